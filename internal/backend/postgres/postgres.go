// Package postgres is conveyor's PostgreSQL backend, built on pgx/v5 and
// pgxpool.
//
// Claims use a single UPDATE fed by a FOR UPDATE SKIP LOCKED selection, so
// claimers never wait for each other and never deadlock. Batches (insert,
// complete, heartbeat, release) are passed as array parameters and
// expanded with unnest, so each is one statement and one round trip
// whatever its size. Inserts and state changes that make jobs available
// wake other processes with one pg_notify per queue on the channel
// "<prefix>wake", delivered when the transaction commits.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/sqlq"
)

//go:embed queries.sql segments.sql migrations/*.sql
var sqlFS embed.FS

var _ driver.Driver = (*Driver)(nil)

// queries holds the SQL of every named query, with the prefix applied.
type queries struct {
	migrateLock, createMigrations, currentVersion, recordVersion, dropAll string
	serverInfo                                                            string
	insert, bulkNow, notifyQueues                                         string
	claim, claimJob, complete, heartbeat, release                         string
	rescue, promote, prune, tryLead, listen                               string
	getJob, listJobs, retry, finish, stats, overview                      string
	listState, listStates, listQueue, listKind                            string
	listDesc, listBefore                                                  string
	pauseQueue, pausedQueues                                              string
	insertUnique, uniqueHolders, jobUniqueKey                             string
	recordSchedule, schedules                                             string
	registerProcess, removeProcess, processes, pruneProcesses             string
}

func loadQueries(prefix string) queries {
	m := sqlq.Queries(sqlFS, "queries.sql", prefix)
	get := func(name string) string {
		s, ok := m[name]
		if !ok {
			panic("postgres: queries.sql has no query " + name)
		}
		return s
	}
	return queries{
		migrateLock:      get("migrate_lock"),
		createMigrations: get("create_migrations"),
		currentVersion:   get("current_version"),
		recordVersion:    get("record_version"),
		dropAll:          get("drop_all"),
		serverInfo:       get("server_info"),
		insert:           get("insert"),
		bulkNow:          get("bulk_now"),
		notifyQueues:     get("notify_queues"),
		claim:            get("claim"),
		claimJob:         get("claim_job"),
		complete:         get("complete"),
		heartbeat:        get("heartbeat"),
		release:          get("release"),
		rescue:           get("rescue"),
		promote:          get("promote"),
		prune:            get("prune"),
		tryLead:          get("try_lead"),
		listen:           get("listen"),
		getJob:           get("get_job"),
		listState:        get("list_jobs_state"),
		listStates:       get("list_jobs_states"),
		listQueue:        get("list_jobs_queue"),
		listKind:         get("list_jobs_kind"),
		listJobs:         get("list_jobs"),
		listDesc:         get("list_jobs_desc"),
		listBefore:       get("list_jobs_before"),
		retry:            get("retry"),
		finish:           get("finish"),
		stats:            get("stats"),
		overview:         get("overview"),
		pauseQueue:       get("pause_queue"),
		pausedQueues:     get("paused_queues"),
		insertUnique:     get("insert_unique"),
		uniqueHolders:    get("unique_holders"),
		jobUniqueKey:     get("job_unique_key"),
		recordSchedule:   get("record_schedule"),
		schedules:        get("schedules"),
		registerProcess:  get("register_process"),
		removeProcess:    get("remove_process"),
		processes:        get("processes"),
		pruneProcesses:   get("prune_processes"),
	}
}

