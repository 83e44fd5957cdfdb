package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// limitConfig is testConfig for one queue "q" whose idle poll would back
// off to an hour: a fetcher that took a held claim for an empty queue
// would not claim again within the tests' guard.
func limitConfig(pollMin time.Duration) Config {
	cfg := testConfig(10 * time.Second)
	cfg.PollMin, cfg.PollMax, cfg.ListenPoll = pollMin, time.Hour, time.Hour
	return cfg
}

// claimsAfter returns the claims of queue that began after index i of
// its claims.
func claimsAfter(d *fakeDriver, queue string, i int) []call {
	cs := d.claimsOf(queue)
	if len(cs) <= i {
		return nil
	}
	return cs[i:]
}

// A claim held back by the concurrency limit (Held, no RetryIn) is tried
// again every PollMin while it stays held: jobs are waiting, so the
// fetcher neither backs off towards PollMax, as after an empty claim, nor
// claims in a tight loop.
func TestLimitHeldClaimRetriedAtPollMin(t *testing.T) {
	const pollMin = 10 * time.Millisecond
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}}
	d.claimLimited = func(context.Context, driver.ClaimParams) (driver.ClaimResult, error) {
		return driver.ClaimResult{Held: true}, nil
	}
	startEngine(t, d, limitConfig(pollMin), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	// Backing off from PollMin to an hour, the 15th claim would come
	// about 2^15 PollMin (5 minutes) after the first.
	const claims = 15
	waitFor(t, "15 held claims", func() bool { return len(d.claimsOf("q")) >= claims })
	cs := d.claimsOf("q")
	for i, c := range cs {
		if !c.limited {
			t.Fatalf("claim %d of a limited queue went through Claim, not ClaimLimited", i+1)
		}
		if i > 0 {
			if gap := c.at.Sub(cs[i-1].at); gap < pollMin {
				t.Fatalf("held claim %d came %v after the previous one, want at least PollMin (%v): a tight loop", i+1, gap, pollMin)
			}
		}
	}
}

