package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// openT opens a driver on path with prefix and closes it at the end of t.
func openT(t testing.TB, path, prefix string) *Driver {
	t.Helper()
	d, err := Open(context.Background(), path, driver.Options{Prefix: prefix})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestDriverSuite runs the shared driver suite. All sub-tests share one
// file, each under its own prefix and with its own Driver (its own write
// connection), as separate processes would.
func TestDriverSuite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "suite.db")
	drivertest.Run(t, testdb.Prefix, func(t *testing.T, prefix string) driver.Driver {
		d, err := Open(context.Background(), path, driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return d
	})
}

// migrated opens and migrates a driver on a fresh file.
func migrated(t *testing.T) *Driver {
	t.Helper()
	d := openT(t, filepath.Join(t.TempDir(), "t.db"), "conveyor_")
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}

func TestOpenDSNForms(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, dsn := range []string{
		filepath.Join(dir, "plain.db"),
		"sqlite:" + filepath.Join(dir, "colon.db"),
		"sqlite://" + filepath.Join(dir, "slashes.db"),
		"file:" + filepath.Join(dir, "uri.db") + "?cache=private",
		filepath.Join(dir, "params.db") + "?_pragma=busy_timeout(2000)",
	} {
		d, err := Open(ctx, dsn, driver.Options{Prefix: "c_"})
		if err != nil {
			t.Fatalf("open %q: %v", dsn, err)
		}
		if _, err := d.Migrate(ctx); err != nil {
			t.Fatalf("migrate %q: %v", dsn, err)
		}
		info, err := d.ServerInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info["journal_mode"] != "wal" || info["synchronous"] != "NORMAL" {
			t.Fatalf("%q: server info %v, want wal/NORMAL", dsn, info)
		}
		if strings.HasSuffix(dsn, "busy_timeout(2000)") != (info["busy_timeout"] == "2000ms") {
			t.Fatalf("%q: busy_timeout %s", dsn, info["busy_timeout"])
		}
		d.Close()
	}
	for _, name := range []string{"plain.db", "colon.db", "slashes.db", "uri.db", "params.db"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("database file not created: %v", err)
		}
	}
}

