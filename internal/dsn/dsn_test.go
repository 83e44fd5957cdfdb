package dsn

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestBackend(t *testing.T) {
	for in, want := range map[string]string{
		"./conveyor.db":             SQLite,
		"jobs.db":                   SQLite,
		"sqlite:jobs.db":            SQLite,
		"sqlite:///tmp/jobs.db":     SQLite,
		"file:jobs.db?_pragma=x":    SQLite,
		"postgres://u@h/db":         Postgres,
		"postgresql://u@h/db":       Postgres,
		"POSTGRES://u@h/db":         Postgres,
		"mysql://root@127.0.0.1/t":  MySQL,
		"mariadb://root@127.0.0.1/": MySQL,
	} {
		got, err := Backend(in)
		if err != nil || got != want {
			t.Errorf("Backend(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "redis://x", "http://x"} {
		if b, err := Backend(bad); err == nil {
			t.Errorf("Backend(%q) = %q, want an error", bad, b)
		}
	}
}

// Redact hides the password of well-formed DSNs and of the typos that
// make them unparsable or look like a SQLite path; paths are left alone.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"mysql://root:Sekr3t@127.0.0.1:3306/test":  "mysql://root:xxxxx@127.0.0.1:3306/test",
		"mysql://root:Sek%r3t@127.0.0.1:3306/test": "mysql://root:xxxxx@127.0.0.1:3306/test",
		"mysql://root:Sekr3t@127.0.0.1:33o6/test":  "mysql://root:xxxxx@127.0.0.1:33o6/test",
		"mysql//root:Sekr3t@127.0.0.1:3306/test":   "mysql//root:xxxxx@127.0.0.1:3306/test",
		"mysql:/root:Sekr3t@127.0.0.1:3306/test":   "mysql:/root:xxxxx@127.0.0.1:3306/test",
		"postgres://u:p@ss:w@rd@h/db":              "postgres://u:xxxxx@h/db",
		"mysql://root@127.0.0.1:3306/test":         "mysql://root@127.0.0.1:3306/test",
		"postgres://u:@h/db":                       "postgres://u:@h/db",
		"./conveyor.db":                            "./conveyor.db",
		"/data/a@b.db":                             "/data/a@b.db",
		"C:/jobs@2.db":                             "C:/jobs@2.db",
		"file:jobs.db?_pragma=busy_timeout(5000)":  "file:jobs.db?_pragma=busy_timeout(5000)",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactError(t *testing.T) {
	d := "mysql://root:Sek%21r3t@127.0.0.1:33o6/test"
	base := errors.New("bad")
	err := RedactError(fmt.Errorf("parse %q: invalid port; password Sek!r3t; again Sek%%21r3t: %w", d, base), d)
	if strings.Contains(err.Error(), "Sek") || !strings.Contains(err.Error(), "mysql://root:xxxxx@127.0.0.1:33o6/test") {
		t.Errorf("RedactError: %v", err)
	}
	if !errors.Is(err, base) {
		t.Error("RedactError lost the error chain")
	}
	if RedactError(nil, d) != nil {
		t.Error("RedactError(nil) is not nil")
	}
	if e := RedactError(base, "./x.db"); e != base {
		t.Errorf("RedactError without a password changed the error: %v", e)
	}
}
