// Package lab holds the hooks that conveyor's own tests and its lab (the
// bench and the torture suite of cmd/conveyor) use on a client, and that
// the public API deliberately does not offer: dropping a prefix's tables,
// tuning the PostgreSQL segments storage, SQLite's lease-yield timing
// hook, running one job synchronously, the events of the engine's slow
// lease renewals and late claims, the text of a cut-off attempt's error
// entry, and the DSN conversion the bench opens its own connections with.
//
// Applications must not use it. Its calls destroy data (DropTables),
// override what the backend decides for itself (SealSegmentsAt),
// bypass the queues' concurrency limits and the client's shutdown
// (WorkOne), and expose the engine's internals (OnSlowRenewal, OnLateClaim,
// LeaseDeadlineMessage) that may change or go away in any release: none
// of it is covered by the compatibility promise of the rest of the API.
// It also links every backend, as package connect does. An application's
// tests use package conveyortest instead.
//
// The lab reaches conveyor only through package connect, this package and
// the public API: the command's module has a test that fails if one of
// its packages imports the library's internal packages (its tests may
// still use internal/testdb for the databases they run on).
package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/backend/mysql"
	"github.com/conveyorq/conveyor/internal/backend/postgres"
	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/engine"
	"github.com/conveyorq/conveyor/internal/seam"
)

// DropTables drops every conveyor table under the client's prefix, with
// every job in it. The client must not be used afterwards but to Close
// it.
func DropTables[TTx any](ctx context.Context, c *conveyor.Client[TTx]) error {
	return seam.DriverOf(c).DropAll(ctx)
}

// Worked is what WorkOne did with a job.
type Worked struct {
	// Err is the handler's error, nil when it succeeded (a panic, a
	// timeout and a kind without a worker are errors, as in a worker).
	Err error
	// Applied reports whether the database took the attempt's outcome:
	// false when the job stopped being this attempt's while it ran
	// (cancelled, discarded, or rescued after its lease expired).
	Applied bool
}

// WorkOne claims job id (available, scheduled or retryable, whatever its
// queue and schedule) and runs it through the client's registered worker
// in the calling goroutine, as a started client runs a job, writing its
// outcome before it returns. The client need not be started; WorkOne
// takes none of its worker slots. It returns an error when the job cannot
// be claimed, and one with a non-nil Worked when the handler ran but its
// outcome could not be written. (conveyortest.Work is the form for
// applications' tests.)
func WorkOne[TTx any](ctx context.Context, c *conveyor.Client[TTx], id int64) (*Worked, error) {
	w, err := seam.WorkOne(ctx, c, id)
	if w == nil {
		return nil, err
	}
	return &Worked{Err: w.Err, Applied: w.Applied}, err
}

// SealSegmentsAt makes the client's PostgreSQL backend seal the current
// segment of a phase at bytes (a finished segment at four times it)
// instead of the backend's own size, so that a short run rotates and
// reclaims segments many times (docs/postgres-storage.md). It applies to
// this client only, from its next maintenance round. It fails on another
// backend and for bytes <= 0.
func SealSegmentsAt[TTx any](c *conveyor.Client[TTx], bytes int64) error {
	if bytes <= 0 {
		return fmt.Errorf("conveyor/lab: seal size %d: want a positive number of bytes", bytes)
	}
	if !postgres.SealSegmentsAt(seam.DriverOf(c), bytes) {
		return fmt.Errorf("conveyor/lab: sealing segments at a size is a PostgreSQL setting; this client is on %s", c.Backend())
	}
	return nil
}

// MigrateTo migrates the client's PostgreSQL prefix up to version only,
// as an earlier release left it (at version 9, every job in the one table
// that version 10 converts to segment tables): the bench builds an
// upgraded database this way. It fails on another backend.
func MigrateTo[TTx any](ctx context.Context, c *conveyor.Client[TTx], version int) ([]int, error) {
	m, ok := seam.DriverOf(c).(interface {
		MigrateTo(context.Context, int) ([]int, error)
	})
	if !ok {
		return nil, fmt.Errorf("conveyor/lab: migrating to an earlier version is a PostgreSQL facility; this client is on %s", c.Backend())
	}
	return m.MigrateTo(ctx, version)
}

// YieldToLeases waits, for at most a quarter of a second, while a lease
// renewal of a conveyor client on the SQLite database file at path is
// pending, in this process or another, and returns ctx's error if ctx
// ends first. It returns at once when no conveyor client of this process
// has path open. Called before each BEGIN on a handle of one's own, it
// lets a renewal polling for SQLite's one write lock go first: the
// torture suite's transactional producer does so, as driver/sqlitedb's
// Driver.BeginTx does for applications.
func YieldToLeases(ctx context.Context, path string) error {
	return sqlite.YieldToLeases(ctx, path)
}

