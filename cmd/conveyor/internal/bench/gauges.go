package bench

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// Gauges are the database's state at one moment of a steady run, read on
// a connection of the bench's own with reads only. A field the backend
// does not have is absent (nil), not zero.
type Gauges struct {
	// AtS is when the gauges were read, in seconds since the load began
	// (negative: before it).
	AtS float64 `json:"at_s"`
	// Tables are the figures of each of the run's tables, by name without
	// the prefix.
	Tables map[string]TableGauge `json:"tables,omitempty"`
	// DeadTuples and LiveTuples sum pg_stat_user_tables' n_dead_tup and
	// n_live_tup over the run's tables (PostgreSQL).
	DeadTuples *int64 `json:"dead_tuples,omitempty"`
	LiveTuples *int64 `json:"live_tuples,omitempty"` // see DeadTuples
	// Vacuums counts the (auto)vacuums of the run's tables so far
	// (PostgreSQL).
	Vacuums *int64 `json:"vacuums,omitempty"`
	// TableBytes, IndexBytes and TotalBytes sum the run's tables' heap,
	// index and total sizes (PostgreSQL pg_relation_size,
	// pg_indexes_size, pg_total_relation_size; MySQL data_length,
	// index_length and their sum, InnoDB's estimates). On SQLite
	// TotalBytes is the database file's size (all tables: the file is
	// the bench's own).
	TableBytes *int64 `json:"table_bytes,omitempty"`
	IndexBytes *int64 `json:"index_bytes,omitempty"` // see TableBytes
	TotalBytes *int64 `json:"total_bytes,omitempty"` // see TableBytes
	// XminAge is the age in transactions of the oldest backend_xmin of
	// the database's other sessions (PostgreSQL): what holds vacuum back.
	XminAge *int64 `json:"xmin_age,omitempty"`
	// XminHolder names the session holding that oldest xmin: its
	// application_name ("conveyor-bench-hold" is the held transaction),
	// else its pid (another program's session).
	XminHolder string `json:"xmin_holder,omitempty"`
	// OldestXactS is the age in seconds of the oldest open transaction
	// of the database's other sessions (PostgreSQL pg_stat_activity,
	// MySQL information_schema.innodb_trx).
	OldestXactS *float64 `json:"oldest_xact_s,omitempty"`
	// HistoryLength is InnoDB's history list length: undo logs of
	// committed transactions not yet purged, which a consistent snapshot
	// keeps (MySQL/MariaDB, server-wide).
	HistoryLength *int64 `json:"history_length,omitempty"`
	// WALBytes is the size of SQLite's -wal file; WALFrames the frames
	// written to it since it was last reset and WALBackfilled those
	// checkpointed into the database (from the -shm wal-index):
	// WALFrames - WALBackfilled is what a checkpoint has yet to copy.
	WALBytes      *int64 `json:"wal_bytes,omitempty"`
	WALFrames     *int64 `json:"wal_frames,omitempty"`     // see WALBytes
	WALBackfilled *int64 `json:"wal_backfilled,omitempty"` // see WALBytes
	// Pages and FreePages are SQLite's page_count and freelist_count.
	Pages     *int64 `json:"pages,omitempty"`
	FreePages *int64 `json:"free_pages,omitempty"` // see Pages
	// DBCPUShare, ClientCPUShare and MachineCPUShare are the shares of
	// the machine's CPU (all cores: 1 is every core busy) used since the
	// previous reading by the database server's processes, by the bench
	// process, and by everything on the machine (other programs
	// included). DBCPUShare is absent when the server does not run on
	// this machine, and on SQLite, whose work is the bench process's.
	DBCPUShare      *float64 `json:"db_cpu_share,omitempty"`
	ClientCPUShare  *float64 `json:"client_cpu_share,omitempty"`  // see DBCPUShare
	MachineCPUShare *float64 `json:"machine_cpu_share,omitempty"` // see DBCPUShare
	// Error says why some gauges could not be read.
	Error string `json:"error,omitempty"`
}

