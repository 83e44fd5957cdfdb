package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// insertClaim runs the suite's tests of inserts that claim the jobs they
// write (driver.InsertClaimer), on the backends that have them.
func insertClaim(t *testing.T, s suite) {
	ctx := context.Background()
	setup := func(t *testing.T) (driver.Driver, driver.InsertClaimer) {
		t.Helper()
		d := s.setup(t)
		ic, ok := d.(driver.InsertClaimer)
		if !ok {
			t.Skipf("%s inserts do not claim (no driver.InsertClaimer)", d.Name())
		}
		return d, ic
	}

	// A flagged job due now is written running, as a claim leaves it: its
	// row comes back with attempt 1 and a fence, and its outcome, fenced
	// by that fence, completes it; the other jobs of the insert are
	// written as Insert writes them, and a later claim takes only the
	// available one.
	t.Run("ClaimsFlaggedDueJobs", func(t *testing.T) {
		d, ic := setup(t)
		later := job("q", 0)
		later.Delay = time.Hour
		jobs := []driver.InsertParams{job("q", 0), job("q", 0), later, job("q", 0)}
		ids, rows, err := ic.InsertClaiming(ctx, jobs, driver.InsertClaim{
			Claim: []bool{true, false, true, true}, Lease: time.Minute, Worker: "w1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 4 || len(rows) != 4 {
			t.Fatalf("%d ids and %d rows, want 4 of each", len(ids), len(rows))
		}
		if rows[1] != nil || rows[2] != nil {
			t.Fatalf("claimed a job not flagged (%v) or not due (%v)", rows[1], rows[2])
		}
		for _, i := range []int{0, 3} {
			r := rows[i]
			if r == nil {
				t.Fatalf("flagged due job %d not claimed", i)
			}
			if r.ID != ids[i] || r.State != driver.StateRunning || r.Attempt != 1 || r.Fence <= 0 || r.Queue != "q" ||
				r.Kind != "k" || string(r.Args) != `{"a":1}` || r.MaxAttempts != 3 || r.AttemptedBy != "w1" {
				t.Fatalf("claimed row %+v", r)
			}
			if !r.LeaseExpiresAt.After(r.AttemptedAt) || r.AttemptedAt.IsZero() || r.CreatedAt.IsZero() {
				t.Fatalf("claimed row times: attempted %v, lease %v, created %v", r.AttemptedAt, r.LeaseExpiresAt, r.CreatedAt)
			}
			got, err := d.GetJob(ctx, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			if got.State != driver.StateRunning || got.Attempt != 1 || got.Fence != r.Fence || got.AttemptedBy != "w1" {
				t.Fatalf("stored job %d: state %s attempt %d fence %d by %q, want running 1 %d w1",
					ids[i], got.State, got.Attempt, got.Fence, got.AttemptedBy, r.Fence)
			}
		}
		if got, _ := d.GetJob(ctx, ids[1]); got == nil || got.State != driver.StateAvailable {
			t.Fatalf("unflagged job: %+v, want available", got)
		}
		if got, _ := d.GetJob(ctx, ids[2]); got == nil || got.State != driver.StateScheduled {
			t.Fatalf("delayed job: %+v, want scheduled", got)
		}
		claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w2"})
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) != 1 || claimed[0].ID != ids[1] {
			t.Fatalf("a claim after the insert took %d jobs, want only job %d", len(claimed), ids[1])
		}
		// A stale fence is refused; the claim's own completes the job.
		stale := driver.Outcome{ID: ids[0], Fence: rows[0].Fence - 1, Attempt: 1, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{stale}); err != nil || len(applied) != 0 {
			t.Fatalf("stale outcome: applied %v, %v", applied, err)
		}
		completeJob(t, d, rows[0], driver.StateCompleted, 0)
		if got, _ := d.GetJob(ctx, ids[0]); got == nil || got.State != driver.StateCompleted {
			t.Fatalf("completed job: %+v", got)
		}
		// Renewal and release go through the lease path as for any claim.
		owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: ids[3], Fence: rows[3].Fence}}, time.Minute)
		if err != nil || len(owned) != 1 {
			t.Fatalf("heartbeat of a job claimed at insert: %v, %v", owned, err)
		}
		if n, err := d.Release(ctx, []driver.Lease{{ID: ids[3], Fence: rows[3].Fence}}); err != nil || n != 1 {
			t.Fatalf("release of a job claimed at insert: %d, %v", n, err)
		}
		if got, _ := d.GetJob(ctx, ids[3]); got == nil || got.State != driver.StateAvailable {
			t.Fatalf("released job: %+v, want available", got)
		}
	})

	// A paused queue's jobs are written available, not claimed.
	t.Run("PausedQueueNotClaimed", func(t *testing.T) {
		d, ic := setup(t)
		if err := d.PauseQueue(ctx, "p", true); err != nil {
			t.Fatal(err)
		}
		ids, rows, err := ic.InsertClaiming(ctx, []driver.InsertParams{job("p", 0), job("q", 0)},
			driver.InsertClaim{Claim: []bool{true, true}, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if rows[0] != nil || rows[1] == nil {
			t.Fatalf("claimed %v of the paused queue's job and %v of the other's; want only the other's", rows[0] != nil, rows[1] != nil)
		}
		if got, _ := d.GetJob(ctx, ids[0]); got == nil || got.State != driver.StateAvailable {
			t.Fatalf("paused queue's job: %+v, want available", got)
		}
	})

	// Only the queues of jobs left available are notified.
	t.Run("NotifiesOnlyAvailable", func(t *testing.T) {
		d, ic := setup(t)
		if !d.Capabilities().Listen {
			t.Skip("no notifications")
		}
		l, err := d.Listen(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, _, err := ic.InsertClaiming(ctx, []driver.InsertParams{job("a", 0), job("b", 0), job("b", 0)},
			driver.InsertClaim{Claim: []bool{true, true, false}, Lease: time.Minute, Worker: "w"}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			q, err := l.Wait(wctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, q)
		}
		if len(got) != 1 || got[0] != "b" {
			t.Fatalf("notifications %v, want [b]: queue a's only job was claimed", got)
		}
	})
}
