package engine

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// leasingDriver is the fake driver with blocks of slots (SlotLeaser):
// each call grants min(want, the queue's MaxRunning as limits says, the
// cap grant sets), and records what it was asked and gave.
type leasingDriver struct {
	*fakeDriver
	mu    sync.Mutex
	cap   map[string]int // the most a call grants per queue (none: no cap)
	asked []map[string]int
	gave  []map[string]driver.SlotBlock
	// fail, when set, fails every call.
	fail atomic.Bool
	// onLease, when set, sees every call's want as it is made.
	onLease func(want map[string]int)
}

func (d *leasingDriver) LeaseSlots(_ context.Context, owner string, want map[string]int, _ time.Duration) (map[string]driver.SlotBlock, error) {
	if d.fail.Load() {
		return nil, context.DeadlineExceeded
	}
	if d.onLease != nil {
		d.onLease(want)
	}
	d.fakeDriver.mu.Lock()
	limits := d.limits
	d.fakeDriver.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]driver.SlotBlock{}
	asked := map[string]int{}
	for q, w := range want {
		asked[q] = w
		mr := limits[q].MaxRunning
		n := min(w, mr)
		if c, ok := d.cap[q]; ok {
			n = min(n, c)
		}
		out[q] = driver.SlotBlock{Held: n, Usable: n, MaxRunning: mr}
	}
	d.asked = append(d.asked, asked)
	d.gave = append(d.gave, out)
	return out, nil
}

func (d *leasingDriver) setCap(q string, n int) {
	d.mu.Lock()
	if d.cap == nil {
		d.cap = map[string]int{}
	}
	d.cap[q] = n
	d.mu.Unlock()
}

func (d *leasingDriver) last() (map[string]int, map[string]driver.SlotBlock) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.asked) == 0 {
		return nil, nil
	}
	return d.asked[len(d.asked)-1], d.gave[len(d.gave)-1]
}

// concurrency counts handlers running at once and their peak.
type concurrency struct{ now, peak atomic.Int64 }

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

func startLeasing(t *testing.T, d *leasingDriver, cfg Config, handlers map[string]Handler) *Engine {
	t.Helper()
	e := New(d, cfg, handlers)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// A queue with a MaxRunning is worked under a block: no more handlers
// run at once than the block holds, whatever the workers, the claims
// take no slot (Claim, Blocked), and Stop gives the block back.
func TestBlockHoldsHandlersToItsSlots(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 3}}}}
	const jobs = 40
	for i := range jobs {
		d.add(job(int64(i + 1)))
	}
	var c concurrency
	var done atomic.Int64
	var blocked atomic.Bool
	blocked.Store(true)
	d.onClaim = func(p driver.ClaimParams) {
		if !p.Blocked {
			blocked.Store(false)
		}
	}
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 10}
	e := startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		c.enter()
		defer c.leave()
		time.Sleep(2 * time.Millisecond)
		done.Add(1)
		return nil
	}})
	waitFor(t, "every job to run", func() bool { return done.Load() == jobs })
	if p := c.peak.Load(); p != 3 {
		t.Fatalf("peak of %d handlers at once under a block of 3 slots, want 3", p)
	}
	if !blocked.Load() {
		t.Fatal("a claim under the block was not marked Blocked")
	}
	for _, cl := range d.claimsOf("q") {
		if cl.limited {
			t.Fatal("a queue whose only limit is MaxRunning was claimed through ClaimLimited under its block")
		}
	}
	if asked, gave := d.last(); asked["q"] < 3 || gave["q"].Held != 3 {
		t.Fatalf("last lease asked %v, gave %v; want a block of the limit's 3", asked, gave)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if asked, _ := d.last(); asked["q"] != 0 {
		t.Fatalf("the last lease after Stop asked %v, want the block given back (0)", asked)
	}
}

