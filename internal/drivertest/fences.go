package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// fences runs the suite's tests of fence tokens: an attempt given back
// (snoozed, released) keeps its attempt number but never its fence.
func fences(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("SnoozeGivesTheAttemptBackNotTheFence", func(t *testing.T) {
		d := s.setup(t)
		ids, err := d.Insert(ctx, []driver.InsertParams{job("s", 0)})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 1, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		first := rows[0]
		applied, err := d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: first.Fence, Attempt: 1, State: driver.StateScheduled, RetryIn: time.Hour}})
		if err != nil || len(applied) != 1 {
			t.Fatalf("snooze: applied %v, %v", applied, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateScheduled || j.Attempt != 0 || len(j.Errors) != 0 || !j.FinalizedAt.IsZero() || time.Until(j.ScheduledAt) < 50*time.Minute {
			t.Fatalf("snoozed job: %+v; want scheduled an hour ahead, attempt given back, no error", j)
		}
		// Due now: promoted and claimed again, under a new fence.
		if _, err := d.Retry(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		rows, err = d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 1, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 1 || rows[0].Attempt != 1 || rows[0].Fence <= first.Fence {
			t.Fatalf("claim after snooze: %+v, %v", rows, err)
		}
		// The snoozed attempt's late acknowledgement is refused.
		applied, err = d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: first.Fence, Attempt: 1, State: driver.StateCompleted}})
		if err != nil || len(applied) != 0 {
			t.Fatalf("late ack of the snoozed attempt: applied %v, %v", applied, err)
		}
	})

	// The fence is the database's alone: after a graceful release gives
	// the attempt back, the next claim carries the same attempt number but
	// a larger fence, and every acknowledgement of the released attempt is
	// refused by the database itself, with no process's bookkeeping
	// involved (this test has none).
	t.Run("FenceOutlivesRelease", func(t *testing.T) {
		d := s.setup(t)
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("f", 0)})
		first, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(first) != 1 {
			t.Fatalf("claim: %d rows, err %v", len(first), err)
		}
		old := driver.Lease{ID: ids[0], Fence: first[0].Fence}
		if n, err := d.Release(ctx, []driver.Lease{old}); err != nil || n != 1 {
			t.Fatalf("release %d err %v", n, err)
		}
		second, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w2"})
		if err != nil || len(second) != 1 {
			t.Fatalf("second claim: %d rows, err %v", len(second), err)
		}
		if second[0].Attempt != first[0].Attempt {
			t.Fatalf("attempt after release: %d, want the released attempt's %d given back", second[0].Attempt, first[0].Attempt)
		}
		if second[0].Fence <= first[0].Fence {
			t.Fatalf("fence after release: %d, want more than %d", second[0].Fence, first[0].Fence)
		}
		if owned, err := d.Heartbeat(ctx, []driver.Lease{old}, time.Minute); err != nil || len(owned) != 0 {
			t.Fatalf("heartbeat of the released attempt owned %v err %v", owned, err)
		}
		if n, err := d.Release(ctx, []driver.Lease{old}); err != nil || n != 0 {
			t.Fatalf("release of the released attempt: %d err %v", n, err)
		}
		stale := driver.Outcome{ID: ids[0], Fence: first[0].Fence, Attempt: first[0].Attempt, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{stale}); err != nil || len(applied) != 0 {
			t.Fatalf("stale acknowledgement after release applied %v err %v", applied, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateRunning || j.AttemptedBy != "w2" {
			t.Fatalf("job after the stale acknowledgement: %+v", j)
		}
		cur := driver.Outcome{ID: ids[0], Fence: second[0].Fence, Attempt: second[0].Attempt, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{cur}); err != nil || len(applied) != 1 {
			t.Fatalf("current acknowledgement applied %v err %v", applied, err)
		}
		if j, _ := d.GetJob(ctx, ids[0]); j.State != driver.StateCompleted {
			t.Fatalf("job after its acknowledgement: %s", j.State)
		}
	})
}
