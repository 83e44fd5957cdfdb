// Package engine runs conveyor inside one process: one fetcher per queue,
// one completer that batches acknowledgements, one inserter that coalesces
// enqueues into multi-row inserts (group commit), one heartbeat loop for all
// running jobs, one listener, and maintenance loops run by an elected
// leader. Workers never touch the database; they wait on in-process
// channels (docs/lessons.md, lessons 1 to 3).
package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Handler runs one job. The engine decodes nothing: the public package
// wraps typed workers into Handlers.
type Handler func(ctx context.Context, row *driver.JobRow) error

// SnoozeError, returned by a handler (wrapped or not), puts the job back
// to run again after For without counting the attempt: the job becomes
// scheduled, its attempt given back. Its fence token is not given back,
// so a late acknowledgement of the snoozed attempt is refused.
type SnoozeError struct{ For time.Duration }

// Error says how long the job was snoozed for.
func (s *SnoozeError) Error() string { return "job snoozed for " + s.For.String() }

// ErrCancelJob, wrapped in a handler's error, cancels the job without retry.
var ErrCancelJob = errors.New("job cancelled by its handler")

// ErrStopped is returned by calls made after Close.
var ErrStopped = errors.New("conveyor: client is closed")

// errShutdown is the cause given to job contexts cancelled by Stop.
var errShutdown = errors.New("conveyor: client shutting down")

// errLeaseLost is the cause given to job contexts whose lease was lost.
var errLeaseLost = errors.New("conveyor: job lease lost (cancelled or discarded by hand, rescued, or taken by another attempt)")

// errLeaseDeadline is the cause given to job contexts cancelled because
// their lease could not be renewed in time: the handler must stop before
// the lease can expire and another process take the job.
var errLeaseDeadline = errors.New(MsgLeaseDeadline)

// MsgLeaseDeadline is the message of the cause given to a job's context
// when its lease could not be renewed in time. The attempt's error entry
// starts with it when the handler returned the cause, and ends with it in
// parentheses when the handler returned an error of its own (see runJob).
// The torture suite's checker recognises such attempts by it.
const MsgLeaseDeadline = "conveyor: job lease could not be renewed in time; handler cancelled before the lease could expire"

// Config is the engine's configuration, filled with defaults by the public
// package (the one place defaults live).
type Config struct {
	Queues             map[string]int // queue -> max concurrent jobs
	ClaimBatch         int
	CompleteBatch      int
	InsertBatch        int
	Lease              time.Duration
	HeartbeatInterval  time.Duration
	JobTimeout         time.Duration // <=0: none
	PollMin            time.Duration
	PollMax            time.Duration
	ListenPoll         time.Duration // fallback poll when listening
	PromoteInterval    time.Duration
	RescueInterval     time.Duration
	PruneInterval      time.Duration
	CompletedRetention time.Duration
	DiscardedRetention time.Duration
	ShutdownTimeout    time.Duration
	Backoff            func(attempt int) time.Duration
	// Kinds holds the settings of kinds that override JobTimeout or
	// Backoff, by kind; a kind absent, or a zero field, takes the
	// engine-wide one. New copies it; SetKind adds one later.
	Kinds map[string]KindConfig
	// Logger receives warnings (database errors being retried, leases
	// lost) and one record per failed attempt; nil discards them.
	Logger *slog.Logger
	// FailedAttemptLevel is the level of the record logged for each
	// failed attempt. Successful attempts are not logged.
	FailedAttemptLevel slog.Level
	// ProcessInterval is how often a started engine refreshes its row in
	// the processes table (it registers at Start and removes the row at
	// Stop); 0 registers nothing. ProcessTTL is how long the row counts
	// as alive after each refresh, and ProcessPruneAge how long after
	// expiring the maintenance leader deletes a row (a process that died
	// without stopping).
	ProcessInterval, ProcessTTL, ProcessPruneAge time.Duration
	// SchedulePruneAge is how long after the last record or touch of a
	// periodic schedule's row (driver.TouchSchedules: every started
	// process touches the schedules it has, far more often) the
	// maintenance leader deletes the row, at its prune interval; 0
	// deletes none.
	SchedulePruneAge time.Duration
	// BatchFireBackoff is how long the maintenance leader waits before
	// trying again a batch whose callback could not be enqueued, doubled
	// at each failure in a row up to BatchFireBackoffMax (see
	// fireBackoff); 0 tries it again at every round.
	BatchFireBackoff, BatchFireBackoffMax time.Duration
	// Version is the conveyor version recorded with the process's row.
	Version string
}

