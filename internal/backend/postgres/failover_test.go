package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestReadOnlyServerDropsConnections: connections made while the server
// was read-only (a standby, a demoted primary) stay read-only for as long
// as they are open; the first write that fails with 25006 drops every
// pooled connection, the application's pool's included, so that writes go
// on once the server accepts them, without a restart.
func TestReadOnlyServerDropsConnections(t *testing.T) {
	ctx := context.Background()
	var readOnly atomic.Bool
	cfg, err := pgxpool.ParseConfig(testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 2, 0
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if readOnly.Load() {
			_, err := c.Exec(ctx, "SET default_transaction_read_only = on")
			return err
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(ctx, pool, nil, driver.Options{Prefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.DropAll(ctx)
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("ro")}); err != nil {
		t.Fatal(err)
	}

	// The server "becomes read-only": every connection made now is.
	readOnly.Store(true)
	pool.Reset()
	d.lease.Reset()
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("ro")}); pgCode(err) != "25006" || !driver.IsNotCommitted(err) {
		t.Fatalf("insert on a read-only server: %v; want 25006, not committed", err)
	}
	if d.Counters()["server_drops"] != 1 {
		t.Fatalf("counters %v after a read-only error; want one drop", d.Counters())
	}
	// The pool holds read-only connections again (made before the server
	// "comes back"); the next error drops them too once dropEvery passed.
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("ro")}); pgCode(err) != "25006" {
		t.Fatalf("insert: %v; want 25006", err)
	}
	readOnly.Store(false)
	time.Sleep(dropEvery)
	// Idle read-only connections are in the pool: one more write fails and
	// drops them, and the writes after it succeed on new connections.
	var ok, failed int
	for i := 0; i < 10 && ok < 3; i++ {
		if _, err := d.Insert(ctx, []driver.InsertParams{pj("ro")}); err != nil {
			if pgCode(err) != "25006" {
				t.Fatal(err)
			}
			failed++
			time.Sleep(dropEvery)
			continue
		}
		ok++
	}
	if ok < 3 || failed > 1 {
		t.Fatalf("after the server accepts writes again: %d inserts succeeded, %d failed; want the read-only connections dropped after one failure", ok, failed)
	}
	// The lease path too: completing a claimed job.
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "ro", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
}

// TestServerGone tells the errors of a server that is gone or read-only
// from the others.
func TestServerGone(t *testing.T) {
	for _, c := range []struct {
		err  error
		gone bool
	}{
		{&pgconn.PgError{Code: "25006"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), true},
		{&pgconn.PgError{Code: "40P01"}, false},
		{&pgconn.PgError{Code: "23505"}, false},
		{context.Canceled, false},
		{errors.New("other"), false},
		{nil, false},
	} {
		if got := serverGone(c.err); got != c.gone {
			t.Errorf("serverGone(%v) = %v, want %v", c.err, got, c.gone)
		}
	}
}

// TestDropServerReconnectsListener: once the driver drops its
// connections (a statement found the server gone or read-only), a
// listener blocked on its old connection, which may be to that server,
// reconnects, reports "" so that the caller claims what it may have
// missed, and is subscribed again.
func TestDropServerReconnectsListener(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	li, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer li.Close()
	l := li.(*listener)
	pid := l.conn.PgConn().PID()
	type result struct {
		q   string
		err error
	}
	got := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		q, err := l.Wait(wctx)
		got <- result{q, err}
	}()
	time.Sleep(100 * time.Millisecond) // let Wait block on the connection
	d.dropServer()
	r := <-got
	if r.err != nil || r.q != "" {
		t.Fatalf("wait after a drop: %q %v; want \"\" nil (a reconnect)", r.q, r.err)
	}
	if l.conn.PgConn().PID() == pid {
		t.Fatal("the listener kept its connection after the drop")
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("afterdrop")}); err != nil {
		t.Fatal(err)
	}
	if q := collect(t, l, 300*time.Millisecond); fmt.Sprint(q) != "[afterdrop]" {
		t.Fatalf("after the drop %v", q)
	}
}
