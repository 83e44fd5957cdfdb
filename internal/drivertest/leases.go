package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// leases runs the suite's tests of leases: release, heartbeat and the
// rescue of expired ones.
func leases(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("Release", func(t *testing.T) {
		d := s.setup(t)
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("r", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Minute, Worker: "w"})
		if len(rows) != 1 {
			t.Fatalf("claimed %d", len(rows))
		}
		n, err := d.Release(ctx, []driver.Lease{{ID: ids[0], Fence: rows[0].Fence}})
		if err != nil || n != 1 {
			t.Fatalf("release %d err %v", n, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateAvailable || j.Attempt != 0 {
			t.Fatalf("released job: %+v", j)
		}
	})

	t.Run("LeaseHeartbeatRescue", func(t *testing.T) {
		d := s.setup(t)
		p := job("l", 0)
		p.MaxAttempts = 2
		ids, _ := d.Insert(ctx, []driver.InsertParams{p, job("l", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "l", Limit: 2, Lease: 200 * time.Millisecond, Worker: "w1"})
		if len(rows) != 2 {
			t.Fatalf("claimed %d", len(rows))
		}
		// Keep the second alive, let the first expire.
		fence := Fences(rows)
		owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: ids[1], Fence: fence[ids[1]]}, {ID: ids[0], Fence: fence[ids[0]] + 6}}, time.Minute)
		if err != nil || len(owned) != 1 || owned[0] != ids[1] {
			t.Fatalf("heartbeat owned %v err %v; want only %d (other fenced)", owned, err, ids[1])
		}
		time.Sleep(350 * time.Millisecond)
		n, err := d.Rescue(ctx, 100)
		if err != nil || n["l"] != 1 {
			t.Fatalf("rescue %v err %v; want 1", n, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateAvailable || len(j.Errors) != 1 || j.Errors[0].Attempt != 1 {
			t.Fatalf("rescued job: %+v", j)
		}
		// The stale attempt's acknowledgement is refused.
		applied, _ := d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateCompleted}})
		if len(applied) != 0 {
			t.Fatalf("stale completion applied after rescue")
		}
		// Second attempt expires too: attempts exhausted, discarded.
		rows, _ = d.Claim(ctx, driver.ClaimParams{Queue: "l", Limit: 1, Lease: 100 * time.Millisecond, Worker: "w2"})
		if len(rows) != 1 || rows[0].Attempt != 2 {
			t.Fatalf("reclaim: %+v", rows)
		}
		time.Sleep(250 * time.Millisecond)
		if n, _ := d.Rescue(ctx, 100); n["l"] != 1 {
			t.Fatalf("second rescue %v", n)
		}
		j, _ = d.GetJob(ctx, ids[0])
		if j.State != driver.StateDiscarded || j.FinalizedAt.IsZero() || len(j.Errors) != 2 {
			t.Fatalf("exhausted job not discarded: %+v", j)
		}
		j, _ = d.GetJob(ctx, ids[1])
		if j.State != driver.StateRunning {
			t.Fatalf("heartbeated job was rescued: %+v", j)
		}
	})
}
