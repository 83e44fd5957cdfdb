package mysql

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestKeyLimitLowered: attempts holding key slots at or beyond a lowered
// KeyMaxRunning count against it until they end, so a key's freed slot
// below the new limit does not let more of its jobs run than it allows.
func TestKeyLimitLowered(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			jobs := limitJobs("kl", 6)
			for i := range jobs {
				jobs[i].Key = "a"
			}
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "kl", driver.QueueLimits{KeyMaxRunning: 3}); err != nil {
				t.Fatal(err)
			}
			rows := claimLimited(t, d, "kl", 10, time.Minute)
			if len(rows) != 3 {
				t.Fatalf("claimed %d of key a under 3 per key", len(rows))
			}
			if err := d.SetQueueLimits(ctx, "kl", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
				t.Fatal(err)
			}
			// The claim gave the key's slots in id order: the last job
			// holds slot 2, beyond the new limit, and keeps running.
			var outs []driver.Outcome
			for _, r := range rows[:2] {
				outs = append(outs, driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted})
			}
			if applied, err := d.Complete(ctx, outs); err != nil || len(applied) != 2 {
				t.Fatalf("complete: %v, %v", applied, err)
			}
			r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "kl", Limit: 10, Lease: time.Minute, Worker: "w"})
			if err != nil || len(r.Rows) != 0 || !r.Held {
				t.Fatalf("claimed %d (held %v, %v) while an attempt beyond the lowered limit runs", len(r.Rows), r.Held, err)
			}
			last := rows[2]
			if applied, err := d.Complete(ctx, []driver.Outcome{{ID: last.ID, Fence: last.Fence, Attempt: last.Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 1 {
				t.Fatalf("complete: %v, %v", applied, err)
			}
			if got := claimLimited(t, d, "kl", 10, time.Minute); len(got) != 1 {
				t.Fatalf("claimed %d once the key's attempts ended, want 1", len(got))
			}
		})
	}
}

// TestKeylessAfterNoneFound: after a claim of a key-limited queue found
// no job without a key, the driver's claims of the queue skip the ones
// another process inserts for a while (driver.QueueSkip), then take them
// again.
func TestKeylessAfterNoneFound(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	other := open(t, d.prefix, driver.Options{}, nil)
	defer other.Close()
	keyed := limitJobs("kn", 3)
	for i := range keyed {
		keyed[i].Key = "a"
	}
	if _, err := d.Insert(ctx, keyed); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "kn", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if got := claimLimited(t, d, "kn", 5, time.Minute); len(got) != 1 || got[0].Key != "a" {
		t.Fatalf("claimed %d, want the one job of key a", len(got))
	}
	ids, err := other.Insert(ctx, limitJobs("kn", 1))
	if err != nil {
		t.Fatal(err)
	}
	if got := claimLimited(t, d, "kn", 5, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %d while skipping jobs without a key", len(got))
	}
	d.noKeyless.Forget("kn") // as once cursorFor has passed
	if got := claimLimited(t, d, "kn", 5, time.Minute); len(got) != 1 || got[0].ID != ids[0] {
		t.Fatalf("claimed %v, want the job without a key", got)
	}
}

