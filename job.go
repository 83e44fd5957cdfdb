package conveyor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/engine"
)

// DefaultQueue is the queue of jobs enqueued without one.
const DefaultQueue = "default"

// Limits on job options; values outside them are refused at enqueue.
const (
	// MinPriority and MaxPriority bound EnqueueOpts.Priority; smaller runs
	// first.
	MinPriority, MaxPriority = -1000, 1000
	maxAttemptsLimit         = 1000
	maxDelay                 = 10 * 365 * 24 * time.Hour
	maxTimeout               = 30 * 24 * time.Hour
)

// Errors returned by conveyor. Test for them with errors.Is.
var (
	// ErrInvalidArgs: arguments that do not encode to valid JSON, contain
	// NUL characters or invalid UTF-8, or exceed the size limit.
	ErrInvalidArgs = errors.New("conveyor: invalid job arguments")
	// ErrInvalidOpts: a bad queue name, priority, delay, attempt count or
	// timeout.
	ErrInvalidOpts = errors.New("conveyor: invalid enqueue options")
	// ErrUnknownKind: a kind that has no registered worker (see
	// Config.AllowUnregisteredKinds), or an invalid kind name.
	ErrUnknownKind = errors.New("conveyor: unknown job kind")
	// ErrClosed: the client was closed.
	ErrClosed = engine.ErrStopped
	// ErrNotFound: no job with that id.
	ErrNotFound = driver.ErrNotFound
	// ErrWrongState: the job's state does not allow the operation.
	ErrWrongState = driver.ErrWrongState
	// ErrSchemaTooNew: the database was migrated by a newer conveyor.
	ErrSchemaTooNew = driver.ErrSchemaTooNew
	// ErrSchemaOutdated: the database needs `conveyor migrate`.
	ErrSchemaOutdated = driver.ErrSchemaOutdated
	// ErrTxType: EnqueueTx was given a transaction the backend does not
	// accept (pgx.Tx or *sql.Tx on PostgreSQL, *sql.Tx elsewhere), or a
	// *sql.Tx begun on a database of another kind (the error names it).
	ErrTxType = driver.ErrTxType
	// ErrUniqueRace: on MySQL/MariaDB, a unique job enqueued in the
	// application's transaction raced another transaction for its key.
	// Roll back and run the transaction again (docs/design.md, "Job
	// features").
	ErrUniqueRace = driver.ErrUniqueRace
	// ErrUniqueConflict: Retry of a finished unique job whose unique key
	// another job holds now (a job freed its key when it finished, and
	// another took it). Nothing was changed; the error is a
	// *UniqueConflictError naming the holder. Retry again once the
	// holder has finished.
	ErrUniqueConflict = driver.ErrUniqueConflict
	// ErrUnconfirmed: an enqueue whose jobs may or may not exist, because
	// the connection was lost while committing (or the caller's context
	// ended before the commit was confirmed). Enqueuing them again may
	// enqueue them twice; look them up first, or make them unique.
	ErrUnconfirmed = engine.ErrUnconfirmed
)

// UniqueConflictError is the error, wrapping ErrUniqueConflict, of a
// Retry refused because another job holds the retried job's unique key:
// Op ("retry"), JobID, Key (the key's SHA-256 digest) and HolderID (0
// when the holder finished before it could be read). Get it with
// errors.As.
type UniqueConflictError = driver.UniqueConflictError

// JobArgs are a job kind's arguments: any JSON-encodable value with a Kind.
// Kind must be a constant per type.
type JobArgs interface {
	// Kind names the job kind, for example "send_email".
	Kind() string
}

// RawArgs are arguments given as JSON with an explicit kind, for callers
// that do not have a Go type (the CLI, other languages' payloads).
type RawArgs struct {
	// KindName is the job's kind, returned by Kind.
	KindName string
	// JSON is the encoded arguments, stored as given; empty means {}.
	JSON json.RawMessage
}

// Kind returns KindName.
func (r RawArgs) Kind() string { return r.KindName }

// MarshalJSON returns the raw JSON as given.
func (r RawArgs) MarshalJSON() ([]byte, error) {
	if len(r.JSON) == 0 {
		return []byte("{}"), nil
	}
	return r.JSON, nil
}

// EnqueueOpts are per-job options; nil or zero fields take the defaults
// the arguments declare (JobArgsWithEnqueueOpts), then the client's.
type EnqueueOpts struct {
	// Queue, default "default". Names are 1 to 128 characters of letters,
	// digits, '_', '-', '.' and ':', starting with a letter or digit.
	Queue string
	// Priority: smaller runs first, between MinPriority and MaxPriority.
	// Default 0.
	Priority int
	// RunAt makes the job due at this time. Zero means now (or Delay).
	RunAt time.Time
	// Delay makes the job due this long after the database's now.
	// Ignored when RunAt is set. Must not be negative.
	Delay time.Duration
	// MaxAttempts overrides Config.MaxAttempts (1 to 1000).
	MaxAttempts int
	// Timeout overrides the worker's timeout (WorkerOpts.Timeout, else
	// Config.JobTimeout) for this job; negative means no timeout.
	Timeout time.Duration
	// Unique, when set, makes the job unique (see UniqueOpts): an enqueue
	// while a job with the same key holds it inserts nothing and returns
	// that job's id.
	Unique *UniqueOpts
	// Metadata travels with the job outside its arguments and comes back
	// in JobInfo.Metadata (to workers and middleware): a trace context, a
	// tenant, a request id. Nil or empty stores nothing. Keys and values
	// must be valid UTF-8 without NUL characters, and the map at most
	// MaxMetadataBytes once encoded as a JSON object. Metadata declared by
	// the arguments (JobArgsWithEnqueueOpts) is merged with the call's,
	// the call's keys winning. It is not part of a unique job's key.
	Metadata map[string]string
	// Key is the job's limit key: a tenant, an account, a partner. The
	// queue's per-key limits (QueueLimits.KeyMaxRunning, Ordered) apply
	// to each key on its own; a job without a key is held only by the
	// queue's own limits. 1 to MaxKeyBytes bytes of UTF-8 without NUL;
	// "" means no key. It is not part of a unique job's key.
	Key string

	// reserved is metadata conveyor itself gives the job (keys under
	// ReservedMetadataPrefix), added after Metadata is checked.
	reserved map[string]string
}

// ReservedMetadataPrefix starts the metadata keys conveyor gives jobs
// itself (a batch callback's batch, a workflow job's failure policy). An
// enqueue whose Metadata has a key with this prefix is refused with
// ErrInvalidOpts.
const ReservedMetadataPrefix = "conveyor."

// MaxKeyBytes bounds EnqueueOpts.Key.
const MaxKeyBytes = driver.MaxKeyBytes

// MaxMetadataBytes bounds EnqueueOpts.Metadata encoded as a JSON object;
// larger metadata is refused at enqueue with ErrInvalidOpts.
const MaxMetadataBytes = 64 << 10

// JobArgsWithEnqueueOpts is implemented by argument types that declare
// their kind's default enqueue options, so that every producer of the
// kind (any client, any enqueue call: Enqueue, EnqueueMany, EnqueueTx,
// EnqueueManyTx, EnqueueBulk) enqueues it the same way without repeating
// them:
//
//	func (SendEmail) EnqueueOpts() conveyor.EnqueueOpts {
//		return conveyor.EnqueueOpts{Queue: "email", MaxAttempts: 5, Timeout: 30 * time.Second}
//	}
//
// Options are resolved field by field: a non-zero field of the call's
// *EnqueueOpts wins, then the field EnqueueOpts returns, then the
// client's default (queue "default", priority 0, Config.MaxAttempts, the
// worker's timeout). The schedule is one field: a call that sets RunAt
// or Delay replaces both RunAt and Delay of the declared options. Since
// zero means "not set", a call cannot override a declared value with a
// zero one (priority 0, no delay); pass the value explicitly instead
// (RunAt: time.Now() for "now"). EnqueueOpts is called once per job
// enqueued and must not depend on the arguments' contents.
type JobArgsWithEnqueueOpts interface {
	JobArgs
	// EnqueueOpts returns the kind's default enqueue options.
	EnqueueOpts() EnqueueOpts
}

// JobArgsWithKey is implemented by argument types whose jobs take their
// limit key (EnqueueOpts.Key) from their own fields, so that every
// producer of the kind keys its jobs the same way: a tenant's or an
// account's id, a partner's name.
//
//	func (a SendEmail) LimitKey() string { return a.CustomerID }
//
// A key given by the call (EnqueueOpts.Key) wins over LimitKey, and
// LimitKey over a key declared by EnqueueOpts (JobArgsWithEnqueueOpts).
// "" means no key from the arguments. The key is checked as a given one
// is (1 to MaxKeyBytes bytes of UTF-8 without NUL): a bad one refuses
// the enqueue with ErrInvalidOpts.
type JobArgsWithKey interface {
	JobArgs
	// LimitKey returns the job's limit key, from its arguments.
	LimitKey() string
}

// resolveOpts returns the options a job is enqueued with: the call's
// non-zero fields over those args declares (JobArgsWithEnqueueOpts), and
// the key the arguments give (JobArgsWithKey) unless the call gives one.
func resolveOpts(args JobArgs, call *EnqueueOpts) EnqueueOpts {
	var o EnqueueOpts
	if d, ok := args.(JobArgsWithEnqueueOpts); ok {
		o = d.EnqueueOpts()
	}
	if k, ok := args.(JobArgsWithKey); ok {
		if key := k.LimitKey(); key != "" {
			o.Key = key
		}
	}
	if call == nil {
		return o
	}
	if call.Queue != "" {
		o.Queue = call.Queue
	}
	if call.Priority != 0 {
		o.Priority = call.Priority
	}
	if !call.RunAt.IsZero() || call.Delay != 0 {
		o.RunAt, o.Delay = call.RunAt, call.Delay
	}
	if call.MaxAttempts != 0 {
		o.MaxAttempts = call.MaxAttempts
	}
	if call.Timeout != 0 {
		o.Timeout = call.Timeout
	}
	if call.Unique != nil {
		o.Unique = call.Unique
	}
	if call.Key != "" {
		o.Key = call.Key
	}
	if call.reserved != nil {
		o.reserved = call.reserved
	}
	switch {
	case len(call.Metadata) == 0:
	case len(o.Metadata) == 0:
		o.Metadata = call.Metadata
	default: // merged into a new map: neither the call's nor the declared one changes
		m := make(map[string]string, len(o.Metadata)+len(call.Metadata))
		for k, v := range o.Metadata {
			m[k] = v
		}
		for k, v := range call.Metadata {
			m[k] = v
		}
		o.Metadata = m
	}
	return o
}

// EnqueueItem is one job of a batch enqueue.
type EnqueueItem struct {
	// Args are the job's arguments; their Kind picks the worker.
	Args JobArgs
	// Opts are the job's options; nil takes the defaults.
	Opts *EnqueueOpts
}

// AttemptError is one failed attempt, kept with the job.
type AttemptError struct {
	// Attempt is the attempt number that failed (1-based).
	Attempt int `json:"attempt"`
	// At is when the failure was recorded.
	At time.Time `json:"at"`
	// Error is the handler's error, panic value or timeout.
	Error string `json:"error"`
	// Trace is the stack trace of a panic.
	Trace string `json:"trace,omitempty"`
}

// JobInfo is a job as stored.
type JobInfo struct {
	// ID is the job's id, unique per database and prefix.
	ID int64
	// Queue is the queue the job is in.
	Queue string
	// Kind names the worker that runs it.
	Kind string
	// EncodedArgs are the arguments as stored, JSON-encoded. A Worker gets
	// them decoded in Job.Args. (The JSON key stays "Args", the field's
	// name before it was renamed.)
	EncodedArgs json.RawMessage `json:"Args"`
	// State is the job's state, one of JobStates().
	State JobState
	// Priority: smaller runs first.
	Priority int
	// Attempt counts the attempts started so far (incremented at claim).
	Attempt int
	// MaxAttempts is the most attempts the job gets before it is discarded.
	MaxAttempts int
	// Timeout is the job's own timeout; 0 means the client default,
	// negative none.
	Timeout time.Duration
	// ScheduledAt is when the job is, or was, due.
	ScheduledAt time.Time
	// CreatedAt is when it was enqueued (database clock).
	CreatedAt time.Time
	// AttemptedAt is when the latest attempt was claimed; zero if none.
	AttemptedAt time.Time
	// FinalizedAt is when it completed, was discarded or cancelled.
	FinalizedAt time.Time
	// LeaseExpiresAt is when a running attempt's lease ends unless renewed.
	LeaseExpiresAt time.Time
	// AttemptedBy identifies the process (host/pid/random) of the latest
	// attempt.
	AttemptedBy string
	// Errors holds every failed attempt's error, oldest first.
	Errors []AttemptError
	// Metadata is the job's metadata (EnqueueOpts.Metadata); nil when it
	// has none.
	Metadata map[string]string `json:",omitempty"`
	// Key is the job's limit key (EnqueueOpts.Key), "" when it has none.
	Key string `json:",omitempty"`
	// Result is the JSON value the attempt that completed the job set
	// with SetResult (or an HTTP worker sent with its completion); nil
	// when the job is not completed or completed without one. Only
	// Client.Job reads it: job lists and the Job handed to a worker leave
	// it nil.
	Result json.RawMessage `json:",omitempty"`
	// BatchID is the batch the job is a member of (EnqueueBatch, or a
	// workflow's job another waits for; Client.Batch reads it), 0 when
	// it is in none or its batch was pruned. A workflow's job that
	// several steps wait for is a member of each of their batches: the
	// first (lowest id) is reported. A batch's callback is no member of
	// it: see CallbackOf. Only Client.Job reads it: job lists and the Job
	// handed to a worker leave it 0.
	BatchID int64 `json:",omitempty"`
	// CallbackOf is the batch whose callback the job is, the batch it
	// was enqueued to close once its members finished (as recorded on
	// the batch when it fired; BatchOf reads the job's metadata
	// instead), 0 when it is no batch's callback or its batch was
	// pruned. Only Client.Job reads it, as BatchID.
	CallbackOf int64 `json:",omitempty"`
}

// MaxResultBytes bounds a job's result encoded as JSON (SetResult, an
// HTTP worker's completion); a larger one is refused with
// ErrInvalidResult.
const MaxResultBytes = 256 << 10

// ErrInvalidResult: SetResult was given a value that does not encode to
// valid JSON, contains NUL characters or invalid UTF-8, exceeds
// MaxResultBytes, or was called outside a handler's context.
var ErrInvalidResult = errors.New("conveyor: invalid job result")

// SetResult records v, encoded as JSON, as the result of the attempt whose
// handler was given ctx (a Worker's Work, or middleware inside it). The
// last call wins. The result is stored only if the attempt completes the
// job (the handler returns nil), in the same transaction as the
// completion and fenced like it: the result of an attempt that no longer
// owns the job (rescued, cancelled) is refused with its outcome. Read it
// back with Client.Job (JobInfo.Result). A v that encodes as JSON null
// (nil, a nil map, slice or pointer) is no result: it clears one set
// before. It returns an error wrapping
// ErrInvalidResult, and records nothing, when v does not encode, is over
// MaxResultBytes or ctx is not a handler's; the handler decides whether
// that fails the attempt.
func SetResult(ctx context.Context, v any) error {
	b, err := encodeResult(v)
	if err != nil {
		return err
	}
	if !engine.SetResult(ctx, b) {
		return fmt.Errorf("%w: the context is not a job handler's", ErrInvalidResult)
	}
	return nil
}

// encodeResult encodes a job's result, refusing what the databases could
// not store faithfully and anything over MaxResultBytes.
func encodeResult(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidResult, err)
	}
	return checkResult(b)
}

// checkResult checks an encoded result as encodeResult does. JSON null
// is no result: it returns nil, as the HTTP API's completion takes it.
func checkResult(b []byte) (json.RawMessage, error) {
	switch {
	case string(bytes.TrimSpace(b)) == "null":
		return nil, nil
	case !json.Valid(b) || !utf8.Valid(b):
		return nil, fmt.Errorf("%w: not valid UTF-8 JSON", ErrInvalidResult)
	case bytes.Contains(b, []byte(`\ufffd`)):
		return nil, fmt.Errorf("%w: a string contains invalid UTF-8", ErrInvalidResult)
	case bytes.Contains(b, []byte(`\u0000`)):
		return nil, fmt.Errorf("%w: a string contains a NUL character, which databases cannot store in JSON", ErrInvalidResult)
	case len(b) > MaxResultBytes:
		return nil, fmt.Errorf("%w: %d bytes encoded, over the %d-byte limit (MaxResultBytes)", ErrInvalidResult, len(b), MaxResultBytes)
	}
	return b, nil
}

// Job is one attempt of a job handed to a Worker: the job as stored
// (JobInfo, whose fields it promotes) and its decoded arguments.
type Job[T JobArgs] struct {
	*JobInfo
	// Args are the arguments decoded from JobInfo.EncodedArgs.
	Args T
}

// Worker works jobs of one kind. Return nil to complete the job, an error
// to fail the attempt (retried with backoff until MaxAttempts, then
// discarded), or JobCancel(err) to cancel it without retry. The context is
// cancelled at the job's timeout, at shutdown and if the lease is lost.
type Worker[T JobArgs] interface {
	// Work runs one attempt of job.
	Work(ctx context.Context, job *Job[T]) error
}

// WorkFunc adapts a function to a Worker.
func WorkFunc[T JobArgs](f func(ctx context.Context, job *Job[T]) error) Worker[T] {
	return workFunc[T](f)
}

type workFunc[T JobArgs] func(ctx context.Context, job *Job[T]) error

// Work calls f.
func (f workFunc[T]) Work(ctx context.Context, job *Job[T]) error { return f(ctx, job) }

// JobSnooze, returned by a handler, puts the job back to run again after
// d (from the database's clock) without using up an attempt and without
// recording an error: the job becomes scheduled. The snoozed attempt's
// claim is over: a late acknowledgement of it is refused by the database
// (the next claim gets a new fence token). A negative d is 0.
func JobSnooze(d time.Duration) error { return &engine.SnoozeError{For: d} }

// JobCancel wraps err so that the job is cancelled instead of retried.
func JobCancel(err error) error {
	if err == nil {
		err = errors.New("cancelled")
	}
	return fmt.Errorf("%w: %w", engine.ErrCancelJob, err)
}

// OutcomeState returns the state an attempt of job that ends with err
// moves the job to, as the client decides it: JobStateCompleted for nil,
// JobStateScheduled for a JobSnooze, JobStateCancelled for a JobCancel,
// JobStateDiscarded for any other error on the job's last attempt
// (Attempt >= MaxAttempts) and JobStateRetryable otherwise. It is for
// middleware that report outcomes (metrics, tracing): the state is
// written only if the attempt still owns the job (a late outcome of a
// rescued or cancelled job is refused). A panic is an error.
func OutcomeState(job *JobInfo, err error) JobState {
	if err == nil {
		return JobStateCompleted
	}
	if sn := (*engine.SnoozeError)(nil); errors.As(err, &sn) {
		return JobStateScheduled
	}
	switch {
	case errors.Is(err, engine.ErrCancelJob):
		return JobStateCancelled
	case job != nil && job.Attempt >= job.MaxAttempts:
		return JobStateDiscarded
	}
	return JobStateRetryable
}

// WorkerOpts are one kind's own worker settings, given to AddWorker. They
// override the client's Config for the jobs of that kind this client
// runs; zero fields take the Config's.
//
// A job's timeout is, in order: its own (EnqueueOpts.Timeout, from the
// call or declared by its arguments' EnqueueOpts method), stored with the
// job at enqueue; else WorkerOpts.Timeout of the worker that runs it;
// else Config.JobTimeout. The backoff is WorkerOpts.Backoff, else
// Config.Backoff. There is no per-worker MaxAttempts: a job's attempts are
// fixed when it is enqueued, possibly by a producer that has no worker
// for the kind; declare a kind's default with its arguments'
// EnqueueOpts method (JobArgsWithEnqueueOpts), which every producer
// applies.
type WorkerOpts struct {
	// Timeout is the timeout of the kind's jobs that have none of their
	// own: the handler's context is cancelled and the attempt fails. It
	// replaces Config.JobTimeout; negative means none, zero takes
	// Config.JobTimeout. At most 30 days.
	Timeout time.Duration
	// Backoff returns the wait before retry number attempt (1-based) of a
	// job of the kind, replacing Config.Backoff; nil takes Config.Backoff.
	Backoff func(attempt int) time.Duration
	// Middleware wraps the kind's attempts, inside the client's
	// Config.WorkMiddleware, the first outermost.
	Middleware []WorkMiddleware
}

// AddWorker registers w for the kind of T on c, with the kind's own
// settings when opts gives them (at most one WorkerOpts). Call it before
// Start.
func AddWorker[T JobArgs, TTx any](c *Client[TTx], w Worker[T], opts ...WorkerOpts) error {
	var zero T
	kind := zero.Kind()
	if err := checkKind(kind); err != nil {
		return err
	}
	var wo WorkerOpts
	switch {
	case len(opts) > 1:
		return fmt.Errorf("conveyor: AddWorker for kind %q: %d WorkerOpts given, want at most one", kind, len(opts))
	case len(opts) == 1:
		wo = opts[0]
	}
	if wo.Timeout > maxTimeout {
		return fmt.Errorf("conveyor: AddWorker for kind %q: timeout %v over the %v limit", kind, wo.Timeout, maxTimeout)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("conveyor: AddWorker after Start")
	}
	if _, dup := c.handlers[kind]; dup {
		return fmt.Errorf("conveyor: a worker for kind %q is already registered", kind)
	}
	if wo.Timeout != 0 || wo.Backoff != nil {
		c.eng.SetKind(kind, engine.KindConfig{Timeout: wo.Timeout, Backoff: wo.Backoff})
	}
	mws := append(append([]WorkMiddleware(nil), c.cfg.WorkMiddleware...), wo.Middleware...)
	c.handlers[kind] = func(ctx context.Context, row *driver.JobRow) error {
		job := &Job[T]{JobInfo: jobInfo(row)}
		work := func(ctx context.Context) error {
			if err := c.dependencyFailure(ctx, job.JobInfo); err != nil {
				return err
			}
			if err := json.Unmarshal(row.Args, &job.Args); err != nil {
				return JobCancel(fmt.Errorf("decoding %s arguments: %w", kind, err))
			}
			return w.Work(ctx, job)
		}
		if len(mws) == 0 {
			return work(ctx)
		}
		return chainWork(mws, job.JobInfo, work)(ctx)
	}
	return nil
}

// nameRE is the rule for queue names (and the protocol of a remote
// claim); kindRE the rule for kind names, which also allows '/'. The
// rest of the module checks names with ValidQueueName and ValidKindName.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
var kindRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$`)

// ValidQueueName reports whether name is a valid queue name: 1 to 128
// letters, digits, '_', '.', ':' or '-', starting with a letter or
// digit. Enqueue, PauseQueue, SetQueueLimits and a JobFilter refuse a
// queue name that breaks the rule; ValidQueueName lets a caller refuse it
// first, with its own context. It returns nil for a valid name, else an
// error that is ErrInvalidOpts for errors.Is, with the message "invalid
// queue name: must match " and the rule: the message leaves the name out,
// for the caller to wrap it with where the name came from, as in
// fmt.Errorf("queue %q: %w", name, err).
func ValidQueueName(name string) error {
	if !validName(name, false) {
		return nameRuleError{field: "queue", re: nameRE}
	}
	return nil
}

// ValidKindName reports whether kind is a valid kind name: 1 to 128
// letters, digits, '_', '.', ':', '/' or '-', starting with a letter or
// digit. Enqueue and a JobFilter refuse a kind that breaks the rule. It
// returns nil for a valid kind, else an error that is ErrInvalidOpts for
// errors.Is (as a JobFilter reports it) and also ErrUnknownKind (as
// enqueue reports it), with the message "invalid kind name: must match "
// and the rule: the message leaves the kind out, for the caller to wrap
// it with where the kind came from, as in fmt.Errorf("kind %q: %w",
// kind, err).
func ValidKindName(kind string) error {
	if !validName(kind, true) {
		return nameRuleError{field: "kind", re: kindRE}
	}
	return nil
}

// validName reports whether s matches nameRE (kindRE when slash is true)
// without running the regular expression: every Enqueue checks a queue
// and a kind, and a byte loop costs a fraction of a match. The test
// checks that both agree.
func validName(s string, slash bool) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == ':' || c == '-'):
		case i > 0 && slash && c == '/':
		default:
			return false
		}
	}
	return true
}

// nameRuleError is the error of ValidQueueName and ValidKindName: field
// is "queue" or "kind", re the rule the name broke.
type nameRuleError struct {
	field string
	re    *regexp.Regexp
}

// Error names the field and the rule.
func (e nameRuleError) Error() string {
	return fmt.Sprintf("invalid %s name: must match %s", e.field, e.re)
}

// Is reports the error as ErrInvalidOpts, and a kind's as ErrUnknownKind
// too.
func (e nameRuleError) Is(target error) bool {
	return target == ErrInvalidOpts || (e.field == "kind" && target == ErrUnknownKind)
}

// checkQueue refuses an enqueued job's (or periodic job's) queue name.
func checkQueue(q string) error {
	if ValidQueueName(q) != nil {
		return fmt.Errorf("%w: queue name %q: must match %s", ErrInvalidOpts, q, nameRE)
	}
	return nil
}

// checkKind refuses an enqueued job's kind name.
func checkKind(k string) error {
	if ValidKindName(k) != nil {
		return fmt.Errorf("%w: kind name %q: must match %s", ErrUnknownKind, k, kindRE)
	}
	return nil
}

// encodeArgs marshals and checks arguments against limit.
func encodeArgs(args JobArgs, limit int) (json.RawMessage, error) {
	if args == nil {
		return nil, fmt.Errorf("%w: nil args", ErrInvalidArgs)
	}
	b, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("%w: kind %q: %v", ErrInvalidArgs, args.Kind(), err)
	}
	if !json.Valid(b) || !utf8.Valid(b) {
		return nil, fmt.Errorf("%w: kind %q: not valid UTF-8 JSON", ErrInvalidArgs, args.Kind())
	}
	// encoding/json replaces invalid UTF-8 in strings by \ufffd: refuse it
	// rather than store something other than what was given.
	if bytes.Contains(b, []byte(`\ufffd`)) {
		return nil, fmt.Errorf("%w: kind %q: a string contains invalid UTF-8", ErrInvalidArgs, args.Kind())
	}
	if bytes.Contains(b, []byte(`\u0000`)) {
		return nil, fmt.Errorf("%w: kind %q: a string contains a NUL character, which databases cannot store in JSON", ErrInvalidArgs, args.Kind())
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%w: kind %q: %d bytes encoded, over the %d-byte limit", ErrInvalidArgs, args.Kind(), len(b), limit)
	}
	return b, nil
}

// encodeMetadata encodes metadata as the JSON object stored with the job,
// nil for none, refusing what the databases could not store faithfully
// and anything over MaxMetadataBytes.
func encodeMetadata(m, reserved map[string]string) (json.RawMessage, error) {
	for k := range m {
		if strings.HasPrefix(k, ReservedMetadataPrefix) {
			return nil, fmt.Errorf("%w: metadata key %q: keys starting with %q are reserved for conveyor", ErrInvalidOpts, k, ReservedMetadataPrefix)
		}
	}
	if len(reserved) > 0 {
		all := make(map[string]string, len(m)+len(reserved))
		for k, v := range m {
			all[k] = v
		}
		for k, v := range reserved {
			all[k] = v
		}
		m = all
	}
	if len(m) == 0 {
		return nil, nil
	}
	for k, v := range m {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: metadata key %q: key and value must be valid UTF-8", ErrInvalidOpts, k)
		}
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("%w: metadata key %q: a NUL character, which databases cannot store in JSON", ErrInvalidOpts, k)
		}
	}
	b, err := json.Marshal(m) // keys sorted
	if err != nil {
		return nil, fmt.Errorf("%w: metadata: %v", ErrInvalidOpts, err)
	}
	if len(b) > MaxMetadataBytes {
		return nil, fmt.Errorf("%w: metadata is %d bytes encoded, over the %d-byte limit", ErrInvalidOpts, len(b), MaxMetadataBytes)
	}
	return b, nil
}

func jobInfo(r *driver.JobRow) *JobInfo {
	j := &JobInfo{
		ID: r.ID, Queue: r.Queue, Kind: r.Kind, EncodedArgs: r.Args, State: JobState(r.State),
		Priority: r.Priority, Attempt: r.Attempt, MaxAttempts: r.MaxAttempts,
		Timeout:     time.Duration(r.TimeoutMS) * time.Millisecond,
		ScheduledAt: r.ScheduledAt, CreatedAt: r.CreatedAt, AttemptedAt: r.AttemptedAt,
		FinalizedAt: r.FinalizedAt, LeaseExpiresAt: r.LeaseExpiresAt, AttemptedBy: r.AttemptedBy,
		Result: r.Result, Key: r.Key, BatchID: r.BatchID, CallbackOf: r.CallbackOf,
	}
	for _, e := range r.Errors {
		j.Errors = append(j.Errors, AttemptError(e))
	}
	if len(r.Meta) > 0 {
		// Written by encodeMetadata (or by hand, in the database): a
		// column that does not decode as an object of strings is left out
		// rather than failing the job.
		_ = json.Unmarshal(r.Meta, &j.Metadata)
	}
	return j
}