// Driver is the PostgreSQL implementation of driver.Driver. It is safe for
// concurrent use.
type Driver struct {
	pool *pgxpool.Pool
	// lease is the lease path's own pool (heartbeat, complete, release):
	// leaseConns connections that claims, inserts, maintenance and the
	// application's handlers never hold, so renewing or ending a lease
	// never waits for a pooled connection.
	lease      *pgxpool.Pool
	ownsPool   bool            // Open made pool; New's caller owns it
	connConfig *pgx.ConnConfig // for the listener's dedicated connections
	prefix     string
	q          queries
	migrations []sqlq.Migration
	kinds      interner
	// storage is the storage Migrate converts the prefix to ("" keeps
	// it); seg is the segments storage once the prefix uses it.
	storage string
	seg     atomic.Pointer[segStore]
	sealAt  atomic.Int64 // SealSegmentsAt's size; 0: the default

	deadlockRetries      atomic.Int64
	lockTimeouts         atomic.Int64
	serializationRetries atomic.Int64
	listenReconnects     atomic.Int64
}

// Open connects to the PostgreSQL server named by dsn (a postgres:// or
// postgresql:// URL) and returns a driver whose pool holds at most
// opts.PoolSize connections (default max(8, 4*GOMAXPROCS), or the DSN's
// pool_max_conns when it sets one), plus up to two connections of the
// lease path's own (heartbeats and acknowledgements) and, once the engine
// listens, one notification connection. It does not migrate.
func Open(ctx context.Context, dsn string, opts driver.Options) (*Driver, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return nil, errors.New("conveyor/postgres: open: DSN must start with postgres:// or postgresql://")
	}
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	switch {
	case opts.PoolSize > 0:
		cfg.MaxConns = int32(opts.PoolSize)
	case !strings.Contains(dsn, "pool_max_conns"):
		cfg.MaxConns = int32(max(8, 4*runtime.GOMAXPROCS(0)))
	}
	if cfg.MinConns > cfg.MaxConns {
		cfg.MinConns = cfg.MaxConns
	}
	// The plan cache mode follows the prefix's storage (see planModes);
	// the driver does not exist yet when the pool is made, so the hook
	// reads it once New has set it.
	var pm *planModes
	_, userPlan := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]
	if !userPlan {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = planCustom
		pm = &planModes{}
		pm.hook(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	d, err := newDriver(ctx, pool, opts, userPlan, true)
	if err != nil {
		pool.Close()
		return nil, err
	}
	d.ownsPool = true
	if pm != nil {
		pm.d.Store(d)
	}
	return d, nil
}

// Plan cache modes. pgx prepares every statement. On the one-table
// storage, after five executions PostgreSQL may keep a generic plan chosen
// while the jobs table was small (a seq scan joined by hash) until the next
// ANALYZE, which conveyor leaves to autovacuum: on a table that grows under
// load that turned a 2,000-row completion into seconds of CPU, so each
// statement is planned anew (force_custom_plan). On the segments storage
// every table a plan reads is bounded (a segment is sealed at a size) and
// the leader analyzes each current segment whenever it doubles, which
// invalidates the plans on it, so a plan cannot outlive the statistics it
// was made with by more than a doubling; planning the segments' statements
// at every execution was 15-20% of the server's CPU in a drain. There a
// connection keeps the generic plan (force_generic_plan).
const (
	planCustom  = "force_custom_plan"
	planGeneric = "force_generic_plan"
)

// planModes gives the connections of a pool conveyor made the plan cache
// mode of the driver's storage: set at connection start to planCustom, and
// switched by PrepareConn (at the acquire of a connection, once) when the
// driver is on the segments. A pool whose configuration names a
// plan_cache_mode keeps it: no planModes is made for it.
type planModes struct {
	d atomic.Pointer[Driver]
}

// planKey is the connection's CustomData key of the mode it was given.
const planKey = "conveyor.plan_cache_mode"

// hook chains the mode switch in front of cfg's own acquire hook:
// PrepareConn, or the deprecated BeforeAcquire (which pgxpool ignores once
// PrepareConn is set, so the switch calls it).
func (pm *planModes) hook(cfg *pgxpool.Config) {
	next, before := cfg.PrepareConn, cfg.BeforeAcquire
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if d := pm.d.Load(); d != nil {
			want := planCustom
			if d.segs() != nil {
				want = planGeneric
			}
			data := c.PgConn().CustomData()
			if have, _ := data[planKey].(string); have != want && !(have == "" && want == planCustom) {
				if _, err := c.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, false)", want); err != nil {
					// The connection's state is unknown: a new one is made.
					return false, nil
				}
				data[planKey] = want
			}
		}
		switch {
		case next != nil:
			return next(ctx, c)
		case before != nil:
			return before(ctx, c), nil
		}
		return true, nil
	}
}