// TestReadKeysWindows: the walk of keys reads a window of key_idx and,
// past a key deeper than the window, the rest of its keys grouped by key;
// it takes keys the collation holds equal once, and keeps to its bounds.
func TestReadKeysWindows(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	var jobs []driver.InsertParams
	// "b " is inserted after "b": the index holds it after "b".
	for _, k := range []struct {
		key string
		n   int
	}{{"a", 1}, {"b", 1}, {"b ", 1}, {"c", 40}, {"d", 1}, {"e", 2}, {"f", 1}} {
		js := limitJobs("kw", k.n)
		for i := range js {
			js[i].Key = k.key
		}
		jobs = append(jobs, js...)
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	upto := "e"
	for _, c := range []struct {
		after string
		upto  *string
		n     int
		want  []string
	}{
		{"", nil, 10, []string{"a", "b", "c", "d", "e", "f"}},
		{"", nil, 2, []string{"a", "b"}},
		{"a", nil, 3, []string{"b", "c", "d"}},
		{"b", &upto, 10, []string{"c", "d", "e"}},
		{"f", nil, 10, nil},
	} {
		got, err := d.readKeys(ctx, "kw", c.after, c.upto, c.n, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("keys after %q (upto %v, %d): %q, want %q", c.after, c.upto != nil, c.n, got, c.want)
		}
	}
	// The jobs of each key, as the windows counted them: c's 40 run
	// past the first (0: not counted), "b " is b's; the second window,
	// sized for keys as deep as the first saw, holds the rest.
	perKey := map[string]int{}
	if _, err := d.readKeys(ctx, "kw", "", nil, 10, perKey); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"a": 1, "b": 2, "c": 0, "d": 1, "e": 2, "f": 1}; !maps.Equal(perKey, want) {
		t.Errorf("jobs per key %v, want %v", perKey, want)
	}
	// Keys too deep for a window of walkWindowMax: the rest are read
	// grouped by key, not counted.
	defer func(m int) { walkWindowMax = m }(walkWindowMax)
	walkWindowMax = 64
	perKey = map[string]int{}
	got, err := d.readKeys(ctx, "kw", "", nil, 10, perKey)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "d", "e", "f"}; !slices.Equal(got, want) {
		t.Errorf("keys read grouped: %q, want %q", got, want)
	}
	if want := map[string]int{"a": 1, "b": 2, "c": 0, "d": 0, "e": 0, "f": 0}; !maps.Equal(perKey, want) {
		t.Errorf("jobs per key read grouped %v, want %v", perKey, want)
	}
	if got, err := d.readKeys(ctx, "kw", "a", &upto, 10, nil); err != nil || !slices.Equal(got, []string{"b", "c", "d", "e"}) {
		t.Errorf("keys read grouped up to e: %q, %v", got, err)
	}
	// Within one window every key is counted.
	perKey = map[string]int{}
	if _, err := d.readKeys(ctx, "kw", "c", nil, 10, perKey); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"d": 1, "e": 2, "f": 1}; !maps.Equal(perKey, want) {
		t.Errorf("jobs per key after c %v, want %v", perKey, want)
	}
}

