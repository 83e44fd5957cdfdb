// Package mysql is conveyor's MySQL and MariaDB backend, built on
// github.com/go-sql-driver/mysql.
//
// Sessions are pinned to UTC (time_zone '+00:00', parseTime with loc=UTC),
// READ COMMITTED (no gap locks, so inserts, claims and completions do not
// block each other through index gaps), utf8mb4 and an explicit sql_mode,
// so nothing depends on the server's defaults. Every time the driver writes
// is computed from the database's clock (UTC_TIMESTAMP(6)).
//
// Claims use FOR UPDATE SKIP LOCKED where the server has it (MySQL 8.0.1+,
// MariaDB 10.6+) and otherwise an optimistic claim: a non-locking read of a
// window of due rows, then one fenced UPDATE of a pick from it (random once
// claimers compete). Batched writes (Complete, Heartbeat, Release) are one
// UPDATE joined to a JSON_TABLE of the batch (a UNION ALL derived table on
// servers without JSON_TABLE). Deadlocks (1213) and lock wait timeouts
// (1205) are retried inside the driver with backoff and counted in
// Counters.
//
// All SQL lives in queries.sql and migrations/.
package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/sqlq"
	gomysql "github.com/go-sql-driver/mysql"
)

//go:embed queries.sql migrations/*.sql
var sqlFiles embed.FS

// Claim methods, reported as claim_method by ServerInfo.
const (
	// ClaimSkipLocked locks due rows with FOR UPDATE SKIP LOCKED.
	ClaimSkipLocked = "skip-locked"
	// ClaimOptimistic takes a random pick from a window of due rows in one
	// UPDATE, without locking reads (servers without SKIP LOCKED).
	ClaimOptimistic = "optimistic-window"
)

// sqlMode is the session sql_mode: strict, so that a value that does not
// fit is an error rather than a silent truncation.
const sqlMode = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"

// lockWaitTimeout (seconds) bounds how long a statement waits for a row
// lock before the server gives up; the driver then retries it.
const lockWaitTimeout = "10"

// MySQL error numbers the driver handles.
const (
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errNoSuchTable     = 1146
	errUnknownVariable = 1193
	errDupColumn       = 1060
	errDupKeyName      = 1061
	errDupEntry        = 1062
	// Galera errors whose commit outcome is unknown (see refused).
	errErrorDuringCommit = 1180
	errUnknownCom        = 1047
)

// Placeholder limit of one prepared statement.
const maxPlaceholders = 65535

// Rows per multi-row INSERT at most (also bounded by max_allowed_packet).
const maxInsertRows = 2000

// Insert statements up to this many rows are kept prepared.
const maxCachedInsertRows = 16

// IN lists and UNION sources are padded to a power of two up to this size
// so that each size is prepared once per connection.
const maxBucket = 4096

// Driver is the MySQL / MariaDB backend. It is safe for concurrent use.
type Driver struct {
	// cursors maps a queue to its *claimCursor.
	cursors sync.Map
	// keyCursors maps a queue to its *keyCursor (see walkKeys).
	keyCursors sync.Map
	// noKeyless: the key-limited queues whose claims skip the jobs
	// without a key for now (see driver.QueueSkip), as long as a job
	// behind the claim cursor waits (cursorFor, see claimCursor).
	// claim_select_nokey reads the claim index in claim order and skips
	// the keyed jobs it meets, all of them in a queue whose available
	// jobs all have a key.
	noKeyless driver.QueueSkip
	// weights: the key weights claims last decoded, per queue.
	weights driver.KeyWeightCache
	db      *sql.DB
	// main is db with its prepared statements; lease is the lease path's
	// own pool (heartbeat, complete, release, LeaseSlots): leaseConns
	// connections that claims, inserts, maintenance and the application's
	// handlers never hold, so renewing or ending a lease never waits for
	// a pooled connection.
	main, lease *stmtPool
	prefix      string
	q           queries
	migs        []sqlq.Migration

	serverVersion string
	mariaDB       bool
	maxPacket     int
	maxArgs       int
	autoincStep   int64
	isoVar        string
	claimMethod   string
	skipLocked    bool // the server supports SKIP LOCKED (Rescue, Promote)
	jsonTable     bool // the server has JSON_TABLE; else UNION ALL sources
	// galera: the server is a Galera node (wsrep_on): reads that follow
	// writes made through other nodes are causal (causal_read), and so
	// are the lease path's acknowledgements (causal_ack),
	// migrations take a lock row instead of GET_LOCK, and multi-row
	// inserts return their ids (returning, on MariaDB 10.5+) or insert
	// one row per statement.
	galera    bool
	returning bool

	deadlockRetries atomic.Int64
	lockTimeouts    atomic.Int64
	claimConflicts  atomic.Int64
	contendedUntil  atomic.Int64 // unix nanoseconds; see claimOptimistic

	// bg tracks the goroutines the driver runs beside its callers (claim
	// probes, see claimCursor), which Close stops and waits for.
	bg struct {
		mu     sync.Mutex
		closed bool
		ctx    context.Context
		stop   context.CancelFunc
		wg     sync.WaitGroup
	}

	// claimStep, when set (by tests), is called by optimistic claims
	// after each window read ("window") and after each UPDATE that took
	// rows ("taken").
	claimStep func(step string)
}

