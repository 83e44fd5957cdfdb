package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Blocks of a queue's concurrency slots (driver.SlotLeaser). A started
// engine whose driver leases slots works a queue with a MaxRunning under
// a block: the fetcher leases some of the queue's slots for the process
// in one call (LeaseSlots), claims without taking a slot, and lets at
// most as many of its handlers run at once as the block may use
// (permits handed from one finished handler to the next waiting one, in
// the order they asked). So a slot passes from one job to the next
// without a write, and the outcomes free nothing.
//
// Soundness rests on three rules:
//   - a claim's jobs are started only if the claim came back before the
//     block's lease could expire by this process's clock, less the lease
//     margin (covers): a block the database let go (its lease expired
//     while the process was paused or cut off, and no job of the process
//     ran then) is one whose slots another process may hold now, and the
//     jobs of a claim made after that are released unstarted;
//   - the database gives an expired block back only once no job of its
//     queue runs under a claim of the process (driver.SlotLeaser), so a
//     job the process holds, whose own lease is still valid, keeps the
//     block's slots with the process;
//   - LeaseSlots calls are serialized (blockMu), a block is shrunk here
//     before the database gives slots back, and it is never asked
//     smaller than the handlers running (those without a permit
//     included: jobs claimed one at a time while the process held no
//     block, which on SQLite count through the block once it holds one).
//
// A queue with a MaxRunning whose process holds no block and has no
// backlog claims as before blocks (ClaimLimited, a slot per attempt): an
// idle queue costs no lease. A claim that comes back full, or an enqueue
// that wakes the fetcher, makes it lease a block, and its claims then
// take no slot. The renewal loop renews every block with the leases,
// sized to what the queue used since the last renewal: a block shrinks
// when the queue's backlog is gone, and grows at once (one LeaseSlots
// from the fetcher) when claims come back full and the process has
// workers left.

// blockRetryMax bounds the wait between two attempts to grow a block that
// found no free slot (every slot held by other processes): the wait
// starts at PollMin and doubles, and a handler of the queue ending in
// this process cuts it short.
const blockRetryMax = 500 * time.Millisecond

// slotBlock is a fetcher's block of its queue's concurrency slots, and
// the permits of its handlers under it. Its fields are guarded by mu but
// for others and waiting.
type slotBlock struct {
	mu sync.Mutex
	// held is how many slots the process holds, usable how many of its
	// handlers may run at once under them, maxRun the queue's MaxRunning,
	// as the last LeaseSlots said (all 0 before the first).
	held, usable, maxRun int
	// unlimited says that the last LeaseSlots found no MaxRunning: every
	// attempt waiting for a permit gets one.
	unlimited bool
	// leasedAt is when the last LeaseSlots that answered was sent: the
	// block's lease may expire a lease's length later in the database,
	// by this process's clock.
	leasedAt time.Time
	// executing counts the handlers running under permits; waiters are
	// the attempts waiting for one, first asked first.
	executing int
	waiters   []*permitWait
	// others counts the fetcher's attempts claimed without a permit
	// (with a slot of their own, while no block was held) whose handler
	// has not ended: permits leave room for them. waiting counts the
	// attempts asking for a permit (in waiters, or about to be), read
	// without mu when such an attempt ends.
	others, waiting atomic.Int64
	// busy says that the queue had a backlog for this process since the
	// last renewal (a claim came back full): the renewal keeps the block
	// at what the workers can run. peak is the most attempts the fetcher
	// held at once since then: without a backlog, the renewal sizes the
	// block to it. claiming is the limit of the claim under way.
	busy           bool
	peak, claiming int
	// nextGrow is the earliest time a fetcher that found no free slot
	// tries again; retry the wait before the one after.
	nextGrow time.Time
	retry    time.Duration
}

// blockState is a read of a slotBlock.
type blockState struct {
	held, usable, maxRun int
	leasedAt, nextGrow   time.Time
}

func (b *slotBlock) state() blockState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return blockState{held: b.held, usable: b.usable, maxRun: b.maxRun, leasedAt: b.leasedAt, nextGrow: b.nextGrow}
}

