// Package sqlitetest opens a test's own SQLite database with a conveyor
// client on it, for package conveyortest's helpers:
//
//	db := sqlitetest.Open(t, nil) // a fresh, migrated file in t.TempDir()
//	conveyortest.RequireEnqueued[Invoice](t, db.Client, nil)
//
// It is a package of its own so that an application on PostgreSQL or
// MySQL, whose tests use conveyortest on their own database, does not
// link SQLite into its test binaries.
package sqlitetest

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/driver/sqlitedb"
)

// DB is a conveyor client on a test's own SQLite database, with the
// handle it runs on.
type DB struct {
	// Client is migrated and has no workers yet; it is closed when the
	// test ends (stopped first if the test started it).
	Client *conveyor.Client[*sql.Tx]
	// DB is the application's handle on the file (WAL, busy timeout 5s,
	// write transactions that begin IMMEDIATE), for the test's own tables
	// and transactions; it is closed after the client.
	DB *sql.DB
	// Driver is conveyor's driver on DB; begin write transactions that
	// enqueue with Driver.BeginTx (see package driver/sqlitedb).
	Driver *sqlitedb.Driver
}

// Open opens a fresh SQLite database in t.TempDir(), a client on it
// with cfg (nil takes the defaults) and migrates it; everything is closed
// when the test ends. It fails t on any error.
func Open(t testing.TB, cfg *conveyor.Config) *DB {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "conveyor.db")
	u := url.URL{Scheme: "file", OmitHost: true, Path: path, RawQuery: "_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		t.Fatalf("sqlitetest: opening %s: %v", path, err)
	}
	drv := sqlitedb.New(db)
	c, err := conveyor.New(ctx, drv, cfg)
	if err != nil {
		db.Close()
		t.Fatalf("sqlitetest: conveyor on %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("sqlitetest: closing the client: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("sqlitetest: closing the database: %v", err)
		}
	})
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatalf("sqlitetest: migrating %s: %v", path, err)
	}
	return &DB{Client: c, DB: db, Driver: drv}
}
