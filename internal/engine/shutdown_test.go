package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// notReturned fails the test if Stop's result is already in ch.
func notReturned(t *testing.T, ch <-chan error, why string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("Stop returned (%v) %s", err, why)
	default:
	}
}

// fetchersStopped waits until every fetch loop of e has returned.
func fetchersStopped(t *testing.T, e *Engine) {
	t.Helper()
	done := make(chan struct{})
	go func() { e.fetchWG.Wait(); close(done) }()
	recv(t, "the fetchers to stop", done)
}

// releasedLeases returns, sorted by id, every lease the fake was asked to
// release.
func releasedLeases(d *fakeDriver) []driver.Lease {
	var ls []driver.Lease
	for _, c := range d.callsOf("release") {
		ls = append(ls, c.leases...)
	}
	slices.SortFunc(ls, func(a, b driver.Lease) int { return int(a.ID - b.ID) })
	return ls
}

// Stop waits for a running handler (here with no shutdown timeout in
// sight) without cancelling it, writes its outcome before returning, and
// releases nothing.
func TestStopWaitsForRunningHandlers(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(1)...)
	cfg := testConfig(10 * time.Second)
	cfg.ShutdownTimeout = time.Hour
	started, finish := make(chan struct{}), make(chan struct{})
	ctxErr := make(chan error, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		close(started)
		select {
		case <-finish:
		case <-ctx.Done():
		}
		ctxErr <- ctx.Err()
		return nil
	}})
	recv(t, "the handler to start", started)
	stop := stopAsync(e)
	waitFor(t, "Stop to begin", e.stopping.Load)
	// Room for a Stop that does not wait to cancel the handler or return.
	time.Sleep(50 * time.Millisecond)
	notReturned(t, stop, "while a handler was running, before the shutdown timeout")
	close(finish)
	if err := recv(t, "the handler to return", ctxErr); err != nil {
		t.Fatalf("the handler's context ended (%v) before the shutdown timeout", err)
	}
	if err := recv(t, "Stop to return", stop); err != nil {
		t.Fatal(err)
	}
	if ids := completedIDs(d); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("outcomes written by the time Stop returned: %v, want [1]", ids)
	}
	if r := d.released.Load(); r != 0 {
		t.Fatalf("%d jobs released, want none: the job finished", r)
	}
}

// Once Stop begins the fetchers stop claiming (a claim already decided
// may still go out, no more); after the shutdown timeout the handlers are
// cancelled with the shutdown cause, and the attempts they gave up are
// released, with their fences, after the last claim: every claimed job is
// then either written or released.
func TestStopReleasesUnfinishedJobsAfterClaimsStop(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(2)...)
	cfg := testConfig(10 * time.Second)
	cfg.ShutdownTimeout = 30 * time.Millisecond
	cfg.PollMin, cfg.PollMax = time.Millisecond, 2*time.Millisecond // a fetcher left running would claim often
	var e *Engine
	var lateClaims atomic.Int64
	d.onClaim = func(driver.ClaimParams) {
		if e.stopping.Load() {
			lateClaims.Add(1)
		}
	}
	started := make(chan struct{}, 2)
	causes := make(chan error, 2)
	e = New(d, cfg, map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		started <- struct{}{}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}})
	t.Cleanup(func() { e.Close(context.Background()) })
	if err := e.Start(context.Background()); err != nil { // after e is set: the claim hook reads it
		t.Fatal(err)
	}
	recv(t, "job 1 to start", started)
	recv(t, "job 2 to start", started)
	stop := stopAsync(e)
	waitFor(t, "Stop to begin", e.stopping.Load)
	fetchersStopped(t, e)
	// Work that turns up now must wait for the next start.
	d.add(jobIn("q", 3, 103))
	e.Wake("q")
	for range 2 {
		if c := recv(t, "a handler to be cancelled", causes); !errors.Is(c, errShutdown) {
			t.Fatalf("handler cancelled by %v, want the shutdown", c)
		}
	}
	if err := recv(t, "Stop to return", stop); err != nil {
		t.Fatal(err)
	}
	if n := lateClaims.Load(); n > 1 {
		t.Fatalf("%d claims after Stop began, want at most the one already decided", n)
	}
	// Job 3 was never claimed; 1 and 2, released, are pending again.
	if p := d.stillPending(); len(p) != 3 || p[0] != 3 || !slices.Equal(slices.Sorted(slices.Values(p)), []int64{1, 2, 3}) {
		t.Fatalf("pending after Stop: %v, want 3 then 1 and 2: nothing is claimed once the fetchers stopped, the released jobs wait again", p)
	}
	if got, want := releasedLeases(d), []driver.Lease{{ID: 1, Fence: 101}, {ID: 2, Fence: 102}}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	var releasedAt int
	calls := d.allCalls()
	for i, c := range calls {
		if c.op == "release" {
			releasedAt = i
			break
		}
	}
	for _, c := range calls[releasedAt:] {
		if c.op == "claim" {
			t.Fatal("a claim after the release: unfinished jobs must be released only once claims have stopped")
		}
	}
	if n := d.count("complete"); n != 0 {
		t.Fatalf("%d outcomes written for handlers interrupted by the shutdown, want none", n)
	}
	if held := d.heldIDs(); len(held) != 0 {
		t.Fatalf("jobs %v left running in the database after Stop", held)
	}
	if got := e.Metrics().Released.Load(); got != 2 {
		t.Fatalf("released %d, want 2", got)
	}
}

