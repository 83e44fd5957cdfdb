package engine

import (
	"cmp"
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// heartbeatLoop renews the leases of every attempt this process holds
// (running, and finished but not yet written) with one statement per
// interval, on the backend's lease path, and cancels attempts whose lease
// was lost. Intervals run from one send to the next, so a slow renewal
// does not stretch them; a failed renewal is tried again soon, and if none
// gets through in time the deadline loop stops the handlers.
func (e *Engine) heartbeatLoop(ctx context.Context) {
	fs := make([]*fetcher, 0, len(e.fetchers))
	for _, f := range e.fetchers {
		fs = append(fs, f)
	}
	var leases []driver.Lease
	fails := 0
	timer := time.NewTimer(e.cfg.HeartbeatInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.hbWake:
			// A claim that took long to come back: renew its lease now
			// rather than at the next interval.
		}
		var sent time.Time
		var err error
		leases, sent, err = e.renew(ctx, fs, leases)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			fails++
			timer.Reset(min(errBackoff(fails), e.cfg.HeartbeatInterval))
		case sent.IsZero():
			timer.Reset(e.cfg.HeartbeatInterval)
		default:
			fails = 0
			timer.Reset(max(0, e.cfg.HeartbeatInterval-time.Since(sent)))
		}
	}
}

// SlowRenewal is a lease renewal that took longer than the heartbeat
// interval: when it was sent, how long until its answer was applied (or
// it failed),
// how many leases it asked for and the driver's error.
type SlowRenewal struct {
	Sent time.Time // when the renewal was sent
	// Took is until its answer was applied to the leases (the deadline
	// loop saw the old deadlines until then), or until it failed.
	Took   time.Duration
	Leases int   // leases it asked for
	Err    error // the driver's error, nil when it got through
}

// OnSlowRenewal has fn called, on the heartbeat's goroutine, after each
// renewal slower than the heartbeat interval (which is also logged as
// "conveyor: heartbeat slow"); nil removes it. It is the lab package's
// hook; fn must return quickly.
func (e *Engine) OnSlowRenewal(fn func(SlowRenewal)) { e.slowRenewal.Store(&fn) }

// LateClaim is a claim (a fetcher's, or an insert's that claimed its own
// jobs) that came back more than a heartbeat interval after it was sent.
// Its jobs' leases run from when it was sent, so their handlers start
// with that much less of their first lease: unless a renewal of theirs
// gets through first, the deadline loop cuts them off at Deadline.
type LateClaim struct {
	Sent time.Time // when the claim was sent: the leases run from it
	// Back is when its jobs were handed to the fetcher, before their
	// handlers start: every renewal of their leases is sent after it.
	Back time.Time
	// Deadline is when their handlers are cut off unless a renewal got
	// through: Sent plus the Lease, less the margin (Lease/5).
	Deadline time.Time
	Jobs     []JobAttempt // the attempts it claimed
}

// JobAttempt names one attempt of a job.
type JobAttempt struct {
	ID      int64 // the job's id
	Attempt int   // the attempt's number
}

// OnLateClaim has fn called, on the claiming goroutine, for each claim
// slower than the heartbeat interval, before its jobs go to their
// workers; nil removes it. It is the lab package's hook; fn must return
// quickly.
func (e *Engine) OnLateClaim(fn func(LateClaim)) { e.lateClaim.Store(&fn) }

// lateClaimed reports a late claim of rows, sent at sent and back at
// back, to OnLateClaim's hook.
func (e *Engine) lateClaimed(rows []*driver.JobRow, sent, back time.Time) {
	fn := e.lateClaim.Load()
	if fn == nil || *fn == nil {
		return
	}
	jobs := make([]JobAttempt, len(rows))
	for i, r := range rows {
		jobs[i] = JobAttempt{ID: r.ID, Attempt: r.Attempt}
	}
	(*fn)(LateClaim{Sent: sent, Back: back, Deadline: sent.Add(e.cfg.Lease - e.leaseMargin()), Jobs: jobs})
}