// KindConfig is one kind's own settings, overriding the engine-wide ones
// for its jobs.
type KindConfig struct {
	// Timeout replaces Config.JobTimeout for jobs of the kind that have no
	// timeout of their own (JobRow.TimeoutMS 0); negative means none, zero
	// takes Config.JobTimeout.
	Timeout time.Duration
	// Backoff replaces Config.Backoff for the kind; nil takes it.
	Backoff func(attempt int) time.Duration
}

// Metrics are process-wide counters.
type Metrics struct {
	ClaimRounds   atomic.Int64 // claim statements issued
	OutcomeRounds atomic.Int64 // outcome statements written (each a batch)
	InsertRounds  atomic.Int64 // group-commit insert transactions
	// SelfNotices counts wake-up notifications of this process's own
	// inserts that the listener passed over (see selfNotes).
	SelfNotices atomic.Int64
	Claimed     atomic.Int64
	// ClaimedAtInsert counts the jobs of Claimed that this process's own
	// inserts claimed (insertclaim.go).
	ClaimedAtInsert  atomic.Int64
	Completed        atomic.Int64
	Failed           atomic.Int64
	Snoozed          atomic.Int64
	StaleAcksRefused atomic.Int64
	LeasesLost       atomic.Int64
	// LeaseDeadlines counts handlers cancelled because their lease could
	// not be renewed in time (see Engine.leaseMargin).
	LeaseDeadlines atomic.Int64
	Released       atomic.Int64
	Rescued        atomic.Int64
	Promoted       atomic.Int64
	Pruned         atomic.Int64
	DBErrors       atomic.Int64
}

