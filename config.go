package conveyor

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/conveyorq/conveyor/internal/engine"
	"github.com/conveyorq/conveyor/internal/sqlq"
)

// Config configures a Client. The zero value is usable: every field has a
// documented default, filled in by New and connect.Open (in withDefaults,
// the one place defaults live); a zero field always means its default. A
// value that makes no sense (a negative duration or batch size, a
// heartbeat slower than half the lease, a nil middleware) is refused by
// New with ErrInvalidConfig and an error naming the field, before
// anything is opened.
type Config struct {
	// Queues maps each queue this client works to its settings.
	// Default: {"default": {MaxWorkers: 100}} unless NoQueues. A client
	// that only enqueues still gets this default but runs nothing until
	// Start. Names are queue names (EnqueueOpts.Queue); another is
	// refused.
	Queues map[string]QueueConfig
	// NoQueues makes a client that works no queue: Queues must then be
	// empty (both set is refused) and gets no default. Started, such a client claims nothing
	// but takes part in maintenance like any started client (the leader
	// among them promotes due scheduled and retryable jobs, rescues
	// expired leases and prunes) and runs its periodic schedules. This is
	// for a process whose jobs are worked elsewhere, such as HTTP workers
	// served by package web (conveyor serve runs one). Default false.
	NoQueues bool

	// TablePrefix is prepended to every conveyor table (and the
	// PostgreSQL notification channel), so conveyor can share the
	// application's database. Lower-case letters, digits and underscores,
	// starting with a letter, at most 31 characters (another is refused).
	// Default "conveyor_".
	TablePrefix string

	// ClaimBatch caps the jobs one claim takes (claims are also capped by
	// the queue's free worker slots, and by what its workers run in about
	// 5 ms when they claim ahead of them, or on SQLite by one batch of
	// them: see QueueConfig.MaxWorkers): 1 to 10000. Default 1000.
	ClaimBatch int
	// CompleteBatch caps the outcomes written in one statement: 1 to
	// 100000. Default 2000.
	CompleteBatch int
	// InsertBatch caps the jobs coalesced into one insert by concurrent
	// Enqueue calls: 1 to 100000. Default 1000.
	InsertBatch int

	// Lease is how long a claimed job is owned without a heartbeat; after
	// it expires (by the database's clock) the job is rescued. A process
	// whose renewals do not get through cancels a handler's context when
	// four fifths of the lease have passed since the last renewal that
	// succeeded was sent, so the handler has the last fifth (6s of the
	// default) to return before another process may take the job.
	// At least 100ms. Default 30s.
	Lease time.Duration
	// HeartbeatInterval is how often one statement renews the leases of
	// all running jobs of this process, on connections of its own. At most
	// Lease/2, so that a failed renewal is retried well before handlers
	// are cancelled. Default Lease/5 (6s of the default lease): a process
	// then rides out a stall of its renewals (a saturated machine, a
	// database that pauses) of about three fifths of the lease before it
	// must stop its handlers. At least 1ms.
	HeartbeatInterval time.Duration
	// JobTimeout is the default per-job timeout: the handler's context is
	// cancelled and the attempt fails. Negative means none; at most 30
	// days (as WorkerOpts.Timeout). Default 1m.
	JobTimeout time.Duration
	// MaxAttempts is the default maximum attempts of a job, 1 to 1000.
	// Default 25.
	MaxAttempts int

	// PollMin and PollMax bound the adaptive poll of backends without
	// notifications (SQLite, MySQL, and PostgreSQL through a transaction
	// pooler without a listen connection): PollMin while work is flowing,
	// doubling to PollMax when idle. Jobs enqueued by this process wake
	// fetchers at once; the poll is for other processes. Each at least
	// 1ms, PollMax not below PollMin. Defaults 10ms and 500ms (PollMin
	// when that is longer).
	PollMin, PollMax time.Duration
	// ListenPoll is the fallback poll on PostgreSQL, where LISTEN/NOTIFY
	// wakes fetchers. At least 1ms. Default 2s.
	ListenPoll time.Duration
	// PromoteInterval is how often the leader makes due scheduled and
	// retryable jobs available: the most a scheduled job runs late when
	// the leader's process works its queue, or on PostgreSQL with
	// notifications. Elsewhere (SQLite, MySQL, PostgreSQL through a
	// transaction pooler) a process that is not the leader sees the job
	// at its next poll, up to PollMax later. At least 1ms. Default 250ms.
	PromoteInterval time.Duration
	// RescueInterval is how often the leader rescues expired leases.
	// At least 1ms. Default 5s.
	RescueInterval time.Duration
	// PruneInterval is how often the leader deletes old finished jobs.
	// At least 1ms. Default 1m.
	PruneInterval time.Duration
	// CompletedRetention keeps completed jobs this long after they
	// finished; the next prune after that deletes them. Negative is
	// refused (to keep finished jobs for years, give years). Default 24h.
	CompletedRetention time.Duration
	// DiscardedRetention keeps discarded and cancelled jobs this long, as
	// CompletedRetention. Default 7 days.
	DiscardedRetention time.Duration
	// ShutdownTimeout bounds how long Stop waits for running jobs before
	// cancelling their contexts. Negative is refused. Default 10s.
	ShutdownTimeout time.Duration

	// MaxArgsBytes rejects encoded arguments larger than this at enqueue,
	// before anything is sent. Default 1 MiB (lowered to what the server
	// accepts where that is smaller, as on MySQL). At least 2 (the
	// smallest JSON object, {}).
	MaxArgsBytes int

	// Backoff returns the wait before retry number attempt (1-based).
	// Default: exponential with jitter, about 2^(attempt-1) seconds drawn
	// from [d/2, d], capped at one hour.
	Backoff func(attempt int) time.Duration

	// AllowUnregisteredKinds lets a client that has workers enqueue kinds
	// it has no worker for (another service works them). By default such
	// an enqueue is refused with ErrUnknownKind. A client with no workers
	// at all may always enqueue any kind.
	AllowUnregisteredKinds bool

	// WorkMiddleware wraps every attempt this client runs, the first
	// outermost, outside the kind's own (WorkerOpts.Middleware). A nil
	// entry is refused.
	WorkMiddleware []WorkMiddleware
	// EnqueueMiddleware wraps every enqueue call of this client, the
	// first outermost. A nil entry is refused.
	EnqueueMiddleware []EnqueueMiddleware

	// Logger receives warnings (database errors being retried, leases lost
	// or not renewed in time) and one record per failed attempt, each with
	// attributes (job_id, kind, queue, attempt, max_attempts, duration,
	// error, next_state). Nothing is logged for a successful job. Default
	// slog.Default().
	Logger *slog.Logger
	// FailedAttemptLevel is the level of the record logged for each failed
	// attempt, for example slog.LevelInfo or slog.LevelDebug (a level below
	// the handler's own silences them). Default slog.LevelWarn.
	FailedAttemptLevel slog.Leveler
}