// renew sends one renewal of the leases fs hold (their snapshots, into
// buf) and applies its answer: owned leases are valid for another Lease
// from when it was sent, the handlers of lost ones are cancelled. It
// returns the leases asked for, when the renewal was sent (zero when
// there was nothing to renew) and the driver's error.
func (e *Engine) renew(ctx context.Context, fs []*fetcher, buf []driver.Lease) ([]driver.Lease, time.Time, error) {
	leases := buf[:0]
	for _, f := range fs {
		leases = f.snapshot(leases)
	}
	if len(leases) == 0 {
		return leases, time.Time{}, nil
	}
	// In id order, as the completer writes, so that a renewal and a
	// completion touching the same rows lock them in the same order.
	slices.SortFunc(leases, func(a, b driver.Lease) int { return cmp.Compare(a.ID, b.ID) })
	sent := time.Now()
	// A renewal waiting for its turn (a lock, a connection) keeps waiting
	// for as long as it can still save a lease: giving up and trying again
	// would only lose its place.
	hctx, cancel := context.WithTimeout(ctx, max(e.cfg.HeartbeatInterval, e.cfg.Lease-e.leaseMargin()))
	owned, err := e.drv.Heartbeat(hctx, leases, e.cfg.Lease)
	cancel()
	if err == nil {
		// Applied first: until it is, the deadline loop still sees the
		// old deadlines and may cut the handlers off.
		asked := make(map[int64]int64, len(leases))
		for _, l := range leases {
			asked[l.ID] = l.Fence
		}
		own := make(map[int64]bool, len(owned))
		for _, id := range owned {
			own[id] = true
		}
		for _, f := range fs {
			e.metrics.LeasesLost.Add(int64(f.renewed(asked, own, sent)))
		}
	}
	if took := time.Since(sent); took > e.cfg.HeartbeatInterval {
		e.warn("conveyor: heartbeat slow", "jobs", len(leases), "took", took, "error", err)
		if fn := e.slowRenewal.Load(); fn != nil && *fn != nil {
			(*fn)(SlowRenewal{Sent: sent, Took: took, Leases: len(leases), Err: err})
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: heartbeat failed (retrying)", "jobs", len(leases), "error", err)
		}
		return leases, sent, err
	}
	return leases, sent, nil
}

// leaseMargin is how long before its lease may expire an attempt whose
// lease could not be renewed has its handler cancelled: a fifth of the
// lease (6s of the default 30s). A handler that honours its context has
// that long to return before another process may take the job.
func (e *Engine) leaseMargin() time.Duration { return e.cfg.Lease / 5 }

// deadlineLoop cancels the handlers of attempts whose lease may expire
// within leaseMargin because no renewal got through (a database that
// does not answer, a lease path that cannot get its turn): the process
// stops working on a job before the job can be rescued, so the same job
// never runs in two places at once while the lease says one owns it. It
// checks every Lease/20 (at most every second), which the margin covers.
func (e *Engine) deadlineLoop(ctx context.Context) {
	fs := make([]*fetcher, 0, len(e.fetchers))
	for _, f := range e.fetchers {
		fs = append(fs, f)
	}
	for sleep(ctx, e.deadlineTick()) {
		e.cutOff(fs, time.Now())
	}
}

// deadlineTick is how often the deadline loop checks: every Lease/20, at
// most every second, which the margin covers.
func (e *Engine) deadlineTick() time.Duration {
	return max(min(e.cfg.Lease/20, time.Second), 5*time.Millisecond)
}

// cutOff cancels the handlers of fs's attempts whose lease may expire
// within leaseMargin, and counts them.
func (e *Engine) cutOff(fs []*fetcher, now time.Time) {
	margin := e.leaseMargin()
	n := 0
	for _, f := range fs {
		n += f.cutOff(now, margin)
	}
	if n > 0 {
		e.metrics.LeaseDeadlines.Add(int64(n))
		e.warn("conveyor: handlers cancelled: their leases could not be renewed in time", "jobs", n, "margin", margin)
	}
}