// Engine is one process's share of the queue.
type Engine struct {
	drv      driver.Driver
	cfg      Config
	id       string
	host     string
	handlers map[string]Handler

	metrics Metrics

	ins *inserter
	// self counts the notifications of this process's own inserts that
	// the listener passes over (selfnotify.go).
	self selfNotes
	// comp writes outcomes. A started engine's fetchers hold the one made
	// at Start until Stop closes it; remote outcomes use the current one,
	// made anew when needed (completer).
	comp *completer
	// waiters wakes waiting remote claims, remote tracks remote workers
	// for the processes table, listen holds the one listener (remote.go).
	waiters *waiters
	remote  *remoteProcs
	listen  listening

	stopMu   sync.Mutex // held for the whole of Start and of Stop
	mu       sync.Mutex
	started  bool
	closed   bool
	fetchers map[string]*fetcher

	// runCtx lives from Start to the end of Stop (maintenance, fetchers,
	// heartbeat); workCtx is the parent of job contexts.
	runCancel  context.CancelFunc
	workCancel context.CancelCauseFunc
	fetchWG    sync.WaitGroup
	loopWG     sync.WaitGroup
	jobWG      sync.WaitGroup
	stopping   atomic.Bool
	// reserveMu orders the workers reserved for jobs claimed at insert
	// (reserveWorkers, which counts them in jobWG) before Stop sets
	// stopping and waits for jobWG.
	reserveMu sync.Mutex
	// ic is the driver as an InsertClaimer, nil when its inserts cannot
	// claim (see reserveWorkers).
	ic driver.InsertClaimer
	// oneWriter is the driver's Capabilities().OneWriter (see aheadN).
	oneWriter bool
	// aheadRun is aheadMaxRun; tests whose handlers are short but whose
	// machine may be too loaded to time them so raise it.
	aheadRun time.Duration
	// keyedIC is the driver's Capabilities().KeyedInsertClaim: its
	// inserts may claim jobs of queues limited only per key.
	keyedIC bool
	// leaser is the driver as a SlotLeaser, nil when it cannot lease a
	// queue's slots in blocks (blocks.go); blockMu serializes the calls.
	leaser  driver.SlotLeaser
	blockMu sync.Mutex

	// hbWake asks the heartbeat loop to renew at once (cap 1).
	hbWake chan struct{}
	// slowRenewal is OnSlowRenewal's hook, lateClaim OnLateClaim's
	// (loops.go).
	slowRenewal atomic.Pointer[func(SlowRenewal)]
	lateClaim   atomic.Pointer[func(LateClaim)]

	// kinds is Config.Kinds, replaced whole by SetKind (copy on write):
	// remote workers' outcomes read it whether or not the engine is
	// started, while the public package may still add workers.
	kinds atomic.Pointer[map[string]KindConfig]

	// limits caches which queues are limited (limits.go); limitsMu
	// orders its writers, limitsLoopState runs its refresh.
	limits          atomic.Pointer[limitCache]
	limitsMu        sync.Mutex
	limitsLoopState limitsRefresher
	// limitsRead is closed once the first read of the limits answered
	// (or failed).
	limitsRead chan struct{}
	limitsOnce sync.Once
	// claimGates holds a gate per queue while a claim or a change of
	// limits uses it: a claim of the queue holds it read-locked from its
	// choice of statement by the limits cache until its statements
	// returned, and LimitsChanged write-locks it once (see lockClaims).
	claimGates gates
}

// New creates an engine. Enqueueing works at once; Start runs workers.
func New(drv driver.Driver, cfg Config, handlers map[string]Handler) *Engine {
	var b [4]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	e := &Engine{
		drv:      drv,
		cfg:      cfg,
		id:       fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		host:     host,
		handlers: handlers,
		fetchers: map[string]*fetcher{},
		hbWake:   make(chan struct{}, 1),
		waiters:  newWaiters(),

		limitsRead: make(chan struct{}),
	}
	e.ic, _ = drv.(driver.InsertClaimer)
	e.oneWriter = drv.Capabilities().OneWriter
	e.aheadRun = aheadMaxRun
	e.keyedIC = e.ic != nil && drv.Capabilities().KeyedInsertClaim
	e.leaser, _ = drv.(driver.SlotLeaser)
	e.ins = newInserter(e)
	e.remote = newRemoteProcs(e)
	kinds := make(map[string]KindConfig, len(cfg.Kinds))
	for k, v := range cfg.Kinds {
		kinds[k] = v
	}
	e.kinds.Store(&kinds)
	return e
}

// SetKind sets kind's own settings (KindConfig), replacing Config.Kinds'
// entry; safe while the engine runs.
func (e *Engine) SetKind(kind string, k KindConfig) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := *e.kinds.Load()
	kinds := make(map[string]KindConfig, len(old)+1)
	for n, v := range old {
		kinds[n] = v
	}
	kinds[kind] = k
	e.kinds.Store(&kinds)
}

// isClosed reports whether Close was called.
func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// completer returns the completer remote outcomes go to: the started
// engine's, or one made for them (closed by the next Stop or by Close);
// nil once the engine is closed.
func (e *Engine) completer() *completer {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	return e.completerLocked()
}

func (e *Engine) completerLocked() *completer {
	if e.comp == nil || e.comp.closed() {
		e.comp = newCompleter(e)
	}
	return e.comp
}

// ID identifies this process in attempted_by and leadership.
func (e *Engine) ID() string { return e.id }

// Metrics returns the engine's counters.
func (e *Engine) Metrics() *Metrics { return &e.metrics }

