// Package mysqldb is conveyor's MySQL and MariaDB driver, on the
// application's go-sql-driver/mysql configuration:
//
//	cfg, err := mysql.ParseDSN("app:pw@tcp(db:3306)/app?parseTime=true")
//	...
//	client, err := conveyor.New(ctx, mysqldb.New(cfg, nil), &conveyor.Config{...})
//
// MySQL session settings are per connection, and conveyor relies on its
// own (UTC times, READ COMMITTED, a strict sql_mode, found-rows counts,
// utf8mb4), so conveyor opens connections of its own from a copy of the
// configuration, with those settings, rather than borrowing the
// application's *sql.DB: Options.PoolSize of them (default 16) plus two
// for the lease path (heartbeats and acknowledgements). Client.EnqueueTx
// takes a *sql.Tx of the application's handle on the same database: the
// jobs appear when it commits (every time conveyor writes is computed
// with UTC_TIMESTAMP, whatever the session's time zone; give EnqueueOpts
// RunAt times, which the application's handle sends in its Loc, only if
// that Loc is UTC).
package mysqldb

import (
	"context"
	"database/sql"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor/internal/backend/mysql"
	"github.com/conveyorq/conveyor/internal/driver"
)

// Options are the MySQL driver's own settings. The zero value is usable.
type Options struct {
	// ClaimStrategy is "" (choose from the server version: SKIP LOCKED on
	// MySQL 8.0.1+ and MariaDB 10.6+, else optimistic), "skip-locked" or
	// "optimistic".
	ClaimStrategy string
	// PoolSize caps conveyor's connections besides the lease path's two.
	// Default 16.
	PoolSize int
}

// Driver is a conveyor.Driver on an application's MySQL configuration.
type Driver struct {
	cfg  *gomysql.Config
	opts Options
}

// New returns a driver on a copy of cfg, for conveyor.New. opts may be
// nil.
func New(cfg *gomysql.Config, opts *Options) *Driver {
	d := &Driver{}
	if cfg != nil {
		d.cfg = cfg.Clone()
	}
	if opts != nil {
		d.opts = *opts
	}
	return d
}

// UnwrapTx is called by Client.EnqueueTx; applications do not call it.
func (d *Driver) UnwrapTx(tx *sql.Tx) any { return tx }

// Bind is called by conveyor.New; applications do not call it.
func (d *Driver) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	opts.ClaimStrategy, opts.PoolSize = d.opts.ClaimStrategy, d.opts.PoolSize
	drv, err := mysql.New(ctx, d.cfg, opts)
	if err != nil {
		return nil, err
	}
	return drv, nil
}
