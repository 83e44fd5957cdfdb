// Package driver is the contract between conveyor's engine and a database
// backend. The engine reaches the database only through Driver; dialect
// differences are expressed as Capabilities, never as type switches in the
// engine.
//
// Every time a driver writes (scheduled_at, lease_expires_at, finalized_at)
// is computed from the database's clock inside the statement; the durations
// passed in (lease, delay, backoff) are relative to that clock.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Job states as stored in the database.
const (
	StateAvailable = "available"
	StateScheduled = "scheduled"
	StateRunning   = "running"
	StateRetryable = "retryable"
	StateCompleted = "completed"
	StateDiscarded = "discarded"
	StateCancelled = "cancelled"
)

// AllStates lists every state in lifecycle order.
var AllStates = []string{StateAvailable, StateScheduled, StateRunning, StateRetryable, StateCompleted, StateDiscarded, StateCancelled}

// ErrSchemaTooNew is returned when the database was migrated by a newer
// conveyor than this binary.
var ErrSchemaTooNew = errors.New("database schema is newer than this conveyor binary")

// ErrSchemaOutdated is returned when the database lacks migrations this
// binary needs.
var ErrSchemaOutdated = errors.New("database schema is older than this conveyor binary; run `conveyor migrate`")

// ErrNotFound is returned by admin calls for an id that does not exist.
var ErrNotFound = errors.New("job not found")

// ErrWrongState is returned by admin calls when the job's state does not
// allow the operation (for example cancelling a completed job).
var ErrWrongState = errors.New("job is not in a state that allows this")

// ErrTxType is returned when a caller transaction is not of the type the
// backend accepts.
var ErrTxType = errors.New("transaction type not supported by this backend")

// ErrUniqueRace is returned, in the caller's transaction, when a unique
// job's key was taken by a concurrent transaction between the check and
// the insert on a backend that would otherwise keep a lock on the holder
// until the caller's transaction ends (MySQL/MariaDB). Roll back and run
// the transaction again: the retry sees the holder.
var ErrUniqueRace = errors.New("a concurrent transaction took the unique key of a job being enqueued: roll back and run the transaction again")

// ErrUniqueConflict is wrapped (through a *UniqueConflictError) by the
// error of an operation that would give a job a unique key that another
// job holds: the retry by hand of a finished unique job whose key another
// job took meanwhile. Nothing was changed.
var ErrUniqueConflict = errors.New("another job holds the unique key")

// UniqueConflictError says which job was refused its unique key and which
// job holds it. errors.Is(err, ErrUniqueConflict) matches it.
type UniqueConflictError struct {
	// Op is the operation refused: "retry".
	Op string
	// JobID is the job the operation was refused for.
	JobID int64
	// Key is the job's unique key (the SHA-256 digest stored with it).
	Key []byte
	// HolderID is the job that holds the key; 0 when it let the key go
	// before it could be read.
	HolderID int64
}

// Error says what was refused, for which job, and who holds the key.
func (e *UniqueConflictError) Error() string {
	if e.HolderID == 0 {
		return fmt.Sprintf("%s job %d: another job holds its unique key %x", e.Op, e.JobID, e.Key)
	}
	return fmt.Sprintf("%s job %d: its unique key %x is held by job %d; %s it once job %d has finished",
		e.Op, e.JobID, e.Key, e.HolderID, e.Op, e.HolderID)
}

// Is matches ErrUniqueConflict.
func (e *UniqueConflictError) Is(target error) bool { return target == ErrUniqueConflict }

// notCommitted marks an error after which nothing of the call was
// committed.
type notCommitted struct{ err error }

func (e notCommitted) Error() string { return e.err.Error() }
func (e notCommitted) Unwrap() error { return e.err }

// NotCommitted marks err (nil stays nil) as the error of a write of which
// the driver knows that nothing was committed: it failed before its
// transaction was committed (a statement refused, a connection lost
// before the commit was sent, a lock never obtained), or the server said
// the commit failed. A write that fails without the mark may have
// committed (a connection lost while the commit was under way). The
// engine may run the writes of a failed group commit again, caller by
// caller, only after an error so marked. The message is err's.
func NotCommitted(err error) error {
	if err == nil || IsNotCommitted(err) {
		return err
	}
	return notCommitted{err}
}

// ForeignTx returns err, the error of a statement run in the caller's
// transaction by the backend named backend, marked ErrTxType and naming
// the other database when it is the error of another backend's database
// driver: the transaction is of the type the backend accepts (a *sql.Tx)
// but was begun on a database of another kind, where conveyor's SQL is
// not understood.
func ForeignTx(backend string, err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		t := reflect.TypeOf(e)
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		var other string
		switch t.PkgPath() {
		case "github.com/jackc/pgx/v5/pgconn":
			other = "postgres"
		case "github.com/go-sql-driver/mysql":
			other = "mysql"
		case "modernc.org/sqlite":
			other = "sqlite"
		}
		if other != "" {
			if other == backend {
				return err
			}
			return fmt.Errorf("conveyor: the transaction is on a %s database, not the %s database of this client: %w (%w)", other, backend, ErrTxType, err)
		}
	}
	return err
}

// IsNotCommitted reports whether err, or an error it wraps, was marked by
// NotCommitted.
func IsNotCommitted(err error) bool {
	var n notCommitted
	return errors.As(err, &n)
}

// Capabilities describes what a backend can do; the engine adapts to it.
type Capabilities struct {
	// Listen is true when the backend has a push notification channel
	// (PostgreSQL LISTEN/NOTIFY). Without it the engine polls.
	Listen bool
	// NoListen says why a backend that has notifications cannot listen
	// on this connection (PostgreSQL behind a transaction pooler, with no
	// direct connection for the listener), and what would let it. Listen
	// is false then; the engine logs it once when it starts.
	NoListen string
	// MaxArgsBytes is the largest encoded args the server accepts in one
	// row (0: no server-specific limit beyond the client's).
	MaxArgsBytes int
	// OneWriter is true when every write of the database, of every
	// process, waits for one lock (SQLite): a claim or an outcome batch
	// holds back every other writer, heartbeats included, for as long as
	// it takes. The engine then claims no more than one batch of a
	// queue's workers ahead of them, whatever its handlers take.
	OneWriter bool
	// KeyedInsertClaim is true when the driver's InsertClaiming (see
	// InsertClaimer) may also be given jobs of a queue whose only limits
	// are per key (KeyMaxRunning, Ordered): it reads the queue's limits
	// in the insert's own transaction, claims a job with a key only when
	// no due job of its key waits and the key has a free slot, which the
	// job then holds as a claim's would, and claims nothing of a queue
	// with any other limit.
	KeyedInsertClaim bool
}