// warn logs a warning with attributes.
func (e *Engine) warn(msg string, args ...any) {
	if e.cfg.Logger != nil {
		e.cfg.Logger.Warn(msg, args...)
	}
}

// logFailure records one failed attempt: the job, its attempt, how long
// it ran, the error and what becomes of the job.
func (e *Engine) logFailure(row *driver.JobRow, ran time.Duration, o driver.Outcome, err error) {
	l := e.cfg.Logger
	if l == nil || !l.Enabled(context.Background(), e.cfg.FailedAttemptLevel) {
		return
	}
	l.Log(context.Background(), e.cfg.FailedAttemptLevel, "conveyor: job attempt failed",
		slog.Int64("job_id", row.ID), slog.String("kind", row.Kind), slog.String("queue", row.Queue),
		slog.Int("attempt", row.Attempt), slog.Int("max_attempts", row.MaxAttempts),
		slog.Duration("duration", ran), slog.String("error", err.Error()), slog.String("next_state", o.State))
}

// Start begins fetching and working the configured queues.
func (e *Engine) Start(ctx context.Context) error {
	e.stopMu.Lock() // a Start waits for a Stop under way
	defer e.stopMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrStopped
	}
	if e.started {
		return errors.New("conveyor: client already started")
	}
	e.started = true
	e.stopping.Store(false)
	runCtx, runCancel := context.WithCancel(context.WithoutCancel(ctx))
	workCtx, workCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	e.runCancel, e.workCancel = runCancel, workCancel
	comp := e.completerLocked()
	e.fetchers = map[string]*fetcher{}
	for q, n := range e.cfg.Queues {
		f := newFetcher(e, q, n, workCtx)
		f.comp = comp
		e.fetchers[q] = f
	}
	for _, f := range e.fetchers {
		f.startWorkers()
		e.fetchWG.Add(1)
		go func() { defer e.fetchWG.Done(); f.run(runCtx) }()
	}
	e.loopWG.Add(5)
	go func() { defer e.loopWG.Done(); e.heartbeatLoop(runCtx) }()
	go func() { defer e.loopWG.Done(); e.blockLoop(runCtx) }()
	go func() { defer e.loopWG.Done(); e.deadlineLoop(runCtx) }()
	go func() { defer e.loopWG.Done(); e.maintenanceLoop(runCtx) }()
	go func() { defer e.loopWG.Done(); e.processLoop(runCtx) }()
	if why := e.drv.Capabilities().NoListen; why != "" {
		e.warn("conveyor: notifications unavailable, polling for jobs of other processes", "reason", why,
			"poll_min", e.cfg.PollMin, "poll_max", e.cfg.PollMax)
	}
	e.listenAcquire()
	e.limitsAcquire()
	return nil
}

