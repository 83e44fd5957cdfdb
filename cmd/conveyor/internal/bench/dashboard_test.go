package bench

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// The dashboard workload on PostgreSQL: the jobs are loaded and given
// their states in the one table of a prefix at migration 9 and moved to
// the segment tables by Migrate's conversion, so the pages are timed on
// the segments, with the loaded states (the workload once failed there:
// its UPDATE named {p}jobs).
func TestDashboardPostgresSegments(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := testdb.Prefix()
	o := Options{DSN: dsn, Workload: "dashboard", Jobs: 1000, Keep: true, Timeout: time.Minute}
	o.Config.TablePrefix = prefix
	rs, err := RunAll(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(dashboardPages) {
		t.Fatalf("%d pages timed, want %d", len(rs), len(dashboardPages))
	}
	cfg := conveyor.Config{TablePrefix: prefix, NoQueues: true}
	c, err := connect.OpenWith(ctx, dsn, &cfg, connect.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[conveyor.JobState]int64{}
	for _, q := range st.Queues {
		for s, n := range q.Counts {
			got[s] += n
		}
	}
	// dashboardStatesSQL by id modulo 100 (ids 1..1000: ten of each).
	want := map[conveyor.JobState]int64{
		conveyor.JobStateCompleted: 800, conveyor.JobStateDiscarded: 30, conveyor.JobStateCancelled: 10,
		conveyor.JobStateRetryable: 20, conveyor.JobStateScheduled: 30, conveyor.JobStateRunning: 10, conveyor.JobStateAvailable: 100,
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%s: %d jobs, want %d (all: %v)", s, got[s], n, got)
		}
	}
}
