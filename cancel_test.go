package conveyor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestCancelRunningJobFromAnotherClient: a job running in one client is
// cancelled from another; its handler's context is cancelled, the job ends
// cancelled, and the handler's late success does not complete it. On
// PostgreSQL a notification carries the cancel, so it arrives long before
// the next heartbeat (set to 30s here); elsewhere the next heartbeat (400ms
// here) finds the job gone.
func TestCancelRunningJobFromAnotherClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		cfg := fast(prefix)
		bound := 20 * time.Second
		if strings.HasPrefix(dsn, "postgres://") {
			cfg.Lease, cfg.HeartbeatInterval = time.Minute, 30*time.Second
		}
		worker := openDropped(t, dsn, cfg)
		admin := open(t, dsn, fast(prefix))
		started, stopped := make(chan struct{}), make(chan error, 1)
		err := conveyor.AddWorker(worker, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
			close(started)
			<-ctx.Done()
			stopped <- context.Cause(ctx)
			return nil // a late success: must not complete the cancelled job
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := worker.Start(ctx); err != nil {
			t.Fatal(err)
		}
		id, err := admin.Enqueue(ctx, tagged{"run"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the job did not start within 30s")
		}
		j, err := admin.Cancel(ctx, id)
		if err != nil || j.State != conveyor.JobStateCancelled {
			t.Fatalf("cancel: %+v, %v", j, err)
		}
		select {
		case cause := <-stopped:
			if cause == nil || !strings.Contains(cause.Error(), "cancelled") {
				t.Errorf("the handler's context ended with %v", cause)
			}
		case <-time.After(bound):
			t.Fatalf("the handler's context was not cancelled within %v of the cancel", bound)
		}
		// The handler returned nil; give the completer time to try.
		if err := worker.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if j := jobState(t, admin, id); j.State != conveyor.JobStateCancelled {
			t.Fatalf("job is %s after the handler's late success, want cancelled", j.State)
		}
	})
}
