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

// TestLeaseStatementsLinearOnAnEmptiedSegment: a running or waiting
// segment that was emptied and analyzed (as autovacuum does between two
// bursts) has statistics that say it holds no row. The generic plans the
// pool's connections keep, made then, must still find a batch's jobs
// (outcomes, renewals, releases, and the jobs rescue and promotion lock)
// without joining every row of the segment to every entry of the batch
// once it is full again. The test prepares the six statements on the
// emptied segments, fills them with 4,000 jobs, runs each on a batch of
// 1,000 with EXPLAIN ANALYZE (in a transaction it rolls back), and checks
// that each moved or renewed its whole batch and that no plan node
// filtered out more rows than a few passes over the segment would (the
// join plans filtered out 2 to 4 million).
func TestLeaseStatementsLinearOnAnEmptiedSegment(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run, wait := v.cur[phRunning].tbl, v.cur[phWaiting].tbl
	// No autovacuum of the segments while the test runs: their
	// statistics are the ones the test sets.
	for _, tbl := range []string{run, wait} {
		if _, err := d.pool.Exec(ctx, "ALTER TABLE "+tbl+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	insert := func(queue string, n int, due time.Time) {
		t.Helper()
		params := make([]driver.InsertParams, n)
		for i := range params {
			params[i] = pj(queue)
			params[i].RunAt = due
		}
		if _, err := d.BulkInsert(ctx, params); err != nil {
			t.Fatal(err)
		}
	}
	claimAll := func(n int, lease time.Duration) []*driver.JobRow {
		t.Helper()
		insert("lp", n, time.Time{})
		var all []*driver.JobRow
		for len(all) < n {
			js, err := d.Claim(ctx, driver.ClaimParams{Queue: "lp", Limit: 1000, Lease: lease, Worker: "w"})
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
	// promoteAll waits for n jobs scheduled in the near future to be due
	// and promotes them.
	promoteAll := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for moved := 0; moved < n; {
			if time.Now().After(deadline) {
				t.Fatalf("promoted %d of %d jobs", moved, n)
			}
			m, err := d.Promote(ctx, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range m {
				moved += c
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A burst, drained: the segments keep their pages, with no live row.
	var outs []driver.Outcome
	for _, j := range claimAll(3000, time.Hour) {
		outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, State: driver.StateCompleted})
	}
	if _, err := d.Complete(ctx, outs); err != nil {
		t.Fatal(err)
	}
	insert("later", 3000, time.Now().Add(200*time.Millisecond))
	promoteAll(3000)
	for _, tbl := range []string{run, wait} {
		if _, err := d.pool.Exec(ctx, "ANALYZE "+tbl); err != nil {
			t.Fatal(err)
		}
		var pages int
		var tuples float64
		if err := d.pool.QueryRow(ctx, "SELECT relpages, reltuples FROM pg_class WHERE oid = $1::regclass", tbl).Scan(&pages, &tuples); err != nil {
			t.Fatal(err)
		}
		if pages == 0 || tuples != 0 {
			t.Fatalf("precondition: %s analyzed at %d pages, %v rows; want pages and no row", tbl, pages, tuples)
		}
	}

	// The plans made while the segments are empty, kept by the session,
	// as the pool's connections keep theirs.
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	stmts := []struct{ name, q, seg, empty string }{
		{"lp_cd", s.stmt(&d.q.SegCompleteDone, v, v.live[phRunning], phDone), run, "'{1}', '{1}', '{}', '{}'"},
		{"lp_cx", s.stmt(&d.q.SegComplete, v, v.live[phRunning], phWaiting, phDone, phDead), run, "'{1}', '{1}', '{completed}', '{0}', '{\"\"}', '{}', '{}'"},
		{"lp_hb", s.stmt(&d.q.SegHeartbeat, v, v.live[phRunning]), run, "'{1}', '{1}', 1000000"},
		{"lp_rl", s.stmt(&d.q.SegRelease, v, v.live[phRunning], phReady), run, "'{1}', '{1}'"},
		{"lp_rs", s.stmt(&d.q.SegRescue, v, v.live[phRunning], phReady, phDead), run, "1"},
		{"lp_pr", s.stmt(&d.q.SegPromote, v, v.live[phWaiting], phReady), wait, "1"},
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, st := range stmts {
			_, _ = conn.Exec(ctx, "DEALLOCATE "+st.name)
		}
		_, _ = conn.Exec(ctx, "RESET plan_cache_mode")
	}()
	for _, st := range stmts {
		if _, err := conn.Exec(ctx, "PREPARE "+st.name+" AS "+st.q); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		explain(t, conn.Query, "(ANALYZE, TIMING OFF, COSTS OFF) EXECUTE "+st.name+"("+st.empty+")")
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}

	// The next burst: 4,000 running jobs, a quarter to each of the first
	// four statements, 4,000 more whose leases expire at once, and 4,000
	// due waiting jobs.
	jobs := claimAll(4000, time.Hour)
	claimAll(4000, time.Millisecond)
	insert("later", 4000, time.Now().Add(100*time.Millisecond))
	time.Sleep(200 * time.Millisecond)
	lit := func(js []*driver.JobRow, f func(*driver.JobRow) string) string {
		parts := make([]string, len(js))
		for i, j := range js {
			parts[i] = f(j)
		}
		return "'{" + strings.Join(parts, ",") + "}'"
	}
	idOf := func(j *driver.JobRow) string { return strconv.FormatInt(j.ID, 10) }
	fenceOf := func(j *driver.JobRow) string { return strconv.FormatInt(j.Fence, 10) }
	each := func(s string) func(*driver.JobRow) string {
		return func(*driver.JobRow) string { return s }
	}
	const batch = 1000
	args := make([]string, len(stmts))
	for i := range stmts {
		var js []*driver.JobRow
		if i < 4 {
			js = jobs[i*batch : (i+1)*batch]
		}
		ids, fences := lit(js, idOf), lit(js, fenceOf)
		switch stmts[i].name {
		case "lp_cd":
			args[i] = ids + ", " + fences + ", '{}', '{}'"
		case "lp_cx":
			args[i] = ids + ", " + fences + ", " + lit(js, each("retryable")) + ", " + lit(js, each("1000000")) + ", " + lit(js, each(`""`)) + ", '{}', '{}'"
		case "lp_hb":
			args[i] = ids + ", " + fences + ", 3600000000"
		case "lp_rl":
			args[i] = ids + ", " + fences
		case "lp_rs", "lp_pr":
			args[i] = strconv.Itoa(batch)
		}
	}
	removed := regexp.MustCompile(`Rows Removed by (?:Join )?Filter: (\d+)`)
	for i, st := range stmts {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		plan := explain(t, conn.Query, "(ANALYZE, TIMING OFF, COSTS OFF) EXECUTE "+st.name+"("+args[i]+")")
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		moved := regexp.MustCompile(`(?:Delete|Update) on ` + regexp.QuoteMeta(st.seg) + ` \w+ \(actual rows=(\d+)`)
		m := moved.FindStringSubmatch(plan)
		if m == nil || m[1] != strconv.Itoa(batch) {
			t.Errorf("%s: did not move or renew %d jobs:\n%s", st.name, batch, plan)
		}
		// A locking read of the whole segment (rescue and promotion
		// have no index on the lease or the time) filters out at most
		// its rows: 8,000 running, 4,000 waiting.
		for _, r := range removed.FindAllStringSubmatch(plan, -1) {
			if n, _ := strconv.Atoi(r[1]); n > 4*8000 {
				t.Errorf("%s: a node filtered out %d rows for a batch of %d:\n%s", st.name, n, batch, plan)
			}
		}
	}
}
