package engine

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Queue limits (driver.QueueLimits) are kept in the database and held by
// the claim statement itself (driver.Driver.ClaimLimited). The engine
// only needs to know which queues are limited, to claim those through
// ClaimLimited and the others through the cheaper Claim: it keeps that in
// a cache refreshed by one read per process every limitsRefresh, while
// the engine is started or remote claims are served, and updated at once
// when this process sets limits (LimitsChanged). When the cache is
// missing or stale (not refreshed yet, or the database did not answer),
// every queue is claimed through ClaimLimited, which is always right.

const (
	// limitsRefresh is how often the limits cache is read again: a
	// queue limited by another process is claimed within its limits
	// after at most about this long.
	limitsRefresh = time.Second
	// limitsStale is the age past which the cache is not trusted.
	limitsStale = 3 * limitsRefresh / 2
	// limitsReadTimeout bounds one read of the limits.
	limitsReadTimeout = 5 * time.Second
)

// limitCache is one read of the limited queues, and when it was read,
// with the changes this process made since (LimitsChanged).
type limitCache struct {
	limited map[string]bool
	// keyed holds the queues with limits per key (as of the read): a
	// job enqueued there may start although the queue's claims are held
	// back (its key may have room), so an enqueue wakes held claims.
	keyed map[string]bool
	// values holds the limits of the limited queues (as of the read),
	// to tell a change of a limited queue's values made by another
	// process: its held fetcher may wait for a window the change
	// shortened or widened (see limitsLoop).
	values map[string]driver.QueueLimits
	// at is when the read began: the age of what the cache says of
	// every queue but those this process changed since.
	at time.Time
	// changed is when this process last changed a queue's limits since
	// the read (zero if it did not): a read that began earlier may miss
	// the change.
	changed time.Time
}

// newest is when what the cache says was last known true: its read, or
// this process's change since.
func (c *limitCache) newest() time.Time {
	if c.changed.After(c.at) {
		return c.changed
	}
	return c.at
}

// limited reports whether queue must be claimed through ClaimLimited:
// it has limits, or the cache cannot tell.
func (e *Engine) limited(queue string) bool {
	c := e.limits.Load()
	if c == nil || time.Since(c.at) > limitsStale {
		return true
	}
	return c.limited[queue]
}

// keyLimited reports whether queue has limits per key, as far as the
// cache tells (a queue whose key limits this process set since the last
// read is not known yet: its held claims wait for a slot or PollMin).
func (e *Engine) keyLimited(queue string) bool {
	c := e.limits.Load()
	return c != nil && c.keyed[queue]
}

// keysOnly reports whether queue's only limits are per key (KeyMaxRunning,
// Ordered), as far as a fresh cache tells.
func (e *Engine) keysOnly(queue string) bool {
	c := e.limits.Load()
	if c == nil || time.Since(c.at) > limitsStale {
		return false
	}
	l, ok := c.values[queue]
	return ok && l.MaxRunning == 0 && l.Rate == 0 && l.KeyRate == 0 && !l.Fair && (l.KeyMaxRunning > 0 || l.Ordered)
}

// anyLimited reports whether some queue may be limited (the completer's
// cheap test before it looks at a batch's queues).
func (e *Engine) anyLimited() bool {
	c := e.limits.Load()
	return c == nil || len(c.limited) > 0 || time.Since(c.at) > limitsStale
}

// awaitLimits waits, up to limitsReadTimeout, for the first read of the
// limits (or its failure), so that a starting fetcher's first claims take
// the right statement; false if stop closed first.
func (e *Engine) awaitLimits(stop <-chan struct{}) bool {
	t := time.NewTimer(limitsReadTimeout)
	defer t.Stop()
	select {
	case <-e.limitsRead:
	case <-t.C:
	case <-stop:
		return false
	}
	return true
}

// setLimited replaces the cache with a fresh read.
func (e *Engine) setLimited(m map[string]driver.QueueLimits, at time.Time) {
	limited := make(map[string]bool, len(m))
	keyed := map[string]bool{}
	values := make(map[string]driver.QueueLimits, len(m))
	for q, l := range m {
		if !l.IsZero() {
			limited[q] = true
			values[q] = l
		}
		if l.HasKeyLimits() {
			keyed[q] = true
		}
	}
	e.limitsMu.Lock()
	defer e.limitsMu.Unlock()
	if old := e.limits.Load(); old != nil && (old.at.After(at) || old.changed.After(at)) {
		return // a later change (LimitsChanged) is already in
	}
	e.limits.Store(&limitCache{limited: limited, keyed: keyed, values: values, at: at})
}