// TableGauge is one table's figures (absent fields: see Gauges).
type TableGauge struct {
	// Live and Dead are n_live_tup and n_dead_tup (PostgreSQL); Live is
	// InnoDB's row estimate on MySQL.
	Live *int64 `json:"live,omitempty"`
	Dead *int64 `json:"dead,omitempty"` // see Live
	// TableBytes, IndexBytes and TotalBytes: see Gauges.
	TableBytes int64 `json:"table_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	TotalBytes int64 `json:"total_bytes"`
}

// Gauge queries. They read catalogs and statistics only; the tables are
// those whose name starts with the run's prefix (LIKE with the prefix's
// '_' escaped).
const (
	pgGaugeTablesSQL = `SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.vacuum_count + s.autovacuum_count,
       pg_relation_size(s.relid), pg_indexes_size(s.relid), pg_total_relation_size(s.relid)
FROM pg_stat_user_tables s
WHERE s.schemaname = current_schema() AND s.relname LIKE $1 ESCAPE '\'`
	pgGaugeXminSQL = `SELECT age(backend_xmin), coalesce(nullif(application_name, ''), 'pid ' || pid),
       (SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid())
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
ORDER BY age(backend_xmin) DESC NULLS LAST LIMIT 1`
	pgTablesSQL = `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1 ESCAPE '\' ORDER BY tablename`

	myGaugeTablesSQL = `SELECT table_name, COALESCE(table_rows, 0), COALESCE(data_length, 0), COALESCE(index_length, 0)
FROM information_schema.TABLES
WHERE table_schema = DATABASE() AND table_name LIKE ?`
	myHistorySQL   = `SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'`
	myHistoryVar   = `SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'`
	myOldestTrxSQL = `SELECT TIMESTAMPDIFF(MICROSECOND, MIN(trx_started), NOW()) / 1e6 FROM information_schema.INNODB_TRX
WHERE trx_mysql_thread_id <> CONNECTION_ID()`
	myTablesSQL = `SELECT table_name FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name LIKE ? ORDER BY table_name`

	sqliteTablesSQL = `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\' ORDER BY name`
)

// likePrefix is the LIKE pattern of the names that start with prefix.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `_`, `\_`, `%`, `\%`)
	return r.Replace(prefix) + "%"
}

// gauger reads Gauges on a connection of its own.
type gauger struct {
	backend, prefix string
	pg              *pgx.Conn
	db              *sql.DB // MySQL, SQLite
	sqlitePath      string
	cpu             cpuReader
	last            cpuTimes
	t0              time.Time
}

// newGauger connects to dsn for reading the gauges of the tables under
// prefix, and finds the server's processes for the CPU shares. The
// caller closes it.
func newGauger(ctx context.Context, dsn, backend, prefix string) (*gauger, error) {
	g := &gauger{backend: backend, prefix: prefix, t0: time.Now()}
	switch backend {
	case "postgres":
		cfg, err := pgSideConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = "conveyor-bench-gauges"
		if g.pg, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return nil, err
		}
		var pid int
		if err := g.pg.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			g.close()
			return nil, err
		}
		g.cpu = pgServerCPU(cfg.Host, pid)
	case "mysql":
		cfg, err := mysqlConfig(dsn)
		if err != nil {
			return nil, err
		}
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		g.db = sql.OpenDB(conn)
		g.db.SetMaxOpenConns(1)
		var pidFile sql.NullString
		if err := g.db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
			g.close()
			return nil, err
		}
		host := cfg.Addr
		if cfg.Net == "unix" {
			host = "/"
		} else if h, _, ok := strings.Cut(cfg.Addr, ":"); ok && !strings.HasPrefix(cfg.Addr, "[") {
			host = h
		} else if i := strings.LastIndex(cfg.Addr, "]"); i > 0 {
			host = cfg.Addr[1:i]
		}
		g.cpu = myServerCPU(host, pidFile.String)
	case "sqlite":
		var err error
		if g.db, err = sql.Open("sqlite", sqliteDSN(dsn, "_pragma=busy_timeout(10000)")); err != nil {
			return nil, err
		}
		g.db.SetMaxOpenConns(1)
		var seq int
		var name string
		if err := g.db.QueryRowContext(ctx, "PRAGMA database_list").Scan(&seq, &name, &g.sqlitePath); err != nil {
			g.close()
			return nil, err
		}
		g.cpu = cpuReader{source: "unavailable: SQLite runs inside the bench process (its share is the client's)"}
	default:
		return nil, fmt.Errorf("bench: no gauges for backend %q", backend)
	}
	g.last = g.cpu.read()
	return g, nil
}