var _ driver.Driver = (*Driver)(nil)

// Open connects to the server named by dsn, of the form
// mysql://user:pass@host:port/db?params (a "socket" parameter selects a
// Unix socket instead of host:port; other parameters are passed to
// go-sql-driver/mysql). It reads the server's version and
// max_allowed_packet and chooses the claim strategy.
func Open(ctx context.Context, dsn string, opts driver.Options) (*Driver, error) {
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	cfg, err := urlConfig(dsn, forced)
	if err != nil {
		return nil, fmt.Errorf("conveyor/mysql: open: %w", err)
	}
	return New(ctx, cfg, opts)
}

// New opens conveyor's pool on the server an application's go-sql-driver
// configuration names (user, password, address, database, TLS and other
// connection settings are kept). Conveyor decides its own session
// settings on a copy (UTC times, READ COMMITTED, strict sql_mode, found
// rows, utf8mb4): they are per connection, so conveyor's statements run
// on connections of its own, opts.PoolSize of them (default 16) plus two
// for the lease path. A *sql.Tx of the application's handle on the same
// database works with InsertTx.
func New(ctx context.Context, appCfg *gomysql.Config, opts driver.Options) (*Driver, error) {
	if appCfg == nil {
		return nil, errors.New("conveyor/mysql: new: nil *mysql.Config")
	}
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	cfg := appCfg.Clone()
	for _, k := range forced {
		delete(cfg.Params, k)
	}
	forceSettings(cfg)
	q, err := loadQueries(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("conveyor/mysql: open: %w", err)
	}

	// Probe the server with one connection: version, packet size and the
	// name of the isolation variable (transaction_isolation on MySQL 5.7.20+
	// and MariaDB 11.1+, tx_isolation before).
	pc := cfg.Clone()
	pc.MaxAllowedPacket = 0
	pconn, err := gomysql.NewConnector(pc)
	if err != nil {
		return nil, fmt.Errorf("conveyor/mysql: open: %w", err)
	}
	pdb := sql.OpenDB(pconn)
	defer pdb.Close()
	pdb.SetMaxOpenConns(1)
	d := &Driver{prefix: opts.Prefix}
	d.noKeyless.For = cursorFor
	var packet int64
	if err := pdb.QueryRowContext(ctx, q.Probe).Scan(&d.serverVersion, &packet, &d.autoincStep); err != nil {
		return nil, fmt.Errorf("conveyor/mysql: open: probe server: %w", err)
	}
	d.isoVar = "transaction_isolation"
	var iso string
	if err := pdb.QueryRowContext(ctx, q.ProbeIsolation).Scan(&iso); err != nil {
		if myErrno(err) != errUnknownVariable {
			return nil, fmt.Errorf("conveyor/mysql: open: probe server: %w", err)
		}
		d.isoVar = "tx_isolation"
	}
	// Fence epochs name the server by @@server_id, or 0 on every node of
	// a Galera cluster (one logical primary); see fence_floor.
	// Galera is detected the same way (see probe_wsrep).
	server := "@@server_id"
	var wsrep sql.NullString
	if err := pdb.QueryRowContext(ctx, q.ProbeWsrep).Scan(&wsrep); err == nil {
		server = "IF(@@wsrep_on, 0, @@server_id)"
	} else if myErrno(err) != errUnknownVariable {
		return nil, fmt.Errorf("conveyor/mysql: open: probe server: %w", err)
	}
	if d.autoincStep < 1 {
		d.autoincStep = 1
	}
	d.galera = wsrep.String == "1" || strings.EqualFold(wsrep.String, "ON")
	d.maxPacket = int(packet)
	d.maxArgs = maxArgsFor(d.maxPacket)

	ver := parseVersion(d.serverVersion)
	d.mariaDB = strings.Contains(strings.ToLower(d.serverVersion), "mariadb")
	if d.mariaDB {
		d.skipLocked = !ver.less(10, 6, 0)
		d.jsonTable = !ver.less(10, 6, 0)
	} else {
		d.skipLocked = !ver.less(8, 0, 1)
		d.jsonTable = !ver.less(8, 0, 4)
	}
	switch opts.ClaimStrategy {
	case "":
		d.claimMethod = ClaimOptimistic
		if d.skipLocked {
			d.claimMethod = ClaimSkipLocked
		}
	case "skip-locked":
		if !d.skipLocked {
			return nil, fmt.Errorf("conveyor/mysql: open: claim strategy skip-locked needs MySQL 8.0.1+ or MariaDB 10.6+, server is %s", d.serverVersion)
		}
		d.claimMethod = ClaimSkipLocked
	case "optimistic":
		d.claimMethod = ClaimOptimistic
	default:
		return nil, fmt.Errorf("conveyor/mysql: open: unknown claim strategy %q (want \"\", \"skip-locked\" or \"optimistic\")", opts.ClaimStrategy)
	}

	if d.galera {
		d.returning = d.mariaDB && !ver.less(10, 5, 0)
		// Reads that an application expects to see writes made through
		// any node (see causal_read), and the read of the queues' pauses
		// before an insert claims (a pause made through another node must
		// stop it).
		for _, r := range []*string{&q.GetJob, &q.GetResult, &q.GetBatch, &q.BatchMembers, &q.ReadyBatches, &q.ListJobs, &q.ListJobsDesc, &q.Stats, &q.Overview,
			&q.PausedQueues, &q.QueueLimits, &q.LimitUsage, &q.Schedules, &q.Processes, &q.MigrationsMax, &q.InsertClaimState} {
			*r = q.CausalRead + " " + *r
		}
		// Acknowledgements that may reach a node before the claim they
		// acknowledge, the changes of one job by id (Cancel, Discard,
		// Retry) that may reach it before the job or its last change, and
		// the rescue's giving back of an expired block, which must see
		// every claim of its owner's (see causal_ack).
		for _, r := range []*string{&q.Complete, &q.CompleteWithErrors, &q.SlotHolders, &q.Heartbeat, &q.Release, &q.FenceCheck, &q.Finalize, &q.Retry, &q.CompleteOne, &q.BlockFree} {
			*r = q.CausalAck + " " + *r
		}
	}

	skip := ""
	if d.skipLocked {
		skip = "SKIP LOCKED"
	}
	intx := ""
	if d.galera {
		// The guard of the writes in transactions (see "Transactions on
		// Galera" in queries.sql).
		intx = " AND @@in_transaction = 1"
	}
	sqlq.Rewrite(&q, strings.NewReplacer("{skip}", skip, "{iso}", d.isoVar, "{server}", server, "{intx}", intx).Replace)
	d.q = q
	d.migs = sqlq.Migrations(sqlFiles, "migrations", opts.Prefix)

	cfg.MaxAllowedPacket = d.maxPacket
	cfg.Params[d.isoVar] = "'READ-COMMITTED'"
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("conveyor/mysql: open: %w", err)
	}
	d.db = sql.OpenDB(conn)
	pool := opts.PoolSize
	if pool <= 0 {
		pool = 16
	}
	d.db.SetMaxOpenConns(pool)
	d.db.SetMaxIdleConns(pool)
	d.db.SetConnMaxIdleTime(5 * time.Minute)
	d.db.SetConnMaxLifetime(time.Hour)
	if err := d.db.PingContext(ctx); err != nil {
		d.db.Close()
		return nil, fmt.Errorf("conveyor/mysql: open: %w", err)
	}
	d.main = newStmtPool(d.db)
	ldb := sql.OpenDB(conn)
	ldb.SetMaxOpenConns(leaseConns)
	ldb.SetMaxIdleConns(leaseConns)
	ldb.SetConnMaxIdleTime(5 * time.Minute)
	ldb.SetConnMaxLifetime(time.Hour)
	d.lease = newStmtPool(ldb)
	return d, nil
}