// A claim that comes back after the block's lease could have expired
// (less the margin) starts nothing, although its jobs' own leases are
// fresh: its jobs are released unstarted, and the block is renewed
// before the next claim.
func TestBlockLateClaimReleased(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	const lease = 2 * time.Second
	var slow atomic.Bool
	slow.Store(true)
	d.claim = func(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
		rows := d.takePending(p)
		if len(rows) > 0 && slow.Swap(false) {
			time.Sleep(lease / 4)
		}
		return rows, nil
	}
	type attempt struct{ id, fence int64 }
	ran := make(chan attempt, 4)
	cfg := testConfig(lease)
	cfg.HeartbeatInterval = time.Hour // no renewal behind the claim's back
	startLeasing(t, d, cfg, map[string]Handler{"k": func(_ context.Context, r *driver.JobRow) error {
		ran <- attempt{r.ID, r.Fence}
		return nil
	}})
	waitFor(t, "the block's lease", func() bool { a, _ := d.last(); return a != nil })
	leased := time.Now()
	// The jobs come when the block has a little more than its margin
	// (a fifth of the lease) left: the claim that finds them, slowed by
	// a quarter of the lease, comes back with less than the margin left.
	time.Sleep(lease - lease/5 - lease/8 - time.Since(leased))
	d.add(job(1), job(2))
	waitFor(t, "the late claim's jobs to be released", func() bool { return d.released.Load() == 2 })
	// Released, they are pending again under a new fence (as in the
	// database) and run under the renewed block; the late claim's
	// attempts (fence 7) never ran.
	for range 2 {
		a := recv(t, "a job under the renewed block", ran)
		if a.fence == job(a.id).Fence {
			t.Fatalf("job %d of a claim that came back after its block may have expired ran", a.id)
		}
	}
}

// A block whose slots another process holds is tried again after a
// while, not in a tight loop, and the jobs run once slots free.
func TestBlockGrowsWhenSlotsFree(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 4}}}}
	d.setCap("q", 0) // every slot held elsewhere
	for i := range 5 {
		d.add(job(int64(i + 1)))
	}
	var c concurrency
	var done atomic.Int64
	cfg := limitConfig(5 * time.Millisecond)
	cfg.Queues = map[string]int{"q": 8}
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		c.enter()
		defer c.leave()
		time.Sleep(5 * time.Millisecond)
		done.Add(1)
		return nil
	}})
	time.Sleep(300 * time.Millisecond)
	d.mu.Lock()
	tries := len(d.asked)
	d.mu.Unlock()
	if done.Load() != 0 {
		t.Fatalf("%d jobs ran without a slot", done.Load())
	}
	// Backing off from PollMin (5ms) to blockRetryMax, 300ms hold about
	// 7 tries; a tight loop thousands.
	if tries < 2 || tries > 40 {
		t.Fatalf("%d tries to lease a slot in 300ms while none was free", tries)
	}
	d.setCap("q", 2)
	waitFor(t, "the jobs to run once 2 slots freed", func() bool { return done.Load() == 5 })
	if p := c.peak.Load(); p > 2 {
		t.Fatalf("peak of %d handlers at once with 2 slots", p)
	}
}

// A lowered MaxRunning, seen by the limits cache, takes effect without
// waiting for the next renewal: the block is leased again under it.
func TestBlockLoweredLimitLeasedAgain(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 4}}}}
	var c concurrency
	var done atomic.Int64
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 8}
	cfg.HeartbeatInterval = time.Hour
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		c.enter()
		defer c.leave()
		time.Sleep(3 * time.Millisecond)
		done.Add(1)
		return nil
	}})
	for i := range 20 {
		d.add(job(int64(i + 1)))
	}
	waitFor(t, "the first jobs", func() bool { return done.Load() == 20 })
	if p := c.peak.Load(); p != 4 {
		t.Fatalf("peak %d under a block of 4", p)
	}
	d.fakeDriver.mu.Lock()
	d.limits = map[string]driver.QueueLimits{"q": {MaxRunning: 1}}
	d.fakeDriver.mu.Unlock()
	waitFor(t, "the block leased again under the lowered limit", func() bool {
		_, gave := d.last()
		return gave["q"].MaxRunning == 1
	})
	c.peak.Store(0)
	for i := range 20 {
		d.add(job(int64(100 + i)))
	}
	waitFor(t, "the later jobs", func() bool { return done.Load() == 40 })
	if p := c.peak.Load(); p != 1 {
		t.Fatalf("peak %d after the limit was lowered to 1", p)
	}
}

