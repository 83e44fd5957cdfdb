package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keyedJobs returns n jobs of queue with key (none when key is "").
func keyedJobs(queue, key string, n int) []driver.InsertParams {
	out := make([]driver.InsertParams, n)
	for i := range out {
		out[i] = pj(queue)
		out[i].Key = key
	}
	return out
}

// insertJobs inserts the jobs of every group.
func insertJobs(t *testing.T, d *Driver, groups ...[]driver.InsertParams) {
	t.Helper()
	var all []driver.InsertParams
	for _, g := range groups {
		all = append(all, g...)
	}
	if _, err := d.Insert(context.Background(), all); err != nil {
		t.Fatal(err)
	}
}

// claimAll claims queue's jobs with ClaimLimited, limit at a time, until
// a claim takes none, and returns them with the last claim's result.
func claimAll(t *testing.T, d *Driver, queue string, limit int) ([]*driver.JobRow, driver.ClaimResult) {
	t.Helper()
	var all []*driver.JobRow
	for i := 0; ; i++ {
		r, err := d.ClaimLimited(context.Background(), driver.ClaimParams{Queue: queue, Limit: limit, Lease: time.Hour, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, r.Rows...)
		if len(r.Rows) == 0 {
			return all, r
		}
		if i > 1000 {
			t.Fatal("claims never ran dry")
		}
	}
}

func perKey(rows []*driver.JobRow) map[string]int {
	m := map[string]int{}
	for _, r := range rows {
		m[r.Key]++
	}
	return m
}

// countSlots counts queue's key slot rows matching where.
func countSlots(t *testing.T, d *Driver, queue, where string) int {
	t.Helper()
	var n int
	if err := d.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+d.prefix+"key_slots WHERE queue = $1 AND "+where, queue).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestKeyRateRefused: a rate per key beyond the rows a key's slots may
// take (maxKeyRate) is refused naming the field, and the limits stay as
// they were. The driver suite checks the storing and the other refusals.
func TestKeyRateRefused(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	want := driver.QueueLimits{KeyMaxRunning: 2, KeyRate: 7, KeyRatePeriod: 90 * time.Second}
	if err := d.SetQueueLimits(ctx, "st", want); err != nil {
		t.Fatal(err)
	}
	l := driver.QueueLimits{KeyRate: maxKeyRate + 1, KeyRatePeriod: time.Second}
	if err := d.SetQueueLimits(ctx, "st", l); err == nil || !strings.Contains(err.Error(), "KeyRate") {
		t.Errorf("%+v: %v, want an error naming KeyRate", l, err)
	}
	if got, err := d.QueueLimits(ctx); err != nil || got["st"] != want {
		t.Fatalf("after the refused change: %+v, %v", got["st"], err)
	}
}

// TestKeyRateTwoKeys: with 3 starts per hour per key, repeated claims take
// exactly 3 jobs of each key and every job without one; the claim that
// finds only held jobs is Held until the oldest start leaves the window;
// completing the attempts frees nothing; LimitUsage counts both keys as
// rated and their other jobs as held. Without KeyMaxRunning no
// concurrency slot is made.
func TestKeyRateTwoKeys(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	insertJobs(t, d, keyedJobs("kr", "a", 10), keyedJobs("kr", "b", 10), keyedJobs("kr", "", 5))
	if err := d.SetQueueLimits(ctx, "kr", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rows, last := claimAll(t, d, "kr", 4)
	if m := perKey(rows); len(rows) != 11 || m["a"] != 3 || m["b"] != 3 || m[""] != 5 {
		t.Fatalf("claimed %v, want 3 of a, 3 of b and the 5 without a key", m)
	}
	if !last.Held || last.RetryIn <= 0 || last.RetryIn > time.Hour {
		t.Fatalf("the last claim: held %v, retry in %v; want held, within the hour", last.Held, last.RetryIn)
	}
	if n := countSlots(t, d, "kr", "n >= 0"); n != 0 {
		t.Fatalf("%d concurrency slots made without KeyMaxRunning", n)
	}
	if n := countSlots(t, d, "kr", "n < 0 AND used_at > now() - interval '1 hour'"); n != 6 {
		t.Fatalf("%d rate slots stamped, want 6", n)
	}
	for _, r := range rows {
		if _, err := d.Complete(ctx, []driver.Outcome{{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}}); err != nil {
			t.Fatal(err)
		}
	}
	if more, res := claimAll(t, d, "kr", 10); len(more) != 0 || !res.Held {
		t.Fatalf("after the completions: claimed %v (held %v), want none, held", perKey(more), res.Held)
	}
	if n := countSlots(t, d, "kr", "n < 0 AND used_at > now() - interval '1 hour'"); n != 6 {
		t.Fatalf("%d rate slots stamped after the completions, want 6", n)
	}
	u, err := d.LimitUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := u["kr"]; got.KeysRated != 2 || got.KeyHeld != 14 || got.KeysRunning != 0 {
		t.Fatalf("usage: %d keys rated, %d held, %d running; want 2, 14, 0", got.KeysRated, got.KeyHeld, got.KeysRunning)
	}
}

// TestKeyRateConcurrentClaimers: six claimers, two processes, over eight
// keys of twenty jobs at five starts per hour per key: exactly five of
// each key claimed, none twice.
func TestKeyRateConcurrentClaimers(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	o := openOther(t, d)
	const keys, per, rate = 8, 20, 5
	var groups [][]driver.InsertParams
	for k := 0; k < keys; k++ {
		groups = append(groups, keyedJobs("cc", fmt.Sprintf("k%d", k), per))
	}
	insertJobs(t, d, groups...)
	if err := d.SetQueueLimits(ctx, "cc", driver.QueueLimits{KeyRate: rate, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	byKey := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for c := 0; c < 6; c++ {
		drv := d
		if c%2 == 1 {
			drv = o
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			empty := 0
			for i := 0; i < 200 && empty < 3; i++ {
				r, err := drv.ClaimLimited(ctx, driver.ClaimParams{Queue: "cc", Limit: 3, Lease: time.Hour, Worker: "w"})
				if err != nil {
					errs <- err
					return
				}
				if len(r.Rows) == 0 {
					empty++
					continue
				}
				empty = 0
				mu.Lock()
				for _, row := range r.Rows {
					seen[row.ID]++
					byKey[row.Key]++
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
	// Claims that found every slot locked by another claimer may have
	// stopped early: a last claim takes what they left.
	rows, _ := claimAll(t, d, "cc", 100)
	for _, row := range rows {
		seen[row.ID]++
		byKey[row.Key]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("job %d claimed %d times", id, n)
		}
	}
	for k := 0; k < keys; k++ {
		if n := byKey[fmt.Sprintf("k%d", k)]; n != rate {
			t.Fatalf("key k%d: %d claimed, want %d (all: %v)", k, n, rate, byKey)
		}
	}
}

// TestKeyRateSweep: Rescue's sweep deletes rate slots stamped longer ago
// than the period (and a minute) and those of a queue without a rate per
// key, and keeps those stamped within the period, beyond a lowered rate
// too (the rate raised again within the window counts them).
func TestKeyRateSweep(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if err := d.SetQueueLimits(ctx, "sw", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	add := func(queue, key string, n int, ago string) {
		t.Helper()
		if _, err := d.pool.Exec(ctx, "INSERT INTO "+d.prefix+"key_slots (queue, lkey, n, used_at) VALUES ($1, $2, $3, now() - $4::interval)",
			queue, key, n, ago); err != nil {
			t.Fatal(err)
		}
	}
	add("sw", "in", -1, "5 minutes") // within the period, older than a minute
	add("sw", "in", -2, "1 second")
	add("sw", "old", -1, "11 minutes")
	add("sw", "beyond", -4, "1 second")
	add("none", "x", -1, "1 second")
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := countSlots(t, d, "sw", "lkey = 'in'"); n != 2 {
		t.Fatalf("%d of the 2 slots stamped within the period kept", n)
	}
	if n := countSlots(t, d, "sw", "lkey = 'old'"); n != 0 {
		t.Fatalf("%d slots out of the window kept", n)
	}
	if n := countSlots(t, d, "sw", "lkey = 'beyond'"); n != 1 {
		t.Fatalf("%d of the 1 slot beyond the rate stamped within the period kept", n)
	}
	if n := countSlots(t, d, "none", "true"); n != 0 {
		t.Fatalf("a queue without a rate per key kept %d rate slots", n)
	}
	// A short period: a slot stays for a minute after its stamp.
	if err := d.SetQueueLimits(ctx, "sw", driver.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Second}); err != nil {
		t.Fatal(err)
	}
	add("sw", "short", -1, "30 seconds")
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := countSlots(t, d, "sw", "lkey = 'short'"); n != 1 {
		t.Fatal("a slot stamped 30 seconds ago was swept under a period of a second")
	}
	if err := d.SetQueueLimits(ctx, "sw", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := countSlots(t, d, "sw", "true"); n != 0 {
		t.Fatalf("%d rate slots kept once the rate was removed", n)
	}
}

// TestKeyRateEveryEndKeepsTheStamps: however an attempt ends (by hand,
// by a lost lease rescued), the rate slot stamped by its start stays
// stamped, and the key's window stays full.
func TestKeyRateEveryEndKeepsTheStamps(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	insertJobs(t, d, keyedJobs("ee", "a", 8))
	if err := d.SetQueueLimits(ctx, "ee", driver.QueueLimits{KeyMaxRunning: 4, KeyRate: 4, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "ee", Limit: 3, Lease: time.Hour, Worker: "w"})
	if err != nil || len(r.Rows) != 3 {
		t.Fatalf("claimed %d, %v", len(r.Rows), err)
	}
	// The fourth start with a lease that runs out at once.
	short, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "ee", Limit: 1, Lease: time.Microsecond, Worker: "w"})
	if err != nil || len(short.Rows) != 1 {
		t.Fatalf("claimed %d with a short lease, %v", len(short.Rows), err)
	}
	if _, err := d.Cancel(ctx, r.Rows[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Discard(ctx, r.Rows[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Complete(ctx, []driver.Outcome{{ID: r.Rows[2].ID, Fence: r.Rows[2].Fence, Attempt: r.Rows[2].Attempt,
		State: driver.StateRetryable, RetryIn: time.Microsecond}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; countSlots(t, d, "ee", "n >= 0 AND job_id IS NOT NULL") > 0; i++ {
		if i == 1000 {
			t.Fatal("the expired attempt was never rescued")
		}
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Promote(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := countSlots(t, d, "ee", "n < 0 AND job_id IS NULL AND fence IS NULL AND used_at > now() - interval '1 hour'"); n != 4 {
		t.Fatalf("%d rate slots stamped after every attempt ended, want 4", n)
	}
	if rows, res := claimAll(t, d, "ee", 10); len(rows) != 0 || !res.Held || res.RetryIn <= 0 {
		t.Fatalf("claimed %d (held %v, retry in %v) with the key's window full", len(rows), res.Held, res.RetryIn)
	}
}

// TestKeyRatePlans: with many keys' concurrency and rate slots, analyzed
// as a maintenance round does, the generic plans of the keyed claim's
// statements read a key's slots through the primary key, (queue, lkey,
// n), never the whole table: the rate slots' negative numbers are a range
// of it. EXPLAIN without ANALYZE runs nothing.
func TestKeyRatePlans(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	tbl := d.prefix + "key_slots"
	if _, err := d.pool.Exec(ctx, "INSERT INTO "+tbl+" (queue, lkey, n, used_at) "+
		"SELECT 'q', 'k' || k, g, now() - (k % 90) * interval '1 minute' FROM generate_series(1, 2000) AS k, generate_series(-30, 3) AS g"); err != nil {
		t.Fatal(err)
	}
	s.lastMaint = time.Time{}
	if _, err := s.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	// The plan a prepared statement keeps, as the pool's connections do.
	generic := func(name, q, args string) string {
		t.Helper()
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+q); err != nil {
			t.Fatal(err)
		}
		return explain(t, tx.Query, "EXECUTE "+name+"("+args+")")
	}
	keys, hour := "'{k1,k2,k3}'", strconv.FormatInt(time.Hour.Microseconds(), 10)
	for name, plan := range map[string]string{
		"key_lock":          generic("kl", d.q.KeyLock, "'q', "+keys+", 4, 30, "+hour+", 10"),
		"key_rate_retry_in": generic("kr", d.q.KeyRateRetryIn, "'q', "+keys+", 30, "+hour),
		"key_take":          generic("kt", d.q.KeyTake, "'q', '{k1}', '{-1}', '{0}', '{0}'"),
		"seg_key_walk":      generic("kw", s.stmt(&d.q.SegKeyWalk, v, v.live[phReady]), "'q', '', 104, 10, 4, 30, "+hour+", false, 62"),
	} {
		if !strings.Contains(plan, "$1") {
			t.Errorf("%s: not the generic plan:\n%s", name, plan)
		}
		if strings.Contains(plan, "Seq Scan on "+tbl) || !strings.Contains(plan, tbl+"_pkey") {
			t.Errorf("%s reads the key slots without their primary key:\n%s", name, plan)
		}
	}
}

// TestKeyRateWindowNeverExceeded: claimers in two processes claim and end
// the jobs of three keys under 2 running and 3 starts per 250ms per key
// until every job ran. By the database's clock (each attempt's
// attempted_at, the time its rate slot was stamped with), any 4
// consecutive starts of a key span at least the period, and at most 2 of
// a key ran at once.
func TestKeyRateWindowNeverExceeded(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	o := openOther(t, d)
	const rate, period, per = 3, 250 * time.Millisecond, 12
	insertJobs(t, d, keyedJobs("wn", "a", per), keyedJobs("wn", "b", per), keyedJobs("wn", "c", per))
	if err := d.SetQueueLimits(ctx, "wn", driver.QueueLimits{KeyMaxRunning: 2, KeyRate: rate, KeyRatePeriod: period}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	starts := map[string][]time.Time{}
	running := map[string]int{}
	done := 0
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		drv := d
		if c%2 == 1 {
			drv = o
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(time.Minute)
			for {
				mu.Lock()
				finished := done == 3*per
				mu.Unlock()
				if finished {
					return
				}
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("not every job ran within a minute")
					return
				}
				r, err := drv.ClaimLimited(ctx, driver.ClaimParams{Queue: "wn", Limit: 4, Lease: time.Hour, Worker: "w"})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, row := range r.Rows {
					starts[row.Key] = append(starts[row.Key], row.AttemptedAt)
					if running[row.Key]++; running[row.Key] > 2 {
						errs <- fmt.Errorf("key %s: %d running at once", row.Key, running[row.Key])
					}
				}
				mu.Unlock()
				for _, row := range r.Rows {
					mu.Lock()
					running[row.Key]--
					mu.Unlock()
					if _, err := drv.Complete(ctx, []driver.Outcome{{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}}); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					done++
					mu.Unlock()
				}
				if len(r.Rows) == 0 && r.RetryIn > 0 {
					time.Sleep(min(r.RetryIn, 50*time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, ts := range starts {
		if len(ts) != per {
			t.Fatalf("key %s: %d starts, want %d", k, len(ts), per)
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := 0; i+rate < len(ts); i++ {
			if span := ts[i+rate].Sub(ts[i]); span < period {
				t.Fatalf("key %s: starts %d to %d within %v, under the period %v", k, i, i+rate, span, period)
			}
		}
	}
}

// TestKeyRateSlotsForTheJobs: a claim of many jobs makes a key's rate
// slots for the jobs the key has ready, not for the claim's size nor
// the rate.
func TestKeyRateSlotsForTheJobs(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	insertJobs(t, d, keyedJobs("fj", "a", 2), keyedJobs("fj", "b", 1))
	if err := d.SetQueueLimits(ctx, "fj", driver.QueueLimits{KeyRate: 1000, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rows, _ := claimAll(t, d, "fj", 100); len(rows) != 3 {
		t.Fatalf("claimed %d, want the 3", len(rows))
	}
	if a, b := countSlots(t, d, "fj", "lkey = 'a'"), countSlots(t, d, "fj", "lkey = 'b'"); a != 2 || b != 1 {
		t.Fatalf("rate slots made: %d of a, %d of b; want 2 and 1", a, b)
	}
}