// A claim held back by the rate (Held with RetryIn) is tried again when
// the window has room, RetryIn later: not at PollMin, not at PollMax.
func TestLimitHeldClaimRetriedAfterRetryIn(t *testing.T) {
	const retryIn = 300 * time.Millisecond
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {Rate: 1, RatePeriod: time.Second}}}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		if n.Add(1) == 1 {
			return driver.ClaimResult{Held: true, RetryIn: retryIn}, nil
		}
		return driver.ClaimResult{Rows: d.takePending(p)}, nil
	}
	d.add(job(1))
	ran := make(chan int64, 1)
	startEngine(t, d, limitConfig(10*time.Millisecond), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	if id := recv(t, "the job held by the rate to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	cs := d.claimsOf("q")
	if len(cs) < 2 {
		t.Fatalf("%d claims, want 2", len(cs))
	}
	if gap := cs[1].at.Sub(cs[0].at); gap < retryIn {
		t.Fatalf("the claim after a rate hold came %v after it, want at least RetryIn (%v)", gap, retryIn)
	}
}

// In a queue limited per key, a claim held back by a key's rate (Held
// with RetryIn, an hour here) is tried again after PollMin, not RetryIn:
// one key's window says nothing of the other keys, whose jobs may come
// from other processes; and not in a tight loop either.
func TestLimitKeyRateHeldClaimRetriedAtPollMin(t *testing.T) {
	const pollMin = 10 * time.Millisecond
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {KeyRate: 1, KeyRatePeriod: time.Hour}}}
	const held = 5
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		if n.Add(1) <= held {
			return driver.ClaimResult{Held: true, RetryIn: time.Hour}, nil
		}
		return driver.ClaimResult{Rows: d.takePending(p)}, nil
	}
	d.add(job(1))
	ran := make(chan int64, 1)
	startEngine(t, d, limitConfig(pollMin), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	if id := recv(t, "the job of another key to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	cs := d.claimsOf("q")
	if len(cs) <= held {
		t.Fatalf("%d claims, want more than the %d held", len(cs), held)
	}
	for i := 1; i <= held; i++ {
		if gap := cs[i].at.Sub(cs[i-1].at); gap < pollMin {
			t.Fatalf("claim %d came %v after a claim held by a key's rate, want at least PollMin (%v): a tight loop", i+1, gap, pollMin)
		}
	}
}

// In a queue served by key (Fair here, with a Rate), a claim held back
// by the queue's own full window (RateFull) is tried again when that
// window has room, RetryIn later, not after PollMin: no job of any key
// starts before. It was tried every PollMin for as long as the window
// stayed full (up to its whole period).
func TestLimitQueueRateHeldClaimInKeyedQueueRetriedAfterRetryIn(t *testing.T) {
	const retryIn = 300 * time.Millisecond
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {Rate: 1, RatePeriod: time.Second, Fair: true}}}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		if n.Add(1) == 1 {
			return driver.ClaimResult{Held: true, RetryIn: retryIn, RateFull: true}, nil
		}
		return driver.ClaimResult{Rows: d.takePending(p)}, nil
	}
	d.add(job(1))
	ran := make(chan int64, 1)
	startEngine(t, d, limitConfig(10*time.Millisecond), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	if id := recv(t, "the job held by the queue's rate to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	cs := d.claimsOf("q")
	if len(cs) < 2 {
		t.Fatalf("%d claims, want 2", len(cs))
	}
	if gap := cs[1].at.Sub(cs[0].at); gap < retryIn {
		t.Fatalf("the claim after a hold by the queue's full window came %v after it, want at least RetryIn (%v)", gap, retryIn)
	}
}

// When an attempt of a limited queue ends, the completer wakes the
// queue's fetcher, held back by the concurrency limit: it claims at once,
// not at its next poll (an hour here).
func TestLimitCompletionWakesHeldFetcher(t *testing.T) {
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		switch n.Add(1) {
		case 1: // job 1 takes the one slot; job 2 waits
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 1, 101)}, Held: true}, nil
		case 2:
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 2, 102)}}, nil
		}
		return driver.ClaimResult{}, nil
	}
	gate := make(chan struct{})
	ran := make(chan int64, 2)
	startEngine(t, d, limitConfig(time.Hour), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		if row.ID == 1 {
			<-gate
		}
		ran <- row.ID
		return nil
	}})
	waitFor(t, "the held claim", func() bool { cs := d.claimsOf("q"); return len(cs) == 1 && cs[0].done })
	close(gate)
	recv(t, "job 1 to finish", ran)
	if id := recv(t, "job 2 to run after job 1's slot was freed", ran); id != 2 {
		t.Fatalf("ran job %d, want 2", id)
	}
	cs, done := d.claimsOf("q"), d.callsOf("complete")
	if len(done) == 0 || cs[1].at.Before(done[0].at) {
		t.Fatal("the second claim did not follow the completion of job 1")
	}
}

// A fetcher whose process holds every slot of its queue's MaxRunning (as
// its last claim read it) does not claim when woken for a slot freed
// elsewhere: no claim could take one of this process's slots. It claims
// as soon as one of its own attempts ends, and asks for no more than the
// slots it could take.
func TestLimitFullProcessClaimsAfterItsOwnEnd(t *testing.T) {
	e, d := limitHoldEngine(t)
	// Wake-ups of the kind a notification of a slot freed elsewhere
	// gives: none may start a claim while job 1 holds the one slot.
	for range 5 {
		e.slotFreed("q")
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(d.claimsOf("q")); n != 1 {
		t.Fatalf("%d claims while the process held every slot, want only the first", n)
	}
	close(d.gate)
	if id := recv(t, "job 2 to run after job 1 ended", d.ran); id != 2 {
		t.Fatalf("ran job %d, want 2", id)
	}
	cs := d.claimsOf("q")
	if len(cs) < 2 || cs[1].limit != 1 {
		t.Fatalf("claims %+v: want a second claim for the one slot freed", cs)
	}
}

// A process that holds every slot and changes the queue's limits itself
// claims at once: its MaxRunning may have been raised.
func TestLimitFullProcessClaimsAfterItsOwnChange(t *testing.T) {
	e, d := limitHoldEngine(t)
	defer close(d.gate)
	if err := e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, "job 2 to run after the process changed the limits", d.ran); id != 2 {
		t.Fatalf("ran job %d, want 2", id)
	}
}

// limitHoldDriver is a fake whose queue "q" has a MaxRunning of 1: job 1
// takes the slot and runs until gate closes; job 2 comes with the next
// claim.
type limitHoldDriver struct {
	*fakeDriver
	gate chan struct{}
	ran  chan int64
}