// TestReadKeyJobsShallow: the next jobs of the keys the walk found
// shallow, read in one statement of all their jobs, are those the
// statement of a part per key reads, with deep keys among them or not,
// in id order (Ordered) or priority then id order.
func TestReadKeyJobsShallow(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	var jobs []driver.InsertParams
	keys := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "z"}
	for i, k := range keys {
		n := 3
		if k == "z" {
			n = 3 * shallowKey
		}
		js := limitJobs("kj", n)
		for j := range js {
			js[j].Key = k
			js[j].Priority = (i + 2*j) % 3
		}
		jobs = append(jobs, js...)
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	depth := map[string]int{}
	got, err := d.readKeys(ctx, "kj", "", nil, len(keys), depth)
	if err != nil || !slices.Equal(got, keys) {
		t.Fatalf("walk: %q, %v", got, err)
	}
	if depth["s0"] != 3 || depth["z"] != 0 {
		t.Fatalf("depths %v", depth)
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, ordered := range []bool{false, true} {
		for _, ks := range [][]string{keys[:10], keys, keys[8:]} {
			counts := make([]int64, len(ks))
			for i := range counts {
				counts[i] = int64(1 + i%3)
			}
			want, err := d.readKeyJobs(ctx, tx, "kj", ordered, ks, counts, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.readKeyJobs(ctx, tx, "kj", ordered, ks, counts, depth)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.EqualFunc(got, want, slices.Equal) {
				t.Errorf("ordered %v, keys %q: %v, want %v", ordered, ks, got, want)
			}
			for i, k := range ks {
				if len(want[k]) != int(counts[i]) {
					t.Errorf("ordered %v: key %s: %d jobs, want %d", ordered, k, len(want[k]), counts[i])
				}
			}
		}
	}
}

// TestCompleteFreeingCount: a batch of outcomes whose attempts hold key
// slots reports the jobs it applied from the jobs statement's count when
// every job matched, and reads them back when one did not: a stale
// outcome, or the same outcome twice.
func TestCompleteFreeingCount(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	jobs := limitJobs("kc", 6)
	for i := range jobs {
		jobs[i].Key = string(rune('a' + i))
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "kc", driver.QueueLimits{KeyMaxRunning: 1, MaxRunning: 10}); err != nil {
		t.Fatal(err)
	}
	rows := claimLimited(t, d, "kc", 6, time.Minute)
	if len(rows) != 6 {
		t.Fatalf("claimed %d, want 6", len(rows))
	}
	out := func(r *driver.JobRow) driver.Outcome {
		return driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
	}
	stale := out(rows[1])
	stale.Fence--
	for _, c := range []struct {
		outs []driver.Outcome
		want []int64
	}{
		{[]driver.Outcome{out(rows[0]), stale}, []int64{rows[0].ID}},
		{[]driver.Outcome{out(rows[2]), out(rows[2]), out(rows[3])}, []int64{rows[2].ID, rows[3].ID}},
		{[]driver.Outcome{out(rows[4]), out(rows[5])}, []int64{rows[4].ID, rows[5].ID}},
	} {
		got, err := d.Complete(ctx, c.outs)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("applied %v, want %v", got, c.want)
		}
	}
	// Every slot but the stale outcome's job's was freed: its key alone
	// has no room.
	if err := d.SetQueueLimits(ctx, "kc", driver.QueueLimits{KeyMaxRunning: 1, MaxRunning: 10}); err != nil {
		t.Fatal(err)
	}
	more := limitJobs("kc", 6)
	for i := range more {
		more[i].Key = string(rune('a' + i))
	}
	if _, err := d.Insert(ctx, more); err != nil {
		t.Fatal(err)
	}
	if got := claimLimited(t, d, "kc", 10, time.Minute); len(got) != 5 {
		t.Errorf("claimed %d after the outcomes, want 5 (key b still runs)", len(got))
	}
}

// TestKeySlotsTakenInChunks: a claim of more keyed jobs than one
// statement of key_slot_take takes (keySlotTakeChunk) takes every one's
// slot, so no key runs more than its limit, and completing them frees
// every slot.
func TestKeySlotsTakenInChunks(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	const keys = 2*keySlotTakeChunk + 22
	for range 2 {
		jobs := limitJobs("kch", keys)
		for i := range jobs {
			jobs[i].Key = "k" + strconv.Itoa(i)
		}
		if _, err := d.Insert(ctx, jobs); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetQueueLimits(ctx, "kch", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	rows := claimLimited(t, d, "kch", 2*keys, time.Minute)
	byKey := map[string]int{}
	for _, r := range rows {
		byKey[r.Key]++
	}
	if len(rows) != keys || len(byKey) != keys {
		t.Fatalf("claimed %d jobs of %d keys, want one of each of %d keys", len(rows), len(byKey), keys)
	}
	if more := claimLimited(t, d, "kch", 2*keys, time.Minute); len(more) != 0 {
		t.Fatalf("claimed %d more while every key runs its one job", len(more))
	}
	outs := make([]driver.Outcome, len(rows))
	for i, r := range rows {
		outs[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
	}
	if applied, err := d.Complete(ctx, outs); err != nil || len(applied) != len(outs) {
		t.Fatalf("complete: applied %d of %d, %v", len(applied), len(outs), err)
	}
	if next := claimLimited(t, d, "kch", 2*keys, time.Minute); len(next) != keys {
		t.Fatalf("after completing: claimed %d, want the second job of each of %d keys", len(next), keys)
	}
}
