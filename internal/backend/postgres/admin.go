package postgres

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// GetJob returns one job, or an error wrapping driver.ErrNotFound.
func (d *Driver) GetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	out, err := d.tryGetJob(ctx, id)
	if d.converted(ctx, err) {
		return d.tryGetJob(ctx, id)
	}
	return out, err
}

// tryGetJob is GetJob on the storage this driver last read (see converted).
func (d *Driver) tryGetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	var j *driver.JobRow
	var err error
	if s := d.segs(); s != nil {
		j, err = s.getJob(ctx, id)
		if err == nil && j == nil {
			err = pgx.ErrNoRows
		}
	} else {
		j, err = scanJob(d.pool.QueryRow(ctx, d.q.getJob, id))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/postgres: get job %d: %w", id, driver.ErrNotFound)
	}
	if err != nil {
		return nil, wrap("get job", err)
	}
	return j, nil
}

// ListJobs returns the jobs matching f in id order (descending with
// f.Desc), at most f.Limit (default 100) after f.AfterID (and before
// f.BeforeID when set).
func (d *Driver) ListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	out, err := d.tryListJobs(ctx, f)
	if d.converted(ctx, err) {
		return d.tryListJobs(ctx, f)
	}
	return out, err
}

// tryListJobs is ListJobs on the storage this driver last read (see converted).
func (d *Driver) tryListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	run := func(v *segView) ([]*driver.JobRow, error) {
		q, args := d.listQuery(v, f, false)
		if q == "" {
			return nil, nil
		}
		rows, err := d.pool.Query(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		return scanJobs(rows)
	}
	s := d.segs()
	if s == nil {
		jobs, err := run(nil)
		return jobs, wrap("list jobs", err)
	}
	var jobs []*driver.JobRow
	err := s.read(ctx, func(v *segView) (err error) {
		jobs, err = run(v)
		return err
	})
	return jobs, wrap("list jobs", err)
}

// ListJobsTx lists jobs as ListJobs does, inside the caller's transaction
// (a pgx.Tx, or a *sql.Tx of the pgx stdlib driver), seeing the jobs it
// inserted.
func (d *Driver) ListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	out, err := d.tryListJobsTx(ctx, tx, f)
	if d.converted(ctx, err) {
		err = fmt.Errorf("%w (the prefix was converted to the segments storage meanwhile; this driver now uses it: run the transaction again)", err)
	}
	return out, err
}

// tryListJobsTx is ListJobsTx on the storage this driver last read (see converted).
func (d *Driver) tryListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	var q querier
	var sqlTx bool
	switch t := tx.(type) {
	case pgx.Tx:
		q = pgxQuerier(t)
	case *sql.Tx:
		if t != nil {
			q, sqlTx = sqlQuerier(t), true
		}
	}
	if q == nil {
		return nil, fmt.Errorf("conveyor/postgres: list jobs tx: transaction of type %T: accepted are pgx.Tx and *sql.Tx (pgx stdlib driver): %w", tx, driver.ErrTxType)
	}
	var jobs []*driver.JobRow
	run := func(v *segView) error {
		jobs = jobs[:0]
		query, args := d.listQuery(v, f, sqlTx)
		if query == "" {
			return nil
		}
		return q(ctx, query, args, func(scan func(...any) error) error {
			j, err := scanJobRow(scan, sqlTx)
			if err == nil {
				jobs = append(jobs, j)
			}
			return err
		})
	}
	var err error
	if s := d.segs(); s != nil {
		err = s.readIn(ctx, q, run)
	} else {
		err = run(nil)
	}
	if err != nil {
		return nil, wrap("list jobs tx", err)
	}
	return jobs, nil
}

// listQuery builds the list statement for f and its arguments ("" when no
// job can match f's states). On one table (v nil): only the filters f
// sets, a single state as an equality, so that the planner can walk a
// list index in id order. On segments: a merge of per-segment scans of
// the phases f's states live in, in v. sqlTx encodes a states array for
// database/sql.
func (d *Driver) listQuery(v *segView, f driver.JobFilter, sqlTx bool) (string, []any) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	if v != nil {
		states := f.States
		if states == nil {
			states = []string{}
		}
		before := max(f.BeforeID, 0)
		q := d.segs().listQuery(v, states, f.Queue != "", f.Kind != "", before > 0, f.Desc)
		if q == "" {
			return "", nil
		}
		var st any = states
		if sqlTx {
			st = textArray(states)
		}
		return q, []any{f.AfterID, st, f.Queue, f.Kind, limit, before}
	}
	args := []any{f.AfterID, limit}
	var where strings.Builder
	add := func(frag string, v any) {
		args = append(args, v)
		where.WriteString(" ")
		where.WriteString(strings.Replace(frag, "{n}", strconv.Itoa(len(args)), 1))
	}
	switch {
	case len(f.States) == 1:
		add(d.q.listState, f.States[0])
	case len(f.States) > 1 && sqlTx:
		add(d.q.listStates, textArray(f.States))
	case len(f.States) > 1:
		add(d.q.listStates, f.States)
	}
	if f.Queue != "" {
		add(d.q.listQueue, f.Queue)
	}
	if f.Kind != "" {
		add(d.q.listKind, f.Kind)
	}
	if f.BeforeID > 0 {
		add(d.q.listBefore, f.BeforeID)
	}
	list := d.q.listJobs
	if f.Desc {
		list = d.q.listDesc
	}
	return strings.Replace(list, "{where}", where.String(), 1), args
}