// leaseConns is the size of the lease path's pool: the heartbeat loop,
// the completer and the leases of slot blocks (LeaseSlots) each hold at
// most one connection at a time.
const leaseConns = 3

// URLConfig converts mysql://user:pass@host:port/db?params (a "socket"
// parameter selects a unix socket) into a go-sql-driver configuration,
// leaving session settings as the DSN gives them. The bench uses it to
// open its own connections at the server's defaults.
func URLConfig(dsn string) (*gomysql.Config, error) {
	return urlConfig(dsn, nil)
}

// forced are the settings conveyor decides; a DSN cannot override them.
var forced = []string{"parseTime", "loc", "charset", "collation", "interpolateParams", "multiStatements", "clientFoundRows", "maxAllowedPacket", "time_zone", "sql_mode", "transaction_isolation", "tx_isolation"}

// parseDSN is URLConfig with the settings conveyor relies on forced.
func parseDSN(dsn string) (*gomysql.Config, error) {
	cfg, err := urlConfig(dsn, forced)
	if err != nil {
		return nil, err
	}
	forceSettings(cfg)
	return cfg, nil
}

// forceSettings sets on cfg the session settings conveyor relies on.
func forceSettings(cfg *gomysql.Config) {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.Collation = "utf8mb4_general_ci"
	cfg.InterpolateParams = false
	cfg.MultiStatements = false
	cfg.ClientFoundRows = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Params["sql_mode"] = "'" + sqlMode + "'"
	if _, ok := cfg.Params["innodb_lock_wait_timeout"]; !ok {
		cfg.Params["innodb_lock_wait_timeout"] = lockWaitTimeout
	}
}