// New returns a driver on the application's own pool, which it does not
// close. Claims, inserts, maintenance and admin calls use that pool; the
// lease path (heartbeat, complete, release) gets a pool of its own of at
// most two connections, and the listener one dedicated connection, both
// made from the pool's configuration. Unless that configuration sets a
// plan_cache_mode, the lease pool's connections get the mode of the
// prefix's storage (see planCustom); the application's pool is left as
// it is: on the segments storage, giving it plan_cache_mode =
// force_generic_plan saves the planning of every claim.
func New(ctx context.Context, pool *pgxpool.Pool, opts driver.Options) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("conveyor/postgres: new: nil *pgxpool.Pool")
	}
	_, userPlan := pool.Config().ConnConfig.RuntimeParams["plan_cache_mode"]
	return newDriver(ctx, pool, opts, userPlan, false)
}

// newDriver is New; userPlan reports whether the pool's configuration
// came with a plan_cache_mode of the application's, which every pool of
// the driver then keeps; ours, whether Open made the pool (its
// PrepareConn is then planModes', which the lease pool does not take).
func newDriver(ctx context.Context, pool *pgxpool.Pool, opts driver.Options, userPlan, ours bool) (*Driver, error) {
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: new: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	cfg := pool.Config()
	var leasePM *planModes
	if !userPlan {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = planCustom
	}
	leaseCfg := cfg.Copy()
	leaseCfg.MaxConns, leaseCfg.MinConns = leaseConns, 0
	if ours {
		leaseCfg.PrepareConn = nil
	}
	if !userPlan {
		leasePM = &planModes{}
		leasePM.hook(leaseCfg)
	}
	lease, err := pgxpool.NewWithConfig(ctx, leaseCfg)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: lease pool: %w", err)
	}
	switch opts.Storage {
	case "", StorageTable, StorageSegments:
	default:
		lease.Close()
		return nil, fmt.Errorf("conveyor/postgres: new: unknown storage %q (table or segments)", opts.Storage)
	}
	d := &Driver{
		pool:       pool,
		lease:      lease,
		connConfig: cfg.ConnConfig.Copy(),
		prefix:     opts.Prefix,
		q:          loadQueries(opts.Prefix),
		migrations: sqlq.Migrations(sqlFS, "migrations", opts.Prefix),
		kinds:      newInterner(),
		storage:    opts.Storage,
	}
	if err := d.detectStorage(ctx); err != nil {
		lease.Close()
		return nil, err
	}
	if leasePM != nil {
		leasePM.d.Store(d)
	}
	return d, nil
}

// Pool returns the driver's connection pool, for callers (the benchmark)
// that run their own SQL next to conveyor's. The driver owns it: do not
// close it.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Name returns "postgres".
func (d *Driver) Name() string { return "postgres" }

// Capabilities reports LISTEN/NOTIFY support and SKIP LOCKED claims.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Listen: true,
	}
}

