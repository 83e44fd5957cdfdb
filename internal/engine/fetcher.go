package engine

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// gatherFor bounds how long a fetcher with a backlog waits for more free
// slots before claiming less than a full batch.
const gatherFor = time.Millisecond

// aheadMaxRun is the longest a queue's handlers may take, on a running
// average, for its fetcher to claim ahead of free workers while the queue
// has a backlog, and about the longest the jobs claimed ahead wait for a
// worker: the fetcher claims ahead as many jobs as its workers run in
// aheadMaxRun at that average (at least one worker's round, at most
// ClaimBatch; see aheadN), so a claimed job never waits long for a worker
// (and another process never waits long for a job this one holds), and
// the claim's round trip overlaps the work instead of idling the workers.
const aheadMaxRun = 5 * time.Millisecond

// fetcher is the only claimer of one queue in this process. It claims
// batches sized to the free worker slots, claims again at once while the
// queue has work, and otherwise waits for a wake-up (local enqueue,
// notification) or its poll timer.
type fetcher struct {
	e       *Engine
	comp    *completer // a started engine's, from Start (nil for WorkOne's)
	queue   string
	max     int
	workCtx context.Context

	wakeCh  chan struct{} // cap 1: "the queue may have work"
	freedCh chan struct{} // cap 1: "a worker slot was freed"
	// limitCh (cap 1) says "a slot of the queue's limits may be free":
	// an attempt of the queue ended, or its limits changed. A fetcher
	// held back by the limits waits on it, not on wakeCh: an enqueue
	// frees no slot.
	limitCh chan struct{}
	stopCh  chan struct{}
	stopped sync.Once
	// idle is set from a claim that took fewer jobs than it asked for
	// (not held back by limits, but for those per key when the insert
	// checks them: Engine.claimsKeyedAtInsert) to the next that took as
	// many: while the
	// queue has no backlog, an insert of this process may claim the jobs
	// of the queue it writes for this fetcher's free workers
	// (Engine.reserveWorkers). claiming is the limit of the claim in
	// flight (0 between claims), which those workers are not.
	idle     atomic.Bool
	claiming atomic.Int64
	// resMu orders the fetcher's choice of a claim's limit (claiming)
	// with reserveWorkers' reservations: each sees the other's.
	resMu sync.Mutex
	// dispMu orders the delivery of jobs claimed at insert (deliver)
	// with closeWorkers, which sets workersClosed under it.
	dispMu        sync.RWMutex
	workersClosed bool
	// jobs holds claimed attempts for the workers: cap 2*max + ClaimBatch,
	// so that it never blocks (running <= max + at most ClaimBatch claimed
	// ahead, plus up to max claimed at insert while a claim was under
	// way).
	jobs chan *running

	// maxRun is the queue's MaxRunning as the last limited claim read it
	// (0: none known; see room). Set by the fetch loop, and cleared by
	// LimitsChanged: this process changed the queue's limits.
	maxRun atomic.Int64

	// running counts the attempts dispatched and not yet done: running
	// handlers, and those waiting for a worker.
	running atomic.Int64
	// runAvg is a running average of the handlers' run time in
	// nanoseconds (-1 until one ran): claims run a batch ahead only while
	// it is under aheadMaxRun.
	runAvg   atomic.Int64
	workerWG sync.WaitGroup
	closeW   sync.Once

	mu     sync.Mutex
	leases map[int64]*running

	// blk is the block of the queue's concurrency slots the process
	// works the queue under, when it has a MaxRunning (blocks.go).
	blk slotBlock
}