// Stop stops claiming, waits for running jobs until ctx ends or the
// shutdown timeout passes, then cancels their contexts; acknowledgements
// are flushed and jobs that did not finish are released, claimable again.
func (e *Engine) Stop(ctx context.Context) error {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	e.mu.Lock()
	if !e.started {
		e.mu.Unlock()
		return nil
	}
	e.started = false
	e.mu.Unlock()

	e.reserveMu.Lock()
	e.stopping.Store(true)
	e.reserveMu.Unlock()
	// 1. No more claims.
	for _, f := range e.fetchers {
		f.stopFetching()
	}
	e.fetchWG.Wait()
	// 2. Wait for running jobs, up to the deadline.
	done := make(chan struct{})
	go func() { e.jobWG.Wait(); close(done) }()
	timer := time.NewTimer(e.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-timer.C:
	}
	// 3. Cancel what is left and give handlers a moment to return.
	e.workCancel(errShutdown)
	select {
	case <-done:
	case <-time.After(time.Second):
	}
	// 4. Flush acknowledgements, then release every attempt still held
	// (handlers that ignore their context, and those that returned because
	// of the shutdown).
	for _, f := range e.fetchers {
		f.closeWorkers()
	}
	var comp *completer
	for _, f := range e.fetchers {
		comp = f.comp
	}
	if comp == nil { // no queues: the completer made at Start
		e.mu.Lock()
		comp = e.comp
		e.mu.Unlock()
	}
	if comp != nil {
		comp.close()
	}
	var leases []driver.Lease
	for _, f := range e.fetchers {
		leases = append(leases, f.takeAllLeases()...)
	}
	var err error
	if len(leases) > 0 {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var n int64
		n, err = e.drv.Release(rctx, leases)
		cancel()
		e.metrics.Released.Add(n)
		if err != nil {
			err = fmt.Errorf("conveyor: releasing %d unfinished jobs at shutdown (they will be rescued when their lease expires): %w", len(leases), err)
		}
	}
	e.runCancel()
	e.loopWG.Wait()
	// The blocks of limited queues' slots go back to the queues, now that
	// the block loop no longer renews them: every attempt run under them
	// has ended or was released. (Left to expire, they would hold the
	// slots for a lease and a rescue.)
	if e.leaser != nil {
		bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if berr := e.leaseBlocks(bctx, nil, true); berr != nil {
			e.warn("conveyor: giving back the blocks of limited queues' slots failed (they are given back when their lease expires)", "error", berr)
		}
		cancel()
	}
	e.listenRelease(0)
	e.limitsRelease(0)
	// 5. Leave the processes table (the loop that refreshed the row has
	// ended, so nothing registers it again). A row left behind by a
	// failure expires by itself.
	if e.cfg.ProcessInterval > 0 {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if rerr := e.drv.RemoveProcess(rctx, e.id); rerr != nil {
			e.warn("conveyor: removing this process from the processes table failed (its row expires by itself)", "error", rerr)
		}
		cancel()
	}
	return err
}

// Close stops the engine if started, flushes pending enqueues and closes
// the inserter. The driver is closed by the caller.
func (e *Engine) Close(ctx context.Context) error {
	err := e.Stop(ctx)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return err
	}
	e.closed = true
	comp := e.comp
	e.mu.Unlock()
	e.waiters.notify("")
	if comp != nil {
		comp.close() // remote outcomes of a client never started
	}
	e.listenClose()
	e.limitsClose()
	e.ins.close()
	return err
}

// wake nudges the fetcher of queue and wakes the remote claims waiting
// on it (all of them when queue is "").
func (e *Engine) wake(queue string) {
	e.waiters.notify(queue)
	e.mu.Lock()
	fs := e.fetchers
	e.mu.Unlock()
	if queue == "" {
		for _, f := range fs {
			f.nudge()
		}
		return
	}
	if f := fs[queue]; f != nil {
		f.nudge()
	}
	if e.keyLimited(queue) {
		// Held claims of a queue limited per key wait for a slot, but
		// the new job's key may have room.
		e.slotFreed(queue)
	}
}

// Wake nudges this process's fetcher of queue, if it has one, and the
// remote claims waiting on it.
func (e *Engine) Wake(queue string) { e.wake(queue) }

