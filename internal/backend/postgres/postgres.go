// Package postgres is conveyor's PostgreSQL backend, built on pgx/v5 and
// pgxpool.
//
// Jobs live in tables per phase (ready, running, waiting, done, dead),
// each a series of segment tables that the maintenance leader seals and
// truncates whole (docs/postgres-storage.md). A job moves between phases
// by one statement that deletes it from its segment and inserts it into
// the current segment of its next phase. Claims select with FOR UPDATE
// SKIP LOCKED, so claimers never wait for each other and never deadlock.
// Batches (insert, complete, heartbeat, release) are passed as array
// parameters and expanded with unnest, so each is one statement and one
// round trip whatever its size. Inserts and state changes that make jobs
// available wake other processes with one pg_notify per queue on the
// channel "<prefix>wake", delivered when the transaction commits.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
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

// queries holds every named query of queries.sql and segments.sql, with
// the prefix applied (sqlq.Load). The statements of segments.sql are
// mostly templates that segStore.stmt and segStore.table fill in.
type queries struct {
	MigrateLock      string `sql:"migrate_lock"`
	CreateMigrations string `sql:"create_migrations"`
	CurrentVersion   string `sql:"current_version"`
	RecordVersion    string `sql:"record_version"`
	DropAll          string `sql:"drop_all"`
	ServerInfo       string `sql:"server_info"`
	BackendPID       string `sql:"backend_pid"`
	SessionPlanMode  string `sql:"session_plan_mode"`
	ProbeBegin       string `sql:"probe_begin"`
	ProbeRollback    string `sql:"probe_rollback"`
	BulkNow          string `sql:"bulk_now"`
	NotifyAsync      string `sql:"notify_queues_async"`
	TryLead          string `sql:"try_lead"`
	Listen           string `sql:"listen"`
	PauseQueue       string `sql:"pause_queue"`
	PausedQueues     string `sql:"paused_queues"`
	RecordSchedule   string `sql:"record_schedule"`
	Schedules        string `sql:"schedules"`
	TouchSchedule    string `sql:"touch_schedule"`
	PruneSchedules   string `sql:"prune_schedules"`
	RegisterProcess  string `sql:"register_process"`
	RemoveProcess    string `sql:"remove_process"`
	Processes        string `sql:"processes"`
	PruneProcesses   string `sql:"prune_processes"`
	GetResult        string `sql:"get_result"`
	InsertBatch      string `sql:"insert_batch"`
	InsertBatchJobs  string `sql:"insert_batch_jobs"`
	FireBatch        string `sql:"fire_batch"`
	GetBatch         string `sql:"get_batch"`
	JobBatch         string `sql:"job_batch"`
	AwaitingDeps     string `sql:"awaiting_dependencies"`
	PruneBatches     string `sql:"prune_batches"`
	InsertBatchDeps  string `sql:"insert_batch_deps"`
	PruneResults     string `sql:"prune_results"`
	SetQueueLimits   string `sql:"set_queue_limits"`
	QueueLimits      string `sql:"queue_limits"`
	LimitUsage       string `sql:"limit_usage"`
	LimitBegin       string `sql:"limit_begin"`
	LimitLock        string `sql:"limit_lock"`
	LimitRowLock     string `sql:"limit_row_lock"`
	LimitHeld        string `sql:"limit_held"`
	LeaseLimits      string `sql:"lease_limits"`
	LeaseMine        string `sql:"lease_mine"`
	LeaseTake        string `sql:"lease_take"`
	LeaseSet         string `sql:"lease_set"`
	LeaseOthers      string `sql:"lease_others"`
	LimitTake        string `sql:"limit_take"`
	LimitRetryIn     string `sql:"limit_retry_in"`
	KeyLock          string `sql:"key_lock"`
	KeyTake          string `sql:"key_take"`
	KeyRateRetryIn   string `sql:"key_rate_retry_in"`
	SetKeyWeights    string `sql:"set_key_weights"`
	KeyWeights       string `sql:"key_weights"`

	SegTable           string `sql:"seg_table"`
	SegIndexReady      string `sql:"seg_index_ready"`
	SegIndexWaiting    string `sql:"seg_index_waiting"`
	SegIndexFinished   string `sql:"seg_index_finished"`
	SegUnindexFinished string `sql:"seg_unindex_finished"`
	SegRegistry        string `sql:"seg_registry"`
	SegRegistryTx      string `sql:"seg_registry_tx"`
	SegCount           string `sql:"seg_count"`
	SegInsert          string `sql:"seg_insert"`
	SegInsertClaim     string `sql:"seg_insert_claim"`
	SegInsertUnique    string `sql:"seg_insert_unique"`
	SegJobUniqueKey    string `sql:"seg_job_unique_key"`
	SegUniqueHolders   string `sql:"seg_unique_holders"`
	SegBulkLock        string `sql:"seg_bulk_lock"`
	SegBulkGuard       string `sql:"seg_bulk_guard"`
	SegClaim           string `sql:"seg_claim"`
	SegGuard           string `sql:"seg_guard"`
	SegHasReady        string `sql:"seg_has_ready"`
	SegSweepSlots      string `sql:"seg_sweep_slots"`
	SegKeyRoom         string `sql:"seg_key_room"`
	SegKeyWalk         string `sql:"seg_key_walk"`
	SegKeyPick         string `sql:"seg_key_pick"`
	SegClaimIDs        string `sql:"seg_claim_ids"`
	SegKeyHeld         string `sql:"seg_key_held"`
	SegSweepKept       string `sql:"seg_sweep_kept"`

	// SegClaimNoKey is seg_claim for the jobs without a key of a queue
	// with key limits (made by loadQueries).
	SegClaimNoKey         string
	SegComplete           string `sql:"seg_complete"`
	SegCompleteDone       string `sql:"seg_complete_done"`
	SegHeartbeat          string `sql:"seg_heartbeat"`
	SegRelease            string `sql:"seg_release"`
	SegRescue             string `sql:"seg_rescue"`
	SegPromote            string `sql:"seg_promote"`
	SegClaimJob           string `sql:"seg_claim_job"`
	SegGetJob             string `sql:"seg_get_job"`
	SegReadyBatches       string `sql:"seg_ready_batches"`
	SegLockBatch          string `sql:"seg_lock_batch"`
	SegBatchReady         string `sql:"seg_batch_ready"`
	SegBatchMembers       string `sql:"seg_batch_members"`
	SegPrunableBatches    string `sql:"seg_prunable_batches"`
	SegListJobs           string `sql:"seg_list_jobs"`
	SegListJobsDesc       string `sql:"seg_list_jobs_desc"`
	SegRetry              string `sql:"seg_retry"`
	SegFinish             string `sql:"seg_finish"`
	SegStats              string `sql:"seg_stats"`
	SegStatsSerial        string `sql:"seg_stats_serial"`
	SegOverview           string `sql:"seg_overview"`
	SegMaintLock          string `sql:"seg_maint_lock"`
	SegRegistryAll        string `sql:"seg_registry_all"`
	SegCurrent            string `sql:"seg_current"`
	SegFree               string `sql:"seg_free"`
	SegInc                string `sql:"seg_inc"`
	SegStill              string `sql:"seg_still"`
	SegNewName            string `sql:"seg_new_name"`
	SegRegister           string `sql:"seg_register"`
	SegSetStatus          string `sql:"seg_set_status"`
	SegCountsLock         string `sql:"seg_counts_lock"`
	SegRecordCounts       string `sql:"seg_record_counts"`
	SegUnregister         string `sql:"seg_unregister"`
	SegSize               string `sql:"seg_size"`
	SegLockExclusive      string `sql:"seg_lock_exclusive"`
	SegLockShare          string `sql:"seg_lock_share"`
	SegRows               string `sql:"seg_rows"`
	SegExpired            string `sql:"seg_expired"`
	SegOldest             string `sql:"seg_oldest"`
	SegMove               string `sql:"seg_move"`
	SegMoveDelete         string `sql:"seg_move_delete"`
	SegFreeKeys           string `sql:"seg_free_keys"`
	SegAnalyze            string `sql:"seg_analyze"`
	SegAnalyzeSample      string `sql:"seg_analyze_sample"`
	SegAnalyzeTable       string `sql:"seg_analyze_table"`
	SegReltuples          string `sql:"seg_reltuples"`
	SegTruncate           string `sql:"seg_truncate"`
	SegAdvance            string `sql:"seg_advance"`
	SegSync               string `sql:"seg_sync"`
	SegOutOfSync          string `sql:"seg_out_of_sync"`
	SegDrop               string `sql:"seg_drop"`
	SegNotify             string `sql:"seg_notify"`
	SegTables             string `sql:"seg_tables"`
	SegConvertSetup       string `sql:"seg_convert_setup"`
	SegConvertLock        string `sql:"seg_convert_lock"`
	SegConvertLockTimeout string `sql:"seg_convert_lock_timeout"`
	SegConvertLockReset   string `sql:"seg_convert_lock_reset"`
	SegConvertMove        string `sql:"seg_convert_move"`
	SegConvertDrop        string `sql:"seg_convert_drop"`
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
	pooler     Pooler          // what lies between the pool and PostgreSQL
	canListen  bool            // false behind a transaction pooler without a direct connection
	direct     *pgx.ConnConfig // the registry's connection when not nil (DirectDSNParam)
	prefix     string
	q          queries
	migrations []sqlq.Migration
	kinds      interner
	seg        *segStore             // the segment tables and their registry
	keys       keyStates             // the key limits and walk cursors of the queues claimed
	weights    driver.KeyWeightCache // the decoded key weights of the fair queues claimed
	// noKeyless: the key-limited queues whose claims skip the jobs
	// without a key for now (see driver.QueueSkip). seg_claim restricted
	// to them reads the claim index in claim order and skips the keyed
	// jobs it meets, a heap fetch each: 5 ms a claim behind 20,000 jobs
	// of one key, to find nothing.
	noKeyless driver.QueueSkip

	deadlockRetries      atomic.Int64
	lockTimeouts         atomic.Int64
	serializationRetries atomic.Int64
	listenReconnects     atomic.Int64
	serverDrops          atomic.Int64
	// notifyLost counts wake-up notifications that failed twice after
	// the commit of their jobs (notify.go).
	notifyLost atomic.Int64

	fo failover // see dropServer
}

