package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A primary that is switched over or fails (Patroni, or any address that
// follows the primary) leaves the driver's connections on a server that
// is gone or no longer writable: the server closes them (57P01
// admin_shutdown, a lost connection), or, where a connection outlives a
// demotion, every write on it fails with 25006 read_only_sql_transaction
// for as long as it stays open. Pooled connections are only found dead
// one failed statement at a time, and one to a read-only server never.
//
// So the first error that says the server is gone or read-only (see
// serverGone) drops every connection the driver holds to it at once
// (dropServer): the lease and registry pools and the application's pool
// are reset (pgxpool.Pool.Reset: idle connections close now, those in use
// when released), the listener reconnects (and then wakes every fetcher,
// which claims what it may have missed), the cached registry view is read
// again and every claim hint starts over. New connections go to whichever
// server is the primary by then: a multi-host DSN should name
// target_session_attrs=read-write, which the driver sets itself on the
// connections it makes when the DSN names several hosts and no
// target_session_attrs when Open makes the pool, and on the direct
// connection's (see readWriteFallbacks). The connections conveyor makes,
// the direct ones included, also close at once on a read-only error
// (closeOnReadOnly).
//
// Nothing else is cached per server: the tables, the registry, the leader
// row and the fences live in the database and replicate with it.

// dropEvery bounds how often dropServer resets the pools: the errors of
// one failover arrive together, and a reset destroys connections already
// made to the new primary too.
const dropEvery = time.Second

// serverGone reports whether err says that the connection's server is
// gone, going, not accepting connections, or read-only: its connections
// are of no further use to a writer.
func serverGone(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "25006", // read_only_sql_transaction: a standby, or a demoted primary
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now (starting up, shutting down, in recovery)
			return true
		}
		return len(pe.Code) == 5 && pe.Code[:2] == "08" // connection_exception
	}
	var ce *pgconn.ConnectError
	var oe *net.OpError
	switch {
	case errors.As(err, &ce), errors.As(err, &oe),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

// failover is the driver's state for dropServer.
type failover struct {
	mu      sync.Mutex
	last    time.Time          // the last reset of the pools
	gen     uint64             // bumped by each drop
	changed context.Context    // cancelled at the next drop
	cancel  context.CancelFunc // cancels changed
}

// generation returns the current drop generation and a context cancelled
// at the next drop.
func (d *Driver) generation() (uint64, context.Context) {
	f := &d.fo
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed, f.cancel = context.WithCancel(context.Background())
	}
	return f.gen, f.changed
}

// noticeLost drops the driver's connections when err says their server is
// gone or read-only (see serverGone), and returns err.
func (d *Driver) noticeLost(err error) error {
	if serverGone(err) {
		d.dropServer()
	}
	return err
}

// dropServer resets the driver's pools, at most once per dropEvery, and
// has the listener reconnect and the next statements read the registry
// anew.
func (d *Driver) dropServer() {
	f := &d.fo
	f.mu.Lock()
	if !f.last.IsZero() && time.Since(f.last) < dropEvery {
		f.mu.Unlock()
		return
	}
	f.last = time.Now()
	f.gen++
	if f.cancel != nil {
		f.cancel()
	}
	f.changed, f.cancel = context.WithCancel(context.Background())
	f.mu.Unlock()

	d.serverDrops.Add(1)
	d.pool.Reset()
	d.lease.Reset()
	if reg := d.seg.regIfOpen(); reg != nil {
		reg.Reset()
	}
	d.seg.invalidate()
	d.seg.hints.wakeAll()
}

// closeOnReadOnly makes a connection of cfg close itself on a read-only
// error (as it does on a FATAL one through prev, the handler it had), so
// that the pool destroys it rather than hand it out again.
func closeOnReadOnly(prev pgconn.PgErrorHandler, cfg *pgconn.Config) {
	cfg.OnPgError = func(c *pgconn.PgConn, pe *pgconn.PgError) bool {
		if pe.Code == "25006" {
			return false
		}
		if prev != nil {
			return prev(c, pe)
		}
		return pe.Severity != "FATAL"
	}
}

// readWriteFallbacks has a configuration that names several hosts and no
// target_session_attrs connect to a writable one only
// (target_session_attrs=read-write): a job queue writes on every
// statement, and a connection to a standby is of no use to it.
// Open applies it to a DSN that does not name target_session_attrs (and
// with no PGTARGETSESSIONATTRS in the environment), and to its direct DSN
// (DirectDSNParam); a pool given to New is the application's, and its
// configuration stands, but New applies it (with dsn "") to the direct
// configuration it is given.
func readWriteFallbacks(dsn string, cfg *pgconn.Config) {
	if len(cfg.Fallbacks) == 0 || cfg.ValidateConnect != nil ||
		strings.Contains(dsn, "target_session_attrs") || os.Getenv("PGTARGETSESSIONATTRS") != "" {
		return
	}
	cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
}
