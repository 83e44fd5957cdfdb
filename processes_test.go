package conveyor_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestProcessesListStartedClients: a started client is listed (its
// worker id, host, pid, queues with their concurrency, alive, Self on
// its own row) by every client of the database; a client that only
// enqueues is not; a stopped client's row is gone at once.
func TestProcessesListStartedClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		viewer := openDropped(t, dsn, fast(prefix)) // never started
		cfg := fast(prefix)
		cfg.Queues = map[string]conveyor.QueueConfig{"mail": {MaxWorkers: 3}, "reports": {MaxWorkers: 1}}
		worker := open(t, dsn, cfg)
		if err := conveyor.AddWorker(worker, conveyor.WorkFunc(func(context.Context, *conveyor.Job[noop]) error { return nil })); err != nil {
			t.Fatal(err)
		}
		if ps, err := viewer.Processes(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("before any Start: %+v, %v; want none", ps, err)
		}
		if err := worker.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Job ids tell the worker's id: it claims one and records it.
		id, err := worker.Enqueue(ctx, noop{}, &conveyor.EnqueueOpts{Queue: "mail"})
		if err != nil {
			t.Fatal(err)
		}
		var by string
		waitFor(t, "the job to complete", 20*time.Second, func() bool {
			j := jobState(t, viewer, id)
			by = j.AttemptedBy
			return j.State == conveyor.JobStateCompleted
		})
		var ps []conveyor.ProcessInfo
		waitFor(t, "the started client to be listed", 20*time.Second, func() bool {
			ps, err = viewer.Processes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return len(ps) == 1
		})
		host, _ := os.Hostname()
		p := ps[0]
		if p.ID != by || p.Kind != conveyor.ProcessKindClient || p.Host != host || p.PID != os.Getpid() || !p.Alive || p.Self ||
			len(p.Queues) != 2 || p.Queues["mail"] != 3 || p.Queues["reports"] != 1 ||
			p.StartedAt.IsZero() || p.HeartbeatAt.Before(p.StartedAt) || !p.ExpiresAt.After(p.HeartbeatAt) {
			t.Fatalf("listed %+v; want the worker %q on %s pid %d, alive, queues mail:3 reports:1", p, by, host, os.Getpid())
		}
		own, err := worker.Processes(ctx)
		if err != nil || len(own) != 1 || !own[0].Self {
			t.Fatalf("the worker's own listing %+v, %v: want its row marked Self", own, err)
		}
		if err := worker.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if ps, err := viewer.Processes(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("after Stop: %+v, %v; want the row removed", ps, err)
		}
	})
}