func TestOpenRejects(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for dsn, want := range map[string]string{
		"postgres://u@localhost/db":                             `scheme "postgres"`,
		"mysql://root@127.0.0.1:3306/test":                      `scheme "mysql"`,
		":memory:":                                              "in-memory",
		"file::memory:?cache=shared":                            "in-memory",
		"file:x.db?mode=memory":                                 "in-memory",
		filepath.Join(dir, "x.db?_txlock=deferred"):             "_txlock",
		filepath.Join(dir, "x.db?_pragma=synchronous(OFF)"):     "synchronous",
		filepath.Join(dir, "x.db?_pragma=journal_mode(DELETE)"): "journal_mode",
		// An exclusive lock held by one connection (the writer) locks
		// the driver's other connections out: every write waited forever.
		filepath.Join(dir, "x.db?_pragma=locking_mode(EXCLUSIVE)"):                      "locking_mode",
		"file:" + filepath.Join(dir, "x.db") + "?_pragma=main.Locking_Mode%3Dexclusive": "locking_mode",
		filepath.Join(dir, "no/such/dir/x.db"):                                          "directory",
	} {
		_, err := Open(ctx, dsn, driver.Options{Prefix: "c_"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("open %q: err %v, want one mentioning %q", dsn, err, want)
		}
	}
	if _, err := Open(ctx, filepath.Join(dir, "y.db"), driver.Options{Prefix: "c_", Synchronous: "OFF"}); err == nil || !strings.Contains(err.Error(), "synchronous") {
		t.Errorf("synchronous OFF: %v, want rejected", err)
	}
	if _, err := Open(ctx, filepath.Join(dir, "y.db"), driver.Options{Prefix: "Bad-Prefix"}); err == nil {
		t.Errorf("bad prefix accepted")
	}
}

func TestSynchronousFull(t *testing.T) {
	ctx := context.Background()
	d, err := Open(ctx, filepath.Join(t.TempDir(), "f.db"), driver.Options{Prefix: "c_", Synchronous: "full"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info, err := d.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info["synchronous"] != "FULL" || info["backend"] != "sqlite" || info["server_version"] == "" || info["sqlite_version"] != info["server_version"] {
		t.Fatalf("server info %v", info)
	}
	c := d.Capabilities()
	if c.Listen || c.MaxArgsBytes != maxArgsBytes {
		t.Fatalf("capabilities %+v", c)
	}
	if l, err := d.Listen(ctx); l != nil || err != nil {
		t.Fatalf("listen: %v %v, want nil, nil", l, err)
	}
}

// TestInsertFieldsAndOrder checks ids come back in input order, args are
// stored byte for byte, and scheduling fields are honoured, including for
// a batch split into several statements.
func TestInsertFieldsAndOrder(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			if split {
				old := insertChunkBytes
				insertChunkBytes = 2000
				t.Cleanup(func() { insertChunkBytes = old })
			}
			d := migrated(t)
			ctx := context.Background()
			past := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
			future := time.Now().Add(time.Hour).Truncate(time.Microsecond)
			args := []string{`{"a": 1,  "b":[1, 2]}`, `{"s":"quote \" backslash \\ tab \t nl \n ctl \u0001 é 日本"}`, `[]`, `"x"`, `123`}
			in := make([]driver.InsertParams, 257)
			for i := range in {
				in[i] = driver.InsertParams{
					Queue: "q" + strconv.Itoa(i%3), Kind: "kind" + strconv.Itoa(i),
					Args: json.RawMessage(args[i%len(args)]), Priority: i % 7, MaxAttempts: i%5 + 1, TimeoutMS: int64(i) - 3,
				}
				switch i % 4 {
				case 1:
					in[i].RunAt = past
				case 2:
					in[i].RunAt = future
				case 3:
					in[i].Delay = time.Hour
				}
			}
			before := time.Now().Add(-time.Second)
			ids, err := d.Insert(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != len(in) {
				t.Fatalf("%d ids for %d jobs", len(ids), len(in))
			}
			for i, id := range ids {
				j, err := d.GetJob(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				p := in[i]
				if j.Kind != p.Kind || j.Queue != p.Queue || string(j.Args) != string(p.Args) || j.Priority != p.Priority ||
					j.MaxAttempts != p.MaxAttempts || j.TimeoutMS != p.TimeoutMS || j.Attempt != 0 || len(j.Errors) != 0 {
					t.Fatalf("job %d (input %d) = %+v, want %+v", id, i, j, p)
				}
				if j.CreatedAt.Before(before) || j.CreatedAt.After(time.Now().Add(time.Second)) || j.CreatedAt.Location() != time.UTC {
					t.Fatalf("created_at %v", j.CreatedAt)
				}
				want := driver.StateAvailable
				switch i % 4 {
				case 0:
					if !j.ScheduledAt.Equal(j.CreatedAt) {
						t.Fatalf("immediate job scheduled at %v, created %v", j.ScheduledAt, j.CreatedAt)
					}
				case 1:
					if !j.ScheduledAt.Equal(past) {
						t.Fatalf("run_at past: %v want %v", j.ScheduledAt, past)
					}
				case 2:
					want = driver.StateScheduled
					if !j.ScheduledAt.Equal(future) {
						t.Fatalf("run_at future: %v want %v", j.ScheduledAt, future)
					}
				case 3:
					want = driver.StateScheduled
					if d := j.ScheduledAt.Sub(j.CreatedAt); d != time.Hour {
						t.Fatalf("delay: scheduled %v after creation, want 1h", d)
					}
				}
				if j.State != want {
					t.Fatalf("input %d: state %s want %s", i, j.State, want)
				}
			}
			// A second insert continues after the first.
			more, err := d.Insert(ctx, in[:2])
			if err != nil || more[0] <= ids[len(ids)-1] || more[1] != more[0]+1 {
				t.Fatalf("second insert ids %v after %d: %v", more, ids[len(ids)-1], err)
			}
		})
	}
}

func TestInsertValidation(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "", Kind: "k"}}); err == nil {
		t.Fatal("empty queue accepted")
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: strings.Repeat("q", 129), Kind: "k"}}); err == nil {
		t.Fatal("129-character queue accepted")
	}
	if ids, err := d.Insert(ctx, []driver.InsertParams{{Queue: strings.Repeat("é", 128), Kind: strings.Repeat("日", 128)}}); err != nil || len(ids) != 1 {
		t.Fatalf("128-character names: %v %v", ids, err)
	}
	if ids, err := d.Insert(ctx, nil); err != nil || len(ids) != 0 {
		t.Fatalf("empty insert: %v %v", ids, err)
	}
}

