package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// stats runs the suite's tests of the per-queue counts of the dashboard's
// overview.
func stats(t *testing.T, s suite) {
	ctx := context.Background()

	// Overview counts the unfinished states as Stats does and the finished
	// ones only from finishedSince on, by the database's clock: the
	// finished jobs' own finalized_at (read back) is the boundary.
	t.Run("Overview", func(t *testing.T) {
		d := s.setup(t)
		later := job("o", 0)
		later.Delay = time.Hour
		ids, err := d.Insert(ctx, []driver.InsertParams{job("o", 0), job("o", 0), job("o", 0), job("o", 0), job("o", 0), later, job("p", 0), job("idle", 0)})
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "o", Limit: 4, Lease: time.Minute, Worker: "w"})
		if err != nil || len(claimed) != 4 {
			t.Fatalf("claim: %d %v", len(claimed), err)
		}
		// Of the four running: completed, discarded, retryable; one runs.
		if _, err := d.Complete(ctx, []driver.Outcome{
			{ID: claimed[0].ID, Fence: claimed[0].Fence, Attempt: 1, State: driver.StateCompleted},
			{ID: claimed[1].ID, Fence: claimed[1].Fence, Attempt: 1, State: driver.StateDiscarded},
			{ID: claimed[2].ID, Fence: claimed[2].Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour},
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Cancel(ctx, ids[7]); err != nil { // idle: only a finished job
			t.Fatal(err)
		}
		var first, last time.Time
		for _, id := range []int64{claimed[0].ID, claimed[1].ID, ids[7]} {
			j, err := d.GetJob(ctx, id)
			if err != nil || j.FinalizedAt.IsZero() {
				t.Fatalf("job %d: %+v %v", id, j, err)
			}
			if first.IsZero() || j.FinalizedAt.Before(first) {
				first = j.FinalizedAt
			}
			if j.FinalizedAt.After(last) {
				last = j.FinalizedAt
			}
		}
		stats, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		full := map[string]driver.QueueStats{}
		for _, s := range stats {
			full[s.Queue] = s
		}
		overview := func(since time.Time) map[string]driver.QueueStats {
			t.Helper()
			st, err := d.Overview(ctx, since)
			if err != nil {
				t.Fatal(err)
			}
			by := map[string]driver.QueueStats{}
			for _, s := range st {
				if len(s.Counts) != len(driver.AllStates) {
					t.Fatalf("overview %s: counts %v lack states", s.Queue, s.Counts)
				}
				by[s.Queue] = s
			}
			return by
		}
		unfinished := []string{driver.StateAvailable, driver.StateScheduled, driver.StateRetryable, driver.StateRunning}
		finished := []string{driver.StateCompleted, driver.StateDiscarded, driver.StateCancelled}
		before := overview(first.Add(-time.Millisecond))
		for _, q := range []string{"o", "p", "idle"} {
			for _, st := range unfinished {
				if before[q].Counts[st] != full[q].Counts[st] {
					t.Errorf("queue %s %s: overview %d, stats %d", q, st, before[q].Counts[st], full[q].Counts[st])
				}
			}
			for _, st := range finished { // all finished within the window
				if before[q].Counts[st] != full[q].Counts[st] {
					t.Errorf("queue %s %s since before: overview %d, stats %d", q, st, before[q].Counts[st], full[q].Counts[st])
				}
			}
		}
		o := full["o"].Counts
		if o[driver.StateAvailable] != 1 || o[driver.StateScheduled] != 1 || o[driver.StateRetryable] != 1 || o[driver.StateRunning] != 1 || o[driver.StateCompleted] != 1 || o[driver.StateDiscarded] != 1 {
			t.Fatalf("stats of o: %v", o)
		}
		if full["o"].OldestAvailable > 0 && before["o"].OldestAvailable <= 0 {
			t.Errorf("oldest available: overview %v, stats %v", before["o"].OldestAvailable, full["o"].OldestAvailable)
		}
		after := overview(last.Add(time.Millisecond))
		for _, st := range finished {
			if n := after["o"].Counts[st]; n != 0 {
				t.Errorf("o %s since after the last finish: %d, want 0", st, n)
			}
		}
		for _, st := range unfinished {
			if after["o"].Counts[st] != full["o"].Counts[st] {
				t.Errorf("o %s since after: overview %d, stats %d", st, after["o"].Counts[st], full["o"].Counts[st])
			}
		}
		if _, ok := after["idle"]; ok {
			t.Errorf("queue idle, with only a job finished before since, listed: %+v", after["idle"])
		}
		if after["p"].Counts[driver.StateAvailable] != 1 {
			t.Errorf("queue p: %+v", after["p"])
		}
	})
}