// urlConfig parses the URL form, dropping the parameters named in drop.
func urlConfig(dsn string, drop []string) (*gomysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad DSN: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, fmt.Errorf("bad DSN: scheme %q, want mysql://user:pass@host:port/db", u.Scheme)
	}
	base := gomysql.NewConfig()
	if u.User != nil {
		base.User = u.User.Username()
		base.Passwd, _ = u.User.Password()
	}
	base.Net = "tcp"
	base.Addr = u.Host
	if base.Addr == "" {
		base.Addr = "127.0.0.1:3306"
	} else if _, _, err := net.SplitHostPort(base.Addr); err != nil {
		base.Addr = net.JoinHostPort(strings.Trim(u.Host, "[]"), "3306")
	}
	base.DBName = strings.TrimPrefix(u.Path, "/")
	if base.DBName == "" {
		return nil, errors.New("bad DSN: no database name")
	}
	params := u.Query()
	if s := params.Get("socket"); s != "" {
		base.Net = "unix"
		base.Addr = s
	}
	params.Del("socket")
	for _, k := range drop {
		params.Del(k)
	}
	cfg := base
	if len(params) > 0 {
		// Let go-sql-driver interpret its own parameters (tls, timeouts,
		// ...); unknown ones become session variables set at connect.
		cfg, err = gomysql.ParseDSN(base.FormatDSN() + "?" + params.Encode())
		if err != nil {
			return nil, fmt.Errorf("bad DSN parameters: %w", err)
		}
	}
	return cfg, nil
}

// maxArgsFor leaves headroom in max_allowed_packet for the rest of the row
// and the protocol.
func maxArgsFor(packet int) int {
	head := max(64<<10, packet/16)
	return max(packet-head, 1024)
}

type version [3]int

func parseVersion(s string) version {
	var v version
	s, _, _ = strings.Cut(s, "-")
	for i, p := range strings.SplitN(s, ".", 3) {
		n, _ := strconv.Atoi(strings.TrimFunc(p, func(r rune) bool { return r < '0' || r > '9' }))
		v[i] = n
	}
	return v
}

func (v version) less(a, b, c int) bool {
	o := version{a, b, c}
	for i := range v {
		if v[i] != o[i] {
			return v[i] < o[i]
		}
	}
	return false
}

// DB returns the driver's connection pool, so that tools such as the
// benchmark can run their own SQL against the same server and settings.
func (d *Driver) DB() *sql.DB { return d.db }

