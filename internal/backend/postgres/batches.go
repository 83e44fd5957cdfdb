package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// InsertBatches inserts jobs, then per batch a row keeping its callback,
// its member rows and the rows of the batches it waits for, in tx (a
// pgx.Tx or a *sql.Tx of the pgx stdlib driver) or in a transaction of
// its own when tx is nil. In its own, an error before the commit, or the
// server's refusal of the commit, is marked driver.NotCommitted.
func (d *Driver) InsertBatches(ctx context.Context, tx any, jobs []driver.InsertParams, batches []driver.BatchParams) ([]int64, []int64, error) {
	var ids, batchIDs []int64
	none := func(func(...any) error) error { return nil }
	in := func(q querier) error {
		ids, batchIDs = nil, batchIDs[:0]
		if len(jobs) > 0 {
			var err error
			if ids, err = d.seg.insert(ctx, q, jobs, true); err != nil {
				return err
			}
		}
		for _, b := range batches {
			cb, err := json.Marshal(b.Callback)
			if err != nil {
				return err
			}
			var bid int64
			if err := q(ctx, d.q.InsertBatch, []any{string(cb)}, func(scan func(...any) error) error {
				return scan(&bid)
			}); err != nil {
				return err
			}
			var members, deps arrayLit
			members.init(12 * len(b.Jobs))
			deps.init(12 * len(b.After))
			for _, j := range b.Jobs {
				members.int(ids[j])
			}
			for _, a := range b.After {
				deps.int(batchIDs[a])
			}
			if err := q(ctx, d.q.InsertBatchJobs, []any{bid, members.String()}, none); err != nil {
				return err
			}
			if err := q(ctx, d.q.InsertBatchDeps, []any{bid, deps.String()}, none); err != nil {
				return err
			}
			batchIDs = append(batchIDs, bid)
		}
		return nil
	}
	if tx != nil {
		q, _, err := txQuerier("insert batch", tx)
		if err != nil {
			return nil, nil, err
		}
		if err := in(q); err != nil {
			return nil, nil, d.wrap("insert batch", err)
		}
		return ids, batchIDs, nil
	}
	err := d.retryable(ctx, func() error {
		t, err := d.pool.Begin(ctx)
		if err != nil {
			return driver.NotCommitted(err)
		}
		defer func() { _ = t.Rollback(context.WithoutCancel(ctx)) }()
		if err := in(pgxQuerier(t)); err != nil {
			return driver.NotCommitted(err)
		}
		return refused(t.Commit(ctx))
	})
	if err != nil {
		return nil, nil, d.wrap("insert batch", err)
	}
	// Again after the commit (see driver.QueueSkip).
	d.noKeyless.ForgetKeyless(jobs)
	return ids, batchIDs, nil
}