// running is one attempt in progress. Its fields other than row, ctx and
// cancel are guarded by its fetcher's mu.
type running struct {
	row    *driver.JobRow
	ctx    context.Context
	cancel context.CancelCauseFunc
	// abandonAt, when set, is the job's timeout plus one lease: a handler
	// still running then ignores its context, and the attempt is abandoned
	// (no more heartbeats, no release) so its lease expires, the rescue
	// counts the attempt, and the job is discarded after MaxAttempts
	// instead of running forever.
	abandonAt time.Time
	// validUntil is when the lease may expire in the database, by this
	// process's clock: Lease after the claim or the last renewal that
	// succeeded was sent (the database computes the expiry from its own
	// clock when the statement runs, which is no earlier).
	validUntil time.Time
	// finishing is set once the handler returned and its outcome is queued
	// in the completer: the lease is still renewed until the outcome is
	// written, so that a slow write cannot let a finished job be rescued
	// and run again.
	finishing bool
	// finishedAt is when the handler returned (set with finishing).
	finishedAt time.Time
	// cutOff is set when the deadline loop cancelled the handler because
	// the lease could not be renewed in time.
	cutOff bool
	// result is what the handler gave SetResult: the handler's context
	// carries a pointer to it (one context value per attempt, no
	// allocation of its own).
	result resultSlot
	// permit is set when the attempt was claimed under the fetcher's
	// block of the queue's slots: its handler starts only with a permit
	// of the block (blocks.go). other is set for an attempt claimed
	// otherwise by a fetcher that may work under a block: the permits
	// leave room for it until its handler ends (or it ends unstarted).
	permit, other bool
}

// abandoned reports whether the attempt's handler outlived its timeout by
// a whole lease.
func (it *running) abandoned(now time.Time) bool {
	return !it.abandonAt.IsZero() && now.After(it.abandonAt)
}

func newFetcher(e *Engine, queue string, max int, workCtx context.Context) *fetcher {
	f := &fetcher{
		e: e, queue: queue, max: max, workCtx: workCtx,
		wakeCh:  make(chan struct{}, 1),
		freedCh: make(chan struct{}, 1),
		limitCh: make(chan struct{}, 1),
		stopCh:  make(chan struct{}),
		jobs:    make(chan *running, 2*max+e.cfg.ClaimBatch),
		leases:  make(map[int64]*running, max),
	}
	f.runAvg.Store(-1)
	return f
}

// noteRun folds a handler's run time into runAvg (an average over about
// the last eight; concurrent updates may drop one, which only blurs it).
func (f *fetcher) noteRun(d time.Duration) {
	old := f.runAvg.Load()
	if old < 0 {
		f.runAvg.Store(int64(d))
		return
	}
	f.runAvg.Store(old + (int64(d)-old)/8)
}

// aheadN is how many jobs the fetcher may claim ahead of its free
// workers (see aheadMaxRun): as many as its workers run in aheadMaxRun at
// the handlers' average run time, at least want (one batch of its
// workers), at most ClaimBatch. Very short handlers (a drain of no-op
// jobs) thus get claims of up to ClaimBatch whatever MaxWorkers is, which
// spreads each claim's and each outcome statement's fixed cost over more
// jobs. A queue with limits claims want ahead: its claims hold slots,
// windows or turns that other processes wait for; but not a queue
// limited only per key (keysOnly), whose claims hold only the slots of
// the keys they took, each for a job that starts within about
// aheadMaxRun, as a job claimed ahead in an unlimited queue does. Every
// queue of a backend whose writes all wait for one lock
// (driver.Capabilities.OneWriter: SQLite) claims want ahead too, since a
// larger claim would hold every other writer, heartbeats included, back
// for longer.
func (f *fetcher) aheadN(want int) int {
	if f.e.limited(f.queue) && !f.e.keysOnly(f.queue) {
		return want
	}
	return f.unlimitedAhead(want)
}

// unlimitedAhead is aheadN for a queue whose claims hold nothing that
// other processes wait for: on a backend with one writer, want.
func (f *fetcher) unlimitedAhead(want int) int {
	if f.e.oneWriter {
		return want
	}
	n := f.e.cfg.ClaimBatch
	if avg := f.runAvg.Load(); avg > 0 {
		if k := int64(f.e.aheadRun) * int64(f.max) / avg; k < int64(n) {
			n = int(k)
		}
	}
	return max(n, want)
}

