package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// maintenance runs the suite's tests of schema migration and the leader's
// upkeep: promotion of scheduled jobs, pruning, leadership.
func maintenance(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("MigrateIdempotent", func(t *testing.T) {
		d := s.setup(t)
		applied, err := d.Migrate(ctx)
		if err != nil || len(applied) != 0 {
			t.Fatalf("second migrate applied %v, err %v; want nothing", applied, err)
		}
		cur, latest, err := d.SchemaVersion(ctx)
		if err != nil || cur != latest || cur < 1 {
			t.Fatalf("schema version %d/%d err %v", cur, latest, err)
		}
	})

	t.Run("ScheduledNotClaimedUntilPromoted", func(t *testing.T) {
		// Job "s" is due in an hour: no promotion or claim of this test
		// may take it. Job "s2" is due in 300 ms: the first promotion
		// may already find it due on a loaded machine, so it is counted
		// over both.
		d := s.setup(t)
		late, soon := job("s", 0), job("s2", 0)
		late.Delay, soon.Delay = time.Hour, 300*time.Millisecond
		ids, err := d.Insert(ctx, []driver.InsertParams{late, soon})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			j, _ := d.GetJob(ctx, id)
			if j.State != driver.StateScheduled {
				t.Fatalf("delayed job %d state %q, want scheduled", id, j.State)
			}
		}
		n, err := d.Promote(ctx, 100)
		if err != nil || n["s"] != 0 {
			t.Fatalf("promoted %v (err %v): a job due in an hour was promoted", n, err)
		}
		promoted := n["s2"]
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 5, Lease: time.Minute, Worker: "w"})
		if len(rows) != 0 {
			t.Fatalf("claimed a scheduled job early")
		}
		time.Sleep(400 * time.Millisecond)
		n, err = d.Promote(ctx, 100)
		if err != nil || n["s"] != 0 || promoted+n["s2"] != 1 {
			t.Fatalf("promote: %v err %v, after %d of s2 (want s2's one job promoted once, s's none)", n, err, promoted)
		}
		rows, _ = d.Claim(ctx, driver.ClaimParams{Queue: "s2", Limit: 5, Lease: time.Minute, Worker: "w"})
		if len(rows) != 1 || rows[0].ID != ids[1] || time.Since(rows[0].ScheduledAt) < 0 {
			t.Fatalf("claim after promote: %d rows", len(rows))
		}
		if rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 5, Lease: time.Minute, Worker: "w"}); len(rows) != 0 {
			t.Fatalf("claimed the job due in an hour")
		}
	})

	t.Run("Prune", func(t *testing.T) {
		d := s.setup(t)
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("p", 0), job("p", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "p", Limit: 2, Lease: time.Minute, Worker: "w"})
		d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: Fences(rows)[ids[0]], Attempt: 1, State: driver.StateCompleted}})
		time.Sleep(50 * time.Millisecond)
		n, err := d.Prune(ctx, time.Millisecond, time.Hour, 100)
		if err != nil || n != 1 {
			t.Fatalf("prune %d err %v; want 1", n, err)
		}
		if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("pruned job still there: %v", err)
		}
		if j, err := d.GetJob(ctx, ids[1]); err != nil || j.State != driver.StateRunning {
			t.Fatalf("running job pruned: %v", err)
		}
	})

	t.Run("Leader", func(t *testing.T) {
		d := s.setup(t)
		ok, err := d.TryLead(ctx, "a", 300*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("first leader: %v %v", ok, err)
		}
		if ok, _ := d.TryLead(ctx, "b", 300*time.Millisecond); ok {
			t.Fatal("second process took a live leadership")
		}
		if ok, _ := d.TryLead(ctx, "a", 300*time.Millisecond); !ok {
			t.Fatal("leader could not renew")
		}
		time.Sleep(400 * time.Millisecond)
		if ok, _ := d.TryLead(ctx, "b", 300*time.Millisecond); !ok {
			t.Fatal("leadership not taken over after expiry")
		}
	})

	// A negative ttl gives up the leadership its id holds (a leader that
	// stops), which another id then takes at once; it does not take or
	// shorten another id's live leadership.
	t.Run("LeaderResigns", func(t *testing.T) {
		d := s.setup(t)
		if ok, err := d.TryLead(ctx, "a", time.Hour); err != nil || !ok {
			t.Fatalf("first leader: %v %v", ok, err)
		}
		if ok, err := d.TryLead(ctx, "b", -time.Hour); err != nil || ok {
			t.Fatalf("another id's resignation: %v %v, want false", ok, err)
		}
		if ok, _ := d.TryLead(ctx, "b", time.Hour); ok {
			t.Fatal("another id's resignation ended a live leadership")
		}
		if _, err := d.TryLead(ctx, "a", -time.Hour); err != nil {
			t.Fatal(err)
		}
		if ok, err := d.TryLead(ctx, "b", time.Hour); err != nil || !ok {
			t.Fatalf("leadership not taken at once after the leader gave it up: %v %v", ok, err)
		}
		if ok, _ := d.TryLead(ctx, "a", time.Hour); ok {
			t.Fatal("the former leader took back a live leadership")
		}
	})
}