// Open connects to the PostgreSQL server named by dsn (a postgres:// or
// postgresql:// URL) and returns a driver whose pool holds at most
// opts.PoolSize connections (default max(8, 4*GOMAXPROCS), or the DSN's
// pool_max_conns when it sets one), plus up to two connections of the
// lease path's own (heartbeats and acknowledgements), one of the segment
// registry's and, once the engine listens, one notification connection.
// A DSN that names several hosts and no target_session_attrs connects to
// a writable one only (see readWriteFallbacks). It does not migrate.
//
// Open finds out whether the DSN goes through a connection pooler, and
// in which mode, and adapts or refuses (see probePooler and adapt).
// The DSN's DirectDSNParam, if any, names the direct connection of the
// listener and the segment registry's reader.
func Open(ctx context.Context, dsn string, opts driver.Options) (*Driver, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return nil, errors.New("conveyor/postgres: open: DSN must start with postgres:// or postgresql://")
	}
	q, err := loadQueries(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	dsn, directDSN, err := splitDirectDSN(dsn)
	if err != nil {
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
	_, planSet := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]
	setPlanMode(cfg)
	readWriteFallbacks(dsn, &cfg.ConnConfig.Config)
	closeOnReadOnly(cfg.ConnConfig.OnPgError, &cfg.ConnConfig.Config)
	pr, err := probePooler(ctx, q, cfg.ConnConfig, !planSet)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	if err := adapt(q, cfg, pr, strings.Contains(dsn, "default_query_exec_mode")); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	var direct *pgx.ConnConfig
	if directDSN != "" {
		if direct, err = directConfig(ctx, q, directDSN); err != nil {
			return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	d, err := newDriver(ctx, pool, opts, &setup{q: q, probe: pr, direct: direct})
	if err != nil {
		pool.Close()
		return nil, err
	}
	d.ownsPool = true
	return d, nil
}

// setup is what Open learnt before it made the pool, for newDriver.
type setup struct {
	q      *queries
	probe  probe
	direct *pgx.ConnConfig // the listener's and the registry's; nil: the pool's configuration
}

// loadQueries loads queries.sql and segments.sql for prefix.
func loadQueries(prefix string) (*queries, error) {
	if err := sqlq.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	var q queries
	if err := sqlq.Load(&q, sqlFS, prefix, "queries.sql", "segments.sql"); err != nil {
		return nil, err
	}
	// seg_claim's {nokey}: nothing for the plain claim; the keyed claim's
	// jobs without a key are claimed by the same statement restricted to
	// them.
	q.SegClaimNoKey = strings.Replace(q.SegClaim, "{nokey}", "lkey IS NULL AND ", 1)
	q.SegClaim = strings.Replace(q.SegClaim, "{nokey}", "", 1)
	// seg_key_walk's {key_room}: seg_key_room, the test of a key each
	// step of the walk makes, without its leading comment.
	q.SegKeyWalk = strings.ReplaceAll(q.SegKeyWalk, "{key_room}", sqlBody(q.SegKeyRoom))
	return &q, nil
}

// sqlBody is q without the comment lines that head it.
func sqlBody(q string) string {
	for strings.HasPrefix(q, "--") {
		_, q, _ = strings.Cut(q, "\n")
	}
	return q
}

// planGeneric is the plan cache mode of the connections conveyor makes.
// pgx prepares every statement. Every table a plan reads is bounded (a
// segment is sealed at a size) and the leader analyzes each current
// segment whenever it doubles, which invalidates the plans on it, so a
// generic plan cannot outlive the statistics it was made with by more
// than a doubling; planning the statements at every execution was 15-20%
// of the server's CPU in a drain.
const planGeneric = "force_generic_plan"

// setPlanMode gives the connections of cfg planGeneric, unless its
// configuration names a plan_cache_mode of the application's, which
// stands.
func setPlanMode(cfg *pgxpool.Config) {
	if _, ok := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !ok {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = planGeneric
	}
}

// New returns a driver on the application's own pool, which it does not
// close. Claims, inserts, maintenance and admin calls use that pool; the
// lease path (heartbeat, complete, release) gets a pool of its own of at
// most two connections, the segment registry one connection, and the
// listener one dedicated connection, all made from the pool's
// configuration, except the listener's and the registry's when direct is
// not nil. Unless that configuration sets a plan_cache_mode, the lease
// pool's connections get force_generic_plan (see planGeneric); the
// application's pool is left as it is: giving it that mode too saves the
// planning of every claim.
//
// Behind a transaction pooler (see probePooler) the pool must not
// prepare named statements (pgx QueryExecModeCacheStatement, its
// default): New refuses it. LISTEN through such a pooler receives
// nothing; direct, a configuration that reaches PostgreSQL itself, gives
// the listener a connection that works (and the registry's reader one
// that never waits for a pooled server connection), and without it the
// engine polls.
//
// The driver resets the application's pool (pgxpool.Pool.Reset), with
// its own, when a statement finds the server gone or read-only (a
// switchover or failover of the primary; see dropServer): the pool's
// connections to that server are of no use to the application either.
// The pool's configuration stands as the application made it, but a
// direct configuration that names several hosts (Fallbacks) and no
// ValidateConnect (no target_session_attrs, or "any") gets
// target_session_attrs=read-write, as a DSN given to Open does (see
// readWriteFallbacks), unless PGTARGETSESSIONATTRS is set: its
// connections are the listener's and the registry reader's, of no use
// on a standby. Give it a ValidateConnect of its own to choose
// otherwise. The direct connections, like the driver's own pools',
// close on a read-only error (see closeOnReadOnly).
func New(ctx context.Context, pool *pgxpool.Pool, direct *pgx.ConnConfig, opts driver.Options) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("conveyor/postgres: new: nil *pgxpool.Pool")
	}
	if direct != nil {
		direct = direct.Copy()
		readWriteFallbacks("", &direct.Config)
	}
	return newDriver(ctx, pool, opts, &setup{direct: direct})
}

