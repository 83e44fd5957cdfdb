package bench

import (
	"net/url"

	"github.com/jackc/pgx/v5"
)

// pgSideConfig parses the PostgreSQL DSN of the bench's own side
// connections (samplers, gauges, the held transaction) as conveyor
// an application's: without conveyor's listen DSN parameter (a pooler
// refuses it as a startup parameter). Through a transaction pooler such
// as PgBouncer the DSN must choose an exec mode that prepares no named
// statement (default_query_exec_mode=cache_describe), as an
// application's must.
func pgSideConfig(dsn string) (*pgx.ConnConfig, error) {
	if u, err := url.Parse(dsn); err == nil && u.Query().Has("conveyor_direct_dsn") {
		q := u.Query()
		q.Del("conveyor_direct_dsn")
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	return pgx.ParseConfig(dsn)
}
