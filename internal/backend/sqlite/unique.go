package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
	if len(order) > 1 {
		// One statement per unique job (and one more per key found held),
		// all in this transaction, which holds the write lock: compile
		// each once, not once per job.
		if p, ok := e.(preparer); ok {
			c := &stmtCache{p: p, execer: e, queries: []string{d.q.InsertUnique, d.q.UniqueHolder}}
			defer c.close()
			e = c
		}
	}
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

// preparer is the part of *sql.Tx that prepares a statement.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// stmtCache runs the statements of queries on statements it prepares on
// p (a transaction) at their first use, and any other on execer.
type stmtCache struct {
	p       preparer
	queries []string
	stmts   []*sql.Stmt
	execer
}

// stmt returns the prepared statement of query, or nil if query is not
// one of c.queries.
func (c *stmtCache) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	i := slices.Index(c.queries, query)
	if i < 0 {
		return nil, nil
	}
	if c.stmts == nil {
		c.stmts = make([]*sql.Stmt, len(c.queries))
	}
	if c.stmts[i] == nil {
		st, err := c.p.PrepareContext(ctx, query)
		if err != nil {
			return nil, err
		}
		c.stmts[i] = st
	}
	return c.stmts[i], nil
}

func (c *stmtCache) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := c.stmt(ctx, query)
	switch {
	case err != nil:
		return nil, err
	case st == nil:
		return c.execer.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

func (c *stmtCache) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.stmt(ctx, query)
	switch {
	case err != nil:
		return nil, err
	case st == nil:
		return c.execer.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

// close closes the statements prepared.
func (c *stmtCache) close() {
	for _, st := range c.stmts {
		if st != nil {
			st.Close()
		}
	}
}
