package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestOverviewPlan checks that the overview query (the dashboard's
// counts) can be served without reading the jobs table whole: no Seq
// Scan on it, and each arm on its partial index. The test table is tiny,
// where a sequential scan is the planner's honest choice, so the plan is
// taken with SET LOCAL enable_seqscan = off: this shows that an index
// plan exists for every arm (each arm's WHERE matches its partial index's
// predicate), not which plan a large table gets; the dashboard benchmark
// (docs/web.md) measures that. EXPLAIN without ANALYZE: nothing runs.
func TestOverviewPlan(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("a"), pj("b")}); err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	all := explain(t, tx.Query, d.q.overview, time.Now().Add(-5*time.Minute))
	if strings.Contains(all, "Seq Scan on "+d.prefix+"jobs") {
		t.Errorf("overview reads the jobs table whole:\n%s", all)
	}
	for _, idx := range []string{"jobs_claim_idx", "jobs_due_idx", "jobs_lease_idx", "jobs_finalized_idx"} {
		if !strings.Contains(all, d.prefix+idx) {
			t.Errorf("overview plan does not use %s:\n%s", d.prefix+idx, all)
		}
	}
}

// explain returns the plan of query with args (EXPLAIN, nothing runs),
// one line per node, read through query (a pool's, a transaction's).
func explain(t *testing.T, query func(context.Context, string, ...any) (pgx.Rows, error), q string, args ...any) string {
	t.Helper()
	rows, err := query(context.Background(), "EXPLAIN "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
