package postgres

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestLeaseStatementsLinearOnAnEmptiedSegment: a running segment that
// was emptied and analyzed (as autovacuum does between two bursts) has
// statistics that say it holds no row. The generic plans the pool's
// connections keep, made then, must still read each outcome's, renewal's
// and release's job without joining every running row to every entry of
// the batch once the segment is full again. The test prepares the four
// statements on the emptied segment, fills it with 4,000 running jobs,
// runs each on a batch of 1,000 with EXPLAIN ANALYZE (in a transaction it
// rolls back), and checks that each moved or renewed its whole batch and
// that no plan node filtered out more rows than a few passes over the
// segment would (the join plan filtered out 4 million).
func TestLeaseStatementsLinearOnAnEmptiedSegment(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run := v.cur[phRunning].tbl
	// No autovacuum of the segment while the test runs: its statistics
	// are the ones the test sets.
	if _, err := d.pool.Exec(ctx, "ALTER TABLE "+run+" SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	claimAll := func(n int) []*driver.JobRow {
		t.Helper()
		params := make([]driver.InsertParams, n)
		for i := range params {
			params[i] = pj("lp")
		}
		if _, err := d.BulkInsert(ctx, params); err != nil {
			t.Fatal(err)
		}
		var all []*driver.JobRow
		for len(all) < n {
			js, err := d.Claim(ctx, driver.ClaimParams{Queue: "lp", Limit: 1000, Lease: time.Hour, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if len(js) == 0 {
				t.Fatalf("claimed %d of %d jobs", len(all), n)
			}
			all = append(all, js...)
		}
		return all
	}

	// A burst, drained: the segment keeps its pages, with no live row.
	var outs []driver.Outcome
	for _, j := range claimAll(3000) {
		outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, State: driver.StateCompleted})
	}
	if _, err := d.Complete(ctx, outs); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, "ANALYZE "+run); err != nil {
		t.Fatal(err)
	}
	var pages int
	var tuples float64
	if err := d.pool.QueryRow(ctx, "SELECT relpages, reltuples FROM pg_class WHERE oid = $1::regclass", run).Scan(&pages, &tuples); err != nil {
		t.Fatal(err)
	}
	if pages == 0 || tuples != 0 {
		t.Fatalf("precondition: %s analyzed at %d pages, %v rows; want pages and no row", run, pages, tuples)
	}

	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	srcs := v.live[phRunning]
	stmts := []struct{ name, q, empty string }{
		{"cd", s.stmt(&d.q.SegCompleteDone, v, srcs, phDone), "'{1}', '{1}', '{}', '{}'"},
		{"cx", s.stmt(&d.q.SegComplete, v, srcs, phWaiting, phDone, phDead), "'{1}', '{1}', '{completed}', '{0}', '{\"\"}', '{}', '{}'"},
		{"hb", s.stmt(&d.q.SegHeartbeat, v, srcs), "'{1}', '{1}', 1000000"},
		{"rl", s.stmt(&d.q.SegRelease, v, srcs, phReady), "'{1}', '{1}'"},
	}
	// The plans made while the segment is empty, kept by the session.
	for _, st := range stmts {
		if _, err := tx.Exec(ctx, "PREPARE "+st.name+" AS "+st.q); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		explain(t, tx.Query, "EXECUTE "+st.name+"("+st.empty+")")
	}

	// The next burst: 4,000 running jobs, a quarter to each statement.
	jobs := claimAll(4000)
	lit := func(js []*driver.JobRow, f func(*driver.JobRow) string) string {
		parts := make([]string, len(js))
		for i, j := range js {
			parts[i] = f(j)
		}
		return "'{" + strings.Join(parts, ",") + "}'"
	}
	idOf := func(j *driver.JobRow) string { return strconv.FormatInt(j.ID, 10) }
	fenceOf := func(j *driver.JobRow) string { return strconv.FormatInt(j.Fence, 10) }
	each := func(js []*driver.JobRow, s string) func(*driver.JobRow) string {
		return func(*driver.JobRow) string { return s }
	}
	const batch = 1000
	args := make([]string, len(stmts))
	for i := range stmts {
		js := jobs[i*batch : (i+1)*batch]
		ids, fences := lit(js, idOf), lit(js, fenceOf)
		switch stmts[i].name {
		case "cd":
			args[i] = ids + ", " + fences + ", '{}', '{}'"
		case "cx":
			args[i] = ids + ", " + fences + ", " + lit(js, each(js, "retryable")) + ", " + lit(js, each(js, "1000000")) + ", " + lit(js, each(js, `""`)) + ", '{}', '{}'"
		case "hb":
			args[i] = ids + ", " + fences + ", 3600000000"
		case "rl":
			args[i] = ids + ", " + fences
		}
	}
	moved := regexp.MustCompile(`(?:Delete|Update) on ` + regexp.QuoteMeta(run) + ` \w+ \(actual rows=(\d+)`)
	removed := regexp.MustCompile(`Rows Removed by (?:Join )?Filter: (\d+)`)
	for i, st := range stmts {
		plan := explain(t, tx.Query, "(ANALYZE, TIMING OFF, COSTS OFF) EXECUTE "+st.name+"("+args[i]+")")
		m := moved.FindStringSubmatch(plan)
		if m == nil || m[1] != strconv.Itoa(batch) {
			t.Errorf("%s: did not move or renew its %d jobs:\n%s", st.name, batch, plan)
		}
		for _, r := range removed.FindAllStringSubmatch(plan, -1) {
			if n, _ := strconv.Atoi(r[1]); n > 4*len(jobs) {
				t.Errorf("%s: a node filtered out %d rows for a batch of %d over %d running jobs:\n%s", st.name, n, batch, len(jobs), plan)
			}
		}
	}
}
