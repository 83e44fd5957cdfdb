package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/conveyorq/conveyor/internal/driver"
)

// InsertBatches inserts jobs, then per batch a row keeping its callback,
// its member rows and the rows of the batches it waits for, in tx (a
// *sql.Tx on this database) or in a write transaction of its own when tx
// is nil.
func (d *Driver) InsertBatches(ctx context.Context, tx any, jobs []driver.InsertParams, batches []driver.BatchParams) ([]int64, []int64, error) {
	var ids, batchIDs []int64
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
			var bid int64
			if err := t.QueryRowContext(ctx, d.q.InsertBatch, string(cb)).Scan(&bid); err != nil {
				return err
			}
			members, deps := make([]int64, len(b.Jobs)), make([]int64, len(b.After))
			for i, j := range b.Jobs {
				members[i] = ids[j]
			}
			for i, a := range b.After {
				deps[i] = batchIDs[a]
			}
			mj, _ := json.Marshal(members)
			dj, _ := json.Marshal(deps)
			if _, err := t.ExecContext(ctx, d.q.InsertBatchJobs, bid, string(mj)); err != nil {
				return err
			}
			if _, err := t.ExecContext(ctx, d.q.InsertBatchDeps, bid, string(dj)); err != nil {
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
			return nil, nil, fmt.Errorf("conveyor/sqlite: insert batch in transaction: got %T, want a non-nil *sql.Tx: %w", tx, driver.ErrTxType)
		}
		err = in(t)
	} else {
		err = d.inTx(ctx, in)
		// Again after the commit (see driver.QueueSkip).
		d.noKeyless.ForgetKeyless(jobs)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("conveyor/sqlite: insert %d batches of %d jobs: %w", len(batches), len(jobs), err)
	}
	return ids, batchIDs, nil
}

// FireBatches enqueues the callbacks of up to limit batches whose members
// have all finished (see driver.FireReady), each in a write transaction
// that reads the batch again (a member retried by hand since the first
// read keeps it open: the write transaction is exclusive, so no retry
// comes between that read and the commit) and records the callback's id
// only while none is recorded.
func (d *Driver) FireBatches(ctx context.Context, limit int, skip func(batchID int64) bool) (map[int64]int64, error) {
	read := func(ctx context.Context, after int64, n int) ([]driver.ReadyBatch, error) {
		var rs []driver.ReadyBatch
		err := d.busyRetry(ctx, func() error {
			rs = rs[:0]
			rows, err := d.r.QueryContext(ctx, d.q.ReadyBatches, n, after)
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
		}, nil)
		if err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: fire batches: %w", err)
		}
		return rs, nil
	}
	fire := func(ctx context.Context, id int64, p driver.InsertParams) (int64, error) {
		var cbID int64
		err := d.inTx(ctx, func(tx *sql.Tx) error {
			var one int
			if err := tx.QueryRowContext(ctx, d.q.BatchReady, id).Scan(&one); errors.Is(err, sql.ErrNoRows) {
				return driver.ErrBatchNotReady
			} else if err != nil {
				return err
			}
			driver.InFire(ctx, id)
			ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{p})
			if err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, d.q.FireBatch, id, ids[0])
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
			return 0, fmt.Errorf("conveyor/sqlite: fire batch %d: %w", id, err)
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
	var cb, waiting string
	var cbID, fired sql.NullInt64
	var created int64
	err := d.r.QueryRowContext(ctx, d.q.GetBatch, id).Scan(&b.ID, &cb, &cbID, &created, &fired, &waiting)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: %w", id, driver.ErrBatchNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: %w", id, err)
	}
	if err := json.Unmarshal([]byte(cb), &b.Callback); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: callback: %w", id, err)
	}
	if err := json.Unmarshal([]byte(waiting), &b.Waiting); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: batches waited for: %w", id, err)
	}
	slices.Sort(b.Waiting)
	b.CallbackID, b.CreatedAt = cbID.Int64, fromUS(created)
	if fired.Valid {
		b.FiredAt = fromUS(fired.Int64)
	}
	rows, err := d.r.QueryContext(ctx, d.q.BatchMembers, id)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: members: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var m driver.BatchMember
		var res sql.NullString
		if err := rows.Scan(&m.ID, &m.State, &res); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: get batch %d: members: %w", id, err)
		}
		if res.Valid {
			m.Result = json.RawMessage(res.String)
		}
		b.Members = append(b.Members, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: get batch %d: members: %w", id, err)
	}
	return b, nil
}
