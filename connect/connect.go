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
	"errors"
	"fmt"
	"net/url"
	"time"

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
// (or mariadb://). A postgres:// DSN that goes through PgBouncer in
// transaction pooling names a direct connection to PostgreSQL, for the
// listener and the segment registry's reader, in its conveyor_direct_dsn
// parameter (a URL-encoded postgres:// URL); without one there the client
// polls. Open refuses a
// database whose schema is newer than
// this binary; one that lacks migrations can be migrated with
// Client.Migrate. The client's EnqueueTx takes a pgx.Tx or *sql.Tx on
// PostgreSQL and a *sql.Tx elsewhere, checked when it is called.
func Open(ctx context.Context, dsnStr string, cfg *conveyor.Config) (*conveyor.Client[any], error) {
	return OpenWith(ctx, dsnStr, cfg, Options{})
}

// Options are the settings of the connections Open opens, which belong
// to one backend each and not to the shared conveyor.Config. The zero
// value takes every default.
type Options struct {
	// PoolSize caps the connections of the pool conveyor opens: on
	// PostgreSQL and MySQL the pool for claims, inserts and admin calls
	// (default max(8, 4*GOMAXPROCS) on PostgreSQL, 16 on MySQL), on
	// SQLite the read pool (default 4; writes always use one connection).
	// The lease path's own two connections come on top.
	PoolSize int
	// ClaimStrategy selects the MySQL/MariaDB claim: "" (from the server
	// version: SKIP LOCKED where it is safe), "skip-locked" or
	// "optimistic". Refused on other backends.
	ClaimStrategy string
	// SQLiteSynchronous is SQLite's synchronous mode: "NORMAL" (durable
	// against a process crash; the default) or "FULL" (also against
	// power loss). Refused on other backends.
	SQLiteSynchronous string
	// ConnectTimeout bounds opening a PostgreSQL or MySQL client: reaching
	// the server, its handshake and the statements Open runs to probe it
	// and check the schema. A server that accepts connections but never
	// answers (a wrong port, a firewall that drops packets, a server hung
	// in recovery) then fails Open after ConnectTimeout instead of hanging
	// it. Default DefaultConnectTimeout; negative for no bound. SQLite
	// opens a local file and is not bounded.
	ConnectTimeout time.Duration
}

// DefaultConnectTimeout is the default of Options.ConnectTimeout.
const DefaultConnectTimeout = 10 * time.Second

// OpenWith is Open with the connections' Options.
func OpenWith(ctx context.Context, dsnStr string, cfg *conveyor.Config, opts Options) (*conveyor.Client[any], error) {
	b, err := dsn.Backend(dsnStr)
	if err != nil {
		return nil, err
	}
	if opts.ClaimStrategy != "" && b != dsn.MySQL {
		return nil, fmt.Errorf("conveyor: connect: ClaimStrategy %q is a MySQL/MariaDB setting; this DSN is %s", opts.ClaimStrategy, b)
	}
	if opts.SQLiteSynchronous != "" && b != dsn.SQLite {
		return nil, fmt.Errorf("conveyor: connect: SQLiteSynchronous %q is a SQLite setting; this DSN is %s", opts.SQLiteSynchronous, b)
	}
	octx, timeout := ctx, opts.ConnectTimeout
	if timeout == 0 {
		timeout = DefaultConnectTimeout
	}
	if b != dsn.SQLite && timeout > 0 {
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := conveyor.New(octx, &dsnDriver{backend: b, dsn: dsnStr, opts: opts}, cfg)
	if err != nil {
		if errors.Is(octx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = &timeoutError{backend: b, server: server(dsnStr), timeout: timeout, err: err}
		}
		return nil, dsn.RedactError(err, dsnStr)
	}
	return c, nil
}

// timeoutError is an Open that ConnectTimeout cut off.
type timeoutError struct {
	backend, server string
	timeout         time.Duration
	err             error
}

// Error names the server and the timeout, not the connection attempt's
// own error (a "context deadline exceeded" at some step of it).
func (e *timeoutError) Error() string {
	return fmt.Sprintf("conveyor/%s: open: %s did not answer within %v (connect timeout)", e.backend, e.server, e.timeout)
}

// Unwrap returns the connection attempt's error.
func (e *timeoutError) Unwrap() error { return e.err }

// Is reports the error as context.DeadlineExceeded, whatever step of the
// connection attempt the deadline cut.
func (e *timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// server returns the host:port a network DSN names, or "the server" when
// it cannot tell.
func server(dsnStr string) string {
	if u, err := url.Parse(dsnStr); err == nil && u.Host != "" {
		return u.Host
	}
	return "the server"
}

// dsnDriver opens the backend's own connections from a DSN.
type dsnDriver struct {
	backend, dsn string
	opts         Options
}

// Bind opens the backend named by the DSN.
func (d *dsnDriver) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	opts.PoolSize, opts.ClaimStrategy, opts.Synchronous = d.opts.PoolSize, d.opts.ClaimStrategy, d.opts.SQLiteSynchronous
	switch d.backend {
	case dsn.Postgres:
		return nilIfErr(postgres.Open(ctx, d.dsn, opts))
	case dsn.MySQL:
		return nilIfErr(mysql.Open(ctx, d.dsn, opts))
	default:
		return nilIfErr(sqlite.Open(ctx, d.dsn, opts))
	}
}

// UnwrapTx passes the transaction on: the backend checks its type.
func (d *dsnDriver) UnwrapTx(tx any) any { return tx }

// nilIfErr keeps a failed backend's nil pointer out of the interface.
func nilIfErr[D driver.Driver](d D, err error) (driver.Driver, error) {
	if err != nil {
		return nil, err
	}
	return d, nil
}