// ahead reports whether the fetcher may claim ahead of its free workers:
// its handlers are short (see aheadMaxRun).
func (f *fetcher) ahead() bool {
	avg := f.runAvg.Load()
	return avg >= 0 && avg < int64(f.e.aheadRun)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (f *fetcher) nudge()        { signal(f.wakeCh) }
func (f *fetcher) stopFetching() { f.stopped.Do(func() { close(f.stopCh) }) }

func (f *fetcher) run(ctx context.Context) {
	e := f.e
	listening := e.drv.Capabilities().Listen
	interval := e.cfg.PollMin
	if listening {
		interval = e.cfg.ListenPoll
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	more := true // claim at once on start
	errs := 0
	want := min(f.max, e.cfg.ClaimBatch)
	var gathering time.Time // when a backlogged fetcher began waiting for slots
	// held, when positive, is how long to wait before claiming again
	// because the queue's limits held jobs back at the last claim: until
	// the rate's window has room, or PollMin for a concurrency slot
	// (freed by another process; this process's own frees wake it at
	// once through limitCh).
	var held time.Duration
	if !e.awaitLimits(f.stopCh) {
		return
	}
	for {
		select {
		case <-f.stopCh:
			return
		default:
		}
		if f.blocked() {
			if !f.runBlocked(ctx) {
				return
			}
			// The queue no longer has a MaxRunning: claim it as any
			// other, at once.
			more, held, errs = true, 0, 0
			continue
		}
		running := int(f.running.Load())
		slots := f.max
		if more && f.ahead() && (held == 0 || !e.limited(f.queue)) {
			// A backlog of short jobs: one batch may wait for workers
			// while this claim travels (see aheadMaxRun). Not for a
			// limited queue whose limits held the last claim back: jobs
			// waiting for a worker would hold its slots while other
			// processes' workers idle. A limit that does not bind (above
			// the workers of every process) holds nothing back, and its
			// queue claims ahead as any other.
			slots += f.aheadN(want)
		}
		free := slots - running
		if free <= 0 {
			select {
			case <-f.freedCh:
			case <-f.stopCh:
				return
			}
			continue
		}
		capped := false
		if room, ok := f.room(); ok {
			if room <= 0 {
				// This process holds every concurrency slot of the
				// queue's limit: no claim could take one before one of
				// its attempts ends (limitCh). After PollMin it claims
				// anyway: the limit may have been raised elsewhere.
				if !timer.Stop() {
					select {
					case <-timer.C:
					default:
					}
				}
				timer.Reset(max(e.cfg.PollMin, time.Millisecond))
				select {
				case <-f.limitCh:
				case <-timer.C:
					f.maxRun.Store(0)
				case <-f.stopCh:
					return
				}
				// This was the wait of a claim held back by the limits:
				// claim at once.
				held, more = 0, true
				continue
			}
			if room < free {
				free, capped = room, true
			}
		}
		if more && running > 0 && free < want && !capped {
			// The queue has a backlog and only a few slots are free: wait
			// briefly for more to free up, so that one claim takes a full
			// batch instead of many claims taking a few rows each.
			if gathering.IsZero() {
				gathering = time.Now()
			}
			if left := gatherFor - time.Since(gathering); left > 0 {
				select {
				case <-f.freedCh:
				case <-time.After(left):
				case <-f.stopCh:
					return
				}
				continue
			}
		}
		gathering = time.Time{}
		if held > 0 {
			// Held back by the queue's limits: jobs are waiting, so this
			// is not an idle queue (no backoff towards PollMax), and an
			// enqueue frees no slot (wakeCh stays set for later).
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(held)
			select {
			case <-f.limitCh:
			case <-timer.C:
			case <-f.stopCh:
				return
			}
		} else if !more {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(interval)
			select {
			case <-f.wakeCh:
			case <-timer.C:
			case <-f.stopCh:
				return
			}
		}
		// Workers reserved by inserts while this loop waited are taken:
		// count them before choosing the claim's limit.
		f.resMu.Lock()
		if avail := slots - int(f.running.Load()); avail < free {
			free = avail
		}
		if free <= 0 {
			f.resMu.Unlock()
			if !more {
				signal(f.wakeCh) // the wake-up this wait took still stands
			}
			continue
		}
		limit := min(free, e.cfg.ClaimBatch)
		f.claiming.Store(int64(limit))
		f.resMu.Unlock()
		sent := time.Now()
		rows, hold, err := f.claim(ctx, limit)
		if err != nil {
			f.claiming.Store(0)
			f.idle.Store(false)
			if ctx.Err() != nil {
				return
			}
			errs++
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: claim failed (retrying)", "queue", f.queue, "error", err)
			select {
			case <-time.After(errBackoff(errs)):
			case <-f.stopCh:
				return
			}
			more, held = true, 0
			continue
		}
		errs = 0
		e.metrics.ClaimRounds.Add(1)
		if len(rows) > 0 && rows[0].LeaseFrom.After(sent) {
			// The driver knows the claim waited (for a lock) before the
			// database started its leases.
			sent = rows[0].LeaseFrom
		}
		f.dispatch(rows, sent, false)
		f.claiming.Store(0)
		more = len(rows) == limit
		held = hold
		if held > 0 && more && e.keysOnly(f.queue) {
			// Some keys had no room, but the claim got every job it
			// asked for: in a queue limited only per key the other keys
			// have a backlog, and no slot of the queue is held back by
			// claiming on (at once, and ahead: aheadN).
			held = 0
		}
		// Without a backlog, inserts of this process may claim the jobs
		// they write for the free workers (insertclaim.go). In a queue
		// limited only per key whose keys the insert checks, a claim cut
		// short by its keys left only jobs of keys without room: a new
		// job of a key with room is next in line.
		f.idle.Store(!more && (held == 0 || e.claimsKeyedAtInsert(f.queue)))
		if held > 0 {
			// Fewer rows than asked because of the limits, not because
			// the queue ran dry.
			more = false
			continue
		}
		if !listening {
			interval = f.nextPoll(interval, len(rows) > 0)
		}
	}
}

// nextPoll is the adaptive poll of a backend without notifications: fast
// while work flows (a claim got jobs), backing off when idle.
func (f *fetcher) nextPoll(interval time.Duration, got bool) time.Duration {
	if got {
		return f.e.cfg.PollMin
	}
	return min(interval*2, f.e.cfg.PollMax)
}

// room returns how many more slots of the queue's concurrency limit
// this process could take at most, as far as it knows: the queue's
// MaxRunning as its last claim read it, less the attempts this process
// holds (running, waiting for a worker, or finishing: an attempt keeps
// its slot until its outcome is written). Claiming more than that would
// come back short, and count as held. ok is false when no concurrency
// limit is known. Attempts that took no slot (claimed before the queue
// was limited) make it smaller than it is, for as long as they run.
func (f *fetcher) room() (n int, ok bool) {
	m := int(f.maxRun.Load())
	if m <= 0 || !f.e.limited(f.queue) {
		return 0, false
	}
	f.mu.Lock()
	held := len(f.leases)
	f.mu.Unlock()
	return m - held, true
}

// claim claims up to limit jobs of the queue: through ClaimLimited when
// the queue has limits (or the engine cannot tell), else through Claim.
// hold, when positive, is how long to wait before the next claim because
// the limits held jobs back: the result's RetryIn (the rate; at most
// PollMin in a queue limited per key, unless the queue's own window is
// full), else PollMin (a concurrency slot).
func (f *fetcher) claim(ctx context.Context, limit int) (rows []*driver.JobRow, hold time.Duration, err error) {
	e := f.e
	p := driver.ClaimParams{Queue: f.queue, Limit: limit, Lease: e.cfg.Lease, Worker: e.id}
	defer e.lockClaims(f.queue)()
	if !e.limited(f.queue) {
		f.maxRun.Store(0)
		rows, err = e.drv.Claim(ctx, p)
		return rows, 0, err
	}
	res, err := e.drv.ClaimLimited(ctx, p)
	if err == nil {
		f.maxRun.Store(int64(res.MaxRunning))
	}
	if err != nil || !res.Held {
		return res.Rows, 0, err
	}
	return res.Rows, heldWait(res, e.cfg.PollMin, e.keyLimited(f.queue)), nil
}

// heldWait is how long a claim held back by a queue's limits (res) waits
// before the next: until the rate's window has room (res.RetryIn), else
// pollMin; never less than a millisecond. In a queue limited per key
// (keyed), a window of one key (KeyRate) says nothing of the queue's
// other keys, whose slots may free and whose new jobs may come from
// other processes: the wait is then at most pollMin, as for a key's
// concurrency slot; but not when the queue's own window is full
// (res.RateFull), which holds every key until it has room.
func heldWait(res driver.ClaimResult, pollMin time.Duration, keyed bool) time.Duration {
	if retryIn := res.RetryIn; retryIn > 0 {
		if keyed && !res.RateFull {
			retryIn = min(retryIn, pollMin)
		}
		return max(retryIn, time.Millisecond)
	}
	return max(pollMin, time.Millisecond)
}

// dispatch hands claimed rows to the workers; sent is when the claim was
// sent, from which their leases run; permit, that they were claimed
// under the fetcher's block (their handlers start with a permit).
func (f *fetcher) dispatch(rows []*driver.JobRow, sent time.Time, permit bool) {
	if len(rows) == 0 {
		return
	}
	// Workers take the rows in this order, and a batch claimed ahead
	// waits for them: higher priorities first. Drivers return a claim's
	// rows in claim order within a priority, not always across
	// priorities (an UPDATE ... RETURNING returns them in the order it
	// wrote them).
	if !slices.IsSortedFunc(rows, claimOrder) {
		slices.SortStableFunc(rows, claimOrder)
	}
	n := f.running.Add(int64(len(rows)))
	if permit {
		f.blk.noteHeld(int(n), false)
	}
	f.e.jobWG.Add(len(rows))
	f.deliver(rows, sent, permit)
}

// deliver holds rows, counted in running and jobWG already, as attempts
// of this fetcher and hands them to the workers, in the order given.
func (f *fetcher) deliver(rows []*driver.JobRow, sent time.Time, permit bool) {
	f.e.metrics.Claimed.Add(int64(len(rows)))
	back := time.Now() // before any renewal can hold these leases
	valid := sent.Add(f.e.cfg.Lease)
	f.mu.Lock()
	items := make([]*running, len(rows))
	other := !permit && f.canLease()
	for i, r := range rows {
		it := f.hold(r, valid)
		it.permit, it.other = permit, other
		if permit {
			// Its timeout runs from its start, not from its wait for a
			// permit (blocks.go): abandonAt is set when it gets one.
			it.abandonAt = time.Time{}
		}
		items[i] = it
	}
	if other {
		f.blk.otherHeld(len(rows))
	}
	f.mu.Unlock()
	if back.Sub(sent) > f.e.cfg.HeartbeatInterval {
		// The claim took longer than a heartbeat interval to come back:
		// do not wait for the next interval to renew these leases.
		signal(f.e.hbWake)
		f.e.lateClaimed(rows, sent, back)
	}
	for _, it := range items {
		f.jobs <- it
	}
}

// claimOrder orders claimed rows by priority (lower first).
func claimOrder(a, b *driver.JobRow) int { return cmp.Compare(a.Priority, b.Priority) }

// hold records a claimed row as an attempt of this fetcher, its lease
// valid until valid, with its context. The caller holds f.mu.
func (f *fetcher) hold(r *driver.JobRow, valid time.Time) *running {
	ctx, cancel := context.WithCancelCause(f.workCtx)
	it := &running{row: r, ctx: ctx, cancel: cancel, validUntil: valid}
	if t := f.e.timeout(r); t > 0 {
		it.abandonAt = time.Now().Add(t + f.e.cfg.Lease)
	}
	// An entry of an earlier attempt of the same job (rescued, or
	// cancelled and retried by hand, and claimed here again before a
	// renewal found it gone) is stale: the new claim replaces it, and its
	// handler, if it still runs, is stopped as a lost lease's is. Left
	// out of leases uncancelled, no renewal would ever stop it.
	if old := f.leases[r.ID]; old != nil && old != it {
		if !old.finishing && !old.abandoned(time.Now()) {
			// (An abandoned attempt was let go on purpose.)
			f.e.metrics.LeasesLost.Add(1)
		}
		old.cancel(errLeaseLost)
	}
	f.leases[r.ID] = it
	return it
}

func (f *fetcher) startWorkers() {
	f.workerWG.Add(f.max)
	for range f.max {
		go f.worker()
	}
}

// closeWorkers lets idle workers exit; the fetch loop has already stopped.
func (f *fetcher) closeWorkers() {
	f.closeW.Do(func() {
		f.dispMu.Lock()
		f.workersClosed = true
		close(f.jobs)
		f.dispMu.Unlock()
	})
}

func (f *fetcher) worker() {
	defer f.workerWG.Done()
	e := f.e
	for it := range f.jobs {
		if e.stopping.Load() {
			// Stop began before a worker took this attempt (claimed
			// ahead, or by a claim already under way): it is not started,
			// and Stop releases it with the other unstarted ones.
			if it.other {
				f.blk.otherEnded()
			}
			f.running.Add(-1)
			signal(f.freedCh)
			e.jobWG.Done()
			continue
		}
		a := f.work(it)
		if it.other {
			f.blk.otherEnded()
		}
		if a.ran {
			f.noteRun(a.took)
		}
		if a.write && !f.comp.submit(pending{f: f, o: a.outcome}) {
			// The completer closed under us: Stop releases the job, or it
			// is rescued.
			f.unfinish(it)
		}
		f.running.Add(-1)
		signal(f.freedCh)
		e.jobWG.Done()
	}
}

// attempt is what became of one claimed attempt that work ran.
type attempt struct {
	// ran is set when the handler ran; otherwise the attempt was given
	// back unstarted (its lease was about to run out).
	ran bool
	// took is how long the handler ran.
	took time.Duration
	// err is the handler's error.
	err error
	// interrupted is set when the handler failed because its context was
	// cancelled by a shutdown or by the end of WorkOne's context: the
	// attempt keeps its lease for the caller to release, so that the
	// interruption does not count as a failure.
	interrupted bool
	// write is set when outcome must be written: the attempt still holds
	// its lease and is now finishing (its lease is renewed until the
	// outcome is written and settled).
	write   bool
	outcome driver.Outcome
}

// work runs one claimed attempt: the path every job takes, from a
// worker of a started engine or from WorkOne. An attempt whose lease is
// about to run out is given back unstarted; otherwise the handler runs
// (runJob: the timeout, panic recovery) and its result becomes the
// outcome to write, unless the attempt was interrupted or lost its lease
// meanwhile. The attempt's context is cancelled when work returns.
func (f *fetcher) work(it *running) attempt {
	e := f.e
	defer it.cancel(nil)
	if it.permit {
		if !f.blk.acquire(it.ctx, f.stopCh) {
			if !e.stopping.Load() {
				// Cut off or lost while it waited for a permit, or its
				// block is gone: give it back (a lost one is refused).
				f.giveBack(it)
			}
			// Else Stop releases it with the other unstarted ones.
			return attempt{}
		}
		if t := e.timeout(it.row); t > 0 {
			f.mu.Lock()
			it.abandonAt = time.Now().Add(t + e.cfg.Lease)
			f.mu.Unlock()
		}
	}
	if !f.startable(it) {
		if it.permit {
			f.blk.release()
		}
		f.giveBack(it)
		return attempt{}
	}
	began := time.Now()
	err, trace := e.runJob(context.WithValue(it.ctx, resultKey{}, &it.result), it.row)
	ran := time.Since(began)
	if it.permit {
		// The execution ended: its permit goes to the next attempt at
		// once, the outcome's write does not hold it.
		f.blk.release()
	}
	a := attempt{ran: true, took: ran, err: err}
	switch {
	case err != nil && interrupting(context.Cause(it.ctx)):
		// Interrupted by shutdown: keep the lease so that it is released
		// instead of counting a failure.
		a.interrupted = true
	case f.finish(it):
		a.write = true
		a.outcome = e.outcome(it.row, err, trace, it.result.get())
		switch {
		case a.outcome.State == driver.StateScheduled:
			e.metrics.Snoozed.Add(1)
		case err != nil:
			e.metrics.Failed.Add(1)
			e.logFailure(it.row, ran, a.outcome, err)
		}
	default:
		// The lease was lost, or released by Stop while the handler
		// ignored its context: the outcome is dropped (the database's
		// fence would refuse it), the job belongs to another attempt.
	}
	return a
}

// interrupting reports whether cause, a job context's cancellation cause,
// interrupts the attempt rather than failing it.
func interrupting(cause error) bool {
	return errors.Is(cause, errShutdown) || errors.Is(cause, errCallerGone)
}

// startable reports whether it may start: this fetcher still holds its
// lease and the lease is not about to expire. An attempt that waited for a
// worker while the process was paused or starved past its lease must not
// start: the job may already be running, or done, elsewhere.
func (f *fetcher) startable(it *running) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leases[it.row.ID] != it || it.cutOff {
		return false
	}
	return time.Now().Before(it.validUntil.Add(-f.e.leaseMargin()))
}

// giveBack releases an attempt that never started (its handler did not
// run, so the attempt is not counted), fenced: if the job was rescued
// meanwhile the release is refused and nothing changes.
func (f *fetcher) giveBack(it *running) {
	f.mu.Lock()
	held := f.leases[it.row.ID] == it
	// The deadline loop may have cut the attempt off while it waited for
	// a worker; it counted it then.
	counted := it.cutOff
	if held {
		delete(f.leases, it.row.ID)
	}
	f.mu.Unlock()
	if !held {
		return // lost, or released by Stop
	}
	if !counted {
		f.e.metrics.LeaseDeadlines.Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.e.cfg.Lease)
	defer cancel()
	n, err := f.e.drv.Release(ctx, []driver.Lease{{ID: it.row.ID, Fence: it.row.Fence}})
	f.e.metrics.Released.Add(n)
	if n > 0 && f.e.limited(f.queue) {
		f.e.slotFreed(f.queue)
	}
	if err != nil {
		f.e.metrics.DBErrors.Add(1)
		f.e.warn("conveyor: releasing a job whose lease ran out before it started failed; it will be rescued", "job_id", it.row.ID, "error", err)
	}
}

// finish marks it as finishing if this fetcher still holds its lease.
func (f *fetcher) finish(it *running) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leases[it.row.ID] != it {
		return false
	}
	it.finishing, it.finishedAt = true, time.Now()
	return true
}

