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
