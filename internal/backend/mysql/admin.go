package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// GetJob returns one job, or an error wrapping driver.ErrNotFound.
func (d *Driver) GetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	s, err := d.stmt(ctx, d.q.GetJob)
	if err != nil {
		return nil, d.wrap("get job", err)
	}
	j, err := scanJob(s.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/mysql: get job %d: %w", id, driver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrap("get job", err)
	}
	if j.State == driver.StateCompleted {
		var res string
		switch err := d.db.QueryRowContext(ctx, d.q.GetResult, id, j.Fence).Scan(&res); {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, d.wrap("get job result", err)
		default:
			j.Result = json.RawMessage(res)
		}
	}
	if err := d.db.QueryRowContext(ctx, d.q.JobBatch, id, id, id).Scan(&j.BatchID, &j.CallbackOf); err != nil {
		return nil, d.wrap("get job batch", err)
	}
	return j, nil
}

// ListJobs returns jobs matching f in id order (descending with f.Desc),
// at most f.Limit (default 100) with ids greater than f.AfterID (and
// smaller than f.BeforeID when set).
func (d *Driver) ListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	q, args := d.listQuery(f)
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrap("list jobs", err)
	}
	out, err := scanJobs(rows)
	if err != nil {
		return nil, d.wrap("list jobs", err)
	}
	return out, nil
}

// ListJobsTx lists jobs as ListJobs does, inside the caller's transaction
// (a *sql.Tx of the application's handle), seeing the jobs it inserted.
// The application's connection may read times differently from
// conveyor's (parseTime, loc): they are read as the UTC they are stored in.
func (d *Driver) ListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	t, ok := tx.(*sql.Tx)
	if !ok || t == nil {
		return nil, fmt.Errorf("conveyor/mysql: list jobs tx: got %T, want a non-nil *sql.Tx (database/sql on a go-sql-driver/mysql connection): %w", tx, driver.ErrTxType)
	}
	q, args := d.listQuery(f)
	rows, err := t.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrap("list jobs tx", err)
	}
	defer rows.Close()
	var out []*driver.JobRow
	for rows.Next() {
		j, err := scanAppJob(rows)
		if err != nil {
			return nil, d.wrap("list jobs tx", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("list jobs tx", err)
	}
	return out, nil
}

// ClaimJob claims job id, whatever its queue or schedule, if it is
// available, scheduled or retryable: one transaction locks the row
// (claim_job_select) and marks it as Claim does (claim_mark).
func (d *Driver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	var out *driver.JobRow
	var state string
	err := d.inTx(ctx, "claim job", func(tx *sql.Tx) error {
		out, state = nil, ""
		var now time.Time
		var floor sql.NullInt64
		j, err := scanJob(tx.QueryRowContext(ctx, d.q.ClaimJobSelect, id), &now, &floor)
		if errors.Is(err, sql.ErrNoRows) {
			return driver.ErrNotFound
		}
		if err != nil {
			return err
		}
		switch j.State {
		case driver.StateAvailable, driver.StateScheduled, driver.StateRetryable:
		default:
			state = j.State
			return nil
		}
		f, err := d.fenceFloor(ctx, tx, floor)
		if err != nil {
			return err
		}
		until := now.Add(lease).Truncate(time.Microsecond)
		q, args, cache := d.inList(d.q.ClaimMark, []int64{id}, dbTime(now), dbTime(until), worker, f)
		res, err := d.exec(ctx, tx, cache, q, args...)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("marked %d rows of the one locked", n)
		}
		j.State = driver.StateRunning
		j.Attempt++
		j.Fence = max(j.Fence+1, f)
		j.AttemptedAt = now
		j.LeaseExpiresAt = until
		j.AttemptedBy = worker
		out = j
		return nil
	})
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return nil, fmt.Errorf("conveyor/mysql: claim job %d: %w", id, driver.ErrNotFound)
	case err != nil:
		return nil, d.wrap("claim job", err)
	case out == nil:
		return nil, fmt.Errorf("conveyor/mysql: claim job %d: state is %s: %w", id, state, driver.ErrWrongState)
	}
	return out, nil
}