func TestInsertTx(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	in := []driver.InsertParams{{Queue: "tx", Kind: "k", Args: json.RawMessage(`{}`)}, {Queue: "tx", Kind: "k2", Args: json.RawMessage(`{}`)}}

	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := d.InsertTx(ctx, tx, in)
	if err != nil || len(ids) != 2 || ids[1] != ids[0]+1 {
		t.Fatalf("insert tx: %v %v", ids, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("rolled back job exists: %v", err)
	}

	tx, err = d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err = d.InsertTx(ctx, tx, in)
	if err != nil {
		t.Fatal(err)
	}
	// Not committed by InsertTx: invisible to the read pool until Commit.
	if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("InsertTx job visible before commit: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if j, err := d.GetJob(ctx, ids[1]); err != nil || j.Kind != "k2" {
		t.Fatalf("committed job: %+v %v", j, err)
	}

	for _, bad := range []any{nil, "tx", &sql.DB{}, (*sql.Tx)(nil)} {
		if _, err := d.InsertTx(ctx, bad, in); !errors.Is(err, driver.ErrTxType) || !strings.Contains(err.Error(), "*sql.Tx") {
			t.Fatalf("InsertTx(%T): %v, want ErrTxType naming *sql.Tx", bad, err)
		}
	}
}

func TestMigrations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	ctx := context.Background()
	// Concurrent migrators on separate drivers (separate write
	// connections) apply each version exactly once.
	var wg sync.WaitGroup
	applied := make([][]int, 6)
	errs := make([]error, 6)
	for i := range applied {
		d := openT(t, path, "mig_")
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = d.Migrate(ctx)
		}()
	}
	wg.Wait()
	total := 0
	for i := range applied {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	d := openT(t, path, "mig_")
	cur, latest, err := d.SchemaVersion(ctx)
	if err != nil || cur != latest || total != latest {
		t.Fatalf("version %d/%d, %d applications in all, err %v", cur, latest, total, err)
	}
	// A fresh prefix is at version 0.
	if cur, _, err := openT(t, path, "other_").SchemaVersion(ctx); err != nil || cur != 0 {
		t.Fatalf("unmigrated prefix at %d, %v", cur, err)
	}
	// A newer database is refused, naming both versions.
	if _, err := d.DB().Exec(`INSERT INTO mig_schema_migrations (version, applied_at) VALUES (99, 0)`); err != nil {
		t.Fatal(err)
	}
	_, err = d.Migrate(ctx)
	if !errors.Is(err, driver.ErrSchemaTooNew) || !strings.Contains(err.Error(), "99") || !strings.Contains(err.Error(), strconv.Itoa(latest)) {
		t.Fatalf("migrate on newer schema: %v", err)
	}
	if err := d.DropAll(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := d.DB().QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name LIKE 'mig\_%' ESCAPE '\'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d objects left after DropAll (%v)", n, err)
	}
}

