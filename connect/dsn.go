package connect

import (
	"fmt"

	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/dsn"
)

// Backend names the backend Open selects for a DSN: "postgres" for
// postgres:// and postgresql:// URLs, "mysql" for mysql:// and
// mariadb:// URLs, "sqlite" for sqlite:, sqlite://, file: and plain
// paths. Any other scheme, and an empty DSN, is an error naming it. It
// reads nothing else of the DSN.
func Backend(dsnStr string) (string, error) {
	return dsn.Backend(dsnStr)
}

// SQLiteFile returns the database file a SQLite DSN names, as Open reads
// it (a plain path, sqlite:path, sqlite://path or a file: URI without its
// parameters). It fails for a DSN of another backend and for one Open
// would refuse, such as an in-memory database.
func SQLiteFile(dsnStr string) (string, error) {
	b, err := dsn.Backend(dsnStr)
	if err != nil {
		return "", err
	}
	if b != dsn.SQLite {
		return "", fmt.Errorf("conveyor: connect: %s is a %s DSN, not a SQLite file", dsn.Redact(dsnStr), b)
	}
	return sqlite.FilePath(dsnStr)
}

// RedactError returns err with the password of dsnStr removed from its
// message: every occurrence of the DSN shows "xxxxx" in its place, as do
// occurrences of the password itself (of 4 characters or more, as
// written and unescaped). errors.Is and errors.As see err as before. Open
// returns its errors redacted; this is for messages built around one.
func RedactError(err error, dsnStr string) error {
	return dsn.RedactError(err, dsnStr)
}
