package drivertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keyRates runs the suite's tests of rates per key (QueueLimits.KeyRate,
// KeyRatePeriod): at most KeyRate starts of a key within its window,
// whatever the attempts' outcomes, jobs without a key never held, the
// rate beside the limits per key and Ordered, changed while its windows
// are full, and held across concurrent claimers. Windows are an hour
// wherever a test must not see one pass.
func keyRates(t *testing.T, s suite) {
	ctx := context.Background()
	// heldByRate checks that r was held by a key's window: Held, and
	// RetryIn within (0, period].
	heldByRate := func(t *testing.T, what string, r driver.ClaimResult, period time.Duration) {
		t.Helper()
		if !r.Held || r.RetryIn <= 0 || r.RetryIn > period {
			t.Fatalf("%s: held %v, retry in %v; want held by a key's window, retry within (0, %v]", what, r.Held, r.RetryIn, period)
		}
	}

	t.Run("Stored", func(t *testing.T) {
		d := s.setup(t)
		want := driver.QueueLimits{KeyRate: 5, KeyRatePeriod: time.Hour}
		both := driver.QueueLimits{MaxRunning: 4, Rate: 10, RatePeriod: time.Second, KeyMaxRunning: 2, KeyRate: 7, KeyRatePeriod: 1500 * time.Millisecond}
		ordered := driver.QueueLimits{Ordered: true, KeyRate: 1, KeyRatePeriod: time.Millisecond}
		setLimits(t, d, "kr", want)
		setLimits(t, d, "both", both)
		setLimits(t, d, "ord", ordered)
		got, err := d.QueueLimits(ctx)
		if err != nil || got["kr"] != want || got["both"] != both || got["ord"] != ordered || len(got) != 3 {
			t.Fatalf("limits %+v, %v; want kr %+v, both %+v, ord %+v", got, err, want, both, ordered)
		}
		u, err := d.LimitUsage(ctx)
		if err != nil || u["kr"].Limits != want || u["both"].Limits != both || u["kr"].KeysRated != 0 || u["kr"].KeyHeld != 0 {
			t.Fatalf("usage %+v, %v", u, err)
		}
		for _, bad := range []struct {
			l     driver.QueueLimits
			field string
		}{
			{driver.QueueLimits{KeyRate: -1, KeyRatePeriod: time.Hour}, "KeyRate"},
			{driver.QueueLimits{KeyRate: 3}, "KeyRatePeriod"},
			{driver.QueueLimits{KeyRatePeriod: time.Hour}, "KeyRatePeriod"},
		} {
			err := d.SetQueueLimits(ctx, "kr", bad.l)
			if err == nil || !strings.Contains(err.Error(), bad.field) {
				t.Fatalf("limits %+v: %v, want an error naming %s", bad.l, err, bad.field)
			}
		}
		if got, _ := d.QueueLimits(ctx); got["kr"] != want {
			t.Fatalf("limits after refused changes: %+v, want %+v", got["kr"], want)
		}
		for _, q := range []string{"kr", "both", "ord"} {
			setLimits(t, d, q, driver.QueueLimits{})
		}
		if got, err := d.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("limits after removal: %+v, %v", got, err)
		}
	})

	t.Run("Window", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 10; i++ {
			jobs = append(jobs, keyedJob("w", "a", 0), keyedJob("w", "b", 0))
		}
		for i := 0; i < 5; i++ {
			jobs = append(jobs, job("w", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "w", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour})
		r := claimLimited(t, d, "w", 50, time.Minute)
		heldByRate(t, "first claim", r, time.Hour)
		var all []*driver.JobRow
		all = append(all, r.Rows...)
		for i := 0; i < 3; i++ {
			again := claimLimited(t, d, "w", 50, time.Minute)
			all = append(all, again.Rows...)
			heldByRate(t, fmt.Sprintf("claim %d with both windows full", i+2), again, time.Hour)
		}
		if got := countByKey(all); got["a"] != 3 || got["b"] != 3 || got[""] != 5 || len(all) != 11 {
			t.Fatalf("claims took %v at 3 per key per hour, want a:3 b:3 and the 5 without a key", got)
		}
		// Ending the attempts frees nothing, whatever their outcome; nor
		// does a sweep.
		for i, row := range all {
			if i%2 == 0 {
				completeJob(t, d, row, driver.StateCompleted, 0)
			} else {
				completeJob(t, d, row, driver.StateRetryable, time.Hour)
			}
		}
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		again := claimLimited(t, d, "w", 50, time.Minute)
		if len(again.Rows) != 0 {
			t.Fatalf("after the attempts ended and a sweep: claimed %v, want none (each key's window is full)", countByKey(again.Rows))
		}
		heldByRate(t, "claim after the attempts ended", again, time.Hour)
		u, err := d.LimitUsage(ctx)
		if err != nil || u["w"].KeysRated != 2 || u["w"].KeyHeld != 14 || u["w"].KeysRunning != 0 || u["w"].Limits.KeyRate != 3 {
			t.Fatalf("usage %+v, %v; want 2 keys rated, 14 jobs held by their key, none running", u["w"], err)
		}
	})

	t.Run("BesideKeyMaxRunning", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 6; i++ {
			jobs = append(jobs, keyedJob("km", "a", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "km", driver.QueueLimits{KeyMaxRunning: 1, KeyRate: 3, KeyRatePeriod: time.Hour})
		ran := 0
		for i := 0; i < 3; i++ {
			r := claimLimited(t, d, "km", 10, time.Minute)
			if len(r.Rows) != 1 {
				t.Fatalf("claim %d: took %d, want 1", i+1, len(r.Rows))
			}
			if i < 2 && (!r.Held || r.RetryIn != 0) {
				t.Fatalf("claim %d: held %v, retry in %v; want held by the key's slot, with room in its window (retry in 0)", i+1, r.Held, r.RetryIn)
			}
			if i == 2 {
				// The third start fills the key's window too.
				heldByRate(t, "claim of the window's last start", r, time.Hour)
			}
			ran++
			if again := claimLimited(t, d, "km", 10, time.Minute); len(again.Rows) != 0 || !again.Held {
				t.Fatalf("claim with the key's slot held: took %d (held %v)", len(again.Rows), again.Held)
			}
			completeJob(t, d, r.Rows[0], driver.StateCompleted, 0)
		}
		r := claimLimited(t, d, "km", 10, time.Minute)
		if len(r.Rows) != 0 {
			t.Fatalf("claimed %d more after %d starts at 3 per hour", len(r.Rows), ran)
		}
		heldByRate(t, "claim with the key's slot free and its window full", r, time.Hour)
		u, err := d.LimitUsage(ctx)
		if err != nil || u["km"].KeysRated != 1 || u["km"].KeyHeld != 3 || u["km"].KeysRunning != 0 {
			t.Fatalf("usage %+v, %v; want 1 key rated, its 3 jobs held", u["km"], err)
		}
	})

	t.Run("Ordered", func(t *testing.T) {
		d := s.setup(t)
		ids := insertJobs(t, d, keyedJob("o", "a", 0), keyedJob("o", "a", 0), keyedJob("o", "a", 0), keyedJob("o", "b", 0), keyedJob("o", "b", 0), keyedJob("o", "b", 0))
		setLimits(t, d, "o", driver.QueueLimits{Ordered: true, KeyRate: 2, KeyRatePeriod: time.Hour})
		r := claimLimited(t, d, "o", 10, time.Minute)
		heads := map[string]int64{}
		for _, row := range r.Rows {
			heads[row.Key] = row.ID
		}
		if len(r.Rows) != 2 || heads["a"] != ids[0] || heads["b"] != ids[3] {
			t.Fatalf("claimed %v, want each key's first job", r.Rows)
		}
		var a1 *driver.JobRow
		for _, row := range r.Rows {
			if row.Key == "a" {
				a1 = row
				completeJob(t, d, row, driver.StateRetryable, time.Hour)
			} else {
				completeJob(t, d, row, driver.StateCompleted, 0)
			}
		}
		// a's head waits for its retry and keeps its key; b goes on.
		got := claimLimited(t, d, "o", 10, time.Minute)
		if len(got.Rows) != 1 || got.Rows[0].ID != ids[4] {
			t.Fatalf("with a's head waiting for its retry: claimed %v, want b's second job", got.Rows)
		}
		completeJob(t, d, got.Rows[0], driver.StateCompleted, 0)
		// The retry, made due by hand, is a's second start: then a's
		// window is full and its second job waits, as does b's third.
		if _, err := d.Retry(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		got = claimLimited(t, d, "o", 10, time.Minute)
		if len(got.Rows) != 1 || got.Rows[0].ID != ids[0] {
			t.Fatalf("with a's head due again: claimed %v, want it alone", got.Rows)
		}
		completeJob(t, d, got.Rows[0], driver.StateCompleted, 0)
		got = claimLimited(t, d, "o", 10, time.Minute)
		if len(got.Rows) != 0 {
			t.Fatalf("with both keys' windows full: claimed %v", got.Rows)
		}
		heldByRate(t, "claim with both keys' windows full", got, time.Hour)
		u, err := d.LimitUsage(ctx)
		if err != nil || u["o"].KeysRated != 2 || u["o"].KeyHeld != 3 {
			t.Fatalf("usage %+v, %v; want 2 keys rated, 3 jobs held", u["o"], err)
		}
		// Without the rate the keys go on, each in its order.
		setLimits(t, d, "o", driver.QueueLimits{Ordered: true})
		ran := map[string][]int64{}
		for i := 0; i < 10; i++ {
			got := claimLimited(t, d, "o", 10, time.Minute)
			if len(got.Rows) == 0 {
				break
			}
			for _, row := range got.Rows {
				ran[row.Key] = append(ran[row.Key], row.ID)
				completeJob(t, d, row, driver.StateCompleted, 0)
			}
		}
		if !slices.Equal(ran["a"], ids[1:3]) || !slices.Equal(ran["b"], ids[5:6]) {
			t.Fatalf("after removing the rate: ran %v, want a %v and b %v", ran, ids[1:3], ids[5:6])
		}
	})

	t.Run("Changed", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 12; i++ {
			jobs = append(jobs, keyedJob("ch", "a", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "ch", driver.QueueLimits{KeyRate: 4, KeyRatePeriod: time.Hour})
		if got := claimLimited(t, d, "ch", 20, time.Minute); len(got.Rows) != 4 {
			t.Fatalf("claimed %d at 4 per hour, want 4", len(got.Rows))
		}
		// Lowered below the starts within the window: none.
		setLimits(t, d, "ch", driver.QueueLimits{KeyRate: 2, KeyRatePeriod: time.Hour})
		got := claimLimited(t, d, "ch", 20, time.Minute)
		if len(got.Rows) != 0 {
			t.Fatalf("claimed %d after lowering the rate to 2 with 4 starts in the window", len(got.Rows))
		}
		heldByRate(t, "claim after lowering the rate", got, time.Hour)
		// Raised: the starts within the window count.
		setLimits(t, d, "ch", driver.QueueLimits{KeyRate: 6, KeyRatePeriod: time.Hour})
		if got := claimLimited(t, d, "ch", 20, time.Minute); len(got.Rows) != 2 {
			t.Fatalf("claimed %d after raising the rate to 6 with 4 starts in the window, want 2", len(got.Rows))
		}
		// Lowered again and swept: the slots beyond the rate stay while
		// their starts are within the window, ignored by claims, so that
		// the rate raised again within the window counts them (the sweep
		// deleted them, and 4 more started at 6 per hour: 10 within the
		// hour).
		setLimits(t, d, "ch", driver.QueueLimits{KeyRate: 2, KeyRatePeriod: time.Hour})
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		if got := claimLimited(t, d, "ch", 20, time.Minute); len(got.Rows) != 0 {
			t.Fatalf("claimed %d after lowering the rate to 2 and a sweep", len(got.Rows))
		}
		setLimits(t, d, "ch", driver.QueueLimits{KeyRate: 6, KeyRatePeriod: time.Hour})
		got = claimLimited(t, d, "ch", 20, time.Minute)
		if len(got.Rows) != 0 {
			t.Fatalf("claimed %d at 6 per hour after a sweep, with 6 starts in the window", len(got.Rows))
		}
		heldByRate(t, "claim after raising the rate back to 6", got, time.Hour)
		// Removed: the key's other jobs run at once.
		setLimits(t, d, "ch", driver.QueueLimits{})
		if got := claimLimited(t, d, "ch", 20, time.Minute); len(got.Rows) != 6 || got.Held {
			t.Fatalf("claimed %d (held %v) after removing the rate, want the last 6", len(got.Rows), got.Held)
		}
	})

	t.Run("ConcurrentClaimers", func(t *testing.T) {
		d := s.setup(t)
		const nKeys, perKey, rate = 8, 20, 5
		var jobs []driver.InsertParams
		for i := 0; i < perKey; i++ {
			for k := 0; k < nKeys; k++ {
				jobs = append(jobs, keyedJob("cc", fmt.Sprintf("key-%d", k), 0))
			}
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "cc", driver.QueueLimits{KeyRate: rate, KeyRatePeriod: time.Hour})
		var mu sync.Mutex
		claimed := map[int64]int{}
		perKeyRan := map[string]int{}
		var firstErr error
		fail := func(err error) { // under mu
			if firstErr == nil {
				firstErr = err
			}
		}
		deadline := time.Now().Add(60 * time.Second)
		var wg sync.WaitGroup
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					mu.Lock()
					stop := len(claimed) >= nKeys*rate || firstErr != nil
					mu.Unlock()
					if stop {
						return
					}
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "cc", Limit: 3, Lease: time.Minute, Worker: "w"})
					mu.Lock()
					if err != nil {
						fail(err)
					}
					for _, row := range r.Rows {
						claimed[row.ID]++
						perKeyRan[row.Key]++
					}
					mu.Unlock()
					for _, row := range r.Rows {
						o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
						if applied, err := d.Complete(ctx, []driver.Outcome{o}); err != nil || len(applied) != 1 {
							mu.Lock()
							fail(fmt.Errorf("complete %d: %v, %v", row.ID, applied, err))
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
		// Every window full: a last claim takes nothing.
		last := claimLimited(t, d, "cc", 50, time.Minute)
		for _, row := range last.Rows {
			claimed[row.ID]++
			perKeyRan[row.Key]++
		}
		for id, n := range claimed {
			if n != 1 {
				t.Fatalf("job %d claimed %d times", id, n)
			}
		}
		for k := 0; k < nKeys; k++ {
			if got := perKeyRan[fmt.Sprintf("key-%d", k)]; got != rate {
				t.Fatalf("key-%d started %d jobs within the hour (all keys: %v), want %d", k, got, perKeyRan, rate)
			}
		}
		heldByRate(t, "last claim", last, time.Hour)
	})

	t.Run("ShortPeriod", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 6; i++ {
			jobs = append(jobs, keyedJob("sp", "a", 0), keyedJob("sp", "b", 0))
		}
		insertJobs(t, d, jobs...)
		const period = 300 * time.Millisecond
		setLimits(t, d, "sp", driver.QueueLimits{KeyRate: 2, KeyRatePeriod: period})
		r := claimLimited(t, d, "sp", 20, time.Minute)
		if got := countByKey(r.Rows); got["a"] != 2 || got["b"] != 2 {
			t.Fatalf("first claim took %v at 2 per key per %v, want 2 of each key", got, period)
		}
		heldByRate(t, "first claim", r, period)
		total := countByKey(r.Rows)
		// Wait for the window to pass, claiming as each claim's RetryIn
		// says; every claim takes at most 2 of a key.
		deadline := time.Now().Add(30 * time.Second)
		for wait := r.RetryIn; total["a"] <= 2 || total["b"] <= 2; {
			if time.Now().After(deadline) {
				t.Fatalf("started %v in 30s at 2 per key per %v", total, period)
			}
			time.Sleep(wait)
			got := claimLimited(t, d, "sp", 20, time.Minute)
			for k, n := range countByKey(got.Rows) {
				if n > 2 {
					t.Fatalf("one claim took %d of key %s at 2 per key per %v", n, k, period)
				}
				total[k] += n
			}
			wait = max(got.RetryIn, time.Millisecond)
		}
	})
}