// newDriver is New; s.q nil means New's caller made the pool, which has
// not been probed.
func newDriver(ctx context.Context, pool *pgxpool.Pool, opts driver.Options, s *setup) (*Driver, error) {
	q := s.q
	if q == nil {
		var err error
		if q, err = loadQueries(opts.Prefix); err != nil {
			return nil, fmt.Errorf("conveyor/postgres: new: %w", err)
		}
	}
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: %w", err)
	}
	cfg := pool.Config()
	_, planSet := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]
	setPlanMode(cfg)
	pr := s.probe
	if s.q == nil {
		var err error
		if pr, err = probePooler(ctx, q, cfg.ConnConfig, !planSet); err != nil {
			return nil, fmt.Errorf("conveyor/postgres: new: %w", err)
		}
		if err := adapt(q, cfg, pr, true); err != nil {
			return nil, fmt.Errorf("conveyor/postgres: new: %w", err)
		}
		if s.direct != nil {
			if err := checkDirectConfig(ctx, q, s.direct); err != nil {
				return nil, fmt.Errorf("conveyor/postgres: new: %w", err)
			}
		}
	} else if pr.planRefused {
		delete(cfg.ConnConfig.RuntimeParams, "plan_cache_mode")
	}
	closeOnReadOnly(cfg.ConnConfig.OnPgError, &cfg.ConnConfig.Config)
	if s.direct != nil {
		closeOnReadOnly(s.direct.OnPgError, &s.direct.Config)
	}
	leaseCfg := cfg.Copy()
	leaseCfg.MaxConns, leaseCfg.MinConns = leaseConns, 0
	lease, err := pgxpool.NewWithConfig(ctx, leaseCfg)
	if err != nil {
		return nil, fmt.Errorf("conveyor/postgres: open: lease pool: %w", err)
	}
	listenCfg := s.direct
	if listenCfg == nil {
		listenCfg = cfg.ConnConfig.Copy()
	}
	d := &Driver{
		pool:       pool,
		lease:      lease,
		connConfig: listenCfg,
		pooler:     pr.pooler,
		direct:     s.direct,
		canListen:  pr.pooler != PoolerTransaction || s.direct != nil,
		prefix:     opts.Prefix,
		q:          *q,
		migrations: sqlq.Migrations(sqlFS, "migrations", opts.Prefix),
		kinds:      newInterner(),
	}
	d.seg = newSegStore(d)
	return d, nil
}

