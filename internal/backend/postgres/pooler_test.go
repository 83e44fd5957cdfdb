package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// TestDriverThroughPgBouncer runs the driver suite through PgBouncer in
// transaction pooling mode, with the exec mode Open picks there.
func TestDriverThroughPgBouncer(t *testing.T) {
	b := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction"})
	dsn := b.DSN("sslmode=disable")
	drivertest.Run(t, testdb.Prefix, func(t *testing.T, prefix string) driver.Driver {
		d, err := Open(context.Background(), dsn, driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if d.pooler != PoolerTransaction {
			t.Fatalf("pooler %v through PgBouncer in transaction mode", d.pooler)
		}
		return d
	})
}

// TestPoolerDetected: Open tells a direct connection, session pooling
// and transaction pooling apart, and adapts to each.
func TestPoolerDetected(t *testing.T) {
	ctx := context.Background()
	direct := testdb.Postgres(t)
	session := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "session"})
	transaction := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction"})
	// One server connection: the probe's second connection takes the
	// one its first released, and the first must not wait for it.
	single := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction", PoolSize: 1})
	for _, c := range []struct {
		name   string
		dsn    string
		pooler Pooler
		mode   pgx.QueryExecMode
		listen bool
	}{
		{"direct", direct, PoolerNone, pgx.QueryExecModeCacheStatement, true},
		{"session", session.DSN("sslmode=disable"), PoolerSession, pgx.QueryExecModeCacheStatement, true},
		{"transaction", transaction.DSN("sslmode=disable"), PoolerTransaction, pgx.QueryExecModeCacheDescribe, false},
		{"transaction-exec", transaction.DSN("sslmode=disable&default_query_exec_mode=exec"), PoolerTransaction, pgx.QueryExecModeExec, false},
		{"transaction-one-server-connection", single.DSN("sslmode=disable"), PoolerTransaction, pgx.QueryExecModeCacheDescribe, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			d, err := Open(ctx, c.dsn, driver.Options{Prefix: testdb.Prefix()})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.pooler != c.pooler {
				t.Fatalf("pooler %v, want %v", d.pooler, c.pooler)
			}
			if m := d.pool.Config().ConnConfig.DefaultQueryExecMode; m != c.mode {
				t.Fatalf("exec mode %v, want %v", m, c.mode)
			}
			caps := d.Capabilities()
			if caps.Listen != c.listen || (caps.NoListen != "") == c.listen {
				t.Fatalf("capabilities %+v, want Listen %v and a reason when false", caps, c.listen)
			}
			// Generic plans on every pooled connection that can keep
			// them: through the session pooler they were set after
			// connecting, since it refuses them as a startup parameter.
			var mode string
			if err := d.pool.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if c.pooler != PoolerTransaction && mode != planGeneric {
				t.Fatalf("plan_cache_mode %q on a pooled connection, want %s", mode, planGeneric)
			}
			info, err := d.ServerInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info["pooler"] != c.pooler.String() {
				t.Fatalf("ServerInfo pooler %q, want %q", info["pooler"], c.pooler)
			}
		})
	}
}

// TestStatementPoolingRefused: statement pooling cannot run conveyor's
// transactions, and Open says so in one line.
func TestStatementPoolingRefused(t *testing.T) {
	b := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "statement"})
	d, err := Open(context.Background(), b.DSN("sslmode=disable"), driver.Options{Prefix: testdb.Prefix()})
	if err == nil {
		d.Close()
		t.Fatal("Open through PgBouncer in statement mode succeeded")
	}
	if !strings.Contains(err.Error(), "statement mode") || !strings.Contains(err.Error(), "pool_mode = transaction or session") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %q does not name statement pooling and the fix in one line", err)
	}
}