// Name returns "mysql".
func (d *Driver) Name() string { return "mysql" }

// Capabilities reports no push channel and the largest args the server
// accepts (derived from max_allowed_packet). The claim method is in
// ServerInfo.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Listen:       false,
		MaxArgsBytes: d.maxArgs,
	}
}

// ServerInfo reports the server version and the settings that decide
// durability and throughput.
func (d *Driver) ServerInfo(ctx context.Context) (map[string]string, error) {
	var ver, flush, syncBinlog, iso, logBin, packet, autoinc sql.NullString
	if err := d.db.QueryRowContext(ctx, d.q.ServerInfo).Scan(&ver, &flush, &syncBinlog, &iso, &logBin, &packet, &autoinc); err != nil {
		return nil, d.wrap("server info", err)
	}
	flavor := "mysql"
	if d.mariaDB {
		flavor = "mariadb"
	}
	return map[string]string{
		"backend":                        "mysql",
		"flavor":                         flavor,
		"server_version":                 ver.String,
		"innodb_flush_log_at_trx_commit": flush.String,
		"sync_binlog":                    syncBinlog.String,
		"log_bin":                        logBin.String,
		"transaction_isolation":          iso.String,
		"max_allowed_packet":             packet.String,
		"innodb_autoinc_lock_mode":       autoinc.String,
		"claim_method":                   d.claimMethod,
		"galera":                         strconv.FormatBool(d.galera),
	}, nil
}

// Counters returns the retries and conflicts this driver has absorbed:
// deadlock_retries (error 1213), lock_timeouts (error 1205) and
// claim_conflicts (optimistic claims that lost the head of the queue to
// another claimer and fell back to a random pick).
func (d *Driver) Counters() map[string]int64 {
	return map[string]int64{
		"deadlock_retries": d.deadlockRetries.Load(),
		"lock_timeouts":    d.lockTimeouts.Load(),
		"claim_conflicts":  d.claimConflicts.Load(),
	}
}

// Listen returns nil: MySQL has no push channel and the engine polls.
func (d *Driver) Listen(ctx context.Context) (driver.Listener, error) { return nil, nil }

// Close closes the prepared statements and both connection pools.
func (d *Driver) Close() error {
	d.bg.mu.Lock()
	d.bg.closed = true
	if d.bg.stop != nil {
		d.bg.stop()
	}
	d.bg.mu.Unlock()
	d.bg.wg.Wait()
	return errors.Join(d.lease.close(), d.main.close())
}

// background returns a context for a goroutine of the driver's own,
// bounded by limit and ended by Close, which waits for it to call bgDone;
// ok is false once Close began.
func (d *Driver) background(limit time.Duration) (ctx context.Context, stop context.CancelFunc, ok bool) {
	d.bg.mu.Lock()
	defer d.bg.mu.Unlock()
	if d.bg.closed {
		return nil, nil, false
	}
	if d.bg.ctx == nil {
		d.bg.ctx, d.bg.stop = context.WithCancel(context.Background())
	}
	d.bg.wg.Add(1)
	ctx, stop = context.WithTimeout(d.bg.ctx, limit)
	return ctx, stop, true
}

// bgDone ends a goroutine started after background.
func (d *Driver) bgDone() { d.bg.wg.Done() }

func (d *Driver) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("conveyor/mysql: %s: %w", op, err)
}

// stmtPool is a connection pool with its prepared statements.
type stmtPool struct {
	db *sql.DB
	mu sync.Mutex
	// stmts are the pool-wide prepared statements; database/sql
	// re-prepares each lazily on every connection of the pool.
	stmts map[string]*sql.Stmt
	// preparing marks statements being prepared in the background.
	preparing map[string]bool
}

func newStmtPool(db *sql.DB) *stmtPool {
	return &stmtPool{db: db, stmts: map[string]*sql.Stmt{}, preparing: map[string]bool{}}
}

func (p *stmtPool) close() error {
	p.mu.Lock()
	for k, s := range p.stmts {
		s.Close()
		delete(p.stmts, k)
	}
	p.mu.Unlock()
	return p.db.Close()
}

// cachedStmt returns the prepared statement for query, or nil.
func (p *stmtPool) cachedStmt(query string) *sql.Stmt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stmts[query]
}