// Pool returns the driver's connection pool, for callers (the benchmark)
// that run their own SQL next to conveyor's. The driver owns it: do not
// close it.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Name returns "postgres".
func (d *Driver) Name() string { return "postgres" }

// noListen is Capabilities.NoListen behind a transaction pooler without
// a direct connection.
const noListen = "PostgreSQL is reached through a transaction pooler (PgBouncer pool_mode = transaction), where LISTEN receives nothing; give conveyor a direct connection to PostgreSQL (" + DirectDSNParam + " in the DSN, or pgxv5.Driver.WithDirect)"

// Capabilities reports LISTEN/NOTIFY support: not behind a transaction
// pooler unless the listener has a direct connection.
func (d *Driver) Capabilities() driver.Capabilities {
	if !d.canListen {
		return driver.Capabilities{NoListen: noListen}
	}
	return driver.Capabilities{Listen: true}
}

// ServerInfo returns the server version and the settings that decide
// commit throughput and durability.
func (d *Driver) ServerInfo(ctx context.Context) (map[string]string, error) {
	var version, syncCommit, fsync, fpw, walLevel, walSync, commitDelay, maxConns, sharedBuffers string
	err := d.pool.QueryRow(ctx, d.q.ServerInfo).Scan(&version, &syncCommit, &fsync, &fpw, &walLevel, &walSync, &commitDelay, &maxConns, &sharedBuffers)
	if err != nil {
		return nil, d.wrap("server info", err)
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
		"pooler":             d.pooler.String(),
		"listen":             fmt.Sprint(d.canListen),
	}, nil
}