// listQuery returns the list_jobs statement for f and its arguments.
func (d *Driver) listQuery(f driver.JobFilter) (string, []any) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var where strings.Builder
	args := []any{f.AfterID}
	if len(f.States) > 0 {
		where.WriteByte(' ')
		where.WriteString(strings.Replace(d.q.ListJobsStates, "{ids}", placeholders(len(f.States)), 1))
		for _, s := range f.States {
			args = append(args, s)
		}
	}
	if f.Queue != "" {
		where.WriteByte(' ')
		where.WriteString(d.q.ListJobsQueue)
		args = append(args, f.Queue)
	}
	if f.Kind != "" {
		where.WriteByte(' ')
		where.WriteString(d.q.ListJobsKind)
		args = append(args, f.Kind)
	}
	if f.BeforeID > 0 {
		where.WriteByte(' ')
		where.WriteString(d.q.ListJobsBefore)
		args = append(args, f.BeforeID)
	}
	args = append(args, int64(limit))
	list := d.q.ListJobs
	if f.Desc {
		list = d.q.ListJobsDesc
	}
	return strings.Replace(list, "{where}", where.String(), 1), args
}

// scanAppJob reads the job_columns of one row read on the application's
// connection, whose DSN may lack parseTime or set another loc.
func scanAppJob(r rowScanner) (*driver.JobRow, error) {
	j := &driver.JobRow{}
	var (
		args, errs, meta []byte
		by, lkey         sql.NullString
	)
	err := r.Scan(&j.ID, &j.Queue, &j.Kind, &args, &j.State, &j.Priority, &j.Attempt, &j.MaxAttempts, &j.TimeoutMS,
		utcTime{&j.ScheduledAt}, utcTime{&j.CreatedAt}, utcTime{&j.AttemptedAt}, utcTime{&j.FinalizedAt},
		utcTime{&j.LeaseExpiresAt}, &by, &errs, &j.Fence, &meta, &lkey)
	if err != nil {
		return nil, err
	}
	j.Args = args
	j.Key = lkey.String
	if len(meta) > 0 {
		j.Meta = meta
	}
	j.AttemptedBy = by.String
	if len(errs) > 2 {
		if err := json.Unmarshal(errs, &j.Errors); err != nil {
			return nil, fmt.Errorf("job %d: decode errors: %w", j.ID, err)
		}
	}
	return j, nil
}

// utcTime scans a DATETIME(6), which conveyor stores in UTC, read as text
// or as a time.Time in any location (its wall clock is the UTC time); NULL
// is the zero time.
type utcTime struct{ dst *time.Time }

// Scan implements sql.Scanner.
func (u utcTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*u.dst = time.Time{}
	case time.Time:
		*u.dst = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	case []byte:
		return u.parse(string(v))
	case string:
		return u.parse(v)
	default:
		return fmt.Errorf("DATETIME read as %T", src)
	}
	return nil
}

func (u utcTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05", s, time.UTC)
	if err != nil {
		return err
	}
	*u.dst = t
	return nil
}

// adminUpdate runs a state-guarded UPDATE of one job and returns the job;
// when nothing matched it tells a missing job (ErrNotFound) from one in a
// state that does not allow op (ErrWrongState).
func (d *Driver) adminUpdate(ctx context.Context, op string, id int64, q string, args ...any) (*driver.JobRow, error) {
	n, err := d.execCount(ctx, d.main, op, true, q, args)
	if err != nil {
		return nil, err
	}
	j, err := d.GetJob(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("conveyor/mysql: %s job %d: %w", op, id, unwrapNotFound(err))
	}
	if n == 0 {
		return nil, fmt.Errorf("conveyor/mysql: %s job %d: state is %s: %w", op, id, j.State, driver.ErrWrongState)
	}
	return j, nil
}

func unwrapNotFound(err error) error {
	if errors.Is(err, driver.ErrNotFound) {
		return driver.ErrNotFound
	}
	return err
}