// prepareLater prepares query on the pool once a connection is free.
func (p *stmtPool) prepareLater(query string) {
	p.mu.Lock()
	if p.preparing[query] {
		p.mu.Unlock()
		return
	}
	p.preparing[query] = true
	p.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = p.stmt(ctx, query) // an error leaves it unprepared: tried again later
		p.mu.Lock()
		delete(p.preparing, query)
		p.mu.Unlock()
	}()
}

// stmt returns the pool-wide prepared statement for query, preparing it
// on first use. Never call it while holding a transaction.
func (p *stmtPool) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	p.mu.Lock()
	s, ok := p.stmts[query]
	p.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := p.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if old, ok := p.stmts[query]; ok {
		p.mu.Unlock()
		s.Close()
		return old, nil
	}
	p.stmts[query] = s
	p.mu.Unlock()
	return s, nil
}

// exec runs a statement on the pool or inside a transaction begun on it,
// using the prepared statement cache when cached is true.
func (p *stmtPool) exec(ctx context.Context, tx *sql.Tx, cached bool, query string, args ...any) (sql.Result, error) {
	if !cached {
		if tx != nil {
			return tx.ExecContext(ctx, query, args...)
		}
		return p.db.ExecContext(ctx, query, args...)
	}
	if tx != nil {
		if s := p.cachedStmt(query); s != nil {
			return tx.StmtContext(ctx, s).ExecContext(ctx, args...)
		}
		// Not prepared yet: preparing on the pool inside a transaction
		// would wait for a second connection, which may never come (the
		// transaction can hold the last one). Run it on the transaction's
		// connection and prepare it on the pool in the background.
		p.prepareLater(query)
		return tx.ExecContext(ctx, query, args...)
	}
	s, err := p.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.ExecContext(ctx, args...)
}

// query is exec for statements that return rows.
func (p *stmtPool) query(ctx context.Context, tx *sql.Tx, cached bool, query string, args ...any) (*sql.Rows, error) {
	if !cached {
		if tx != nil {
			return tx.QueryContext(ctx, query, args...)
		}
		return p.db.QueryContext(ctx, query, args...)
	}
	if tx != nil {
		if s := p.cachedStmt(query); s != nil {
			return tx.StmtContext(ctx, s).QueryContext(ctx, args...)
		}
		p.prepareLater(query) // see exec
		return tx.QueryContext(ctx, query, args...)
	}
	s, err := p.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(ctx, args...)
}

// stmt, exec and query on the main pool.
func (d *Driver) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	return d.main.stmt(ctx, query)
}

func (d *Driver) exec(ctx context.Context, tx *sql.Tx, cached bool, query string, args ...any) (sql.Result, error) {
	return d.main.exec(ctx, tx, cached, query, args...)
}

func (d *Driver) query(ctx context.Context, tx *sql.Tx, cached bool, query string, args ...any) (*sql.Rows, error) {
	return d.main.query(ctx, tx, cached, query, args...)
}

// myErrno returns the MySQL error number in err, or 0.
func myErrno(err error) uint16 {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// maxRetries bounds the retries of one operation; with the backoff cap it
// is minutes, far beyond any real deadlock storm, and ctx ends it sooner.
const maxRetries = 1000

// retry runs fn again while it fails with a deadlock, a lock wait
// timeout or errTxEnded, with jittered exponential backoff (1ms doubling to 100ms). Each
// statement retried is fenced or transactional, so running it again is
// safe. Other errors and the context's end are returned at once.
func (d *Driver) retry(ctx context.Context, op string, fn func() error) error {
	for i := 0; ; i++ {
		err := fn()
		if err == nil {
			return nil
		}
		switch myErrno(err) {
		case errDeadlock:
			d.deadlockRetries.Add(1)
		case 0:
			if !errors.Is(err, errTxEnded) {
				return d.wrap(op, err)
			}
			d.deadlockRetries.Add(1)
		case errLockWaitTimeout:
			d.lockTimeouts.Add(1)
		default:
			return d.wrap(op, err)
		}
		if i >= maxRetries {
			return d.wrap(op, fmt.Errorf("gave up after %d retries: %w", i, err))
		}
		back := time.Millisecond << min(i, 7)
		back = min(back, 100*time.Millisecond)
		back = back/2 + rand.N(back/2+1)
		t := time.NewTimer(back)
		select {
		case <-ctx.Done():
			t.Stop()
			return d.wrap(op, ctx.Err())
		case <-t.C:
		}
	}
}

// inTx runs fn in a READ COMMITTED transaction (the session default) on
// the main pool, retried as a whole on deadlocks and lock wait timeouts.
// An error before the commit, or the server's refusal of the commit, is
// marked driver.NotCommitted; a commit whose answer was lost is not.
func (d *Driver) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	return d.inTxOn(ctx, d.main, op, fn)
}

