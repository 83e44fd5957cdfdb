package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// errCallerGone is the cause given to the context of a job run by WorkOne
// when the caller's context ends: like a shutdown, it interrupts the
// attempt instead of failing it.
var errCallerGone = errors.New("conveyor: the caller of WorkOne gave up")

// Worked is what WorkOne did with a job.
type Worked struct {
	// Row is the attempt as claimed (state running, its attempt number
	// and fence token).
	Row *driver.JobRow
	// Err is the handler's error, nil when it succeeded: a panic, a
	// timeout and an unknown kind are errors too, as in a worker.
	Err error
	// Outcome is the outcome written: the state the job was moved to, its
	// retry delay and the error recorded.
	Outcome driver.Outcome
	// Applied reports whether the database took the outcome; false when
	// its fence refused it because the job stopped being this attempt's
	// while it ran (cancelled, discarded, or rescued after its lease
	// expired).
	Applied bool
}

// WorkOne claims job id, if it is available, scheduled or retryable,
// whatever its queue and schedule, and runs it in the calling goroutine
// the way a worker of a started engine runs a claimed job (fetcher.work):
// the same check before the handler starts, the handler with its timeout
// and panic recovery, the lease renewed while it runs and the handler
// cancelled if the lease is lost or cannot be renewed in time, and the
// outcome written with the driver call the completer makes (fenced),
// before WorkOne returns. It does not need Start and takes no worker slot
// of any queue. The handler's context carries ctx's values; if ctx ends
// while the handler runs, the handler's context is cancelled and, if the
// handler then fails, the attempt is released as at shutdown (available
// again, the attempt not counted) and WorkOne returns an error. WorkOne
// returns when the handler returns.
//
// It returns an error wrapping driver.ErrNotFound or ErrWrongState when
// the job cannot be claimed, and an error with a non-nil Worked when the
// handler ran but its outcome could not be written (the lease was lost,
// or the database stayed unreachable until the lease ran out).
func (e *Engine) WorkOne(ctx context.Context, id int64) (*Worked, error) {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, ErrStopped
	}
	sent := time.Now()
	row, err := e.drv.ClaimJob(ctx, id, e.cfg.Lease, e.id)
	if err != nil {
		return nil, err
	}
	e.metrics.Claimed.Add(1)
	// A fetcher of its own holds the one attempt: the bookkeeping of
	// leases (renewal, cut-off, finishing, settling) is the workers'.
	f := newFetcher(e, row.Queue, 1, context.WithoutCancel(ctx))
	f.mu.Lock()
	it := f.hold(row, sent.Add(e.cfg.Lease))
	f.mu.Unlock()
	stopCaller := context.AfterFunc(ctx, func() { it.cancel(errCallerGone) })
	defer stopCaller()
	lctx, stopLeases := context.WithCancel(context.Background())
	leasesDone := make(chan struct{})
	go func() { defer close(leasesDone); e.keepLeases(lctx, f) }()
	defer func() { stopLeases(); <-leasesDone }()

	a := f.work(it)
	w := &Worked{Row: row, Err: a.err, Outcome: a.outcome}
	switch {
	case !a.ran:
		return nil, fmt.Errorf("conveyor: job %d: its lease ran out before its handler could start; the attempt was given back", id)
	case a.interrupted:
		rctx, cancel := context.WithTimeout(context.Background(), e.cfg.Lease)
		defer cancel()
		n, rerr := e.drv.Release(rctx, []driver.Lease{{ID: row.ID, Fence: row.Fence}})
		e.metrics.Released.Add(n)
		if rerr != nil {
			return nil, fmt.Errorf("conveyor: job %d: interrupted (%w) and could not be released (it will be rescued when its lease expires): %v", id, context.Cause(ctx), rerr)
		}
		return nil, fmt.Errorf("conveyor: job %d: interrupted (%w) before its handler finished; the attempt was released: the job is available again and the attempt not counted", id, context.Cause(ctx))
	case !a.write:
		return w, fmt.Errorf("conveyor: job %d: %w while its handler ran; its outcome was not written", id, errLeaseLost)
	}
	applied, err := e.writeOne(f, it, a.outcome)
	if err != nil {
		return w, err
	}
	w.Applied = applied
	return w, nil
}

// writeOne writes the outcome of WorkOne's attempt with the completer's
// driver call, retrying a failed write as the completer does while the
// attempt's lease may still hold, then settles the attempt. It reports
// whether the database applied the outcome.
func (e *Engine) writeOne(f *fetcher, it *running, o driver.Outcome) (bool, error) {
	defer f.settle(o.ID, o.Fence)
	batch := []driver.Outcome{o}
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		applied, err := e.drv.Complete(ctx, batch)
		cancel()
		if err == nil || len(applied) == 1 {
			// Applied, even if the call failed after (see completer.write).
			e.written(batch, applied)
			return len(applied) == 1, nil
		}
		e.metrics.DBErrors.Add(1)
		e.warn("conveyor: writing a job's outcome failed (retrying)", "job_id", o.ID, "error", err)
		f.mu.Lock()
		valid := it.validUntil
		f.mu.Unlock()
		wait := errBackoff(try)
		if time.Now().Add(wait).After(valid) {
			return false, fmt.Errorf("conveyor: job %d: writing its outcome (%s) failed until its lease ran out; the job will be rescued: %w", o.ID, o.State, err)
		}
		time.Sleep(wait)
	}
}

// keepLeases renews the leases f holds every HeartbeatInterval and
// cancels the handlers whose lease is lost or cannot be renewed in time,
// as the heartbeat and deadline loops do for a started engine's
// fetchers, until ctx ends. WorkOne runs it for its one attempt, whether
// or not the engine is started.
func (e *Engine) keepLeases(ctx context.Context, f *fetcher) {
	fs := []*fetcher{f}
	var leases []driver.Lease
	next := time.Now().Add(e.cfg.HeartbeatInterval)
	fails := 0
	for sleep(ctx, e.deadlineTick()) {
		now := time.Now()
		e.cutOff(fs, now)
		if now.Before(next) {
			continue
		}
		var sent time.Time
		var err error
		leases, sent, err = e.renew(ctx, fs, leases)
		switch {
		case err != nil:
			fails++
			next = time.Now().Add(min(errBackoff(fails), e.cfg.HeartbeatInterval))
		case sent.IsZero():
			next = now.Add(e.cfg.HeartbeatInterval)
		default:
			fails = 0
			next = sent.Add(e.cfg.HeartbeatInterval)
		}
	}
}
