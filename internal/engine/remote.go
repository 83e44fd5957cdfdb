package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Remote workers are workers in other processes that reach this engine
// through a protocol (package web's HTTP worker protocol): the engine
// claims, renews and settles their jobs as it does its own, through the
// same driver calls, fence, completer, listener and processes table.

// Bounds of remote claims.
const (
	// remotePollMin and remotePollMax bound the re-claims of a waiting
	// remote claim: 50ms after an empty claim, doubling to 1s.
	remotePollMin, remotePollMax = 50 * time.Millisecond, time.Second
	// remoteListenIdle is how long the listener a waiting remote claim
	// opened (on a backend with notifications, when this engine is not
	// started) stays open after the last such claim ended.
	remoteListenIdle = 30 * time.Second
	// remoteWriteTimeout bounds a remote claim's statement, which runs on
	// a context the remote worker's disconnect does not cancel.
	remoteWriteTimeout = 30 * time.Second
)

// ErrLeaseLost is returned for a remote worker's renewal or outcome when
// the job is no longer held under the fence it sends: its lease expired
// and it was rescued, or it was released, cancelled, discarded or
// finished.
var ErrLeaseLost = errors.New("conveyor: job is no longer held under this fence")

// RemoteClaim is a claim made on behalf of a remote worker.
type RemoteClaim struct {
	// Queue to claim from.
	Queue string
	// Limit is the most jobs claimed.
	Limit int
	// Lease is how long the claimed jobs are held before they can be
	// rescued, unless renewed.
	Lease time.Duration
	// Wait, when positive, makes the claim wait up to that long for a job
	// when the queue has none: it claims again 50ms after an empty claim,
	// doubling to 1s, and at once when the queue is woken (an enqueue, a
	// retry or a resume in this process, a notification from another).
	// When the queue's limits hold its jobs back, it claims again when
	// the rate's window has room, or every PollMin for a concurrency
	// slot, and at once when an attempt of the queue ends in this
	// process.
	Wait time.Duration
	// Worker is recorded in the claimed jobs' attempted_by.
	Worker string
	// Process is the remote worker's id in the processes table, Host the
	// host it connects from.
	Process, Host string
}

// ClaimRemote claims jobs for a remote worker. The claim runs on a
// context ctx's cancellation does not cut short (a claim cut off half way
// may have committed); if ctx ended meanwhile, the claimed jobs are
// released at once, rather than when their leases expire, and ctx's
// error is returned.
func (e *Engine) ClaimRemote(ctx context.Context, p RemoteClaim) ([]*driver.JobRow, error) {
	if e.isClosed() {
		return nil, ErrStopped
	}
	deadline := time.Now().Add(p.Wait)
	backoff := remotePollMin
	// The limits cache is kept fresh while remote claims are served.
	e.limitsAcquire()
	defer e.limitsRelease(remoteListenIdle)
	if p.Wait > 0 {
		e.listenAcquire()
		defer e.listenRelease(remoteListenIdle)
	}
	for {
		// Before the claim, so that a wake during it is not missed: an
		// enqueue for a claim that finds the queue empty, a freed slot
		// for one the limits hold back.
		woken, done := e.waiters.wait(p.Queue)
		freed, doneHeld := e.waiters.wait(heldKey(p.Queue))
		if e.isClosed() {
			done()
			doneHeld()
			return nil, ErrStopped
		}
		e.remote.claiming(ctx, p.Process, p.Host, p.Queue)
		rows, hold, err := e.claimRemote(ctx, driver.ClaimParams{Queue: p.Queue, Limit: p.Limit, Lease: p.Lease, Worker: p.Worker})
		if err != nil {
			done()
			doneHeld()
			return nil, err
		}
		e.remote.claimed(p.Process, rows)
		left := time.Until(deadline)
		if len(rows) > 0 || left <= 0 {
			done()
			doneHeld()
			return rows, nil
		}
		wait := backoff
		if hold > 0 {
			// Jobs are waiting, held back by the limits: an enqueue
			// changes nothing, a freed slot or the window's room does.
			wait, woken = hold, nil
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-woken:
			backoff = remotePollMin
		case <-freed:
		case <-t.C:
			if hold == 0 {
				backoff = min(2*backoff, remotePollMax)
			}
		case <-ctx.Done():
			t.Stop()
			done()
			doneHeld()
			return nil, ctx.Err()
		}
		t.Stop()
		done()
		doneHeld()
	}
}

