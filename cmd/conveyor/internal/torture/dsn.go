package torture

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite" // registers "sqlite" for the checker's own reads

	"github.com/conveyorq/conveyor/connect"
)

// backendOf names the backend a DSN selects, as connect.Open does.
func backendOf(s string) string {
	b, _ := connect.Backend(s)
	return b
}

// sqlitePath returns the file of a SQLite DSN: a plain path or
// "sqlite:path" / "sqlite://path" (URIs with parameters are refused: the
// suite opens the file with its own settings).
func sqlitePath(dsn string) (string, error) {
	p := dsn
	for _, pre := range []string{"sqlite://", "sqlite:"} {
		if strings.HasPrefix(p, pre) {
			p = strings.TrimPrefix(p, pre)
			break
		}
	}
	if p == "" || strings.HasPrefix(p, "file:") || strings.ContainsAny(p, "?") {
		return "", fmt.Errorf("torture: SQLite DSN %q: give a plain file path", dsn)
	}
	return p, nil
}

// mysqlConfig turns a conveyor MySQL DSN (mysql://user:pass@host:port/db)
// into a go-sql-driver configuration.
func mysqlConfig(dsn string) (*gomysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	c := gomysql.NewConfig()
	c.User = u.User.Username()
	c.Passwd, _ = u.User.Password()
	c.Net = "tcp"
	c.Addr = u.Host
	if u.Port() == "" {
		c.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	c.DBName = strings.TrimPrefix(u.Path, "/")
	c.ParseTime = true
	c.Loc = time.UTC
	c.Params = map[string]string{"time_zone": "'+00:00'"}
	c.Timeout = 5 * time.Second
	return c, nil
}

// openSQL opens a database/sql handle on a MySQL or SQLite DSN; for SQLite
// with immediate transactions when tx is set (EnqueueTx), else read-mostly.
func openSQL(dsn string, tx bool) (*sql.DB, error) {
	switch backendOf(dsn) {
	case "mysql":
		cfg, err := mysqlConfig(dsn)
		if err != nil {
			return nil, err
		}
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		return sql.OpenDB(conn), nil
	case "sqlite":
		p, err := sqlitePath(dsn)
		if err != nil {
			return nil, err
		}
		q := "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
		if tx {
			q += "&_txlock=immediate"
		}
		return sql.Open("sqlite", "file:"+p+q)
	}
	return nil, fmt.Errorf("torture: no database/sql handle for %q", dsn)
}

// hostPort returns the server address of a network DSN.
func hostPort(dsn string) (host string, port int, err error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", 0, err
	}
	host = u.Hostname()
	p := u.Port()
	if p == "" {
		p = map[string]string{"postgres": "5432", "mysql": "3306"}[backendOf(dsn)]
	}
	port, err = strconv.Atoi(p)
	return host, port, err
}

// checkLoopback refuses a network DSN whose host is not a loopback
// address: the suite kills connections and restarts servers.
func checkLoopback(dsn string) error {
	if backendOf(dsn) == "sqlite" {
		return nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return fmt.Errorf("torture: bad DSN: %w", err)
	}
	// A PostgreSQL URL may name several hosts (a Patroni cluster's nodes),
	// each with its port.
	for _, hp := range strings.Split(u.Host, ",") {
		host := hp
		if h, _, err := net.SplitHostPort(hp); err == nil {
			host = h
		}
		if !loopbackHost(host) {
			return errors.New("torture: the database must be on a loopback address (127.0.0.1, ::1 or localhost): the suite kills its connections and restarts it")
		}
	}
	return nil
}

// loopbackHost reports whether host (a name or an address, IPv6 in
// brackets or not) is localhost or a loopback address.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// withAppName adds application_name to a PostgreSQL DSN, so that the
// suite's processes are recognisable in pg_stat_activity.
func withAppName(dsn, name string) string {
	if backendOf(dsn) != "postgres" {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}
