package connect

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyorq/conveyor"
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