// Retry makes a discarded, cancelled, retryable, scheduled or completed job
// available now, granting one more attempt if all were used. A finished
// unique job whose key another job holds now (the unique index refuses
// the update: error 1062) is refused with a *driver.UniqueConflictError
// naming the holder; should the holder finish before it is read, the
// retry is tried again.
func (d *Driver) Retry(ctx context.Context, id int64) (*driver.JobRow, error) {
	for round := 0; ; round++ {
		j, err := d.adminUpdate(ctx, "retry", id, d.q.Retry, id)
		if err == nil && j != nil {
			d.behind(j.Queue)
		}
		if myErrno(err) != errDupEntry {
			return j, err
		}
		c := &driver.UniqueConflictError{Op: "retry", JobID: id}
		if err := d.db.QueryRowContext(ctx, d.q.JobUniqueKey, id).Scan(&c.Key); err != nil {
			return nil, d.wrap("retry", err)
		}
		err = d.db.QueryRowContext(ctx, d.q.UniqueHolder, c.Key).Scan(&c.HolderID)
		switch {
		case errors.Is(err, sql.ErrNoRows) && round < uniqueRounds:
			continue // the holder finished in between
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return nil, d.wrap("retry", err)
		}
		return nil, fmt.Errorf("conveyor/mysql: %w", c)
	}
}

// Cancel cancels a job that has not finished; a running attempt's outcome
// will then be refused by its fence.
func (d *Driver) Cancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.adminUpdate(ctx, "cancel", id, d.q.Finalize, driver.StateCancelled, id)
}

// Discard discards a job that has not finished.
func (d *Driver) Discard(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.adminUpdate(ctx, "discard", id, d.q.Finalize, driver.StateDiscarded, id)
}

// Stats counts jobs per queue and state, with the age of each queue's
// oldest available job by the database's clock.
func (d *Driver) Stats(ctx context.Context) ([]driver.QueueStats, error) {
	return d.queueStats(ctx, "stats", d.q.Stats)
}

// Overview counts the unfinished jobs and the jobs finished since
// finishedSince through the secondary indexes (see driver.Driver).
func (d *Driver) Overview(ctx context.Context, finishedSince time.Time) ([]driver.QueueStats, error) {
	return d.queueStats(ctx, "overview", d.q.Overview, finishedSince.UTC())
}