// permitWait is an attempt waiting for a permit: ch is closed when it is
// granted one (granted set) or turned away (the block is gone).
type permitWait struct {
	ch      chan struct{}
	granted bool
}

// roomLocked reports whether a permit is free.
func (b *slotBlock) roomLocked() bool {
	return b.unlimited || b.executing+int(b.others.Load()) < b.usable
}

// acquire waits for a permit to start an attempt under the block, in
// the order the attempts asked: false when ctx (the attempt's) ended,
// stop closed, or the block was given up with attempts still waiting
// (abortLocked) first.
func (b *slotBlock) acquire(ctx context.Context, stop <-chan struct{}) bool {
	b.mu.Lock()
	// Counted before the room is looked at: an attempt without a permit
	// ending meanwhile (otherEnded) then sees it waiting.
	b.waiting.Add(1)
	if len(b.waiters) == 0 && b.roomLocked() {
		b.waiting.Add(-1)
		b.executing++
		b.mu.Unlock()
		return true
	}
	w := &permitWait{ch: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ch:
		return w.granted
	case <-ctx.Done():
	case <-stop:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.waiters {
		if x == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			b.waiting.Add(-1)
			return false
		}
	}
	if w.granted {
		// Handed a permit as it gave up: pass it on.
		b.executing--
		b.handOffLocked()
	}
	return false
}

// release ends a permit: its handler returned.
func (b *slotBlock) release() {
	b.mu.Lock()
	b.executing--
	b.handOffLocked()
	b.mu.Unlock()
}

// otherHeld and otherEnded count the fetcher's attempts claimed without a
// permit until their handlers end; one that ends hands its room to a
// waiter.
func (b *slotBlock) otherHeld(n int) { b.others.Add(int64(n)) }

func (b *slotBlock) otherEnded() {
	b.others.Add(-1)
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		b.handOffLocked()
		b.mu.Unlock()
	}
}

// handOffLocked gives the free permits to the first waiters.
func (b *slotBlock) handOffLocked() {
	for len(b.waiters) > 0 && b.roomLocked() {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.waiting.Add(-1)
		b.executing++
		w.granted = true
		close(w.ch)
	}
}

// leave is called when the fetcher stops working the queue under a
// block: without a limit any more, every waiting attempt gets a permit;
// else (the block is gone) each is turned away, to be given back.
func (b *slotBlock) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.unlimited {
		b.handOffLocked()
		return
	}
	b.turnAwayLocked()
}

// turnAwayLocked ends the wait of every attempt waiting for a permit
// without one: each is given back unstarted (see fetcher.work).
func (b *slotBlock) turnAwayLocked() {
	for _, w := range b.waiters {
		b.waiting.Add(-1)
		close(w.ch)
	}
	b.waiters = nil
}

// noteHeld records that the fetcher holds n attempts (dispatched, not
// done), and whether its last claim came back full (a backlog).
func (b *slotBlock) noteHeld(n int, full bool) {
	b.mu.Lock()
	b.peak = max(b.peak, n)
	b.busy = b.busy || full
	b.mu.Unlock()
}

// beginClaim sizes a claim under the block as it is now and records its
// limit as the claim under way (claiming), in one hold of mu: 0 when the
// block has no room (none usable, its lease may have expired, every
// slot and every job ahead taken). A renewal sizing the block (target)
// thus either shrinks it before this reads it, or counts this claim's
// jobs: never a block shrunk to nothing under jobs being claimed for it,
// which would be turned away unstarted.
func (f *fetcher) beginClaim(more bool) int {
	if !f.covers(time.Now()) {
		return 0
	}
	b := &f.blk
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.usable == 0 {
		return 0
	}
	free := b.usable + f.blockAhead(b.usable, more) - int(f.running.Load())
	if free <= 0 {
		return 0
	}
	b.claiming = min(free, f.e.cfg.ClaimBatch)
	return b.claiming
}

// setClaiming records the limit of the claim under way (0: none).
func (b *slotBlock) setClaiming(n int) {
	b.mu.Lock()
	b.claiming = n
	b.mu.Unlock()
}