// LimitsChanged tells the engine that this process set queue's limits to
// l, so that its claims follow them at once rather than at the next
// refresh of the limits (a MaxRunning set here, say, is worked under a
// block from the next claim). It wakes the queue's fetcher and the remote
// claims waiting on it, and returns once every claim of the queue that
// began under the cache as it was before has returned (see lockClaims),
// or with ctx's error when ctx ends first: a job enqueued after it
// returned nil is claimed within the new limits by this process.
func (e *Engine) LimitsChanged(ctx context.Context, queue string, l driver.QueueLimits) error {
	limited := !l.IsZero()
	e.limitsMu.Lock()
	if old := e.limits.Load(); old != nil && (old.limited[queue] != limited || old.values[queue] != l) {
		m := make(map[string]bool, len(old.limited)+1)
		for q := range old.limited {
			m[q] = true
		}
		values := make(map[string]driver.QueueLimits, len(old.values)+1)
		for q, v := range old.values {
			values[q] = v
		}
		keyed := make(map[string]bool, len(old.keyed)+1)
		for q := range old.keyed {
			keyed[q] = true
		}
		delete(m, queue)
		delete(values, queue)
		delete(keyed, queue)
		if limited {
			m[queue], values[queue] = true, l
		}
		if l.HasKeyLimits() {
			keyed[queue] = true
		}
		// The read's age is kept (the rest of the cache is no fresher
		// for this change); the change is stamped now, so that a read
		// that began before it does not undo it (setLimited).
		e.limits.Store(&limitCache{limited: m, keyed: keyed, values: values, at: old.at, changed: time.Now()})
	}
	e.limitsMu.Unlock()
	e.mu.Lock()
	if f := e.fetchers[queue]; f != nil {
		// Its MaxRunning may be another now: claim at once rather than
		// wait for an attempt of its own to end (see room).
		f.maxRun.Store(0)
	}
	e.mu.Unlock()
	e.wake(queue)
	e.slotFreed(queue)
	return e.awaitClaims(ctx, queue)
}

// gates holds the claims gate of each queue a claim or a change of
// limits is using: an entry lives while one holds a reference to it, as
// the waiters' entries do, so that claims of queue names made up by HTTP
// workers leave nothing behind. A gate dropped once unused is as good as
// a new one: nothing holds it or waits on it.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

// gate is one queue's claims gate and how many hold a reference to it.
type gate struct {
	sync.RWMutex
	refs int
}

// get returns queue's gate with a reference taken for the caller.
func (gs *gates) get(queue string) *gate {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g := gs.m[queue]
	if g == nil {
		if gs.m == nil {
			gs.m = map[string]*gate{}
		}
		g = &gate{}
		gs.m[queue] = g
	}
	g.refs++
	return g
}

// put gives back a reference get took; the last one drops the gate.
func (gs *gates) put(queue string, g *gate) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g.refs--; g.refs == 0 && gs.m[queue] == g {
		delete(gs.m, queue)
	}
}

// has reports whether queue has a gate (tests).
func (gs *gates) has(queue string) bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return gs.m[queue] != nil
}

// lockClaims read-locks queue's gate for one claim of the queue, from
// its choice of statement by the limits cache to the end of the
// statements, and returns the unlock: a claim that began before
// LimitsChanged stored this process's change has returned before
// LimitsChanged does. Without the gate, a claim slowed on a busy machine
// between its choice and its statements could take jobs enqueued after
// SetQueueLimits returned, without the slots or the rate the new limits
// ask for: a plain claim chosen by the cache as it was, or a limited one
// whose driver read no limits in the database and went on as a plain
// claim in a later statement.
func (e *Engine) lockClaims(queue string) (unlock func()) {
	g := e.claimGates.get(queue)
	g.RLock()
	return func() {
		g.RUnlock()
		e.claimGates.put(queue, g)
	}
}

// tryLockClaims is lockClaims for a claim that would rather not claim
// than wait: it read-locks queue's gate unless a change of limits holds
// it or waits for it, and then returns ok false.
func (e *Engine) tryLockClaims(queue string) (unlock func(), ok bool) {
	g := e.claimGates.get(queue)
	if !g.TryRLock() {
		e.claimGates.put(queue, g)
		return nil, false
	}
	return func() {
		g.RUnlock()
		e.claimGates.put(queue, g)
	}, true
}