// limitHoldEngine starts an engine (PollMin an hour) on a
// limitHoldDriver and waits until job 1 holds the slot.
func limitHoldEngine(t *testing.T) (*Engine, *limitHoldDriver) {
	t.Helper()
	d := &limitHoldDriver{
		fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}},
		gate:       make(chan struct{}), ran: make(chan int64, 2),
	}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		switch n.Add(1) {
		case 1:
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 1, 101)}, Held: true, MaxRunning: 1}, nil
		case 2:
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 2, 102)}, MaxRunning: 1}, nil
		}
		return driver.ClaimResult{MaxRunning: 1}, nil
	}
	e := startEngine(t, d.fakeDriver, limitConfig(time.Hour), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		d.ran <- row.ID
		if row.ID == 1 {
			<-d.gate
		}
		return nil
	}})
	if id := recv(t, "job 1 to start", d.ran); id != 1 {
		t.Fatalf("ran job %d first, want 1", id)
	}
	return e, d
}

// A remote claim waiting on a queue held back by its concurrency limit is
// woken when a remote attempt of the queue ends, and claims the job the
// freed slot lets start (its own poll here is an hour).
func TestLimitCompletionWakesHeldRemoteClaim(t *testing.T) {
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		switch n.Add(1) {
		case 1:
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 1, 101)}}, nil
		case 2:
			return driver.ClaimResult{Held: true}, nil
		}
		return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 2, 102)}}, nil
	}
	e := New(d, limitConfig(time.Hour), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	ctx := context.Background()
	first, err := e.ClaimRemote(ctx, RemoteClaim{Queue: "q", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	got := make(chan []*driver.JobRow, 1)
	go func() {
		rows, err := e.ClaimRemote(ctx, RemoteClaim{Queue: "q", Limit: 1, Lease: time.Minute, Worker: "w", Wait: 3 * guard})
		if err != nil {
			t.Error(err)
		}
		got <- rows
	}()
	waitFor(t, "the held remote claim", func() bool { cs := d.claimsOf("q"); return len(cs) == 2 && cs[1].done })
	if err := e.CompleteRemote(ctx, 1, 101, nil); err != nil {
		t.Fatal(err)
	}
	rows := recv(t, "the held remote claim to be woken", got)
	if len(rows) != 1 || rows[0].ID != 2 {
		t.Fatalf("the woken claim got %v, want job 2", rows)
	}
}

// LimitsChanged switches the queue's claims to ClaimLimited at once, and
// back to Claim, without waiting for the next read of the limits (which
// never answers here after the first).
func TestLimitsChangedSwitchesClaimAtOnce(t *testing.T) {
	d := &fakeDriver{}
	var reads atomic.Int64
	d.queueLimits = func(ctx context.Context) (map[string]driver.QueueLimits, error) {
		if reads.Add(1) > 1 {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return map[string]driver.QueueLimits{}, nil
	}
	e := startEngine(t, d, limitConfig(time.Hour), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "the first claim", func() bool { return d.idle("q") })
	if cs := d.claimsOf("q"); cs[0].limited {
		t.Fatal("a queue without limits was claimed through ClaimLimited")
	}
	for _, limited := range []bool{true, false} {
		before := len(d.claimsOf("q"))
		var l driver.QueueLimits
		if limited {
			l = driver.QueueLimits{Rate: 1, RatePeriod: time.Hour}
		}
		if err := e.LimitsChanged(context.Background(), "q", l); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a claim after LimitsChanged", func() bool {
			cs := claimsAfter(d, "q", before)
			return len(cs) > 0 && cs[0].done
		})
		if c := claimAfter(d, before); c.limited != limited {
			t.Fatalf("after LimitsChanged(q, %v) the claim was limited=%v", limited, c.limited)
		}
	}
}

// A claim that began before this process changed the queue's limits,
// and whose statements are still running, may take jobs enqueued after
// the change without the slots the new limits ask for (a plain claim
// chosen by the cache as it was, or a limited one whose driver read no
// limits and went on as a plain one): LimitsChanged (and so
// SetQueueLimits) returns only after that claim has, and returns ctx's
// error if ctx ends first.
func TestLimitsChangedWaitsForClaims(t *testing.T) {
	d := &fakeDriver{}
	d.queueLimits = func(ctx context.Context) (map[string]driver.QueueLimits, error) {
		return map[string]driver.QueueLimits{}, nil
	}
	// A claim made while stall holds a channel waits until it closes.
	var stall atomic.Pointer[chan struct{}]
	entered := make(chan struct{}, 1)
	d.claim = func(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
		if ch := stall.Swap(nil); ch != nil {
			entered <- struct{}{}
			<-*ch
		}
		return d.takePending(p), nil
	}
	e := startEngine(t, d, limitConfig(time.Hour), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "the first claim", func() bool { return d.idle("q") })

	// Each stall is released at the end whatever happens, before the
	// engine is closed.
	stalled := func(what string) (release func()) {
		ch := make(chan struct{})
		var once sync.Once
		release = func() { once.Do(func() { close(ch) }) }
		t.Cleanup(release)
		stall.Store(&ch)
		e.Wake("q")
		recv(t, what+" under way", entered)
		return release
	}
	// LimitsChanged to l must wait for the stalled claim (what).
	waitsFor := func(what string, l driver.QueueLimits, release func()) {
		changed := make(chan error, 1)
		go func() { changed <- e.LimitsChanged(context.Background(), "q", l) }()
		select {
		case err := <-changed:
			t.Fatalf("LimitsChanged returned (%v) while %s begun before it was still running", err, what)
		case <-time.After(100 * time.Millisecond):
		}
		release()
		if err := recv(t, "LimitsChanged after "+what+" returned", changed); err != nil {
			t.Fatal(err)
		}
	}

	// The claim that stalls read the cache: no limits.
	waitsFor("a plain claim", driver.QueueLimits{MaxRunning: 1}, stalled("a plain claim"))

	// A claim after the change goes through ClaimLimited.
	before := len(d.claimsOf("q"))
	if err := e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a claim after the change", func() bool { cs := claimsAfter(d, "q", before); return len(cs) > 0 && cs[0].done })
	if c := claimAfter(d, before); !c.limited {
		t.Fatal("a claim after LimitsChanged set a MaxRunning was not limited")
	}

	// A limited claim (whose driver may have read no limits and gone on
	// as a plain claim) holds the change up as well.
	waitsFor("a limited claim", driver.QueueLimits{MaxRunning: 3}, stalled("a limited claim"))

	// Back to no limits; a plain claim stalls again, and the wait for it
	// ends with the caller's context.
	if err := e.LimitsChanged(context.Background(), "q", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an idle plain claim", func() bool { return d.idle("q") })
	release := stalled("a second plain claim")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.LimitsChanged(ctx, "q", driver.QueueLimits{MaxRunning: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LimitsChanged with a stalled plain claim and an ended context returned %v, want the context's error", err)
	}
	release()
}

// claimAfter is the first claim of "q" after index i.
func claimAfter(d *fakeDriver, i int) call { return claimsAfter(d, "q", i)[0] }

// While the limits cannot be read, the cache goes stale and every queue
// is claimed through ClaimLimited (another process may have limited any
// of them since the last read). A change of limits made by this process
// meanwhile (LimitsChanged) tells about one queue only: it must not make
// the rest of the stale cache look fresh again, which would let claims of
// a queue limited elsewhere go through Claim for another while, and for
// as long as this process keeps changing limits.
func TestLimitsChangedKeepsAStaleCacheStale(t *testing.T) {
	d := &fakeDriver{}
	var reads atomic.Int64
	d.queueLimits = func(ctx context.Context) (map[string]driver.QueueLimits, error) {
		if reads.Add(1) > 1 {
			return nil, context.DeadlineExceeded // the database does not answer
		}
		return map[string]driver.QueueLimits{}, nil
	}
	e := startEngine(t, d, limitConfig(time.Hour), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "the first read of the limits", func() bool { return e.limits.Load() != nil })
	waitFor(t, "the cache to go stale", func() bool { return e.limited("elsewhere") })
	if err := e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if !e.limited("elsewhere") {
		t.Fatal("after LimitsChanged of another queue, a stale cache said a queue is not limited")
	}
	if !e.limited("q") {
		t.Fatal("the queue just limited is not limited")
	}
}

// A refused call of a stale attempt (a renewal, an outcome, a release
// under an old fence) does not make the engine forget the job's current
// remote attempt: that attempt's completion still wakes a remote claim
// held back by the queue's concurrency limit (its own poll here is an
// hour).
func TestStaleRemoteCallKeepsCurrentAttempt(t *testing.T) {
	d := &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}}
	var n atomic.Int64
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		switch n.Add(1) {
		case 1:
			return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 1, 101)}}, nil
		case 2:
			return driver.ClaimResult{Held: true}, nil
		}
		return driver.ClaimResult{Rows: []*driver.JobRow{jobIn("q", 2, 102)}}, nil
	}
	// Fence 100 is job 1's earlier attempt, since rescued: the database
	// refuses it.
	d.heartbeat = func(_ context.Context, ls []driver.Lease) ([]int64, error) {
		var ids []int64
		for _, l := range ls {
			if l.Fence != 100 {
				ids = append(ids, l.ID)
			}
		}
		return ids, nil
	}
	d.complete = func(_ context.Context, os []driver.Outcome) ([]int64, error) {
		var ids []int64
		for _, o := range os {
			if o.Fence != 100 {
				ids = append(ids, o.ID)
			}
		}
		return ids, nil
	}
	e := New(d, limitConfig(time.Hour), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	ctx := context.Background()
	first, err := e.ClaimRemote(ctx, RemoteClaim{Queue: "q", Limit: 1, Lease: time.Minute, Worker: "w2", Process: "w2"})
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %v %v", first, err)
	}
	if err := e.RenewRemote(ctx, 1, 100, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the stale attempt's renewal: %v, want ErrLeaseLost", err)
	}
	if err := e.CompleteRemote(ctx, 1, 100, nil); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the stale attempt's completion: %v, want ErrLeaseLost", err)
	}
	if q := e.remote.queueOf(1); q != "q" {
		t.Fatalf("after the stale attempt's calls the current attempt's queue is %q, want q: its remote attempt was forgotten", q)
	}
	got := make(chan []*driver.JobRow, 1)
	go func() {
		rows, err := e.ClaimRemote(ctx, RemoteClaim{Queue: "q", Limit: 1, Lease: time.Minute, Worker: "w3", Wait: 3 * guard})
		if err != nil {
			t.Error(err)
		}
		got <- rows
	}()
	waitFor(t, "the held remote claim", func() bool { cs := d.claimsOf("q"); return len(cs) == 2 && cs[1].done })
	if err := e.CompleteRemote(ctx, 1, 101, nil); err != nil {
		t.Fatal(err)
	}
	rows := recv(t, "the held remote claim to be woken by the current attempt's completion", got)
	if len(rows) != 1 || rows[0].ID != 2 {
		t.Fatalf("the woken claim got %v, want job 2", rows)
	}
}