func TestCompleteOutcomes(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	in := make([]driver.InsertParams, 5)
	for i := range in {
		in[i] = driver.InsertParams{Queue: "c", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5}
	}
	ids, _ := d.Insert(ctx, in)
	claim := func(n int) []*driver.JobRow {
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: n, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	if rows := claim(5); len(rows) != 5 {
		t.Fatalf("claimed %d", len(rows))
	}
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	e1 := &driver.AttemptError{At: at, Error: "first"}
	applied, err := d.Complete(ctx, []driver.Outcome{
		{ID: ids[0], Fence: 1, Attempt: 1, State: driver.StateDiscarded, Err: e1},
		{ID: ids[1], Fence: 1, Attempt: 1, State: driver.StateCancelled},
		{ID: ids[2], Fence: 1, Attempt: 1, State: driver.StateRetryable, RetryIn: 0, Err: e1},
		{ID: ids[3], Fence: 1, Attempt: 1, State: driver.StateCompleted},
	})
	if err != nil || len(applied) != 4 {
		t.Fatalf("complete: %v %v", applied, err)
	}
	j0, _ := d.GetJob(ctx, ids[0])
	if j0.State != driver.StateDiscarded || j0.FinalizedAt.IsZero() || !j0.LeaseExpiresAt.IsZero() || len(j0.Errors) != 1 ||
		!j0.Errors[0].At.Equal(at) || j0.Errors[0].Attempt != 1 || j0.Errors[0].Error != "first" {
		t.Fatalf("discarded: %+v", j0)
	}
	j1, _ := d.GetJob(ctx, ids[1])
	if j1.State != driver.StateCancelled || j1.FinalizedAt.IsZero() || len(j1.Errors) != 0 {
		t.Fatalf("cancelled: %+v", j1)
	}
	// The retryable job runs again and fails again: errors accumulate.
	if n, _ := d.Promote(ctx, 10); n["c"] != 1 {
		t.Fatalf("promote retryable: %v", n)
	}
	rows := claim(5)
	if len(rows) != 1 || rows[0].ID != ids[2] || rows[0].Attempt != 2 || len(rows[0].Errors) != 1 {
		t.Fatalf("reclaim: %+v", rows)
	}
	applied, err = d.Complete(ctx, []driver.Outcome{{ID: ids[2], Fence: 2, Attempt: 2, State: driver.StateRetryable, RetryIn: time.Minute,
		Err: &driver.AttemptError{Attempt: 2, At: at, Error: "second", Trace: "t"}}})
	if err != nil || len(applied) != 1 {
		t.Fatalf("complete: %v %v", applied, err)
	}
	j2, _ := d.GetJob(ctx, ids[2])
	if j2.State != driver.StateRetryable || len(j2.Errors) != 2 || j2.Errors[1].Error != "second" || j2.Errors[1].Attempt != 2 ||
		j2.Errors[1].Trace != "t" || !j2.FinalizedAt.IsZero() {
		t.Fatalf("retryable twice: %+v", j2)
	}
	if _, err := d.Complete(ctx, []driver.Outcome{{ID: ids[4], Fence: 1, Attempt: 1, State: driver.StateRunning}}); err == nil {
		t.Fatal("outcome state running accepted")
	}
	// Release of the last running job returns it, uncounted.
	if n, err := d.Release(ctx, []driver.Lease{{ID: ids[4], Fence: 1}, {ID: ids[3], Fence: 1}}); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	j4, _ := d.GetJob(ctx, ids[4])
	if j4.State != driver.StateAvailable || j4.Attempt != 0 || j4.AttemptedBy != "" || !j4.LeaseExpiresAt.IsZero() {
		t.Fatalf("released: %+v", j4)
	}
}

func TestRescueRecordsWorker(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	ids, _ := d.Insert(ctx, []driver.InsertParams{{Queue: "r", Kind: "k", MaxAttempts: 3}})
	if rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Millisecond, Worker: "host/42/ab"}); len(rows) != 1 {
		t.Fatal("claim")
	}
	time.Sleep(20 * time.Millisecond)
	if n, err := d.Rescue(ctx, 10); err != nil || n["r"] != 1 {
		t.Fatalf("rescue: %v %v", n, err)
	}
	j, _ := d.GetJob(ctx, ids[0])
	if j.State != driver.StateAvailable || len(j.Errors) != 1 || j.Errors[0].Attempt != 1 ||
		j.Errors[0].Error != "lease expired: host/42/ab stopped heartbeating" || time.Since(j.Errors[0].At) > time.Minute {
		t.Fatalf("rescued: %+v", j)
	}
}