// A block is never given back below the handlers running under it: a
// renewal that shrinks it (the queue's backlog gone) first stops handing
// out permits beyond the smaller block, so that when the database gives
// the rest back no handler runs under a slot another process may take.
func TestBlockNeverShrinksUnderRunningHandlers(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 6}}}}
	// Every slot of an attempt of its own taken (as by HTTP workers): the
	// jobs run under the block alone, and every handler counts in it.
	d.claimLimited = func(context.Context, driver.ClaimParams) (driver.ClaimResult, error) {
		return driver.ClaimResult{Held: true, MaxRunning: 6}, nil
	}
	var c concurrency
	var below atomic.Int64
	d.onLease = func(want map[string]int) {
		// As a database would: the slots beyond want go back at the
		// commit, a moment after the call was made.
		time.Sleep(time.Millisecond)
		if n := c.now.Load(); int64(want["q"]) < n {
			below.Store(n<<32 | int64(want["q"]))
		}
	}
	cfg := testConfig(time.Second)
	cfg.Queues = map[string]int{"q": 6}
	cfg.HeartbeatInterval = 5 * time.Millisecond // renewals all the time
	var done atomic.Int64
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		c.enter()
		defer c.leave()
		time.Sleep(time.Duration(1+done.Load()%4) * time.Millisecond)
		done.Add(1)
		return nil
	}})
	next := int64(1)
	for round := range 120 {
		// Bursts of 1 to 8 jobs with pauses between: blocks grow and
		// shrink.
		for range 1 + round%8 {
			d.add(job(next))
			next++
		}
		time.Sleep(time.Duration(round%5) * 3 * time.Millisecond)
	}
	// The fake loses a job given back (Release does not make it pending
	// again): a block shrunk to nothing under a claim in flight turned
	// that claim's jobs away unstarted.
	waitFor(t, "every job", func() bool { return done.Load() == next-1 || d.released.Load() > 0 })
	if r := d.released.Load(); r != 0 {
		t.Fatalf("%d jobs given back unstarted: a renewal shrank the block under a claim in flight", r)
	}
	if v := below.Load(); v != 0 {
		t.Fatalf("a lease asked for %d slots while %d handlers ran under the block", v&(1<<32-1), v>>32)
	}
	if p := c.peak.Load(); p > 6 {
		t.Fatalf("peak %d under a limit of 6", p)
	}
}

// Jobs claimed ahead under a block, waiting for a permit, when the
// queue's MaxRunning is removed: the lease that finds no limit hands them
// all a permit, and they run.
func TestBlockRemovedLimitFreesWaiters(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	const jobs = 10
	for i := range jobs {
		d.add(job(int64(i + 1)))
	}
	gate := make(chan struct{})
	var started, done atomic.Int64
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 8}
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		started.Add(1)
		<-gate
		done.Add(1)
		return nil
	}})
	waitFor(t, "two handlers under the block of 2", func() bool { return started.Load() == 2 })
	time.Sleep(50 * time.Millisecond) // the claim ahead (2 more jobs) waits for permits
	d.fakeDriver.mu.Lock()
	d.limits = map[string]driver.QueueLimits{"q": {}}
	d.fakeDriver.mu.Unlock()
	waitFor(t, "the block leased again without a limit", func() bool {
		_, gave := d.last()
		return gave["q"].MaxRunning == 0
	})
	close(gate)
	deadline := time.Now().Add(3 * time.Second)
	for done.Load() < jobs && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := done.Load(); n != jobs {
		t.Fatalf("%d of %d jobs ran 3s after MaxRunning was removed; none pending (%v): the rest wait for a permit",
			n, jobs, d.stillPending())
	}
}

// A block is never larger than the process's workers, whatever the jobs
// it claimed ahead: slots no handler of it could use would be slots other
// processes' workers wait for.
func TestBlockNoLargerThanWorkers(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 50}}}}
	for i := range 3000 {
		d.add(job(int64(i + 1)))
	}
	cfg := testConfig(time.Second)
	cfg.Queues = map[string]int{"q": 4}
	cfg.HeartbeatInterval = 20 * time.Millisecond
	cfg.ClaimBatch = 100
	var done atomic.Int64
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		time.Sleep(200 * time.Microsecond)
		done.Add(1)
		return nil
	}})
	time.Sleep(500 * time.Millisecond)
	d.mu.Lock()
	most := 0
	for _, g := range d.gave {
		most = max(most, g["q"].Held)
	}
	d.mu.Unlock()
	if most > 4 {
		t.Fatalf("a process with 4 workers held a block of %d slots (limit 50)", most)
	}
}

