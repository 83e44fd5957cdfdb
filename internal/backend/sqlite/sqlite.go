// Package sqlite is conveyor's SQLite backend, built on modernc.org/sqlite
// (pure Go, no cgo).
//
// SQLite has one writer at a time, so the driver keeps one dedicated write
// connection (every write transaction is BEGIN IMMEDIATE: the write lock is
// taken up front, so there are no read-to-write upgrade deadlocks and no
// SQLITE_BUSY in the middle of a transaction) and a separate pool of
// read-only connections for admin reads. The database runs in WAL mode, so
// readers never block the writer nor the writer readers. Other processes
// may write the same file: their locks are waited for by busy_timeout, and
// an SQLITE_BUSY that still surfaces is retried inside the driver with
// short backoff (Counters()["busy_retries"]).
//
// Batches (insert, complete, heartbeat, release) are passed as one JSON
// text parameter and unpacked by json_each, so each batch is one statement
// whatever its size.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/sqlq"
)

//go:embed queries.sql migrations/*.sql
var sqlFS embed.FS

// busyTimeoutMS is how long SQLite itself waits for another connection's
// lock before reporting SQLITE_BUSY, on the read pool's connections.
const busyTimeoutMS = 10000

// writeBusyTimeoutMS is that wait on the driver's write connection (unless
// the DSN sets busy_timeout). Past it the write marks itself starved for
// other processes (see gate) and tries again at once, as many times as it
// takes, up to maxBusyRetry.
const writeBusyTimeoutMS = 20

// walSizeLimit is the size, in bytes, the checkpointer cuts the WAL file
// of a database the driver opened back to (unless the DSN sets
// journal_size_limit). While a reader holds a snapshot (a long read
// transaction, a backup), checkpoints cannot get past it and the WAL file
// grows with every write; nothing can bound that growth. Once the reader
// is gone and a checkpoint completes, the WAL starts over and the file is
// cut back to this size, instead of keeping every gigabyte the hold made
// it grow to. A variable, so that a test can make it small.
var walSizeLimit int64 = 64 << 20

// maxBusyRetry bounds how long the driver keeps retrying a statement that
// SQLite reported busy (on top of busy_timeout per attempt), unless the
// context ends first.
const maxBusyRetry = 2 * time.Minute

// defaultReadPool is the size of the read pool when Options.PoolSize is 0.
const defaultReadPool = 4

// insertChunkBytes caps the JSON text of one insert statement; larger
// batches are split into several statements in one transaction. (A
// variable so that tests can exercise the split.)
var insertChunkBytes = 32 << 20

// bulkChunkRows is the number of rows per statement in BulkInsert.
const bulkChunkRows = 2000

// maxArgsBytes is the largest args the driver accepts in one row: SQLite's
// default SQLITE_MAX_LENGTH is 1e9 bytes per value, and args travel escaped
// inside a JSON string (up to 6 bytes per byte for control characters).
const maxArgsBytes = 100 << 20

// Driver is the SQLite backend. It is safe for concurrent use.
type Driver struct {
	path   string // file path, for messages
	prefix string
	sync   string // NORMAL, FULL or EXTRA

	w *sql.DB // the one write connection (BEGIN IMMEDIATE), or the application's handle
	// borrowed: w and r are the application's handle (New), not closed.
	borrowed bool
	lw       *sql.DB // the lease path's own write connection (busy_timeout 0)
	// cp checkpoints the WAL off the writers' path (checkpoint.go).
	cp *checkpointer
	r  *sql.DB // read-only pool for admin reads
	// gate orders this process's writers to the file, lease-path writes
	// first; dropGate lets go of it at Close.
	gate     *gate
	dropGate func()

	q          queries
	migrations []sqlq.Migration
	// stmts: the hot path's statements, prepared on w.
	stmts stmts
	// cursors: where the next keyed claim of each queue starts.
	cursors keyCursors
	// weights: the key weights claims last decoded, per queue.
	weights driver.KeyWeightCache
	// noKeyless: the key-limited queues whose claims skip the jobs
	// without a key for now (see driver.QueueSkip). claim_unkeyed walks
	// jobs_claim in claim order past the keyed jobs ahead of the first
	// job without a key: 20,000 index entries a claim behind one key of
	// 20,000 jobs, to find nothing.
	noKeyless driver.QueueSkip

	// shortBusy: the write connection waits writeBusyTimeoutMS in
	// SQLite's busy handler, so a busy write is tried again at once.
	shortBusy bool

	busyRetries   atomic.Int64
	lockTimeouts  atomic.Int64
	starvedWrites atomic.Int64
}

