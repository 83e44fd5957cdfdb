package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A connection pooler between conveyor and PostgreSQL (PgBouncer) changes
// what a client connection is: in session pooling it keeps one server
// connection for its life, as a direct connection does; in transaction
// pooling each transaction (each statement outside one) may run on
// another server connection, shared with other clients; in statement
// pooling multi-statement transactions are refused. Conveyor finds out
// which when it opens (probePooler) and adapts:
//
//   - statement pooling is refused (its claims and moves are
//     multi-statement transactions);
//   - a startup parameter the pooler refuses (plan_cache_mode, which
//     conveyor sends to get generic plans) is dropped; in session pooling
//     the mode is set on each new connection instead, in transaction
//     pooling it is not set at all: there every statement runs as an
//     unnamed statement, planned at each execution whatever the mode;
//   - in transaction pooling named prepared statements, which live on one
//     server connection, cannot be used: the connections conveyor makes
//     describe each statement once and execute it unnamed
//     (QueryExecModeCacheDescribe, which also encodes JSON and array
//     parameters by the types the server described); an application pool
//     (New) that would prepare statements is refused;
//   - LISTEN through a transaction pooler receives nothing: the listener
//     needs a direct connection (DirectDSNParam, or New's direct
//     configuration); without one the engine polls and says so once.
//     The segment registry's reader takes the direct connection too: it
//     runs while a transaction that enqueues holds a server connection,
//     and through the pooler it would wait for another, which every
//     other such transaction may hold.
//
// Everything else conveyor keeps on a server connection is scoped to a
// transaction (advisory locks are pg_advisory_xact_lock, settings are
// SET LOCAL or set_config(..., true)), so it holds through any pooler.

// DirectDSNParam is the query parameter of a postgres:// DSN that names,
// URL-encoded, a direct connection to PostgreSQL for the two connections
// of a process that must not go through a transaction pooler when the
// DSN itself does: the listener (LISTEN through one receives nothing) and
// the segment registry's reader (see the list above):
//
//	postgres://app@pgbouncer:6432/app?conveyor_direct_dsn=postgres%3A%2F%2Fapp%40db%3A5432%2Fapp
//
// Open removes it before the DSN reaches pgx.
const DirectDSNParam = "conveyor_direct_dsn"

// Pooler is what lies between conveyor's connections and PostgreSQL, as
// probePooler found it.
type Pooler int

const (
	// PoolerNone is a direct connection, or a pooler that keeps a server
	// connection per client connection without showing itself.
	PoolerNone Pooler = iota
	// PoolerSession is a pooler in session mode (PgBouncer
	// pool_mode = session), known by a startup parameter it refused.
	PoolerSession
	// PoolerTransaction is a pooler in transaction mode (PgBouncer
	// pool_mode = transaction).
	PoolerTransaction
)

// String names the pooler as ServerInfo reports it.
func (p Pooler) String() string {
	switch p {
	case PoolerSession:
		return "session pooling"
	case PoolerTransaction:
		return "transaction pooling"
	}
	return "none"
}

// probeRounds bounds the rounds of probePooler: each round proves
// transaction pooling unless other clients of the pooler happened to
// hand the probe's server connections back to it in the same order.
const probeRounds = 3

// errStatementPooling refuses statement pooling.
var errStatementPooling = errors.New("PostgreSQL is reached through a pooler in statement mode (PgBouncer pool_mode = statement), which refuses multi-statement transactions; conveyor needs them: use pool_mode = transaction or session for this database")

// probe is what probePooler found.
type probe struct {
	pooler Pooler
	// planRefused is set when the pooler refused plan_cache_mode as a
	// startup parameter: it was removed from the configuration.
	planRefused bool
}

// probePooler connects twice with cfg and finds out whether the
// connections go through a transaction pooler: two client connections
// open at once never share a server process (pg_backend_pid) unless a
// pooler hands server connections from one client to another between
// transactions, and one client connection never changes server process
// unless it does. Connection A runs a statement, connection B then opens
// a transaction and runs one (a pooler that hands out its most recently
// released server connection first, as PgBouncer does, gives B A's), and
// A runs one more while B's transaction holds its server connection.
// Statement pooling shows as B's transaction refused.
//
// When addedPlan is set, cfg's plan_cache_mode is conveyor's own: if the
// server refuses it as a startup parameter (a pooler does), probePooler
// removes it from cfg and connects again. The probe's connections use
// the simple protocol and are closed before it returns.
func probePooler(ctx context.Context, q *queries, cfg *pgx.ConnConfig, addedPlan bool) (probe, error) {
	var pr probe
	connect := func() (*pgx.Conn, error) {
		c, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil && addedPlan && !pr.planRefused && refusedStartup(err) {
			pr.planRefused = true
			delete(cfg.RuntimeParams, "plan_cache_mode")
			c, err = pgx.ConnectConfig(ctx, cfg.Copy())
		}
		if err != nil && refusedStartup(err) {
			err = fmt.Errorf("%w (a pooler such as PgBouncer refuses startup parameters it does not know: remove it from the DSN or list it in the pooler's ignore_startup_parameters)", err)
		}
		return c, err
	}
	a, err := connect()
	if err != nil {
		return pr, err
	}
	defer closeConn(a)
	b, err := connect()
	if err != nil {
		return pr, err
	}
	defer closeConn(b)
	if pr.planRefused {
		pr.pooler = PoolerSession
	}
	for range probeRounds {
		a1, err := backendPID(ctx, q, a)
		if err != nil {
			return pr, err
		}
		if err := simpleExec(ctx, b, q.ProbeBegin); err != nil {
			return pr, statementPooling(err)
		}
		pb, err := backendPID(ctx, q, b)
		if err != nil {
			return pr, statementPooling(err)
		}
		if pb == a1 {
			pr.pooler = PoolerTransaction
			return pr, nil
		}
		// A pooler whose every server connection B's transaction and
		// other clients hold makes A wait: a client connection of its
		// own would not, so a wait past probeWait proves pooling too.
		actx, cancel := context.WithTimeout(ctx, probeWait)
		a2, err := backendPID(actx, q, a)
		cancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			pr.pooler = PoolerTransaction
			return pr, nil
		}
		if err != nil {
			return pr, err
		}
		if err := simpleExec(ctx, b, q.ProbeRollback); err != nil {
			return pr, statementPooling(err)
		}
		if a1 != a2 || pb == a2 {
			pr.pooler = PoolerTransaction
			return pr, nil
		}
	}
	return pr, nil
}