// Counters returns the retries this driver performed after deadlocks,
// lock timeouts and serialization failures, the listener's reconnects,
// the drops of a lost server's connections, and the wake-up
// notifications lost after their jobs' commit.
func (d *Driver) Counters() map[string]int64 {
	return map[string]int64{
		"deadlock_retries":      d.deadlockRetries.Load(),
		"lock_timeouts":         d.lockTimeouts.Load(),
		"serialization_retries": d.serializationRetries.Load(),
		"listen_reconnects":     d.listenReconnects.Load(),
		"server_drops":          d.serverDrops.Load(),
		"notify_lost":           d.notifyLost.Load(),
	}
}

// Close closes the lease path's pool, the registry's connection, and the
// main pool when Open made it. Listeners have their own connections and
// are closed separately.
func (d *Driver) Close() error {
	d.lease.Close()
	d.seg.close()
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
// migrators of the same prefix, then converts a prefix that an earlier
// version left on its one jobs table ({p}jobs) to the segment tables, in
// one more transaction under the same lock (see convertStorage): jobs in
// every state are moved, running ones with their attempt, fence and
// lease.
//
// The conversion runs after the last migration, not at version 10: a
// binary that knows migration 11 refuses nothing on a database that an
// earlier binary converted. A future migration that changes the segment
// tables must therefore not assume a converted prefix: it runs before the
// conversion on a prefix that an earlier version kept on the one table
// (the registry is empty then), or it must convert first.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	applied, err := d.MigrateTo(ctx, len(d.migrations))
	if err != nil {
		return applied, err
	}
	return applied, d.convertStorage(ctx)
}