// canLease reports whether f may work its queue under a block: a started
// engine's fetcher on a driver that leases slots.
func (f *fetcher) canLease() bool { return f.e.leaser != nil && f.comp != nil }

// blocked reports whether f works its queue under a block: it holds one,
// or the queue has a MaxRunning (as the fresh limits cache says).
func (f *fetcher) blocked() bool {
	if !f.canLease() {
		return false
	}
	f.blk.mu.Lock()
	held := f.blk.held
	f.blk.mu.Unlock()
	return held > 0 || f.cachedMaxRunning() > 0
}

// cachedMaxRunning is the queue's MaxRunning as the limits cache says, 0
// when it has none or the cache is stale.
func (f *fetcher) cachedMaxRunning() int {
	c := f.e.limits.Load()
	if c == nil || time.Since(c.at) > limitsStale {
		return 0
	}
	return c.values[f.queue].MaxRunning
}

// desired is the most slots f's block can use: the queue's MaxRunning (as
// the fresher of the last lease and the limits cache says), at most f's
// workers.
func (f *fetcher) desired(st blockState) int {
	mr := st.maxRun
	if c := f.e.limits.Load(); c != nil && (mr == 0 || c.newest().After(st.leasedAt)) {
		mr = c.values[f.queue].MaxRunning
	}
	return min(f.max, mr)
}

// blockAhead is how many jobs f claims beyond its block's usable slots,
// to wait for a permit while the handlers run: as many as it may use, so
// that a freed permit goes to a job already claimed; or, when it may use
// as many as f has workers (the limit does not bind in this process),
// what an unlimited queue claims ahead.
func (f *fetcher) blockAhead(usable int, more bool) int {
	if usable >= f.max {
		if more && f.ahead() {
			return f.unlimitedAhead(min(f.max, f.e.cfg.ClaimBatch))
		}
		return 0
	}
	return usable
}

// covers reports whether a claim that came back at now may start its
// jobs under the block: its lease, renewed or not since, cannot have
// expired by then, with the lease margin to spare.
func (f *fetcher) covers(now time.Time) bool {
	f.blk.mu.Lock()
	defer f.blk.mu.Unlock()
	return !f.blk.leasedAt.IsZero() && now.Before(f.blk.leasedAt.Add(f.e.cfg.Lease-f.e.leaseMargin()))
}

// target is the block f asks for: grow (f's fetcher wants more now) or a
// backlog since the last renewal asks for what f's workers can run; else
// the most attempts f held at once since then, or holds now; at most what
// its workers can run; stopping, none. Never fewer than the handlers
// running (with or without a permit). A renewal starts the next period.
// A block asked smaller than it is shrinks here, before the call: no
// permit beyond the smaller block is handed out while the call gives the
// rest back, so that no handler runs under a slot the database may
// already have given to another process.
func (f *fetcher) target(grow, stopping bool) int {
	d := f.desired(f.blk.state())
	running := int(f.running.Load())
	b := &f.blk
	b.mu.Lock()
	defer b.mu.Unlock()
	t := min(max(b.peak, running+b.claiming), d)
	if grow || b.busy {
		t = d
	}
	if stopping || b.usable < b.held {
		// Stopping; or the slots in use exceed a lowered limit: keep only
		// the slots of the handlers running, so that those above the
		// limit go back as they end (asking for the waiting ones too,
		// every process would keep its slots and none could start). The
		// attempts waiting for a permit are turned away, to be given back
		// to the queue: they would wait for slots this block gives up
		// (and on SQLite, claimed by a process that holds no block, would
		// count against the limit without running).
		t = 0
		b.turnAwayLocked()
	}
	t = max(t, b.executing+int(b.others.Load()))
	if !grow {
		b.busy, b.peak = false, running
	}
	b.held, b.usable = min(b.held, t), min(b.usable, t)
	return t
}