// queueStats runs Stats or Overview: rows of queue, state, count, the
// oldest scheduled_at and the database's now.
func (d *Driver) queueStats(ctx context.Context, what, q string, args ...any) ([]driver.QueueStats, error) {
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrap(what, err)
	}
	defer rows.Close()
	by := map[string]*driver.QueueStats{}
	for rows.Next() {
		var queue, state string
		var n int64
		var oldest, now time.Time
		if err := rows.Scan(&queue, &state, &n, &oldest, &now); err != nil {
			return nil, d.wrap(what, err)
		}
		s := by[queue]
		if s == nil {
			s = driver.NewQueueStats(queue)
			by[queue] = s
		}
		s.Counts[state] += n
		if state == driver.StateAvailable && n > 0 {
			s.OldestAvailable = max(now.Sub(oldest), 0)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap(what, err)
	}
	out := make([]driver.QueueStats, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	awaiting, err := d.awaiting(ctx)
	if err != nil {
		return nil, d.wrap(what, err)
	}
	return driver.WithAwaiting(out, awaiting), nil
}

// awaiting counts the callbacks of the open batches by queue: the jobs
// waiting for their dependencies.
func (d *Driver) awaiting(ctx context.Context) (map[string]int64, error) {
	rows, err := d.db.QueryContext(ctx, d.q.AwaitingDeps)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return driver.ScanAwaiting(rows)
}

// Migrate applies the missing migrations under a lock that serialises
// concurrent migrators: a named lock (GET_LOCK), or on Galera, where
// GET_LOCK is local to a node, a lock row (see lockMigrations). DDL
// auto-commits in MySQL, so a migration cannot be one transaction: its
// statements are idempotent and its version is recorded only after all of
// them succeeded, so an interrupted migration is re-run from the start.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	record := func(ctx context.Context, conn *sql.Conn, version int) error {
		return d.retry(ctx, "migrate", func() error {
			_, err := conn.ExecContext(ctx, d.q.MigrationsRecord, version)
			return err
		})
	}
	if d.galera {
		lock, err := d.lockMigrations(ctx)
		if err != nil {
			return nil, err
		}
		defer lock.unlock()
		// The statements stop once the lock row is lost (lock.ctx ends),
		// and each version is recorded only while it is still held.
		ctx = lock.ctx
		record = func(ctx context.Context, _ *sql.Conn, version int) error { return lock.record(ctx, version) }
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, d.wrap("migrate", err)
	}
	defer conn.Close()
	if !d.galera {
		unlock, err := d.getLock(ctx, conn)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	if _, err := conn.ExecContext(ctx, d.q.MigrationsTable); err != nil {
		return nil, d.wrap("migrate", err)
	}
	var current int
	if err := conn.QueryRowContext(ctx, d.q.MigrationsMax).Scan(&current); err != nil {
		return nil, d.wrap("migrate", err)
	}
	latest := len(d.migs)
	if current > latest {
		return nil, fmt.Errorf("conveyor/mysql: migrate: database is at schema version %d, this binary knows up to %d: %w", current, latest, driver.ErrSchemaTooNew)
	}
	var applied []int
	for _, m := range d.migs[current:] {
		for i, st := range m.Statements {
			// Retried on a deadlock: on Galera a data statement can lose
			// certification to a write made through another node.
			err := d.retry(ctx, "migrate", func() error {
				_, err := conn.ExecContext(ctx, st)
				return err
			})
			if err != nil && myErrno(err) != errDupColumn && myErrno(err) != errDupKeyName {
				// (DDL auto-commits: a column added by a run that stopped
				// before recording its version is already there.)
				return applied, fmt.Errorf("conveyor/mysql: migrate: version %d (%s) statement %d: %w", m.Version, m.Name, i+1, migrateErr(ctx, err))
			}
		}
		// A duplicate means another migrator recorded it: the statements
		// are applied all the same.
		if err := record(ctx, conn, m.Version); err != nil && myErrno(err) != errDupEntry {
			return applied, fmt.Errorf("conveyor/mysql: migrate: record version %d: %w", m.Version, migrateErr(ctx, err))
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// migrateErr is err, or the reason ctx ended when it did (such as the
// loss of the migration lock).
func migrateErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// getLock takes the migrators' named lock on conn, waiting up to a minute.
func (d *Driver) getLock(ctx context.Context, conn *sql.Conn) (unlock func(), err error) {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, d.q.GetLock, 60).Scan(&got); err != nil {
		return nil, d.wrap("migrate: take lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, errors.New("conveyor/mysql: migrate: timed out waiting for another migrator's lock")
	}
	return func() {
		// A fresh context: the lock must be released even if ctx ended.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var r sql.NullInt64
		if err := conn.QueryRowContext(rctx, d.q.ReleaseLock).Scan(&r); err != nil {
			// The session ends with the connection, which frees the lock.
			_ = conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
	}, nil
}

// The migration lock row's lease, how often its holder renews it, and how
// long a migrator waits for it.
const (
	migrationLockTTL   = 30 * time.Second
	migrationLockRenew = 5 * time.Second
	migrationLockWait  = 60 * time.Second
)

// errMigrationLockLost ends a migration whose lock row another migrator
// took, or whose lease could not be renewed for half its TTL.
var errMigrationLockLost = errors.New("conveyor/mysql: migrate: lost the migration lock")

// migrationLock is a held migration lock row (see lockMigrations).
type migrationLock struct {
	d      *Driver
	holder string
	// ctx is the caller's context, ended (with errMigrationLockLost as
	// its cause) once the lock is lost.
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
}

// take renews or takes the lease of the lock row and returns its holder.
func (l *migrationLock) take(ctx context.Context, tx *sql.Tx) (string, error) {
	if _, err := tx.ExecContext(ctx, l.d.q.MigrationLockTake, l.holder, micros(migrationLockTTL)); err != nil {
		return "", err
	}
	var got string
	err := tx.QueryRowContext(ctx, l.d.q.MigrationLockHolder).Scan(&got)
	return got, err
}

func (l *migrationLock) takeTx(ctx context.Context) (string, error) {
	var got string
	err := l.d.inTx(ctx, "migrate: take lock", func(tx *sql.Tx) error {
		var err error
		got, err = l.take(ctx, tx)
		return err
	})
	return got, err
}

// record records version as applied in the transaction that renews the
// lease, so that it commits only while the lock is held: a migrator that
// took the row meanwhile conflicts with it (on its own node, by the row
// lock; across nodes, at certification).
func (l *migrationLock) record(ctx context.Context, version int) error {
	return l.d.inTx(ctx, "migrate: record version", func(tx *sql.Tx) error {
		got, err := l.take(ctx, tx)
		if err != nil {
			return err
		}
		if got != l.holder {
			err := fmt.Errorf("%w: held by %s", errMigrationLockLost, got)
			l.cancel(err)
			return err
		}
		_, err = tx.ExecContext(ctx, l.d.q.MigrationsRecord, version)
		return err
	})
}

// renew renews the lease every migrationLockRenew until unlock. It ends
// l.ctx when another migrator holds the row, or when no renewal succeeded
// for half the TTL (as when a DDL statement replicated in total order
// stalls the cluster's commits): the lease may then expire and be taken.
func (l *migrationLock) renew() {
	defer close(l.done)
	tick := time.NewTicker(migrationLockRenew)
	defer tick.Stop()
	renewed := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(context.Background(), migrationLockRenew)
		got, err := l.takeTx(rctx)
		cancel()
		switch {
		case err == nil && got == l.holder:
			renewed = time.Now()
		case err == nil:
			l.cancel(fmt.Errorf("%w: held by %s", errMigrationLockLost, got))
			return
		case time.Since(renewed) >= migrationLockTTL/2:
			l.cancel(fmt.Errorf("%w: not renewed for %v: %v", errMigrationLockLost, time.Since(renewed).Round(time.Second), err))
			return
		}
	}
}

// unlock stops the renewals and deletes the row.
func (l *migrationLock) unlock() {
	close(l.stop)
	<-l.done
	l.cancel(nil)
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// On failure the lease expires by itself.
	_ = l.d.retry(rctx, "migrate: release lock", func() error {
		_, err := l.d.db.ExecContext(rctx, l.d.q.MigrationLockRelease, l.holder)
		return err
	})
}

// lockMigrations takes the migration lock row (Galera; see
// migration_lock_take): it creates the lock table if needed (DDL, which
// Galera replicates in total order before it returns, so concurrent
// creators are safe), then takes the row's lease, waiting up to
// migrationLockWait for another holder to release it or for its lease to
// expire. The lease is renewed until unlock, which deletes the row; the
// lock's ctx ends if it is lost before.
func (d *Driver) lockMigrations(ctx context.Context) (*migrationLock, error) {
	token, err := newToken()
	if err != nil {
		return nil, d.wrap("migrate: take lock", err)
	}
	l := &migrationLock{d: d, holder: fmt.Sprintf("%x", token[:]), stop: make(chan struct{}), done: make(chan struct{})}
	if err := d.retry(ctx, "migrate: create lock table", func() error {
		_, err := d.db.ExecContext(ctx, d.q.MigrationLockTable)
		return err
	}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(migrationLockWait)
	for {
		got, err := l.takeTx(ctx)
		if err != nil {
			return nil, err
		}
		if got == l.holder {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("conveyor/mysql: migrate: timed out after %v waiting for another migrator's lock (held by %s)", migrationLockWait, got)
		}
		t := time.NewTimer(100*time.Millisecond + rand.N(100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, d.wrap("migrate: take lock", ctx.Err())
		case <-t.C:
		}
	}
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	go l.renew()
	return l, nil
}

// SchemaVersion returns the applied schema version (0 before the first
// migration) and the latest one this binary embeds.
func (d *Driver) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	latest = len(d.migs)
	err = d.db.QueryRowContext(ctx, d.q.MigrationsMax).Scan(&current)
	if myErrno(err) == errNoSuchTable {
		return 0, latest, nil
	}
	if err != nil {
		return 0, latest, d.wrap("schema version", err)
	}
	return current, latest, nil
}

// DropAll drops the tables under this driver's prefix.
func (d *Driver) DropAll(ctx context.Context) error {
	_, err := d.db.ExecContext(ctx, d.q.DropAll)
	return d.wrap("drop all", err)
}