func (g *gauger) close() {
	if g.pg != nil {
		g.pg.Close(context.Background())
	}
	if g.db != nil {
		g.db.Close()
	}
}

// source describes where the gauges come from.
func (g *gauger) source() string {
	switch g.backend {
	case "postgres":
		return "pg_stat_user_tables, pg_*_size, pg_stat_activity (backend_xmin, xact_start)"
	case "mysql":
		return "information_schema.INNODB_METRICS trx_rseg_history_len, information_schema.TABLES (InnoDB estimates), information_schema.INNODB_TRX"
	}
	return "the -wal file's size, the -shm wal-index header (frames written, backfilled), PRAGMA page_count/freelist_count, the database file's size"
}

// read reads the gauges; the CPU shares cover the time since the
// previous read. A failed read is reported in Gauges.Error.
func (g *gauger) read(ctx context.Context) Gauges {
	var gs Gauges
	gs.AtS = time.Since(g.t0).Seconds()
	var errs []error
	switch g.backend {
	case "postgres":
		errs = append(errs, g.readPG(ctx, &gs))
	case "mysql":
		errs = append(errs, g.readMySQL(ctx, &gs))
	case "sqlite":
		errs = append(errs, g.readSQLite(ctx, &gs))
	}
	now := g.cpu.read()
	gs.DBCPUShare, gs.ClientCPUShare, gs.MachineCPUShare = cpuShares(g.last, now)
	g.last = now
	if err := errors.Join(errs...); err != nil {
		gs.Error = err.Error()
	}
	return gs
}

func i64(v int64) *int64 { return &v }