func TestAdmin(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	in := make([]driver.InsertParams, 10)
	for i := range in {
		in[i] = driver.InsertParams{Queue: "a", Kind: "k" + strconv.Itoa(i%2), MaxAttempts: 1}
	}
	ids, _ := d.Insert(ctx, in)
	rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
	d.Complete(ctx, []driver.Outcome{{ID: rows[0].ID, Fence: 1, Attempt: 1, State: driver.StateCompleted}})

	// Retry from completed grants another attempt.
	j, err := d.Retry(ctx, ids[0])
	if err != nil || j.State != driver.StateAvailable || j.MaxAttempts != 2 || !j.FinalizedAt.IsZero() {
		t.Fatalf("retry completed: %+v %v", j, err)
	}
	if _, err := d.Retry(ctx, ids[0]); !errors.Is(err, driver.ErrWrongState) {
		t.Fatalf("retry available: %v", err)
	}
	for _, f := range []func(context.Context, int64) (*driver.JobRow, error){d.Retry, d.Cancel, d.Discard} {
		if _, err := f(ctx, 1<<50); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("admin on a missing job: %v", err)
		}
	}
	// Cancel a running job: its outcome is then refused.
	rows, _ = d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
	if j, err := d.Cancel(ctx, rows[0].ID); err != nil || j.State != driver.StateCancelled || !j.LeaseExpiresAt.IsZero() {
		t.Fatalf("cancel running: %+v %v", j, err)
	}
	if applied, _ := d.Complete(ctx, []driver.Outcome{{ID: rows[0].ID, Fence: rows[0].Fence, Attempt: rows[0].Attempt, State: driver.StateCompleted}}); len(applied) != 0 {
		t.Fatal("outcome of a cancelled job applied")
	}
	if _, err := d.Discard(ctx, rows[0].ID); !errors.Is(err, driver.ErrWrongState) {
		t.Fatalf("discard cancelled: %v", err)
	}

	// Paging and filters.
	var got []int64
	after := int64(0)
	for {
		page, err := d.ListJobs(ctx, driver.JobFilter{Limit: 3, AfterID: after, Kind: "k0"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, j := range page {
			got = append(got, j.ID)
		}
		after = page[len(page)-1].ID
	}
	if len(got) != 5 || got[0] != ids[0] || got[4] != ids[8] {
		t.Fatalf("paged kind k0: %v (ids %v)", got, ids)
	}
	page, _ := d.ListJobs(ctx, driver.JobFilter{States: []string{driver.StateAvailable, driver.StateCancelled}, Queue: "a"})
	if len(page) != 10 {
		t.Fatalf("list available+cancelled: %d", len(page))
	}
	if page, _ := d.ListJobs(ctx, driver.JobFilter{Queue: "none"}); len(page) != 0 {
		t.Fatalf("list other queue: %d", len(page))
	}

	time.Sleep(30 * time.Millisecond)
	st, err := d.Stats(ctx)
	if err != nil || len(st) != 1 || st[0].Queue != "a" || st[0].Counts[driver.StateAvailable] != 9 ||
		st[0].Counts[driver.StateCancelled] != 1 || len(st[0].Counts) != len(driver.AllStates) {
		t.Fatalf("stats %+v %v", st, err)
	}
	if st[0].OldestAvailable < 30*time.Millisecond || st[0].OldestAvailable > time.Minute {
		t.Fatalf("oldest available %v", st[0].OldestAvailable)
	}
}

// TestBusyRetried holds the write lock from a foreign connection (as
// another process would) for longer than busy_timeout: the driver's calls
// wait and succeed instead of failing with "database is locked".
func TestBusyRetried(t *testing.T) {
	path := filepath.Join(t.TempDir(), "busy.db")
	d := openT(t, path+"?_pragma=busy_timeout(20)", "b_")
	ctx := context.Background()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ids, _ := d.Insert(ctx, []driver.InsertParams{{Queue: "b", Kind: "k"}, {Queue: "b", Kind: "k"}})
	other, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(20)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	committing := make(chan time.Time, 1)
	time.AfterFunc(300*time.Millisecond, func() {
		committing <- time.Now()
		conn.ExecContext(ctx, "COMMIT")
	})
	start := time.Now()
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "b", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim under a foreign lock: %v %v", rows, err)
	}
	if time.Since(start) < 250*time.Millisecond {
		t.Fatalf("claim did not wait for the lock (%v)", time.Since(start))
	}
	// The lease ran from when the claim took the lock, not from when it
	// was asked for, and LeaseFrom says so without overstating it.
	from, commit := rows[0].LeaseFrom, <-committing
	if from.Before(commit.Add(-time.Millisecond)) {
		t.Fatalf("LeaseFrom %v is before the foreign lock was let go (%v)", from, commit)
	}
	if dbStart := rows[0].LeaseExpiresAt.Add(-time.Minute); dbStart.Before(from) {
		t.Fatalf("LeaseFrom %v is after the database started the lease (%v)", from, dbStart)
	}
	if d.Counters()["busy_retries"] == 0 {
		t.Fatalf("busy retries not counted: %v", d.Counters())
	}
	// A context that ends while locked returns the context's error.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = d.Complete(cctx, []driver.Outcome{{ID: ids[0], Fence: 1, Attempt: 1, State: driver.StateCompleted}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("complete with a deadline under a held lock: %v", err)
	}
}

