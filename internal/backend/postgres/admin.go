package postgres

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// GetJob returns one job, looked up in every live segment, or an error
// wrapping driver.ErrNotFound.
func (d *Driver) GetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	j, err := d.seg.getJob(ctx, id)
	if err != nil {
		return nil, d.wrap("get job", err)
	}
	if j == nil {
		return nil, fmt.Errorf("conveyor/postgres: get job %d: %w", id, driver.ErrNotFound)
	}
	if j.State == driver.StateCompleted {
		var res string
		switch err := d.pool.QueryRow(ctx, d.q.GetResult, id, j.Fence).Scan(&res); {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, d.wrap("get job result", err)
		default:
			j.Result = json.RawMessage(res)
		}
	}
	if err := d.pool.QueryRow(ctx, d.q.JobBatch, id).Scan(&j.BatchID, &j.CallbackOf); err != nil {
		return nil, d.wrap("get job batch", err)
	}
	return j, nil
}

// ListJobs returns the jobs matching f in id order (descending with
// f.Desc), at most f.Limit (default 100) after f.AfterID and before
// f.BeforeID when set: a merge of per-segment index scans of the phases
// f's states live in.
func (d *Driver) ListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	var jobs []*driver.JobRow
	err := d.seg.read(ctx, func(v *segView) error {
		jobs = nil
		q, args := d.listQuery(v, f, false)
		if q == "" {
			return nil
		}
		rows, err := d.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		jobs, err = scanJobs(rows)
		return err
	})
	return jobs, d.wrap("list jobs", err)
}

// ListJobsTx lists jobs as ListJobs does, inside the caller's transaction
// (a pgx.Tx, or a *sql.Tx of the pgx stdlib driver), seeing the jobs it
// inserted.
func (d *Driver) ListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	q, sqlTx, err := txQuerier("list jobs tx", tx)
	if err != nil {
		return nil, err
	}
	var jobs []*driver.JobRow
	err = d.seg.readIn(ctx, q, func(v *segView) error {
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
	})
	if err != nil {
		return nil, d.wrap("list jobs tx", err)
	}
	return jobs, nil
}

// listQuery builds the list statement of v for f and its arguments (""
// when no job can match f's states). sqlTx encodes the states array for
// database/sql.
func (d *Driver) listQuery(v *segView, f driver.JobFilter, sqlTx bool) (string, []any) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	states := f.States
	if states == nil {
		states = []string{}
	}
	before := max(f.BeforeID, 0)
	q := d.seg.listQuery(v, states, f.Queue != "", f.Kind != "", before > 0, f.Desc)
	if q == "" {
		return "", nil
	}
	var st any = states
	if sqlTx {
		st = textArray(states)
	}
	return q, []any{f.AfterID, st, f.Queue, f.Kind, limit, before}
}

// ClaimJob claims job id, whatever its queue or schedule, if it is
// available, scheduled or retryable.
func (d *Driver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	return d.seg.admin(ctx, "claim", &d.q.SegClaimJob, id, []string{phReady, phWaiting}, []string{phRunning}, id, micros(lease), worker)
}

// Retry makes a discarded, cancelled, retryable, scheduled or completed job
// available now, granting one more attempt if all were used, and wakes its
// queue. A finished unique job whose key another job holds now (the
// unique keys table refuses it) is refused with a
// *driver.UniqueConflictError naming the holder; should the holder finish
// before it is read, the retry is tried again.
func (d *Driver) Retry(ctx context.Context, id int64) (*driver.JobRow, error) {
	for round := 0; ; round++ {
		j, err := d.seg.admin(ctx, "retry", &d.q.SegRetry, id, []string{phDead, phDone, phWaiting}, []string{phReady}, id)
		if err == nil {
			d.seg.hints.wake(j.Queue) // see claimHints
		}
		if pgCode(err) != "23505" { // unique_violation
			return j, err
		}
		c := &driver.UniqueConflictError{Op: "retry", JobID: id}
		found, err := d.uniqueHolder(ctx, id, c)
		switch {
		case err != nil:
			return nil, d.wrap("retry", err)
		case !found && round < uniqueRounds:
			continue // the holder finished in between
		}
		return nil, fmt.Errorf("conveyor/postgres: %w", c)
	}
}

// uniqueHolder fills in c.Key, job id's unique key, and c.HolderID, the
// job holding that key, if any.
func (d *Driver) uniqueHolder(ctx context.Context, id int64, c *driver.UniqueConflictError) (bool, error) {
	v, err := d.seg.viewNow(ctx)
	if err != nil {
		return false, err
	}
	if err := d.pool.QueryRow(ctx, d.seg.stmt(&d.q.SegJobUniqueKey, v, v.srcs(phases...)), id).Scan(&c.Key); err != nil {
		return false, err
	}
	var key string
	err = d.pool.QueryRow(ctx, d.q.SegUniqueHolders, "{"+hex.EncodeToString(c.Key)+"}").Scan(&key, &c.HolderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Cancel cancels a job that has not finished (available, scheduled,
// retryable or running). A running attempt's later outcome is refused.
func (d *Driver) Cancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.seg.admin(ctx, "cancel", &d.q.SegFinish, id, []string{phReady, phWaiting, phRunning}, []string{phDead}, id, driver.StateCancelled)
}

// Discard discards a job that has not finished.
func (d *Driver) Discard(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.seg.admin(ctx, "discard", &d.q.SegFinish, id, []string{phReady, phWaiting, phRunning}, []string{phDead}, id, driver.StateDiscarded)
}

// Stats returns every queue's counts by state (all states present) and the
// age of its oldest available job, by the server's clock. It counts every
// live segment, but reads the counts the leader recorded of a sealed
// done or dead segment instead of scanning it (seg_stats).
func (d *Driver) Stats(ctx context.Context) ([]driver.QueueStats, error) {
	var out []driver.QueueStats
	err := d.seg.read(ctx, func(v *segView) error {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, d.q.SegStatsSerial); err != nil {
			return err
		}
		out, err = d.queueStats(ctx, tx.Query, d.seg.statsQuery(v))
		return err
	})
	if err == nil {
		out, err = d.withAwaiting(ctx, out)
	}
	return out, d.wrap("stats", err)
}

// Overview counts the unfinished jobs and the jobs finished since
// finishedSince (see driver.Driver): every live ready, running and
// waiting segment, and the finished segments that may hold a job
// finished since then (see overviewQuery).
func (d *Driver) Overview(ctx context.Context, finishedSince time.Time) ([]driver.QueueStats, error) {
	var out []driver.QueueStats
	err := d.seg.read(ctx, func(v *segView) (err error) {
		out, err = d.queueStats(ctx, d.pool.Query, d.seg.overviewQuery(v, finishedSince), finishedSince)
		return err
	})
	if err == nil {
		out, err = d.withAwaiting(ctx, out)
	}
	return out, d.wrap("overview", err)
}

// withAwaiting adds to stats the callbacks of the open batches, by
// queue: the jobs waiting for their dependencies.
func (d *Driver) withAwaiting(ctx context.Context, stats []driver.QueueStats) ([]driver.QueueStats, error) {
	rows, err := d.pool.Query(ctx, d.q.AwaitingDeps)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	awaiting, err := driver.ScanAwaiting(rows)
	if err != nil {
		return nil, err
	}
	return driver.WithAwaiting(stats, awaiting), nil
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
