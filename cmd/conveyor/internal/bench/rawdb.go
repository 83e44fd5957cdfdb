package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
)

// backendOf names the backend a DSN selects, as connect.Open does (the
// scheme itself for one conveyor does not know).
func backendOf(s string) string {
	b, err := connect.Backend(s)
	if err != nil {
		scheme, _, _ := strings.Cut(s, "://")
		return scheme
	}
	return b
}

// openRaw opens a database/sql pool of up to conns connections of the
// bench's own, at the server's default settings (so that the classic
// claims run as an application would run them), for SQL outside
// conveyor. On SQLite transactions begin IMMEDIATE (the pessimistic lock
// SQLite has instead of FOR UPDATE) and the journal and synchronous modes
// are conveyor's: WAL, and sync (NORMAL by default).
func openRaw(ctx context.Context, dsn string, conns int, sync string) (*sql.DB, string, error) {
	backend := backendOf(dsn)
	var db *sql.DB
	switch backend {
	case "postgres":
		cfg, err := pgSideConfig(dsn)
		if err != nil {
			return nil, backend, err
		}
		cfg.RuntimeParams["application_name"] = "conveyor-bench"
		db = stdlib.OpenDB(*cfg)
	case "mysql":
		cfg, err := mysqlConfig(dsn)
		if err != nil {
			return nil, backend, err
		}
		// Client-side parameters, as ORMs send them: one round trip per
		// statement.
		cfg.InterpolateParams = true
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			return nil, backend, err
		}
		db = sql.OpenDB(conn)
	case "sqlite":
		if sync == "" {
			sync = "NORMAL"
		}
		var err error
		db, err = sql.Open("sqlite", sqliteDSN(dsn,
			"_pragma=busy_timeout(10000)", "_pragma=journal_mode(WAL)",
			"_pragma=synchronous("+url.QueryEscape(sync)+")", "_txlock=immediate"))
		if err != nil {
			return nil, backend, err
		}
	default:
		return nil, backend, fmt.Errorf("bench: unsupported DSN scheme %q", backend)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, backend, err
	}
	return db, backend, nil
}

// sqliteDSN turns conveyor's SQLite DSN (a path, sqlite:path,
// sqlite://path or a file: URI) into a modernc.org/sqlite DSN with params
// appended.
func sqliteDSN(dsn string, params ...string) string {
	switch {
	case strings.HasPrefix(dsn, "sqlite://"):
		dsn = dsn[len("sqlite://"):]
	case strings.HasPrefix(dsn, "sqlite:"):
		dsn = dsn[len("sqlite:"):]
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + strings.Join(params, "&")
}

// mysqlConfig is the MySQL backend's URL conversion (lab.MySQLConfig)
// with times parsed in UTC; session settings stay at the server's
// defaults.
func mysqlConfig(dsn string) (*gomysql.Config, error) {
	cfg, err := lab.MySQLConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return cfg, nil
}

// errKind classifies a database error for the contention counts.
type errKind int

const (
	errOther         errKind = iota
	errDeadlock              // PostgreSQL 40P01, MySQL 1213
	errLockTimeout           // PostgreSQL 55P03, MySQL 1205
	errBusy                  // SQLite SQLITE_BUSY / SQLITE_LOCKED
	errSerialization         // PostgreSQL 40001
)

func classify(err error) errKind {
	var pe *pgconn.PgError
	var me *gomysql.MySQLError
	var se *sqlite.Error
	switch {
	case err == nil:
		return errOther
	case errors.As(err, &pe):
		switch pe.Code {
		case "40P01":
			return errDeadlock
		case "55P03":
			return errLockTimeout
		case "40001":
			return errSerialization
		}
	case errors.As(err, &me):
		switch me.Number {
		case 1213:
			return errDeadlock
		case 1205:
			return errLockTimeout
		}
	case errors.As(err, &se):
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return errBusy
		}
	}
	return errOther
}

// rawSettings reads the server version and the settings that decide a
// raw-SQL run: durability and the session's isolation and lock waits.
func rawSettings(ctx context.Context, db *sql.DB, backend string) map[string]string {
	s := map[string]string{"backend": backend}
	one := func(key, q string) {
		var v sql.NullString
		if err := db.QueryRowContext(ctx, q).Scan(&v); err == nil {
			s[key] = v.String
		}
	}
	switch backend {
	case "postgres":
		one("server_version", "SHOW server_version")
		one("synchronous_commit", "SHOW synchronous_commit")
		one("fsync", "SHOW fsync")
		one("raw_isolation", "SHOW transaction_isolation")
		one("raw_lock_timeout", "SHOW lock_timeout")
		one("deadlock_timeout", "SHOW deadlock_timeout")
	case "mysql":
		one("server_version", "SELECT @@version")
		one("innodb_flush_log_at_trx_commit", "SELECT @@innodb_flush_log_at_trx_commit")
		one("sync_binlog", "SELECT @@sync_binlog")
		if one("raw_isolation", "SELECT @@transaction_isolation"); s["raw_isolation"] == "" {
			one("raw_isolation", "SELECT @@tx_isolation")
		}
		one("raw_lock_wait_timeout", "SELECT @@innodb_lock_wait_timeout")
	case "sqlite":
		one("server_version", "SELECT sqlite_version()")
		one("journal_mode", "PRAGMA journal_mode")
		var n sql.NullInt64
		if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n); err == nil {
			s["synchronous"] = map[int64]string{0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[n.Int64]
		}
		one("raw_busy_timeout_ms", "PRAGMA busy_timeout")
		s["raw_isolation"] = "BEGIN IMMEDIATE"
	}
	return s
}
