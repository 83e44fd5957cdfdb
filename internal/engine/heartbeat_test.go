package engine

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// blockUntilDone is a handler that waits for its context to end.
func blockUntilDone(ctx context.Context, _ *driver.JobRow) error {
	<-ctx.Done()
	return ctx.Err()
}

// The heartbeat renews every running attempt of every queue in one call
// per HeartbeatInterval, with their fences, sorted by job id, for a whole
// Lease each time.
func TestHeartbeatRenewsRunningJobsEveryInterval(t *testing.T) {
	const interval = 40 * time.Millisecond
	d := &fakeDriver{}
	d.add(jobIn("b", 1, 11), jobIn("a", 2, 22))
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"a": 1, "b": 1}
	cfg.HeartbeatInterval = interval
	cfg.ShutdownTimeout = time.Millisecond // the handlers wait to be cancelled
	startEngine(t, d, cfg, map[string]Handler{"k": blockUntilDone})
	want := []driver.Lease{{ID: 1, Fence: 11}, {ID: 2, Fence: 22}}
	both := func() int {
		n := 0
		for _, c := range d.callsOf("heartbeat") {
			if slices.Equal(c.leases, want) {
				n++
			}
		}
		return n
	}
	// At Lease/5 (2s) this would take 12s, past the guard.
	waitFor(t, "six renewals of both jobs", func() bool { return both() >= 6 })
	hs := d.callsOf("heartbeat")
	early := 0
	for i, c := range hs {
		if c.dur != cfg.Lease {
			t.Fatalf("renewal for %v, want the lease %v", c.dur, cfg.Lease)
		}
		for _, l := range c.leases {
			if !slices.Contains(want, l) {
				t.Fatalf("renewal of %+v, want only %v", l, want)
			}
		}
		if i > 0 && c.at.Sub(hs[i-1].at) < interval/2 {
			early++
		}
	}
	// A claim slower than an interval may wake the heartbeat early, once
	// per claim with jobs (two here); otherwise renewals are an interval
	// apart.
	if early > 2 {
		t.Fatalf("%d of %d renewals came less than half an interval after the previous one", early, len(hs)-1)
	}
}

// A lease the heartbeat reports lost cancels that attempt's handler with
// the lost-lease cause, is not renewed again, and its outcome is dropped;
// the other attempts run on untouched and are written.
func TestHeartbeatLostLeaseCancelsOnlyThatHandler(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(2)...)
	d.heartbeat = func(_ context.Context, leases []driver.Lease) ([]int64, error) {
		var ids []int64
		for _, l := range leases {
			if l.ID != 1 { // job 1 was rescued and taken by another process
				ids = append(ids, l.ID)
			}
		}
		return ids, nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.HeartbeatInterval = 10 * time.Millisecond
	lost := make(chan error, 1)
	finish := make(chan struct{})
	other := make(chan error, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		if row.ID == 1 {
			<-ctx.Done()
			lost <- context.Cause(ctx)
			return ctx.Err()
		}
		select {
		case <-finish:
		case <-ctx.Done():
		}
		other <- ctx.Err()
		return nil
	}})
	if c := recv(t, "job 1's handler to be stopped", lost); !errors.Is(c, errLeaseLost) {
		t.Fatalf("job 1's handler stopped by %v, want the lost lease", c)
	}
	// Let a few more renewals go by while job 2 runs.
	n := d.count("heartbeat")
	waitFor(t, "more renewals", func() bool { return d.count("heartbeat") >= n+3 })
	close(finish)
	if err := recv(t, "job 2's handler", other); err != nil {
		t.Fatalf("job 2's context ended (%v) though its lease was renewed", err)
	}
	waitFor(t, "job 2's outcome written", func() bool { return e.Metrics().Completed.Load() == 1 })
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var written []int64
	for _, c := range d.callsOf("complete") {
		written = append(written, c.ids...)
	}
	if !slices.Equal(written, []int64{2}) {
		t.Fatalf("outcomes written for %v, want only job 2's", written)
	}
	asked := 0
	for _, c := range d.callsOf("heartbeat") {
		if slices.Contains(c.ids, 1) {
			asked++
		}
	}
	if asked != 1 {
		t.Fatalf("job 1's lease was renewed %d times, want once: it is not renewed after it was lost", asked)
	}
	if got := e.Metrics().LeasesLost.Load(); got != 1 {
		t.Fatalf("leases_lost %d, want 1", got)
	}
	if r := d.released.Load(); r != 0 {
		t.Fatalf("%d leases released at shutdown, want 0", r)
	}
}

// A cancel sent while the listener was reconnecting is lost with the other
// notifications; the reconnection itself renews the leases at once, so the
// cancelled job's handler stops now rather than at the next heartbeat (an
// hour away here).
func TestListenerReconnectRenewsLeases(t *testing.T) {
	d := &fakeDriver{listen: true, wakeups: make(chan string)}
	var gone atomic.Bool
	d.heartbeat = func(_ context.Context, leases []driver.Lease) ([]int64, error) {
		if gone.Load() {
			return nil, nil // cancelled by hand meanwhile
		}
		return owned(leases), nil
	}
	cfg := testConfig(3 * time.Hour) // heartbeats every hour
	cfg.ListenPoll = time.Hour
	started := make(chan struct{})
	stopped := make(chan error, 1)
	startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		close(started)
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return ctx.Err()
	}})
	notify := func(q string) {
		select {
		case d.wakeups <- q:
		case <-time.After(guard):
			t.Fatalf("the listener never waited for notification %q", q)
		}
	}
	// The listener is up (its first renewal, with no job held, is done
	// with) before the job exists.
	notify("elsewhere")
	d.add(jobs(1)...)
	notify("q")
	recv(t, "the job to start", started)
	gone.Store(true)
	notify("") // the listener reports it reconnected
	if c := recv(t, "the cancelled job's handler to stop", stopped); !errors.Is(c, errLeaseLost) {
		t.Fatalf("handler stopped by %v, want the lost lease", c)
	}
}

// An attempt whose outcome waits in the completer is left out of a
// renewal only while its lease outlasts the next renewal with room to
// spare. With HeartbeatInterval at its largest (half the Lease), an
// attempt that finished just before a renewal, renewed last an interval
// ago, has one interval of lease left: left out, its next renewal came
// as the lease ran out, so a slow write of its outcome let the job be
// rescued and run again while its worker was alive.
func TestFinishingAttemptRenewedWhenItsLeaseIsShort(t *testing.T) {
	cfg := testConfig(10 * time.Second)
	cfg.HeartbeatInterval = cfg.Lease / 2
	e := New(&fakeDriver{}, cfg, nil)
	f := newFetcher(e, "q", 2, context.Background())
	now := time.Now()
	f.mu.Lock()
	short := f.hold(jobIn("q", 1, 11), now.Add(cfg.HeartbeatInterval)) // renewed an interval ago
	long := f.hold(jobIn("q", 2, 22), now.Add(cfg.Lease))              // renewed just now
	for _, it := range []*running{short, long} {
		it.finishing, it.finishedAt = true, now // outcome queued just now
	}
	f.mu.Unlock()
	got := f.snapshot(nil)
	if want := []driver.Lease{{ID: 1, Fence: 11}}; !slices.Equal(got, want) {
		t.Fatalf("renewal of finishing attempts %v, want %v: the one whose lease would end by the next renewal", got, want)
	}
}