// maintenanceLoop runs the backend's upkeep (driver.Driver.Maintain),
// promotion, rescue and pruning while this process holds leadership;
// every process competes for it.
func (e *Engine) maintenanceLoop(ctx context.Context) {
	const batch = 1000
	leadTTL := 15 * time.Second
	var leader bool
	var lastLead, lastRescue, lastPrune time.Time
	errs, roundErrs := 0, 0
	fires := fireBackoff{base: e.cfg.BatchFireBackoff, max: e.cfg.BatchFireBackoffMax}
	// A leader that stops gives the leadership up, so that another
	// process promotes at its next tick instead of after the rest of the
	// TTL (scheduled jobs would otherwise run up to 15s late at every
	// restart of the leader). A leader that died is waited out.
	defer func() {
		if !leader {
			return
		}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := e.drv.TryLead(rctx, e.id, -leadTTL); err != nil {
			e.warn("conveyor: giving up the maintenance leadership failed (another process takes it when it expires)", "error", err)
		}
	}()
	for sleep(ctx, e.cfg.PromoteInterval) {
		now := time.Now()
		if now.Sub(lastLead) >= leadTTL/3 || !leader {
			ok, err := e.drv.TryLead(ctx, e.id, leadTTL)
			if err != nil && ctx.Err() != nil {
				return
			}
			if err != nil {
				errs++
				e.metrics.DBErrors.Add(1)
				e.warn("conveyor: leader election failed", "error", err)
				sleep(ctx, errBackoff(errs))
				continue
			}
			errs = 0
			leader, lastLead = ok, now
		}
		if !leader {
			fires.reset() // a later leadership starts afresh
			continue
		}
		// Every round runs all its tasks: one that fails (a lasting
		// Maintain error, say no privilege to rotate a segment) must not
		// keep the others from promoting and rescuing. A round in which
		// any failed (the database is away: a failover, a restart) is
		// followed by a growing pause rather than the next round at
		// PromoteInterval.
		failed := false
		if _, err := e.drv.Maintain(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failed = true
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: maintenance failed", "task", "maintain", "error", err)
		}
		if !e.drainLoop(ctx, "promote", batch, &e.metrics.Promoted, e.drv.Promote) {
			failed = true
		}
		// Batches whose every job has finished get their callback. A
		// batch whose callback could not be enqueued is logged by id and
		// tried again after a backoff of its own (fireBackoff); the
		// others were fired all the same, and the round is not taken for
		// a failed one (a batch that fails every time would otherwise
		// slow every round down).
		fires.forget(now)
		fired, err := e.drv.FireBatches(ctx, batch, fires.skip(now))
		for id := range fired {
			fires.fired(id)
		}
		if err != nil && ctx.Err() == nil {
			e.metrics.DBErrors.Add(1)
			var fe *driver.BatchFireError
			if errors.As(err, &fe) {
				for _, f := range fe.Failed {
					wait := fires.failed(f.BatchID, now)
					e.warn("conveyor: enqueueing the callback of a finished batch failed", "batch", f.BatchID, "error", f.Err, "retry_in", wait)
				}
			} else {
				failed = true
				e.warn("conveyor: enqueueing the callbacks of finished batches failed", "error", err)
			}
		}
		if now.Sub(lastRescue) >= e.cfg.RescueInterval {
			lastRescue = now
			if !e.drainLoop(ctx, "rescue", batch, &e.metrics.Rescued, e.drv.Rescue) {
				failed = true
			}
		}
		if now.Sub(lastPrune) >= e.cfg.PruneInterval {
			lastPrune = now
			if e.cfg.ProcessPruneAge > 0 {
				if _, err := e.drv.PruneProcesses(ctx, e.cfg.ProcessPruneAge); err != nil && ctx.Err() == nil {
					e.warn("conveyor: pruning gone processes failed", "error", err)
				}
			}
			if e.cfg.SchedulePruneAge > 0 {
				if _, err := e.drv.PruneSchedules(ctx, e.cfg.SchedulePruneAge); err != nil && ctx.Err() == nil {
					e.warn("conveyor: pruning removed periodic schedules failed", "error", err)
				}
			}
			for {
				n, err := e.drv.Prune(ctx, e.cfg.CompletedRetention, e.cfg.DiscardedRetention, batch)
				if err != nil {
					if ctx.Err() == nil {
						e.warn("conveyor: prune failed", "error", err)
					}
					break
				}
				e.metrics.Pruned.Add(n)
				if n < batch {
					break
				}
			}
		}
		if failed {
			roundErrs++
			sleep(ctx, errBackoff(roundErrs))
		} else {
			roundErrs = 0
		}
	}
}

type counter interface{ Add(int64) int64 }

// drainLoop runs f in batches until one comes back short, and reports
// whether none failed.
func (e *Engine) drainLoop(ctx context.Context, what string, batch int, m counter, f func(context.Context, int) (map[string]int, error)) bool {
	for ctx.Err() == nil {
		counts, err := f(ctx, batch)
		if err != nil {
			if ctx.Err() == nil {
				e.metrics.DBErrors.Add(1)
				e.warn("conveyor: maintenance failed", "task", what, "error", err)
			}
			return false
		}
		total := 0
		for _, n := range counts {
			total += n
		}
		m.Add(int64(total))
		e.wakeAll(counts)
		if total < batch {
			return true
		}
	}
	return true
}

