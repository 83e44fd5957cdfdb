// Package sqlitedb is conveyor's SQLite driver on the application's own
// database/sql handle, opened with modernc.org/sqlite:
//
//	db, err := sql.Open("sqlite", "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
//	...
//	drv := sqlitedb.New(db)
//	client, err := conveyor.New(ctx, drv, &conveyor.Config{...})
//
// Conveyor's claims, inserts and maintenance run on that handle, one at a
// time; the lease path (heartbeats and acknowledgements) gets one
// connection of its own. A transaction begun on the handle works with
// Client.EnqueueTx: the jobs appear when it commits. The file must be in
// WAL mode; its synchronous mode and busy timeout are the application's.
// Closing the client leaves the handle open.
//
// conveyor checkpoints the WAL on a connection of its own, off every
// commit path. The handle's own connections still checkpoint as they
// commit (SQLite's default) unless the DSN turns that off, which keeps
// checkpoints, and the stall after a long reader ends, out of the
// application's commits too: add _pragma=wal_autocheckpoint(0).
//
// SQLite has one writer at a time and no queue for its lock. While a
// heartbeat of any conveyor client on the file is pending, conveyor's
// other writes in every process wait for it (on Linux; a side file
// "<database>-conveyor-lease" carries the signal between processes). An
// application whose own write transactions follow each other back to back
// can still keep renewals out long enough for leases to expire and jobs
// to run twice: begin those transactions with Driver.BeginTx (or call
// Driver.YieldToLeases first), which lets a pending renewal go first.
package sqlitedb

import (
	"context"
	"database/sql"
	"sync/atomic"

	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/driver"
)

// Driver is a conveyor.Driver on an application's *sql.DB.
type Driver struct {
	db   *sql.DB
	path atomic.Pointer[string] // the database file, once bound
}

// New returns a driver on db, for conveyor.New.
func New(db *sql.DB) *Driver { return &Driver{db: db} }

// UnwrapTx is called by Client.EnqueueTx; applications do not call it.
func (d *Driver) UnwrapTx(tx *sql.Tx) any { return tx }

// Bind is called by conveyor.New; applications do not call it.
func (d *Driver) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	drv, err := sqlite.New(ctx, d.db, opts)
	if err != nil {
		return nil, err
	}
	p := drv.Path()
	d.path.Store(&p)
	return drv, nil
}

// YieldToLeases waits, for at most a quarter of a second, while a lease
// renewal of a conveyor client on the same file is pending in this
// process or another. It returns at once before the driver is bound by
// conveyor.New, and ctx's error if ctx ends first.
func (d *Driver) YieldToLeases(ctx context.Context) error {
	p := d.path.Load()
	if p == nil {
		return ctx.Err()
	}
	return sqlite.YieldToLeases(ctx, *p)
}

// BeginTx begins a transaction on the application's handle after
// YieldToLeases: use it for write transactions that enqueue jobs (or
// any that follow each other quickly).
func (d *Driver) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := d.YieldToLeases(ctx); err != nil {
		return nil, err
	}
	return d.db.BeginTx(ctx, opts)
}