// SlowRenewal is one lease renewal of a client's engine that took longer
// than its Config.HeartbeatInterval (the engine also logs it as
// "conveyor: heartbeat slow"). A renewal this slow may come back after
// the engine had to cut handlers off, because their leases could no
// longer be known to be held (see LeaseDeadlineMessage).
type SlowRenewal struct {
	// Sent is when the renewal was sent.
	Sent time.Time
	// Took is how long it took until its answer was applied to the
	// leases (the engine's deadlines were the old ones until then), or
	// until it failed.
	Took time.Duration
	// Leases is how many leases it renewed.
	Leases int
	// Err is the renewal's error, nil when it got through.
	Err error
}

// OnSlowRenewal has fn called after each lease renewal of the client's
// engine that took longer than the heartbeat interval; nil removes the
// hook. fn is called on the heartbeat's own goroutine, which waits for
// it: it must return quickly. Set it before Start to see every renewal.
func OnSlowRenewal[TTx any](c *conveyor.Client[TTx], fn func(SlowRenewal)) {
	if fn == nil {
		seam.EngineOf(c).OnSlowRenewal(nil)
		return
	}
	seam.EngineOf(c).OnSlowRenewal(func(r engine.SlowRenewal) {
		fn(SlowRenewal{Sent: r.Sent, Took: r.Took, Leases: r.Leases, Err: r.Err})
	})
}

// LateClaim is one claim of a client's engine (a fetcher's, or an
// enqueue's that claimed its own jobs for idle workers) that came back
// more than its Config.HeartbeatInterval after it was sent. Its jobs'
// leases run from when it was sent, so their handlers start with less of
// their first lease, and the engine cuts them off at Deadline unless a
// renewal of theirs gets through first (see LeaseDeadlineMessage).
type LateClaim struct {
	// Sent is when the claim was sent; the leases run from it.
	Sent time.Time
	// Back is when its jobs were handed to the engine's workers, before
	// any renewal of their leases was sent and before their handlers
	// started.
	Back time.Time
	// Deadline is when the engine cuts their handlers off unless a
	// renewal got through: Sent plus the Lease, less a fifth of it.
	Deadline time.Time
	// Jobs are the claimed attempts: job ids and attempt numbers.
	Jobs []JobAttempt
}

// JobAttempt names one attempt of a job.
type JobAttempt struct {
	// ID is the job's id.
	ID int64
	// Attempt is the attempt's number.
	Attempt int
}

// OnLateClaim has fn called for each claim of the client's engine that
// came back later than the heartbeat interval, before the claimed jobs'
// handlers start; nil removes the hook. fn is called on the claiming
// goroutine, which waits for it: it must return quickly. Set it before
// Start to see every claim.
func OnLateClaim[TTx any](c *conveyor.Client[TTx], fn func(LateClaim)) {
	if fn == nil {
		seam.EngineOf(c).OnLateClaim(nil)
		return
	}
	seam.EngineOf(c).OnLateClaim(func(r engine.LateClaim) {
		jobs := make([]JobAttempt, len(r.Jobs))
		for i, j := range r.Jobs {
			jobs[i] = JobAttempt{ID: j.ID, Attempt: j.Attempt}
		}
		fn(LateClaim{Sent: r.Sent, Back: r.Back, Deadline: r.Deadline, Jobs: jobs})
	})
}

// LeaseDeadlineMessage is the message of the cause the engine gives a
// job's context when it cuts the handler off because the job's lease
// could not be renewed in time (so that the handler stops before the
// lease can expire and another process take the job). It is stored in
// the attempt's error entry (JobInfo.Errors): the entry starts with it
// when the handler returned the cause, and ends with it in parentheses
// when the handler returned an error of its own (see CutOff).
const LeaseDeadlineMessage = engine.MsgLeaseDeadline

// CutOff reports whether entry, an attempt's error entry
// (AttemptError.Error), says that its engine cut the handler off because
// its lease could not be renewed in time: the handler returned the
// cut-off's cause, or an error of its own (a call the cancellation
// interrupted) to which the engine appended the cause in parentheses.
func CutOff(entry string) bool {
	return strings.HasPrefix(entry, LeaseDeadlineMessage) || strings.HasSuffix(entry, " ("+LeaseDeadlineMessage+")")
}

// MySQLConfig converts a conveyor MySQL DSN
// (mysql://user:pass@host:port/db?params, or mariadb://; a "socket"
// parameter selects a unix socket) into a go-sql-driver configuration
// with the MySQL backend's own parser, leaving the session settings as
// the DSN gives them (the server's defaults when it gives none): the
// bench opens its raw-SQL connections with it.
func MySQLConfig(dsn string) (*gomysql.Config, error) {
	return mysql.URLConfig(dsn)
}
