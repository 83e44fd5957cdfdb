package mysql

import (
	"context"
	"strings"
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
		d.noKeyless.Forget(queue) // look for jobs without a key every round
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

// TestKeyRateRefused: values the database cannot hold are refused naming
// the field (KeyRate apart from KeyRatePeriod), and the limits stay as
// they were. The driver suite checks the storing itself.
func TestKeyRateRefused(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	want := driver.QueueLimits{MaxRunning: 4, KeyMaxRunning: 2, KeyRate: 3, KeyRatePeriod: 90 * time.Minute}
	if err := d.SetQueueLimits(ctx, "ks", want); err != nil {
		t.Fatal(err)
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
}

// TestKeyRateSweep: the rescue's sweep deletes the rate slots stamped
// longer ago than their period or a minute, or never, and those of a
// queue without a rate per key, and never a slot stamped within the
// window, beyond a lowered rate too (the rate raised again within the
// window counts it).
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
		{"kw", "lkey = 'a' AND n = 3", 1, "beyond the rate, stamped within the window"},
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
