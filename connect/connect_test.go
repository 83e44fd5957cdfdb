package connect

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestOptionsBelongToTheirBackend: a setting of another backend is refused
// before anything is opened, and SQLite's own settings apply.
func TestOptionsBelongToTheirBackend(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	cases := []struct {
		dsn  string
		opts Options
		want string
	}{
		{path, Options{ClaimStrategy: "optimistic"}, "ClaimStrategy \"optimistic\" is a MySQL/MariaDB setting"},
		{"postgres://postgres@127.0.0.1:1/test", Options{SQLiteSynchronous: "FULL"}, "SQLiteSynchronous \"FULL\" is a SQLite setting"},
	}
	for _, tc := range cases {
		_, err := OpenWith(ctx, tc.dsn, nil, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenWith(%q, %+v) = %v, want an error containing %q", tc.dsn, tc.opts, err, tc.want)
		}
	}
	c, err := OpenWith(ctx, path, nil, Options{SQLiteSynchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info["synchronous"] != "FULL" {
		t.Errorf("synchronous = %q, want FULL", info["synchronous"])
	}
}

// TestClientAnyChecksTxType: a Client[any] takes whatever transaction it
// is given and refuses one of the wrong type when EnqueueTx runs.
func TestClientAnyChecksTxType(t *testing.T) {
	ctx := context.Background()
	c, err := Open(ctx, filepath.Join(t.TempDir(), "c.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.EnqueueTx(ctx, &sql.Conn{}, conveyor.RawArgs{KindName: "k", JSON: []byte(`{}`)}, nil)
	if !errors.Is(err, conveyor.ErrTxType) || !strings.Contains(err.Error(), "*sql.Conn") {
		t.Errorf("EnqueueTx with a *sql.Conn: %v, want ErrTxType naming the type", err)
	}
}

// TestConnectTimeout: a server that accepts TCP connections and never
// answers fails Open after ConnectTimeout, with an error naming the
// server and the timeout (and matching context.DeadlineExceeded),
// instead of hanging until the caller's context ends.
func TestConnectTimeout(t *testing.T) {
	addr := testdb.SilentServer(t)
	for _, d := range []string{"postgres://postgres:Sekr3tPw@" + addr + "/test", "mysql://root:Sekr3tPw@" + addr + "/test"} {
		// The caller's own bound, far above the connect timeout: hitting
		// it means ConnectTimeout did not apply.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := OpenWith(ctx, d, nil, Options{ConnectTimeout: 300 * time.Millisecond})
		callerExpired := ctx.Err() != nil
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("%s: opened a server that never answers", d)
		}
		want := addr + " did not answer within 300ms (connect timeout)"
		if callerExpired || !strings.Contains(err.Error(), want) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Sekr3tPw") {
			t.Errorf("%s: %v (caller's context expired: %v), want an error containing %q", d, err, callerExpired, want)
		}
	}
}

// TestOpenErrorsHideThePassword: DSN typos that the backends' parsers
// echo (url.Parse quotes the whole URL) are reported without the password.
func TestOpenErrorsHideThePassword(t *testing.T) {
	for _, d := range []string{
		"mysql://root:Sekr3tPw@127.0.0.1:33o6/test",
		"mysql://root:Sek%r3tPw@127.0.0.1:3306/test",
		"mysql://root:Sekr3tPw@[127.0.0.1:3306/test",
		"mysql:/root:Sekr3tPw@127.0.0.1:3306/test",
		"postgres://postgres:Sekr3tPw@127.0.0.1:54x/test",
	} {
		_, err := Open(context.Background(), d, nil)
		if err == nil || strings.Contains(err.Error(), "Sekr3tPw") || strings.Contains(err.Error(), "Sek%r3tPw") {
			t.Errorf("Open(%q): %v", d, err)
		}
	}
}