// A queue's claims gate lives only while a claim or a change of limits
// uses it: claims of queue names HTTP workers make up, and changes whose
// wait ended with the caller's context, leave no gate behind once they
// returned.
func TestClaimGatesAreDropped(t *testing.T) {
	d := &fakeDriver{}
	d.queueLimits = func(ctx context.Context) (map[string]driver.QueueLimits, error) {
		return map[string]driver.QueueLimits{}, nil
	}
	e := startEngine(t, d, limitConfig(time.Hour), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "the first claim", func() bool { return d.idle("q") })
	for i := range 100 {
		p := driver.ClaimParams{Queue: fmt.Sprintf("made-up-%d", i), Limit: 1, Lease: time.Minute, Worker: "w"}
		if _, _, err := e.claimRemote(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	// Two claims hold a gate; the first returns: the gate stays, and a
	// change still waits for the second (a gate dropped early would be
	// made anew, and the change would not wait). The change's wait ends
	// with its context: the gate outlives the change until the claim
	// returns.
	unlock1 := e.lockClaims("other")
	unlock := e.lockClaims("other")
	unlock1()
	if !e.claimGates.has("other") {
		t.Fatal("the gate was dropped while a claim held it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := e.LimitsChanged(ctx, "other", driver.QueueLimits{MaxRunning: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LimitsChanged with the gate held returned %v, want the context's error", err)
	}
	if !e.claimGates.has("other") {
		t.Fatal("the gate was dropped while a claim held it")
	}
	unlock()
	// The change's wait, left running, takes the gate once and drops it.
	waitFor(t, "the gate dropped once its last user returned", func() bool { return !e.claimGates.has("other") })
	for i := range 100 {
		if q := fmt.Sprintf("made-up-%d", i); e.claimGates.has(q) {
			t.Fatalf("the gate of %s outlived its remote claim", q)
		}
	}
}
