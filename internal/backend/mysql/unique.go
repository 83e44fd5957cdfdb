package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/conveyorq/conveyor/internal/driver"
)

// uniqueRounds bounds how often InsertUnique tries again a job whose insert
// was refused but whose key's holder had finished (and freed the key) by
// the time it was looked up.
const uniqueRounds = 10

// InsertUnique inserts, in tx (a *sql.Tx on a MySQL or MariaDB
// connection) or in one transaction of its own retried whole on a
// deadlock, the jobs without a unique key as Insert does, then the unique
// ones one row each, in key order.
//
// Each job's key is first looked up with a plain (consistent, lock-free)
// read: a job holding it makes this one a duplicate, and nothing is
// locked. Only a key nobody holds is inserted; the unique index on
// unique_live refuses it if a concurrent transaction took the key in
// between (error 1062). InnoDB then keeps a shared lock on the holder's
// index entry until this transaction ends, and the holder's completion
// (which changes that entry) waits for it, with the rows of its batch,
// and the process's heartbeat behind them. In a transaction of our own
// that is moments; in the caller's it could be as long as the caller
// keeps it open, and every job of the holder's process would lose its
// lease meanwhile. So in the caller's transaction that race is
// ErrUniqueRace: the caller rolls back, which releases the lock, and runs
// its transaction again. Concurrent inserters of one key that both wait
// for a third may deadlock, which InnoDB resolves by rolling one back
// (retried here in a transaction of our own; returned to the caller in
// theirs).
func (d *Driver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	defer d.behindInserted(jobs)
	if _, err := d.planInsert("insert unique", jobs); err != nil {
		return nil, nil, driver.NotCommitted(err)
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	if tx == nil {
		err := d.inTx(ctx, "insert unique", func(t *sql.Tx) error {
			clear(dup)
			return d.insertUnique(ctx, t, true, jobs, ids, dup)
		})
		if err != nil {
			return nil, nil, err
		}
		return ids, dup, nil
	}
	t, ok := tx.(*sql.Tx)
	if !ok || t == nil {
		return nil, nil, fmt.Errorf("conveyor/mysql: insert unique tx: got %T, want a non-nil *sql.Tx (database/sql on a go-sql-driver/mysql connection): %w", tx, driver.ErrTxType)
	}
	if err := d.insertUnique(ctx, t, false, jobs, ids, dup); err != nil {
		return nil, nil, d.wrap("insert unique tx", err)
	}
	return ids, dup, nil
}

func (d *Driver) insertUnique(ctx context.Context, tx *sql.Tx, own bool, jobs []driver.InsertParams, ids []int64, dup []bool) error {
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
		p, err := d.planInsert("insert unique", plain)
		if err != nil {
			return err
		}
		got := make([]int64, len(plain))
		off := 0
		for _, c := range p.chunks {
			if own {
				err = d.insertChunk(ctx, tx, nil, c, got[off:off+len(c)])
			} else {
				err = d.insertChunk(ctx, nil, tx, c, got[off:off+len(c)])
			}
			if err != nil {
				return err
			}
			off += len(c)
		}
		for k, i := range plainAt {
			ids[i] = got[k]
		}
	}
	sort.Slice(order, func(a, b int) bool { return bytes.Compare(jobs[order[a]].UniqueKey, jobs[order[b]].UniqueKey) < 0 })
	q := d.q.InsertUniqueHead + " " + d.q.InsertUniqueRow
	for _, i := range order {
		j := &jobs[i]
		args := append(insertArgs(make([]any, 0, insertParamsPerRow+2), jobs[i:i+1]), j.UniqueKey, int64(j.UniqueKeep))
		for round := 0; ; round++ {
			if round == uniqueRounds {
				return fmt.Errorf("job %d: its unique key was held and freed again %d times in a row", i, uniqueRounds)
			}
			holder, found, err := d.uniqueHolder(ctx, tx, j.UniqueKey)
			if err != nil {
				return err
			}
			if found {
				ids[i], dup[i] = holder, true
				break
			}
			res, err := tx.ExecContext(ctx, q, args...)
			if err == nil {
				id, err := res.LastInsertId()
				if err != nil {
					return err
				}
				ids[i] = id
				break
			}
			if myErrno(err) != errDupEntry {
				return err
			}
			if !own {
				return fmt.Errorf("job %d: %w", i, driver.ErrUniqueRace)
			}
			// Our own transaction commits in moments: read the holder
			// (or, if it finished in between, try again).
		}
	}
	return nil
}

// uniqueHolder reads, without locking, the job holding key.
func (d *Driver) uniqueHolder(ctx context.Context, tx *sql.Tx, key []byte) (int64, bool, error) {
	var holder int64
	err := tx.QueryRowContext(ctx, d.q.UniqueHolder, key).Scan(&holder)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return holder, err == nil, err
}
