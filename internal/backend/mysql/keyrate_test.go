package mysql

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keyedJobs returns n jobs of queue with key key ("" for none).
func keyedJobs(queue, key string, n int) []driver.InsertParams {
	jobs := limitJobs(queue, n)
	for i := range jobs {
		jobs[i].Key = key
	}
	return jobs
}

// claimAll claims from queue in rounds of limit until a round takes
// nothing, returning every row claimed and the last round's result.
func claimAll(t *testing.T, d *Driver, queue string, limit int) ([]*driver.JobRow, driver.ClaimResult) {
	t.Helper()
	var all []*driver.JobRow
	for range 50 {
		d.noKeyless.Delete(queue) // look for jobs without a key every round
		r, err := d.ClaimLimited(context.Background(), driver.ClaimParams{Queue: queue, Limit: limit, Lease: time.Hour, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Rows) == 0 {
			return all, r
		}
		all = append(all, r.Rows...)
	}
	t.Fatalf("claims of %s never ran out", queue)
	return nil, driver.ClaimResult{}
}

func countKeys(rows []*driver.JobRow) map[string]int {
	m := map[string]int{}
	for _, r := range rows {
		m[r.Key]++
	}
	return m
}

func completeAll(t *testing.T, d *Driver, rows []*driver.JobRow, state string) {
	t.Helper()
	if len(rows) == 0 {
		return
	}
	outs := make([]driver.Outcome, len(rows))
	for i, r := range rows {
		outs[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: state}
		if state == driver.StateRetryable {
			outs[i].RetryIn = time.Millisecond
		}
	}
	if applied, err := d.Complete(context.Background(), outs); err != nil || len(applied) != len(rows) {
		t.Fatalf("complete: %d of %d, %v", len(applied), len(rows), err)
	}
}

// TestKeyRateStored: a rate per key is stored and returned with the
// queue's other limits, and values the database cannot hold are refused
// naming the field.
func TestKeyRateStored(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	want := driver.QueueLimits{MaxRunning: 4, KeyMaxRunning: 2, KeyRate: 3, KeyRatePeriod: 90 * time.Minute}
	if err := d.SetQueueLimits(ctx, "ks", want); err != nil {
		t.Fatal(err)
	}
	only := driver.QueueLimits{KeyRate: 7, KeyRatePeriod: 1500 * time.Microsecond}
	if err := d.SetQueueLimits(ctx, "ko", only); err != nil {
		t.Fatal(err)
	}
	got, err := d.QueueLimits(ctx)
	if err != nil || got["ks"] != want || got["ko"] != only {
		t.Fatalf("limits %+v, %v; want ks %+v and ko %+v", got, err, want, only)
	}
	u, err := d.LimitUsage(ctx)
	if err != nil || u["ko"].Limits != only {
		t.Fatalf("usage %+v, %v; want the limits of ko", u, err)
	}
	for _, c := range []struct {
		l     driver.QueueLimits
		field string
	}{
		{driver.QueueLimits{KeyRate: -1, KeyRatePeriod: time.Second}, "KeyRate "},
		{driver.QueueLimits{KeyRate: 100001, KeyRatePeriod: time.Second}, "KeyRate "},
		{driver.QueueLimits{KeyRate: 3}, "KeyRatePeriod"},
		{driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Nanosecond}, "KeyRatePeriod"},
		{driver.QueueLimits{KeyRatePeriod: time.Second}, "KeyRatePeriod"},
	} {
		err := d.SetQueueLimits(ctx, "ks", c.l)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("limits %+v: %v, want an error naming %s", c.l, err, c.field)
		}
	}
	if got, _ := d.QueueLimits(ctx); got["ks"] != want {
		t.Fatalf("limits %+v after refused changes, want %+v", got["ks"], want)
	}
	if err := d.SetQueueLimits(ctx, "ks", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.QueueLimits(ctx); !got["ks"].IsZero() {
		t.Fatalf("limits %+v after their removal", got["ks"])
	}
}

