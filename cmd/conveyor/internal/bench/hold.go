package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// HoldFigures describe the transaction a steady run held open (--hold-xmin).
type HoldFigures struct {
	// Statement is what opened the transaction.
	Statement string `json:"statement"`
	// Tables are the tables read in it (SELECT count(*) each, as pg_dump
	// reads the tables it dumps), and Rows the rows counted.
	Tables []string `json:"tables"`
	Rows   int64    `json:"rows"`
	// StartS and EndS are when it was opened (after its reads) and
	// ended, in seconds since the load began.
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
	// Session is the held session's application_name (PostgreSQL), to
	// find it in pg_stat_activity.
	Session string `json:"session,omitempty"`
	// Thread is the held connection's CONNECTION_ID() (MySQL), to find
	// its transaction in information_schema.innodb_trx
	// (trx_mysql_thread_id).
	Thread int64 `json:"thread,omitempty"`
	// Released: it was rolled back (or its connection closed, which ends
	// it on the server).
	Released bool `json:"released"`
	// ReleaseError is the rollback's or close's error, if any.
	ReleaseError string `json:"release_error,omitempty"`
}

// holdAppName begins the PostgreSQL application_name of the held session
// (followed by the run's prefix).
const holdAppName = "conveyor-bench-hold"

// heldTx is a read transaction held open on a connection of its own. It
// only reads; release ends it, once, and is safe to call from any
// goroutine and on every exit path.
type heldTx struct {
	fig    HoldFigures
	t0     time.Time
	once   sync.Once
	mu     sync.Mutex
	end    func(context.Context) error // rollback and close
	opened time.Time                   // when the reads were done
	// count counts a table's rows in the transaction (see recount), and
	// tables are the tables read when it began.
	count  func(ctx context.Context, table string) (int64, error)
	tables []string
}

// start sets the moment the figures count from (the load's start).
func (h *heldTx) start(t0 time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.t0 = t0
	h.fig.StartS = h.opened.Sub(t0).Seconds()
}

// holdSnapshot opens a connection to dsn, begins the transaction that
// keeps a snapshot (PostgreSQL REPEATABLE READ, MySQL WITH CONSISTENT
// SNAPSHOT, SQLite a deferred BEGIN), counts the rows of each of the
// prefix's tables in it, and returns it held. safety is how long the
// server may let it sit idle before ending it itself, should the bench
// be stopped in a way that skips release (PostgreSQL
// idle_in_transaction_session_timeout, MariaDB idle_transaction_timeout).
func holdSnapshot(ctx context.Context, dsn, backend, prefix string, safety time.Duration) (h *heldTx, err error) {
	// held, not h: a "return nil, err" sets h to nil before this runs,
	// and the connection opened so far must still be closed.
	held := &heldTx{t0: time.Now()}
	h = held
	defer func() {
		if err != nil {
			held.release()
			h = nil
		}
	}()
	var query func(ctx context.Context, q string) (int64, error)
	var exec func(ctx context.Context, q string) error
	begin := ""
	var list func(ctx context.Context, q string, arg string) ([]string, error)
	quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	switch backend {
	case "postgres":
		cfg, err := pgSideConfig(dsn)
		if err != nil {
			return nil, err
		}
		h.fig.Session = holdAppName + " " + prefix
		cfg.RuntimeParams["application_name"] = h.fig.Session
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		h.end = func(ctx context.Context) error {
			_, rerr := conn.Exec(ctx, "ROLLBACK")
			return errors.Join(rerr, conn.Close(ctx))
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", safety.Milliseconds())); err != nil {
			return nil, err
		}
		list = func(ctx context.Context, q, arg string) ([]string, error) {
			rows, _ := conn.Query(ctx, q, arg)
			return pgx.CollectRows(rows, pgx.RowTo[string])
		}
		query = func(ctx context.Context, q string) (n int64, err error) {
			return n, conn.QueryRow(ctx, q).Scan(&n)
		}
		exec = func(ctx context.Context, q string) error { _, err := conn.Exec(ctx, q); return err }
		begin = "BEGIN ISOLATION LEVEL REPEATABLE READ"
		h.fig.Statement = begin
	case "mysql", "sqlite":
		var db *sql.DB
		if backend == "mysql" {
			cfg, err := mysqlConfig(dsn)
			if err != nil {
				return nil, err
			}
			c, err := gomysql.NewConnector(cfg)
			if err != nil {
				return nil, err
			}
			db = sql.OpenDB(c)
			quote = func(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
			begin = "START TRANSACTION WITH CONSISTENT SNAPSHOT"
			h.fig.Statement = begin
		} else {
			if db, err = sql.Open("sqlite", sqliteDSN(dsn, "_pragma=busy_timeout(10000)")); err != nil {
				return nil, err
			}
			begin = "BEGIN"
			h.fig.Statement = "BEGIN (deferred: the read transaction starts at the first read)"
		}
		db.SetMaxOpenConns(1)
		conn, err := db.Conn(ctx)
		if err != nil {
			db.Close()
			return nil, err
		}
		h.end = func(ctx context.Context) error {
			_, rerr := conn.ExecContext(ctx, "ROLLBACK")
			return errors.Join(rerr, conn.Close(), db.Close())
		}
		if backend == "mysql" {
			// MariaDB only (MySQL has no such variable): a safety net.
			_, _ = conn.ExecContext(ctx, fmt.Sprintf("SET SESSION idle_transaction_timeout = %d", int(safety.Seconds())))
			if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&h.fig.Thread); err != nil {
				return nil, err
			}
		}
		exec = func(ctx context.Context, q string) error { _, err := conn.ExecContext(ctx, q); return err }
		list = func(ctx context.Context, q, arg string) ([]string, error) {
			rows, err := conn.QueryContext(ctx, q, arg)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					return nil, err
				}
				out = append(out, s)
			}
			return out, rows.Err()
		}
		query = func(ctx context.Context, q string) (n int64, err error) {
			return n, conn.QueryRowContext(ctx, q).Scan(&n)
		}
	default:
		return nil, fmt.Errorf("bench: --hold-xmin: unsupported backend %q", backend)
	}
	// The tables are listed before the transaction begins: on SQLite a
	// read of sqlite_master would start it.
	tables, err := prefixTables(ctx, list, backend, prefix)
	if err != nil {
		return nil, err
	}
	if len(tables) == 0 {
		return nil, fmt.Errorf("bench: --hold-xmin: no tables under prefix %q", prefix)
	}
	if err := exec(ctx, begin); err != nil {
		return nil, err
	}
	h.count = func(ctx context.Context, t string) (int64, error) {
		return query(ctx, "SELECT count(*) FROM "+quote(t))
	}
	h.tables = tables
	for _, t := range tables {
		n, err := h.count(ctx, t)
		if err != nil {
			return nil, err
		}
		h.fig.Rows += n
		h.fig.Tables = append(h.fig.Tables, strings.TrimPrefix(t, prefix))
	}
	h.opened = time.Now()
	return h, nil
}