var (
	_ driver.Driver = (*Driver)(nil)
	// Its inserts claim the jobs an idle worker of this process can take.
	_ driver.InsertClaimer = (*Driver)(nil)
)

// Open opens (creating it if missing) the SQLite database named by dsn: a
// plain path ("./conveyor.db", "/tmp/x.db"), "sqlite:path",
// "sqlite://path", or a URI "file:path?...". Query parameters of
// modernc.org/sqlite may follow a "?" (busy_timeout, for one, may be
// overridden there); the journal mode (WAL), the synchronous mode
// (opts.Synchronous: NORMAL by default, FULL or EXTRA), the transaction
// locking and the locking mode are the driver's own and may not be given
// there. In-memory databases are refused: the driver's connections must
// share one file.
// opts.PoolSize sizes the read pool (default 4); writes always use one
// connection. Open does not migrate.
func Open(ctx context.Context, dsn string, opts driver.Options) (*Driver, error) {
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	syncMode, err := checkSynchronous(opts.Synchronous)
	if err != nil {
		return nil, err
	}
	target, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if err := target.checkDir(dsn); err != nil {
		return nil, err
	}
	q, err := loadQueries(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: open: %w", err)
	}
	base := target.base()
	pragmas := []string{"journal_mode(WAL)", "synchronous(" + syncMode + ")", "foreign_keys(0)"}
	// wal_autocheckpoint(0): no commit of the driver's runs a checkpoint;
	// the checkpointer does, off the writers' path (checkpoint.go).
	wpragmas := append(append([]string(nil), pragmas...), "cache_size(-65536)", "temp_store(MEMORY)", "wal_autocheckpoint(0)")
	if !target.hasBusyTimeout {
		// (The driver takes the first busy_timeout of a DSN.)
		pragmas = append(pragmas, "busy_timeout("+strconv.Itoa(busyTimeoutMS)+")")
		wpragmas = append(wpragmas, "busy_timeout("+strconv.Itoa(writeBusyTimeoutMS)+")")
	}
	// The WAL's size limit: a DSN's journal_size_limit applies as SQLite
	// applies it, in the first commit after the WAL starts over;
	// otherwise the checkpointer cuts the file back to walSizeLimit in
	// steps, off the writers' path.
	cpLimit := int64(-1)
	if !target.hasSizeLimit {
		cpLimit = walSizeLimit
	}
	wdsn := withParams(base, wpragmas, "_txlock=immediate")
	rdsn := withParams(base, append(pragmas, "query_only(1)"))
	// The checkpointer's connection: the writers' synchronous mode (a
	// checkpoint syncs what it copies as they would) and no busy handler,
	// so that its checkpoints never wait for a lock.
	cdsn := withParams(base, []string{"synchronous(" + syncMode + ")", "busy_timeout(0)", "foreign_keys(0)"})

	d := &Driver{
		path:       target.path,
		prefix:     opts.Prefix,
		sync:       syncMode,
		q:          q,
		migrations: sqlq.Migrations(sqlFS, "migrations", opts.Prefix),
	}
	d.shortBusy = !target.hasBusyTimeout
	d.gate, d.dropGate = gateFor(target.path)
	d.w, err = sql.Open("sqlite", wdsn)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: open %s: %w", target.path, err)
	}
	// One writer: SQLite serialises writers anyway, and queueing them here
	// (in Go) instead of on the file lock costs nothing and never spins.
	d.w.SetMaxOpenConns(1)
	d.stmts.db = d.w
	d.w.SetMaxIdleConns(1)
	d.w.SetConnMaxLifetime(0)
	d.w.SetConnMaxIdleTime(0)

	d.lw, err = sql.Open("sqlite", wdsn)
	if err != nil {
		d.w.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s: %w", target.path, err)
	}
	d.lw.SetMaxOpenConns(1)
	d.lw.SetMaxIdleConns(1)
	d.lw.SetConnMaxLifetime(0)
	d.lw.SetConnMaxIdleTime(0)

	d.r, err = sql.Open("sqlite", rdsn)
	if err != nil {
		d.w.Close()
		d.lw.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s: %w", target.path, err)
	}
	n := opts.PoolSize
	if n <= 0 {
		n = defaultReadPool
	}
	d.r.SetMaxOpenConns(n)
	d.r.SetMaxIdleConns(n)

	// Connect now so that a bad path or a locked file fails here. The
	// write connection goes first: it creates the file and switches it to
	// WAL.
	if err := d.retry(ctx, func() error { return d.w.PingContext(ctx) }); err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s: %w", target.path, err)
	}
	if err := d.r.PingContext(ctx); err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s (read pool): %w", target.path, err)
	}
	var mode string
	if err := d.w.QueryRowContext(ctx, d.q.PragmaJournalMode).Scan(&mode); err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s: %w", target.path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s: journal_mode is %q, not WAL (is the file on a filesystem without shared memory support?)", target.path, mode)
	}
	d.cp, err = startCheckpointer(cdsn, d.gate.file, cpLimit, d.turn, &d.q, checkpointInterval)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: open %s (checkpointer): %w", target.path, err)
	}
	return d, nil
}

