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
// an error before the commit, or the server's refusal of the commit, is
// marked driver.NotCommitted.
func (d *Driver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	ids, dup, err := d.tryInsertUnique(ctx, tx, jobs)
	if d.converted(ctx, err) {
		if tx == nil {
			return d.tryInsertUnique(ctx, tx, jobs)
		}
		err = fmt.Errorf("%w (the prefix was converted to the segments storage meanwhile; this driver now uses it: run the transaction again)", err)
	}
	return ids, dup, err
}

// tryInsertUnique is InsertUnique on the storage this driver last read
// (see converted).
func (d *Driver) tryInsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	switch t := tx.(type) {
	case nil:
		ptx, err := d.pool.Begin(ctx)
		if err != nil {
			return nil, nil, wrap("insert unique", driver.NotCommitted(err))
		}
		defer ptx.Rollback(ctx)
		if err := d.insertUnique(ctx, pgxQuerier(ptx), jobs, ids, dup); err != nil {
			return nil, nil, wrap("insert unique", driver.NotCommitted(err))
		}
		if err := ptx.Commit(ctx); err != nil {
			return nil, nil, wrap("insert unique: commit", refused(err))
		}
	case pgx.Tx:
		if err := d.insertUnique(ctx, pgxQuerier(t), jobs, ids, dup); err != nil {
			return nil, nil, wrap("insert unique tx", err)
		}
	case *sql.Tx:
		if t == nil {
			return nil, nil, fmt.Errorf("conveyor/postgres: insert unique tx: a nil *sql.Tx: %w", driver.ErrTxType)
		}
		if err := d.insertUnique(ctx, sqlQuerier(t), jobs, ids, dup); err != nil {
			return nil, nil, wrap("insert unique tx", err)
		}
	default:
		return nil, nil, fmt.Errorf("conveyor/postgres: insert unique tx: transaction of type %T: accepted are pgx.Tx and *sql.Tx (pgx stdlib driver): %w", tx, driver.ErrTxType)
	}
	if s := d.segs(); s != nil {
		// After the commit of a transaction of the driver's own; in the
		// caller's, the notification at its commit wakes the queues too
		// (see claimHints).
		s.wakeJobs(jobs)
	}
	return ids, dup, nil
}

func (d *Driver) insertUnique(ctx context.Context, q querier, all []driver.InsertParams, ids []int64, dup []bool) error {
	s := d.segs()
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
		var got []int64
		var err error
		if s != nil {
			got, err = s.insert(ctx, q, plain)
		} else {
			got = make([]int64, 0, len(plain))
			err = q(ctx, d.q.insert, insertArgs(plain), func(scan func(...any) error) error {
				var id int64
				if err := scan(&id); err != nil {
					return err
				}
				got = append(got, id)
				return nil
			})
		}
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
	if err := d.insertKeyed(ctx, q, s, jobs, uids, udup); err != nil {
		return err
	}
	for k, i := range jobsAt {
		ids[i], dup[i] = uids[k], udup[k]
	}
	return nil
}

// insertKeyed inserts jobs that all have a unique key, in key order, and
// reads the holders of the keys held (s is the segments storage, or nil).
func (d *Driver) insertKeyed(ctx context.Context, q querier, s *segStore, jobs []driver.InsertParams, ids []int64, dup []bool) error {
	// The statements of the prefix's storage; on the segments storage, an
	// insert the incarnation guard refused returns no row at all, and the
	// round runs again with a fresh view of the registry.
	insertQ, holdersQ := d.q.insertUnique, d.q.uniqueHolders
	stmts := func(stale bool) error {
		if s == nil {
			return nil
		}
		var err error
		insertQ, holdersQ, err = s.uniqueStatements(ctx, stale)
		return err
	}
	if err := stmts(false); err != nil {
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
		var keys, keeps arrayLit
		keys.init(67 * len(pending))
		keeps.init(2 * len(pending))
		for k, i := range pending {
			batch[k] = jobs[i]
			keys.str(hex.EncodeToString(jobs[i].UniqueKey))
			keeps.int(int64(jobs[i].UniqueKeep))
		}
		var refused []int
		k := 0
		err := q(ctx, insertQ, append(insertArgs(batch), keys.String(), keeps.String()), func(scan func(...any) error) error {
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
		if k == 0 && s != nil && staleRounds < segRounds {
			staleRounds++
			round--
			if err := stmts(true); err != nil {
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
		err = q(ctx, holdersQ, []any{held.String()}, func(scan func(...any) error) error {
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