// InsertParams is one job to insert. Args are already validated JSON.
type InsertParams struct {
	Queue       string
	Kind        string
	Args        json.RawMessage
	Priority    int
	MaxAttempts int
	// TimeoutMS is the per-job timeout in milliseconds; 0 means the client
	// default, negative means none.
	TimeoutMS int64
	// RunAt, when non-zero, is the absolute time the job becomes due.
	RunAt time.Time
	// Delay, when RunAt is zero, is added to the database's clock.
	Delay time.Duration
	// UniqueKey, when not nil, makes the job unique: the database refuses
	// a second job with the same key while one holds it (see UniqueKeep).
	// Only InsertUnique inserts jobs with a key.
	UniqueKey []byte
	// UniqueKeep is the finished states in which the job still holds its
	// key, as bits: KeepCompleted, KeepDiscarded, KeepCancelled. An
	// unfinished job always holds it.
	UniqueKeep int
	// Meta is the job's metadata, a JSON object of strings already
	// validated and bounded by the public package, stored in the meta
	// column; nil stores NULL (no metadata).
	Meta json.RawMessage
	// Key is the job's limit key (a tenant, an account, a partner),
	// stored in the lkey column; "" stores NULL (no key). Already
	// validated by the public package: 1 to MaxKeyBytes bytes of UTF-8
	// without NUL. The queue's key limits (QueueLimits.KeyMaxRunning,
	// Ordered) apply per key; a job without a key is held only by the
	// queue's own limits.
	Key string
}

// MaxKeyBytes bounds a job's limit key (InsertParams.Key).
const MaxKeyBytes = 255

// Bits of InsertParams.UniqueKeep.
const (
	KeepCompleted = 1
	KeepDiscarded = 2
	KeepCancelled = 4
)

// JobRow is a job as stored.
type JobRow struct {
	ID       int64
	Queue    string
	Kind     string
	Args     json.RawMessage
	State    string
	Priority int
	Attempt  int
	// Fence is the claim's fence token: it grows at every claim and is
	// never reused (a graceful release gives the attempt back but not the
	// fence), so an acknowledgement fenced by it is refused by the
	// database once the attempt it belongs to no longer owns the job,
	// whatever any process remembers. SQLite and MySQL add one; PostgreSQL,
	// whose claims commit without waiting for the disk, takes the database
	// clock in microseconds, so that a claim lost in a server crash is not
	// handed out again under the same fence.
	Fence          int64
	MaxAttempts    int
	TimeoutMS      int64
	ScheduledAt    time.Time
	CreatedAt      time.Time
	AttemptedAt    time.Time // zero if never attempted
	FinalizedAt    time.Time // zero if not final
	LeaseExpiresAt time.Time // zero if not running
	AttemptedBy    string
	Errors         []AttemptError
	// Meta is the job's metadata as stored (a JSON object), nil when it
	// has none.
	Meta json.RawMessage
	// Key is the job's limit key, "" when it has none.
	Key string
	// Result is the JSON value the attempt that completed the job
	// returned (Outcome.Result), nil when the job is not completed or
	// completed without one. Only GetJob reads it; other reads leave it
	// nil.
	Result json.RawMessage
	// BatchID is the batch the job is a member of (a row of the batch's
	// jobs, or for a callback a batch that waits for the batch it
	// closes; the lowest id of those of a workflow's job several steps
	// wait for), 0 when it is in none or its batches were pruned. Only
	// GetJob reads it; other reads leave it 0.
	BatchID int64
	// CallbackOf is the batch whose callback the job is (the batch row
	// that recorded its id when it fired), 0 when it is no batch's
	// callback or its batch was pruned. Only GetJob reads it; other reads
	// leave it 0.
	CallbackOf int64
	// LeaseFrom, on a row Claim returned, is a time by this process's
	// clock no later than the moment the database started the claim's
	// lease: on SQLite, when the claim's transaction took the write lock,
	// after any wait for it; on MySQL/MariaDB, when the claim's
	// transaction had begun on its connection, after any wait for one
	// (the locking and limited claims). Zero when the driver cannot tell; the
	// engine then counts the lease from when it called Claim, which is
	// safe and, after a long wait for a lock or a connection, short.
	LeaseFrom time.Time
}

// AttemptError is one failed attempt, kept with the job.
type AttemptError struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	Error   string    `json:"error"`
	Trace   string    `json:"trace,omitempty"`
}

// ClaimParams asks for up to Limit available jobs of one queue.
type ClaimParams struct {
	Queue  string
	Limit  int
	Lease  time.Duration
	Worker string // identifies the claiming process, stored in attempted_by
	// Blocked, for ClaimLimited, says that the caller holds a block of
	// the queue's concurrency slots (SlotLeaser) and starts no more of
	// the claimed jobs at once than the block allows: the claim takes no
	// concurrency slot and is held only by the queue's other limits
	// (Rate, the limits per key, the pause). It still reports the
	// MaxRunning it read.
	Blocked bool
}

// Outcome is the result of one attempt, as the completer writes it.
type Outcome struct {
	ID int64
	// Fence is the claim's fence token: the outcome is applied only if the
	// job is still running under this very claim.
	Fence int64
	// Attempt is the attempt number the outcome belongs to (for the error
	// record; the fence decides).
	Attempt int
	// State is the new state: completed, retryable, discarded or
	// cancelled, or scheduled for a snooze: the job runs again after
	// RetryIn and its attempt is given back (not its fence).
	State string
	// RetryIn is the wait from the database's clock, for retryable and
	// scheduled.
	RetryIn time.Duration
	// Err is recorded in the job's error list when non-nil.
	Err *AttemptError
	// Result, for a completed outcome, is the JSON value the handler
	// returned (already validated and bounded), stored in the job's
	// result row in the same transaction as the outcome and only if the
	// outcome is applied; nil stores nothing. Ignored for other states.
	Result json.RawMessage
}

// Lease identifies one running attempt, for heartbeats and releases, by
// the job and the fence token of the claim that started the attempt.
type Lease struct {
	ID    int64
	Fence int64
}