func (e *Engine) wakeAll(counts map[string]int) {
	for q, n := range counts {
		if n > 0 {
			e.wake(q)
		}
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errBackoff is the wait after a database error in a loop: 50ms doubling
// to 2s, with jitter.
func errBackoff(n int) time.Duration {
	d := 50 * time.Millisecond * time.Duration(1<<min(n, 6))
	d = min(d, 2*time.Second)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// DefaultBackoff is exponential with jitter: about 2^attempt seconds (from
// 1s), capped at 1 hour, drawn uniformly from [d/2, d].
func DefaultBackoff(attempt int) time.Duration {
	d := time.Duration(math.Min(math.Pow(2, float64(attempt-1)), 3600)) * time.Second
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// resultKey keys the *resultSlot of an attempt's context.
type resultKey struct{}

// resultSlot holds the result an attempt's handler set (SetResult).
type resultSlot struct {
	mu  sync.Mutex
	val json.RawMessage
}

// SetResult records v, already encoded and checked, as the result of the
// attempt whose handler's context is ctx; the last call wins. It reports
// false when ctx is not an attempt's context.
func SetResult(ctx context.Context, v json.RawMessage) bool {
	s, ok := ctx.Value(resultKey{}).(*resultSlot)
	if !ok {
		return false
	}
	s.mu.Lock()
	s.val = v
	s.mu.Unlock()
	return true
}

// get returns the result set, nil for none.
func (s *resultSlot) get() json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.val
}

// runJob executes one job's handler with its timeout, converting panics
// into errors with stack traces.
func (e *Engine) runJob(ctx context.Context, row *driver.JobRow) (err error, trace string) {
	h := e.handlers[row.Kind]
	if h == nil {
		return fmt.Errorf("unknown job kind %q: no worker registered for it in this client", row.Kind), ""
	}
	if timeout := e.timeout(row); timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, &timeoutError{timeout})
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("job panicked: %v", r)
			trace = string(debug.Stack())
		}
	}()
	err = h(ctx, row)
	if err == nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), errLeaseLost) {
		err = context.Cause(ctx)
	}
	if err != nil && ctx.Err() != nil {
		if c := context.Cause(ctx); c != nil && !errors.Is(err, c) {
			err = fmt.Errorf("%w (%v)", err, c)
		}
	}
	return err, trace
}

// timeoutError is the cause of a job context's cancellation at the
// job's timeout. Its message is formatted only when read: every job's
// context is given one, and few time out.
type timeoutError struct{ after time.Duration }

func (e *timeoutError) Error() string { return fmt.Sprintf("job timed out after %v", e.after) }

// timeout is the job's own timeout, else its kind's, else the engine's;
// 0 means none.
func (e *Engine) timeout(row *driver.JobRow) time.Duration {
	t := e.cfg.JobTimeout
	if k := (*e.kinds.Load())[row.Kind].Timeout; k != 0 {
		t = k
	}
	switch {
	case row.TimeoutMS > 0:
		return time.Duration(row.TimeoutMS) * time.Millisecond
	case row.TimeoutMS < 0 || t < 0:
		return 0
	}
	return t
}

// backoff is the wait before retrying row after its attempt failed: its
// kind's Backoff, else the engine's.
func (e *Engine) backoff(row *driver.JobRow) time.Duration {
	if b := (*e.kinds.Load())[row.Kind].Backoff; b != nil {
		return b(row.Attempt)
	}
	return e.cfg.Backoff(row.Attempt)
}

// storable makes an attempt's error text storable in the job's JSON list
// of errors on every backend: valid UTF-8 and no NUL character, which
// PostgreSQL's jsonb refuses (the whole outcome statement of the batch
// would fail, and be retried for ever).
func storable(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// outcome turns a handler's error and result into the outcome the
// completer writes; the result is kept only by a completion.
func (e *Engine) outcome(row *driver.JobRow, err error, trace string, result json.RawMessage) driver.Outcome {
	o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt}
	if err == nil {
		o.State = driver.StateCompleted
		o.Result = result
		return o
	}
	if sn := (*SnoozeError)(nil); errors.As(err, &sn) {
		o.State, o.RetryIn = driver.StateScheduled, max(sn.For, 0)
		return o
	}
	o.Err = &driver.AttemptError{Attempt: row.Attempt, At: time.Now().UTC(), Error: storable(err.Error()), Trace: storable(trace)}
	switch {
	case errors.Is(err, ErrCancelJob):
		o.State = driver.StateCancelled
	case row.Attempt >= row.MaxAttempts:
		o.State = driver.StateDiscarded
	default:
		o.State = driver.StateRetryable
		o.RetryIn = e.backoff(row)
	}
	return o
}