// TestKeyRateTakesEachKeysWindow: 3 starts per hour per key take exactly
// 3 jobs of each key however many claims run, every job without a key,
// and say when the oldest start leaves its window; outcomes give nothing
// back, and the usage counts the full windows and the jobs they hold.
func TestKeyRateTakesEachKeysWindow(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			jobs := append(keyedJobs("kr", "a", 10), keyedJobs("kr", "b", 10)...)
			jobs = append(jobs, keyedJobs("kr", "", 5)...)
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "kr", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
				t.Fatal(err)
			}
			rows, last := claimAll(t, d, "kr", 50)
			if got := countKeys(rows); got["a"] != 3 || got["b"] != 3 || got[""] != 5 || len(rows) != 11 {
				t.Fatalf("claimed %v, want 3 of a, 3 of b and the 5 without a key", got)
			}
			if !last.Held || last.RetryIn <= 0 || last.RetryIn > time.Hour {
				t.Fatalf("claim after the windows filled: held %v, retry in %v; want held, within the hour", last.Held, last.RetryIn)
			}
			u, err := d.LimitUsage(ctx)
			if err != nil || u["kr"].KeysRated != 2 || u["kr"].KeyHeld != 14 {
				t.Fatalf("usage %+v, %v; want 2 keys rated, 14 jobs held", u["kr"], err)
			}
			completeAll(t, d, rows[:4], driver.StateCompleted)
			completeAll(t, d, rows[4:], driver.StateRetryable)
			if _, err := d.db.ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET state = 'available' WHERE state = 'retryable'"); err != nil {
				t.Fatal(err)
			}
			more, last := claimAll(t, d, "kr", 50)
			if got := countKeys(more); got["a"] != 0 || got["b"] != 0 {
				t.Fatalf("claimed %v after outcomes and retries, want none of a or b", got)
			}
			if !last.Held {
				t.Fatal("claim not held while keys' windows are full")
			}
		})
	}
}

// TestKeyRateWithKeyMaxRunning: a key's job needs both a free slot and a
// start left in its window.
func TestKeyRateWithKeyMaxRunning(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, keyedJobs("km", "a", 6)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "km", driver.QueueLimits{KeyMaxRunning: 1, KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := 0; i < 5; i++ {
		rows, _ := claimAll(t, d, "km", 10)
		if len(rows) > 1 {
			t.Fatalf("claimed %d of key a at once under KeyMaxRunning 1", len(rows))
		}
		total += len(rows)
		if len(rows) == 1 && total < 3 {
			// The key's slot, not its window, holds its other jobs.
			r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "km", Limit: 10, Lease: time.Hour, Worker: "w"})
			if err != nil || len(r.Rows) != 0 || !r.Held || r.RetryIn != 0 {
				t.Fatalf("claim with the key's slot held and room in its window: %d rows, held %v, retry in %v, %v; want held, retry in 0", len(r.Rows), r.Held, r.RetryIn, err)
			}
		}
		completeAll(t, d, rows, driver.StateCompleted)
	}
	if total != 3 {
		t.Fatalf("claimed %d of key a in all, want the rate's 3", total)
	}
	if u, _ := d.LimitUsage(ctx); u["km"].KeysRated != 1 || u["km"].KeyHeld != 3 || u["km"].KeysRunning != 0 {
		t.Fatalf("usage %+v, want 1 key rated holding 3 jobs", u["km"])
	}
}

// TestKeyRateOrdered: an ordered key's jobs start in id order, and the
// retry of a job holding its key's slot is a start of the key too.
func TestKeyRateOrdered(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	ids, err := d.Insert(ctx, keyedJobs("ko", "a", 5))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "ko", driver.QueueLimits{Ordered: true, KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var got []int64
	rows, _ := claimAll(t, d, "ko", 10)
	if len(rows) != 1 || rows[0].ID != ids[0] {
		t.Fatalf("claimed %v, want the key's head %d", rows, ids[0])
	}
	got = append(got, rows[0].ID)
	// The head fails: it keeps the key's slot, and its retry is the
	// key's second start.
	completeAll(t, d, rows, driver.StateRetryable)
	if _, err := d.db.ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET state = 'available' WHERE state = 'retryable'"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		rows, _ := claimAll(t, d, "ko", 10)
		if len(rows) > 1 {
			t.Fatalf("claimed %d of an ordered key at once", len(rows))
		}
		for _, r := range rows {
			got = append(got, r.ID)
		}
		completeAll(t, d, rows, driver.StateCompleted)
	}
	if want := []int64{ids[0], ids[0], ids[1]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("started %v, want %v: the head, its retry, the next job, then the window is full", got, want)
	}
}