// JobFilter selects jobs for listing. Zero fields match everything.
type JobFilter struct {
	States  []string
	Queue   string
	Kind    string
	Limit   int   // default 100
	AfterID int64 // for paging: only ids greater than this
	// BeforeID, when positive, keeps only ids smaller than this: the
	// cursor of a list read newest first (Desc), whose next page is
	// the jobs before its last one. It bounds an ascending list too.
	BeforeID int64
	// Desc lists by descending id (newest first); Limit then takes the
	// highest ids within the bounds.
	Desc bool
}

// QueueStats is one queue's counts by state and its oldest due job.
type QueueStats struct {
	Queue  string
	Counts map[string]int64
	// OldestAvailable is the age of the oldest available job by the
	// database's clock, 0 if none.
	OldestAvailable time.Duration
	// AwaitingDependencies is the number of jobs of the queue waiting for
	// their dependencies: the callbacks of the batches still open (whose
	// callback is not enqueued yet, a workflow's later steps included),
	// by the callback's queue. They are not rows of the jobs table yet, so
	// no state counts them.
	AwaitingDependencies int64
}

// Rows is a statement's result as ScanAwaiting reads it: database/sql's
// *sql.Rows and pgx's Rows are both.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanAwaiting reads rows of (queue, count), each backend's count of the
// callbacks of open batches by queue, into a map for WithAwaiting. The
// caller closes rows.
func ScanAwaiting(rows Rows) (map[string]int64, error) {
	out := map[string]int64{}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		out[q] = n
	}
	return out, rows.Err()
}

// WithAwaiting adds to stats (sorted by queue) each queue's count of
// callbacks of open batches, listing a queue that has only those, and
// returns the stats sorted by queue.
func WithAwaiting(stats []QueueStats, awaiting map[string]int64) []QueueStats {
	if len(awaiting) == 0 {
		return stats
	}
	listed := make(map[string]bool, len(stats))
	for i := range stats {
		stats[i].AwaitingDependencies = awaiting[stats[i].Queue]
		listed[stats[i].Queue] = true
	}
	for q, n := range awaiting {
		if listed[q] {
			continue
		}
		s := NewQueueStats(q)
		s.AwaitingDependencies = n
		stats = append(stats, *s)
	}
	sort.Slice(stats, func(i, j int) bool { return stats[i].Queue < stats[j].Queue })
	return stats
}

// NewQueueStats returns stats for queue with every state counted as 0.
func NewQueueStats(queue string) *QueueStats {
	s := &QueueStats{Queue: queue, Counts: make(map[string]int64, len(AllStates))}
	for _, st := range AllStates {
		s.Counts[st] = 0
	}
	return s
}

// QueueLimits are a queue's flow limits. They are kept in the database
// (beside the queue's pause) and every claim of every process, in-process
// workers and HTTP workers alike, is held to them. The zero value means
// no limit.
type QueueLimits struct {
	// MaxRunning is the most jobs of the queue running at once across
	// every process; 0 means no limit. A job counts from the claim that
	// starts its attempt to the statement that ends the attempt (an
	// outcome, a release, a rescue, a cancel or discard by hand).
	MaxRunning int
	// Rate is the most jobs of the queue started in any window of
	// RatePeriod, by the database's clock; 0 means no limit. Every claim
	// counts as a start, whatever the attempt's outcome.
	Rate int
	// RatePeriod is the window of Rate; set exactly when Rate is.
	RatePeriod time.Duration
	// KeyMaxRunning is the most jobs with the same key (InsertParams.Key)
	// running at once across every process; 0 means no limit per key.
	// Jobs without a key are not held by it. Held like MaxRunning, by
	// slot rows of their own (one per unit of the limit per key, made
	// when a claim first needs them), from the claim that starts an
	// attempt to the statement that ends it.
	KeyMaxRunning int
	// Ordered makes the jobs of each key start one at a time in the
	// order they were enqueued (by id) among those due; KeyMaxRunning is
	// then 1. A job of the key that failed and waits for its retry (or
	// was snoozed) keeps its key's slot, so that no later job of the key
	// starts before it completes, is discarded or is cancelled, unless
	// OrderedMoveOn is set.
	Ordered bool
	// OrderedMoveOn, with Ordered, lets a key's next job start while a
	// failed job of the key waits for its retry: the waiting job gives
	// its slot back and takes its turn again (it is the key's oldest
	// job) when it is due.
	OrderedMoveOn bool
	// KeyRate is the most jobs with the same key started in any window
	// of KeyRatePeriod, by the database's clock; 0 means no rate per
	// key. Every claim of a keyed job counts as a start of its key,
	// whatever the attempt's outcome. Jobs without a key are not held
	// by it. Held by rate slot rows of each key (one per unit of the
	// rate, made when a claim first needs them), each stamped with the
	// database time of the start it last admitted: a slot admits a
	// start when its stamp is at least KeyRatePeriod old. Composes with
	// every other limit: a keyed job starts only when its key has both a
	// free slot (KeyMaxRunning, Ordered) and room in its window.
	KeyRate int
	// KeyRatePeriod is the window of KeyRate; set exactly when KeyRate
	// is.
	KeyRatePeriod time.Duration
	// Fair serves the keys of the queue's due jobs in turns: a claim
	// walks them in rotation (from where this driver's last claim of the
	// queue stopped) and admits at most a key's weight (SetKeyWeights;
	// 1 for a key not weighed) of the key's jobs per turn, within the
	// key's other limits (KeyMaxRunning, Ordered, KeyRate). A claim with
	// room left once every key with due jobs had its turn gives the keys
	// that have more further turns, in proportion to their weights, so
	// that two deep keys share a claim by weight and a lone key still
	// fills it. Jobs without a key are claimed after the keyed ones. Fair
	// holds no job back: it orders a claim, it does not limit it.
	Fair bool
}

// Bounds of a queue's key weights (Driver.SetKeyWeights).
const (
	// MaxKeyWeights is the most keys a queue may weigh.
	MaxKeyWeights = 1000
	// MaxKeyWeight is the largest weight of a key.
	MaxKeyWeight = 1000
)

