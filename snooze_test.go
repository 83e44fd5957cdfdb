package conveyor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestSnooze: a handler that snoozes its job twice sees it again after
// each snooze with the same attempt number, then completes it; no error is
// recorded and no attempt used up, on every backend.
func TestSnooze(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		var runs atomic.Int32
		attempts := make(chan int, 3)
		err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
			attempts <- j.Attempt
			if runs.Add(1) <= 2 {
				return conveyor.JobSnooze(50 * time.Millisecond)
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		id, err := c.Enqueue(ctx, tagged{"s"}, &conveyor.EnqueueOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, c, id, conveyor.JobStateCompleted)
		close(attempts)
		for a := range attempts {
			if a != 1 {
				t.Errorf("a run after a snooze had attempt %d, want 1 (snoozes use no attempt)", a)
			}
		}
		j := jobState(t, c, id)
		if runs.Load() != 3 || j.Attempt != 1 || len(j.Errors) != 0 {
			t.Fatalf("%d runs, job %+v; want 3 runs, attempt 1, no errors", runs.Load(), j)
		}
		if n := c.Counters().Snoozed; n != 2 {
			t.Errorf("snoozed counter %d, want 2", n)
		}
		if n := c.Counters().FailedAttempts; n != 0 {
			t.Errorf("failed attempts %d, want 0", n)
		}
	})
}