// ClaimJob claims job id, whatever its queue or schedule, if it is
// available, scheduled or retryable.
func (d *Driver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	out, err := d.tryClaimJob(ctx, id, lease, worker)
	if d.converted(ctx, err) {
		return d.tryClaimJob(ctx, id, lease, worker)
	}
	return out, err
}

// tryClaimJob is ClaimJob on the storage this driver last read (see converted).
func (d *Driver) tryClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "claim", "seg_claim_job", id, []string{phReady, phWaiting}, []string{phRunning}, id, micros(lease), worker)
	}
	return d.adminUpdate(ctx, "claim", id, d.q.claimJob, id, micros(lease), worker)
}

// Retry makes a discarded, cancelled, retryable, scheduled or completed job
// available now, granting one more attempt if all were used, and wakes its
// queue. A finished unique job whose key another job holds now (the
// unique index, or the unique keys table on segments, refuses it) is
// refused with a *driver.UniqueConflictError naming the holder; should
// the holder finish before it is read, the retry is tried again.
func (d *Driver) Retry(ctx context.Context, id int64) (*driver.JobRow, error) {
	for round := 0; ; round++ {
		out, err := d.tryRetry(ctx, id)
		if d.converted(ctx, err) {
			out, err = d.tryRetry(ctx, id)
		}
		if pgCode(err) != "23505" { // unique_violation
			return out, err
		}
		c := &driver.UniqueConflictError{Op: "retry", JobID: id}
		found, err := d.uniqueHolder(ctx, id, c)
		switch {
		case err != nil:
			return nil, wrap("retry", err)
		case !found && round < uniqueRounds:
			continue // the holder finished in between
		}
		return nil, fmt.Errorf("conveyor/postgres: %w", c)
	}
}

// uniqueHolder fills in c.Key, job id's unique key, and c.HolderID, the
// job holding that key, if any.
func (d *Driver) uniqueHolder(ctx context.Context, id int64, c *driver.UniqueConflictError) (bool, error) {
	keyQ, holdersQ := d.q.jobUniqueKey, d.q.uniqueHolders
	if s := d.segs(); s != nil {
		v, err := s.viewNow(ctx)
		if err != nil {
			return false, err
		}
		keyQ, holdersQ = s.stmt("seg_job_unique_key", v, v.srcs(phases...)), s.q("seg_unique_holders")
	}
	if err := d.pool.QueryRow(ctx, keyQ, id).Scan(&c.Key); err != nil {
		return false, err
	}
	var key string
	err := d.pool.QueryRow(ctx, holdersQ, "{"+hex.EncodeToString(c.Key)+"}").Scan(&key, &c.HolderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// tryRetry is Retry on the storage this driver last read (see converted).
func (d *Driver) tryRetry(ctx context.Context, id int64) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		j, err := s.admin(ctx, "retry", "seg_retry", id, []string{phDead, phDone, phWaiting}, []string{phReady}, id)
		if err == nil {
			s.hints.wake(j.Queue) // see claimHints
		}
		return j, err
	}
	return d.adminUpdate(ctx, "retry", id, d.q.retry, id)
}

// Cancel cancels a job that has not finished (available, scheduled,
// retryable or running). A running attempt's later outcome is refused.
func (d *Driver) Cancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	out, err := d.tryCancel(ctx, id)
	if d.converted(ctx, err) {
		return d.tryCancel(ctx, id)
	}
	return out, err
}

// tryCancel is Cancel on the storage this driver last read (see converted).
func (d *Driver) tryCancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "cancel", "seg_finish", id, []string{phReady, phWaiting, phRunning}, []string{phDead}, id, driver.StateCancelled)
	}
	return d.adminUpdate(ctx, "cancel", id, d.q.finish, id, driver.StateCancelled)
}