// A slow LeaseSlots (a lock wait, a slow durable commit) does not hold
// back the renewal of the jobs' leases: blocks are renewed by a loop of
// their own, and a handler whose job's lease the database renews is not
// cut off.
func TestBlockSlowRenewalSparesJobLeases(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	var slow atomic.Bool
	d.onLease = func(map[string]int) {
		if slow.Load() {
			time.Sleep(900 * time.Millisecond)
		}
	}
	d.add(job(1))
	cfg := testConfig(time.Second) // margin 200ms
	cfg.HeartbeatInterval = 200 * time.Millisecond
	cfg.Queues = map[string]int{"q": 2}
	cut := make(chan error, 1)
	e := startLeasing(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		slow.Store(true)
		select {
		case <-ctx.Done():
			cut <- context.Cause(ctx)
		case <-time.After(3 * time.Second):
			cut <- nil
		}
		return nil
	}})
	if err := recv(t, "the handler's end", cut); err != nil {
		t.Fatalf("a handler whose job's lease the database renews every time was cut off (%v; lease deadlines %d): the block's renewal held back the job's", err, e.Metrics().LeaseDeadlines.Load())
	}
}

// On a backend without notifications, a fetcher whose block shrank to
// nothing (the queue idle) still polls: a job another process enqueued
// starts within the poll interval.
func TestBlockIdleQueuePolled(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	cfg := testConfig(5 * time.Second)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	ran := make(chan time.Time, 2)
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		ran <- time.Now()
		return nil
	}})
	waitFor(t, "a block", func() bool { _, g := d.last(); return g["q"].Held > 0 })
	waitFor(t, "the idle block given back", func() bool { a, _ := d.last(); return a != nil && a["q"] == 0 })
	time.Sleep(200 * time.Millisecond) // the fetcher has seen the empty block
	added := time.Now()
	d.add(job(1)) // enqueued by another process: no wake-up
	select {
	case at := <-ran:
		if took := at.Sub(added); took > time.Second {
			t.Fatalf("a job enqueued elsewhere started %v later (PollMax %v)", took, cfg.PollMax)
		}
	case <-time.After(2 * time.Second):
		at := <-ran
		t.Fatalf("a job enqueued elsewhere started %v later (PollMax %v, Lease %v)", at.Sub(added), cfg.PollMax, cfg.Lease)
	}
}

// An idle queue whose block shrank to nothing, polled by claims of a slot
// per attempt that the limit holds back (every such slot taken, as by
// HTTP workers): the held claim says jobs wait, and the fetcher leases a
// block for them.
func TestBlockLeasedWhenProbeHeld(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	d.claimLimited = func(context.Context, driver.ClaimParams) (driver.ClaimResult, error) {
		return driver.ClaimResult{Held: true, MaxRunning: 2}, nil
	}
	cfg := testConfig(5 * time.Second)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	ran := make(chan time.Time, 2)
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		ran <- time.Now()
		return nil
	}})
	waitFor(t, "a block", func() bool { _, g := d.last(); return g["q"].Held > 0 })
	waitFor(t, "the idle block given back", func() bool { a, _ := d.last(); return a != nil && a["q"] == 0 })
	time.Sleep(200 * time.Millisecond)
	added := time.Now()
	d.add(job(1)) // enqueued by another process: no wake-up
	select {
	case at := <-ran:
		if took := at.Sub(added); took > time.Second {
			t.Fatalf("a job enqueued elsewhere started %v later (PollMax %v)", took, cfg.PollMax)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a job held back by per-attempt slots never started under a block")
	}
}

// A queue with a MaxRunning and a Rate: while the rate holds its claims
// back (RetryIn) and nothing runs, the renewal gives the block back; once
// the rate has room, the fetcher leases a block again and claims.
func TestBlockRateHeldAfterBlockGivenBack(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{
		"q": {MaxRunning: 2, Rate: 1, RatePeriod: time.Hour}}}}
	var full atomic.Bool
	full.Store(true)
	d.claimLimited = func(_ context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
		if full.Load() {
			return driver.ClaimResult{Held: true, RateFull: true, RetryIn: 30 * time.Millisecond, MaxRunning: 2}, nil
		}
		return driver.ClaimResult{Rows: d.takePending(p), MaxRunning: 2}, nil
	}
	d.add(job(1))
	cfg := testConfig(2 * time.Second)
	cfg.HeartbeatInterval = 20 * time.Millisecond
	ran := make(chan int64, 1)
	startLeasing(t, d, cfg, map[string]Handler{"k": func(_ context.Context, r *driver.JobRow) error {
		ran <- r.ID
		return nil
	}})
	waitFor(t, "a block", func() bool { _, g := d.last(); return g["q"].Held > 0 })
	waitFor(t, "the block given back", func() bool { a, _ := d.last(); return a != nil && a["q"] == 0 })
	time.Sleep(100 * time.Millisecond)
	full.Store(false) // the rate has room
	before := len(d.claimsOf("q"))
	select {
	case <-ran:
	case <-time.After(3 * time.Second):
		t.Fatalf("job 1 never ran after the rate had room: %d claims in 3s (before %d, after %d); pending %v",
			len(d.claimsOf("q"))-before, before, len(d.claimsOf("q")), d.stillPending())
	}
}

