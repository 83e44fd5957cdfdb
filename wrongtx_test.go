package conveyor_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestEnqueueTxOnAnotherDatabase: EnqueueTx, EnqueueBatchTx and
// EnqueueWorkflowTx given a *sql.Tx begun on a database of another
// backend (the type the client accepts, the wrong database) fail with
// ErrTxType naming both databases, not with the other database's syntax
// error about conveyor's SQL.
func TestEnqueueTxOnAnotherDatabase(t *testing.T) {
	ctx := context.Background()
	dsns := map[string]string{
		"sqlite":   filepath.Join(t.TempDir(), "conveyor.db"),
		"postgres": testdb.Postgres(t),
		"mysql":    testdb.MySQL(t),
	}
	// sqlTx begins a *sql.Tx on the database of backend (SQLite: a file
	// of its own), rolled back and closed by end.
	sqlTx := func(t *testing.T, backend string) (tx *sql.Tx, end func()) {
		if backend == "postgres" {
			db, err := sql.Open("pgx", dsns[backend])
			if err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, func() { _ = tx.Rollback(); db.Close() }
		}
		dsn := dsns[backend]
		if backend == "sqlite" {
			dsn = filepath.Join(t.TempDir(), "other.db")
		}
		anyTx, _, rollback, done, err := openTx(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		return anyTx.(*sql.Tx), func() { _ = rollback(); done() }
	}
	for _, client := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(client, func(t *testing.T) {
			c := openDropped(t, dsns[client], fast(testdb.Prefix()))
			for _, other := range []string{"sqlite", "postgres", "mysql"} {
				if other == client {
					continue
				}
				for _, call := range []struct {
					name string
					do   func(tx *sql.Tx) error
				}{
					{"EnqueueTx", func(tx *sql.Tx) error { _, err := c.EnqueueTx(ctx, tx, tagged{"x"}, nil); return err }},
					{"EnqueueBatchTx", func(tx *sql.Tx) error {
						_, _, err := c.EnqueueBatchTx(ctx, tx, []conveyor.EnqueueItem{{Args: tagged{"m"}}}, conveyor.EnqueueItem{Args: tagged{"cb"}})
						return err
					}},
					{"EnqueueWorkflowTx", func(tx *sql.Tx) error {
						_, err := c.EnqueueWorkflowTx(ctx, tx, []conveyor.WorkflowJob{{Name: "a", Args: tagged{"a"}}}, nil)
						return err
					}},
				} {
					tx, end := sqlTx(t, other)
					err := call.do(tx)
					end()
					if !errors.Is(err, conveyor.ErrTxType) || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), client) {
						t.Errorf("%s on a %s transaction: %v; want ErrTxType naming %s and %s", call.name, other, err, other, client)
					}
				}
			}
			if n := totalJobs(t, c); n != 0 {
				t.Fatalf("%d jobs", n)
			}
		})
	}
}
