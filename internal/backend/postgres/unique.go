package postgres

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// uniqueRounds bounds how often InsertUnique tries again a job whose insert
// was refused but whose key's holder had finished (and freed the key) by
// the time it was looked up.
const uniqueRounds = 10

// querier runs a query and calls row for each row it returns, with the
// function that scans the row.
type querier func(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error

// InsertUnique inserts jobs in tx (a pgx.Tx or a *sql.Tx of the pgx
// stdlib driver) or, when tx is nil, in one transaction of its own: the
// jobs without a unique key with Insert's statement, then one statement
// inserts every unique job whose key is free, in key order, and one more
// reads the holders of the others. A holder that finished in between
// freed its key: those jobs are tried again. In a transaction of its own,
// run again on a deadlock, an error before the commit, or the server's
// refusal of the commit, is marked driver.NotCommitted.
func (d *Driver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	if tx == nil {
		// Run again whole when the server breaks a deadlock by rolling it
		// back: an application's transaction that inserts keys against
		// the key order waits for this one while this one waits for it.
		err := d.retryable(ctx, func() error {
			clear(ids)
			clear(dup)
			ptx, err := d.pool.Begin(ctx)
			if err != nil {
				return d.wrap("insert unique", driver.NotCommitted(err))
			}
			defer ptx.Rollback(ctx)
			if err := d.insertUnique(ctx, pgxQuerier(ptx), jobs, ids, dup, false); err != nil {
				return d.wrap("insert unique", driver.NotCommitted(err))
			}
			if err := ptx.Commit(ctx); err != nil {
				return d.wrap("insert unique: commit", refused(err))
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		// Notified after the commit (see notify.go): the jobs that went
		// in, a held key's job not.
		d.notifyAfter(ctx, dueQueues(jobs, dup))
	} else {
		q, _, err := txQuerier("insert unique tx", tx)
		if err != nil {
			return nil, nil, err
		}
		if err := d.insertUnique(ctx, q, jobs, ids, dup, true); err != nil {
			return nil, nil, d.wrap("insert unique tx", err)
		}
	}
	// After the commit of a transaction of the driver's own; in the
	// caller's, the notification at its commit wakes the queues too (see
	// claimHints).
	d.seg.wakeJobs(jobs)
	return ids, dup, nil
}

// insertUnique is InsertUnique's work through q; inline says whether its
// statements notify the queues themselves (see segStore.insert).
func (d *Driver) insertUnique(ctx context.Context, q querier, all []driver.InsertParams, ids []int64, dup []bool, inline bool) error {
	var jobs, plain []driver.InsertParams
	var jobsAt, plainAt []int
	for i := range all {
		if all[i].UniqueKey == nil {
			plain, plainAt = append(plain, all[i]), append(plainAt, i)
		} else {
			jobs, jobsAt = append(jobs, all[i]), append(jobsAt, i)
		}
	}
	if len(plain) > 0 {
		got, err := d.seg.insert(ctx, q, plain, inline)
		if err != nil {
			return err
		}
		if len(got) != len(plain) {
			return fmt.Errorf("the insert returned %d ids for %d jobs", len(got), len(plain))
		}
		for k, i := range plainAt {
			ids[i] = got[k]
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	uids, udup := make([]int64, len(jobs)), make([]bool, len(jobs))
	if err := d.insertKeyed(ctx, q, jobs, uids, udup, inline); err != nil {
		return err
	}
	for k, i := range jobsAt {
		ids[i], dup[i] = uids[k], udup[k]
	}
	return nil
}

// insertKeyed inserts jobs that all have a unique key, in key order (ids
// and queue positions in the order given), and reads the holders of the
// keys held. An insert the incarnation guard
// refused returns no row at all, and the round runs again with a fresh
// view of the registry.
func (d *Driver) insertKeyed(ctx context.Context, q querier, jobs []driver.InsertParams, ids []int64, dup []bool, inline bool) error {
	insertQ, err := d.seg.uniqueInsert(ctx, false)
	if err != nil {
		return err
	}
	staleRounds := 0
	pending := make([]int, len(jobs))
	for i := range pending {
		pending[i] = i
	}
	sort.Slice(pending, func(a, b int) bool { return bytes.Compare(jobs[pending[a]].UniqueKey, jobs[pending[b]].UniqueKey) < 0 })
	for round := 0; len(pending) > 0; round++ {
		if round == uniqueRounds {
			return fmt.Errorf("%d unique jobs: their keys were held and freed again %d times in a row", len(pending), uniqueRounds)
		}
		batch := make([]driver.InsertParams, len(pending))
		var keys, keeps, order arrayLit
		keys.init(67 * len(pending))
		keeps.init(2 * len(pending))
		order.init(4 * len(pending))
		for k, i := range pending {
			batch[k] = jobs[i]
			keys.str(hex.EncodeToString(jobs[i].UniqueKey))
			keeps.int(int64(jobs[i].UniqueKeep))
			order.int(int64(i))
		}
		var refused []int
		k := 0
		err := q(ctx, insertQ, append(insertArgs(batch), keys.String(), keeps.String(), order.String(), inline), func(scan func(...any) error) error {
			var id int64
			var inserted bool
			if err := scan(&id, &inserted); err != nil {
				return err
			}
			if k >= len(pending) {
				return errors.New("the insert returned more rows than jobs")
			}
			i := pending[k]
			k++
			if inserted {
				ids[i] = id
			} else {
				refused = append(refused, i)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if k == 0 && staleRounds < segRounds {
			staleRounds++
			round--
			if insertQ, err = d.seg.uniqueInsert(ctx, true); err != nil {
				return err
			}
			continue
		}
		if k != len(pending) {
			return fmt.Errorf("the insert returned %d rows for %d jobs", k, len(pending))
		}
		if len(refused) == 0 {
			return nil
		}
		var held arrayLit
		held.init(67 * len(refused))
		for _, i := range refused {
			held.str(hex.EncodeToString(jobs[i].UniqueKey))
		}
		holders := make(map[string]int64, len(refused))
		err = q(ctx, d.q.SegUniqueHolders, []any{held.String()}, func(scan func(...any) error) error {
			var key string
			var id int64
			if err := scan(&key, &id); err != nil {
				return err
			}
			holders[key] = id
			return nil
		})
		if err != nil {
			return err
		}
		pending = pending[:0]
		for _, i := range refused {
			if id, ok := holders[hex.EncodeToString(jobs[i].UniqueKey)]; ok {
				ids[i], dup[i] = id, true
			} else {
				pending = append(pending, i)
			}
		}
	}
	return nil
}

// pgxQuerier runs queries on a pgx transaction.
func pgxQuerier(tx pgx.Tx) querier { return rowsQuerier(tx.Query) }

// rowsQuerier runs queries with a pgx Query method (a transaction's, a
// pool's).
func rowsQuerier(run func(ctx context.Context, sql string, args ...any) (pgx.Rows, error)) querier {
	return func(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
		rows, err := run(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}

// sqlQuerier runs queries on a database/sql transaction.
func sqlQuerier(tx *sql.Tx) querier {
	return func(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}