// TestPreparedStatementsRefusedBehindTransactionPooler: an application
// pool that prepares named statements (pgx's default) cannot work through
// a transaction pooler; New refuses it, and accepts one that describes
// statements instead.
func TestPreparedStatementsRefusedBehindTransactionPooler(t *testing.T) {
	ctx := context.Background()
	b := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction"})
	pool, err := pgxpool.New(ctx, b.DSN("sslmode=disable"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if d, err := New(ctx, pool, nil, driver.Options{Prefix: testdb.Prefix()}); err == nil {
		d.Close()
		t.Fatal("New accepted a pool that prepares named statements behind a transaction pooler")
	} else if !strings.Contains(err.Error(), "default_query_exec_mode=cache_describe") {
		t.Fatalf("error %q does not name the setting", err)
	}
	// A DSN that asks for named prepared statements is refused by Open
	// too.
	if d, err := Open(ctx, b.DSN("sslmode=disable&default_query_exec_mode=cache_statement"), driver.Options{Prefix: testdb.Prefix()}); err == nil {
		d.Close()
		t.Fatal("Open accepted default_query_exec_mode=cache_statement behind a transaction pooler")
	}
	ok, err := pgxpool.New(ctx, b.DSN("sslmode=disable&default_query_exec_mode=cache_describe"))
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	d, err := New(ctx, ok, nil, driver.Options{Prefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Capabilities().Listen {
		t.Fatal("listening through a transaction pooler without a listen connection")
	}
}

// TestJSONThroughTransactionPooler: args, metadata and the batch arrays
// keep their values through a transaction pooler in both exec modes that
// work there.
func TestJSONThroughTransactionPooler(t *testing.T) {
	ctx := context.Background()
	b := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction"})
	for _, mode := range []string{"", "&default_query_exec_mode=exec", "&default_query_exec_mode=cache_describe", "&default_query_exec_mode=simple_protocol"} {
		t.Run(strings.TrimPrefix(mode, "&"), func(t *testing.T) {
			d, err := Open(ctx, b.DSN("sslmode=disable"+mode), driver.Options{Prefix: testdb.Prefix()})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if _, err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			defer d.DropAll(ctx)
			args := json.RawMessage(`{"s":"quote \" backslash \\ brace } comma , unicode é","n":[1,2.5,null],"o":{}}`)
			meta := json.RawMessage(`{"trace":"a\"b","tag":"x, {y}"}`)
			var params []driver.InsertParams
			for i := range 3 {
				p := pj("q")
				p.Args, p.Meta = args, meta
				p.Priority = i
				params = append(params, p)
			}
			ids, err := d.Insert(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Worker: "w", Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != len(ids) {
				t.Fatalf("claimed %d of %d", len(rows), len(ids))
			}
			for _, r := range rows {
				if !jsonEqual(t, r.Args, args) || !jsonEqual(t, r.Meta, meta) {
					t.Fatalf("job %d args %s meta %s, want %s and %s", r.ID, r.Args, r.Meta, args, meta)
				}
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// TestListenThroughPoolers: LISTEN works through a session pooler, and
// through a transaction pooler when the listener has a direct connection
// (conveyor_direct_dsn); a direct DSN that goes through the transaction
// pooler too is refused.
func TestListenThroughPoolers(t *testing.T) {
	ctx := context.Background()
	direct := testdb.Postgres(t)
	session := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "session"})
	transaction := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction"})
	listenVia := func(dsn, listen string) string {
		return dsn + "&" + DirectDSNParam + "=" + url.QueryEscape(listen)
	}
	for _, c := range []struct{ name, dsn string }{
		{"session", session.DSN("sslmode=disable")},
		{"transaction-listen-dsn", listenVia(transaction.DSN("sslmode=disable"), direct)},
	} {
		t.Run(c.name, func(t *testing.T) {
			prefix := testdb.Prefix()
			d, err := Open(ctx, c.dsn, driver.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if _, err := d.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			defer d.DropAll(ctx)
			if !d.Capabilities().Listen {
				t.Fatalf("cannot listen: %s", d.Capabilities().NoListen)
			}
			l, err := d.Listen(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			// Another process enqueues through the pooler.
			other, err := Open(ctx, c.dsn, driver.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if _, err := other.Insert(ctx, []driver.InsertParams{pj("woken")}); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for {
				q, err := l.Wait(wctx)
				if err != nil {
					t.Fatalf("no notification: %v", err)
				}
				if q == "woken" {
					return
				}
			}
		})
	}
	t.Run("listen-dsn-through-pooler-refused", func(t *testing.T) {
		dsn := transaction.DSN("sslmode=disable")
		d, err := Open(ctx, listenVia(dsn, dsn), driver.Options{Prefix: testdb.Prefix()})
		if err == nil {
			d.Close()
			t.Fatal("Open accepted a listen DSN through the transaction pooler")
		}
		if !strings.Contains(err.Error(), "LISTEN receives nothing") {
			t.Fatalf("error %q does not say why", err)
		}
	})
}

// TestDirectDSNConnectsToThePrimary: behind PgBouncer, a direct
// connection that names several hosts, a standby first, connects to the
// writable one (as target_session_attrs=read-write would), for Open's
// conveyor_direct_dsn and for New's direct configuration alike: LISTEN
// works (it fails on a standby, "cannot execute LISTEN during recovery")
// and the registry's reader is on the primary. The direct connections
// close on a read-only error.
func TestDirectDSNConnectsToThePrimary(t *testing.T) {
	if os.Geteuid() != 0 {
		testdb.Missing(t, "root, to run a private PostgreSQL primary and standby as the postgres user")
	}
	if _, err := topology.PostgresBin(); err != nil {
		testdb.Missing(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := func(name string, start func(dir string) (*topology.PostgresNode, error)) *topology.PostgresNode {
		dir, err := topology.TempDir("conveyor-direct-"+name+"-", "postgres")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		n, err := start(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		return n
	}
	primary := node("primary", func(dir string) (*topology.PostgresNode, error) {
		return topology.StartPostgresPrimary(ctx, "primary", dir, nil)
	})
	standby := node("standby", func(dir string) (*topology.PostgresNode, error) {
		return topology.StartPostgresStandby(ctx, "standby", primary, dir, nil)
	})
	b := topology.PgBouncerT(t, topology.PgBouncerOptions{Mode: "transaction", Upstream: primary.DSN("postgres")})
	directDSN := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable", standby.Port, primary.Port)

	check := func(t *testing.T, d *Driver) {
		if _, err := d.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		defer d.DropAll(ctx)
		reg, err := d.seg.regPool(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var recovering bool
		if err := reg.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&recovering); err != nil || recovering {
			t.Fatalf("the registry's reader is on a standby (in recovery %v, %v)", recovering, err)
		}
		if d.connConfig.OnPgError(nil, &pgconn.PgError{Severity: "ERROR", Code: "25006"}) {
			t.Fatal("the direct connection stays open after a read-only error")
		}
		l, err := d.Listen(ctx)
		if err != nil {
			t.Fatalf("listen on the direct connection: %v", err)
		}
		defer l.Close()
		if _, err := d.Insert(ctx, []driver.InsertParams{pj("woken")}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			q, err := l.Wait(wctx)
			if err != nil {
				t.Fatalf("no notification: %v", err)
			}
			if q == "woken" {
				return
			}
		}
	}
	t.Run("Open", func(t *testing.T) {
		d, err := Open(ctx, b.DSN("sslmode=disable&"+DirectDSNParam+"="+url.QueryEscape(directDSN)), driver.Options{Prefix: testdb.Prefix()})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		check(t, d)
	})
	t.Run("New", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, b.DSN("sslmode=disable&default_query_exec_mode=cache_describe"))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		direct, err := pgx.ParseConfig(directDSN)
		if err != nil {
			t.Fatal(err)
		}
		d, err := New(ctx, pool, direct, driver.Options{Prefix: testdb.Prefix()})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if direct.ValidateConnect != nil || (direct.OnPgError != nil && !direct.OnPgError(nil, &pgconn.PgError{Severity: "ERROR", Code: "25006"})) {
			t.Fatal("New changed the caller's configuration")
		}
		check(t, d)
	})
}
