package torture

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// admin is the orchestrator's own raw access to the database, for what the
// public API does not show: the database's clock, the maintenance leader,
// the server's view of connections, SQLite's integrity.
type admin struct {
	backend string
	dsn     string
	prefix  string
	pg      *pgxpool.Pool
	db      *sql.DB
}

func openAdmin(ctx context.Context, dsn, prefix string) (*admin, error) {
	a := &admin{backend: backendOf(dsn), dsn: dsn, prefix: prefix}
	switch a.backend {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(withAppName(dsn, "conveyor-torture-admin"))
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 2
		a.pg, err = pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
	default:
		db, err := openSQL(dsn, false)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(2)
		a.db = db
	}
	return a, nil
}

func (a *admin) close() {
	if a.pg != nil {
		a.pg.Close()
	}
	if a.db != nil {
		a.db.Close()
	}
}

// now returns the database's clock.
func (a *admin) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	switch a.backend {
	case "postgres":
		err := a.pg.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
		return t, err
	case "mysql":
		err := a.db.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t)
		return t, err
	}
	return time.Now(), nil // SQLite's clock is the process's
}

// clockOffset is the database's clock minus this process's, measured at
// the middle of the round trip.
func (a *admin) clockOffset(ctx context.Context) (time.Duration, error) {
	before := time.Now()
	t, err := a.now(ctx)
	after := time.Now()
	if err != nil {
		return 0, err
	}
	return t.Sub(before.Add(after.Sub(before) / 2)), nil
}

// leaderPID returns the pid in the maintenance leader's id
// ("host/pid/random"), or 0 if there is none.
func (a *admin) leaderPID(ctx context.Context) (int, error) {
	var id string
	var err error
	switch a.backend {
	case "postgres":
		err = a.pg.QueryRow(ctx, "SELECT leader_id FROM "+a.prefix+"leader WHERE name = 'maintenance'").Scan(&id)
	case "mysql":
		err = a.db.QueryRowContext(ctx, "SELECT leader_id FROM `"+a.prefix+"leader` WHERE name = 'maintenance'").Scan(&id)
	default:
		err = a.db.QueryRowContext(ctx, "SELECT leader_id FROM "+a.prefix+"leader WHERE name = 'maintenance'").Scan(&id)
	}
	if err != nil {
		if strings.Contains(err.Error(), "no rows") {
			return 0, nil
		}
		return 0, err
	}
	parts := strings.Split(id, "/")
	if len(parts) < 3 {
		return 0, fmt.Errorf("leader id %q: unexpected form", id)
	}
	return strconv.Atoi(parts[len(parts)-2])
}

// killConnections has the server kill the connections whose client port
// is in ports (the suite's worker processes' connections, found from
// /proc), and returns how many it killed.
func (a *admin) killConnections(ctx context.Context, ports map[int]bool) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	switch a.backend {
	case "postgres":
		list := make([]int32, 0, len(ports))
		for p := range ports {
			list = append(list, int32(p))
		}
		var n int
		err := a.pg.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE client_port = ANY($1) AND pid <> pg_backend_pid()`, list).Scan(&n)
		return n, err
	case "mysql":
		rows, err := a.db.QueryContext(ctx, "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			var host string
			if err := rows.Scan(&id, &host); err != nil {
				rows.Close()
				return 0, err
			}
			if i := strings.LastIndexByte(host, ':'); i >= 0 {
				if p, err := strconv.Atoi(host[i+1:]); err == nil && ports[p] {
					ids = append(ids, id)
				}
			}
		}
		rows.Close()
		n := 0
		for _, id := range ids {
			if _, err := a.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
				n++
			}
		}
		return n, nil
	}
	return 0, fmt.Errorf("no server connections to kill on %s", a.backend)
}

// myRows counts the rows of the prefix's tables named (without the
// prefix) on MySQL, as a fresh read sees them.
func (a *admin) myRows(ctx context.Context, tables []string) (int64, error) {
	var sum int64
	for _, t := range tables {
		var n int64
		if err := a.db.QueryRowContext(ctx, "SELECT count(*) FROM `"+a.prefix+t+"`").Scan(&n); err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// myTrxAge returns how many seconds ago (by the server's clock, to the
// second) the transaction open on MySQL connection thread began, from
// information_schema.innodb_trx, and false if that connection has none
// open.
func (a *admin) myTrxAge(ctx context.Context, thread int64) (int64, bool, error) {
	var age int64
	err := a.db.QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(SECOND, trx_started, NOW())
		FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?`, thread).Scan(&age)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return age, err == nil, err
}