// New returns a driver on the application's own handle to a SQLite file,
// which it does not close. Conveyor's claims, inserts and maintenance run
// on that handle, one at a time behind the gate, so a transaction the
// application begins on it works with InsertTx and no second pool of
// writers competes with the application's. The lease path (heartbeat,
// complete, release) gets one connection of its own, so that renewals
// never wait for a connection the application holds. The database must
// be a file in WAL mode (journal_mode is persistent: open the handle once
// with _pragma=journal_mode(WAL)); its synchronous mode and busy timeout
// are the application's, set in its DSN. opts.Synchronous must be empty.
func New(ctx context.Context, db *sql.DB, opts driver.Options) (*Driver, error) {
	if db == nil {
		return nil, errors.New("conveyor/sqlite: new: nil *sql.DB")
	}
	if err := sqlq.CheckPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	if opts.Synchronous != "" {
		return nil, errors.New("conveyor/sqlite: new: the synchronous mode of the application's handle is the application's: set it in its DSN (_pragma=synchronous(FULL)), not in conveyor's Config")
	}
	q, err := loadQueries(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: new: %w", err)
	}
	var path, mode string
	var syncN int
	if err := db.QueryRowContext(ctx, q.MainFile).Scan(&path); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: new: %w", err)
	}
	if path == "" {
		return nil, errors.New("conveyor/sqlite: new: the handle is on an in-memory or temporary database: conveyor's connections must share one file")
	}
	if err := db.QueryRowContext(ctx, q.PragmaJournalMode).Scan(&mode); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: new: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return nil, fmt.Errorf("conveyor/sqlite: new: %s is in journal_mode %q; conveyor needs WAL: open the handle with _pragma=journal_mode(WAL)", path, mode)
	}
	if err := db.QueryRowContext(ctx, q.PragmaSynchronous).Scan(&syncN); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: new: %w", err)
	}
	syncMode := map[int]string{0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[syncN]
	// The WAL's size limit is the application's too: the lease
	// connection takes the handle's (SQLite's default -1, none, unless
	// its DSN sets one), so that whichever connection starts the WAL over
	// truncates it the same way.
	var sizeLimit int64
	if err := db.QueryRowContext(ctx, q.PragmaJournalSizeLimit).Scan(&sizeLimit); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: new: %w", err)
	}
	d := &Driver{
		path:       path,
		prefix:     opts.Prefix,
		sync:       syncMode,
		q:          q,
		migrations: sqlq.Migrations(sqlFS, "migrations", opts.Prefix),
		w:          db,
		r:          db,
		borrowed:   true,
	}
	d.stmts.db = db
	d.gate, d.dropGate = gateFor(path)
	lw, err := sql.Open("sqlite", withParams((&url.URL{Scheme: "file", OmitHost: true, Path: path}).String()+"?",
		[]string{"busy_timeout(0)", "synchronous(" + syncMode + ")", "foreign_keys(0)",
			"journal_size_limit(" + strconv.FormatInt(sizeLimit, 10) + ")", "wal_autocheckpoint(0)"}, "_txlock=immediate"))
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: new: lease connection: %w", err)
	}
	lw.SetMaxOpenConns(1)
	lw.SetMaxIdleConns(1)
	lw.SetConnMaxLifetime(0)
	lw.SetConnMaxIdleTime(0)
	d.lw = lw
	if err := lw.PingContext(ctx); err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: new: lease connection: %w", err)
	}
	// The checkpointer, with the handle's synchronous mode. The handle's
	// own connections keep the application's wal_autocheckpoint: with
	// _pragma=wal_autocheckpoint(0) in its DSN, no commit on it (the
	// application's nor conveyor's) runs a checkpoint.
	d.cp, err = startCheckpointer(withParams((&url.URL{Scheme: "file", OmitHost: true, Path: path}).String()+"?",
		[]string{"busy_timeout(0)", "synchronous(" + syncMode + ")", "foreign_keys(0)"}), path, -1, d.turn, &d.q, checkpointInterval)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("conveyor/sqlite: new: checkpointer: %w", err)
	}
	return d, nil
}