// claimRemote makes one claim of a remote claim: through ClaimLimited
// for a limited queue (hold is then the wait before the next claim when
// the limits held jobs back, see fetcher.claim), else through Claim.
func (e *Engine) claimRemote(ctx context.Context, p driver.ClaimParams) (rows []*driver.JobRow, hold time.Duration, err error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), remoteWriteTimeout)
	defer cancel()
	e.metrics.ClaimRounds.Add(1)
	rows, hold, err = e.claimRemoteGated(cctx, p)
	if err != nil {
		e.metrics.DBErrors.Add(1)
		return nil, 0, err
	}
	e.metrics.Claimed.Add(int64(len(rows)))
	if ctx.Err() == nil || len(rows) == 0 {
		return rows, hold, nil
	}
	leases := make([]driver.Lease, len(rows))
	for i, row := range rows {
		leases[i] = driver.Lease{ID: row.ID, Fence: row.Fence}
	}
	n, rerr := e.drv.Release(cctx, leases)
	e.metrics.Released.Add(n)
	if rerr != nil {
		e.warn("conveyor: releasing the jobs of a remote claim whose caller went away (they are rescued when their leases expire)", "jobs", len(rows), "error", rerr)
	}
	if n > 0 && e.limited(p.Queue) {
		e.slotFreed(p.Queue)
	}
	return nil, 0, ctx.Err()
}

// claimRemoteGated is claimRemote's statements under the queue's claims
// gate (lockClaims), released however they return.
func (e *Engine) claimRemoteGated(ctx context.Context, p driver.ClaimParams) (rows []*driver.JobRow, hold time.Duration, err error) {
	defer e.lockClaims(p.Queue)()
	if !e.limited(p.Queue) {
		rows, err = e.drv.Claim(ctx, p)
		return rows, 0, err
	}
	res, err := e.drv.ClaimLimited(ctx, p)
	if res.Held {
		hold = heldWait(res, e.cfg.PollMin, e.keyLimited(p.Queue))
	}
	return res.Rows, hold, err
}

// RenewRemote renews the lease of a remote worker's job for another
// lease, fenced; ErrLeaseLost when the job is no longer held under fence.
func (e *Engine) RenewRemote(ctx context.Context, id, fence int64, lease time.Duration) error {
	if e.isClosed() {
		return ErrStopped
	}
	owned, err := e.drv.Heartbeat(ctx, []driver.Lease{{ID: id, Fence: fence}}, lease)
	if err != nil {
		return err
	}
	if len(owned) != 1 {
		e.remote.done(id, fence)
		e.metrics.LeasesLost.Add(1)
		return ErrLeaseLost
	}
	e.remote.beat(ctx, id)
	return nil
}

// RemoteFailure is a remote worker's failed attempt.
type RemoteFailure struct {
	// Error is the worker's error message, Trace its stack trace (both
	// stored with the attempt).
	Error, Trace string
	// Cancel ends the job as cancelled, without retry.
	Cancel bool
	// RetryIn, when positive, replaces the kind's backoff before the
	// next attempt.
	RetryIn time.Duration
}

// remoteError is a remote failure as a handler error, so that the
// outcome of a remote attempt is decided as a local one is (outcome).
type remoteError struct {
	msg    string
	cancel bool
}

func (r *remoteError) Error() string { return r.msg }

// Is makes a cancelling failure match ErrCancelJob.
func (r *remoteError) Is(target error) bool { return r.cancel && target == ErrCancelJob }

