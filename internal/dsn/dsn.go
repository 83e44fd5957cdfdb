// Package dsn names the backend a conveyor DSN selects. It is the one
// place that decides it: connect.Open, the command, the bench and the
// torture suite all ask it. Each backend then reads the rest of the DSN
// with its own parser (pgx's, the MySQL backend's, the SQLite backend's).
package dsn

import (
	"errors"
	"fmt"
	"net/url"
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

// Redact returns dsn with the password of its user information (the text
// between the first ':' after the user name and the last '@') replaced by
// "xxxxx", as pgx prints a DSN. It works on DSNs that do not parse (a typo
// in a port or an escape) and on ones that lost their "://" (such as
// "mysql//user:pass@host/db", which is taken for a SQLite path), so that
// no message built from a DSN shows its password.
func Redact(dsn string) string {
	start, at, ok := password(dsn)
	if !ok {
		return dsn
	}
	return dsn[:start] + "xxxxx" + dsn[at:]
}

// password returns where the password of dsn's user information starts
// and where it ends (the last '@'), and whether dsn has one. The user
// information starts after the first "//" (after the scheme), else after
// the first ":/", else at the start.
func password(dsn string) (start, end int, ok bool) {
	end = strings.LastIndex(dsn, "@")
	if end < 0 {
		return 0, 0, false
	}
	from := 0
	if i := strings.Index(dsn, "//"); i >= 0 && i < end {
		from = i + 2
	} else if i := strings.Index(dsn, ":/"); i >= 0 && i < end {
		from = i + 2
	}
	colon := strings.Index(dsn[from:end], ":")
	if colon < 0 || from+colon+1 == end {
		return 0, 0, false
	}
	return from + colon + 1, end, true
}

// RedactError returns err with every occurrence of dsn in its message
// replaced by Redact(dsn), and every occurrence of the password itself
// (as written and unescaped) by "xxxxx"; errors.Is and errors.As see err
// as before. A nil err, or a DSN without a password, returns err as it
// is. Passwords of fewer than 4 characters are only redacted as part of
// the DSN: replacing so short a string everywhere would garble messages.
func RedactError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	start, end, ok := password(dsn)
	if !ok {
		return err
	}
	msg := err.Error()
	out := strings.ReplaceAll(msg, dsn, Redact(dsn))
	pw := dsn[start:end]
	forms := []string{pw}
	if u, uerr := url.PathUnescape(pw); uerr == nil && u != pw {
		forms = append(forms, u)
	}
	for _, p := range forms {
		if len(p) >= 4 {
			out = strings.ReplaceAll(out, p, "xxxxx")
		}
	}
	if out == msg {
		return err
	}
	return redacted{msg: out, err: err}
}

// redacted is an error whose message had a password removed.
type redacted struct {
	msg string
	err error
}

// Error returns the redacted message.
func (r redacted) Error() string { return r.msg }

// Unwrap returns the original error, for errors.Is and errors.As.
func (r redacted) Unwrap() error { return r.err }
