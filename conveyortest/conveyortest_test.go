package conveyortest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/conveyortest"
	"github.com/conveyorq/conveyor/conveyortest/sqlitetest"
	"github.com/conveyorq/conveyor/driver/pgxv5"
	"github.com/conveyorq/conveyor/driver/sqlitedb"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// email is the kind the tests enqueue; its handler does what Subject says.
type email struct {
	To      string   `json:"to"`
	Subject string   `json:"subject"`
	Tags    []string `json:"tags,omitempty"`
	N       int      `json:"n"`
}

func (email) Kind() string { return "email" }

// env is a client on one backend and a way to begin the application's
// own transaction there.
type env struct {
	c     *conveyor.Client[any]
	begin func(t *testing.T) (tx any, commit, rollback func() error)
}

// forEachBackend runs fn on SQLite (sqlitetest.Open), and on
// PostgreSQL (the application's pgx pool) and MySQL/MariaDB (the
// application's database/sql handle, whose connections read times as
// text) when they are reachable.
func forEachBackend(t *testing.T, cfg conveyor.Config, fn func(t *testing.T, e env)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db := sqlitetest.Open(t, &cfg)
		// A Client[any] on the same handle, so that one env type serves
		// every backend.
		c, err := conveyor.New(context.Background(), conveyor.AnyTx(sqlitedb.New(db.DB)), &cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fn(t, env{c, func(t *testing.T) (any, func() error, func() error) {
			tx, err := db.Driver.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, testdb.Postgres(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		c := migrated(t, func(cfg *conveyor.Config) (*conveyor.Client[any], error) {
			return conveyor.New(ctx, conveyor.AnyTx(pgxv5.New(pool)), cfg)
		}, cfg)
		fn(t, env{c, func(t *testing.T) (any, func() error, func() error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		}})
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		dsn := testdb.MySQL(t)
		c := migrated(t, func(cfg *conveyor.Config) (*conveyor.Client[any], error) {
			return connect.Open(context.Background(), dsn, cfg)
		}, cfg)
		app, err := lab.MySQLConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := gomysql.NewConnector(app)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		t.Cleanup(func() { db.Close() })
		fn(t, env{c, func(t *testing.T) (any, func() error, func() error) {
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback
		}})
	})
}

// migrated opens a client on a shared server under a fresh prefix,
// migrates it, and drops its tables and closes it when the test ends.
func migrated(t *testing.T, open func(*conveyor.Config) (*conveyor.Client[any], error), cfg conveyor.Config) *conveyor.Client[any] {
	t.Helper()
	cfg.TablePrefix = testdb.Prefix()
	c, err := open(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.DropTables(context.Background(), c); err != nil {
			t.Errorf("drop: %v", err)
		}
		c.Close()
	})
	if _, err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does, so that failures can be checked.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs fn with a recorder and returns what it failed with ("" if it
// did not fail).
func fails(t *testing.T, fn func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.msg
}

func TestEnqueuedAssertions(t *testing.T) {
	forEachBackend(t, conveyor.Config{}, func(t *testing.T, e env) {
		ctx := context.Background()
		c := e.c
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[email]) error { return nil })); err != nil {
			t.Fatal(err)
		}
		// Inside the transaction, before the commit: seen there only.
		tx, commit, _ := e.begin(t)
		a := email{To: "a@example.com", Subject: "hi", Tags: []string{"x", "y"}, N: 1}
		id, err := c.EnqueueTx(ctx, tx, a, &conveyor.EnqueueOpts{Queue: "mail"})
		if err != nil {
			t.Fatal(err)
		}
		got := conveyortest.RequireEnqueuedTx(t, c, tx, &conveyortest.Filter[email]{Args: `{"to": "a@example.com"}`})
		if len(got) != 1 || got[0].ID != id || got[0].Args.Subject != "hi" || got[0].Queue != "mail" || got[0].State != conveyor.JobStateAvailable {
			t.Fatalf("jobs in the transaction: %+v", got)
		}
		conveyortest.RequireNotEnqueued[email](t, c, nil)
		if msg := fails(t, func(tb testing.TB) { conveyortest.RequireEnqueued[email](tb, c, nil) }); !strings.Contains(msg, `no job of kind "email" was enqueued (committed); there is no job of the kind at all`) {
			t.Fatalf("RequireEnqueued before the commit failed with %q", msg)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}

		// Committed: every kind of filter.
		b := email{To: "b@example.com", Subject: "later", N: 2}
		if _, err := c.Enqueue(ctx, b, &conveyor.EnqueueOpts{Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
		for _, c2 := range []struct {
			name string
			f    *conveyortest.Filter[email]
			want []string // recipients, oldest first
		}{
			{"nil filter", nil, []string{a.To, b.To}},
			{"JSON text", &conveyortest.Filter[email]{Args: `{"n": 2}`}, []string{b.To}},
			{"raw JSON", &conveyortest.Filter[email]{Args: json.RawMessage(`{"subject":"hi","n":1.0}`)}, []string{a.To}},
			{"bytes", &conveyortest.Filter[email]{Args: []byte(`{}`)}, []string{a.To, b.To}},
			{"map", &conveyortest.Filter[email]{Args: map[string]any{"to": b.To}}, []string{b.To}},
			{"whole struct", &conveyortest.Filter[email]{Args: a}, []string{a.To}},
			{"array equal", &conveyortest.Filter[email]{Args: `{"tags": ["x", "y"]}`}, []string{a.To}},
			{"array shorter", &conveyortest.Filter[email]{Args: `{"tags": ["x"]}`}, nil},
			{"absent key", &conveyortest.Filter[email]{Args: `{"cc": null}`}, nil},
			{"wrong type", &conveyortest.Filter[email]{Args: `{"n": "1"}`}, nil},
			{"match", &conveyortest.Filter[email]{Match: func(j *conveyor.Job[email]) bool { return j.Args.N > 1 }}, []string{b.To}},
			{"queue", &conveyortest.Filter[email]{Queue: "mail"}, []string{a.To}},
			{"state", &conveyortest.Filter[email]{States: []conveyor.JobState{conveyor.JobStateScheduled}}, []string{b.To}},
			{"all of them", &conveyortest.Filter[email]{Args: `{"n":1}`, Queue: "mail", Match: func(j *conveyor.Job[email]) bool { return j.Args.To == a.To }}, []string{a.To}},
			{"none of them", &conveyortest.Filter[email]{Args: `{"n":1}`, Queue: conveyor.DefaultQueue}, nil},
		} {
			var to []string
			for _, j := range conveyortest.Enqueued(t, c, c2.f) {
				to = append(to, j.Args.To)
			}
			if fmt.Sprint(to) != fmt.Sprint(c2.want) {
				t.Errorf("%s: matched %v, want %v", c2.name, to, c2.want)
			}
		}
		msg := fails(t, func(tb testing.TB) {
			conveyortest.RequireEnqueued(tb, c, &conveyortest.Filter[email]{Args: `{"to":"c@example.com"}`, Queue: "mail"})
		})
		if !strings.Contains(msg, `no job of kind "email" with arguments containing {"to":"c@example.com"}, in queue "mail" was enqueued`) || !strings.Contains(msg, `queue "mail", available, arguments {`) {
			t.Errorf("RequireEnqueued failed with %q, want the filter and the jobs of the kind", msg)
		}
		msg = fails(t, func(tb testing.TB) {
			conveyortest.RequireNotEnqueued(tb, c, &conveyortest.Filter[email]{Args: `{"n":2}`})
		})
		if !strings.Contains(msg, `1 jobs of kind "email" with arguments containing {"n":2} were enqueued (committed), want none`) || !strings.Contains(msg, "b@example.com") {
			t.Errorf("RequireNotEnqueued failed with %q", msg)
		}
		if msg := fails(t, func(tb testing.TB) { conveyortest.Enqueued(tb, c, &conveyortest.Filter[email]{Args: `{"to":`}) }); !strings.Contains(msg, "Filter.Args") {
			t.Errorf("a filter that is not JSON failed with %q", msg)
		}

		// A rolled back transaction leaves nothing; inside it, before the
		// rollback, the committed jobs are seen as well.
		tx, _, rollback := e.begin(t)
		if _, err := c.EnqueueTx(ctx, tx, email{To: "d@example.com"}, nil); err != nil {
			t.Fatal(err)
		}
		if n := len(conveyortest.EnqueuedTx[email](t, c, tx, nil)); n != 3 {
			t.Errorf("%d jobs seen in the transaction, want the 2 committed and its own", n)
		}
		conveyortest.RequireNotEnqueuedTx(t, c, tx, &conveyortest.Filter[email]{Args: `{"to":"e@example.com"}`})
		if msg := fails(t, func(tb testing.TB) {
			conveyortest.RequireNotEnqueuedTx(tb, c, tx, &conveyortest.Filter[email]{Args: `{"to":"d@example.com"}`})
		}); !strings.Contains(msg, "are in the transaction, want none") {
			t.Errorf("RequireNotEnqueuedTx failed with %q", msg)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		conveyortest.RequireNotEnqueued(t, c, &conveyortest.Filter[email]{Args: `{"to":"d@example.com"}`})
		if msg := fails(t, func(tb testing.TB) { conveyortest.EnqueuedTx[email](tb, c, "not a transaction", nil) }); !strings.Contains(msg, "transaction") {
			t.Errorf("a string as the transaction failed with %q", msg)
		}
	})
}

func TestWork(t *testing.T) {
	forEachBackend(t, conveyor.Config{JobTimeout: time.Hour}, func(t *testing.T, e env) {
		ctx := context.Background()
		c := e.c
		errSMTP := errors.New("smtp down")
		var cancelled atomic.Int64
		err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[email]) error {
			switch j.Args.Subject {
			case "fail":
				return fmt.Errorf("sending to %s: %w", j.Args.To, errSMTP)
			case "cancel":
				return conveyor.JobCancel(errors.New("bounced"))
			case "panic":
				panic("template missing")
			case "slow":
				<-ctx.Done()
				return ctx.Err()
			case "cancel-self":
				// Cancelled by hand while it runs: its outcome is refused.
				if _, err := c.Cancel(context.Background(), j.ID); err != nil {
					return err
				}
				cancelled.Add(1)
			}
			return nil
		}), conveyor.WorkerOpts{
			Timeout: 50 * time.Millisecond,
			Backoff: func(attempt int) time.Duration { return time.Duration(attempt) * time.Hour },
		})
		if err != nil {
			t.Fatal(err)
		}
		enqueue := func(subject string, opts *conveyor.EnqueueOpts) int64 {
			t.Helper()
			id, err := c.Enqueue(ctx, email{To: "a@example.com", Subject: subject}, opts)
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		hour := func(t *testing.T, what string, j *conveyor.JobInfo, hours int) {
			t.Helper()
			want := time.Duration(hours) * time.Hour
			if wait := j.ScheduledAt.Sub(j.AttemptedAt); wait < want || wait > want+time.Minute {
				t.Errorf("%s: retry scheduled %v after the attempt, want the kind's backoff %v", what, wait, want)
			}
		}

		ok := enqueue("ok", nil)
		r := conveyortest.Work(t, c, ok)
		if r.Err != nil || !r.Applied || r.Job.State != conveyor.JobStateCompleted || r.Job.Attempt != 1 || r.Job.FinalizedAt.IsZero() {
			t.Errorf("ok: %+v %+v", r, r.Job)
		}

		fail := enqueue("fail", &conveyor.EnqueueOpts{MaxAttempts: 3})
		r = conveyortest.Work(t, c, fail)
		if !errors.Is(r.Err, errSMTP) || r.Job.State != conveyor.JobStateRetryable || len(r.Job.Errors) != 1 || r.Job.Errors[0].Error != "sending to a@example.com: smtp down" {
			t.Errorf("fail: err %v, job %+v", r.Err, r.Job)
		}
		hour(t, "first failure", r.Job, 1)
		// A retryable job runs again at once, its backoff growing.
		r = conveyortest.Work(t, c, fail)
		if r.Job.State != conveyor.JobStateRetryable || r.Job.Attempt != 2 || len(r.Job.Errors) != 2 {
			t.Errorf("second failure: %+v", r.Job)
		}
		hour(t, "second failure", r.Job, 2)
		r = conveyortest.Work(t, c, fail)
		if r.Job.State != conveyor.JobStateDiscarded || r.Job.Attempt != 3 || len(r.Job.Errors) != 3 {
			t.Errorf("last attempt: %+v", r.Job)
		}

		r = conveyortest.Work(t, c, enqueue("cancel", nil))
		if r.Job.State != conveyor.JobStateCancelled || !strings.Contains(r.Job.Errors[0].Error, "bounced") {
			t.Errorf("JobCancel: %+v", r.Job)
		}

		r = conveyortest.Work(t, c, enqueue("panic", nil))
		if r.Job.State != conveyor.JobStateRetryable || !strings.Contains(r.Err.Error(), "template missing") || !strings.Contains(r.Job.Errors[0].Trace, "goroutine") {
			t.Errorf("panic: err %v, job %+v", r.Err, r.Job)
		}

		// The kind's 50ms timeout, not the client's hour; a job's own
		// timeout beats the kind's.
		r = conveyortest.Work(t, c, enqueue("slow", nil))
		if r.Job.State != conveyor.JobStateRetryable || !strings.Contains(r.Job.Errors[0].Error, "timed out after 50ms") {
			t.Errorf("kind timeout: %+v", r.Job.Errors)
		}
		r = conveyortest.Work(t, c, enqueue("slow", &conveyor.EnqueueOpts{Timeout: 20 * time.Millisecond}))
		if !strings.Contains(r.Job.Errors[0].Error, "timed out after 20ms") {
			t.Errorf("own timeout: %+v", r.Job.Errors)
		}

		// A job scheduled for later runs now.
		r = conveyortest.Work(t, c, enqueue("ok", &conveyor.EnqueueOpts{Delay: time.Hour}))
		if r.Job.State != conveyor.JobStateCompleted {
			t.Errorf("scheduled job: %+v", r.Job)
		}

		// Cancelled while it ran: the database refuses its completion.
		r = conveyortest.Work(t, c, enqueue("cancel-self", nil))
		if r.Applied || r.Err != nil || r.Job.State != conveyor.JobStateCancelled || cancelled.Load() != 1 {
			t.Errorf("cancelled while running: applied %v err %v job %+v", r.Applied, r.Err, r.Job)
		}

		// Values of the caller's context reach the handler.
		type key struct{}
		seen := make(chan any, 1)
		vctx := context.WithValue(context.Background(), key{}, "v")
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[ctxKind]) error {
			seen <- ctx.Value(key{})
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		id, err := c.Enqueue(ctx, ctxKind{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r := conveyortest.WorkContext(vctx, t, c, id); r.Job.State != conveyor.JobStateCompleted || <-seen != "v" {
			t.Errorf("WorkContext: %+v", r.Job)
		}

		// What cannot be worked fails the test.
		if msg := fails(t, func(tb testing.TB) { conveyortest.Work(tb, c, ok) }); !strings.Contains(msg, fmt.Sprintf("working job %d", ok)) || !strings.Contains(msg, "completed") {
			t.Errorf("Work of a completed job failed with %q", msg)
		}
		if msg := fails(t, func(tb testing.TB) { conveyortest.Work(tb, c, 1<<40) }); !strings.Contains(msg, "not found") {
			t.Errorf("Work of a missing job failed with %q", msg)
		}
	})
}

// ctxKind is a kind whose handler reports a context value.
type ctxKind struct{}

func (ctxKind) Kind() string { return "ctx_kind" }

// A kind no worker of the client handles fails its attempt as it would
// in a running client, and is retried.
func TestWorkUnknownKind(t *testing.T) {
	db := sqlitetest.Open(t, nil)
	id, err := db.Client.Enqueue(context.Background(), email{To: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := conveyortest.Work(t, db.Client, id)
	if r.Job.State != conveyor.JobStateRetryable || r.Err == nil || !strings.Contains(r.Job.Errors[0].Error, `unknown job kind "email"`) {
		t.Fatalf("unknown kind: err %v, job %+v", r.Err, r.Job)
	}
}

// sqlitetest.Open's database is the test's: its handle works for the test's
// own tables, and the client runs on it.
func TestSQLiteTestOpen(t *testing.T) {
	db := sqlitetest.Open(t, &conveyor.Config{TablePrefix: "q_"})
	if db.Client.Backend() != "sqlite" || db.Client.Config().TablePrefix != "q_" {
		t.Fatalf("client on %s with prefix %q", db.Client.Backend(), db.Client.Config().TablePrefix)
	}
	if _, err := db.DB.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.DB.QueryRow("SELECT count(*) FROM q_jobs").Scan(&n); err != nil || n != 0 {
		t.Fatalf("jobs table: %d, %v", n, err)
	}
}

// The package links no PostgreSQL or MySQL code: a SQLite-only test does
// not build pgx or go-sql-driver.
func TestLinksNoOtherBackend(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		testdb.Missing(t, "a working go command (go list -deps): %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/jackc/", "github.com/go-sql-driver/", "gonum.org/", "conveyor/internal/backend/postgres", "conveyor/internal/backend/mysql", "conveyor/connect"} {
			if strings.Contains(dep, banned) {
				t.Errorf("conveyortest links %s", dep)
			}
		}
	}
}
