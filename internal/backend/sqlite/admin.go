package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// GetJob returns one job, or an error wrapping driver.ErrNotFound.
func (d *Driver) GetJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	j, err := scanJob(d.r.QueryRowContext(ctx, d.q.GetJob, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/sqlite: get job %d: %w", id, driver.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get job %d: %w", id, err)
	}
	if j.State == driver.StateCompleted {
		var res string
		switch err := d.r.QueryRowContext(ctx, d.q.GetResult, id, j.Fence).Scan(&res); {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("conveyor/sqlite: get job %d: result: %w", id, err)
		default:
			j.Result = json.RawMessage(res)
		}
	}
	if err := d.r.QueryRowContext(ctx, d.q.JobBatch, id).Scan(&j.BatchID, &j.CallbackOf); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get job %d: batch: %w", id, err)
	}
	return j, nil
}

// ListJobs lists jobs by ascending id (descending with f.Desc),
// filtered by f.
func (d *Driver) ListJobs(ctx context.Context, f driver.JobFilter) ([]*driver.JobRow, error) {
	return d.listJobs(ctx, d.r, f)
}

// ListJobsTx lists jobs as ListJobs does, inside the caller's transaction
// (a *sql.Tx on this database), seeing the jobs it inserted.
func (d *Driver) ListJobsTx(ctx context.Context, tx any, f driver.JobFilter) ([]*driver.JobRow, error) {
	t, ok := tx.(*sql.Tx)
	if !ok || t == nil {
		return nil, fmt.Errorf("conveyor/sqlite: list jobs in transaction: got %T, want a non-nil *sql.Tx: %w", tx, driver.ErrTxType)
	}
	return d.listJobs(ctx, t, f)
}

// ClaimJob claims job id, whatever its queue or schedule, if it is
// available, scheduled or retryable, in a BEGIN IMMEDIATE transaction as
// Claim does.
func (d *Driver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	return d.changeJob(ctx, "claim", id, false, d.q.ClaimJob, id, us(lease), worker)
}

// listJobs runs the list_jobs query on q (the read pool or a
// transaction) with only the filters f sets: a single state as an
// equality, so that the planner walks the state list index in id order.
func (d *Driver) listJobs(ctx context.Context, q execer, f driver.JobFilter) ([]*driver.JobRow, error) {
	query, args := d.listQuery(f)
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: list jobs: %w", err)
	}
	defer rows.Close()
	var out []*driver.JobRow
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: list jobs: %w", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: list jobs: %w", err)
	}
	return out, nil
}

// listQuery builds the list_jobs query for f and its arguments.
func (d *Driver) listQuery(f driver.JobFilter) (string, []any) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
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
		add(d.q.ListJobsState, f.States[0])
	case len(f.States) > 1:
		var b strings.Builder
		b.WriteByte('[')
		for i, s := range f.States {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(appendJSONStr(nil, s))
		}
		b.WriteByte(']')
		add(d.q.ListJobsStates, b.String())
	}
	if f.Queue != "" {
		add(d.q.ListJobsQueue, f.Queue)
	}
	if f.Kind != "" {
		add(d.q.ListJobsKind, f.Kind)
	}
	if f.BeforeID > 0 {
		add(d.q.ListJobsBefore, f.BeforeID)
	}
	list := d.q.ListJobs
	if f.Desc {
		list = d.q.ListJobsDesc
	}
	return strings.Replace(list, "{where}", where.String(), 1), args
}

// Retry makes a discarded, cancelled, retryable, scheduled or completed job
// available now, granting one more attempt if all were used. A finished
// unique job whose key another job holds now is refused with a
// *driver.UniqueConflictError.
func (d *Driver) Retry(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.changeJob(ctx, "retry", id, false, d.q.RetryJob, id)
}

// uniqueConflict reads, in tx, job id's unique key and the job holding it,
// for the error of an update refused by the unique index.
func (d *Driver) uniqueConflict(ctx context.Context, tx *sql.Tx, op string, id int64) error {
	c := &driver.UniqueConflictError{Op: op, JobID: id}
	if err := tx.QueryRowContext(ctx, d.q.JobUniqueKey, id).Scan(&c.Key); err != nil {
		return err
	}
	err := tx.QueryRowContext(ctx, d.q.UniqueHolder, c.Key).Scan(&c.HolderID)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return c
}

