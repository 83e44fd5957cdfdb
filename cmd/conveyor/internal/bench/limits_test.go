package bench

import (
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// ms10 is t milliseconds in unix ns from an arbitrary origin.
func ms10(t int64) int64 { return t * int64(time.Millisecond) }

// Under a MaxRunning of 2 with a backlog, the third start waits for the
// first end, the fourth for the second: the waits run from each end to
// the start it let through, in any input order, and a start the clocks
// put before its end counts as no wait.
func TestPickupWaitsConcurrency(t *testing.T) {
	starts := []int64{ms10(0), ms10(0), ms10(12), ms10(19)}
	ends := []int64{ms10(15), ms10(10), ms10(20), ms10(25)}
	got := pickupWaits(starts, ends, conveyor.QueueLimits{MaxRunning: 2}, true)
	want := []time.Duration{2 * time.Millisecond, 4 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	starts[3] = ms10(14) // before the end that freed its slot (clock skew)
	got = pickupWaits(starts, ends, conveyor.QueueLimits{MaxRunning: 2}, true)
	if want := []time.Duration{2 * time.Millisecond, 0}; !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
}

// Under a Rate of 2 per 100ms, the third start waits for the first to
// leave the window, the fourth for the second.
func TestPickupWaitsRate(t *testing.T) {
	starts := []int64{ms10(1), ms10(0), ms10(103), ms10(101)}
	got := pickupWaits(starts, nil, conveyor.QueueLimits{Rate: 2, RatePeriod: 100 * time.Millisecond}, false)
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	if q := quantile(got, 0.5); q != 2 {
		t.Fatalf("median %v ms, want 2", q)
	}
}

// The recorder's key counts catch what key limits must prevent: two jobs
// of one key at once, and a key's later job started before an earlier
// one; checkHeld turns them into errors for limited runs.
func TestKeyRecorder(t *testing.T) {
	r := NewRecorder()
	r.KeyBegin("a", 0)
	r.KeyEnd("a")
	r.KeyBegin("a", 2)
	r.KeyBegin("b", 1)
	r.KeyEnd("b")
	r.KeyEnd("a")
	if r.KeyPeak() != 1 || r.KeyReorders() != 0 {
		t.Fatalf("in order, one at a time: peak %d, reorders %d", r.KeyPeak(), r.KeyReorders())
	}
	r.KeyBegin("a", 1) // enqueued before 2, which started
	r.KeyBegin("a", 3)
	if r.KeyPeak() != 2 || r.KeyReorders() != 1 {
		t.Fatalf("peak %d, reorders %d, want 2 and 1", r.KeyPeak(), r.KeyReorders())
	}
	res := &Result{Workload: "keys", Limits: &conveyor.QueueLimits{Ordered: true}, KeyPeakRunning: r.KeyPeak()}
	if checkHeld(res) == nil {
		t.Fatal("two executions of an ordered key at once passed the check")
	}
	res.KeyPeakRunning, res.KeyReorders = 1, 1
	if checkHeld(res) == nil {
		t.Fatal("an out-of-order start of an ordered key passed the check")
	}
	res = &Result{Workload: "keys", Limits: &conveyor.QueueLimits{KeyMaxRunning: 2}, KeyPeakRunning: 2, KeyReorders: 5}
	if err := checkHeld(res); err != nil {
		t.Fatalf("2 at once under 2 per key, unordered: %v", err)
	}
}

// The most claims of one key within a window counts each key apart (two
// keys claimed together do not add up) and only within the period; the
// check refuses a key over its rate.
func TestKeyMaxInWindow(t *testing.T) {
	r := NewRecorder()
	keyOf := func(seq int64) string { return []string{"a", "b"}[seq%2] }
	// a: seqs 0, 2, 4, 6 claimed at 0, 10, 20, 150 ms; b: 1, 3, 5 at 0, 5, 500 ms.
	at := map[int64]int64{0: 0, 2: 10, 4: 20, 6: 150, 1: 0, 3: 5, 5: 500}
	origin := time.Unix(1_700_000_000, 0)
	for seq := int64(0); seq < 7; seq++ {
		r.Next()
		r.Started(seq, origin)
		r.Claimed(seq, origin.Add(time.Duration(at[seq])*time.Millisecond))
	}
	if got := r.KeyMaxInWindow(0, r.Issued(), 100*time.Millisecond, keyOf); got != 3 {
		t.Fatalf("most claims of one key in 100ms: %d, want 3 (a at 0, 10, 20)", got)
	}
	if got := r.MaxInWindow(0, r.Issued(), 100*time.Millisecond); got != 5 {
		t.Fatalf("most claims of the queue in 100ms: %d, want 5", got)
	}
	if got := r.KeyMaxInWindow(0, r.Issued(), 5*time.Millisecond, keyOf); got != 1 {
		t.Fatalf("most claims of one key in 5ms: %d, want 1", got)
	}
	l := &conveyor.QueueLimits{KeyRate: 2, KeyRatePeriod: 100 * time.Millisecond}
	if checkHeld(&Result{Workload: "limits", Limits: l, KeyMaxStartsInWindow: 3}) == nil {
		t.Fatal("3 starts of one key in a window passed a KeyRate of 2")
	}
	if err := checkHeld(&Result{Workload: "limits", Limits: l, KeyMaxStartsInWindow: 2}); err != nil {
		t.Fatalf("2 starts of one key under a KeyRate of 2: %v", err)
	}
}