// ServerInfo returns the server version and the settings that decide
// commit throughput and durability.
func (d *Driver) ServerInfo(ctx context.Context) (map[string]string, error) {
	var version, syncCommit, fsync, fpw, walLevel, walSync, commitDelay, maxConns, sharedBuffers string
	err := d.pool.QueryRow(ctx, d.q.serverInfo).Scan(&version, &syncCommit, &fsync, &fpw, &walLevel, &walSync, &commitDelay, &maxConns, &sharedBuffers)
	if err != nil {
		return nil, wrap("server info", err)
	}
	return map[string]string{
		"backend":            "postgres",
		"server_version":     version,
		"synchronous_commit": syncCommit,
		"fsync":              fsync,
		"full_page_writes":   fpw,
		"wal_level":          walLevel,
		"wal_sync_method":    walSync,
		"commit_delay":       commitDelay,
		"max_connections":    maxConns,
		"shared_buffers":     sharedBuffers,
		"pool_max_conns":     fmt.Sprint(d.pool.Config().MaxConns),
	}, nil
}

// Counters returns the retries this driver performed after deadlocks,
// lock timeouts and serialization failures, and the listener's
// reconnects.
func (d *Driver) Counters() map[string]int64 {
	return map[string]int64{
		"deadlock_retries":      d.deadlockRetries.Load(),
		"lock_timeouts":         d.lockTimeouts.Load(),
		"serialization_retries": d.serializationRetries.Load(),
		"listen_reconnects":     d.listenReconnects.Load(),
	}
}

// Close closes the lease path's pool, and the main pool when Open made
// it. Listeners have their own connections and are closed separately.
func (d *Driver) Close() error {
	d.lease.Close()
	if s := d.segs(); s != nil {
		s.close()
	}
	if d.ownsPool {
		d.pool.Close()
	}
	return nil
}

// leaseConns is the size of the lease path's pool: the heartbeat loop and
// the completer each hold at most one connection at a time.
const leaseConns = 2

// Migrate applies the missing migrations, each in its own transaction
// under a transaction-level advisory lock that serialises concurrent
// migrators of the same prefix.
//
// Migration 10 converts the prefix to the segments storage, unless the
// driver was opened with Options.Storage "table". A driver opened with
// "segments" also converts a prefix that migration 10 left on the one
// table, in one transaction under the same lock (see convertStorage). The
// storage is the database's: every driver follows whatever its prefix
// uses, whatever its options say.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	latest := len(d.migrations)
	var applied []int
	for {
		done, v, err := d.migrateStep(ctx, latest)
		if err != nil {
			return applied, err
		}
		if done {
			break
		}
		applied = append(applied, v)
	}
	if d.storage == StorageSegments && d.segs() == nil {
		if err := d.convertStorage(ctx); err != nil {
			return applied, err
		}
	}
	return applied, d.detectStorage(ctx)
}

// segmentsDefaultVersion is the migration (010_segments_default.sql) that
// converts a prefix to the segments storage unless the driver was opened
// with Options.Storage "table".
const segmentsDefaultVersion = 10

// convertStorage converts the prefix to the segments storage under the
// migration lock, unless another process did it first, and tells every
// listening process. Migrate calls it for a driver opened with
// Options.Storage "segments" on a prefix that migration 10 left on the
// one table (it was opened with "table" then).
func (d *Driver) convertStorage(ctx context.Context) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return wrap("convert", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, d.q.migrateLock, d.prefix); err != nil {
		return wrap("convert: lock", err)
	}
	if err := d.convertIn(ctx, tx); err != nil {
		return wrap("convert", err)
	}
	return wrap("convert: commit", tx.Commit(ctx))
}

// convertIn converts the prefix in tx, which holds the migration lock,
// unless it has segments already, and notifies every listening process
// when tx commits.
func (d *Driver) convertIn(ctx context.Context, tx pgx.Tx) error {
	s := newSegStore(d)
	var n int64
	if err := tx.QueryRow(ctx, s.q("seg_count")).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil // converted by another process
	}
	if _, err := s.convert(ctx, tx); err != nil {
		return fmt.Errorf("to segments: %w", err)
	}
	_, err := tx.Exec(ctx, s.q("seg_notify"))
	return err
}

