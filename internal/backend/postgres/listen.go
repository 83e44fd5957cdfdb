package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Listener backoff between reconnect attempts.
const (
	listenMinBackoff  = 50 * time.Millisecond
	listenMaxBackoff  = 5 * time.Second
	listenPingTimeout = 5 * time.Second
)

// listenPingInterval is how long a listener waits in silence before it
// pings the server to detect a dead connection (a variable for tests).
var listenPingInterval = 30 * time.Second

// errListenerClosed is returned by Wait after Close.
var errListenerClosed = errors.New("conveyor/postgres: listen: listener closed")

// listener holds a dedicated connection (outside the pool) that LISTENs on
// "<prefix>wake". It runs no goroutine of its own: Wait drives the
// connection, and Close interrupts a pending Wait through a context.
type listener struct {
	d *Driver

	closing context.Context // cancelled by Close
	cancel  context.CancelFunc

	mu     sync.Mutex // held by Wait; guards conn, gen and closed
	conn   *pgx.Conn
	gen    uint64 // the driver's drop generation when conn was made
	closed bool
}

// Listen opens a dedicated connection and subscribes to this prefix's wake
// channel, on which every notification's payload is a queue name.
func (d *Driver) Listen(ctx context.Context) (driver.Listener, error) {
	gen, _ := d.generation()
	conn, err := d.listenConn(ctx)
	if err != nil {
		return nil, d.wrap("listen", err)
	}
	closing, cancel := context.WithCancel(context.Background())
	return &listener{d: d, closing: closing, cancel: cancel, conn: conn, gen: gen}, nil
}

// listenConn connects outside the pool and issues LISTEN.
func (d *Driver) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, d.connConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, d.q.Listen); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// closeConn closes a connection without waiting long for the server.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Wait returns the queue named by the next notification. When the
// connection was lost it reconnects (with backoff, until ctx ends) and
// then returns ("", nil) once so that the caller refetches whatever it may
// have missed meanwhile.
func (l *listener) Wait(ctx context.Context) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", errListenerClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.closing, cancel)
	defer stop()

	for {
		if l.conn == nil {
			if err := l.reconnect(ctx); err != nil {
				return "", l.ctxErr(ctx, err)
			}
			// Notifications may have been missed meanwhile.
			l.d.seg.hints.wakeAll()
			return "", nil
		}
		gen, changed := l.d.generation()
		if gen != l.gen {
			// The driver dropped its connections to a server that is gone
			// or read-only (see dropServer) since this one was made: it may
			// be to that server, which sends no more notifications.
			closeConn(l.conn)
			l.conn = nil
			continue
		}
		waitCtx, waitCancel := context.WithTimeout(ctx, listenPingInterval)
		stopChanged := context.AfterFunc(changed, waitCancel)
		n, err := l.conn.WaitForNotification(waitCtx)
		stopChanged()
		waitCancel()
		if err == nil {
			if n.Payload == segNotice {
				l.d.segmentsChanged()
				continue
			}
			// Jobs became available in the queue: its claim hint starts
			// over (see claimHints).
			l.d.seg.hints.wake(n.Payload)
			return n.Payload, nil
		}
		if ctx.Err() != nil {
			if l.conn.IsClosed() {
				l.conn = nil
			}
			return "", l.ctxErr(ctx, ctx.Err())
		}
		if changed.Err() != nil {
			continue // dropped: reconnect above
		}
		if !l.conn.IsClosed() && waitCtx.Err() != nil {
			// Quiet for a while: make sure the connection is alive, since a
			// half-open TCP connection would otherwise wait forever.
			pingCtx, pingCancel := context.WithTimeout(ctx, listenPingTimeout)
			err = l.conn.Ping(pingCtx)
			pingCancel()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return "", l.ctxErr(ctx, ctx.Err())
			}
		}
		// The connection failed: drop it (and, if its server is gone or
		// read-only, every connection of the driver) and reconnect.
		l.d.noticeLost(err)
		closeConn(l.conn)
		l.conn = nil
	}
}

// ctxErr reports a closed listener as such rather than as a cancellation.
func (l *listener) ctxErr(ctx context.Context, err error) error {
	if l.closing.Err() != nil {
		return errListenerClosed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return l.d.wrap("listen", err)
}

// reconnect dials until it succeeds or ctx ends, backing off
// exponentially with jitter.
func (l *listener) reconnect(ctx context.Context) error {
	backoff := listenMinBackoff
	for {
		gen, _ := l.d.generation()
		conn, err := l.d.listenConn(ctx)
		if err == nil {
			l.conn, l.gen = conn, gen
			l.d.listenReconnects.Add(1)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, listenMaxBackoff)
	}
}

// Close interrupts a pending Wait, then closes the connection. It is safe
// to call more than once.
func (l *listener) Close() error {
	l.cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.conn != nil {
		closeConn(l.conn)
		l.conn = nil
	}
	return nil
}
