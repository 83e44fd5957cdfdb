// Package testdb tells tests where the real databases are. A backend that
// is unreachable is skipped with a message, unless CONVEYOR_REQUIRE_BACKENDS
// names it (CI sets "postgres,mysql"), in which case the test fails. It
// also says whether anything else a test needs (a tool, time zone data)
// may be missing: see Strict and Missing.
package testdb

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Default DSNs of the loopback servers; override with CONVEYOR_TEST_POSTGRES
// and CONVEYOR_TEST_MYSQL.
const (
	DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQL    = "mysql://root@127.0.0.1:3306/test"
)

// Required reports whether the named backend must be reachable.
func Required(backend string) bool {
	for _, b := range strings.Split(os.Getenv("CONVEYOR_REQUIRE_BACKENDS"), ",") {
		if strings.TrimSpace(b) == backend {
			return true
		}
	}
	return false
}

// Strict reports whether tests run where everything they need must be
// present: in CI (CI=true) or whenever CONVEYOR_REQUIRE_BACKENDS is set
// (scripts/test sets it under CI). There a test that cannot run fails
// instead of skipping.
func Strict() bool {
	return os.Getenv("CI") == "true" || strings.TrimSpace(os.Getenv("CONVEYOR_REQUIRE_BACKENDS")) != ""
}

// Missing ends the test because something it needs is missing (a tool,
// time zone data, a kernel feature), which the message names with how to
// get it: the test is skipped, or fails when Strict.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if Strict() {
		tb.Fatalf("required under CI=true or CONVEYOR_REQUIRE_BACKENDS, but missing: "+format, args...)
	}
	tb.Skipf("SKIPPED, missing: "+format, args...)
}

// Postgres returns the PostgreSQL test DSN, or skips (fails if required).
func Postgres(tb testing.TB) string {
	return dsn(tb, "postgres", "CONVEYOR_TEST_POSTGRES", DefaultPostgres)
}

// MySQL returns the MySQL/MariaDB test DSN, or skips (fails if required).
func MySQL(tb testing.TB) string {
	return dsn(tb, "mysql", "CONVEYOR_TEST_MYSQL", DefaultMySQL)
}

func dsn(tb testing.TB, backend, env, def string) string {
	tb.Helper()
	d := os.Getenv(env)
	if d == "" {
		d = def
	}
	u, err := url.Parse(d)
	if err != nil {
		tb.Fatalf("%s: bad DSN %q: %v", env, d, err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		if Required(backend) {
			tb.Fatalf("%s backend required (CONVEYOR_REQUIRE_BACKENDS) but unreachable at %s: %v", backend, u.Host, err)
		}
		tb.Skipf("SKIPPED BACKEND %s: unreachable at %s (%v); set %s or start the server", backend, u.Host, err, env)
	}
	c.Close()
	return d
}

// Prefix returns a fresh table prefix so that tests can share a database.
func Prefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:]) + "_"
}

// SilentServer listens on a loopback port, accepts TCP connections and
// never answers: a server that is up but does not speak the protocol,
// for connect-timeout tests. It returns its address and stops when the
// test ends.
func SilentServer(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
