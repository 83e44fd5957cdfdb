package conveyortest

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/driver/sqlitedb"
)

// SQLite is a conveyor client on a test's own SQLite database, with the
// handle it runs on.
type SQLite struct {
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

// OpenSQLite opens a fresh SQLite database in t.TempDir(), a client on it
// with cfg (nil takes the defaults) and migrates it; everything is closed
// when the test ends. It fails t on any error.
func OpenSQLite(t testing.TB, cfg *conveyor.Config) *SQLite {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "conveyor.db")
	u := url.URL{Scheme: "file", OmitHost: true, Path: path, RawQuery: "_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		t.Fatalf("conveyortest: opening %s: %v", path, err)
	}
	drv := sqlitedb.New(db)
	c, err := conveyor.New(ctx, drv, cfg)
	if err != nil {
		db.Close()
		t.Fatalf("conveyortest: conveyor on %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("conveyortest: closing the client: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("conveyortest: closing the database: %v", err)
		}
	})
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatalf("conveyortest: migrating %s: %v", path, err)
	}
	return &SQLite{Client: c, DB: db, Driver: drv}
}
