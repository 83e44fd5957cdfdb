package engine

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Blocks of a queue's concurrency slots (driver.SlotLeaser). A started
// engine whose driver leases slots works a queue with a MaxRunning under
// a block: the fetcher leases some of the queue's slots for the process
// in one call (LeaseSlots), claims without taking a slot, and lets at
// most as many of its handlers run at once as the block holds slots
// (permits handed from one finished handler to the next waiting one, in
// the order they were claimed). So a slot passes from one job to the
// next without a write, and the outcomes free nothing.
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
//   - LeaseSlots calls are serialized (blockMu), and the block asked for
//     is never below the attempts the fetcher holds.
//
// The heartbeat loop renews every block with the jobs' leases, sized to
// what the queue used since the last renewal: a block shrinks when the
// queue has no backlog, and grows at once (one LeaseSlots from the
// fetcher) when claims come back full and the process has workers left.

// blockRetryMax bounds the wait between two attempts to grow a block that
// found no free slot (every slot held by other processes): the wait
// starts at PollMin and doubles.
const blockRetryMax = 500 * time.Millisecond

// slotBlock is a fetcher's block of its queue's concurrency slots, and
// the permits of its handlers under it. Its fields are guarded by mu.
type slotBlock struct {
	mu sync.Mutex
	// held is how many slots the process holds, as the last LeaseSlots
	// said; maxRun the queue's MaxRunning it read (0 before the first).
	held, maxRun int
	// validUntil is when the block's lease may expire in the database,
	// by this process's clock: a lease's length after the last
	// LeaseSlots that answered was sent (leasedAt).
	validUntil, leasedAt time.Time
	// executing counts the handlers running under the block; waiters
	// are the attempts waiting for a permit, first claimed first.
	executing int
	waiters   []chan struct{}
	// busy says that the queue had a backlog for this process since the
	// last renewal (a claim came back full): the renewal keeps the block
	// at what the workers can run. peak is the most attempts the fetcher
	// held at once since then: without a backlog, the renewal sizes the
	// block to it.
	busy bool
	peak int
	// claiming is the limit of the fetcher's claim under way (0 between
	// claims): jobs that may be dispatched any moment.
	claiming int
	// nextGrow is the earliest time a fetcher that found no free slot
	// tries again; retry the wait before the one after.
	nextGrow time.Time
	retry    time.Duration
}

// blockState is a read of a slotBlock.
type blockState struct {
	held, maxRun                   int
	validUntil, leasedAt, nextGrow time.Time
}

func (b *slotBlock) state() blockState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return blockState{held: b.held, maxRun: b.maxRun, validUntil: b.validUntil, leasedAt: b.leasedAt, nextGrow: b.nextGrow}
}