// Discard discards a job that has not finished.
func (d *Driver) Discard(ctx context.Context, id int64) (*driver.JobRow, error) {
	out, err := d.tryDiscard(ctx, id)
	if d.converted(ctx, err) {
		return d.tryDiscard(ctx, id)
	}
	return out, err
}

// tryDiscard is Discard on the storage this driver last read (see converted).
func (d *Driver) tryDiscard(ctx context.Context, id int64) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "discard", "seg_finish", id, []string{phReady, phWaiting, phRunning}, []string{phDead}, id, driver.StateDiscarded)
	}
	return d.adminUpdate(ctx, "discard", id, d.q.finish, id, driver.StateDiscarded)
}

// adminUpdate runs a state-guarded single-job update; when no row changed
// it tells a missing job (ErrNotFound) from one in the wrong state
// (ErrWrongState).
func (d *Driver) adminUpdate(ctx context.Context, op string, id int64, query string, args ...any) (*driver.JobRow, error) {
	j, err := scanJob(d.pool.QueryRow(ctx, query, args...))
	if err == nil {
		return j, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, wrap(op, err)
	}
	cur, err := d.GetJob(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: %s job %d: %w", op, id, driver.ErrNotFound)
	}
	return nil, fmt.Errorf("conveyor/postgres: %s job %d: job is %s: %w", op, id, cur.State, driver.ErrWrongState)
}

// Stats returns every queue's counts by state (all states present) and the
// age of its oldest available job, by the server's clock.
func (d *Driver) Stats(ctx context.Context) ([]driver.QueueStats, error) {
	out, err := d.tryStats(ctx)
	if d.converted(ctx, err) {
		return d.tryStats(ctx)
	}
	return out, err
}

// tryStats is Stats on the storage this driver last read (see converted).
func (d *Driver) tryStats(ctx context.Context) ([]driver.QueueStats, error) {
	s := d.segs()
	if s == nil {
		out, err := d.queueStats(ctx, d.pool.Query, d.q.stats)
		return out, wrap("stats", err)
	}
	// Without parallel workers: the planner sizes a sealed finished
	// segment's arm by its rows, not knowing that recorded counts skip its
	// scan, and starting the workers it plans for took 40-60 ms of a
	// 60 ms Stats over 1,000,000 counted jobs.
	var out []driver.QueueStats
	err := s.read(ctx, func(v *segView) error {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, "SET LOCAL max_parallel_workers_per_gather = 0"); err != nil {
			return err
		}
		out, err = d.queueStats(ctx, tx.Query, s.statsQuery(v))
		return err
	})
	return out, wrap("stats", err)
}

// Overview counts the unfinished jobs and the jobs finished since
// finishedSince through the partial indexes (see driver.Driver). On
// segments it counts the unfinished phases and the finished segments
// sealed since finishedSince (and the current ones): see overviewQuery.
func (d *Driver) Overview(ctx context.Context, finishedSince time.Time) ([]driver.QueueStats, error) {
	out, err := d.tryOverview(ctx, finishedSince)
	if d.converted(ctx, err) {
		return d.tryOverview(ctx, finishedSince)
	}
	return out, err
}

// tryOverview is Overview on the storage this driver last read (see converted).
func (d *Driver) tryOverview(ctx context.Context, finishedSince time.Time) ([]driver.QueueStats, error) {
	s := d.segs()
	if s == nil {
		out, err := d.queueStats(ctx, d.pool.Query, d.q.overview, finishedSince)
		return out, wrap("overview", err)
	}
	var out []driver.QueueStats
	err := s.read(ctx, func(v *segView) (err error) {
		out, err = d.queueStats(ctx, d.pool.Query, s.overviewQuery(v, finishedSince), finishedSince)
		return err
	})
	return out, wrap("overview", err)
}

// queueStats runs stats or overview: rows of queue, state, count and the
// oldest available job's age in microseconds.
func (d *Driver) queueStats(ctx context.Context, query func(context.Context, string, ...any) (pgx.Rows, error), q string, args ...any) ([]driver.QueueStats, error) {
	rows, err := query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	by := map[string]*driver.QueueStats{}
	var order []string
	var (
		queue, state string
		count, ageUS int64
	)
	for rows.Next() {
		if err := rows.Scan(&queue, &state, &count, &ageUS); err != nil {
			return nil, err
		}
		qs := by[queue]
		if qs == nil {
			qs = driver.NewQueueStats(queue)
			by[queue] = qs
			order = append(order, queue)
		}
		qs.Counts[state] = count
		if state == driver.StateAvailable {
			qs.OldestAvailable = time.Duration(ageUS) * time.Microsecond
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Strings(order)
	out := make([]driver.QueueStats, 0, len(order))
	for _, q := range order {
		out = append(out, *by[q])
	}
	return out, nil
}