// unfinish puts a finishing attempt back among the running ones (its
// outcome could not be queued), for Stop to release.
func (f *fetcher) unfinish(it *running) {
	f.mu.Lock()
	if f.leases[it.row.ID] == it {
		it.finishing = false
	}
	f.mu.Unlock()
}

// settle drops the lease of job id's attempt fence once its outcome was
// written (applied or refused) or given up on.
func (f *fetcher) settle(id, fence int64) {
	f.mu.Lock()
	f.settleLocked(id, fence)
	f.mu.Unlock()
}

// settleLocked is settle with f.mu held.
func (f *fetcher) settleLocked(id, fence int64) {
	if it := f.leases[id]; it != nil && it.row.Fence == fence && it.finishing {
		delete(f.leases, id)
	}
}

// snapshot lists the attempts this fetcher holds, for the heartbeat:
// running ones, and finished ones whose outcome has waited in the
// completer for more than half a heartbeat interval (an outcome is
// usually written within milliseconds; renewing it too would make most
// renewals touch rows being completed at the same moment), but not those
// abandoned. A finished attempt is left out only while its lease outlasts
// the next renewal by the lease margin: it was renewed while it ran, which
// with the default interval (a fifth of the lease) leaves it well over
// the interval and a half it may wait, but not with an interval near its
// largest, half the lease (nor after renewals that failed).
func (f *fetcher) snapshot(dst []driver.Lease) []driver.Lease {
	now := time.Now()
	slow := now.Add(-f.e.cfg.HeartbeatInterval / 2)
	safe := now.Add(f.e.cfg.HeartbeatInterval + f.e.leaseMargin())
	f.mu.Lock()
	for id, it := range f.leases {
		if it.abandoned(now) || it.finishing && it.finishedAt.After(slow) && it.validUntil.After(safe) {
			continue
		}
		dst = append(dst, driver.Lease{ID: id, Fence: it.row.Fence})
	}
	f.mu.Unlock()
	return dst
}

