package conveyor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/engine"
	"github.com/conveyorq/conveyor/internal/seam"
)

func init() {
	seam.DriverOf = func(c any) driver.Driver {
		return c.(interface{ driverOf() driver.Driver }).driverOf()
	}
	seam.EngineOf = func(c any) *engine.Engine {
		return c.(interface{ engineOf() *engine.Engine }).engineOf()
	}
	seam.WorkOne = func(ctx context.Context, c any, id int64) (*engine.Worked, error) {
		return c.(interface {
			workOne(context.Context, int64) (*engine.Worked, error)
		}).workOne(ctx, id)
	}
}

// workOne runs job id through its registered worker in the calling
// goroutine (engine.WorkOne), for package conveyortest through the seam.
// It is not a method applications see: it bypasses the queues'
// concurrency limits and the client's shutdown (docs/design.md).
func (c *Client[TTx]) workOne(ctx context.Context, id int64) (*engine.Worked, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	return c.eng.WorkOne(ctx, id)
}

// Client enqueues jobs and, once started, works the queues in its Config.
// It is safe for concurrent use. TTx is the transaction type of its
// driver, which EnqueueTx takes: pgx.Tx for driver/pgxv5, *sql.Tx for
// driver/sqlitedb and driver/mysqldb. A client from connect.Open, whose
// backend is known only at run time, is a Client[any] and checks the
// transaction's type when it is used.
type Client[TTx any] struct {
	cfg      Config
	drv      driver.Driver
	unwrap   func(TTx) any
	eng      *engine.Engine
	mu       sync.Mutex
	handlers map[string]engine.Handler
	periodic periodic
	started  bool
	schemaOK atomic.Bool
	maxArgs  int
}

// Driver is a database backend for New, built from the application's own
// handle by one of the driver packages: driver/pgxv5 (a *pgxpool.Pool),
// driver/sqlitedb (a *sql.DB on a SQLite file) or driver/mysqldb. The
// package connect opens one from a DSN instead. An application links only
// the driver packages it imports. TTx is the transaction type the
// driver's EnqueueTx takes, so that the compiler checks it.
type Driver[TTx any] interface {
	// Bind is called once, by New, with the client's table prefix; it
	// returns the backend conveyor's engine runs on. Applications do not
	// call it.
	Bind(ctx context.Context, opts driver.Options) (driver.Driver, error)
	// UnwrapTx returns the transaction in the form the backend takes.
	// Applications do not call it.
	UnwrapTx(tx TTx) any
}

// New returns a client on drv. Closing the client closes what conveyor
// opened itself (the lease path's connections, the listener) and leaves
// the application's handle open. New refuses a database whose schema is
// newer than this binary; a database that lacks migrations can be
// migrated with Client.Migrate.
func New[TTx any](ctx context.Context, drv Driver[TTx], cfg *Config) (*Client[TTx], error) {
	if drv == nil {
		return nil, errors.New("conveyor: New: nil Driver: build one with a driver package (driver/pgxv5, driver/sqlitedb, driver/mysqldb) or use connect.Open")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	d, err := drv.Bind(ctx, driver.Options{Prefix: c.TablePrefix})
	if err != nil {
		return nil, err
	}
	cl := &Client[TTx]{cfg: c, drv: d, unwrap: drv.UnwrapTx, handlers: map[string]engine.Handler{}, maxArgs: c.MaxArgsBytes}
	if m := d.Capabilities().MaxArgsBytes; m > 0 && m < cl.maxArgs {
		cl.maxArgs = m
	}
	if err := cl.checkSchema(ctx); err != nil && !errors.Is(err, ErrSchemaOutdated) {
		d.Close()
		return nil, err
	}
	ec := c.engineConfig()
	cl.eng = engine.New(d, ec, cl.handlers)
	return cl, nil
}

// driverOf is the seam to the backend, for the command and the tests.
func (c *Client[TTx]) driverOf() driver.Driver { return c.drv }

// engineOf is the seam to the engine, for package lab's hooks.
func (c *Client[TTx]) engineOf() *engine.Engine { return c.eng }

func (c *Client[TTx]) checkSchema(ctx context.Context) error {
	cur, latest, err := c.drv.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	switch {
	case cur > latest:
		return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaTooNew, cur, latest)
	case cur < latest:
		return fmt.Errorf("%w (database at version %d, binary needs %d)", ErrSchemaOutdated, cur, latest)
	}
	c.schemaOK.Store(true)
	return nil
}

