package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// GetJob returns one job, or an error wrapping driver.ErrNotFound.
func (d *Driver) GetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	var j *driver.JobRow
	var err error
	if s := d.segs(); s != nil {
		j, err = s.getJob(ctx, id)
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

// ListJobs returns the jobs matching f in id order, at most f.Limit
// (default 100) after f.AfterID.
func (d *Driver) ListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	states := f.States
	if states == nil {
		states = []string{}
	}
	query, err := d.listQuery(ctx, states)
	if err != nil || query == "" {
		return nil, wrap("list jobs", err)
	}
	rows, err := d.pool.Query(ctx, query, f.AfterID, states, f.Queue, f.Kind, limit)
	if err != nil {
		return nil, wrap("list jobs", err)
	}
	jobs, err := scanJobs(rows)
	return jobs, wrap("list jobs", err)
}

// ListJobsTx lists jobs as ListJobs does, inside the caller's transaction
// (a pgx.Tx, or a *sql.Tx of the pgx stdlib driver), seeing the jobs it
// inserted.
func (d *Driver) ListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	states := f.States
	if states == nil {
		states = []string{}
	}
	query, err := d.listQuery(ctx, states)
	if err != nil {
		return nil, wrap("list jobs tx", err)
	}
	switch t := tx.(type) {
	case pgx.Tx:
		if query == "" {
			return nil, nil
		}
		rows, err := t.Query(ctx, query, f.AfterID, states, f.Queue, f.Kind, limit)
		if err != nil {
			return nil, wrap("list jobs tx", err)
		}
		jobs, err := scanJobs(rows)
		return jobs, wrap("list jobs tx", err)
	case *sql.Tx:
		if t == nil {
			break
		}
		if query == "" {
			return nil, nil
		}
		rows, err := t.QueryContext(ctx, query, f.AfterID, textArray(states), f.Queue, f.Kind, limit)
		if err != nil {
			return nil, wrap("list jobs tx", err)
		}
		jobs, err := scanSQLJobs(rows)
		return jobs, wrap("list jobs tx", err)
	}
	return nil, fmt.Errorf("conveyor/postgres: list jobs tx: transaction of type %T: accepted are pgx.Tx and *sql.Tx (pgx stdlib driver): %w", tx, driver.ErrTxType)
}

// listQuery returns the list statement of the prefix's storage ("" when
// no job can match the states).
func (d *Driver) listQuery(ctx context.Context, states []string) (string, error) {
	if s := d.segs(); s != nil {
		return s.listQuery(ctx, states)
	}
	return d.q.listJobs, nil
}

// ClaimJob claims job id, whatever its queue or schedule, if it is
// available, scheduled or retryable.
func (d *Driver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "claim", "seg_claim_job", id, []string{phReady, phWaiting}, []string{phRunning}, id, micros(lease), worker)
	}
	return d.adminUpdate(ctx, "claim", id, d.q.claimJob, id, micros(lease), worker)
}

// Retry makes a discarded, cancelled, retryable, scheduled or completed job
// available now, granting one more attempt if all were used, and wakes its
// queue.
func (d *Driver) Retry(ctx context.Context, id int64) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "retry", "seg_retry", id, []string{phDead, phDone, phWaiting}, []string{phReady}, id)
	}
	return d.adminUpdate(ctx, "retry", id, d.q.retry, id)
}

// Cancel cancels a job that has not finished (available, scheduled,
// retryable or running). A running attempt's later outcome is refused.
func (d *Driver) Cancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	if s := d.segs(); s != nil {
		return s.admin(ctx, "cancel", "seg_finish", id, []string{phReady, phWaiting, phRunning}, []string{phDead}, id, driver.StateCancelled)
	}
	return d.adminUpdate(ctx, "cancel", id, d.q.finish, id, driver.StateCancelled)
}

// Discard discards a job that has not finished.
func (d *Driver) Discard(ctx context.Context, id int64) (*driver.JobRow, error) {
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
	query := d.q.stats
	if s := d.segs(); s != nil {
		var err error
		if query, err = s.statsQuery(ctx); err != nil {
			return nil, wrap("stats", err)
		}
	}
	rows, err := d.pool.Query(ctx, query)
	if err != nil {
		return nil, wrap("stats", err)
	}
	defer rows.Close()
	var out []driver.QueueStats
	var (
		queue, state string
		count, ageUS int64
	)
	for rows.Next() {
		if err := rows.Scan(&queue, &state, &count, &ageUS); err != nil {
			return nil, wrap("stats", err)
		}
		if len(out) == 0 || out[len(out)-1].Queue != queue {
			out = append(out, *driver.NewQueueStats(queue))
		}
		qs := &out[len(out)-1]
		qs.Counts[state] = count
		if state == driver.StateAvailable {
			qs.OldestAvailable = time.Duration(ageUS) * time.Microsecond
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("stats", err)
	}
	return out, nil
}