// inTxOn is inTx on pool p (the lease path's, for LeaseSlots).
func (d *Driver) inTxOn(ctx context.Context, p *stmtPool, op string, fn func(tx *sql.Tx) error) error {
	return d.retry(ctx, op, func() error {
		tx, err := p.db.BeginTx(ctx, nil)
		if err != nil {
			return driver.NotCommitted(err)
		}
		ferr := fn(tx)
		if d.galera && (ferr == nil || myErrno(ferr) == 0) {
			// Before the commit, and when a statement's result made fn
			// give up: was the transaction ended under it?
			if err := d.txOpen(ctx, tx); err != nil {
				_ = tx.Rollback()
				return driver.NotCommitted(err)
			}
		}
		if ferr != nil {
			_ = tx.Rollback()
			return driver.NotCommitted(ferr)
		}
		return d.refused(tx.Commit())
	})
}

// errTxEnded says that Galera ended a transaction before its COMMIT
// without telling any of its statements (see "Transactions on Galera" in
// queries.sql): nothing of it is committed, and it is run again whole.
var errTxEnded = errors.New("the cluster rolled the transaction back before its commit")

// txOpen fails with errTxEnded when tx is no longer open on the server.
func (d *Driver) txOpen(ctx context.Context, tx *sql.Tx) error {
	var open sql.NullInt64
	if err := tx.QueryRowContext(ctx, d.q.TxOpen).Scan(&open); err != nil {
		return err
	}
	if open.Int64 != 1 {
		return errTxEnded
	}
	return nil
}

// refused marks err, the error of a commit or of an autocommit statement,
// driver.NotCommitted when the write it ended certainly did not take
// effect: the server answered with an error (which rolls back an
// autocommit statement, or a commit), or the connection was found broken
// before anything was sent (driver.ErrBadConn). Anything else, such as a
// connection lost while waiting for the answer, may have committed.
//
// On Galera a commit replicates the write set to the cluster before the
// node answers, so some of the node's errors leave the outcome unknown:
// error 1180 (ER_ERROR_DURING_COMMIT) and 1047 (WSREP not ready, as when
// the node left the primary component meanwhile) may come after the rest
// of the cluster received the write set and committed it. Only a
// certification failure (1213) and the other statement errors, raised
// before the commit replicates anything, are certain refusals there.
func (d *Driver) refused(err error) error {
	if d.galera {
		switch myErrno(err) {
		case errErrorDuringCommit, errUnknownCom:
			return err
		}
	}
	var me *gomysql.MySQLError
	if errors.As(err, &me) || errors.Is(err, sqldriver.ErrBadConn) {
		return driver.NotCommitted(err)
	}
	return err
}

// bucket rounds n up to a power of two (exact above maxBucket).
func bucket(n int) int {
	if n > maxBucket {
		return n
	}
	b := 1
	for b < n {
		b <<= 1
	}
	return b
}

// placeholders returns "?, ?, ..." with n marks.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

// inList expands {ids} in query for n ids and returns the query,
// the padded argument list and whether it is worth caching.
func (d *Driver) inList(query string, ids []int64, extra ...any) (string, []any, bool) {
	b := bucket(len(ids))
	q := strings.Replace(query, "{ids}", placeholders(b), 1)
	args := make([]any, 0, len(extra)+b)
	args = append(args, extra...)
	for _, id := range ids {
		args = append(args, id)
	}
	for i := len(ids); i < b; i++ {
		args = append(args, ids[0])
	}
	return q, args, b <= maxBucket
}

// dbTime formats t for a DATETIME(6) parameter (UTC, microseconds), so the
// value does not depend on a connection's loc setting.
func dbTime(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.000000")
}

// micros converts a duration to whole microseconds for INTERVAL ...
// MICROSECOND.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }
