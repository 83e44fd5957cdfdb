// Package dsn names the backend a conveyor DSN selects. It is the one
// place that decides it: connect.Open, the command, the bench and the
// torture suite all ask it. Each backend then reads the rest of the DSN
// with its own parser (pgx's, the MySQL backend's, the SQLite backend's).
package dsn

import (
	"errors"
	"fmt"
	"strings"
)

// Backend names.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
)

// Backend returns the backend dsn selects: "postgres" for postgres:// and
// postgresql:// URLs, "mysql" for mysql:// and mariadb:// URLs, "sqlite"
// for sqlite:, sqlite://, file: and plain paths. Any other scheme is an
// error naming it.
func Backend(dsn string) (string, error) {
	if dsn == "" {
		return "", errors.New("conveyor: empty DSN: give a SQLite path, postgres://... or mysql://...")
	}
	scheme, _, hasScheme := strings.Cut(dsn, "://")
	if !hasScheme {
		// "sqlite:x.db", "file:x.db?..." and plain paths (which may hold
		// a colon, as in "C:" or "a:b.db", but no "://").
		return SQLite, nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	case "sqlite", "file":
		return SQLite, nil
	}
	return "", fmt.Errorf("conveyor: unsupported DSN scheme %q: give a SQLite path, postgres://... or mysql://...", scheme)
}