// processLoop registers this process in the processes table at once and
// refreshes its row every ProcessInterval (one upsert, never on the claim
// path), so that dashboards list it and the queues it works. A failed
// refresh is retried sooner; the row outlives a few failures (its TTL is
// several intervals). Stop removes the row once this loop has ended.
func (e *Engine) processLoop(ctx context.Context) {
	if e.cfg.ProcessInterval <= 0 {
		return
	}
	row := e.processRow()
	fails := 0
	for {
		wait := e.cfg.ProcessInterval
		rctx, cancel := context.WithTimeout(ctx, e.cfg.ProcessInterval)
		err := e.drv.RegisterProcess(rctx, row, e.cfg.ProcessTTL)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			e.metrics.DBErrors.Add(1)
			e.warn("conveyor: registering this process failed (retrying)", "error", err)
			wait = min(errBackoff(fails), wait)
		} else {
			fails = 0
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// processRow is this process as the processes table records it.
func (e *Engine) processRow() driver.ProcessRow {
	qs := make(map[string]int, len(e.cfg.Queues))
	for q, n := range e.cfg.Queues {
		qs[q] = n
	}
	return driver.ProcessRow{ID: e.id, Kind: driver.ProcessClient, Host: e.host, PID: os.Getpid(), Version: e.cfg.Version, Queues: qs}
}

// listening runs the engine's one listener while something needs it: a
// started engine (from Start to Stop) or waiting remote claims (until
// remoteListenIdle after the last one ended).
type listening struct {
	mu     sync.Mutex
	refs   int
	closed bool
	cancel context.CancelFunc // nil when not running
	done   chan struct{}
	idle   *time.Timer
	wg     sync.WaitGroup // every listenLoop, those still ending too
}

// listenAcquire starts the listener, on a backend that has one, if it
// is not running, and keeps it running until the matching listenRelease.
func (e *Engine) listenAcquire() {
	if !e.drv.Capabilities().Listen {
		return
	}
	l := &e.listen
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
	done := make(chan struct{})
	l.cancel, l.done = cancel, done
	l.wg.Add(1)
	go func() { defer l.wg.Done(); defer close(done); e.listenLoop(ctx) }()
}

// listenRelease ends a listenAcquire. The listener stops linger after
// the last one ended; with no linger at once, and listenRelease waits
// for it.
func (e *Engine) listenRelease(linger time.Duration) {
	if !e.drv.Capabilities().Listen {
		return
	}
	l := &e.listen
	l.mu.Lock()
	if l.refs > 0 {
		l.refs--
	}
	if l.refs > 0 || l.cancel == nil {
		l.mu.Unlock()
		return
	}
	if linger > 0 {
		if l.idle == nil {
			var idle *time.Timer
			idle = time.AfterFunc(linger, func() {
				l.mu.Lock()
				defer l.mu.Unlock()
				if l.idle != idle {
					return // stopped, and the listener acquired again since
				}
				l.idle = nil
				if l.refs == 0 && l.cancel != nil {
					l.cancel()
					l.cancel = nil
				}
			})
			l.idle = idle
		}
		l.mu.Unlock()
		return
	}
	l.cancel()
	l.cancel = nil
	done := l.done
	l.mu.Unlock()
	<-done
}

// listenClose stops the listener for good and waits for it.
func (e *Engine) listenClose() {
	l := &e.listen
	l.mu.Lock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
	}
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// listenLoop holds this process's one notification connection and wakes
// the fetcher of each queue named in a notification, and the remote
// claims waiting on it.
func (e *Engine) listenLoop(ctx context.Context) {
	if !e.drv.Capabilities().Listen {
		return
	}
	for try := 1; ctx.Err() == nil; try++ {
		l, err := e.drv.Listen(ctx)
		if err != nil {
			e.warn("conveyor: listen failed (polling meanwhile)", "error", err)
			sleep(ctx, errBackoff(try))
			continue
		}
		try = 0
		// Notifications sent before now are not received (see selfNotes).
		e.self.forget()
		// Listening from now on. A cancel sent before this instant (while
		// connecting, or between a failure and this reconnection) was
		// missed: renew the leases at once, so that a job cancelled
		// meanwhile is found gone now rather than at the next heartbeat.
		// (Missed wake-ups need nothing here: fetchers claim when they
		// start, and a failure of the listener wakes them all.)
		signal(e.hbWake)
		for {
			q, err := l.Wait(ctx)
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				e.warn("conveyor: listener failed (reconnecting)", "error", err)
				e.self.forget()
				sleep(ctx, errBackoff(1))
				signal(e.hbWake) // a cancel may have been missed meanwhile
				e.wake("")
				continue
			}
			if q == driver.CancelNotice {
				signal(e.hbWake)
				continue
			}
			if q == "" {
				// The listener reconnected: notifications sent while it
				// was down are lost, a cancel among them.
				e.self.forget()
				signal(e.hbWake)
			} else if e.self.own(q) && !e.limited(q) {
				// This process's own insert sent it and has woken the
				// queue's fetcher itself (see selfNotes).
				e.metrics.SelfNotices.Add(1)
				continue
			}
			e.wake(q)
			if q != "" && e.limited(q) {
				// Another process may have ended an attempt of the
				// queue (a backend may notify as a slot frees): a
				// fetcher held back by the limits claims again.
				e.slotFreed(q)
			}
		}
		l.Close()
	}
}
