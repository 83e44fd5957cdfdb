// Package pgxv5 is conveyor's PostgreSQL driver on the application's own
// pgx v5 pool:
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	...
//	client, err := conveyor.New(ctx, pgxv5.New(pool), &conveyor.Config{...})
//
// Claims, inserts, maintenance and admin calls use the pool; the lease
// path (heartbeats and acknowledgements) gets a pool of its own of at most
// two connections, and the listener one dedicated connection, both made
// from the pool's configuration, so that renewing a lease never waits for
// a connection the application's handlers hold. Closing the client leaves
// the pool open. Client.EnqueueTx takes a pgx.Tx begun on any connection
// to the database (the job appears when that transaction commits).
//
// Behind PgBouncer in transaction pooling mode the pool must not prepare
// named statements: give its DSN default_query_exec_mode=cache_describe
// (conveyor.New refuses pgx's default, cache_statement, there), and give
// conveyor a direct connection to PostgreSQL with WithDirect. Statement
// pooling is refused.
//
// conveyor's own connections keep generic plans (force_generic_plan):
// every segment table is bounded and analyzed as it grows, and planning
// each claim anew costs 15-20% of the database's CPU in a drain. The
// application's pool keeps its own setting; set the mode in its
// configuration (RuntimeParams, or "?plan_cache_mode=force_generic_plan"
// in its DSN) so that claims on its connections are planned the same way.
package pgxv5

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/backend/postgres"
	"github.com/conveyorq/conveyor/internal/driver"
)

// Driver is a conveyor.Driver on an application's *pgxpool.Pool.
type Driver struct {
	pool   *pgxpool.Pool
	direct *pgx.ConnConfig
}

// New returns a driver on pool, for conveyor.New.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// WithDirect makes the listener's connection (LISTEN/NOTIFY, which wakes
// workers when another process enqueues) and the segment registry's
// reader from cfg instead of the pool's configuration, and returns d. A
// pool that goes through a transaction pooler (PgBouncer pool_mode =
// transaction) needs it: LISTEN through one receives nothing, and the
// registry's reader, which runs while a transaction that enqueues holds a
// server connection, must not wait for another one from the pooler. cfg
// must reach PostgreSQL itself (Bind refuses one that goes through a
// transaction pooler too); without it, behind such a pooler the client
// polls for other processes' jobs and logs a warning once when it
// starts. A cfg that names several hosts and no target_session_attrs
// (no ValidateConnect) connects to a writable host only, as
// target_session_attrs=read-write would (conveyor works on a copy of
// cfg). Call it before conveyor.New.
func (d *Driver) WithDirect(cfg *pgx.ConnConfig) *Driver {
	d.direct = cfg
	return d
}

// UnwrapTx is called by Client.EnqueueTx; applications do not call it.
func (d *Driver) UnwrapTx(tx pgx.Tx) any { return tx }

// Bind is called by conveyor.New; applications do not call it.
func (d *Driver) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	drv, err := postgres.New(ctx, d.pool, d.direct, opts)
	if err != nil {
		return nil, err
	}
	return drv, nil
}