// segRotation reads the segments registry of a PostgreSQL prefix on the
// segments storage: the tables registered now, the reclaims (truncations)
// those tables went through, and the highest table number, which counts
// every segment table the prefix ever had.
func (a *admin) segRotation(ctx context.Context) (tables, reclaims, highest int64, err error) {
	err = a.pg.QueryRow(ctx, `SELECT count(*), coalesce(sum(inc - 1), 0),
	        coalesce(max(substring(tbl from '_([0-9]+)$')::bigint), 0)
	   FROM `+a.prefix+`segments`).Scan(&tables, &reclaims, &highest)
	return tables, reclaims, highest, err
}

// unfinishedSegRows returns the jobs of a PostgreSQL prefix on the
// segments storage that are in no final state, read from every ready,
// running and waiting table (see segRows).
func (a *admin) unfinishedSegRows(ctx context.Context) (map[int64]string, error) {
	return a.segRows(ctx, true)
}

// segRows returns the jobs of a PostgreSQL prefix on the segments storage,
// by id, with their state and attempt ("completed at attempt 1"): every
// job, or only those in no final state (read from the ready, running and
// waiting tables). It reads every such table of the registry, whatever
// its status, in one statement: the orchestrator's own reading of the
// tables, which depends on no client's view of the registry. A table
// dropped between the registry's reading and the statement's makes it
// read the registry again.
func (a *admin) segRows(ctx context.Context, unfinished bool) (map[int64]string, error) {
	phases, final := "", ""
	if unfinished {
		phases = " WHERE phase IN ('ready', 'running', 'waiting')"
		final = " WHERE state NOT IN ('completed', 'discarded', 'cancelled')"
	}
	for try := 0; ; try++ {
		var tbls []string
		rows, err := a.pg.Query(ctx, "SELECT tbl FROM "+a.prefix+"segments"+phases+" ORDER BY tbl")
		if err == nil {
			tbls, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return nil, err
		}
		if len(tbls) == 0 {
			return nil, nil
		}
		parts := make([]string, len(tbls))
		for i, t := range tbls {
			parts[i] = "SELECT id, state, attempt FROM " + pgx.Identifier{t}.Sanitize() + final
		}
		rows, err = a.pg.Query(ctx, strings.Join(parts, " UNION ALL "))
		out := map[int64]string{}
		if err == nil {
			var id int64
			var state string
			var attempt int
			_, err = pgx.ForEachRow(rows, []any{&id, &state, &attempt}, func() error {
				out[id] = fmt.Sprintf("%s at attempt %d", state, attempt)
				return nil
			})
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" && try < 5 {
			continue
		}
		return out, err
	}
}

// integrity runs SQLite's integrity check.
func (a *admin) integrity(ctx context.Context) (string, error) {
	var s string
	err := a.db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&s)
	return s, err
}

// clientPorts returns the local ports of pid's TCP connections to
// serverPort, from /proc.
func clientPorts(pid, serverPort int) (map[int]bool, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			lp := hexPort(fields[1])
			rp := hexPort(fields[2])
			if rp == serverPort && lp > 0 {
				ports[lp] = true
			}
		}
		fh.Close()
	}
	return ports, nil
}

func hexPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0
	}
	p, err := strconv.ParseUint(addr[i+1:], 16, 32)
	if err != nil {
		return 0
	}
	return int(p)
}

// sqliteWriter returns the pid holding SQLite's WAL write lock on the
// database at path (byte 120 of the -shm file, WALINDEX_LOCK_OFFSET +
// WAL_WRITE_LOCK), from /proc/locks, or 0 if nobody holds it: a process
// holding it is inside a write transaction.
func sqliteWriter(path string) (int, error) {
	st, err := os.Stat(path + "-shm")
	if err != nil {
		return 0, err
	}
	ino := st.Sys().(*syscall.Stat_t).Ino
	suffix := ":" + strconv.FormatUint(ino, 10)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		// "1: POSIX  ADVISORY  WRITE 1234 00:2f:5678 120 120"; waiters
		// have "->" after the number.
		if len(f) != 8 || f[1] != "POSIX" || f[3] != "WRITE" || !strings.HasSuffix(f[5], suffix) || f[6] != "120" {
			continue
		}
		return strconv.Atoi(f[4])
	}
	return 0, nil
}

// absPath resolves a SQLite DSN's file.
func absPath(dsn string) (string, error) {
	p, err := sqlitePath(dsn)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}