// awaitClaims waits until no claim of queue holds its gate (the claims
// that began before the limits cache changed have returned), or ctx ends.
func (e *Engine) awaitClaims(ctx context.Context, queue string) error {
	g := e.claimGates.get(queue)
	if g.TryLock() {
		g.Unlock()
		e.claimGates.put(queue, g)
		return nil
	}
	done := make(chan struct{})
	go func() {
		g.Lock()
		g.Unlock()
		e.claimGates.put(queue, g)
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slotFreed wakes the fetcher of a limited queue and the remote claims
// held back by its limits: an attempt of the queue ended (a slot may be
// free), or its limits changed.
func (e *Engine) slotFreed(queue string) {
	e.waiters.notify(heldKey(queue))
	e.mu.Lock()
	f := e.fetchers[queue]
	e.mu.Unlock()
	if f != nil {
		signal(f.limitCh)
	}
}

// heldKey is the waiters' key of the remote claims of queue held back by
// its limits: they wait for a slot to free, not for an enqueue.
func heldKey(queue string) string { return "\x00held:" + queue }

// limitsRefresher runs the loop that refreshes the limits cache while
// something needs it: a started engine (Start to Stop) or remote claims
// (until remoteListenIdle after the last one).
type limitsRefresher struct {
	mu     sync.Mutex
	refs   int
	closed bool
	cancel context.CancelFunc // nil when not running
	idle   *time.Timer
	wg     sync.WaitGroup
}

// limitsAcquire starts the refresh loop if it is not running and keeps
// it running until the matching limitsRelease.
func (e *Engine) limitsAcquire() {
	l := &e.limitsLoopState
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.refs++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(1)
	go func() { defer l.wg.Done(); e.limitsLoop(ctx) }()
}

// limitsRelease ends a limitsAcquire; the loop stops linger after the
// last one ended (at once without linger).
func (e *Engine) limitsRelease(linger time.Duration) {
	l := &e.limitsLoopState
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs > 0 {
		l.refs--
	}
	if l.refs > 0 || l.cancel == nil {
		return
	}
	if linger <= 0 {
		l.cancel()
		l.cancel = nil
		return
	}
	if l.idle != nil {
		return
	}
	var idle *time.Timer
	idle = time.AfterFunc(linger, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.idle != idle {
			return
		}
		l.idle = nil
		if l.refs == 0 && l.cancel != nil {
			l.cancel()
			l.cancel = nil
		}
	})
	l.idle = idle
}

// limitsClose stops the refresh loop for good and waits for it.
func (e *Engine) limitsClose() {
	l := &e.limitsLoopState
	l.mu.Lock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// limitsLoop reads the limited queues at once and every limitsRefresh.
// A queue that becomes limited, or no longer is, wakes its fetcher (it
// may be waiting for a slot, or claim through the other statement now);
// so does a limited queue whose limits changed since the last read: a
// fetcher held back by a rate sleeps until the window it last read has
// room, up to a whole period, and a raised or removed rate, or a shorter
// period, set by another process must not wait that long (on a backend
// without notifications nothing else tells it).
func (e *Engine) limitsLoop(ctx context.Context) {
	for {
		at := time.Now()
		rctx, cancel := context.WithTimeout(ctx, limitsReadTimeout)
		m, err := e.drv.QueueLimits(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: reading queue limits failed (claiming every queue within its limits meanwhile)", "error", err)
		} else {
			old := e.limits.Load()
			e.setLimited(m, at)
			if old != nil {
				now := e.limits.Load()
				for q, l := range m {
					if !l.IsZero() && (!old.limited[q] || old.values != nil && old.values[q] != l) {
						e.slotFreed(q)
					}
				}
				for q := range old.limited {
					if !now.limited[q] {
						e.slotFreed(q)
						e.wake(q)
					}
				}
			}
		}
		// Only now, the cache stored: a fetcher awaiting the first read
		// (awaitLimits) must find it there, or it would take its first
		// claims through ClaimLimited for want of a cache.
		e.limitsOnce.Do(func() { close(e.limitsRead) })
		if !sleep(ctx, limitsRefresh) {
			return
		}
	}
}