// MigrateTo applies the missing migrations up to version and stops there,
// without the conversion that Migrate runs after the last one: the prefix
// is left as a release whose newest migration was version left it, its
// jobs in the one table {p}jobs. Tests and the bench build a prefix of an
// earlier release with it; applications call Migrate.
func (d *Driver) MigrateTo(ctx context.Context, version int) ([]int, error) {
	var applied []int
	deadline := time.Now().Add(convertLockFor)
	for {
		done, v, err := d.migrateStep(ctx, version)
		if pgCode(err) == "55P03" && time.Now().Before(deadline) {
			// A lock a migration needs is held (see migrateStep): give
			// the lock queue back to the writers, then try again.
			select {
			case <-ctx.Done():
				return applied, ctx.Err()
			case <-time.After(convertLockPause):
			}
			continue
		}
		if pgCode(err) == "55P03" {
			return applied, fmt.Errorf("%w; another transaction held a lock the migration needs through every attempt for %v (a pg_dump or a long transaction?): run Migrate again when it ends", err, convertLockFor)
		}
		if err != nil {
			return applied, err
		}
		if done {
			return applied, nil
		}
		applied = append(applied, v)
	}
}

// segmentsVersion is the first migration (010_segments_default.sql) after
// which a prefix is expected on the segment tables: a prefix at it or
// later whose registry is empty was kept on the one table by an earlier
// version, and still needs the conversion (see SchemaVersion).
const segmentsVersion = 10

// convertStorage converts the prefix to the segment tables under the
// migration lock, unless it has them already, and tells every listening
// process (one of an earlier version on the one table switches).
func (d *Driver) convertStorage(ctx context.Context) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return d.wrap("migrate: convert", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, d.q.MigrateLock, d.prefix); err != nil {
		return d.wrap("migrate: convert: lock", err)
	}
	var n int64
	if err := tx.QueryRow(ctx, d.q.SegCount).Scan(&n); err != nil {
		return d.wrap("migrate: convert", err)
	}
	if n > 0 {
		return nil // converted already
	}
	if _, err := d.seg.convert(ctx, tx); err != nil {
		return d.wrap("migrate: convert to segments", err)
	}
	if _, err := tx.Exec(ctx, d.q.SegNotify); err != nil {
		return d.wrap("migrate: convert", err)
	}
	return d.wrap("migrate: convert: commit", tx.Commit(ctx))
}