// leaseBlocks asks the driver, in one LeaseSlots, for a block: grow's
// queue's alone when grow is set (its fetcher wants more now), else the
// block of every fetcher that works under one or holds one, renewed (see
// target; stopping gives them all back). It applies the answer: slots
// held and usable, limit, lease.
func (e *Engine) leaseBlocks(ctx context.Context, grow *fetcher, stopping bool) error {
	e.blockMu.Lock()
	defer e.blockMu.Unlock()
	fs := map[string]*fetcher{}
	if grow != nil {
		fs[grow.queue] = grow
	} else {
		e.mu.Lock()
		for q, f := range e.fetchers {
			fs[q] = f
		}
		e.mu.Unlock()
	}
	want := map[string]int{}
	ask := false // a call that changes or renews something
	for q, f := range fs {
		if !f.blocked() {
			continue
		}
		ask = ask || f == grow || f.blk.state().held > 0
		want[q] = f.target(f == grow, stopping)
		ask = ask || want[q] > 0
	}
	if !ask {
		return nil
	}
	sent := time.Now()
	lctx, cancel := context.WithTimeout(ctx, max(e.cfg.HeartbeatInterval, e.cfg.Lease-e.leaseMargin()))
	got, err := e.leaser.LeaseSlots(lctx, e.id, want, e.cfg.Lease)
	cancel()
	if err != nil {
		return err
	}
	for q, blk := range got {
		f := fs[q]
		if f == nil {
			continue
		}
		b := &f.blk
		b.mu.Lock()
		b.held, b.usable, b.maxRun = blk.Held, min(blk.Usable, blk.Held), blk.MaxRunning
		b.unlimited = blk.MaxRunning == 0
		if b.usable == 0 && !b.unlimited {
			// No slot to use: the attempts waiting for a permit go back
			// to the queue rather than wait for a lease that their own
			// claims may keep from coming (on SQLite, jobs claimed by a
			// process that holds no block count against the limit).
			b.turnAwayLocked()
		}
		if sent.After(b.leasedAt) {
			b.leasedAt = sent
		}
		if f == grow {
			if blk.Usable < want[q] {
				// Every slot it could take is held elsewhere: try again
				// after a while, longer each time.
				b.retry = min(max(2*b.retry, e.cfg.PollMin, time.Millisecond), blockRetryMax)
				b.nextGrow = time.Now().Add(b.retry)
			} else {
				b.retry, b.nextGrow = 0, time.Time{}
			}
		}
		b.handOffLocked()
		b.mu.Unlock()
	}
	return nil
}

// blockLoop renews every block every HeartbeatInterval, on a goroutine of
// its own so that a slow LeaseSlots never delays the jobs' lease
// renewals; a failure is logged, and the blocks' leases run out unless
// a later one gets through (claims are then released unstarted, see
// covers).
func (e *Engine) blockLoop(ctx context.Context) {
	if e.leaser == nil {
		return
	}
	for sleep(ctx, e.cfg.HeartbeatInterval) {
		if err := e.leaseBlocks(ctx, nil, false); err != nil && ctx.Err() == nil {
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: renewing the blocks of limited queues' slots failed (retrying)", "error", err)
		}
	}
}

// releaseRows gives claimed rows back unstarted, fenced; a failure is
// logged as failing to release the jobs why says (they are rescued when
// their leases expire).
func (f *fetcher) releaseRows(rows []*driver.JobRow, why string) {
	leases := make([]driver.Lease, len(rows))
	for i, r := range rows {
		leases[i] = driver.Lease{ID: r.ID, Fence: r.Fence}
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.e.cfg.Lease)
	defer cancel()
	n, err := f.e.drv.Release(ctx, leases)
	f.e.metrics.Released.Add(n)
	if err != nil {
		f.e.metrics.DBErrors.Add(1)
		f.e.warn("conveyor: releasing "+why+" failed; they will be rescued", "queue", f.queue, "jobs", len(rows), "error", err)
	}
}

// blockWaiter is runBlocked's one timer and its waits.
type blockWaiter struct {
	f     *fetcher
	timer *time.Timer
}