func (c *Client[TTx]) ready(ctx context.Context) error {
	if c.schemaOK.Load() {
		return nil
	}
	return c.checkSchema(ctx)
}

// Migrate applies the embedded migrations that the database lacks and
// returns their versions; running it again applies nothing.
func (c *Client[TTx]) Migrate(ctx context.Context) ([]int, error) {
	applied, err := c.drv.Migrate(ctx)
	if err != nil {
		return applied, err
	}
	return applied, c.checkSchema(ctx)
}

// Backend names the database backend: "sqlite", "postgres" or "mysql".
func (c *Client[TTx]) Backend() string { return c.drv.Name() }

// Config returns the client's configuration with defaults filled in.
func (c *Client[TTx]) Config() Config { return c.cfg }

// Start begins working the configured queues with the registered workers
// and returns once they run; the work goes on in the background until Stop
// or Close.
//
// ctx bounds the start-up work only (the schema check, when New could not
// confirm the schema): if ctx is already done, Start returns its error and
// starts nothing. Cancelling ctx after Start returned does not stop the
// client; call Stop. The values of ctx (trace ids, loggers) are passed on
// to every job's context, whose cancellation is conveyor's own (job
// timeout, Stop, a lost lease).
//
// Start fails on a client that is already started, and with ErrClosed on
// one that was closed.
func (c *Client[TTx]) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	if err := c.eng.Start(ctx); err != nil {
		return err
	}
	c.startPeriodic()
	return nil
}

// Stop stops claiming jobs, waits for running jobs until ctx ends or
// Config.ShutdownTimeout passes, then cancels their contexts. Jobs that did
// not finish are made available again; nothing is lost. The client can
// still enqueue after Stop.
func (c *Client[TTx]) Stop(ctx context.Context) error {
	c.stopPeriodic()
	err := c.eng.Stop(ctx)
	c.mu.Lock()
	c.started = false
	c.mu.Unlock()
	return err
}

// Close stops the client (as Stop, bounded by Config.ShutdownTimeout),
// waits for pending enqueues and closes the database connections.
func (c *Client[TTx]) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	defer cancel()
	c.stopPeriodic()
	err := c.eng.Close(ctx)
	return errors.Join(err, c.drv.Close())
}

// itemError is the refusal of one job of several enqueued at once, by
// its place among them; batches and workflows rename it after their own
// jobs.
type itemError struct {
	index, count int
	err          error
}

func (e *itemError) Error() string { return fmt.Sprintf("job %d of %d: %v", e.index, e.count, e.err) }
func (e *itemError) Unwrap() error { return e.err }

// ownTxError words the error of a write of n jobs in a transaction of the
// driver's own (EnqueueBulk, EnqueueBatch, EnqueueWorkflow) as the
// group-commit writer words its callers': none was inserted when the
// driver knows nothing was committed, else they may exist (the connection
// was lost while committing).
func ownTxError(n int, err error) error {
	switch {
	case err == nil:
		return nil
	case driver.IsNotCommitted(err):
		return fmt.Errorf("conveyor: enqueue of %d job(s) failed, none was inserted: %w", n, err)
	}
	return engine.Unconfirmed(fmt.Errorf("conveyor: enqueue of %d job(s) failed before the commit was confirmed, so they may exist: %w", n, err))
}