// CheckKeyWeights refuses key weights the database should not hold,
// naming what is wrong: too many keys, a bad key or a weight out of
// range.
func CheckKeyWeights(weights map[string]int) error {
	if len(weights) > MaxKeyWeights {
		return fmt.Errorf("%d keys weighed: at most %d", len(weights), MaxKeyWeights)
	}
	keys := make([]string, 0, len(weights))
	for k := range weights {
		keys = append(keys, k)
	}
	sort.Strings(keys) // name the same bad key every time
	for _, k := range keys {
		w := weights[k]
		switch {
		case k == "":
			return errors.New("an empty key is weighed")
		case len(k) > MaxKeyBytes:
			return fmt.Errorf("weighed key %.40q... is %d bytes: at most %d", k, len(k), MaxKeyBytes)
		case !utf8.ValidString(k) || strings.ContainsRune(k, 0):
			return fmt.Errorf("weighed key %q is not UTF-8 without NUL", k)
		case w < 1 || w > MaxKeyWeight:
			return fmt.Errorf("weight %d of key %q is out of range 1..%d", w, k, MaxKeyWeight)
		}
	}
	return nil
}

// KeyWeight is key's weight under weights: its entry, or 1.
func KeyWeight(weights map[string]int, key string) int {
	if w, ok := weights[key]; ok && w > 0 {
		return w
	}
	return 1
}

// EncodeKeyWeights is the stored form of a queue's key weights: a JSON
// object of key to weight, keys sorted, or nil (SQL NULL) for none.
func EncodeKeyWeights(w map[string]int) []byte {
	if len(w) == 0 {
		return nil
	}
	b, err := json.Marshal(w) // maps marshal with their keys sorted
	if err != nil {
		panic(err) // a map of strings to ints always marshals
	}
	return b
}

// KeyWeightCache keeps, per queue, the key weights a claim last decoded
// with the stored text they came from, so that a claim decodes a queue's
// weights only when they changed. The zero value is ready; it is safe
// for concurrent use.
type KeyWeightCache struct {
	mu sync.Mutex
	m  map[string]cachedKeyWeights
}

// cachedKeyWeights is a queue's stored key weights and their decoding.
type cachedKeyWeights struct {
	raw string
	w   map[string]int
}

// Get returns the weights stored as raw for queue (nil for none),
// decoding raw only when it is not what the queue's last claim read. The
// map returned is shared: callers only read it.
func (c *KeyWeightCache) Get(queue, raw string) (map[string]int, error) {
	if raw == "" {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[queue]; ok && e.raw == raw {
		return e.w, nil
	}
	w, err := DecodeKeyWeights([]byte(raw))
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]cachedKeyWeights{}
	}
	c.m[queue] = cachedKeyWeights{raw: raw, w: w}
	return w, nil
}

// DecodeKeyWeights reads stored key weights (EncodeKeyWeights); empty
// or NULL is none.
func DecodeKeyWeights(b []byte) (map[string]int, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var w map[string]int
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("stored key weights: %w", err)
	}
	if len(w) == 0 {
		return nil, nil
	}
	return w, nil
}

// IsZero reports whether l limits nothing.
func (l QueueLimits) IsZero() bool {
	return l.MaxRunning == 0 && l.Rate == 0 && l.KeyMaxRunning == 0 && !l.Ordered && l.KeyRate == 0 && !l.Fair
}

// HasKeyLimits reports whether l treats jobs by key: limits them per
// key (KeyMaxRunning, Ordered, KeyRate) or serves keys in turns (Fair).
func (l QueueLimits) HasKeyLimits() bool {
	return l.KeyMaxRunning > 0 || l.Ordered || l.KeyRate > 0 || l.Fair
}

// LimitUsage is a limited queue's limits and how much of them is in use,
// read in one statement by the database's clock.
type LimitUsage struct {
	Limits QueueLimits
	// Running is the number of concurrency slots held by attempts or
	// leased to processes in blocks (SlotLeaser); where the backend
	// counts running jobs instead of holding slots for them (SQLite),
	// the slots leased in blocks and the running jobs claimed by no
	// block's owner.
	Running int
	// Started is the number of starts within the last RatePeriod.
	Started int
	// NextStart, when Started has reached Rate, is how long until the
	// oldest of those starts leaves the window; 0 otherwise.
	NextStart time.Duration
	// KeysRunning is the number of keys with at least one key slot held
	// (by a running attempt, or kept for an ordered key's retry).
	KeysRunning int
	// KeyHeld is the number of due available jobs whose key has no slot
	// free for them: every slot of the key held, or (Ordered) kept for
	// another job of the key, or (KeyRate) every start of the key's
	// window used.
	KeyHeld int64
	// KeysRated is the number of keys whose KeyRate window is full (each
	// of their rate slots stamped within the last KeyRatePeriod).
	KeysRated int
}

// ClaimResult is what ClaimLimited claimed, and whether the queue's limits
// held jobs back.
type ClaimResult struct {
	// Rows are the claimed jobs, as Claim returns them.
	Rows []*JobRow
	// Held is true when the queue's limits let the claim take fewer
	// jobs than it asked for while due jobs of the queue may be waiting
	// (a concurrency limit reached, or the rate's window full). A claim
	// that found no due job is not Held.
	Held bool
	// RetryIn, when the rate held jobs back, is how long until the
	// window has room again (by the database's clock); 0 when only the
	// concurrency limit held them (a slot frees when an attempt ends).
	RetryIn time.Duration
	// RateFull, with Held, says that the queue's own rate (Rate) cut the
	// claim and its window is full: no job of the queue, whatever its
	// key, starts before RetryIn, which is then when that window has
	// room. (A window of one key's rate, or a key's slots, says nothing
	// of the queue's other keys.)
	RateFull bool
	// MaxRunning is the queue's MaxRunning as the claim read it (0: no
	// concurrency limit). A process that holds that many of the queue's
	// attempts need not claim again until one of them ends (the engine
	// still claims every PollMin, for a limit raised elsewhere).
	MaxRunning int
}

// InsertClaim is what an insert that claims (InsertClaimer) may claim of
// the jobs it writes.
type InsertClaim struct {
	// Claim flags, per job of the insert, those to claim: a flagged job
	// that is due at once and whose queue is not paused is written as
	// running, as Claim would have left it (attempt 1, a new fence, leased
	// to Worker for Lease); every other job is written as Insert writes it.
	Claim  []bool
	Lease  time.Duration
	Worker string
}

// InsertClaimer is implemented by a backend whose insert can claim the
// jobs it writes in the same statement: a process that enqueues jobs of
// a queue it works, while its workers of that queue are idle, hands them
// to those workers without a claim of its own, so that the job starts
// right after its commit and costs one move fewer (the engine checks for
// it; a backend without it gets plain inserts).
type InsertClaimer interface {
	// InsertClaiming is Insert (one statement, one commit of its own, its
	// error marked as Insert's) that claims the jobs c.Claim flags, as
	// InsertClaim says. It returns the ids in order and, per job, the
	// claimed row (nil for a job not claimed): a row as Claim returns it.
	// Only jobs left available wake other processes' fetchers.
	InsertClaiming(ctx context.Context, jobs []InsertParams, c InsertClaim) ([]int64, []*JobRow, error)
}

