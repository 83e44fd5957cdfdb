// Package connect opens a conveyor client from a DSN, the convenience the
// command and quick starts use:
//
//	client, err := connect.Open(ctx, "./conveyor.db", nil)
//
// It links every backend (PostgreSQL, MySQL/MariaDB and SQLite). An
// application that already has a handle to its database builds a driver
// from it instead (driver/pgxv5, driver/sqlitedb, driver/mysqldb) and
// calls conveyor.New, and links only that backend.
package connect

import (
	"context"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/backend/mysql"
	"github.com/conveyorq/conveyor/internal/backend/postgres"
	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/dsn"
)

// Open connects to the database named by dsnStr and returns a client on
// connections of its own, which Client.Close closes. The DSN is a SQLite
// path ("./conveyor.db", "sqlite:jobs.db", "file:jobs.db?..."),
// "postgres://..." (or postgresql://) or "mysql://user:pass@host:port/db"
// (or mariadb://). Config.PoolSize sizes the pool, Config.ClaimStrategy
// and Config.SQLiteSynchronous apply to their backends. Open refuses a
// database whose schema is newer than this binary; one that lacks
// migrations can be migrated with Client.Migrate.
func Open(ctx context.Context, dsnStr string, cfg *conveyor.Config) (*conveyor.Client, error) {
	b, err := dsn.Backend(dsnStr)
	if err != nil {
		return nil, err
	}
	return conveyor.New(ctx, &dsnDriver{backend: b, dsn: dsnStr}, cfg)
}

// dsnDriver opens the backend's own connections from a DSN.
type dsnDriver struct {
	backend, dsn string
}

// Bind opens the backend named by the DSN.
func (d *dsnDriver) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	switch d.backend {
	case dsn.Postgres:
		return nilIfErr(postgres.Open(ctx, d.dsn, opts))
	case dsn.MySQL:
		return nilIfErr(mysql.Open(ctx, d.dsn, opts))
	default:
		return nilIfErr(sqlite.Open(ctx, d.dsn, opts))
	}
}

// nilIfErr keeps a failed backend's nil pointer out of the interface.
func nilIfErr[D driver.Driver](d D, err error) (driver.Driver, error) {
	if err != nil {
		return nil, err
	}
	return d, nil
}