// FireBatches enqueues the callbacks of up to limit batches none of whose
// members is in a live ready, running or waiting segment, read with a
// verified view of the registry (see segStore.read and
// driver.FireReady), each in a transaction that first locks the batch's
// finished members FOR SHARE (seg_lock_batch: a retry by hand, which
// deletes a job's row from its finished segment, then either came
// before and is seen, or waits for the commit), reads the batch again,
// and whose UPDATE of the batch row records the callback's id only
// while none is recorded.
func (d *Driver) FireBatches(ctx context.Context, limit int, skip func(batchID int64) bool) (map[int64]int64, error) {
	read := func(ctx context.Context, after int64, n int) ([]driver.ReadyBatch, error) {
		var rs []driver.ReadyBatch
		err := d.seg.read(ctx, func(v *segView) error {
			rs = rs[:0]
			rows, err := d.pool.Query(ctx, d.seg.stmt(&d.q.SegReadyBatches, v, v.srcs(phReady, phRunning, phWaiting)), n, after)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var r driver.ReadyBatch
				if err := rows.Scan(&r.ID, &r.Callback); err != nil {
					return err
				}
				rs = append(rs, r)
			}
			return rows.Err()
		})
		if err != nil {
			return nil, d.wrap("fire batches", err)
		}
		return rs, nil
	}
	none := func(func(...any) error) error { return nil }
	fire := func(ctx context.Context, id int64, p driver.InsertParams) (int64, error) {
		var cbID int64
		err := d.retryable(ctx, func() error {
			t, err := d.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = t.Rollback(context.WithoutCancel(ctx)) }()
			q := pgxQuerier(t)
			var ready bool
			err = d.seg.readIn(ctx, q, func(v *segView) error {
				if err := q(ctx, d.seg.stmt(&d.q.SegLockBatch, v, v.srcs(phDone, phDead)), []any{id}, none); err != nil {
					return err
				}
				ready = false
				return q(ctx, d.seg.stmt(&d.q.SegBatchReady, v, v.srcs(phReady, phRunning, phWaiting)), []any{id}, func(func(...any) error) error {
					ready = true
					return nil
				})
			})
			if err != nil {
				return err
			}
			if !ready {
				return driver.ErrBatchNotReady
			}
			driver.InFire(ctx, id)
			ids, err := d.seg.insert(ctx, q, []driver.InsertParams{p}, true)
			if err != nil {
				return err
			}
			tag, err := t.Exec(ctx, d.q.FireBatch, id, ids[0])
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return driver.ErrBatchNotReady
			}
			if err := t.Commit(ctx); err != nil {
				return err
			}
			cbID = ids[0]
			return nil
		})
		if err != nil {
			return 0, d.wrap(fmt.Sprintf("fire batch %d", id), err)
		}
		if p.Key == "" {
			// Again after the commit (see driver.QueueSkip).
			d.noKeyless.Forget(p.Queue)
		}
		return cbID, nil
	}
	return driver.FireReady(ctx, limit, skip, read, fire)
}

// GetBatch returns batch id with its members' states and results, read
// from every live segment.
func (d *Driver) GetBatch(ctx context.Context, id int64) (*driver.BatchRow, error) {
	b := &driver.BatchRow{}
	var cb string
	var cbID *int64
	var fired *time.Time
	err := d.pool.QueryRow(ctx, d.q.GetBatch, id).Scan(&b.ID, &cb, &cbID, &b.CreatedAt, &fired, &b.Waiting)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/postgres: get batch %d: %w", id, driver.ErrBatchNotFound)
	}
	if err != nil {
		return nil, d.wrap("get batch", err)
	}
	if err := json.Unmarshal([]byte(cb), &b.Callback); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: get batch %d: callback: %w", id, err)
	}
	if cbID != nil {
		b.CallbackID = *cbID
	}
	slices.Sort(b.Waiting)
	if fired != nil {
		b.FiredAt = *fired
	}
	err = d.seg.read(ctx, func(v *segView) error {
		b.Members = b.Members[:0]
		rows, err := d.pool.Query(ctx, d.seg.stmt(&d.q.SegBatchMembers, v, v.srcs(phases...)), id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var m driver.BatchMember
			var res *string
			if err := rows.Scan(&m.ID, &m.State, &res); err != nil {
				return err
			}
			if res != nil {
				m.Result = json.RawMessage(*res)
			}
			b.Members = append(b.Members, m)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, d.wrap("get batch members", err)
	}
	return b, nil
}

// pruneBatches deletes up to limit batches fired longer ago than age
// whose callback is in no live ready, running or waiting segment and
// that no kept batch waits for, with their member and dependency rows:
// the ids are read with a verified view of the registry (see
// segStore.read; a callback moved between segments meanwhile is not
// taken for finished), then deleted in one statement.
func (d *Driver) pruneBatches(ctx context.Context, age time.Duration, limit int) error {
	var ids []int64
	err := d.seg.read(ctx, func(v *segView) error {
		rows, err := d.pool.Query(ctx, d.seg.stmt(&d.q.SegPrunableBatches, v, v.srcs(phReady, phRunning, phWaiting)), micros(age), int64(limit))
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil || len(ids) == 0 {
		return err
	}
	_, err = d.pool.Exec(ctx, d.q.PruneBatches, ids)
	return err
}
