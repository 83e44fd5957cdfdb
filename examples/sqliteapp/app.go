// Package sqliteapp is an application with its own *sql.DB on a SQLite
// file that gives it to conveyor: it records an order and enqueues its
// invoice job in the same transaction of its own handle.
package sqliteapp

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/driver/sqlitedb"
)

// Invoice is the job enqueued for an order.
type Invoice struct {
	OrderID int64 `json:"order_id"`
	Cents   int64 `json:"cents"`
}

// Kind names the job kind.
func (Invoice) Kind() string { return "invoice" }

// App is the application: its handle, conveyor's driver on it, its
// client, and the invoices it issued.
type App struct {
	DB     *sql.DB
	Driver *sqlitedb.Driver
	Client *conveyor.Client[*sql.Tx]
	Issued chan Invoice
}

// Open opens the application's database at path (WAL, as conveyor needs,
// and BEGIN IMMEDIATE for its write transactions) and conveyor on it.
func Open(ctx context.Context, path string) (*App, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, cents INTEGER NOT NULL CHECK (cents > 0))"); err != nil {
		db.Close()
		return nil, err
	}
	drv := sqlitedb.New(db)
	c, err := conveyor.New(ctx, drv, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	a := &App{DB: db, Driver: drv, Client: c, Issued: make(chan Invoice, 16)}
	if _, err := c.Migrate(ctx); err != nil {
		a.Close()
		return nil, err
	}
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(a.Issue)); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// Close closes conveyor, then the application's handle.
func (a *App) Close() error {
	return errors.Join(a.Client.Close(), a.DB.Close())
}

// Issue is the handler of Invoice.
func (a *App) Issue(ctx context.Context, job *conveyor.Job[Invoice]) error {
	select {
	case a.Issued <- job.Args:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Order records an order and enqueues its invoice in one transaction of
// the application's handle, begun through the driver so that a pending
// lease renewal goes first.
func (a *App) Order(ctx context.Context, cents int64) (int64, error) {
	tx, err := a.Driver.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	id, err := a.OrderTx(ctx, tx, cents)
	if err != nil {
		return 0, err
	}
	return id, tx.Commit()
}

// OrderTx records an order and enqueues its invoice in tx, which the
// caller commits: the invoice job exists if and only if the order does.
func (a *App) OrderTx(ctx context.Context, tx *sql.Tx, cents int64) (int64, error) {
	res, err := tx.ExecContext(ctx, "INSERT INTO orders (cents) VALUES (?)", cents)
	if err != nil {
		return 0, fmt.Errorf("order of %d cents: %w", cents, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	if _, err := a.Client.EnqueueTx(ctx, tx, Invoice{OrderID: id, Cents: cents}, nil); err != nil {
		return 0, err
	}
	return id, nil
}