// CompleteRemote records a remote worker's success, fenced, with its
// result (already checked; nil for none), stored only if the completion
// is applied.
func (e *Engine) CompleteRemote(ctx context.Context, id, fence int64, result json.RawMessage) error {
	return e.settleRemote(ctx, driver.Outcome{ID: id, Fence: fence, State: driver.StateCompleted, Result: result})
}

// SnoozeRemote puts a remote worker's job back for d without counting
// the attempt, fenced.
func (e *Engine) SnoozeRemote(ctx context.Context, id, fence int64, d time.Duration) error {
	err := e.settleRemote(ctx, driver.Outcome{ID: id, Fence: fence, State: driver.StateScheduled, RetryIn: max(d, 0)})
	if err == nil {
		e.metrics.Snoozed.Add(1)
	}
	return err
}

// FailRemote records a remote worker's failed attempt, fenced, and
// returns the job's new state: retryable with the kind's backoff (or
// f.RetryIn), discarded after its last attempt, or cancelled. The
// decision is the one a local worker's error gets (outcome); the
// attempt and its limit are read first, and the fenced write refuses the
// outcome if another claim took the job meanwhile.
func (e *Engine) FailRemote(ctx context.Context, id, fence int64, f RemoteFailure) (string, error) {
	if e.isClosed() {
		return "", ErrStopped
	}
	row, err := e.drv.GetJob(ctx, id)
	if errors.Is(err, driver.ErrNotFound) {
		err = nil // pruned or deleted: no longer held, as for any outcome
		row = &driver.JobRow{ID: id}
	}
	if err != nil {
		return "", fmt.Errorf("job %d: %w", id, err)
	}
	if row.Fence != fence || row.State != driver.StateRunning {
		e.remote.done(id, fence)
		e.metrics.StaleAcksRefused.Add(1)
		return "", ErrLeaseLost
	}
	rerr := &remoteError{msg: f.Error, cancel: f.Cancel}
	o := e.outcome(row, rerr, f.Trace, nil)
	if o.State == driver.StateRetryable && f.RetryIn > 0 {
		o.RetryIn = f.RetryIn
	}
	if err := e.settleRemote(ctx, o); err != nil {
		return "", err
	}
	e.metrics.Failed.Add(1)
	e.logFailure(row, 0, o, rerr)
	return o.State, nil
}

// settleRemote writes a remote worker's outcome through the completer,
// batched with this process's and other remote workers' outcomes, and
// waits for its result. When ctx ends first it returns ctx's error; the
// outcome may still be written with its batch.
func (e *Engine) settleRemote(ctx context.Context, o driver.Outcome) error {
	res := make(chan written, 1)
	for {
		c := e.completer()
		if c == nil {
			return ErrStopped
		}
		ok, err := c.submitCtx(ctx, pending{o: o, res: res, queue: e.remote.queueOf(o.ID)})
		if err != nil {
			return err
		}
		if ok {
			break
		}
	}
	select {
	case w := <-res:
		e.remote.done(o.ID, o.Fence)
		switch {
		case w.err != nil:
			return w.err
		case !w.applied:
			return ErrLeaseLost
		}
		return nil
	case <-ctx.Done():
		e.remote.done(o.ID, o.Fence) // the worker that waited is gone
		return ctx.Err()
	}
}

// Kinds of remote outcome RecordedRemote checks for.
const (
	// RemoteCompleted is a completion.
	RemoteCompleted = iota + 1
	// RemoteFailed is a failure (RemoteFailure).
	RemoteFailed
	// RemoteSnoozed is a snooze.
	RemoteSnoozed
)