// TestKeyRateChanged: a lowered rate ignores the slots beyond it, a
// raised one makes more, and a removed one holds nothing.
func TestKeyRateChanged(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, keyedJobs("kc", "a", 20)); err != nil {
		t.Fatal(err)
	}
	set := func(l driver.QueueLimits) {
		if err := d.SetQueueLimits(ctx, "kc", l); err != nil {
			t.Fatal(err)
		}
	}
	set(driver.QueueLimits{KeyRate: 2, KeyRatePeriod: time.Hour})
	if rows, _ := claimAll(t, d, "kc", 10); len(rows) != 2 {
		t.Fatalf("claimed %d under 2 per hour, want 2", len(rows))
	}
	set(driver.QueueLimits{KeyRate: 1, KeyRatePeriod: time.Hour})
	if rows, r := claimAll(t, d, "kc", 10); len(rows) != 0 || !r.Held {
		t.Fatalf("claimed %d (held %v) under a rate lowered below the window's starts", len(rows), r.Held)
	}
	set(driver.QueueLimits{KeyRate: 5, KeyRatePeriod: time.Hour})
	if rows, _ := claimAll(t, d, "kc", 10); len(rows) != 3 {
		t.Fatalf("claimed %d under a rate raised to 5, want the 3 more", len(rows))
	}
	set(driver.QueueLimits{})
	if rows, _ := claimAll(t, d, "kc", 20); len(rows) != 15 {
		t.Fatalf("claimed %d once the rate was removed, want the 15 left", len(rows))
	}
}

// TestKeyRateConcurrentClaimers: claimers racing over many keys start
// exactly the rate of each key, and no job twice.
func TestKeyRateConcurrentClaimers(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			const keys, perKey, rate = 8, 20, 5
			var jobs []driver.InsertParams
			for k := 0; k < keys; k++ {
				jobs = append(jobs, keyedJobs("kx", fmt.Sprintf("key-%d", k), perKey)...)
			}
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "kx", driver.QueueLimits{KeyRate: rate, KeyRatePeriod: time.Hour}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			seen := map[int64]bool{}
			byKey := map[string]int{}
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for c := 0; c < 6; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for round := 0; round < 10; round++ {
						r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "kx", Limit: 7, Lease: time.Hour, Worker: "w"})
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						for _, j := range r.Rows {
							if seen[j.ID] {
								errs <- fmt.Errorf("job %d claimed twice", j.ID)
							}
							seen[j.ID] = true
							byKey[j.Key]++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// Claims may have lost races to each other: what is left
			// to take is taken now, and no more.
			rows, _ := claimAll(t, d, "kx", 50)
			for _, j := range rows {
				if seen[j.ID] {
					t.Fatalf("job %d claimed twice", j.ID)
				}
				byKey[j.Key]++
			}
			for k := 0; k < keys; k++ {
				if n := byKey[fmt.Sprintf("key-%d", k)]; n != rate {
					t.Errorf("key-%d: %d claimed, want %d", k, n, rate)
				}
			}
		})
	}
}