// renewed records a heartbeat sent at sent that covered asked: the owned
// leases are valid for another Lease from sent; the others of running
// handlers were lost and those handlers are cancelled. It returns how
// many were lost.
func (f *fetcher) renewed(asked map[int64]int64, owned map[int64]bool, sent time.Time) int {
	valid := sent.Add(f.e.cfg.Lease)
	n := 0
	f.mu.Lock()
	for id, it := range f.leases {
		fence, ok := asked[id]
		if !ok || fence != it.row.Fence {
			continue
		}
		if owned[id] {
			if valid.After(it.validUntil) {
				it.validUntil = valid
			}
			continue
		}
		if it.finishing {
			// Its outcome was most likely written between the snapshot
			// and the renewal (the completer settles it); if the job was
			// taken from us instead, the write is refused and counted as
			// stale. Either way there is no handler left to stop.
			continue
		}
		delete(f.leases, id)
		it.cancel(errLeaseLost)
		n++
	}
	f.mu.Unlock()
	return n
}

// cutOff cancels the handlers of attempts whose lease may expire within
// margin, because no renewal got through in time, and returns how many it
// cancelled. They stay held: their outcome is still written, fenced, and a
// later renewal still extends them.
func (f *fetcher) cutOff(now time.Time, margin time.Duration) int {
	n := 0
	f.mu.Lock()
	for _, it := range f.leases {
		if it.finishing || it.cutOff || it.abandoned(now) || now.Before(it.validUntil.Add(-margin)) {
			continue
		}
		it.cutOff = true
		it.cancel(errLeaseDeadline)
		n++
	}
	f.mu.Unlock()
	return n
}

// takeAllLeases removes every held attempt and returns those to release
// (shutdown): not the abandoned ones, left to expire and be rescued with
// the attempt counted, and not those whose outcome is written or was
// given up on.
func (f *fetcher) takeAllLeases() []driver.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	out := make([]driver.Lease, 0, len(f.leases))
	for id, it := range f.leases {
		delete(f.leases, id)
		if it.abandoned(now) || it.finishing {
			continue
		}
		out = append(out, driver.Lease{ID: id, Fence: it.row.Fence})
	}
	return out
}