// migrateStep applies the next missing migration, if any, in one
// transaction.
func (d *Driver) migrateStep(ctx context.Context, latest int) (done bool, version int, err error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return false, 0, wrap("migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, d.q.migrateLock, d.prefix); err != nil {
		return false, 0, wrap("migrate: lock", err)
	}
	if _, err := tx.Exec(ctx, d.q.createMigrations); err != nil {
		return false, 0, wrap("migrate", err)
	}
	var current int
	if err := tx.QueryRow(ctx, d.q.currentVersion).Scan(&current); err != nil {
		return false, 0, wrap("migrate", err)
	}
	if current > latest {
		return false, 0, fmt.Errorf("conveyor/postgres: migrate: database has schema version %d, this binary knows up to %d: %w", current, latest, driver.ErrSchemaTooNew)
	}
	if current == latest {
		return true, 0, wrap("migrate", tx.Commit(ctx))
	}
	m := d.migrations[current]
	for _, stmt := range m.Statements {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, 0, fmt.Errorf("conveyor/postgres: migrate: version %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if m.Version == segmentsDefaultVersion && d.storage != StorageTable {
		if err := d.convertIn(ctx, tx); err != nil {
			return false, 0, fmt.Errorf("conveyor/postgres: migrate: version %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if _, err := tx.Exec(ctx, d.q.recordVersion, m.Version); err != nil {
		return false, 0, wrap("migrate", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, 0, wrap("migrate", err)
	}
	return false, m.Version, nil
}

// SchemaVersion returns the highest applied migration (0 when the
// database has none) and the newest one embedded in this binary.
func (d *Driver) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	latest = len(d.migrations)
	err = d.pool.QueryRow(ctx, d.q.currentVersion).Scan(&current)
	if err != nil {
		if pgCode(err) == "42P01" { // undefined_table: never migrated
			return 0, latest, nil
		}
		return 0, latest, wrap("schema version", err)
	}
	return current, latest, nil
}

// DropAll drops every table under this driver's prefix.
func (d *Driver) DropAll(ctx context.Context) error {
	tables, err := d.segTables(ctx)
	if err != nil {
		return wrap("drop all", err)
	}
	for _, t := range tables {
		if _, err := d.pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize()); err != nil {
			return wrap("drop all", err)
		}
	}
	_, err = d.pool.Exec(ctx, d.q.dropAll)
	return wrap("drop all", err)
}

// wrap names the operation in err, or returns nil.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("conveyor/postgres: %s: %w", op, err)
}

// refused marks err driver.NotCommitted when the write it ended certainly
// did not take effect: the server answered with an error (which rolls back
// an autocommit statement, a transaction's statement, or a commit), or
// nothing had been sent (pgconn.SafeToRetry). Anything else, such as a
// connection lost while waiting for the answer, may have committed.
func refused(err error) error {
	var pe *pgconn.PgError
	if err != nil && (errors.As(err, &pe) || pgconn.SafeToRetry(err)) {
		return driver.NotCommitted(err)
	}
	return err
}

// pgCode returns the SQLSTATE of a server error, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// retryable runs f again after a short, growing, jittered backoff when the
// server reports a deadlock, a lock timeout or a serialization failure,
// counting each retry. f must be idempotent (the fenced batch statements
// are) and must reset whatever it accumulates.
func (d *Driver) retryable(ctx context.Context, f func() error) error {
	const maxAttempts = 10
	backoff := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		switch pgCode(err) {
		case "40P01": // deadlock_detected
			d.deadlockRetries.Add(1)
		case "55P03": // lock_not_available
			d.lockTimeouts.Add(1)
		case "40001": // serialization_failure
			d.serializationRetries.Add(1)
		default:
			return err
		}
		if attempt >= maxAttempts {
			return err
		}
		sleep := backoff/2 + rand.N(backoff)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// micros converts a duration to whole microseconds, the unit every query
// takes durations in.
func micros(d time.Duration) int64 { return d.Microseconds() }