// Cancel cancels a job that has not finished (available, scheduled,
// retryable or running; a running attempt's outcome is then refused, and
// it no longer counts against its queue's concurrency limit).
func (d *Driver) Cancel(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.changeJob(ctx, "cancel", id, true, d.q.FinishJob, id, driver.StateCancelled)
}

// Discard discards a job that has not finished; a running attempt no
// longer counts against its queue's concurrency limit.
func (d *Driver) Discard(ctx context.Context, id int64) (*driver.JobRow, error) {
	return d.changeJob(ctx, "discard", id, true, d.q.FinishJob, id, driver.StateDiscarded)
}

// changeJob runs a guarded single-job UPDATE ... RETURNING; when it changes
// nothing, it tells a missing job (ErrNotFound) from one in the wrong state
// (ErrWrongState), in the same transaction. With ends, the change ends a
// running attempt: the key slot the job holds under its fence (which the
// change keeps) or that is kept for it is freed in the same transaction.
func (d *Driver) changeJob(ctx context.Context, op string, id int64, ends bool, query string, args ...any) (*driver.JobRow, error) {
	var j *driver.JobRow
	var state string
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		j, state = nil, ""
		var err error
		j, err = scanJob(tx.QueryRowContext(ctx, query, args...))
		if isUniqueViolation(err) {
			// A unique job retried while another holds its key. The
			// write lock is ours: the holder read next is the one.
			return d.uniqueConflict(ctx, tx, op, id)
		}
		if err == nil && ends {
			if j.Key == "" {
				return nil
			}
			return d.freeKeySlots(ctx, tx, []keyEnd{{id: j.ID, fence: j.Fence, state: j.State, queue: j.Queue, key: j.Key}})
		}
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		err = tx.QueryRowContext(ctx, d.q.JobState, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return driver.ErrNotFound
		}
		return err
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("conveyor/sqlite: %s job %d: %w", op, id, err)
	case j == nil:
		return nil, fmt.Errorf("conveyor/sqlite: %s job %d: job is %s: %w", op, id, state, driver.ErrWrongState)
	}
	return j, nil
}

// Stats counts jobs per queue and state, the age of each queue's oldest
// available job by the database's clock, and the jobs waiting for their
// dependencies.
func (d *Driver) Stats(ctx context.Context) ([]driver.QueueStats, error) {
	return d.queueStats(ctx, "stats", d.q.Stats)
}

// Overview counts the unfinished jobs and the jobs finished since
// finishedSince through the partial indexes (see driver.Driver), and the
// jobs waiting for their dependencies.
func (d *Driver) Overview(ctx context.Context, finishedSince time.Time) ([]driver.QueueStats, error) {
	return d.queueStats(ctx, "overview", d.q.Overview, finishedSince.UnixMicro())
}

// awaiting counts the callbacks of the open batches by queue.
func (d *Driver) awaiting(ctx context.Context) (map[string]int64, error) {
	rows, err := d.r.QueryContext(ctx, d.q.AwaitingDeps)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return driver.ScanAwaiting(rows)
}

// queueStats runs query, stats or overview (named what in errors): rows
// of queue, state, count, the oldest available scheduled_at and the
// database's now.
func (d *Driver) queueStats(ctx context.Context, what, query string, args ...any) ([]driver.QueueStats, error) {
	rows, err := d.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: %s: %w", what, err)
	}
	defer rows.Close()
	byQueue := map[string]*driver.QueueStats{}
	for rows.Next() {
		var (
			queue, state string
			n, now       int64
			oldest       sql.NullInt64
		)
		if err := rows.Scan(&queue, &state, &n, &oldest, &now); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: %s: %w", what, err)
		}
		qs := byQueue[queue]
		if qs == nil {
			qs = driver.NewQueueStats(queue)
			byQueue[queue] = qs
		}
		qs.Counts[state] += n
		if state == driver.StateAvailable && oldest.Valid && now > oldest.Int64 {
			qs.OldestAvailable = time.Duration(now-oldest.Int64) * time.Microsecond
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: %s: %w", what, err)
	}
	out := make([]driver.QueueStats, 0, len(byQueue))
	for _, qs := range byQueue {
		out = append(out, *qs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	awaiting, err := d.awaiting(ctx)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: %s: jobs awaiting dependencies: %w", what, err)
	}
	return driver.WithAwaiting(out, awaiting), nil
}
