package drivertest

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// fair runs the suite's tests of fair queues (QueueLimits.Fair) and key
// weights (SetKeyWeights): stored and cleared, weights kept apart from
// the limits, keys served in turns so that a flooded key takes one turn
// among the others, weights splitting a claim, a lone key filling a
// claim, jobs without a key after the keyed ones, weights within the
// limit per key, and concurrent claimers taking every job once.
func fair(t *testing.T, s suite) {
	ctx := context.Background()
	setWeights := func(t *testing.T, d driver.Driver, queue string, w map[string]int) {
		t.Helper()
		if err := d.SetKeyWeights(ctx, queue, w); err != nil {
			t.Fatalf("set key weights of %s to %v: %v", queue, w, err)
		}
	}
	weights := func(t *testing.T, d driver.Driver) map[string]map[string]int {
		t.Helper()
		w, err := d.KeyWeights(ctx)
		if err != nil {
			t.Fatalf("key weights: %v", err)
		}
		return w
	}

	t.Run("Stored", func(t *testing.T) {
		d := s.setup(t)
		only := driver.QueueLimits{Fair: true}
		both := driver.QueueLimits{MaxRunning: 3, KeyMaxRunning: 2, KeyRate: 4, KeyRatePeriod: time.Hour, Fair: true}
		setLimits(t, d, "f", only)
		setLimits(t, d, "both", both)
		got, err := d.QueueLimits(ctx)
		if err != nil || got["f"] != only || got["both"] != both || len(got) != 2 {
			t.Fatalf("limits %+v, %v; want f %+v and both %+v", got, err, only, both)
		}
		u, err := d.LimitUsage(ctx)
		if err != nil || u["f"].Limits != only || u["both"].Limits != both || u["f"].KeyHeld != 0 || u["f"].KeysRunning != 0 {
			t.Fatalf("usage %+v, %v", u, err)
		}

		// Weights are kept beside the limits: SetQueueLimits leaves them.
		setWeights(t, d, "f", map[string]int{"a": 3, "b": 2})
		if w := weights(t, d); len(w) != 1 || !maps.Equal(w["f"], map[string]int{"a": 3, "b": 2}) {
			t.Fatalf("key weights %v, want f: a 3, b 2", w)
		}
		setLimits(t, d, "f", driver.QueueLimits{})
		if got, _ := d.QueueLimits(ctx); len(got) != 1 || got["both"] != both {
			t.Fatalf("limits after removing f's: %+v, want both's only", got)
		}
		if w := weights(t, d); !maps.Equal(w["f"], map[string]int{"a": 3, "b": 2}) {
			t.Fatalf("key weights after removing f's limits: %v, want them kept", w)
		}
		// Replaced whole, then removed.
		setWeights(t, d, "f", map[string]int{"c": 5})
		if w := weights(t, d); len(w) != 1 || !maps.Equal(w["f"], map[string]int{"c": 5}) {
			t.Fatalf("key weights after replacing: %v, want f: c 5", w)
		}
		setWeights(t, d, "f", nil)
		if w := weights(t, d); len(w) != 0 {
			t.Fatalf("key weights after removing: %v, want none", w)
		}

		// Weights on a queue with no limits and no pause yet: stored, and
		// the queue stays unlimited and unpaused.
		setWeights(t, d, "fresh", map[string]int{"x": 2})
		if w := weights(t, d); !maps.Equal(w["fresh"], map[string]int{"x": 2}) {
			t.Fatalf("key weights of a fresh queue: %v", w)
		}
		if got, _ := d.QueueLimits(ctx); len(got) != 1 {
			t.Fatalf("limits after weighing a fresh queue: %+v, want both's only", got)
		}
		if p, err := d.PausedQueues(ctx); err != nil || len(p) != 0 {
			t.Fatalf("paused queues after weighing a fresh queue: %v, %v", p, err)
		}
		insertJobs(t, d, keyedJob("fresh", "x", 0), job("fresh", 0))
		if r := claimLimited(t, d, "fresh", 10, time.Minute); len(r.Rows) != 2 || r.Held {
			t.Fatalf("claim of a weighed queue without limits: %d rows, held %v; want both jobs", len(r.Rows), r.Held)
		}
		setLimits(t, d, "both", driver.QueueLimits{})
		setWeights(t, d, "fresh", nil)
		if got, err := d.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("limits after removal: %+v, %v", got, err)
		}
	})

	t.Run("FloodTakesOneTurn", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 200; i++ {
			jobs = append(jobs, keyedJob("q", "flood", 0))
		}
		for i := 0; i < 3; i++ {
			for k := 0; k < 10; k++ {
				jobs = append(jobs, keyedJob("q", fmt.Sprintf("s%02d", k), 0))
			}
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "q", driver.QueueLimits{Fair: true})
		small := 0
		for i := 1; i <= 4; i++ {
			r := claimLimited(t, d, "q", 10, time.Minute)
			if len(r.Rows) != 10 || r.Held {
				t.Fatalf("claim %d: %d rows, held %v; want 10, not held (fairness holds nothing back)", i, len(r.Rows), r.Held)
			}
			by := countByKey(r.Rows)
			if i <= 3 && len(by) != 10 {
				t.Fatalf("claim %d took %v: want 10 distinct keys of the 11 with jobs (one turn each)", i, by)
			}
			small += len(r.Rows) - by["flood"]
		}
		if small != 30 {
			t.Fatalf("4 claims of 10 took %d of the small keys' 30 jobs, want all of them (the flood takes one turn among 11 keys)", small)
		}
	})

	t.Run("Weights", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 40; i++ {
			jobs = append(jobs, keyedJob("w", "a", 0), keyedJob("w", "b", 0))
		}
		insertJobs(t, d, jobs...)
		// Set before the queue is Fair: they wait for it.
		setWeights(t, d, "w", map[string]int{"a": 3})
		setLimits(t, d, "w", driver.QueueLimits{Fair: true})
		for i := 1; i <= 3; i++ {
			r := claimLimited(t, d, "w", 8, time.Minute)
			if by := countByKey(r.Rows); by["a"] != 6 || by["b"] != 2 {
				t.Fatalf("claim %d of 8 took %v: want a 6 and b 2 (weights 3 and 1)", i, by)
			}
		}
		// Reweighed: the next claim uses the new weights.
		setWeights(t, d, "w", map[string]int{"b": 3})
		r := claimLimited(t, d, "w", 8, time.Minute)
		if by := countByKey(r.Rows); by["a"] != 2 || by["b"] != 6 {
			t.Fatalf("claim after reweighing took %v: want a 2 and b 6", by)
		}
		// Equal weights split a claim evenly over three deep keys.
		d2 := s.setup(t)
		jobs = jobs[:0]
		for i := 0; i < 30; i++ {
			for _, k := range []string{"x", "y", "z"} {
				jobs = append(jobs, keyedJob("e", k, 0))
			}
		}
		insertJobs(t, d2, jobs...)
		setLimits(t, d2, "e", driver.QueueLimits{Fair: true})
		r = claimLimited(t, d2, "e", 9, time.Minute)
		if by := countByKey(r.Rows); by["x"] != 3 || by["y"] != 3 || by["z"] != 3 {
			t.Fatalf("claim of 9 over three deep keys took %v, want 3 each", by)
		}
	})

	t.Run("TurnSpansClaims", func(t *testing.T) {
		// A process's claims are often of one job (one worker freed): a
		// key's turn goes on over the next claims until it took its
		// weight, so that weights hold for claims of any size.
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 20; i++ {
			jobs = append(jobs, keyedJob("t", "a", 0), keyedJob("t", "b", 0))
		}
		insertJobs(t, d, jobs...)
		setWeights(t, d, "t", map[string]int{"a": 3})
		setLimits(t, d, "t", driver.QueueLimits{Fair: true})
		for _, size := range []int{1, 1, 1, 2, 2, 3} {
			for round := 1; round <= 1; round++ {
				var got []*driver.JobRow
				for len(got) < 4 {
					r := claimLimited(t, d, "t", min(size, 4-len(got)), time.Minute)
					if len(r.Rows) == 0 {
						t.Fatalf("claims of %d, round %d: a claim took nothing with both keys deep", size, round)
					}
					got = append(got, r.Rows...)
				}
				if by := countByKey(got); by["a"] != 3 || by["b"] != 1 {
					t.Fatalf("claims of %d, round %d: 4 jobs took %v, want a 3 and b 1 (weights 3 and 1)", size, round, by)
				}
			}
		}
	})

	t.Run("LoneKeyFillsClaim", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 50; i++ {
			jobs = append(jobs, keyedJob("l", "solo", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "l", driver.QueueLimits{Fair: true})
		if r := claimLimited(t, d, "l", 20, time.Minute); len(r.Rows) != 20 || r.Held {
			t.Fatalf("claim of 20 from one key of 50 jobs: %d rows, held %v; want 20", len(r.Rows), r.Held)
		}
	})

	t.Run("KeylessAfterKeyed", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 5; i++ {
			jobs = append(jobs, job("u", 0))
		}
		jobs = append(jobs, keyedJob("u", "a", 0), keyedJob("u", "a", 0), keyedJob("u", "b", 0), keyedJob("u", "b", 0))
		insertJobs(t, d, jobs...)
		setLimits(t, d, "u", driver.QueueLimits{Fair: true})
		r := claimLimited(t, d, "u", 6, time.Minute)
		if by := countByKey(r.Rows); by["a"] != 2 || by["b"] != 2 || by[""] != 2 {
			t.Fatalf("claim of 6 took %v: want the 4 keyed jobs, then 2 without a key", by)
		}
	})

	t.Run("WithinKeyMaxRunning", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 10; i++ {
			jobs = append(jobs, keyedJob("m", "c", 0), keyedJob("m", "d", 0))
		}
		insertJobs(t, d, jobs...)
		setWeights(t, d, "m", map[string]int{"c": 5})
		setLimits(t, d, "m", driver.QueueLimits{Fair: true, KeyMaxRunning: 2})
		r := claimLimited(t, d, "m", 10, time.Minute)
		if by := countByKey(r.Rows); by["c"] != 2 || by["d"] != 2 || !r.Held {
			t.Fatalf("claim took %v, held %v: want 2 of each key (KeyMaxRunning 2 bounds a weight of 5), held by the keys", by, r.Held)
		}
		// An ended attempt frees its key's slot for one more.
		completeJob(t, d, r.Rows[0], driver.StateCompleted, 0)
		r2 := claimLimited(t, d, "m", 10, time.Minute)
		if len(r2.Rows) != 1 || r2.Rows[0].Key != r.Rows[0].Key {
			t.Fatalf("after one attempt of key %s ended: claimed %v, want one job of that key", r.Rows[0].Key, countByKey(r2.Rows))
		}
	})

	t.Run("ConcurrentClaimers", func(t *testing.T) {
		d := s.setup(t)
		const nKeys, perKey, keyless = 12, 10, 10
		var jobs []driver.InsertParams
		for i := 0; i < perKey; i++ {
			for k := 0; k < nKeys; k++ {
				jobs = append(jobs, keyedJob("cc", fmt.Sprintf("key-%02d", k), 0))
			}
		}
		for i := 0; i < keyless; i++ {
			jobs = append(jobs, job("cc", 0))
		}
		insertJobs(t, d, jobs...)
		setWeights(t, d, "cc", map[string]int{"key-00": 4, "key-05": 2})
		setLimits(t, d, "cc", driver.QueueLimits{Fair: true})
		total := len(jobs)
		var mu sync.Mutex
		claimed := map[int64]int{}
		var firstErr error
		deadline := time.Now().Add(60 * time.Second)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					mu.Lock()
					stop := len(claimed) >= total || firstErr != nil
					mu.Unlock()
					if stop {
						return
					}
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "cc", Limit: 5, Lease: time.Minute, Worker: "w"})
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					for _, row := range r.Rows {
						claimed[row.ID]++
					}
					mu.Unlock()
					for _, row := range r.Rows {
						o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
						if applied, err := d.Complete(ctx, []driver.Outcome{o}); err != nil || len(applied) != 1 {
							mu.Lock()
							if firstErr == nil {
								firstErr = fmt.Errorf("complete %d: %v, %v", row.ID, applied, err)
							}
							mu.Unlock()
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		for id, n := range claimed {
			if n != 1 {
				t.Fatalf("job %d claimed %d times", id, n)
			}
		}
		if len(claimed) != total {
			t.Fatalf("claimed %d of %d jobs within 60 s", len(claimed), total)
		}
	})
}