// SlotBlock is what an owner holds of one queue's concurrency slots
// after SlotLeaser.LeaseSlots.
type SlotBlock struct {
	// Held is the number of the queue's concurrency slots the owner
	// holds (leased until the call's ttl from the database's clock).
	Held int
	// Usable is how many attempts the owner may run at once under its
	// block: Held, or fewer while the slots in use exceed a lowered
	// MaxRunning, min(Held, MaxRunning less the slots held by attempts
	// and other owners), never below 0. (So a lowered limit starts no job
	// until fewer than it are in use, whoever holds the slots above it.)
	Usable int
	// MaxRunning is the queue's MaxRunning as the call read it; 0 when
	// the queue has no concurrency limit (Held is then 0).
	MaxRunning int
}

// SlotLeaser is implemented by a backend that leases a queue's
// concurrency slots (QueueLimits.MaxRunning) to a process in blocks: the
// process takes N slots in one call and runs up to N attempts of the
// queue at once under them, its claims taking no slot of their own
// (ClaimParams.Blocked) and its outcomes freeing none, so that a slot
// passes from one finished job to the next inside the process without a
// write. The slots are the same ones per-attempt claims take
// (ClaimLimited without Blocked): a slot is free, held by an attempt, or
// leased to an owner, never two of these; so the attempts holding slots
// and the slots leased in blocks never exceed the limit together.
//
// A block's slots stay with their owner while it renews them, and after
// their lease expired for as long as a job of the queue is running under
// a claim of the owner (attempted_by = owner): Rescue frees a slot whose
// lease expired only when no such job runs (after it rescued the
// owner's expired jobs, in the same round or a later one). An owner that
// starts a claimed job only if the claim came back before the block's
// lease, by its own clock, could have expired, and never runs more
// attempts at once than it holds slots, therefore never runs more than
// the limit together with every other process.
type SlotLeaser interface {
	// LeaseSlots sets how many of each queue's concurrency slots owner
	// holds, for each queue of want, in one transaction that commits
	// durably: it keeps up to want[q] of the slots owner holds, those
	// below the queue's MaxRunning first (the lowest first), then those at
	// or above it (a lowered limit: the owner's handlers may still run
	// under them, and a slot it keeps is no one else's); takes free ones
	// below MaxRunning (never one an attempt or another owner holds, never
	// waiting for another caller: SKIP LOCKED where the database has it)
	// until owner holds want[q] or min(want[q], MaxRunning), or none is
	// free; and gives back the rest of owner's slots of the queue. It
	// takes none while a slot at or above the queue's MaxRunning is held
	// by an attempt or another owner (a lowered limit whose running
	// attempts have not ended), and reports in Usable how many attempts
	// the owner may run now.
	// Every slot owner keeps or takes is leased until ttl from the
	// database's clock. want[q] = 0 gives back all of q's, as does a
	// queue without a MaxRunning (whose slots are then deleted by
	// Rescue's sweep, as free slots at or above the limit are). It
	// returns each queue of want's block. It is on the lease path (see
	// Driver.Complete): a block is renewed on a connection that claims
	// and handlers never hold.
	//
	// A backend that holds MaxRunning by counting the queue's running
	// jobs (SQLite, see ClaimLimited) counts, against the limit, the
	// slots leased in blocks and the running jobs that no block's owner
	// claimed; it takes slots while fewer than MaxRunning are in use, and
	// Usable is min(Held, MaxRunning less the others in use).
	LeaseSlots(ctx context.Context, owner string, want map[string]int, ttl time.Duration) (map[string]SlotBlock, error)
}