// migrateStep applies the next missing migration up to target, if any,
// in one transaction.
func (d *Driver) migrateStep(ctx context.Context, target int) (done bool, version int, err error) {
	latest := len(d.migrations)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, d.q.MigrateLock, d.prefix); err != nil {
		return false, 0, d.wrap("migrate: lock", err)
	}
	if _, err := tx.Exec(ctx, d.q.CreateMigrations); err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	var current int
	if err := tx.QueryRow(ctx, d.q.CurrentVersion).Scan(&current); err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	if current > latest {
		return false, 0, fmt.Errorf("conveyor/postgres: migrate: database has schema version %d, this binary knows up to %d: %w", current, latest, driver.ErrSchemaTooNew)
	}
	if current >= min(target, latest) {
		return true, 0, d.wrap("migrate", tx.Commit(ctx))
	}
	m := d.migrations[current]
	// A migration that alters a table in use waits for the locks of the
	// transactions on it, and every writer of the table queues behind it:
	// behind a pg_dump, for the whole dump. Each attempt waits at most
	// convertLockWait; MigrateTo tries again while writers go on.
	if _, err := tx.Exec(ctx, d.q.SegConvertLockTimeout, strconv.FormatInt(convertLockWait.Milliseconds(), 10)+"ms"); err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	for _, stmt := range m.Statements {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, 0, fmt.Errorf("conveyor/postgres: migrate: version %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if _, err := tx.Exec(ctx, d.q.RecordVersion, m.Version); err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, 0, d.wrap("migrate", err)
	}
	return false, m.Version, nil
}

// SchemaVersion returns the highest applied migration (0 when the
// database has none) and the newest one embedded in this binary. A
// prefix that an earlier version kept on its one jobs table past
// migration 10 reports version 9: it needs Migrate's conversion before
// this binary can use it.
func (d *Driver) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	latest = len(d.migrations)
	err = d.pool.QueryRow(ctx, d.q.CurrentVersion).Scan(&current)
	if err != nil {
		if pgCode(err) == "42P01" { // undefined_table: never migrated
			return 0, latest, nil
		}
		return 0, latest, d.wrap("schema version", err)
	}
	if current < segmentsVersion || current > latest {
		return current, latest, nil
	}
	var n int64
	if err := d.pool.QueryRow(ctx, d.q.SegCount).Scan(&n); err != nil {
		return 0, latest, d.wrap("schema version", err)
	}
	if n == 0 {
		current = segmentsVersion - 1
	}
	return current, latest, nil
}

// DropAll drops every table under this driver's prefix.
func (d *Driver) DropAll(ctx context.Context) error {
	tables, err := d.segTables(ctx)
	if err != nil {
		return d.wrap("drop all", err)
	}
	for _, t := range tables {
		if _, err := d.pool.Exec(ctx, d.seg.table(d.q.SegDrop, t, "")); err != nil {
			return d.wrap("drop all", err)
		}
	}
	_, err = d.pool.Exec(ctx, d.q.DropAll)
	return d.wrap("drop all", err)
}

// wrap is wrap, after noticeLost: an error that says the server is gone
// or read-only drops the driver's connections to it.
func (d *Driver) wrap(op string, err error) error {
	return wrap(op, d.noticeLost(err))
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
	if err != nil && (errors.As(err, &pe) || pgconn.SafeToRetry(err) && !connClosed(err)) {
		return driver.NotCommitted(err)
	}
	return err
}

// connClosed reports whether err is pgconn's "conn closed". pgconn says it
// is safe to retry, as it is when a statement finds its connection already
// closed; but it is also what a simple-protocol statement (a COMMIT)
// returns when the connection broke while it waited for the answer, after
// the server had received it.
func connClosed(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if r, ok := e.(interface{ SafeToRetry() bool }); ok && r.SafeToRetry() && e.Error() == "conn closed" {
			return true
		}
	}
	return false
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