// recount counts the rows of the tables read when the transaction began
// again, in it: while it keeps its snapshot, as many as then (fig.Rows),
// whatever was written since. It fails once the transaction is released.
func (h *heldTx) recount(ctx context.Context) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fig.Released || h.count == nil {
		return 0, errors.New("bench: the held transaction has ended")
	}
	var rows int64
	for _, t := range h.tables {
		n, err := h.count(ctx, t)
		if err != nil {
			return 0, err
		}
		rows += n
	}
	return rows, nil
}

// release ends the transaction (rollback, then close its connection) the
// first time it is called; later calls do nothing. It does not depend on
// ctx being alive: it is called on every exit path, cancellation
// included.
func (h *heldTx) release() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.end == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := h.end(ctx)
		h.fig.EndS = time.Since(h.t0).Seconds()
		// Closing the connection ends the transaction on the server even
		// when the rollback failed.
		h.fig.Released = true
		if err != nil {
			h.fig.ReleaseError = err.Error()
		}
	})
}

// figures returns the hold's figures (final once released).
func (h *heldTx) figures() *HoldFigures {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.fig
	return &f
}

// Hold is a read transaction held open by HoldSnapshot, for other runs
// than the steady workload's (the torture suite holds one through its
// faults).
type Hold struct{ h *heldTx }

// HoldSnapshot opens the transaction the steady workload's --hold-xmin
// holds (see holdSnapshot) on backend ("postgres", "mysql" or "sqlite")
// after reading every table under prefix.
func HoldSnapshot(ctx context.Context, dsn, backend, prefix string, safety time.Duration) (*Hold, error) {
	h, err := holdSnapshot(ctx, dsn, backend, prefix, safety)
	if err != nil {
		return nil, err
	}
	h.start(h.opened)
	return &Hold{h}, nil
}

// Recount counts the rows of the tables the transaction read when it
// began again, in the transaction, which must still be held: as many as
// then (Figures().Rows) for as long as it keeps its snapshot, however many
// rows were written since.
func (h *Hold) Recount(ctx context.Context) (int64, error) { return h.h.recount(ctx) }

// Figures returns the hold's figures so far (final once released).
func (h *Hold) Figures() *HoldFigures { return h.h.figures() }

// Release ends the transaction (once; later calls do nothing) and
// returns its figures, EndS counted from when it was opened.
func (h *Hold) Release() *HoldFigures {
	h.h.release()
	return h.h.figures()
}