// probeWait bounds probePooler's statement on its first connection while
// the second holds a transaction (see probePooler).
const probeWait = 2 * time.Second

// refusedStartup reports the error of a pooler that refused a startup
// parameter ("unsupported startup parameter: plan_cache_mode").
func refusedStartup(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unsupported startup parameter")
}

// statementPooling turns PgBouncer's refusal of a transaction block into
// errStatementPooling.
func statementPooling(err error) error {
	if strings.Contains(err.Error(), "statement pooling mode") {
		return errStatementPooling
	}
	return err
}

// simpleExec runs sql on c with the simple protocol.
func simpleExec(ctx context.Context, c *pgx.Conn, sql string) error {
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// backendPID returns the process id of the server connection c's
// statement ran on.
func backendPID(ctx context.Context, q *queries, c *pgx.Conn) (string, error) {
	res, err := c.PgConn().Exec(ctx, q.BackendPID).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return "", errors.New("pg_backend_pid() returned no row")
	}
	return string(res[0].Rows[0][0]), nil
}

// splitDirectDSN removes DirectDSNParam from dsn and returns the DSN
// without it and the direct DSN ("" when absent).
func splitDirectDSN(dsn string) (string, string, error) {
	if !strings.Contains(dsn, DirectDSNParam) {
		return dsn, "", nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", DirectDSNParam, err)
	}
	q := u.Query()
	direct := q.Get(DirectDSNParam)
	q.Del(DirectDSNParam)
	u.RawQuery = q.Encode()
	if direct == "" {
		return "", "", fmt.Errorf("%s is empty: give it a postgres:// URL of the database's server itself, URL-encoded", DirectDSNParam)
	}
	if !strings.HasPrefix(direct, "postgres://") && !strings.HasPrefix(direct, "postgresql://") {
		return "", "", fmt.Errorf("%s must be a postgres:// URL, URL-encoded in the DSN", DirectDSNParam)
	}
	return u.String(), direct, nil
}

// adapt makes cfg fit what pr found behind it: conveyor's generic plans
// set per connection in session pooling (the pooler refused them as a
// startup parameter), and describe-then-execute-unnamed in transaction
// pooling unless the DSN chose an exec mode (explicitMode). A DSN that
// chose named prepared statements behind a transaction pooler is
// refused.
func adapt(q *queries, cfg *pgxpool.Config, pr probe, explicitMode bool) error {
	if pr.planRefused && pr.pooler == PoolerSession {
		prev := cfg.AfterConnect
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			if prev != nil {
				if err := prev(ctx, c); err != nil {
					return err
				}
			}
			return simpleExec(ctx, c, q.SessionPlanMode)
		}
	}
	if pr.pooler != PoolerTransaction {
		return nil
	}
	if !explicitMode {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		return nil
	}
	return checkExecMode(cfg.ConnConfig)
}

// checkExecMode refuses, behind a transaction pooler, an exec mode that
// prepares named statements.
func checkExecMode(cfg *pgx.ConnConfig) error {
	if cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		return errors.New("PostgreSQL is reached through a transaction pooler (PgBouncer pool_mode = transaction), where named prepared statements fail, but the connections prepare them (pgx QueryExecModeCacheStatement, the default): set default_query_exec_mode=cache_describe (or exec) in the DSN, or ConnConfig.DefaultQueryExecMode")
	}
	return nil
}

// directConfig parses a direct DSN and checks that it reaches PostgreSQL
// without a transaction pooler. A DSN that names several hosts and no
// target_session_attrs connects to a writable one only, as the pool's
// does (see readWriteFallbacks): LISTEN fails on a standby, and the
// registry's reader must see what the primary has.
func directConfig(ctx context.Context, q *queries, dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", DirectDSNParam, err)
	}
	readWriteFallbacks(dsn, &cfg.Config)
	if err := checkDirectConfig(ctx, q, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// checkDirectConfig refuses a direct configuration that goes through a
// transaction pooler too.
func checkDirectConfig(ctx context.Context, q *queries, cfg *pgx.ConnConfig) error {
	pr, err := probePooler(ctx, q, cfg, false)
	if err != nil {
		return fmt.Errorf("direct connection (%s): %w", DirectDSNParam, err)
	}
	if pr.pooler == PoolerTransaction {
		return fmt.Errorf("the direct connection (%s) goes through a transaction pooler too, where LISTEN receives nothing: give it the address of PostgreSQL itself", DirectDSNParam)
	}
	return nil
}