// A limit shared with another process (it holds half the slots), a
// backlog: the fetcher tries to grow its block at most once per backoff
// (PollMin doubling to blockRetryMax), not once per claim round: a
// LeaseSlots is a durable write.
func TestBlockSharedLimitGrowsBackingOff(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 4}}}}
	d.setCap("q", 2) // the other 2 slots are another process's
	const jobs = 200
	for i := range jobs {
		d.add(job(int64(i + 1)))
	}
	var done atomic.Int64
	cfg := testConfig(10 * time.Second) // renewals every 3.3s: none during the run
	cfg.Queues = map[string]int{"q": 4}
	start := time.Now()
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		time.Sleep(2 * time.Millisecond)
		done.Add(1)
		return nil
	}})
	waitFor(t, "every job", func() bool { return done.Load() == jobs })
	took := time.Since(start)
	d.mu.Lock()
	leases := len(d.asked)
	d.mu.Unlock()
	claims := len(d.claimsOf("q"))
	t.Logf("%d jobs in %v: %d LeaseSlots calls, %d claims", jobs, took, leases, claims)
	// Backing off to blockRetryMax (500ms), a run this long needs a
	// handful of tries.
	if max := int(took/blockRetryMax) + 10; leases > max {
		t.Fatalf("%d LeaseSlots calls (durable writes) in %v for %d jobs, %d claims: want at most %d", leases, took, jobs, claims, max)
	}
}

// An attempt without a permit that ends while another asks for a permit
// (the room it leaves seen, or the waiter seen) always lets the waiter
// start: no wake-up is lost between acquire and otherEnded.
func TestBlockOtherEndedWakesWaiter(t *testing.T) {
	stop := make(chan struct{})
	for i := range 50000 {
		var b slotBlock
		b.usable, b.held = 1, 1
		b.others.Store(1)
		got := make(chan bool, 1)
		go func() { got <- b.acquire(context.Background(), stop) }()
		b.otherEnded()
		select {
		case <-got:
		case <-time.After(time.Second):
			b.mu.Lock()
			t.Fatalf("iteration %d: a waiter got no permit with room free (executing %d, others %d, usable %d, waiters %d)",
				i, b.executing, b.others.Load(), b.usable, len(b.waiters))
		}
	}
}

// A renewal that gives an idle block back while the fetcher waits: the
// fetcher claims for the block as it is then, not as it read it before
// the wait; and with the limit then removed by another process, the job
// runs.
func TestBlockClaimAfterBlockGivenBackRuns(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	var eng atomic.Pointer[Engine]
	var unblocked atomic.Bool
	d.claim = func(_ context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
		rows := d.takePending(p)
		if e := eng.Load(); e != nil && len(rows) > 0 && p.Blocked && fetcherOf(e, "q").blk.state().held == 0 {
			unblocked.Store(true)
			d.fakeDriver.mu.Lock()
			d.limits = map[string]driver.QueueLimits{"q": {}} // MaxRunning removed, by another process
			d.fakeDriver.mu.Unlock()
		}
		return rows, nil
	}
	var gaveBack atomic.Bool
	d.onLease = func(want map[string]int) {
		if w, ok := want["q"]; ok && w == 0 {
			gaveBack.Store(true)
		}
	}
	d.add(job(1), job(2))
	cfg := testConfig(10 * time.Second)
	cfg.HeartbeatInterval = 1500 * time.Millisecond
	cfg.PollMax = time.Hour
	ran := make(chan int64, 3)
	e := startLeasing(t, d, cfg, map[string]Handler{"k": func(_ context.Context, r *driver.JobRow) error {
		ran <- r.ID
		return nil
	}})
	eng.Store(e)
	recv(t, "job 1", ran)
	recv(t, "job 2", ran)
	waitFor(t, "the idle block given back", gaveBack.Load)
	d.add(job(3))
	e.Wake("q") // an enqueue (or a notification)
	select {
	case <-ran:
	case <-time.After(4 * time.Second):
		t.Fatalf("job 3 never started (claimed under Blocked with no block: %v; held %+v; fetcher blocked %v)",
			unblocked.Load(), fetcherOf(e, "q").blk.state(), fetcherOf(e, "q").blocked())
	}
}