// QueueConfig configures one queue of a client.
type QueueConfig struct {
	// MaxWorkers is the most jobs of this queue run at once in this
	// process, 1 to 10000. Default 100. While the queue has a backlog of jobs whose
	// handlers take under 5 ms on average, the fetcher claims ahead of
	// its free workers as many jobs as they run in about 5 ms (at least
	// MaxWorkers, at most ClaimBatch; MaxWorkers in a queue with limits
	// and on SQLite), which wait for a worker (docs/design.md, "Claims
	// ahead for short jobs").
	MaxWorkers int
}

// ErrInvalidConfig is returned by New (and connect.Open) for a Config or
// QueueConfig field whose value makes no sense, such as a negative
// duration or batch size; the message names the field. Zero always means
// the field's default.
var ErrInvalidConfig = errors.New("conveyor: invalid Config")

// Bounds of Config fields, beyond which New refuses a value.
const (
	maxWorkersLimit   = 10000
	maxClaimBatch     = 10000
	maxOtherBatch     = 100000 // CompleteBatch and InsertBatch
	minLease          = 100 * time.Millisecond
	minInterval       = time.Millisecond // the polls and maintenance intervals
	defaultPollMax    = 500 * time.Millisecond
	defaultMaxWorkers = 100
)

// withDefaults fills in the default of every zero field and refuses, with
// ErrInvalidConfig and the field's name, the values that make no sense.
func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	switch {
	case c.NoQueues && len(c.Queues) > 0:
		return bad("NoQueues is set but Queues names %d queue(s): give one or the other", len(c.Queues))
	case c.NoQueues:
		c.Queues = map[string]QueueConfig{}
	case len(c.Queues) == 0:
		c.Queues = map[string]QueueConfig{DefaultQueue: {}}
	}
	qs := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		if checkQueue(name) != nil {
			return bad("Queues: %q is not a queue name (1 to 128 letters, digits, '_', '-', '.' or ':', starting with a letter or digit)", name)
		}
		defInt(&q.MaxWorkers, defaultMaxWorkers)
		if q.MaxWorkers < 1 || q.MaxWorkers > maxWorkersLimit {
			return bad("Queues[%q].MaxWorkers %d out of range 1..%d (0 takes the default, %d)", name, q.MaxWorkers, maxWorkersLimit, defaultMaxWorkers)
		}
		qs[name] = q
	}
	c.Queues = qs
	if c.TablePrefix == "" {
		c.TablePrefix = "conveyor_"
	}
	if err := sqlq.CheckPrefix(c.TablePrefix); err != nil {
		return bad("TablePrefix %q: lower-case letters, digits and underscores, starting with a letter, at most 31 characters", c.TablePrefix)
	}
	for _, b := range []struct {
		name     string
		v        *int
		def, max int
	}{
		{"ClaimBatch", &c.ClaimBatch, 1000, maxClaimBatch},
		{"CompleteBatch", &c.CompleteBatch, 2000, maxOtherBatch},
		{"InsertBatch", &c.InsertBatch, 1000, maxOtherBatch},
	} {
		defInt(b.v, b.def)
		if *b.v < 1 || *b.v > b.max {
			return bad("%s %d out of range 1..%d (0 takes the default, %d)", b.name, *b.v, b.max, b.def)
		}
	}
	def(&c.Lease, 30*time.Second)
	if c.Lease < minLease {
		return bad("Lease %v is shorter than %v (0 takes the default, 30s)", c.Lease, minLease)
	}
	def(&c.HeartbeatInterval, c.Lease/5)
	if c.HeartbeatInterval < minInterval || c.HeartbeatInterval > c.Lease/2 {
		return bad("HeartbeatInterval %v must be between %v and half the Lease (%v) (0 takes the default, Lease/5)", c.HeartbeatInterval, minInterval, c.Lease/2)
	}
	def(&c.JobTimeout, time.Minute)
	if c.JobTimeout > maxTimeout {
		return bad("JobTimeout %v over the %v limit (negative means none, 0 takes the default, 1m)", c.JobTimeout, maxTimeout)
	}
	defInt(&c.MaxAttempts, 25)
	if c.MaxAttempts < 1 || c.MaxAttempts > maxAttemptsLimit {
		return bad("MaxAttempts %d out of range 1..%d (0 takes the default, 25)", c.MaxAttempts, maxAttemptsLimit)
	}
	def(&c.PollMin, 10*time.Millisecond)
	def(&c.PollMax, max(defaultPollMax, c.PollMin))
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PollMin", &c.PollMin, 10 * time.Millisecond},
		{"PollMax", &c.PollMax, defaultPollMax},
		{"ListenPoll", &c.ListenPoll, 2 * time.Second},
		{"PromoteInterval", &c.PromoteInterval, 250 * time.Millisecond},
		{"RescueInterval", &c.RescueInterval, 5 * time.Second},
		{"PruneInterval", &c.PruneInterval, time.Minute},
	} {
		def(d.v, d.def)
		if *d.v < minInterval {
			return bad("%s %v is shorter than %v (0 takes the default, %v)", d.name, *d.v, minInterval, d.def)
		}
	}
	if c.PollMax < c.PollMin {
		return bad("PollMax %v is shorter than PollMin %v", c.PollMax, c.PollMin)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"CompletedRetention", &c.CompletedRetention, 24 * time.Hour},
		{"DiscardedRetention", &c.DiscardedRetention, 7 * 24 * time.Hour},
		{"ShutdownTimeout", &c.ShutdownTimeout, 10 * time.Second},
	} {
		def(d.v, d.def)
		if *d.v < 0 {
			return bad("%s %v is negative (0 takes the default, %v)", d.name, *d.v, d.def)
		}
	}
	defInt(&c.MaxArgsBytes, 1<<20)
	if c.MaxArgsBytes < 2 {
		return bad("MaxArgsBytes %d is less than 2, the smallest JSON object (0 takes the default, 1 MiB)", c.MaxArgsBytes)
	}
	for i, mw := range c.WorkMiddleware {
		if mw == nil {
			return bad("WorkMiddleware[%d] is nil", i)
		}
	}
	for i, mw := range c.EnqueueMiddleware {
		if mw == nil {
			return bad("EnqueueMiddleware[%d] is nil", i)
		}
	}
	if c.Backoff == nil {
		c.Backoff = engine.DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.FailedAttemptLevel == nil {
		c.FailedAttemptLevel = slog.LevelWarn
	}
	return c, nil
}