func (g *gauger) readPG(ctx context.Context, gs *Gauges) error {
	rows, err := g.pg.Query(ctx, pgGaugeTablesSQL, likePrefix(g.prefix))
	if err != nil {
		return err
	}
	gs.Tables = map[string]TableGauge{}
	var live, dead, vac, tb, ib, tot int64
	for rows.Next() {
		var name string
		var t TableGauge
		var l, d, v int64
		if err := rows.Scan(&name, &l, &d, &v, &t.TableBytes, &t.IndexBytes, &t.TotalBytes); err != nil {
			rows.Close()
			return err
		}
		t.Live, t.Dead = i64(l), i64(d)
		gs.Tables[strings.TrimPrefix(name, g.prefix)] = t
		live, dead, vac = live+l, dead+d, vac+v
		tb, ib, tot = tb+t.TableBytes, ib+t.IndexBytes, tot+t.TotalBytes
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	gs.LiveTuples, gs.DeadTuples, gs.Vacuums = i64(live), i64(dead), i64(vac)
	gs.TableBytes, gs.IndexBytes, gs.TotalBytes = i64(tb), i64(ib), i64(tot)
	var age sql.NullInt64
	var xs sql.NullFloat64
	var holder string
	if err := g.pg.QueryRow(ctx, pgGaugeXminSQL).Scan(&age, &holder, &xs); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	gs.XminAge = i64(age.Int64)
	if age.Valid {
		gs.XminHolder = holder
	}
	if xs.Valid {
		gs.OldestXactS = &xs.Float64
	}
	return nil
}

func (g *gauger) readMySQL(ctx context.Context, gs *Gauges) error {
	rows, err := g.db.QueryContext(ctx, myGaugeTablesSQL, likePrefix(g.prefix))
	if err != nil {
		return err
	}
	gs.Tables = map[string]TableGauge{}
	var tb, ib int64
	for rows.Next() {
		var name string
		var t TableGauge
		var n int64
		if err := rows.Scan(&name, &n, &t.TableBytes, &t.IndexBytes); err != nil {
			rows.Close()
			return err
		}
		t.Live, t.TotalBytes = i64(n), t.TableBytes+t.IndexBytes
		gs.Tables[strings.TrimPrefix(name, g.prefix)] = t
		tb, ib = tb+t.TableBytes, ib+t.IndexBytes
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	gs.TableBytes, gs.IndexBytes, gs.TotalBytes = i64(tb), i64(ib), i64(tb+ib)
	var h sql.NullInt64
	if err := g.db.QueryRowContext(ctx, myHistorySQL).Scan(&h); err != nil || !h.Valid {
		var name string
		if err := g.db.QueryRowContext(ctx, myHistoryVar).Scan(&name, &h); err != nil {
			return fmt.Errorf("history list length: %w", err)
		}
	}
	gs.HistoryLength = i64(h.Int64)
	var xs sql.NullFloat64
	if err := g.db.QueryRowContext(ctx, myOldestTrxSQL).Scan(&xs); err != nil {
		return err
	}
	if xs.Valid {
		gs.OldestXactS = &xs.Float64
	}
	return nil
}

func (g *gauger) readSQLite(ctx context.Context, gs *Gauges) error {
	var errs []error
	if fi, err := os.Stat(g.sqlitePath); err == nil {
		gs.TotalBytes = i64(fi.Size())
	} else {
		errs = append(errs, err)
	}
	if fi, err := os.Stat(g.sqlitePath + "-wal"); err == nil {
		gs.WALBytes = i64(fi.Size())
	} else if os.IsNotExist(err) {
		gs.WALBytes = i64(0)
	} else {
		errs = append(errs, err)
	}
	if mx, bf, ok := walIndex(g.sqlitePath + "-shm"); ok {
		gs.WALFrames, gs.WALBackfilled = i64(mx), i64(bf)
	}
	var pages, free int64
	if err := g.db.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		errs = append(errs, err)
	} else {
		gs.Pages = &pages
	}
	if err := g.db.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free); err != nil {
		errs = append(errs, err)
	} else {
		gs.FreePages = &free
	}
	return errors.Join(errs...)
}

// walIndex reads the header of SQLite's wal-index (the -shm file): mxFrame,
// the last valid frame of the WAL, and nBackfill, the frames already
// copied into the database by checkpoints. The header is in native byte
// order (little-endian on the machines this runs on); it is read without
// locks, so the two figures may be a moment apart.
func walIndex(path string) (mxFrame, nBackfill int64, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var b [100]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return 0, 0, false
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != 3007000 { // WALINDEX_MAX_VERSION
		return 0, 0, false
	}
	// WalIndexHdr (48 bytes, twice), then WalCkptInfo whose first field
	// is nBackfill.
	return int64(le.Uint32(b[16:])), int64(le.Uint32(b[96:])), true
}

// prefixTables lists the tables of the prefix, for the held snapshot to
// read.
func prefixTables(ctx context.Context, q func(ctx context.Context, query string, arg string) ([]string, error), backend, prefix string) ([]string, error) {
	switch backend {
	case "postgres":
		return q(ctx, pgTablesSQL, likePrefix(prefix))
	case "mysql":
		return q(ctx, myTablesSQL, likePrefix(prefix))
	case "sqlite":
		return q(ctx, sqliteTablesSQL, likePrefix(prefix))
	}
	return nil, fmt.Errorf("bench: no tables query for backend %q", backend)
}
