package torture

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// Malformed DSNs of each backend's scheme are refused at Open with an
// error that names what is wrong, quickly, and leave nothing behind.
func TestMalformedDSNsRefused(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ dsn, want string }{
		{"", "empty DSN"},
		{"redis://127.0.0.1:6379/0", `unsupported DSN scheme "redis"`},
		{"postgres://postgres@127.0.0.1:notaport/test", "invalid port"},
		{"postgres://%zz", "invalid percent-encoded"},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=bogus", "sslmode is invalid"},
		{"postgresql://postgres@127.0.0.1:5432/test?connect_timeout=soon", "connect_timeout"},
		{"postgres://postgres@127.0.0.1:1/test?sslmode=disable", "connection refused"},
		{"mysql://", "no database name"},
		{"mysql://root@127.0.0.1:3306", "no database name"},
		{"mysql://root@127.0.0.1:notaport/test", "invalid port"},
		{"mysql://%zz", "invalid URL escape"},
		{"mysql://root@127.0.0.1:1/test", "connection refused"},
		{":memory:", "in-memory databases are not supported"},
		{"sqlite::memory:", "in-memory databases are not supported"},
		{"file::memory:?cache=shared", "in-memory databases are not supported"},
		{"sqlite:", "in-memory databases are not supported"},
		{filepath.Join(dir, "no", "such", "dir", "x.db"), "no such file or directory"},
		{dir, "unable to open database file"},
		{filepath.Join(dir, "x.db") + "?_pragma=journal_mode(DELETE)", "is set by the driver"},
		{"file:" + filepath.Join(dir, "y.db") + "?_pragma=synchronous(OFF)", "is set by the driver"},
	}
	for _, tc := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		c, err := connect.Open(ctx, tc.dsn, nil)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded, want an error mentioning %q", tc.dsn, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v, want it to mention %q", tc.dsn, err, tc.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Open(%q) took %v to fail", tc.dsn, d)
		}
	}
	for _, f := range []string{"x.db", "y.db"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("a refused DSN created %s", f)
		}
	}
}

// A database that does not exist on a reachable server is named in the
// error.
func TestMissingDatabaseNamed(t *testing.T) {
	for _, b := range []struct {
		name string
		dsn  func(testing.TB) string
	}{{"postgres", testdb.Postgres}, {"mysql", testdb.MySQL}} {
		t.Run(b.name, func(t *testing.T) {
			u, err := url.Parse(b.dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/conveyor_no_such_db"
			_, err = connect.Open(context.Background(), u.String(), nil)
			if err == nil || !strings.Contains(err.Error(), "conveyor_no_such_db") {
				t.Fatalf("Open of a missing database: %v", err)
			}
		})
	}
}

// Patroni REST API URLs off loopback (or not http URLs) are refused
// before anything runs, as a database off loopback is: the switchover
// fault POSTs /switchover to them.
func TestPatroniRESTMustBeLoopback(t *testing.T) {
	for _, tc := range []struct {
		rest []string
		want string // "" accepted
	}{
		{[]string{"http://127.0.0.1:8008", "http://localhost:8009", "http://[::1]:8010/"}, ""},
		{[]string{"http://127.0.0.1:8008", "http://10.0.0.2:8008"}, `"http://10.0.0.2:8008": the cluster must be on a loopback address`},
		{[]string{"https://patroni.example.com:8008"}, "must be on a loopback address"},
		{[]string{"http://127.0.0.1.example.com:8008"}, "must be on a loopback address"},
		{[]string{"127.0.0.1:8008"}, "want http://host:port"},
		{[]string{"ftp://127.0.0.1/"}, "want http://host:port"},
	} {
		err := (&PatroniCluster{REST: tc.rest}).checkREST()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q refused: %v", tc.rest, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error mentioning %q", tc.rest, err, tc.want)
		}
	}
	// Run refuses them before it starts anything.
	_, err := Run(context.Background(), Options{
		DSN:     "postgres://postgres@127.0.0.1:5432/test",
		Faults:  []string{"switchover"},
		Patroni: &PatroniCluster{REST: []string{"http://192.0.2.1:8008"}},
	})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("Run with a Patroni REST API off loopback: %v, want a refusal", err)
	}
}