func (c *Client[TTx]) params(items []EnqueueItem) ([]driver.InsertParams, error) {
	c.mu.Lock()
	checkKinds := len(c.handlers) > 0 && !c.cfg.AllowUnregisteredKinds
	c.mu.Unlock()
	out := make([]driver.InsertParams, len(items))
	for i, it := range items {
		p, err := c.param(it.Args, it.Opts, checkKinds)
		if err != nil {
			if len(items) > 1 {
				err = &itemError{index: i, count: len(items), err: err}
			}
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

func (c *Client[TTx]) param(args JobArgs, o *EnqueueOpts, checkKinds bool) (driver.InsertParams, error) {
	if args == nil {
		return driver.InsertParams{}, fmt.Errorf("%w: nil args", ErrInvalidArgs)
	}
	kind := args.Kind()
	if err := checkKind(kind); err != nil {
		return driver.InsertParams{}, err
	}
	if checkKinds {
		c.mu.Lock()
		_, ok := c.handlers[kind]
		c.mu.Unlock()
		if !ok {
			return driver.InsertParams{}, fmt.Errorf("%w: %q has no worker registered on this client (set Config.AllowUnregisteredKinds if another service works it)", ErrUnknownKind, kind)
		}
	}
	resolved := resolveOpts(args, o)
	o = &resolved
	p := driver.InsertParams{Queue: o.Queue, Kind: kind, Priority: o.Priority, MaxAttempts: o.MaxAttempts, RunAt: o.RunAt, Delay: o.Delay}
	if p.Queue == "" {
		p.Queue = DefaultQueue
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = c.cfg.MaxAttempts
	}
	switch {
	case checkQueue(p.Queue) != nil:
		return p, checkQueue(p.Queue)
	case p.Priority < MinPriority || p.Priority > MaxPriority:
		return p, fmt.Errorf("%w: priority %d out of range %d..%d", ErrInvalidOpts, p.Priority, MinPriority, MaxPriority)
	case p.MaxAttempts < 1 || p.MaxAttempts > maxAttemptsLimit:
		return p, fmt.Errorf("%w: max attempts %d out of range 1..%d", ErrInvalidOpts, p.MaxAttempts, maxAttemptsLimit)
	case p.Delay < 0 || p.Delay > maxDelay:
		return p, fmt.Errorf("%w: delay %v out of range 0..%v", ErrInvalidOpts, p.Delay, maxDelay)
	case !p.RunAt.IsZero() && (p.RunAt.Year() < 2000 || time.Until(p.RunAt) > maxDelay):
		return p, fmt.Errorf("%w: run-at %v is not between year 2000 and %v from now", ErrInvalidOpts, p.RunAt, maxDelay)
	case o.Timeout > maxTimeout:
		return p, fmt.Errorf("%w: timeout %v over the %v limit", ErrInvalidOpts, o.Timeout, maxTimeout)
	case len(o.Key) > MaxKeyBytes:
		return p, fmt.Errorf("%w: key is %d bytes, over the %d-byte limit", ErrInvalidOpts, len(o.Key), MaxKeyBytes)
	case !utf8.ValidString(o.Key) || strings.ContainsRune(o.Key, 0):
		return p, fmt.Errorf("%w: key %q is not UTF-8 without NUL characters", ErrInvalidOpts, o.Key)
	}
	p.Key = o.Key
	switch {
	case o.Timeout < 0:
		p.TimeoutMS = -1
	case o.Timeout > 0:
		p.TimeoutMS = max(1, o.Timeout.Milliseconds())
	}
	var err error
	if p.Meta, err = encodeMetadata(o.Metadata, o.reserved); err != nil {
		return p, err
	}
	if p.Args, err = encodeArgs(args, c.maxArgs); err != nil {
		return p, err
	}
	if o.Unique != nil {
		due := p.RunAt
		if due.IsZero() {
			due = time.Now().Add(p.Delay)
		}
		p.UniqueKey, p.UniqueKeep, err = uniqueKey(kind, p.Queue, p.Args, due, o.Unique)
	}
	return p, err
}

// Enqueue inserts one job and returns its id once it is committed.
// Concurrent calls are coalesced into multi-row inserts (group commit),
// and each is told what happened to its own job: its id once committed,
// or an error. An error says either that the job was not inserted (for
// example a row the database refused, of this call or of another coalesced
// with it: each call is then written again on its own), or, when the
// connection was lost while committing, that it may exist. For a unique
// job (EnqueueOpts.Unique) whose key is held, nothing is inserted and the
// holder's id is returned; EnqueueMany says which jobs were such
// duplicates.
func (c *Client[TTx]) Enqueue(ctx context.Context, args JobArgs, opts *EnqueueOpts) (int64, error) {
	rs, err := c.EnqueueMany(ctx, []EnqueueItem{{Args: args, Opts: opts}})
	if err != nil {
		return 0, err
	}
	if len(rs) != 1 {
		return 0, fmt.Errorf("conveyor: enqueue: the enqueue middleware passed on %d jobs for 1", len(rs))
	}
	return rs[0].ID, nil
}

// EnqueueMany inserts jobs in one transaction and returns one result per
// job, in order: its id, and whether it was a unique job whose key was
// held (then nothing was inserted for it and the id is the holder's). All
// of the jobs are committed or none: nothing is inserted if any job is
// invalid or refused by the database. Plain jobs are one statement; unique
// jobs add their own statements to the same transaction. Concurrent calls
// are coalesced as Enqueue's, and told the same way.
func (c *Client[TTx]) EnqueueMany(ctx context.Context, items []EnqueueItem) ([]EnqueueResult, error) {
	var rs []EnqueueResult
	err := c.enqueueThrough(ctx, items, func(ctx context.Context, ps []driver.InsertParams) (err error) {
		if err := sameCount(len(ps), len(items)); err != nil {
			return err
		}
		rs, err = results(c.eng.Insert(ctx, ps))
		return err
	})
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// sameCount refuses, before anything is written, an enqueue whose
// middleware passed on got jobs for the want given, when the call returns
// one result per job given.
func sameCount(got, want int) error {
	if got == want {
		return nil
	}
	return fmt.Errorf("conveyor: enqueue: the enqueue middleware passed on %d jobs for %d; nothing was inserted (the call returns one result per job given)", got, want)
}

// results pairs ids and duplicate flags.
func results(ids []int64, dup []bool, err error) ([]EnqueueResult, error) {
	if err != nil {
		return nil, err
	}
	rs := make([]EnqueueResult, len(ids))
	for i := range ids {
		rs[i] = EnqueueResult{ID: ids[i], Duplicate: dup[i]}
	}
	return rs, nil
}

// EnqueueTx inserts one job inside the caller's transaction, of the
// driver's type TTx: a pgx.Tx with driver/pgxv5, a *sql.Tx on the same
// database with driver/sqlitedb and driver/mysqldb (on SQLite, begun on
// the handle the driver was built on; sqlitedb.Driver.BeginTx begins one
// that lets lease renewals go first). A Client[any] from connect.Open
// takes a pgx.Tx or *sql.Tx on PostgreSQL and a *sql.Tx elsewhere, and
// refuses anything else with ErrTxType. The job exists if and only if
// that transaction commits, and no worker sees it before. On PostgreSQL
// the commit wakes workers at once; elsewhere they see it at their next
// poll (Config.PollMax at most).
// A unique job whose key is held (by a committed job, or one of this
// transaction) returns the holder's id; one whose key another open
// transaction is inserting waits for that transaction to end.
func (c *Client[TTx]) EnqueueTx(ctx context.Context, tx TTx, args JobArgs, opts *EnqueueOpts) (int64, error) {
	rs, err := c.EnqueueManyTx(ctx, tx, []EnqueueItem{{Args: args, Opts: opts}})
	if err != nil {
		return 0, err
	}
	if len(rs) != 1 {
		return 0, fmt.Errorf("conveyor: enqueue: the enqueue middleware passed on %d jobs for 1", len(rs))
	}
	return rs[0].ID, nil
}

// EnqueueManyTx inserts jobs inside the caller's transaction, as EnqueueTx,
// with one result per job as EnqueueMany.
func (c *Client[TTx]) EnqueueManyTx(ctx context.Context, tx TTx, items []EnqueueItem) ([]EnqueueResult, error) {
	var rs []EnqueueResult
	err := c.enqueueThrough(ctx, items, func(ctx context.Context, ps []driver.InsertParams) (err error) {
		if err := sameCount(len(ps), len(items)); err != nil {
			return err
		}
		rs, err = results(c.eng.InsertTx(ctx, c.unwrap(tx), ps))
		return driver.ForeignTx(c.drv.Name(), err)
	})
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// EnqueueBulk streams many jobs in one transaction (COPY on PostgreSQL,
// large multi-row inserts elsewhere) and returns how many were inserted:
// all of them or none. Use it for loading thousands of jobs at once; ids
// are not returned. Unique jobs are inserted as EnqueueMany inserts them
// (plain jobs then too, in the same transaction, without COPY), and only
// those inserted are counted. An error says, as Enqueue's, that none was
// inserted or that they may exist.
func (c *Client[TTx]) EnqueueBulk(ctx context.Context, items []EnqueueItem) (int64, error) {
	var n int64
	err := c.enqueueThrough(ctx, items, func(ctx context.Context, ps []driver.InsertParams) (err error) {
		if len(ps) == 0 { // the middleware passed on none
			return nil
		}
		n, err = c.eng.BulkInsert(ctx, ps)
		return ownTxError(len(ps), err)
	})
	return n, err
}

// Job returns one job by id (ErrNotFound if there is none).
func (c *Client[TTx]) Job(ctx context.Context, id int64) (*JobInfo, error) {
	r, err := c.drv.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	return jobInfo(r), nil
}

// JobFilter selects jobs for Jobs. Zero fields match everything.
type JobFilter struct {
	// States to include; empty means all. Jobs refuses a state that is not
	// one of JobStates().
	States []JobState
	// Queue, when set, lists only that queue's jobs. Jobs refuses a name
	// that breaks the queue name rule (as enqueue does).
	Queue string
	// Kind, when set, lists only jobs of that kind. Jobs refuses a name
	// that breaks the kind name rule (as enqueue does).
	Kind string
	// Limit on jobs returned; default 100.
	Limit int
	// AfterID returns only jobs with a greater id, for paging.
	AfterID int64
	// BeforeID, when positive, returns only jobs with a smaller id: the
	// cursor of a newest-first list (Desc), whose next page is read
	// with BeforeID set to its last job's id.
	BeforeID int64
	// Desc lists newest first (descending id); Limit then keeps the
	// highest ids within AfterID and BeforeID.
	Desc bool
}

// Jobs lists jobs by id, ascending unless f.Desc. An unknown state in
// f.States is an error that names it and lists the valid states; a
// Queue or Kind that no job can have (a name enqueue would refuse) is
// an error naming it (ErrInvalidOpts for errors.Is), not an empty list.
func (c *Client[TTx]) Jobs(ctx context.Context, f JobFilter) ([]*JobInfo, error) {
	df, err := f.driverFilter()
	if err != nil {
		return nil, err
	}
	return jobInfos(c.drv.ListJobs(ctx, df))
}

// JobsTx lists jobs as Jobs does, inside the caller's transaction (of a
// type EnqueueTx accepts): it sees the jobs that transaction enqueued
// before it commits, which no other transaction sees. Tests use it to
// check what a transaction enqueued (package conveyortest); applications
// to read jobs consistently with their own data.
func (c *Client[TTx]) JobsTx(ctx context.Context, tx TTx, f JobFilter) ([]*JobInfo, error) {
	df, err := f.driverFilter()
	if err != nil {
		return nil, err
	}
	return jobInfos(c.drv.ListJobsTx(ctx, c.unwrap(tx), df))
}

// driverFilter checks f's states, queue and kind and returns it as the
// driver takes it.
func (f JobFilter) driverFilter() (driver.JobFilter, error) {
	df := driver.JobFilter{Queue: f.Queue, Kind: f.Kind, Limit: f.Limit, AfterID: f.AfterID, BeforeID: f.BeforeID, Desc: f.Desc}
	if f.Queue != "" && ValidQueueName(f.Queue) != nil {
		return df, filterNameError{field: "queue", name: f.Queue, re: nameRE.String()}
	}
	if f.Kind != "" && ValidKindName(f.Kind) != nil {
		return df, filterNameError{field: "kind", name: f.Kind, re: kindRE.String()}
	}
	for _, s := range f.States {
		if !s.valid() {
			return df, unknownState(string(s))
		}
		df.States = append(df.States, string(s))
	}
	return df, nil
}

// jobInfos converts a driver's list of jobs.
func jobInfos(rows []*driver.JobRow, err error) ([]*JobInfo, error) {
	if err != nil {
		return nil, err
	}
	out := make([]*JobInfo, len(rows))
	for i, r := range rows {
		out[i] = jobInfo(r)
	}
	return out, nil
}

// Retry makes a discarded, cancelled, completed, retryable or scheduled job
// available now, granting one more attempt if all were used. A finished
// unique job whose key another job took meanwhile is not retried: the
// error wraps ErrUniqueConflict (a *UniqueConflictError naming the
// holder) and the job is left as it was; retry it once the holder has
// finished.
func (c *Client[TTx]) Retry(ctx context.Context, id int64) (*JobInfo, error) {
	return c.admin(ctx, id, c.drv.Retry)
}

// Cancel cancels a job that has not finished. A running attempt's result
// is then refused.
func (c *Client[TTx]) Cancel(ctx context.Context, id int64) (*JobInfo, error) {
	return c.admin(ctx, id, c.drv.Cancel)
}

// Discard discards a job that has not finished.
func (c *Client[TTx]) Discard(ctx context.Context, id int64) (*JobInfo, error) {
	return c.admin(ctx, id, c.drv.Discard)
}

func (c *Client[TTx]) admin(ctx context.Context, id int64, f func(context.Context, int64) (*driver.JobRow, error)) (*JobInfo, error) {
	r, err := f(ctx, id)
	if err != nil {
		// The backends' errors name the job ("cancel job 7: job not
		// found"); one that does not gets it here, never twice.
		if !strings.Contains(err.Error(), fmt.Sprintf("job %d:", id)) {
			err = fmt.Errorf("job %d: %w", id, err)
		}
		return nil, err
	}
	if r.State == driver.StateAvailable {
		c.eng.Wake(r.Queue)
	}
	return jobInfo(r), nil
}

// QueueStats are one queue's counts.
type QueueStats struct {
	// Queue names the queue.
	Queue string `json:"queue"`
	// Counts by state; every state of JobStates() is present.
	Counts map[JobState]int64 `json:"counts"`
	// OldestAvailable is the age of the oldest job waiting to run.
	OldestAvailable time.Duration `json:"oldest_available_ns"`
	// AwaitingDependencies is the number of jobs of the queue waiting for
	// their dependencies: the callbacks of batches (EnqueueBatch) and the
	// jobs of workflows (EnqueueWorkflow) not enqueued yet because a job
	// they wait for has not finished. They are in no state of Counts
	// until they are enqueued. A queue with only such jobs is listed.
	AwaitingDependencies int64 `json:"awaiting_dependencies"`
	// PausedAt is when the queue was paused (PauseQueue); zero when it is
	// not paused.
	PausedAt time.Time `json:"paused_at"`
	// Limits are the queue's flow limits (SetQueueLimits); nil when it
	// has none.
	Limits *QueueLimits `json:"limits,omitempty"`
	// LimitUse is how much of Limits is in use; nil without Limits.
	LimitUse *LimitUse `json:"limit_use,omitempty"`
	// Held says why the queue's available jobs are not being started
	// although workers may be free: HeldByPause, HeldByConcurrency or
	// HeldByRate; "" when nothing holds them (they wait for a worker, or
	// there are none).
	Held string `json:"held,omitempty"`
}

// Stats are the queues' counts and this process's counters.
type Stats struct {
	// Queues holds one entry per queue that has jobs or is paused, in no
	// set order. From Overview: one per queue that has unfinished jobs,
	// jobs finished since FinishedSince, or is paused.
	Queues []QueueStats `json:"queues"`
	// FinishedSince is zero from Stats, whose counts cover every job in
	// the table. From Overview it is the since given: the finished states
	// (completed, discarded, cancelled) count only the jobs finished at
	// or after it.
	FinishedSince time.Time `json:"finished_since,omitzero"`
	// Counters are this client's process counters, as Client.Counters
	// returns them.
	Counters Counters `json:"counters"`
}

// Stats returns per-queue counts of every job in the table and this
// process's counters. It groups the whole jobs table by queue and state,
// so its cost grows with the table (about a second per million jobs):
// for a view refreshed often, such as a dashboard, use Overview.
func (c *Client[TTx]) Stats(ctx context.Context) (*Stats, error) {
	qs, err := c.drv.Stats(ctx)
	if err != nil {
		return nil, err
	}
	return c.withPaused(ctx, qs, time.Time{})
}

// Overview returns the counts of Stats at a cost bounded by the
// unfinished jobs and the recently finished ones rather than by the
// table: the unfinished states (available, scheduled, retryable,
// running) and OldestAvailable are exact, read through the indexes the
// engine claims, promotes and rescues by; the finished states count only
// the jobs finished at or after since (by the database's clock, read
// through the index pruning uses), and Stats.FinishedSince says so.
// Queues are listed when they have unfinished jobs, jobs finished since
// since, or are paused. since must not be zero.
func (c *Client[TTx]) Overview(ctx context.Context, since time.Time) (*Stats, error) {
	if since.IsZero() {
		return nil, errors.New("conveyor: Overview: since is zero (Stats counts every finished job)")
	}
	qs, err := c.drv.Overview(ctx, since)
	if err != nil {
		return nil, err
	}
	return c.withPaused(ctx, qs, since)
}

// withPaused adds to the counts of Stats or Overview the paused and the
// limited queues (listed even without jobs), each queue's limits and
// their use, and why its available jobs wait (Held).
func (c *Client[TTx]) withPaused(ctx context.Context, qs []driver.QueueStats, since time.Time) (*Stats, error) {
	paused, err := c.drv.PausedQueues(ctx)
	if err != nil {
		return nil, err
	}
	usage, err := c.drv.LimitUsage(ctx)
	if err != nil {
		return nil, err
	}
	s := &Stats{Counters: c.Counters(), FinishedSince: since}
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		counts := make(map[JobState]int64, len(q.Counts))
		for st, n := range q.Counts {
			counts[JobState(st)] = n
		}
		s.Queues = append(s.Queues, QueueStats{Queue: q.Queue, Counts: counts, OldestAvailable: q.OldestAvailable, AwaitingDependencies: q.AwaitingDependencies})
		seen[q.Queue] = true
	}
	// Paused and limited queues are listed even without jobs.
	for name := range paused {
		if !seen[name] {
			s.Queues = append(s.Queues, QueueStats{Queue: name, Counts: zeroCounts()})
			seen[name] = true
		}
	}
	for name := range usage {
		if !seen[name] {
			s.Queues = append(s.Queues, QueueStats{Queue: name, Counts: zeroCounts()})
			seen[name] = true
		}
	}
	for i := range s.Queues {
		q := &s.Queues[i]
		q.PausedAt = paused[q.Queue]
		u, limited := usage[q.Queue]
		if limited {
			l := QueueLimits(u.Limits)
			q.Limits = &l
			q.LimitUse = &LimitUse{Running: u.Running, Started: u.Started, NextStart: u.NextStart, KeysRunning: u.KeysRunning, KeyHeld: u.KeyHeld, KeysRated: u.KeysRated}
		}
		switch {
		case q.Counts[JobStateAvailable] == 0:
		case !q.PausedAt.IsZero():
			q.Held = HeldByPause
		case limited && u.Limits.MaxRunning > 0 && u.Running >= u.Limits.MaxRunning:
			q.Held = HeldByConcurrency
		case limited && u.Limits.Rate > 0 && u.Started >= u.Limits.Rate:
			q.Held = HeldByRate
		case limited && u.KeyHeld > 0 && u.KeyHeld >= q.Counts[JobStateAvailable]:
			q.Held = HeldByKey
		}
	}
	return s, nil
}

// zeroCounts is the counts of a queue without jobs: every state, 0.
func zeroCounts() map[JobState]int64 {
	counts := make(map[JobState]int64, len(driver.AllStates))
	for _, st := range driver.AllStates {
		counts[JobState(st)] = 0
	}
	return counts
}

// PauseQueue pauses queue in every process working it on this database:
// no claim that starts after PauseQueue returns takes a job of the queue,
// running jobs finish, and enqueues still succeed (the jobs wait). The
// pause is stored in the database, so it outlasts restarts, and it holds
// until ResumeQueue. Pausing a paused queue changes nothing.
func (c *Client[TTx]) PauseQueue(ctx context.Context, queue string) error {
	return c.setPaused(ctx, queue, true)
}

// ResumeQueue resumes a paused queue (a queue that is not paused is left
// as it is). This process's fetchers claim at once; other processes' on
// PostgreSQL at once (a notification), elsewhere at their next poll
// (Config.PollMax at most).
func (c *Client[TTx]) ResumeQueue(ctx context.Context, queue string) error {
	return c.setPaused(ctx, queue, false)
}

func (c *Client[TTx]) setPaused(ctx context.Context, queue string, paused bool) error {
	if ValidQueueName(queue) != nil {
		op := "resume"
		if paused {
			op = "pause"
		}
		return queueNameError{op: op, queue: queue}
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	if err := c.drv.PauseQueue(ctx, queue, paused); err != nil {
		return err
	}
	if !paused {
		c.eng.Wake(queue)
	}
	return nil
}

// filterNameError refuses a JobFilter's queue or kind that breaks the
// rule enqueue applies to them: no job can have it, and an empty list
// would hide the mistake. It is ErrInvalidOpts for errors.Is.
type filterNameError struct{ field, name, re string }

// Error names the field, the name and the rule.
func (e filterNameError) Error() string {
	return fmt.Sprintf("conveyor: jobs filter: invalid %s name %q: must match %s", e.field, e.name, e.re)
}

// Is reports the error as ErrInvalidOpts.
func (e filterNameError) Is(target error) bool { return target == ErrInvalidOpts }

// queueNameError refuses a queue name that PauseQueue or ResumeQueue was
// given. It is ErrInvalidOpts for errors.Is, but its message does not
// speak of enqueue options.
type queueNameError struct{ op, queue string }

// Error names the operation, the queue and the rule.
func (e queueNameError) Error() string {
	return fmt.Sprintf("conveyor: %s queue %q: invalid queue name: must match %s", e.op, e.queue, nameRE)
}

// Is reports the error as ErrInvalidOpts.
func (e queueNameError) Is(target error) bool { return target == ErrInvalidOpts }

// PausedQueues returns the paused queues of the database and when each
// was paused.
func (c *Client[TTx]) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	return c.drv.PausedQueues(ctx)
}

// ServerInfo describes the database server and the settings that decide
// throughput (durability, isolation).
func (c *Client[TTx]) ServerInfo(ctx context.Context) (map[string]string, error) {
	return c.drv.ServerInfo(ctx)
}

// AnyTx adapts a driver to a Client[any], whose EnqueueTx takes any
// transaction and checks its type when called (as a client from
// connect.Open does): for code that handles clients of several backends
// alike. A transaction of another type than d's is refused with
// ErrTxType.
func AnyTx[TTx any](d Driver[TTx]) Driver[any] { return anyTx[TTx]{d} }

type anyTx[TTx any] struct{ d Driver[TTx] }

// Bind binds the adapted driver.
func (a anyTx[TTx]) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	return a.d.Bind(ctx, opts)
}

// UnwrapTx passes a transaction of the adapted driver's type on, and
// anything else as it is, for the backend to refuse.
func (a anyTx[TTx]) UnwrapTx(tx any) any {
	if t, ok := tx.(TTx); ok {
		return a.d.UnwrapTx(t)
	}
	return tx
}