func checkSynchronous(s string) (string, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "", "NORMAL":
		return "NORMAL", nil
	case "FULL":
		return "FULL", nil
	case "EXTRA":
		return "EXTRA", nil
	}
	return "", fmt.Errorf("conveyor/sqlite: invalid synchronous mode %q: want NORMAL (durable against a process crash), FULL or EXTRA (also against power loss)", s)
}

// dsnTarget is a parsed DSN.
type dsnTarget struct {
	uri            bool   // file: URI form
	path           string // the file path (for messages)
	name           string // what goes before the query: a path or a file: URI
	query          url.Values
	hasBusyTimeout bool
	hasSizeLimit   bool // the DSN sets journal_size_limit itself
}

var schemeRE = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*):`)

// parseDSN accepts a plain path, sqlite:path, sqlite://path or file:path?...
func parseDSN(dsn string) (*dsnTarget, error) {
	orig := dsn
	switch {
	case strings.HasPrefix(dsn, "sqlite://"):
		dsn = dsn[len("sqlite://"):]
	case strings.HasPrefix(dsn, "sqlite:"):
		dsn = dsn[len("sqlite:"):]
	}
	t := &dsnTarget{}
	if strings.HasPrefix(dsn, "file:") {
		t.uri = true
	} else if m := schemeRE.FindStringSubmatch(dsn); m != nil && len(m[1]) > 1 {
		// (A one-letter "scheme" is a Windows drive letter.)
		return nil, fmt.Errorf("conveyor/sqlite: unsupported DSN %q: scheme %q is not SQLite; use a file path, sqlite:path, sqlite://path or file:path", orig, m[1])
	}
	name, rawq, _ := strings.Cut(dsn, "?")
	q, err := url.ParseQuery(rawq)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: DSN %q: bad query: %w", orig, err)
	}
	for _, k := range []string{"_txlock", "_journal_mode", "_journal", "_synchronous", "_sync", "_query_only"} {
		if q.Has(k) {
			return nil, fmt.Errorf("conveyor/sqlite: DSN %q: parameter %s is set by the driver (use Options.Synchronous for the synchronous mode)", orig, k)
		}
	}
	for _, p := range q["_pragma"] {
		// (A pragma may name the schema: main.journal_mode.)
		lp := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(p)), "main.")
		for _, own := range []string{"journal_mode", "synchronous", "query_only"} {
			if strings.HasPrefix(lp, own) {
				return nil, fmt.Errorf("conveyor/sqlite: DSN %q: _pragma=%s is set by the driver (use Options.Synchronous for the synchronous mode)", orig, p)
			}
		}
		if strings.HasPrefix(lp, "locking_mode") {
			// The driver's connections (writer, lease path, readers,
			// checkpointer) share the file: one holding it exclusively
			// would lock the others out, and every write would wait.
			return nil, fmt.Errorf("conveyor/sqlite: DSN %q: _pragma=%s is not supported: locking_mode is the driver's, whose connections share the file", orig, p)
		}
		if strings.HasPrefix(lp, "busy_timeout") {
			t.hasBusyTimeout = true
		}
		if strings.HasPrefix(lp, "journal_size_limit") {
			t.hasSizeLimit = true
		}
	}
	if q.Has("_busy_timeout") || q.Has("_timeout") {
		t.hasBusyTimeout = true
	}
	t.query = q
	t.name = name
	t.path = name
	if t.uri {
		t.path = strings.TrimPrefix(name, "file:")
		if strings.HasPrefix(t.path, "//") { // file://host/path or file:///path
			rest := t.path[2:]
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				t.path = rest[i:]
			}
		}
		if p, err := url.PathUnescape(t.path); err == nil {
			t.path = p
		}
	}
	if t.path == "" || t.path == ":memory:" || q.Get("mode") == "memory" || q.Has("vfs") && q.Get("vfs") == "memdb" {
		return nil, fmt.Errorf("conveyor/sqlite: DSN %q: in-memory databases are not supported: conveyor's connections must share one file", orig)
	}
	return t, nil
}

// FilePath returns the database file a SQLite DSN names (a plain path,
// sqlite:path, sqlite://path or file:path?...), as Open reads it, without
// touching the file system.
func FilePath(dsn string) (string, error) {
	t, err := parseDSN(dsn)
	if err != nil {
		return "", err
	}
	return t.path, nil
}

// checkDir reports a DSN whose file's directory does not exist.
func (t *dsnTarget) checkDir(orig string) error {
	if dir := filepath.Dir(t.path); dir != "" {
		if st, err := os.Stat(dir); err != nil {
			return fmt.Errorf("conveyor/sqlite: DSN %q: directory of the database: %w", orig, err)
		} else if !st.IsDir() {
			return fmt.Errorf("conveyor/sqlite: DSN %q: %s is not a directory", orig, dir)
		}
	}
	return nil
}

// base is the DSN the driver's own parameters are appended to.
func (t *dsnTarget) base() string {
	if len(t.query) == 0 {
		return t.name + "?"
	}
	return t.name + "?" + t.query.Encode() + "&"
}

func withParams(base string, pragmas []string, extra ...string) string {
	var b strings.Builder
	b.WriteString(base)
	for i, p := range pragmas {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString("_pragma=")
		b.WriteString(url.QueryEscape(p))
	}
	for _, e := range extra {
		b.WriteByte('&')
		b.WriteString(e)
	}
	return b.String()
}

// DB returns the driver's write handle: a pool of exactly one connection
// whose transactions begin IMMEDIATE. Callers may use it for their own SQL
// (benchmarks, InsertTx transactions); a transaction held open on it blocks
// every other write of this driver until it ends.
func (d *Driver) DB() *sql.DB { return d.w }

// Name returns "sqlite".
func (d *Driver) Name() string { return "sqlite" }

// Capabilities reports no push notifications and the largest args a job
// may carry.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Listen:       false,
		MaxArgsBytes: maxArgsBytes,
		OneWriter:    true,
		// InsertClaiming checks and takes key slots (insertClaimingKeyed).
		KeyedInsertClaim: true,
	}
}

// ServerInfo reports the SQLite version and the settings that decide
// durability and throughput, as seen by the write connection.
func (d *Driver) ServerInfo(ctx context.Context) (map[string]string, error) {
	conn, err := d.w.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	defer conn.Close()
	var version, journal string
	var syncN, busy, autoCkpt int
	if err := conn.QueryRowContext(ctx, d.q.ServerInfo).Scan(&version); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	if err := conn.QueryRowContext(ctx, d.q.PragmaJournalMode).Scan(&journal); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	if err := conn.QueryRowContext(ctx, d.q.PragmaSynchronous).Scan(&syncN); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	if err := conn.QueryRowContext(ctx, d.q.PragmaBusyTimeout).Scan(&busy); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	if err := conn.QueryRowContext(ctx, d.q.PragmaWALAutocheckpoint).Scan(&autoCkpt); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: server info: %w", err)
	}
	syncName := map[int]string{0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[syncN]
	if syncName == "" {
		syncName = strconv.Itoa(syncN)
	}
	return map[string]string{
		"backend":        "sqlite",
		"server_version": version,
		"sqlite_version": version,
		"driver":         "modernc.org/sqlite (pure Go)",
		"path":           d.path,
		"journal_mode":   journal,
		"synchronous":    syncName,
		"busy_timeout":   strconv.Itoa(busy) + "ms",
		"writers":        d.writers(),
		"lease_priority": d.leasePriority(),
		"checkpoints":    checkpoints(d.cp.interval, autoCkpt),
	}, nil
}

// writers says which handle conveyor's ordinary writes use.
func (d *Driver) writers() string {
	if d.borrowed {
		return "the application's handle, one write at a time"
	}
	return "1 connection, BEGIN IMMEDIATE"
}

// checkpoints says where the WAL is checkpointed, given the checkpointer's
// interval and the wal_autocheckpoint of the connection conveyor's
// ordinary writes use.
func checkpoints(interval time.Duration, autoCkpt int) string {
	s := "PASSIVE every " + interval.String() + " on a connection of conveyor's own"
	if autoCkpt > 0 {
		return s + "; also in commits on the application's handle (wal_autocheckpoint " + strconv.Itoa(autoCkpt) + ")"
	}
	return s + "; never in a commit"
}

// Path returns the database file.
func (d *Driver) Path() string { return d.path }

// leasePriority says how far lease renewals go ahead of other writes.
func (d *Driver) leasePriority() string {
	if d.gate.side == nil {
		return "this process only (" + d.gate.sideErr.Error() + ")"
	}
	return "every process (side file " + d.gate.file + intentSuffix + ")"
}

// Counters returns busy_retries (statements retried after SQLITE_BUSY or
// SQLITE_LOCKED), starved_writes (ordinary writes that waited for the
// lock longer than writeBusyTimeoutMS and had other processes' ordinary
// writes yield to them) and lock_timeouts (operations that gave up after
// retrying for maxBusyRetry).
func (d *Driver) Counters() map[string]int64 {
	return map[string]int64{
		"busy_retries":   d.busyRetries.Load(),
		"starved_writes": d.starvedWrites.Load(),
		"lock_timeouts":  d.lockTimeouts.Load(),
	}
}

// Listen returns (nil, nil): SQLite has no push channel.
func (d *Driver) Listen(ctx context.Context) (driver.Listener, error) { return nil, nil }

// Close closes the driver's own connections; an application's handle
// given to New stays open.
func (d *Driver) Close() error {
	var errs []error
	if d.cp != nil {
		// First: the loop takes the gate for a RESTART or a cut.
		errs = append(errs, d.cp.close())
	}
	if d.dropGate != nil {
		d.dropGate()
	}
	errs = append(errs, d.stmts.close())
	if d.lw != nil {
		errs = append(errs, d.lw.Close())
	}
	if d.borrowed {
		return errors.Join(errs...)
	}
	if d.r != nil {
		errs = append(errs, d.r.Close())
	}
	if d.w != nil {
		errs = append(errs, d.w.Close())
	}
	return errors.Join(errs...)
}

// isUniqueViolation reports whether err is SQLite refusing a second holder
// of a unique index's key (SQLITE_CONSTRAINT_UNIQUE).
func isUniqueViolation(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

// isBusy reports whether err is SQLite telling us another connection holds
// a lock (SQLITE_BUSY, SQLITE_LOCKED and their extended codes).
func isBusy(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		c := se.Code() & 0xff
		return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
	}
	return false
}

// retry runs fn on the write connection once the gate lets it (after
// every pending lease-path write of this process), retrying it while
// SQLite reports busy. Before each try it yields to heartbeats pending in
// other processes.
func (d *Driver) retry(ctx context.Context, fn func() error) error {
	return d.write(ctx, false, fn)
}

// write is retry, with first putting fn ahead of the writes already
// waiting for the write connection.
func (d *Driver) write(ctx context.Context, first bool, fn func() error) error {
	if err := d.gate.acquire(ctx, first); err != nil {
		return err
	}
	defer d.gate.release()
	defer d.gate.unstarve()
	starved := false
	return d.busyRetry(ctx, func() error {
		d.gate.yield(ctx, starved)
		if err := d.gate.begin(ctx); err != nil {
			return err
		}
		defer d.gate.end()
		return fn()
	}, func() {
		if !starved {
			starved = true
			d.starvedWrites.Add(1)
			d.gate.starve()
		}
	})
}

// turn runs fn once in this process's turn at the write lock, as an
// ordinary write does (after every pending lease-path write of this
// process and the writes queued before it, having yielded to heartbeats
// pending in other processes), without retrying it. The checkpointer
// takes the write lock this way, so that this process's writers wait for
// it in the gate's queue rather than in SQLite's busy handler.
func (d *Driver) turn(ctx context.Context, fn func() error) error {
	if err := d.gate.acquire(ctx, false); err != nil {
		return err
	}
	defer d.gate.release()
	d.gate.yield(ctx, false)
	if err := d.gate.begin(ctx); err != nil {
		return err
	}
	defer d.gate.end()
	return fn()
}

// leaseRetry runs fn for the lease path (heartbeat, complete, release) on
// the lease path's own write connection. While it is pending no ordinary
// write of this process starts, and while any connection holds the write
// lock it polls every fraction of a millisecond (busy_timeout 0) instead
// of SQLite's busy handler, whose sleeps grow to 100ms and would let a
// busy neighbour win the lock again and again until the lease expires.
// A heartbeat (across) also holds back the writes of other processes
// while it is pending (see gate). fn must run its statement on conn.
func (d *Driver) leaseRetry(ctx context.Context, across bool, fn func(conn *sql.Conn) error) error {
	d.gate.leaseBegin(across)
	defer d.gate.leaseEnd(across)
	if err := d.gate.waitOrdinary(ctx); err != nil {
		return err
	}
	conn, err := d.lw.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		return err
	}
	for {
		err := fn(conn)
		if err == nil || !isBusy(err) {
			return err
		}
		d.busyRetries.Add(1)
		if perr := pollPause(ctx); perr != nil {
			return fmt.Errorf("%w (while the database was locked: %v)", perr, err)
		}
	}
}

// busyRetry runs fn, retrying it while SQLite reports busy (another
// process holds the write lock), at once when the write connection's own
// wait is short (shortBusy) and otherwise with short jittered backoff;
// onBusy (if not nil) runs before each retry. fn must be safe to repeat
// after a busy failure: every caller runs one autocommit statement or one
// transaction, which SQLite has rolled back when it reports busy.
func (d *Driver) busyRetry(ctx context.Context, fn func() error, onBusy func()) error {
	err := fn()
	if err == nil || !isBusy(err) {
		return err
	}
	start := time.Now()
	for try := 0; ; try++ {
		if time.Since(start) > maxBusyRetry {
			d.lockTimeouts.Add(1)
			return fmt.Errorf("database stayed locked for %s: %w", time.Since(start).Round(time.Second), err)
		}
		d.busyRetries.Add(1)
		if onBusy != nil {
			onBusy()
		}
		// SQLite's busy handler waited already; a busy reported without
		// that wait (a lock SQLite does not wait for) is tried again
		// after a pause all the same.
		backoff := pollInterval()
		if !d.shortBusy {
			backoff = time.Millisecond << min(try, 6) // 1ms .. 64ms
			backoff += rand.N(backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (while the database was locked: %v)", ctx.Err(), err)
		case <-t.C:
		}
		err = fn()
		if err == nil || !isBusy(err) {
			return err
		}
	}
}

// inTx runs fn in a BEGIN IMMEDIATE transaction on the write connection,
// retrying the whole transaction when SQLite reports busy. An error before
// the commit is marked driver.NotCommitted; the commit's own is not.
func (d *Driver) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return d.writeTx(ctx, false, fn)
}

// writeTx is inTx, with first putting the transaction ahead of the
// writes already waiting for the write connection (see write).
func (d *Driver) writeTx(ctx context.Context, first bool, fn func(tx *sql.Tx) error) error {
	return d.write(ctx, first, func() error {
		tx, err := d.w.BeginTx(ctx, nil)
		if err != nil {
			return driver.NotCommitted(err)
		}
		if err := fn(tx); err != nil {
			tx.Rollback()
			return driver.NotCommitted(err)
		}
		return tx.Commit()
	})
}

// us converts a duration to whole microseconds.
func us(d time.Duration) int64 { return d.Microseconds() }