// Driver is a database backend. All methods are safe for concurrent use.
type Driver interface {
	// Name is the backend's short name: "sqlite", "postgres", "mysql".
	Name() string
	// Capabilities tells the engine what the backend can do.
	Capabilities() Capabilities
	// ServerInfo describes the server and its durability settings, for
	// reports.
	ServerInfo(ctx context.Context) (map[string]string, error)

	// Migrate applies missing migrations and returns the versions applied.
	Migrate(ctx context.Context) ([]int, error)
	// SchemaVersion returns the applied and the latest known version.
	SchemaVersion(ctx context.Context) (current, latest int, err error)

	// Insert inserts jobs in one statement and one commit of its own and
	// returns their ids in order. It also wakes other processes' fetchers
	// for the queues it touched (one notification per queue). Its error
	// is marked NotCommitted when the driver knows that none of the jobs
	// was committed (see IsNotCommitted); otherwise they may have been.
	Insert(ctx context.Context, jobs []InsertParams) ([]int64, error)
	// InsertTx inserts jobs inside the caller's transaction, whose type
	// the backend checks (ErrTxType otherwise).
	InsertTx(ctx context.Context, tx any, jobs []InsertParams) ([]int64, error)
	// InsertUnique inserts jobs in the caller's transaction tx or, when tx
	// is nil, in one transaction of its own: all of them or none. Jobs
	// without a UniqueKey are inserted as Insert would; the keys of the
	// others are distinct within the call. A job whose key is held by a
	// job already stored (or being inserted by a transaction that then
	// commits) is not inserted: its id is the holder's and its duplicate
	// flag is set. Enforced by a unique index, never by a read before the
	// insert; rows with a key are inserted in key order so that concurrent
	// inserters of overlapping keys cannot deadlock. Wakes like Insert,
	// and marks its error NotCommitted as Insert does.
	InsertUnique(ctx context.Context, tx any, jobs []InsertParams) (ids []int64, dup []bool, err error)
	// BulkInsert streams many jobs (COPY where available) in one
	// transaction and returns how many were inserted. It marks its error
	// NotCommitted as Insert does.
	BulkInsert(ctx context.Context, jobs []InsertParams) (int64, error)

	// Claim moves up to Limit due jobs of a queue to running, increments
	// their attempt and their fence token, sets their lease and returns
	// them, in claim order within each priority (the engine starts them
	// by priority). It never blocks on another claimer's locks and never
	// deadlocks.
	Claim(ctx context.Context, p ClaimParams) ([]*JobRow, error)
	// ClaimLimited is Claim for a queue that may have limits
	// (SetQueueLimits). It reads the queue's limits inside its own
	// transaction and claims at most as many jobs as the queue's free
	// concurrency slots and the room left in its rate window allow,
	// taking a slot for each claimed attempt and recording each start,
	// in the same transaction as the claim. Slots are rows of their own,
	// locked with SKIP LOCKED where the database has it: concurrent
	// claimers never wait for each other and never count the same slot
	// twice. A queue without limits is claimed as Claim claims it. Every
	// statement that ends an attempt (Complete, whatever the outcome;
	// Release; Rescue; Cancel and Discard of a running job) frees the
	// attempt's slot in its own transaction; Rescue also frees slots
	// whose holder is no longer running under the slot's fence. ClaimJob
	// takes no slot.
	//
	// A backend whose write transactions are exclusive (SQLite) may hold
	// the concurrency limit without slot rows, by counting the queue's
	// running jobs inside the claim's transaction: nothing is then freed
	// when an attempt ends, and every running job of the queue counts,
	// ClaimJob's and those claimed before the limit was set included.
	//
	// Key limits (KeyMaxRunning, Ordered): a job with a key is claimed
	// only into a free slot of its key (a key slot row (queue, key, n),
	// n < KeyMaxRunning, 1 when Ordered), taken in the same transaction,
	// beside the queue's own slots. Key slot rows are made on demand by
	// claims (INSERT of the missing ones, never waiting on a held one)
	// and deleted by Rescue's sweep once free and unused for a while.
	// The claim finds keys by walking the distinct keys of due jobs in
	// key order from where the driver's last claim of the queue stopped
	// (wrapping around), so that keys are served in rotation and the
	// cost of a claim does not grow with the depth of any key; within a
	// key it takes jobs by priority then id (Ordered: by id alone, the
	// key's oldest due job only). A key slot kept for an ordered key's
	// retry (see QueueLimits.Ordered) admits only the job it is kept
	// for. Jobs without a key are claimed as in a queue without key
	// limits, after the keyed ones, within the same queue limits. Held
	// is true when due jobs were left because their keys had no free
	// slot. The statements that end an attempt free its key slot as
	// they free its queue slot, fenced the same way; a retryable or
	// snoozed outcome in an Ordered queue without OrderedMoveOn keeps
	// the slot for the job instead (its fence cleared), and Rescue's
	// sweep frees a kept slot whose job is no longer waiting to run.
	ClaimLimited(ctx context.Context, p ClaimParams) (ClaimResult, error)
	// ClaimJob claims job id as Claim claims a job (state running, attempt
	// incremented, fence token advanced, lease set from the database's clock,
	// attempted_by set to worker), whatever its queue, priority or
	// schedule, provided it is available, scheduled or retryable, and
	// returns it as claimed. It returns an error wrapping ErrNotFound when
	// there is no such job and one wrapping ErrWrongState when it is
	// running or finished. Like Claim it never hands out a job that another
	// claim holds: of a ClaimJob and a Claim racing for the same job, one
	// gets it. Used to run one job on demand (conveyortest).
	ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*JobRow, error)
	// Complete applies outcomes fenced by the claim's fence token and
	// returns the ids that took effect; the others were stale and are
	// refused. Complete, Heartbeat and Release are the lease path: a
	// backend runs them on connections of their own, which the
	// application's handlers and conveyor's claims and inserts never hold,
	// so that renewing or ending a lease never waits for a pooled
	// connection or behind another writer of this process. A backend
	// whose Complete is more than one transaction returns, with an error,
	// the ids of the outcomes its committed transactions applied before
	// it: the caller writes only the others again (written again, an
	// applied outcome would be refused as stale).
	Complete(ctx context.Context, outcomes []Outcome) (applied []int64, err error)
	// Heartbeat extends the leases of running attempts and returns the ids
	// still owned; an id missing from the result has lost its lease.
	Heartbeat(ctx context.Context, leases []Lease, lease time.Duration) (owned []int64, err error)
	// Release makes running attempts available again without counting the
	// attempt (graceful shutdown). The fence token is kept, so the next
	// claim gets a larger one and a late acknowledgement of the released
	// attempt is refused.
	Release(ctx context.Context, leases []Lease) (int64, error)

	// Rescue handles up to limit running jobs whose lease expired by the
	// database's clock: each becomes available again (scheduled_at kept),
	// or discarded (finalized) when attempt >= max_attempts, and gets an
	// AttemptError "lease expired: <attempted_by> stopped heartbeating".
	// It returns the number of jobs rescued per queue and wakes other
	// processes' fetchers for those queues where the backend can notify.
	// It also gives back the slots of blocks (SlotLeaser) whose lease
	// expired and whose owner has no job of the slot's queue running
	// (attempted_by = owner), re-checking the lease on the slot's latest
	// version so that a block renewed meanwhile stays with its owner: a
	// dead owner's slots free in the round that rescued its last expired
	// job of the queue, or a later one.
	Rescue(ctx context.Context, limit int) (map[string]int, error)
	// Promote makes up to limit scheduled and retryable jobs whose
	// scheduled_at has passed available, and returns the count per queue,
	// notifying like Rescue.
	Promote(ctx context.Context, limit int) (map[string]int, error)
	// Prune deletes finished jobs finalized longer ago than the given ages,
	// and the results stored longer ago than completedAge.
	Prune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error)
	// Maintain runs one round of the backend's own upkeep of its tables:
	// on PostgreSQL, the rotation, sealing and reclaiming of segment
	// tables (docs/postgres-storage.md); the other backends have none and
	// return nil. Only the maintenance leader calls it, once per round of
	// its loop (every PromoteInterval), before Promote; a backend may skip
	// a round that comes sooner than its own interval. It never waits for
	// a lock that a worker or a long transaction holds: a step whose lock
	// is not free is left for a later round. It returns how many times
	// each task did something, by the task's name (for logs and tests),
	// leaving out tasks that did nothing. It changes no job's state: a
	// job it moves to another table stays as it was, and visible to every
	// call.
	Maintain(ctx context.Context) (map[string]int, error)
	// TryLead takes or keeps leadership of the maintenance loops for ttl.
	// A negative ttl gives up leadership that id holds: the row expires at
	// once and the next TryLead of another id takes it.
	TryLead(ctx context.Context, id string, ttl time.Duration) (bool, error)

	// RecordSchedule records that schedule s.Name made (or found made)
	// the job s.LastJob for slot s.LastSlot, and that its next slot is
	// s.NextSlot; a record of an earlier slot than the one stored changes
	// only the spec.
	RecordSchedule(ctx context.Context, s ScheduleRow) error
	// Schedules lists the recorded schedules by name.
	Schedules(ctx context.Context) ([]ScheduleRow, error)
	// TouchSchedules sets the updated_at of the named schedules' rows to
	// the database's now: a started process that has them says it still
	// does, however far apart their slots, so that PruneSchedules keeps
	// them. A name without a row gets none (its first slot records it).
	TouchSchedules(ctx context.Context, names []string) error
	// PruneSchedules deletes the schedules that no process recorded or
	// touched for age, by the database's clock, and returns how many.
	PruneSchedules(ctx context.Context, age time.Duration) (int64, error)

	// PauseQueue pauses (paused) or resumes a queue for every process on
	// the database: no claim that starts after it returns takes a job of
	// a paused queue. Resuming wakes other processes' fetchers for the
	// queue where the backend can notify. Pausing a paused queue keeps
	// its first pause time.
	PauseQueue(ctx context.Context, queue string, paused bool) error
	// PausedQueues returns the paused queues and when each was paused.
	PausedQueues(ctx context.Context) (map[string]time.Time, error)

	// SetQueueLimits stores queue's limits for every process (the zero
	// QueueLimits removes them), with the slot rows they need. A lowered
	// MaxRunning stops new claims until fewer attempts than the new limit
	// hold slots; attempts already running finish. It leaves the queue's
	// pause as it was, and PauseQueue leaves its limits.
	SetQueueLimits(ctx context.Context, queue string, l QueueLimits) error
	// QueueLimits returns the limits of every limited queue: one cheap
	// read of the queues table (processes refresh it every second).
	QueueLimits(ctx context.Context) (map[string]QueueLimits, error)
	// LimitUsage returns every limited queue's limits and their use.
	LimitUsage(ctx context.Context) (map[string]LimitUsage, error)
	// SetKeyWeights replaces queue's key weights (nil or empty removes
	// them), already checked by CheckKeyWeights; the queue need not exist
	// or have limits yet. They are kept beside the queue's limits
	// (SetQueueLimits leaves them as they are) and weigh its keys while the
	// queue is Fair (QueueLimits.Fair): the first claim that begins
	// after SetKeyWeights returned uses them.
	SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error
	// KeyWeights returns the key weights of every queue that has some.
	KeyWeights(ctx context.Context) (map[string]map[string]int, error)

	// RegisterProcess inserts or refreshes p's row in the processes
	// table (one upsert): heartbeat_at becomes the database's now and
	// expires_at now plus ttl; started_at is kept, unless the stored row
	// had expired (then the process starts anew). p's StartedAt,
	// HeartbeatAt, ExpiresAt and Alive are ignored. It is a cheap write
	// made every few seconds per process, never on the claim path.
	RegisterProcess(ctx context.Context, p ProcessRow, ttl time.Duration) error
	// RemoveProcess deletes process id's row (a graceful stop); removing
	// a row that does not exist is not an error.
	RemoveProcess(ctx context.Context, id string) error
	// Processes lists every stored process, alive ones first, each by
	// kind and id; Alive is judged by the database's clock (expires_at
	// still ahead).
	Processes(ctx context.Context) ([]ProcessRow, error)
	// PruneProcesses deletes processes whose row expired longer ago
	// than age (by the database's clock) and returns how many.
	PruneProcesses(ctx context.Context, age time.Duration) (int64, error)

	// Listen returns a listener for queue wake-ups, or nil when the backend
	// has no push channel (Capabilities.Listen is false).
	Listen(ctx context.Context) (Listener, error)

	// Admin.
	// GetJob returns job id, with its Result when it is completed and
	// its completion stored one, and its BatchID and CallbackOf (one
	// indexed probe each, in one statement).
	GetJob(ctx context.Context, id int64) (*JobRow, error)
	ListJobs(ctx context.Context, f JobFilter) ([]*JobRow, error)
	// ListJobsTx is ListJobs inside the caller's transaction (of a type
	// InsertTx accepts, ErrTxType otherwise): it sees the jobs that
	// transaction inserted, before it commits.
	ListJobsTx(ctx context.Context, tx any, f JobFilter) ([]*JobRow, error)
	// Retry makes a discarded, cancelled, completed, retryable or
	// scheduled job available now, granting one more attempt if all were
	// used. A finished unique job whose key another job holds now is
	// refused with a *UniqueConflictError (ErrUniqueConflict), and left as
	// it was.
	Retry(ctx context.Context, id int64) (*JobRow, error)
	// Cancel cancels a job that has not finished.
	Cancel(ctx context.Context, id int64) (*JobRow, error)
	// Discard discards a job that has not finished.
	Discard(ctx context.Context, id int64) (*JobRow, error)
	// Stats counts every job by queue and state: it reads the whole jobs
	// table, so its cost grows with the table.
	Stats(ctx context.Context) ([]QueueStats, error)
	// Overview is Stats at a cost bounded by the unfinished jobs and the
	// recently finished ones: the unfinished states (available,
	// scheduled, retryable, running) are counted exactly through their
	// partial or secondary indexes, and the finished states (completed,
	// discarded, cancelled) count only the jobs whose finalized_at (the
	// database's clock) is at or after finishedSince, read as a range of
	// the finalized_at index. Queues without such jobs are left out.
	Overview(ctx context.Context, finishedSince time.Time) ([]QueueStats, error)

	// InsertBatches inserts jobs and batches in the caller's transaction
	// tx or, when tx is nil, in one transaction of its own: the jobs (as
	// InsertTx inserts them; none unique), then per batch a row that
	// keeps its callback (encoded, not yet a job), one member row per job
	// of the batch and one row per earlier batch it waits for. It returns
	// the jobs' ids and the batches' ids in order. In a transaction of
	// its own it marks its error NotCommitted as Insert does.
	InsertBatches(ctx context.Context, tx any, jobs []InsertParams, batches []BatchParams) (jobIDs, batchIDs []int64, err error)
	// FireBatches enqueues the callback of up to limit batches whose
	// every member has finished (completed, discarded or cancelled, or
	// deleted by Prune since), whose every batch waited for (After) has
	// its callback enqueued and finished, and whose callback was not
	// enqueued yet,
	// and returns the callback's id by batch id. Each batch is fired in a
	// transaction of its own that reads the batch again under locks that
	// a retry by hand of a member conflicts with (a member retried since
	// the batch was read keeps it open; one retried later waits for the
	// commit), inserts the callback (its metadata given BatchMetaKey) and
	// records its id on the batch row only if no callback is recorded
	// there yet, so that concurrent callers enqueue each callback exactly
	// once. A batch whose callback cannot be enqueued does not keep the
	// others from firing: they are fired, past limit's first batches if
	// need be, and the error is a *BatchFireError naming each batch that
	// failed (see FireReady). A batch for which skip (nil: none) reports
	// true is not fired (nor counted against limit) and is left for a
	// later call: the leader's backoff of a batch whose callback failed.
	FireBatches(ctx context.Context, limit int, skip func(batchID int64) bool) (map[int64]int64, error)
	// GetBatch returns batch id and every member's state and result,
	// the callbacks already enqueued of the batches it waits for counting
	// as members (ErrBatchNotFound when there is no such batch).
	GetBatch(ctx context.Context, id int64) (*BatchRow, error)

	// Counters returns backend-specific counters (busy retries, deadlock
	// retries) accumulated by this driver.
	Counters() map[string]int64

	// DropAll drops every table under this driver's prefix (tests, bench).
	DropAll(ctx context.Context) error

	Close() error
}

// Options configure a backend at open. The engine fills defaults.
type Options struct {
	// Prefix is prepended to every table name (and the PostgreSQL
	// notification channel). Already validated by sqlq.CheckPrefix.
	Prefix string
	// PoolSize caps the backend's connection pool; 0 means backend default.
	PoolSize int
	// ClaimStrategy selects the claim on backends with a choice (MySQL):
	// "" (automatic from the server version), "skip-locked", "optimistic".
	ClaimStrategy string
	// Synchronous is SQLite's synchronous mode in WAL: "NORMAL" (durable
	// against a process crash; the default) or "FULL" (also power loss).
	Synchronous string
}

// ScheduleRow is a periodic schedule as recorded in the database.
type ScheduleRow struct {
	Name, Spec string
	// LastSlot is the latest slot a job was made for (zero if none) and
	// LastJob that job's id.
	LastSlot time.Time
	LastJob  int64
	// NextSlot is the slot after LastSlot (zero if none).
	NextSlot time.Time
	// UpdatedAt is when a process last recorded the schedule, or said it
	// still has it (TouchSchedules).
	UpdatedAt time.Time
}

// Kinds of process (ProcessRow.Kind).
const (
	// ProcessClient is a started conveyor client working queues in its
	// own process.
	ProcessClient = "client"
	// ProcessHTTP is a worker of the HTTP worker protocol, registered by
	// the web handler that serves its claims.
	ProcessHTTP = "http"
)