// As above without removing the limit: a job enqueued once the idle block
// was given back starts at once, not at the next renewal.
func TestBlockClaimAfterBlockGivenBackStartsAtOnce(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	var gaveBack atomic.Bool
	d.onLease = func(want map[string]int) {
		if w, ok := want["q"]; ok && w == 0 {
			gaveBack.Store(true)
		}
	}
	d.add(job(1), job(2))
	cfg := testConfig(10 * time.Second)
	cfg.HeartbeatInterval = 1500 * time.Millisecond
	cfg.PollMax = time.Hour
	ran := make(chan int64, 3)
	e := startLeasing(t, d, cfg, map[string]Handler{"k": func(_ context.Context, r *driver.JobRow) error {
		ran <- r.ID
		return nil
	}})
	recv(t, "job 1", ran)
	recv(t, "job 2", ran)
	waitFor(t, "the idle block given back", gaveBack.Load)
	d.add(job(3))
	woke := time.Now()
	e.Wake("q")
	recv(t, "job 3", ran)
	if took := time.Since(woke); took > 200*time.Millisecond {
		t.Fatalf("job 3, enqueued with every slot free, started %v after its wake-up", took)
	}
}

// A job claimed ahead under a block, waiting for a permit longer than its
// timeout and a lease: its timeout runs from its start, so its lease is
// renewed while it waits, and it runs when the permit comes.
func TestBlockPermitWaitKeepsTheJob(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 1}}}}
	j2 := job(2)
	j2.TimeoutMS = 50
	d.add(job(1))
	cfg := testConfig(time.Second)
	ran := make(chan int64, 2)
	e := startLeasing(t, d, cfg, map[string]Handler{"k": func(_ context.Context, r *driver.JobRow) error {
		ran <- r.ID
		if r.ID == 1 {
			time.Sleep(2500 * time.Millisecond)
		}
		return nil
	}})
	if id := recv(t, "job 1", ran); id != 1 {
		t.Fatalf("job %d first", id)
	}
	d.add(j2)
	e.Wake("q")
	select {
	case id := <-ran:
		if id != 2 {
			t.Fatalf("job %d", id)
		}
	case <-time.After(5 * time.Second):
		var renewedAt []time.Duration
		start := d.callsOf("claim")[0].at
		for _, c := range d.callsOf("heartbeat") {
			for _, l := range c.leases {
				if l.ID == 2 {
					renewedAt = append(renewedAt, c.at.Sub(start))
				}
			}
		}
		t.Fatalf("job 2, claimed ahead and waiting for the permit job 1 held, never ran: released %d, lease deadlines %d; its lease renewed at %v only",
			d.released.Load(), e.Metrics().LeaseDeadlines.Load(), renewedAt)
	}
}

// slotFake leases a queue's concurrency slots as the PostgreSQL driver
// does: keep the owner's slots up to want (below the limit first, then
// above a lowered one), give back the rest, take free ones below the
// limit (none while another holds one at or above it), Usable =
// min(Held, MaxRunning less the slots others hold).
type slotFake struct {
	*fakeDriver
	smu   sync.Mutex
	owner map[int]string // slot number -> owner
	calls atomic.Int64
}

func (d *slotFake) LeaseSlots(_ context.Context, owner string, want map[string]int, _ time.Duration) (map[string]driver.SlotBlock, error) {
	d.calls.Add(1)
	d.fakeDriver.mu.Lock()
	limits := d.limits
	d.fakeDriver.mu.Unlock()
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.owner == nil {
		d.owner = map[int]string{}
	}
	out := map[string]driver.SlotBlock{}
	for q, w := range want {
		mr := limits[q].MaxRunning
		if mr == 0 {
			w = 0
		}
		var mine []int
		for n, o := range d.owner {
			if o == owner {
				mine = append(mine, n)
			}
		}
		slices.Sort(mine)
		held := 0
		for _, above := range []bool{false, true} {
			for _, n := range mine {
				if (n >= mr) != above {
					continue
				}
				if held < w {
					held++
				} else {
					delete(d.owner, n)
				}
			}
		}
		blocked := false
		for n, o := range d.owner {
			if n >= mr && o != owner {
				blocked = true
			}
		}
		for n := 0; n < mr && held < min(w, mr) && !blocked; n++ {
			if _, ok := d.owner[n]; !ok {
				d.owner[n] = owner
				held++
			}
		}
		others := 0
		for _, o := range d.owner {
			if o != owner {
				others++
			}
		}
		out[q] = driver.SlotBlock{Held: held, Usable: max(0, min(held, mr-others)), MaxRunning: mr}
	}
	return out, nil
}

