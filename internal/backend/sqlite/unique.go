package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/conveyorq/conveyor/internal/driver"
)

// InsertUnique inserts, in tx (a *sql.Tx on this database) or in one
// IMMEDIATE transaction of its own, the jobs without a unique key as Insert
// does, then the unique ones one statement each, in key order. A job whose
// key is held gets the holder's id and its duplicate flag. SQLite has one
// writer, so the holder is always visible to the statement that follows
// the refused insert.
func (d *Driver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	for i := range jobs {
		if err := checkInsert(i, &jobs[i]); err != nil {
			return nil, nil, driver.NotCommitted(fmt.Errorf("conveyor/sqlite: insert %d unique jobs: %w", len(jobs), err))
		}
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	run := func(e execer) error {
		return d.insertUnique(ctx, e, jobs, ids, dup)
	}
	var err error
	if tx == nil {
		err = d.inTx(ctx, func(t *sql.Tx) error { return run(t) })
	} else {
		t, ok := tx.(*sql.Tx)
		switch {
		case !ok:
			return nil, nil, fmt.Errorf("conveyor/sqlite: insert in transaction: got %T, want *sql.Tx: %w", tx, driver.ErrTxType)
		case t == nil:
			return nil, nil, fmt.Errorf("conveyor/sqlite: insert in transaction: got a nil *sql.Tx: %w", driver.ErrTxType)
		}
		err = run(t)
	}
	// After the commit of a transaction of the driver's own, before the
	// caller's (see driver.QueueSkip).
	d.noKeyless.ForgetKeyless(jobs)
	if err != nil {
		return nil, nil, fmt.Errorf("conveyor/sqlite: insert %d unique jobs: %w", len(jobs), err)
	}
	return ids, dup, nil
}

func (d *Driver) insertUnique(ctx context.Context, e execer, jobs []driver.InsertParams, ids []int64, dup []bool) error {
	var order, plainAt []int
	var plain []driver.InsertParams
	for i := range jobs {
		if jobs[i].UniqueKey == nil {
			plain, plainAt = append(plain, jobs[i]), append(plainAt, i)
		} else {
			order = append(order, i)
		}
	}
	if len(plain) > 0 {
		got := make([]int64, 0, len(plain))
		err := insertChunks(plain, 0, func(chunk string, _ int) error {
			return d.insertChunk(ctx, e, chunk, &got)
		})
		if err != nil {
			return err
		}
		if len(got) != len(plain) {
			return fmt.Errorf("%d ids returned for %d jobs", len(got), len(plain))
		}
		for k, i := range plainAt {
			ids[i] = got[k]
		}
	}
	sort.Slice(order, func(a, b int) bool { return bytes.Compare(jobs[order[a]].UniqueKey, jobs[order[b]].UniqueKey) < 0 })
	for _, i := range order {
		j := &jobs[i]
		var row string
		if err := insertChunks(jobs[i:i+1], 1, func(chunk string, _ int) error { row = chunk; return nil }); err != nil {
			return err
		}
		var got []int64
		if err := queryIDs(ctx, e, d.q.InsertUnique, &got, row, j.UniqueKey, j.UniqueKeep); err != nil {
			return err
		}
		if len(got) == 1 {
			ids[i] = got[0]
			continue
		}
		rows, err := e.QueryContext(ctx, d.q.UniqueHolder, j.UniqueKey)
		if err != nil {
			return err
		}
		var holder int64
		found := rows.Next()
		if found {
			err = rows.Scan(&holder)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return err
		}
		if !found {
			return errors.New("a unique job's insert was refused but no job holds its key")
		}
		ids[i], dup[i] = holder, true
	}
	return nil
}
