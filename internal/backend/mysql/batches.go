package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// InsertBatches inserts jobs, then per batch a row keeping its callback,
// its member rows and the rows of the batches it waits for, in tx (a
// *sql.Tx) or in a transaction of its own when tx is nil.
func (d *Driver) InsertBatches(ctx context.Context, tx any, jobs []driver.InsertParams, batches []driver.BatchParams) ([]int64, []int64, error) {
	defer d.behindInserted(jobs)
	var ids, batchIDs []int64
	pairs := func(t *sql.Tx, head string, a int64, bs []int64) error {
		for off := 0; off < len(bs); off += 1000 {
			part := bs[off:min(off+1000, len(bs))]
			var q strings.Builder
			q.WriteString(head)
			args := make([]any, 0, 2*len(part))
			for i, b := range part {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString(" (?, ?)")
				args = append(args, a, b)
			}
			if _, err := t.ExecContext(ctx, q.String(), args...); err != nil {
				return err
			}
		}
		return nil
	}
	in := func(t *sql.Tx) error {
		var err error
		if ids, err = d.InsertTx(ctx, t, jobs); err != nil {
			return err
		}
		batchIDs = batchIDs[:0]
		for _, b := range batches {
			cb, err := json.Marshal(b.Callback)
			if err != nil {
				return err
			}
			res, err := t.ExecContext(ctx, d.q.InsertBatch, string(cb))
			if err != nil {
				return err
			}
			bid, err := res.LastInsertId()
			if err != nil {
				return err
			}
			members, deps := make([]int64, len(b.Jobs)), make([]int64, len(b.After))
			for i, j := range b.Jobs {
				members[i] = ids[j]
			}
			for i, a := range b.After {
				deps[i] = batchIDs[a]
			}
			if err := pairs(t, d.q.InsertBatchJobs, bid, members); err != nil {
				return err
			}
			if err := pairs(t, d.q.InsertBatchDeps, bid, deps); err != nil {
				return err
			}
			batchIDs = append(batchIDs, bid)
		}
		return nil
	}
	var err error
	if tx != nil {
		t, ok := tx.(*sql.Tx)
		if !ok || t == nil {
			return nil, nil, fmt.Errorf("conveyor/mysql: insert batch in transaction: got %T, want a non-nil *sql.Tx: %w", tx, driver.ErrTxType)
		}
		err = in(t)
	} else {
		err = d.inTx(ctx, "insert batch", in)
	}
	if err != nil {
		return nil, nil, d.wrap(fmt.Sprintf("insert %d batches of %d jobs", len(batches), len(jobs)), err)
	}
	return ids, batchIDs, nil
}

// FireBatches enqueues the callbacks of up to limit batches whose members
// have all finished (see driver.FireReady), each in a transaction that
// first reads the batch's members and the batches it waits for again,
// by a locking read (lock_batch_members: a retry by hand either came
// before and is seen, or waits for the commit), and whose UPDATE of the
// batch row records the callback's id only while none is recorded.
func (d *Driver) FireBatches(ctx context.Context, limit int, skip func(batchID int64) bool) (map[int64]int64, error) {
	read := func(ctx context.Context, after int64, n int) ([]driver.ReadyBatch, error) {
		var rs []driver.ReadyBatch
		err := d.retry(ctx, "fire batches", func() error {
			rs = rs[:0]
			rows, err := d.db.QueryContext(ctx, d.q.ReadyBatches, after, n)
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
		return rs, err
	}
	fire := func(ctx context.Context, id int64, p driver.InsertParams) (int64, error) {
		var cbID int64
		err := d.inTx(ctx, "fire batch", func(tx *sql.Tx) error {
			for _, q := range []string{d.q.LockBatchMembers, d.q.LockBatchDeps} {
				var n, unfinished int64
				if err := tx.QueryRowContext(ctx, q, id).Scan(&n, &unfinished); err != nil {
					return err
				}
				if unfinished > 0 {
					return driver.ErrBatchNotReady
				}
			}
			driver.InFire(ctx, id)
			ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{p})
			if err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, d.q.FireBatch, ids[0], id)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				if err == nil {
					err = driver.ErrBatchNotReady
				}
				return err
			}
			cbID = ids[0]
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("conveyor/mysql: fire batch %d: %w", id, err)
		}
		if p.Key == "" {
			// Again after the commit (see driver.QueueSkip).
			d.noKeyless.Forget(p.Queue)
		}
		return cbID, nil
	}
	return driver.FireReady(ctx, limit, skip, read, fire)
}

// GetBatch returns batch id with its members' states and results.
func (d *Driver) GetBatch(ctx context.Context, id int64) (*driver.BatchRow, error) {
	b := &driver.BatchRow{}
	var cb string
	var cbID sql.NullInt64
	var fired sql.NullTime
	var waiting sql.NullString
	err := d.db.QueryRowContext(ctx, d.q.GetBatch, id, id).Scan(&b.ID, &cb, &cbID, &b.CreatedAt, &fired, &waiting)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/mysql: get batch %d: %w", id, driver.ErrBatchNotFound)
	}
	if err != nil {
		return nil, d.wrap("get batch", err)
	}
	if err := json.Unmarshal([]byte(cb), &b.Callback); err != nil {
		return nil, fmt.Errorf("conveyor/mysql: get batch %d: callback: %w", id, err)
	}
	if waiting.Valid {
		if err := json.Unmarshal([]byte(waiting.String), &b.Waiting); err != nil {
			return nil, fmt.Errorf("conveyor/mysql: get batch %d: batches waited for: %w", id, err)
		}
		slices.Sort(b.Waiting)
	}
	b.CallbackID, b.FiredAt = cbID.Int64, fired.Time
	rows, err := d.db.QueryContext(ctx, d.q.BatchMembers, id, id)
	if err != nil {
		return nil, d.wrap("get batch members", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m driver.BatchMember
		var res sql.NullString
		if err := rows.Scan(&m.ID, &m.State, &res); err != nil {
			return nil, d.wrap("get batch members", err)
		}
		if res.Valid {
			m.Result = json.RawMessage(res.String)
		}
		b.Members = append(b.Members, m)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("get batch members", err)
	}
	return b, nil
}

// pruneBatches deletes up to limit batches fired longer ago than age
// whose callback finished and that no kept batch waits for, with their
// member rows, in one transaction. A fired batch never
// changes, so the ids read first are deleted as read.
func (d *Driver) pruneBatches(ctx context.Context, age time.Duration, limit int) error {
	var ids []int64
	err := d.retry(ctx, "prune batches", func() error {
		ids = ids[:0]
		rows, err := d.db.QueryContext(ctx, d.q.PrunableBatches, micros(age), int64(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	})
	if err != nil || len(ids) == 0 {
		return err
	}
	return d.inTx(ctx, "prune batches", func(tx *sql.Tx) error {
		q, args, _ := d.inList(d.q.PruneBatchJobs, ids)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		q, args, _ = d.inList(d.q.PruneBatchDeps, ids)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		q, args, _ = d.inList(d.q.PruneBatches, ids)
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	})
}