// Stop writes the outcome of a handler that finished during the shutdown
// before it returns, even when that write is slow, and releases only the
// attempts that did not finish.
func TestStopFlushesOutcomesBeforeReturning(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(2)...)
	gate := make(chan struct{})
	var written atomic.Bool
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		<-gate // a slow database
		written.Store(true)
		return applied(outs), nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.ShutdownTimeout = 30 * time.Millisecond
	started := make(chan struct{}, 2)
	finish := make(chan struct{})
	cancelled := make(chan struct{})
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		started <- struct{}{}
		if row.ID == 2 {
			<-finish
			return nil
		}
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	}})
	recv(t, "job 1 to start", started)
	recv(t, "job 2 to start", started)
	stop := stopAsync(e)
	waitFor(t, "Stop to begin", e.stopping.Load)
	close(finish)
	waitFor(t, "job 2's outcome sent", func() bool { return d.count("complete") == 1 })
	recv(t, "the shutdown timeout to cancel job 1", cancelled)
	// Room for a Stop that does not wait for the write to return.
	time.Sleep(50 * time.Millisecond)
	notReturned(t, stop, "before the outcome of a finished handler was written")
	close(gate)
	if err := recv(t, "Stop to return", stop); err != nil {
		t.Fatal(err)
	}
	if !written.Load() || e.Metrics().Completed.Load() != 1 {
		t.Fatalf("Stop returned with job 2's outcome written=%v, completed=%d", written.Load(), e.Metrics().Completed.Load())
	}
	if got, want := releasedLeases(d), []driver.Lease{{ID: 1, Fence: 101}}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v: only the unfinished job", got, want)
	}
	if held := d.heldIDs(); len(held) != 0 {
		t.Fatalf("jobs %v left running in the database after Stop", held)
	}
}

// A handler that ignores its cancelled context past the shutdown timeout
// does not hold Stop: Stop returns and releases its attempt (documented:
// jobs that did not finish are made available again); the handler's late
// result is then dropped, not written.
func TestStopAbandonsHandlerIgnoringContext(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(1)...)
	cfg := testConfig(10 * time.Second)
	cfg.ShutdownTimeout = 20 * time.Millisecond
	started, late := make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		close(started)
		<-late // ignores its context
		returned.Store(true)
		return nil
	}})
	recv(t, "the handler to start", started)
	if err := recv(t, "Stop to return", stopAsync(e)); err != nil {
		t.Fatal(err)
	}
	if returned.Load() {
		t.Fatal("the handler returned before Stop: the test proves nothing")
	}
	if got, want := releasedLeases(d), []driver.Lease{{ID: 1, Fence: 101}}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	close(late)
	waitFor(t, "the late handler's worker to finish", func() bool { return e.fetchers["q"].running.Load() == 0 })
	if n := d.count("complete"); n != 0 {
		t.Fatalf("%d outcome writes for an attempt released at shutdown, want none", n)
	}
	if got := e.Metrics().Completed.Load(); got != 0 {
		t.Fatalf("completed %d, want 0", got)
	}
}

// A handler still running one lease after its job timeout, ignoring its
// context, is abandoned: its lease is no longer renewed (the other
// attempts' still are) and Stop does not release it, so that its lease
// expires and a rescue counts the attempt; its late result is dropped.
func TestAbandonedAttemptIsNeitherRenewedNorReleased(t *testing.T) {
	const lease = 300 * time.Millisecond
	d := &fakeDriver{}
	hung, fine := jobIn("q", 1, 101), jobIn("q", 2, 102)
	hung.TimeoutMS, fine.TimeoutMS = 10, -1
	d.add(hung, fine)
	cfg := testConfig(lease)
	cfg.HeartbeatInterval = 20 * time.Millisecond
	cfg.ShutdownTimeout = 20 * time.Millisecond
	late := make(chan struct{})
	timedOut := make(chan error, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		<-ctx.Done()
		if row.ID == 1 {
			timedOut <- context.Cause(ctx)
			<-late // ignores its context
			return nil
		}
		if !errors.Is(context.Cause(ctx), errShutdown) {
			<-late // cut off on a stalled machine: stay until the shutdown
		}
		return ctx.Err()
	}})
	if c := recv(t, "job 1's timeout", timedOut); c == nil || !strings.Contains(c.Error(), "timed out") {
		t.Fatalf("job 1's context ended with %v, want its timeout", c)
	}
	renews := func(c call, id int64) bool { return slices.Contains(c.ids, id) }
	waitFor(t, "a renewal of job 2 without job 1", func() bool {
		hs := d.callsOf("heartbeat")
		return len(hs) > 0 && renews(hs[len(hs)-1], 2) && !renews(hs[len(hs)-1], 1) && slices.ContainsFunc(hs, func(c call) bool { return renews(c, 1) })
	})
	if err := recv(t, "Stop to return", stopAsync(e)); err != nil {
		t.Fatal(err)
	}
	dropped := false
	for _, c := range d.callsOf("heartbeat") {
		switch {
		case !renews(c, 1):
			dropped = true
		case dropped:
			t.Fatal("job 1's lease renewed again after it was abandoned")
		}
	}
	if got, want := releasedLeases(d), []driver.Lease{{ID: 2, Fence: 102}}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v: the abandoned attempt is left to expire", got, want)
	}
	close(late)
	waitFor(t, "the late handler's worker to finish", func() bool { return e.fetchers["q"].running.Load() == 0 })
	if n := d.count("complete"); n != 0 {
		t.Fatalf("%d outcome writes, want none", n)
	}
	if held := d.heldIDs(); !slices.Equal(held, []int64{1}) {
		t.Fatalf("running in the database after Stop: %v, want [1] (left for the rescue)", held)
	}
}
