package drivertest

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// claims runs the suite's tests of the claim path: what a claim hands out,
// in which order, and that no job is handed out twice.
func claims(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("InsertClaimComplete", func(t *testing.T) {
		d := s.setup(t)
		ids, err := d.Insert(ctx, []driver.InsertParams{job("q", 0), job("q", 0), job("q", 0)})
		if err != nil || len(ids) != 3 || !(ids[0] < ids[1] && ids[1] < ids[2]) {
			t.Fatalf("insert: ids %v err %v; want 3 ascending ids", ids, err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(rows) != 3 {
			t.Fatalf("claim: %d rows err %v; want 3", len(rows), err)
		}
		for _, r := range rows {
			if r.State != driver.StateRunning || r.Attempt != 1 || r.AttemptedBy != "w1" || r.LeaseExpiresAt.IsZero() || string(r.Args) == "" {
				t.Fatalf("claimed row not running/attempt 1/leased: %+v", r)
			}
			var v map[string]int
			if err := json.Unmarshal(r.Args, &v); err != nil || v["a"] != 1 {
				t.Fatalf("args round trip: %s", r.Args)
			}
		}
		more, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(more) != 0 {
			t.Fatalf("second claim got %d rows, want 0 (err %v)", len(more), err)
		}
		fence := Fences(rows)
		out := []driver.Outcome{
			{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateCompleted},
			{ID: ids[1], Fence: fence[ids[1]], Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: "boom", Trace: "stack"}},
			{ID: ids[2], Fence: fence[ids[2]] + 1, Attempt: 2, State: driver.StateCompleted}, // stale fence
		}
		applied, err := d.Complete(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(applied, func(i, j int) bool { return applied[i] < applied[j] })
		if len(applied) != 2 || applied[0] != ids[0] || applied[1] != ids[1] {
			t.Fatalf("applied %v, want %v", applied, ids[:2])
		}
		j0, _ := d.GetJob(ctx, ids[0])
		j1, _ := d.GetJob(ctx, ids[1])
		j2, _ := d.GetJob(ctx, ids[2])
		if j0.State != driver.StateCompleted || j0.FinalizedAt.IsZero() || !j0.LeaseExpiresAt.IsZero() {
			t.Fatalf("completed job: %+v", j0)
		}
		if j1.State != driver.StateRetryable || len(j1.Errors) != 1 || j1.Errors[0].Error != "boom" || j1.Errors[0].Trace != "stack" || j1.Errors[0].Attempt != 1 {
			t.Fatalf("retryable job: %+v", j1)
		}
		if time.Until(j1.ScheduledAt) < 50*time.Minute {
			t.Fatalf("retry scheduled at %v, want about an hour from now", j1.ScheduledAt)
		}
		if j2.State != driver.StateRunning {
			t.Fatalf("stale outcome was applied: %+v", j2)
		}
		// Applying the same outcome twice changes nothing the second time.
		again, err := d.Complete(ctx, out[:1])
		if err != nil || len(again) != 0 {
			t.Fatalf("repeated completion applied %v err %v", again, err)
		}
	})

	t.Run("PriorityOrderAndQueues", func(t *testing.T) {
		d := s.setup(t)
		in := []driver.InsertParams{job("a", 5), job("a", 1), job("b", 0), job("a", 3), job("a", 1)}
		ids, err := d.Insert(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for {
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 {
				break
			}
			if rows[0].Queue != "a" {
				t.Fatalf("claimed from queue %q", rows[0].Queue)
			}
			got = append(got, rows[0].ID)
		}
		want := []int64{ids[1], ids[4], ids[3], ids[0]}
		if len(got) != len(want) {
			t.Fatalf("claimed %v want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("claim order %v, want %v (priority, then id)", got, want)
			}
		}
	})

	t.Run("ConcurrentClaimsNeverShare", func(t *testing.T) {
		d := s.setup(t)
		const n = 600
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = job("c", i%3)
		}
		if _, err := d.Insert(ctx, in); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 7, Lease: time.Minute, Worker: "w"})
					if err != nil {
						errs <- err
						return
					}
					if len(rows) == 0 {
						return
					}
					out := make([]driver.Outcome, len(rows))
					mu.Lock()
					for i, r := range rows {
						seen[r.ID]++
						out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
					}
					mu.Unlock()
					if _, err := d.Complete(ctx, out); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent claim/complete error: %v", err)
		}
		if len(seen) != n {
			t.Fatalf("claimed %d distinct jobs, want %d", len(seen), n)
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("job %d handed out %d times", id, c)
			}
		}
	})

	// ClaimJob takes one job by id whatever its queue or schedule, as a
	// claim would (attempt, fence, lease, attempted_by), and only a job
	// that is neither running nor finished.
	t.Run("ClaimJob", func(t *testing.T) {
		d := s.setup(t)
		later := job("a", 5)
		later.Delay = time.Hour
		ids, err := d.Insert(ctx, []driver.InsertParams{job("a", 0), later, job("b", 0)})
		if err != nil {
			t.Fatal(err)
		}
		j, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1")
		if err != nil {
			t.Fatalf("claim of the scheduled job: %v", err)
		}
		if j.ID != ids[1] || j.State != driver.StateRunning || j.Attempt != 1 || j.Fence < 1 || j.AttemptedBy != "w1" ||
			j.Queue != "a" || j.Kind != "k" || j.Priority != 5 || j.MaxAttempts != 3 || string(j.Args) == "" {
			t.Fatalf("claimed row: %+v", j)
		}
		if l := j.LeaseExpiresAt.Sub(j.AttemptedAt); l < 59*time.Second || l > 61*time.Second {
			t.Fatalf("lease %v from the attempt, want the minute asked (%+v)", l, j)
		}
		stored, _ := d.GetJob(ctx, ids[1])
		if stored.State != driver.StateRunning || stored.Fence != j.Fence || stored.Attempt != 1 || !stored.LeaseExpiresAt.Equal(j.LeaseExpiresAt) {
			t.Fatalf("stored row %+v differs from the claimed one %+v", stored, j)
		}
		if _, err := d.ClaimJob(ctx, ids[1], time.Minute, "w2"); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("claim of a running job: %v, want ErrWrongState", err)
		}
		if _, err := d.ClaimJob(ctx, 1<<40, time.Minute, "w2"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("claim of a missing job: %v, want ErrNotFound", err)
		}
		// The queue's claims do not hand it out again; the other job of
		// the queue is still theirs.
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 10, Lease: time.Minute, Worker: "w3"})
		if err != nil || len(rows) != 1 || rows[0].ID != ids[0] {
			t.Fatalf("claim of queue a after ClaimJob: %d rows %v, want only job %d", len(rows), err, ids[0])
		}
		// Its outcome is fenced like a claimed attempt's.
		fail := driver.Outcome{ID: ids[1], Fence: j.Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: "boom"}}
		if applied, err := d.Complete(ctx, []driver.Outcome{fail}); err != nil || len(applied) != 1 {
			t.Fatalf("outcome of the ClaimJob attempt: applied %v err %v", applied, err)
		}
		// A retryable job is claimed again before its retry is due.
		j2, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1")
		if err != nil || j2.Attempt != 2 || j2.Fence <= j.Fence || len(j2.Errors) != 1 {
			t.Fatalf("claim of the retryable job: %+v %v", j2, err)
		}
		done := driver.Outcome{ID: ids[1], Fence: j2.Fence, Attempt: 2, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{done}); err != nil || len(applied) != 1 {
			t.Fatalf("completion: applied %v err %v", applied, err)
		}
		if _, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1"); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("claim of a completed job: %v, want ErrWrongState", err)
		}
		// A released ClaimJob attempt gives the attempt back, not the fence.
		j3, err := d.ClaimJob(ctx, ids[2], time.Minute, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if n, err := d.Release(ctx, []driver.Lease{{ID: ids[2], Fence: j3.Fence}}); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		j4, err := d.ClaimJob(ctx, ids[2], time.Minute, "w1")
		if err != nil || j4.Attempt != j3.Attempt || j4.Fence <= j3.Fence {
			t.Fatalf("claim after release: attempt %d fence %d (err %v), want attempt %d and a fence above %d", j4.Attempt, j4.Fence, err, j3.Attempt, j3.Fence)
		}
	})

	// A ClaimJob racing a queue's Claim for the same job: exactly one of
	// them gets it.
	t.Run("ClaimJobRacesClaim", func(t *testing.T) {
		d := s.setup(t)
		const n = 20
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = job("race", 0)
		}
		ids, err := d.Insert(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		got := map[int64]int{}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "race", Limit: 1, Lease: time.Minute, Worker: "claim"})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if len(rows) == 0 {
					return
				}
				mu.Lock()
				got[rows[0].ID]++
				mu.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			for i := n - 1; i >= 0; i-- {
				_, err := d.ClaimJob(ctx, ids[i], time.Minute, "claim-job")
				switch {
				case err == nil:
					mu.Lock()
					got[ids[i]]++
					mu.Unlock()
				case !errors.Is(err, driver.ErrWrongState):
					t.Errorf("claim job %d: %v", ids[i], err)
				}
			}
		}()
		wg.Wait()
		for _, id := range ids {
			if got[id] != 1 {
				t.Fatalf("job %d handed out %d times, want once (all: %v)", id, got[id], got)
			}
		}
	})
}
