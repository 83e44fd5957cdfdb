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

	// The jobs waiting for their dependencies are the callbacks of the
	// open batches, counted by the callback's queue in Stats and Overview
	// alike (a queue with only those is listed); a fired batch's callback
	// is a job and counts no more.
	t.Run("AwaitingDependencies", func(t *testing.T) {
		d := s.setup(t)
		_, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("m", 0), job("m", 0), job("m", 0)}, []driver.BatchParams{
			{Callback: job("cb", 0), Jobs: []int{0, 1}},
			{Callback: job("cb", 0), Jobs: []int{2}},
			{Callback: job("later", 0), Jobs: []int{2}, After: []int{0}},
		})
		if err != nil || len(bids) != 3 {
			t.Fatalf("insert batches: %v %v", bids, err)
		}
		check := func(when string, want map[string]int64) {
			t.Helper()
			st, err := d.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ov, err := d.Overview(ctx, time.Now().Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			for name, got := range map[string][]driver.QueueStats{"stats": st, "overview": ov} {
				by := map[string]int64{}
				for _, q := range got {
					if len(q.Counts) != len(driver.AllStates) {
						t.Errorf("%s %s: %s counts %v lack states", when, name, q.Queue, q.Counts)
					}
					by[q.Queue] = q.AwaitingDependencies
				}
				for q, n := range want {
					if n2, ok := by[q]; !ok || n2 != n {
						t.Errorf("%s: %s of queue %s: %d awaiting dependencies (listed %v), want %d", when, name, q, n2, ok, n)
					}
				}
			}
		}
		check("before any member finished", map[string]int64{"cb": 2, "later": 1, "m": 0})

		// Batch 1's members finish and its callback is enqueued: cb has
		// one job available and one awaiting.
		claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "m", Limit: 2, Lease: time.Minute, Worker: "w"})
		if err != nil || len(claimed) != 2 {
			t.Fatalf("claim: %d %v", len(claimed), err)
		}
		var outs []driver.Outcome
		for _, c := range claimed {
			outs = append(outs, driver.Outcome{ID: c.ID, Fence: c.Fence, Attempt: 1, State: driver.StateCompleted})
		}
		if _, err := d.Complete(ctx, outs); err != nil {
			t.Fatal(err)
		}
		fired, err := d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		check("after the first batch fired", map[string]int64{"cb": 1, "later": 1, "m": 0})
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range st {
			if q.Queue == "cb" && q.Counts[driver.StateAvailable] != 1 {
				t.Errorf("cb: %v, want its fired callback available", q.Counts)
			}
		}
	})
}