func (d *slotFake) snapshot() map[int]string {
	d.smu.Lock()
	defer d.smu.Unlock()
	return maps.Clone(d.owner)
}

// MaxRunning 4 shared by two processes of 2 workers, each holding 2 slots
// with jobs claimed ahead; lowered to 2: while the limit is exceeded
// each keeps only the slots of its running handlers, so that once they
// end one of them leases the limit and the queue goes on.
func TestBlockLoweredLimitSharedByTwoProcesses(t *testing.T) {
	d := &slotFake{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 4}}}}
	const jobs = 3000
	for i := range jobs {
		d.add(job(int64(i + 1)))
	}
	var done atomic.Int64
	var c concurrency
	cfg := testConfig(2 * time.Second)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	cfg.Queues = map[string]int{"q": 2}
	h := map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		c.enter()
		defer c.leave()
		time.Sleep(time.Millisecond)
		done.Add(1)
		return nil
	}}
	var es []*Engine
	for range 2 {
		e := New(d, cfg, h)
		es = append(es, e)
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
	}
	waitFor(t, "both processes to hold slots", func() bool {
		owners := map[string]int{}
		for _, o := range d.snapshot() {
			owners[o]++
		}
		return len(owners) == 2 && done.Load() > 100
	})
	d.fakeDriver.mu.Lock()
	d.limits = map[string]driver.QueueLimits{"q": {MaxRunning: 2}}
	d.fakeDriver.mu.Unlock()
	time.Sleep(1500 * time.Millisecond) // the caches see it, the blocks are leased again
	before := done.Load()
	time.Sleep(2 * time.Second)
	if after := done.Load(); after == before && after < jobs {
		for _, e := range es {
			f := e.fetchers["q"]
			f.blk.mu.Lock()
			t.Logf("%s: attempts held %d, executing %d, waiting for a permit %d, held %d, usable %d", e.id, f.running.Load(), f.blk.executing, len(f.blk.waiters), f.blk.held, f.blk.usable)
			f.blk.mu.Unlock()
		}
		t.Fatalf("no job ran in 2s after MaxRunning was lowered from 4 to 2 (%d of %d done, %d running): slots %v, %d LeaseSlots calls",
			after, jobs, c.now.Load(), d.snapshot(), d.calls.Load())
	}
}

// fetcherOf is e's fetcher of queue, read under e.mu.
func fetcherOf(e *Engine, queue string) *fetcher {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fetchers[queue]
}

// A lease that leaves the block no slot to use turns away the attempts
// waiting for a permit: they are given back to the queue rather than
// wait for a lease that their own claims may keep from coming (on
// SQLite, the jobs a process holding no block claimed count against the
// limit while they wait).
func TestBlockWaitersGivenBackWithoutSlots(t *testing.T) {
	d := &leasingDriver{fakeDriver: &fakeDriver{limits: map[string]driver.QueueLimits{"q": {MaxRunning: 2}}}}
	for i := range 6 {
		d.add(job(int64(i + 1)))
	}
	gate := make(chan struct{})
	var started atomic.Int64
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 8}
	cfg.HeartbeatInterval = 30 * time.Millisecond
	startLeasing(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		started.Add(1)
		<-gate
		return nil
	}})
	defer close(gate)
	waitFor(t, "two handlers under the block of 2", func() bool { return started.Load() == 2 })
	time.Sleep(50 * time.Millisecond) // jobs claimed ahead wait for a permit
	d.setCap("q", 0)
	waitFor(t, "the waiting attempts given back", func() bool { return d.released.Load() >= 2 })
	if n := started.Load(); n != 2 {
		t.Fatalf("%d handlers started with no slot to use", n)
	}
}