// wait waits d at most for one of chs (nil ones never fire) and returns
// its index, -1 after d; stop is set when the fetcher stops.
func (w *blockWaiter) wait(d time.Duration, chs ...<-chan struct{}) (which int, stop bool) {
	if !w.timer.Stop() {
		select {
		case <-w.timer.C:
		default:
		}
	}
	w.timer.Reset(max(d, 0))
	var c [3]<-chan struct{}
	copy(c[:], chs)
	select {
	case <-c[0]:
		return 0, false
	case <-c[1]:
		return 1, false
	case <-c[2]:
		return 2, false
	case <-w.timer.C:
		return -1, false
	case <-w.f.stopCh:
		return -1, true
	}
}

// runBlocked is the fetch loop of a queue with a MaxRunning worked under
// a block (see run): it returns true once the queue no longer has one
// and the process holds no slot of it, false when the fetcher stops.
//
// Holding no block and knowing of no backlog, it claims as a queue
// without blocks does (ClaimLimited, a slot per attempt, after the poll
// interval or a wake-up); a claim that found jobs, or an enqueue, makes
// it lease a block. Under a block it claims for its usable slots and as
// many jobs again to wait for a permit (blockAhead), grows the block
// when claims come back full and its workers could run more, and waits,
// when the block is full, for a handler to end, the limits to change or
// the next try to grow.
func (f *fetcher) runBlocked(ctx context.Context) bool {
	e := f.e
	f.idle.Store(false) // no claim at insert in a limited queue
	listening := e.drv.Capabilities().Listen
	interval := e.cfg.PollMin
	if listening {
		interval = e.cfg.ListenPoll
	}
	w := &blockWaiter{f: f, timer: time.NewTimer(0)}
	defer w.timer.Stop()
	more := true // claim at once
	errs := 0
	// hold, when positive, is the wait the queue's other limits (rate,
	// keys) set at the last claim.
	var hold time.Duration
	var gathering time.Time
	backoff := func() bool {
		errs++
		e.metrics.DBErrors.Add(1)
		_, stop := w.wait(errBackoff(errs))
		return !stop
	}
	for {
		select {
		case <-f.stopCh:
			return false
		default:
		}
		if !f.blocked() {
			f.blk.leave()
			return true
		}
		st := f.blk.state()
		now := time.Now()
		valid := f.covers(now)
		desired := f.desired(st)
		if c := e.limits.Load(); c != nil && c.newest().After(st.leasedAt) && c.values[f.queue].MaxRunning != st.maxRun && st.held > 0 {
			// The limit changed since the block was leased (as a read
			// of the limits made since says): lease it again under the
			// new one, so that a lowered limit takes effect now, not at
			// the next renewal.
			valid = false
		}
		running := int(f.running.Load())
		if st.held == 0 && hold > 0 {
			// Held back by a rate or a key with no block left (given
			// back while the queue waited): wait as the hold says, then
			// lease one again.
			if _, stop := w.wait(hold, f.limitCh); stop {
				return false
			}
			hold, more = 0, true
			continue
		}
		if st.held == 0 && !more {
			// No block, no backlog known: claim as a queue without
			// blocks would, when woken or polling.
			which, stop := w.wait(interval, f.wakeCh)
			if stop {
				return false
			}
			limit := min(f.max, e.cfg.ClaimBatch) - running
			if limit <= 0 || which == 0 {
				more = true // an enqueue: lease a block for it
				continue
			}
			rows, h, err := f.claim(ctx, limit)
			if err != nil {
				if ctx.Err() != nil || !backoff() {
					return false
				}
				continue
			}
			errs = 0
			e.metrics.ClaimRounds.Add(1)
			f.dispatch(rows, time.Now(), false)
			// Jobs found, or held back by the limit: lease a block
			// for them (a rate holds its blocked claims as well).
			more, hold = len(rows) > 0 || h > 0, 0
			if !listening {
				interval = f.nextPoll(interval, len(rows) > 0)
			}
			continue
		}
		slots := 0
		if valid {
			slots = st.usable + f.blockAhead(st.usable, more)
		}
		free := slots - running
		if !valid && (st.held > 0 || more) || more && free <= 0 && st.usable < desired && !now.Before(st.nextGrow) {
			// Lease (or renew) the block before claiming under it.
			if err := e.leaseBlocks(ctx, f, false); err != nil {
				if ctx.Err() != nil {
					return false
				}
				e.warn("conveyor: leasing the queue's slots failed (retrying)", "queue", f.queue, "error", err)
				if !backoff() {
					return false
				}
				continue
			}
			errs = 0
			continue
		}
		if free <= 0 {
			// Every slot in use and every job ahead claimed, or none to
			// be had: wait for a handler to end (it may also free a
			// slot to grow into), the limits to change, an enqueue (a
			// backlog to grow the block for), or the next try to grow.
			d := interval
			if more && st.usable < desired {
				d = max(time.Until(st.nextGrow), time.Millisecond)
			}
			which, stop := w.wait(d, f.freedCh, f.limitCh, f.wakeCh)
			if stop {
				return false
			}
			if which == 2 {
				more = true
			}
			continue
		}
		if hold > 0 {
			// Held back by the queue's rate or its limits per key.
			if _, stop := w.wait(hold, f.limitCh); stop {
				return false
			}
		} else if !more {
			which, stop := w.wait(interval, f.wakeCh)
			if stop {
				return false
			}
			if which == 0 {
				more = true
			}
		}
		if want := max(1, st.usable/2); more && running > 0 && free < want && hold == 0 {
			// A backlog and only a few jobs to claim: wait briefly for
			// more handlers to end, so that one claim takes a batch.
			if gathering.IsZero() {
				gathering = time.Now()
			}
			if left := gatherFor - time.Since(gathering); left > 0 {
				if _, stop := w.wait(left, f.freedCh); stop {
					return false
				}
				continue
			}
		}
		gathering = time.Time{}
		// The block as it is now: a renewal may have shrunk it while
		// this loop waited.
		limit := f.beginClaim(more)
		if limit == 0 {
			continue
		}
		sent := time.Now()
		rows, h, err := f.claimBlocked(ctx, limit)
		if err != nil {
			f.blk.setClaiming(0)
			if ctx.Err() != nil {
				return false
			}
			e.warn("conveyor: claim failed (retrying)", "queue", f.queue, "error", err)
			if !backoff() {
				return false
			}
			more, hold = true, 0
			continue
		}
		errs = 0
		e.metrics.ClaimRounds.Add(1)
		if !f.covers(time.Now()) {
			// The claim came back too late: the block's slots may be
			// another process's by now. Its jobs go back unstarted, and
			// the block is renewed before the next claim.
			f.blk.setClaiming(0)
			if len(rows) > 0 {
				f.releaseRows(rows, "jobs claimed after the block of their queue's slots may have expired")
			}
			more = true
			continue
		}
		if len(rows) > 0 && rows[0].LeaseFrom.After(sent) {
			sent = rows[0].LeaseFrom
		}
		f.dispatch(rows, sent, true)
		f.blk.setClaiming(0)
		more = len(rows) == limit
		if more {
			f.blk.noteHeld(int(f.running.Load()), true)
		}
		hold = h
		if hold > 0 {
			more = false
			continue
		}
		if !listening {
			interval = f.nextPoll(interval, len(rows) > 0)
		}
	}
}

// claimBlocked claims up to limit jobs of the queue under the block: by
// Claim when the queue's only limit is its MaxRunning (as the fresh
// limits cache says: a rate or a key limit added since applies within a
// second), else by ClaimLimited, Blocked, held by the other limits only.
func (f *fetcher) claimBlocked(ctx context.Context, limit int) ([]*driver.JobRow, time.Duration, error) {
	e := f.e
	p := driver.ClaimParams{Queue: f.queue, Limit: limit, Lease: e.cfg.Lease, Worker: e.id, Blocked: true}
	defer e.lockClaims(f.queue)()
	if c := e.limits.Load(); c != nil && time.Since(c.at) <= limitsStale {
		if l := c.values[f.queue]; l.Rate == 0 && !l.HasKeyLimits() {
			rows, err := e.drv.Claim(ctx, p)
			return rows, 0, err
		}
	}
	res, err := e.drv.ClaimLimited(ctx, p)
	if err != nil || !res.Held {
		return res.Rows, 0, err
	}
	return res.Rows, heldWait(res, e.cfg.PollMin, e.keyLimited(f.queue)), nil
}