// acquire waits for a permit to start an attempt under the block, in
// the order the attempts asked: false when ctx (the attempt's) ended or
// stop closed first.
func (b *slotBlock) acquire(ctx context.Context, stop <-chan struct{}) bool {
	b.mu.Lock()
	if b.executing < b.held && len(b.waiters) == 0 {
		b.executing++
		b.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	b.waiters = append(b.waiters, ch)
	b.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	case <-stop:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, w := range b.waiters {
		if w == ch {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return false
		}
	}
	// Handed a permit as it gave up: pass it on.
	b.executing--
	b.handOffLocked()
	return false
}

// release ends a permit: its handler returned.
func (b *slotBlock) release() {
	b.mu.Lock()
	b.executing--
	b.handOffLocked()
	b.mu.Unlock()
}

// handOffLocked gives the free permits to the first waiters.
func (b *slotBlock) handOffLocked() {
	for b.executing < b.held && len(b.waiters) > 0 {
		ch := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.executing++
		close(ch)
	}
}

// setClaiming records the limit of the claim under way (0: none).
func (b *slotBlock) setClaiming(n int) {
	b.mu.Lock()
	b.claiming = n
	b.mu.Unlock()
}

// noteHeld records that the fetcher holds n attempts (dispatched, not
// done), and whether its last claim came back full (a backlog).
func (b *slotBlock) noteHeld(n int, full bool) {
	b.mu.Lock()
	b.peak = max(b.peak, n)
	b.busy = b.busy || full
	b.mu.Unlock()
}

// blocked reports whether f claims under a block: the engine is started
// on a driver that leases slots, and the queue has a MaxRunning as the
// limits cache says (fresh), or f still holds slots of it.
func (f *fetcher) blocked() bool {
	if f.e.leaser == nil || f.comp == nil {
		return false
	}
	f.blk.mu.Lock()
	held := f.blk.held
	f.blk.mu.Unlock()
	if held > 0 {
		return true
	}
	c := f.e.limits.Load()
	return c != nil && time.Since(c.at) <= limitsStale && c.values[f.queue].MaxRunning > 0
}

// desired is the most slots f's block can use: the queue's MaxRunning
// (as the last lease read it, else the cache), at most f's workers.
func (f *fetcher) desired(st blockState) int {
	mr := st.maxRun
	if mr == 0 {
		if c := f.e.limits.Load(); c != nil {
			mr = c.values[f.queue].MaxRunning
		}
	}
	return min(f.max, mr)
}

// blockAhead is how many jobs f claims beyond its block's slots, to wait
// for a permit while the handlers run: as many as the block holds, so
// that a freed permit goes to a job already claimed; or, when the block
// holds as many slots as f has workers (the limit does not bind in this
// process), what an unlimited queue claims ahead.
func (f *fetcher) blockAhead(held int, more bool) int {
	if held >= f.max {
		if more && f.ahead() {
			return f.unlimitedAhead(min(f.max, f.e.cfg.ClaimBatch))
		}
		return 0
	}
	return held
}

// covers reports whether a claim that came back at now may start its
// jobs under the block: its lease, renewed or not since, cannot have
// expired by then, with the lease margin to spare.
func (f *fetcher) covers(now time.Time) bool {
	f.blk.mu.Lock()
	defer f.blk.mu.Unlock()
	return now.Before(f.blk.validUntil.Add(-f.e.leaseMargin()))
}

// target is the block f asks for: grow (f's fetcher wants more now) or a
// backlog since the last renewal asks for what f's workers can run; else
// the most attempts f held at once since then, or holds now; stopping,
// none. A renewal starts the next period. A block asked smaller than it
// is shrinks here, before the call: no permit beyond the smaller block is
// handed out while the call gives the rest back, so that no handler runs
// under a slot the database may already have given to another process.
// It is never asked smaller than the handlers running under it.
func (f *fetcher) target(grow, stopping bool) int {
	st := f.blk.state()
	d := f.desired(st)
	running := int(f.running.Load())
	b := &f.blk
	b.mu.Lock()
	defer b.mu.Unlock()
	t := max(b.peak, running+b.claiming, b.executing)
	if grow || b.busy {
		t = max(t, d)
	}
	if stopping {
		t = b.executing // none: every attempt ended or was released
	}
	if !grow {
		b.busy, b.peak = false, running
	}
	if t < b.held {
		b.held = t
	}
	return t
}

// leaseBlocks asks the driver, in one LeaseSlots, for the block of every
// fetcher that works under one or holds one: grow's (nil for none) to
// grow, the others renewed (see target); stopping gives them all back.
// It applies the answer: slots held, limit, lease.
func (e *Engine) leaseBlocks(ctx context.Context, grow *fetcher, stopping bool) error {
	e.blockMu.Lock()
	defer e.blockMu.Unlock()
	e.mu.Lock()
	fs := make(map[string]*fetcher, len(e.fetchers))
	for q, f := range e.fetchers {
		fs[q] = f
	}
	e.mu.Unlock()
	want := map[string]int{}
	ask := grow != nil // a call that changes or renews something
	for q, f := range fs {
		if !f.blocked() {
			continue
		}
		f.blk.mu.Lock()
		ask = ask || f.blk.held > 0
		f.blk.mu.Unlock()
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
	valid := sent.Add(e.cfg.Lease)
	for q, blk := range got {
		f := fs[q]
		if f == nil {
			continue
		}
		b := &f.blk
		b.mu.Lock()
		b.held, b.maxRun = blk.Held, blk.MaxRunning
		if valid.After(b.validUntil) {
			b.validUntil, b.leasedAt = valid, sent
		}
		if f == grow {
			if blk.Held < want[q] {
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

// renewBlocks renews every block with the heartbeat; a failure is
// logged, and the blocks' leases run out unless a later one gets
// through (claims are then released unstarted, see covers).
func (e *Engine) renewBlocks(ctx context.Context) {
	if e.leaser == nil {
		return
	}
	if err := e.leaseBlocks(ctx, nil, false); err != nil && ctx.Err() == nil {
		e.metrics.DBErrors.Add(1)
		e.warn("conveyor: renewing the blocks of limited queues' slots failed (retrying)", "error", err)
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

// runBlocked is the fetch loop of a queue worked under a block (see
// run): it returns true once the queue no longer is (its MaxRunning was
// removed and the block given back), false when the fetcher stops. It
// claims for the block's slots and as many jobs again to wait for a
// permit (blockAhead), grows the block when claims come back full and
// the workers could run more, and waits, when the block is full, for a
// handler to end, the limits to change or the next try to grow.
func (f *fetcher) runBlocked(ctx context.Context) bool {
	e := f.e
	listening := e.drv.Capabilities().Listen
	interval := e.cfg.PollMin
	if listening {
		interval = e.cfg.ListenPoll
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	wait := func(d time.Duration, chans ...<-chan struct{}) (which int, stop bool) {
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(d, 0))
		var a, b, c <-chan struct{}
		switch len(chans) {
		case 3:
			c = chans[2]
			fallthrough
		case 2:
			b = chans[1]
			fallthrough
		case 1:
			a = chans[0]
		}
		select {
		case <-a:
			return 0, false
		case <-b:
			return 1, false
		case <-c:
			return 2, false
		case <-timer.C:
			return -1, false
		case <-f.stopCh:
			return -1, true
		}
	}
	more := true // claim at once
	errs := 0
	// hold, when positive, is the wait the queue's other limits (rate,
	// keys) set at the last claim.
	var hold time.Duration
	var gathering time.Time
	for {
		select {
		case <-f.stopCh:
			return false
		default:
		}
		if !f.blocked() {
			return true
		}
		st := f.blk.state()
		now := time.Now()
		valid := now.Before(st.validUntil.Add(-e.leaseMargin()))
		desired := f.desired(st)
		if c := e.limits.Load(); c != nil && c.at.After(st.leasedAt) && c.values[f.queue].MaxRunning != st.maxRun && st.maxRun > 0 {
			// The limit changed since the block was leased (as a read
			// of the limits made since says): lease it again under the
			// new one, so that a lowered limit takes effect now, not at
			// the next renewal.
			valid = false
		}
		running := int(f.running.Load())
		slots := 0
		if valid {
			slots = st.held + f.blockAhead(st.held, more)
		}
		free := slots - running
		if !valid || more && free <= 0 && st.held < desired && !now.Before(st.nextGrow) {
			// Lease (or renew) the block before claiming under it.
			if err := e.leaseBlocks(ctx, f, false); err != nil {
				if ctx.Err() != nil {
					return false
				}
				errs++
				e.metrics.DBErrors.Add(1)
				e.warn("conveyor: leasing the queue's slots failed (retrying)", "queue", f.queue, "error", err)
				if _, stop := wait(errBackoff(errs)); stop {
					return false
				}
				continue
			}
			errs = 0
			if st2 := f.blk.state(); st2.held == 0 && st2.maxRun == 0 {
				// No concurrency limit any more (the cache says so
				// within a second): claim the queue as any other.
				more = true
				if _, stop := wait(e.cfg.PollMin, f.limitCh); stop {
					return false
				}
			}
			continue
		}
		if free <= 0 {
			// Every slot in use and every job ahead claimed: wait for a
			// handler to end, the limits to change, an enqueue (a
			// backlog to grow the block for), or the next try to grow.
			d := interval
			if more && st.held < desired {
				d = max(time.Until(st.nextGrow), time.Millisecond)
			}
			which, stop := wait(d, f.freedCh, f.limitCh, f.wakeCh)
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
			if _, stop := wait(hold, f.limitCh); stop {
				return false
			}
		} else if !more {
			which, stop := wait(interval, f.wakeCh)
			if stop {
				return false
			}
			if which == 0 {
				more = true
			}
		}
		if want := max(1, st.held/2); more && running > 0 && free < want && hold == 0 {
			// A backlog and only a few jobs to claim: wait briefly for
			// more handlers to end, so that one claim takes a batch.
			if gathering.IsZero() {
				gathering = time.Now()
			}
			if left := gatherFor - time.Since(gathering); left > 0 {
				if _, stop := wait(left, f.freedCh); stop {
					return false
				}
				continue
			}
		}
		gathering = time.Time{}
		if free = slots - int(f.running.Load()); free <= 0 {
			continue
		}
		limit := min(free, e.cfg.ClaimBatch)
		sent := time.Now()
		f.blk.setClaiming(limit)
		rows, h, err := f.claimBlocked(ctx, limit)
		if err != nil {
			f.blk.setClaiming(0)
			if ctx.Err() != nil {
				return false
			}
			errs++
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: claim failed (retrying)", "queue", f.queue, "error", err)
			if _, stop := wait(errBackoff(errs)); stop {
				return false
			}
			more, hold = true, 0
			continue
		}
		errs = 0
		e.metrics.ClaimRounds.Add(1)
		if !f.covers(time.Now()) {
			f.blk.setClaiming(0)
			// The claim came back too late: the block's slots may be
			// another process's by now. Its jobs go back unstarted, and
			// the block is renewed before the next claim.
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
