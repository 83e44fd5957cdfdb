package lab_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the test's own handle on the database file

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
)

type task struct {
	Fail string `json:"fail,omitempty"`
}

func (task) Kind() string { return "task" }

// open returns a migrated client on dsn under a fresh prefix, closed when
// the test ends.
func open(t *testing.T, dsn string, cfg *conveyor.Config) *conveyor.Client[any] {
	t.Helper()
	ctx := context.Background()
	if cfg == nil {
		cfg = &conveyor.Config{}
	}
	cfg.TablePrefix = testdb.Prefix()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := connect.Open(ctx, dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func sqliteDSN(t *testing.T) string { return filepath.Join(t.TempDir(), "lab.db") }

// TestDropTables: after DropTables the prefix has no schema: a client
// opened on it is told to migrate, and the jobs are gone.
func TestDropTables(t *testing.T) {
	ctx := context.Background()
	dsn := sqliteDSN(t)
	c := open(t, dsn, nil)
	if _, err := c.Enqueue(ctx, task{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := lab.DropTables(ctx, c); err != nil {
		t.Fatal(err)
	}
	d, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: c.Config().TablePrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.EnqueueMany(ctx, nil); !errors.Is(err, conveyor.ErrSchemaOutdated) {
		t.Fatalf("after DropTables a client on the prefix got %v, want ErrSchemaOutdated", err)
	}
}

// TestWorkOne: WorkOne runs a job through its worker in the calling
// goroutine, on a client not started, and writes its outcome; a job that
// is no longer available cannot be claimed again.
func TestWorkOne(t *testing.T) {
	ctx := context.Background()
	c := open(t, sqliteDSN(t), nil)
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[task]) error {
		if j.Args.Fail != "" {
			return errors.New(j.Args.Fail)
		}
		return nil
	}))
	ok, err := c.Enqueue(ctx, task{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := c.Enqueue(ctx, task{Fail: "boom"}, &conveyor.EnqueueOpts{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	if w, err := lab.WorkOne(ctx, c, ok); err != nil || w.Err != nil || !w.Applied {
		t.Fatalf("WorkOne of a succeeding job: %+v, %v", w, err)
	}
	if j, err := c.Job(ctx, ok); err != nil || j.State != "completed" {
		t.Fatalf("job after WorkOne: %+v, %v; want completed", j, err)
	}
	w, err := lab.WorkOne(ctx, c, bad)
	if err != nil || w.Err == nil || w.Err.Error() != "boom" || !w.Applied {
		t.Fatalf("WorkOne of a failing job: %+v, %v; want its error, applied", w, err)
	}
	if j, err := c.Job(ctx, bad); err != nil || j.State != "retryable" || len(j.Errors) != 1 || j.Errors[0].Error != "boom" {
		t.Fatalf("failed job after WorkOne: %+v, %v; want retryable with its error", j, err)
	}
	if w, err := lab.WorkOne(ctx, c, ok); err == nil {
		t.Fatalf("WorkOne of a completed job: %+v, want an error", w)
	}
}

// TestSealSegmentsAt: the seal size is a PostgreSQL setting, refused on
// SQLite and for a size that is not positive; so is MigrateTo.
func TestSealSegmentsAt(t *testing.T) {
	sq := open(t, sqliteDSN(t), nil)
	if err := lab.SealSegmentsAt(sq, 1<<14); err == nil || !strings.Contains(err.Error(), "PostgreSQL") {
		t.Fatalf("SealSegmentsAt on SQLite: %v, want an error naming PostgreSQL", err)
	}
	if _, err := lab.MigrateTo(context.Background(), sq, 9); err == nil || !strings.Contains(err.Error(), "PostgreSQL") {
		t.Fatalf("MigrateTo on SQLite: %v, want an error naming PostgreSQL", err)
	}
	pg := open(t, testdb.Postgres(t), nil)
	t.Cleanup(func() { lab.DropTables(context.Background(), pg) })
	if err := lab.SealSegmentsAt(pg, 0); err == nil {
		t.Fatal("SealSegmentsAt 0 accepted")
	}
	if err := lab.SealSegmentsAt(pg, 1<<14); err != nil {
		t.Fatalf("SealSegmentsAt on PostgreSQL: %v", err)
	}
}

// TestCutOffAndSlowRenewal holds SQLite's write lock from a handle of the
// test's own while a job runs (lease 500ms), until the engine has cut the
// handler off because its lease could not be renewed: the renewal held
// up meanwhile reaches OnSlowRenewal's hook, and the attempt's stored
// error entry is recognised by CutOff, whether the handler returned the
// cut-off's cause or an error of its own wrapping the context's.
func TestCutOffAndSlowRenewal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ret    func(ctx context.Context) error
		prefix bool // the entry starts with the message, else ends with it in parentheses
	}{
		{"cause", func(ctx context.Context) error { return context.Cause(ctx) }, true},
		{"own error", func(ctx context.Context) error { return fmt.Errorf("read failed: %w", ctx.Err()) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dsn := sqliteDSN(t)
			c := open(t, dsn, &conveyor.Config{Lease: 500 * time.Millisecond})
			var mu sync.Mutex
			var slow []lab.SlowRenewal
			lab.OnSlowRenewal(c, func(r lab.SlowRenewal) {
				mu.Lock()
				slow = append(slow, r)
				mu.Unlock()
			})
			running, cutOff := make(chan struct{}), make(chan struct{})
			conveyor.AddWorker(c, conveyor.WorkFunc(func(jctx context.Context, j *conveyor.Job[task]) error {
				close(running)
				select {
				case <-jctx.Done():
				case <-ctx.Done():
					return errors.New("never cut off")
				}
				close(cutOff)
				return tc.ret(jctx)
			}))
			id, err := c.Enqueue(ctx, task{}, &conveyor.EnqueueOpts{MaxAttempts: 3})
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("sqlite", "file:"+dsn+"?_pragma=busy_timeout(10000)&_txlock=immediate")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			worked := make(chan error, 1)
			go func() {
				w, err := lab.WorkOne(ctx, c, id)
				if err == nil && w.Err == nil {
					err = errors.New("the handler succeeded")
				}
				worked <- err
			}()
			<-running
			tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-cutOff:
			case <-ctx.Done():
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := <-worked; err != nil {
				t.Fatal(err)
			}
			j, err := c.Job(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if len(j.Errors) != 1 {
				t.Fatalf("job %s with errors %v, want the cut-off attempt's", j.State, j.Errors)
			}
			entry := j.Errors[0].Error
			if !lab.CutOff(entry) || strings.HasPrefix(entry, lab.LeaseDeadlineMessage) != tc.prefix {
				t.Fatalf("attempt error %q: CutOff %v, want true with the message at its %s", entry, lab.CutOff(entry), map[bool]string{true: "start", false: "end"}[tc.prefix])
			}
			mu.Lock()
			defer mu.Unlock()
			if len(slow) == 0 {
				t.Fatal("no slow renewal reported while the write lock was held until the cut-off")
			}
			for _, r := range slow {
				if r.Leases != 1 || r.Took <= c.Config().HeartbeatInterval || r.Sent.IsZero() {
					t.Errorf("slow renewal %+v: want 1 lease, sent, slower than the heartbeat interval %v", r, c.Config().HeartbeatInterval)
				}
			}
		})
	}
}

// TestCutOff: the forms of an attempt's error entry CutOff recognises,
// and ones it does not.
func TestCutOff(t *testing.T) {
	for entry, want := range map[string]bool{
		lab.LeaseDeadlineMessage: true,
		"conveyor/postgres: read: context canceled (" + lab.LeaseDeadlineMessage + ")": true,
		"read: context canceled (conveyor: client shutting down)":                      false,
		"read (" + lab.LeaseDeadlineMessage + ") and then: boom":                       false,
		"lease expired": false,
	} {
		if got := lab.CutOff(entry); got != want {
			t.Errorf("CutOff(%q) = %v, want %v", entry, got, want)
		}
	}
}

// TestMySQLConfig: a conveyor MySQL DSN becomes a go-sql-driver
// configuration with the DSN's user, address, database and parameters,
// and no session setting of conveyor's own.
func TestMySQLConfig(t *testing.T) {
	cfg, err := lab.MySQLConfig("mariadb://u:p%40ss@127.0.0.1:3307/db?innodb_lock_wait_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "u" || cfg.Passwd != "p@ss" || cfg.Addr != "127.0.0.1:3307" || cfg.DBName != "db" || cfg.Params["innodb_lock_wait_timeout"] != "5" {
		t.Fatalf("config %+v", cfg)
	}
	if _, ok := cfg.Params["time_zone"]; ok || cfg.ParseTime {
		t.Fatalf("config %+v has conveyor's session settings", cfg)
	}
	if _, err := lab.MySQLConfig("postgres://127.0.0.1/db"); err == nil {
		t.Fatal("a PostgreSQL DSN accepted")
	}
}
