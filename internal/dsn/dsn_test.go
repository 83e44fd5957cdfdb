package dsn

import "testing"

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