// ProcessRow is a process working queues, as it last registered itself.
type ProcessRow struct {
	// ID is the process's worker id, as it appears in attempted_by.
	ID string
	// Kind is ProcessClient or ProcessHTTP.
	Kind string
	// Host is the host name (a client) or the remote address the worker
	// connects from (an HTTP worker).
	Host string
	// PID is the operating system's process id; 0 when unknown.
	PID int
	// Version is the conveyor version of the process ("" when unknown).
	Version string
	// Queues maps each queue the process works to its concurrency (0
	// when unknown, as for HTTP workers).
	Queues map[string]int
	// StartedAt is when the process first registered, HeartbeatAt when
	// it last did and ExpiresAt when it stops counting as alive without
	// another registration, all by the database's clock.
	StartedAt, HeartbeatAt, ExpiresAt time.Time
	// Alive is whether ExpiresAt is still ahead of the database's clock.
	Alive bool
}

// CancelNotice is what a Listener delivers, instead of a queue name (no
// queue name can be it), when a running job was cancelled or discarded by
// hand: the engine then renews its leases at once, which finds the job no
// longer running and stops its handler.
const CancelNotice = "!cancel"

// Listener delivers queue names that have new work.
type Listener interface {
	// Wait blocks until a notification arrives or ctx ends; it reconnects
	// by itself and reports (with queue "") after a reconnect so that the
	// engine refetches anything it may have missed.
	Wait(ctx context.Context) (queue string, err error)
	Close() error
}

// ErrBatchNotFound is returned by GetBatch for an id that does not exist.
var ErrBatchNotFound = errors.New("batch not found")

// BatchMetaKey is the metadata key under which a batch's callback job
// carries the batch's id (decimal).
const BatchMetaKey = "conveyor.batch_id"

// BatchRow is a batch as stored, with its members.
type BatchRow struct {
	ID int64
	// CreatedAt is when the batch was inserted, FiredAt when its
	// callback was enqueued (zero until then), by the database's clock.
	CreatedAt, FiredAt time.Time
	// CallbackID is the callback job's id, 0 until it is enqueued.
	CallbackID int64
	// Callback is the callback job as it will be, or was, inserted.
	Callback InsertParams
	// Members are the batch's jobs by id.
	Members []BatchMember
	// Waiting are the batches it waits for (BatchParams.After) whose
	// callback is not enqueued yet, by id: each callback becomes a
	// member once enqueued. Read before Members, so that a batch firing
	// meanwhile may be in both, never in neither.
	Waiting []int64
}

// BatchMember is one job of a batch.
type BatchMember struct {
	ID int64
	// State is the job's state, "" when Prune deleted it.
	State string
	// Result is the job's result (see JobRow.Result), nil for none.
	Result json.RawMessage
}

// CallbackForBatch returns callback with BatchMetaKey set to batchID in
// its metadata.
func CallbackForBatch(callback InsertParams, batchID int64) (InsertParams, error) {
	m := map[string]string{}
	if len(callback.Meta) > 0 {
		if err := json.Unmarshal(callback.Meta, &m); err != nil {
			return callback, fmt.Errorf("batch %d: callback metadata: %w", batchID, err)
		}
	}
	if m == nil { // "null"
		m = map[string]string{}
	}
	m[BatchMetaKey] = fmt.Sprint(batchID)
	b, err := json.Marshal(m)
	if err != nil {
		return callback, err
	}
	callback.Meta = b
	return callback, nil
}

// BatchParams is one batch of InsertBatches.
type BatchParams struct {
	// Callback is the job enqueued once the batch has finished.
	Callback InsertParams
	// Jobs are the batch's members, as indexes into InsertBatches' jobs.
	Jobs []int
	// After are earlier batches of the same call (indexes) the batch
	// also waits for: each has finished once its callback was enqueued
	// and has finished.
	After []int
}