// RecordedRemote reports whether the attempt of job id claimed under
// fence already ended with an outcome of kind (RemoteCompleted,
// RemoteFailed with f, RemoteSnoozed), as an earlier call whose answer
// was lost would have left it; with the state that outcome produced. It
// is asked after that outcome was refused (ErrLeaseLost), and reads the
// job once; it writes nothing. The job must still carry fence (no claim
// since: every claim advances it, and every backend keeps it on a
// finished row) and be in the state the outcome left:
//   - a completion: completed;
//   - a snooze: scheduled (a snoozed job promoted since is available
//     again, like a released one, and is not told apart);
//   - a failure: the state it decided (cancelled on request, discarded
//     after the last attempt, else retryable, or available once
//     promoted), with the job's last error recorded for this attempt
//     number with f's error and trace. A rescue records "lease expired"
//     instead, and a cancel or discard by hand records none, so neither
//     passes for the failure.
func (e *Engine) RecordedRemote(ctx context.Context, id, fence int64, kind int, f RemoteFailure) (string, bool, error) {
	row, err := e.drv.GetJob(ctx, id)
	if errors.Is(err, driver.ErrNotFound) {
		return "", false, nil // pruned or deleted: nothing to tell
	}
	if err != nil {
		return "", false, fmt.Errorf("job %d: %w", id, err)
	}
	if row.Fence != fence {
		return "", false, nil
	}
	switch kind {
	case RemoteCompleted:
		return driver.StateCompleted, row.State == driver.StateCompleted, nil
	case RemoteSnoozed:
		return driver.StateScheduled, row.State == driver.StateScheduled, nil
	case RemoteFailed:
		if len(row.Errors) == 0 {
			return "", false, nil
		}
		last := row.Errors[len(row.Errors)-1]
		if last.Attempt != row.Attempt || last.Error != f.Error || last.Trace != f.Trace {
			return "", false, nil
		}
		// The state outcome decides for this failure (a failure leaves
		// the attempt number as it was).
		want := driver.StateRetryable
		switch {
		case f.Cancel:
			want = driver.StateCancelled
		case row.Attempt >= row.MaxAttempts:
			want = driver.StateDiscarded
		}
		ok := row.State == want || (want == driver.StateRetryable && row.State == driver.StateAvailable)
		return want, ok, nil
	}
	return "", false, fmt.Errorf("conveyor: unknown remote outcome kind %d", kind)
}

// ReleaseRemote gives a remote worker's job back without counting the
// attempt (a worker shutting down), fenced, and wakes the queue's
// waiting claims.
func (e *Engine) ReleaseRemote(ctx context.Context, id, fence int64) error {
	if e.isClosed() {
		return ErrStopped
	}
	queue := e.remote.queueOf(id)
	n, err := e.drv.Release(ctx, []driver.Lease{{ID: id, Fence: fence}})
	if err != nil {
		return err
	}
	e.remote.done(id, fence)
	if n != 1 {
		return ErrLeaseLost
	}
	e.metrics.Released.Add(n)
	if queue == "" {
		if row, err := e.drv.GetJob(ctx, id); err == nil {
			queue = row.Queue
		}
	}
	if queue != "" {
		e.wake(queue)
		if e.limited(queue) {
			e.slotFreed(queue)
		}
	}
	return nil
}

// waiters wakes waiting remote claims of a queue: engine.wake notifies
// it with the fetchers. A queue's entry lives while a claim waits on it.
type waiters struct {
	mu sync.Mutex
	ch map[string]*waiting
}

// waiting is the channel the claims waiting on one queue share, and how
// many hold it.
type waiting struct {
	ch chan struct{}
	n  int
}

func newWaiters() *waiters { return &waiters{ch: map[string]*waiting{}} }

// wait returns a channel closed at the next notify of queue, and the
// function that ends the wait (call it once).
func (w *waiters) wait(queue string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	x := w.ch[queue]
	if x == nil {
		x = &waiting{ch: make(chan struct{})}
		w.ch[queue] = x
	}
	x.n++
	return x.ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if x.n--; x.n == 0 && w.ch[queue] == x {
			delete(w.ch, queue)
		}
	}
}

// notify wakes every claim waiting on queue, every waiting claim when
// queue is "".
func (w *waiters) notify(queue string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if queue != "" {
		if x := w.ch[queue]; x != nil {
			close(x.ch)
			delete(w.ch, queue)
		}
		return
	}
	for q, x := range w.ch {
		close(x.ch)
		delete(w.ch, q)
	}
}