// TestKeyRateShortPeriod: once the period has passed, a key's window has
// room again.
func TestKeyRateShortPeriod(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, append(keyedJobs("kp", "a", 6), keyedJobs("kp", "b", 6)...)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "kp", driver.QueueLimits{KeyRate: 2, KeyRatePeriod: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "kp", Limit: 10, Lease: time.Hour, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if got := countKeys(r.Rows); got["a"] > 2 || got["b"] > 2 {
		t.Fatalf("first claim took %v, want at most 2 per key", got)
	}
	total := len(r.Rows)
	deadline := time.Now().Add(time.Minute)
	for total <= 4 && time.Now().Before(deadline) {
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "kp", Limit: 10, Lease: time.Hour, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		total += len(r.Rows)
		if len(r.Rows) == 0 {
			// The window's wait, as a worker's: the passing of time is
			// the event awaited.
			time.Sleep(max(r.RetryIn, 10*time.Millisecond))
		}
	}
	if total <= 4 {
		t.Fatalf("claimed %d in a minute under 2 per 300ms per key, want more than one window's 4", total)
	}
}

// TestKeyRateSweep: the rescue's sweep deletes the rate slots stamped
// longer ago than their period or a minute, or never, those beyond a
// lowered rate and those of a queue without one, and never a slot stamped
// within the window.
func TestKeyRateSweep(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	jobs := append(keyedJobs("kw", "a", 6), keyedJobs("kn", "a", 2)...)
	jobs = append(jobs, keyedJobs("ks", "a", 3)...)
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"kw", "kn"} {
		if err := d.SetQueueLimits(ctx, q, driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetQueueLimits(ctx, "ks", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Second}); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]int{"kw": 3, "kn": 2, "ks": 3} {
		if rows, _ := claimAll(t, d, q, 10); len(rows) != want {
			t.Fatalf("claimed %d of %s, want %d", len(rows), q, want)
		}
	}
	slots := func(q, where string) int {
		t.Helper()
		var n int
		if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"limit_slots` WHERE type = 'w' AND queue = ? AND "+where, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := d.db.ExecContext(ctx, strings.ReplaceAll(q, "{p}", d.prefix), args...); err != nil {
			t.Fatal(err)
		}
	}
	// kw, an hour's window: slot 0's start left it an hour ago, slot 1
	// and 2 are within it; a slot beyond the rate (as after a lowered
	// rate), and one never stamped.
	exec("UPDATE `{p}limit_slots` SET used_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR WHERE queue = 'kw' AND type = 'w' AND n = 0")
	exec("UPDATE `{p}limit_slots` SET used_at = UTC_TIMESTAMP(6) - INTERVAL 59 MINUTE WHERE queue = 'kw' AND type = 'w' AND n = 1")
	exec("INSERT INTO `{p}limit_slots` (queue, type, lkey, n, used_at) VALUES ('kw', 'w', 'a', 3, UTC_TIMESTAMP(6)), ('kw', 'w', 'b', 0, NULL)")
	// ks, a second's window: a start 30s ago is kept a minute, one 2
	// minutes ago is not.
	exec("UPDATE `{p}limit_slots` SET used_at = UTC_TIMESTAMP(6) - INTERVAL 30 SECOND WHERE queue = 'ks' AND type = 'w' AND n = 0")
	exec("UPDATE `{p}limit_slots` SET used_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE WHERE queue = 'ks' AND type = 'w' AND n = 1")
	// kn loses its rate per key: its slots go, stamped or not.
	if err := d.SetQueueLimits(ctx, "kn", driver.QueueLimits{MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	if n := slots("kn", "TRUE"); n == 0 {
		t.Fatal("no rate slots of kn before the sweep")
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q, where string
		want     int
		what     string
	}{
		{"kw", "lkey = 'a' AND n = 0", 0, "stamped two hours ago, its period an hour"},
		{"kw", "lkey = 'a' AND n = 1", 1, "stamped 59 minutes ago, its period an hour"},
		{"kw", "lkey = 'a' AND n = 2", 1, "stamped by the claim"},
		{"kw", "lkey = 'a' AND n = 3", 0, "beyond the rate"},
		{"kw", "lkey = 'b'", 0, "never stamped"},
		{"ks", "n = 0", 1, "stamped 30s ago, its period a second"},
		{"ks", "n = 1", 0, "stamped 2 minutes ago, its period a second"},
		{"kn", "TRUE", 0, "of a queue without a rate per key"},
	} {
		if n := slots(c.q, c.where); n != c.want {
			t.Errorf("%s: %d rate slots %s, want %d", c.q, n, c.what, c.want)
		}
	}
	// One start left kw's window (slot 0's, deleted and made again); two
	// are still within it.
	if rows, _ := claimAll(t, d, "kw", 10); len(rows) != 1 {
		t.Fatalf("claimed %d after the sweep, want the one start that left the window", len(rows))
	}
}

// TestKeyRateEndsFreeNothing: the paths that end an attempt by its job
// (release, cancel, an expired lease's rescue) free its key slot but
// never a rate slot: the start stays in its key's window.
func TestKeyRateEndsFreeNothing(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, keyedJobs("ke", "a", 8)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "ke", driver.QueueLimits{KeyMaxRunning: 3, KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rows, _ := claimAll(t, d, "ke", 10)
	if len(rows) != 3 {
		t.Fatalf("claimed %d, want 3", len(rows))
	}
	stamps := func() string {
		t.Helper()
		var s string
		if err := d.db.QueryRowContext(ctx, "SELECT COALESCE(GROUP_CONCAT(n, '@', used_at ORDER BY n), '') FROM `"+d.prefix+"limit_slots` WHERE queue = 'ke' AND type = 'w' AND job_id IS NULL AND fence IS NULL").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := stamps()
	if n, err := d.Release(ctx, []driver.Lease{{ID: rows[0].ID, Fence: rows[0].Fence}}); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	if _, err := d.Cancel(ctx, rows[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", rows[2].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if after := stamps(); after != before || strings.Count(after, "@") != 3 {
		t.Fatalf("rate slots %q after the attempts ended, want them as the claim stamped them: %q", after, before)
	}
	if u, _ := d.LimitUsage(ctx); u["ke"].KeysRunning != 0 || u["ke"].KeysRated != 1 || u["ke"].KeyHeld != 7 {
		t.Fatalf("usage %+v, want no key slot held, the key rated holding its 7 available jobs", u["ke"])
	}
	if more, r := claimAll(t, d, "ke", 10); len(more) != 0 || !r.Held || r.RetryIn <= 0 || r.RetryIn > time.Hour {
		t.Fatalf("claimed %d (held %v, retry in %v) with the key's window full", len(more), r.Held, r.RetryIn)
	}
}

// TestKeyRateWithQueueLimits: the queue's MaxRunning and Rate bound the
// claims as well as each key's window.
func TestKeyRateWithQueueLimits(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			if _, err := d.Insert(ctx, append(keyedJobs("kq", "a", 6), keyedJobs("kq", "b", 6)...)); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "kq", driver.QueueLimits{MaxRunning: 2, KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
				t.Fatal(err)
			}
			var all []*driver.JobRow
			for i := 0; i < 6; i++ {
				rows, _ := claimAll(t, d, "kq", 10)
				if len(rows) > 2 {
					t.Fatalf("claimed %d at once under MaxRunning 2", len(rows))
				}
				all = append(all, rows...)
				completeAll(t, d, rows, driver.StateCompleted)
			}
			if got := countKeys(all); got["a"] != 3 || got["b"] != 3 {
				t.Fatalf("claimed %v under MaxRunning 2 and 3 per key per hour, want 3 of each", got)
			}
			// A queue's rate of 4 per hour stops the claims first.
			if err := d.SetQueueLimits(ctx, "kr", driver.QueueLimits{Rate: 4, RatePeriod: time.Hour, KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Insert(ctx, append(keyedJobs("kr", "a", 6), keyedJobs("kr", "b", 6)...)); err != nil {
				t.Fatal(err)
			}
			rows, r := claimAll(t, d, "kr", 10)
			if got := countKeys(rows); len(rows) != 4 || got["a"] > 3 || got["b"] > 3 {
				t.Fatalf("claimed %v under 4 per hour and 3 per key per hour, want 4, at most 3 of a key", got)
			}
			if !r.Held || r.RetryIn <= 0 || r.RetryIn > time.Hour {
				t.Fatalf("claim with the queue's window full: held %v, retry in %v", r.Held, r.RetryIn)
			}
		})
	}
}

// TestKeyRateSlotsForTheJobs: a claim makes a key's rate slots for the
// jobs the key has, not for the claim's whole room.
func TestKeyRateSlotsForTheJobs(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, append(keyedJobs("kj", "x", 1), keyedJobs("kj", "y", 3)...)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "kj", driver.QueueLimits{KeyRate: 100, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rows := claimLimited(t, d, "kj", 50, time.Hour); len(rows) != 4 {
		t.Fatalf("claimed %d, want the 4 jobs", len(rows))
	}
	for key, want := range map[string]int{"x": 1, "y": 3} {
		var n, stamped int
		if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(used_at) FROM `"+d.prefix+"limit_slots` WHERE queue = 'kj' AND type = 'w' AND lkey = ?", key).Scan(&n, &stamped); err != nil {
			t.Fatal(err)
		}
		if n != want || stamped != want {
			t.Errorf("key %s: %d rate slots, %d stamped; want %d, each stamped", key, n, stamped, want)
		}
	}
}
