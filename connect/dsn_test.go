package connect

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackend: each scheme selects its backend, as Open does; an unknown
// scheme and an empty DSN are errors.
func TestBackend(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u@127.0.0.1/db":   "postgres",
		"postgresql://u@127.0.0.1/db": "postgres",
		"mysql://u@127.0.0.1/db":      "mysql",
		"mariadb://u@127.0.0.1/db":    "mysql",
		"./jobs.db":                   "sqlite",
		"sqlite:jobs.db":              "sqlite",
		"sqlite://jobs.db":            "sqlite",
		"file:jobs.db?cache=shared":   "sqlite",
	} {
		if got, err := Backend(dsn); err != nil || got != want {
			t.Errorf("Backend(%q) = %q, %v; want %q", dsn, got, err, want)
		}
	}
	for _, dsn := range []string{"", "redis://127.0.0.1/0"} {
		if got, err := Backend(dsn); err == nil {
			t.Errorf("Backend(%q) = %q, want an error", dsn, got)
		}
	}
}

// TestSQLiteFile: the file a SQLite DSN names is the one Open creates; a
// DSN of another backend and an in-memory database have none.
func TestSQLiteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.db")
	for _, dsn := range []string{path, "sqlite:" + path, "sqlite://" + path, "file:" + path + "?_pragma=busy_timeout(100)"} {
		if got, err := SQLiteFile(dsn); err != nil || got != path {
			t.Errorf("SQLiteFile(%q) = %q, %v; want %q", dsn, got, err, path)
		}
	}
	c, err := Open(context.Background(), "sqlite:"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Open did not create the file SQLiteFile names: %v", err)
	}
	for _, dsn := range []string{"postgres://u:secret@127.0.0.1/db", "mysql://u@127.0.0.1/db", ":memory:", "file:x?mode=memory"} {
		if got, err := SQLiteFile(dsn); err == nil {
			t.Errorf("SQLiteFile(%q) = %q, want an error", dsn, got)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("SQLiteFile(%q): %v shows the password", dsn, err)
		}
	}
}

// TestRedactError: the DSN's password is gone from the message, and the
// error is still what it wraps.
func TestRedactError(t *testing.T) {
	dsn := "postgres://u:hunter22@127.0.0.1/db"
	base := errors.New("boom")
	err := RedactError(errors.Join(errors.New("cannot reach "+dsn+" (password hunter22)"), base), dsn)
	if strings.Contains(err.Error(), "hunter22") || !strings.Contains(err.Error(), "postgres://u:xxxxx@127.0.0.1/db") {
		t.Fatalf("redacted: %v", err)
	}
	if !errors.Is(err, base) {
		t.Fatal("the redacted error does not wrap the original")
	}
	if RedactError(nil, dsn) != nil {
		t.Fatal("a nil error redacted to non-nil")
	}
}