// The processes table (Client.Processes): a started client refreshes its
// row every processInterval; the row counts as alive for processTTL after
// each refresh (a killed process shows as gone within that, about when
// the leases of its jobs expire), and the maintenance leader deletes rows
// gone for processPruneAge.
const (
	processInterval = 5 * time.Second
	processTTL      = 30 * time.Second
	processPruneAge = 15 * time.Minute
)

// The periodic schedules' rows: every started client touches the rows
// of the schedules it has every scheduleTouchInterval (and at start), and
// the maintenance leader deletes a row no process recorded or touched for
// schedulePruneAge: a schedule that no process has any more (removed
// from the code). The age is far longer than the touch interval, so a
// process that still has the schedule, however far apart its slots,
// keeps its row through a rolling deploy, restarts and database outages
// of days.
const (
	scheduleTouchInterval = time.Hour
	schedulePruneAge      = 30 * 24 * time.Hour
)

// A batch whose callback the maintenance leader could not enqueue is
// tried again after batchFireBackoff, doubled at each failure in a row up
// to batchFireBackoffMax, rather than at every round (PromoteInterval).
const (
	batchFireBackoff    = time.Second
	batchFireBackoffMax = 5 * time.Minute
)

// moduleVersion is the version of the conveyor module built into this
// binary, "(devel)" when it is the main module or built from a work
// tree, "" when the build carries no module information.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	const path = "github.com/conveyorq/conveyor"
	if bi.Main.Path == path {
		return bi.Main.Version
	}
	for _, m := range bi.Deps {
		if m.Path == path {
			if m.Replace != nil && m.Replace.Version != "" {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return ""
}

func (c Config) engineConfig() engine.Config {
	qs := make(map[string]int, len(c.Queues))
	for n, q := range c.Queues {
		qs[n] = q.MaxWorkers
	}
	logger := c.Logger
	return engine.Config{
		Queues:              qs,
		ClaimBatch:          c.ClaimBatch,
		CompleteBatch:       c.CompleteBatch,
		InsertBatch:         c.InsertBatch,
		Lease:               c.Lease,
		HeartbeatInterval:   c.HeartbeatInterval,
		JobTimeout:          c.JobTimeout,
		PollMin:             c.PollMin,
		PollMax:             c.PollMax,
		ListenPoll:          c.ListenPoll,
		PromoteInterval:     c.PromoteInterval,
		RescueInterval:      c.RescueInterval,
		PruneInterval:       c.PruneInterval,
		CompletedRetention:  c.CompletedRetention,
		DiscardedRetention:  c.DiscardedRetention,
		ShutdownTimeout:     c.ShutdownTimeout,
		Backoff:             c.Backoff,
		Logger:              logger,
		FailedAttemptLevel:  c.FailedAttemptLevel.Level(),
		ProcessInterval:     processInterval,
		ProcessTTL:          processTTL,
		ProcessPruneAge:     processPruneAge,
		SchedulePruneAge:    schedulePruneAge,
		BatchFireBackoff:    batchFireBackoff,
		BatchFireBackoffMax: batchFireBackoffMax,
		Version:             moduleVersion(),
	}
}