// TestWALShrinksAfterHold: while a reader holds a snapshot the WAL grows
// past the limit (checkpoints cannot pass the reader); once the reader is
// gone, checkpoints complete and the next writes start the WAL over,
// truncating the file back to walSizeLimit instead of leaving it at the
// size the hold made it.
func TestWALShrinksAfterHold(t *testing.T) {
	old, oldInterval := walSizeLimit, checkpointInterval
	walSizeLimit = 256 << 10
	// Rounds of the checkpointer a few commits apart, so that one comes
	// before the frames in use since the WAL started over pass the limit.
	checkpointInterval = 5 * time.Millisecond
	defer func() { walSizeLimit, checkpointInterval = old, oldInterval }()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "wal.db")
	d := openT(t, path, "c_")
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	insert := func(n int) {
		args := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2000) + `"}`)
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = driver.InsertParams{Queue: "q", Kind: "k", Args: args}
		}
		for i := 0; i < n; i += 50 {
			if _, err := d.Insert(ctx, in[i:min(i+50, n)]); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The reader: a separate handle, in a read transaction that has read.
	rdb, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	tx, err := rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM c_jobs").Scan(&n); err != nil {
		t.Fatal(err)
	}
	insert(2000) // about 4 MB of pages
	held := walSize()
	if held <= 4*walSizeLimit {
		t.Fatalf("WAL is %d bytes with a snapshot held, want it grown well past %d", held, walSizeLimit)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	// Further writes, one small job at a time: the checkpointer copies
	// the backlog, the WAL starts over, and the checkpointer cuts the file
	// back to the limit. The file then grows again until the WAL next
	// starts over, so the size to look for is the smallest seen after a
	// commit: without the limit it never falls below the held peak. The
	// deadline only bounds a broken run.
	args := json.RawMessage(`{"pad":"x"}`)
	smallest := held
	for deadline := time.Now().Add(time.Minute); smallest > walSizeLimit && time.Now().Before(deadline); {
		if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Args: args}}); err != nil {
			t.Fatal(err)
		}
		smallest = min(smallest, walSize())
	}
	if smallest > walSizeLimit {
		t.Fatalf("WAL never fell below %d bytes after the hold ended (was %d while held), want at most %d", smallest, held, walSizeLimit)
	}
}

// TestNewLeaseConnectionKeepsHandleSizeLimit: on the application's own
// handle (New) the WAL's journal_size_limit is the application's, as its
// synchronous mode is: the lease path's connection takes the handle's
// setting instead of imposing the driver's 64 MiB, which would truncate
// the WAL to a size the application did not choose (or at all, when it
// set none).
func TestNewLeaseConnectionKeepsHandleSizeLimit(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		pragma string
		want   int64
	}{
		{"&_pragma=journal_size_limit(12345)", 12345},
		{"", -1}, // SQLite's default: no limit
	} {
		path := filepath.Join(t.TempDir(), "own.db")
		db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)"+tc.pragma)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		d, err := New(ctx, db, driver.Options{Prefix: "c_"})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		var got int64
		if err := d.lw.QueryRowContext(ctx, "PRAGMA journal_size_limit").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("handle %q: the lease connection's journal_size_limit is %d, want the handle's %d", tc.pragma, got, tc.want)
		}
	}
}
