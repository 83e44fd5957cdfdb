package conveyor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
	"github.com/conveyorq/conveyor/lab"
)

func TestMain(m *testing.M) {
	code := m.Run()
	bouncer.Stop()
	stopGalera()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// bouncer is the PgBouncer (transaction pooling) in front of the
// PostgreSQL test server that the postgres-pgbouncer backend goes
// through, shared by every test of this binary and stopped by TestMain.
// Its 20 server connections (PgBouncer's default) are fewer than the
// transactions some tests hold open at once (TestUniqueUnderConcurrency:
// 33 callers' own, each enqueueing in it).
var bouncer = &topology.SharedPgBouncer{Options: topology.PgBouncerOptions{Mode: "transaction", PoolSize: 20}}

// The mysql-galera backend: one 3-node cluster per test binary, started
// by the first test that needs it. Each call of galeraDSN, and each client
// openClient opens on one of its DSNs, takes the next node, so that the
// clients of a test are spread over the nodes and write on all of them.
var (
	galeraOnce sync.Once
	galera     atomic.Pointer[topology.Galera]
	galeraErr  error
)

func galeraDSN(t *testing.T) string {
	t.Helper()
	topology.NeedGalera(t)
	galeraOnce.Do(func() {
		var g *topology.Galera
		g, galeraErr = topology.StartGalera(context.Background(), 3)
		galera.Store(g)
	})
	if galeraErr != nil {
		t.Fatalf("mysql-galera backend: %v", galeraErr)
	}
	return galera.Load().NextDSN()
}

func stopGalera() {
	if g := galera.Load(); g != nil {
		g.Stop()
	}
}

// spread returns dsn for the first client a test opens and the next
// node's DSN for each further one, when dsn is a node of the Galera
// cluster; otherwise dsn. The first client stays on the test's node, so
// that a test's own transactions (beginTx(dsn)) and lock waits meet the
// client they are about on one node.
func spread(t *testing.T, dsn string) string {
	g := galera.Load()
	if g == nil || !slices.Contains(g.DSNs(), dsn) {
		return dsn
	}
	spreadMu.Lock()
	defer spreadMu.Unlock()
	spreadOpened[t.Name()]++
	if spreadOpened[t.Name()] == 1 {
		return dsn
	}
	return g.NextDSN()
}

var (
	spreadMu     sync.Mutex
	spreadOpened = map[string]int{}
)

type backend struct {
	name string
	dsn  func(t *testing.T) string
}

var backends = []backend{
	{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "conveyor.db") }},
	{"postgres", func(t *testing.T) string { return testdb.Postgres(t) }},
	{"mysql", func(t *testing.T) string { return testdb.MySQL(t) }},
	{"postgres-pgbouncer", pgbouncerDSN},
	{"mysql-galera", galeraDSN},
}

// pgbouncerDSN returns the DSN of the postgres-pgbouncer backend,
// configured as the documentation asks of an application behind
// PgBouncer in transaction pooling: statements described and executed
// unnamed (default_query_exec_mode=cache_describe, which conveyor would
// choose by itself, but the application's own transactions need too) and
// the listener and the registry's reader on a direct connection
// (conveyor_direct_dsn).
func pgbouncerDSN(t *testing.T) string {
	direct := testdb.Postgres(t)
	return bouncer.Get(t).DSN("sslmode=disable&default_query_exec_mode=cache_describe&conveyor_direct_dsn=" + url.QueryEscape(direct))
}

// appDSN is dsn as the application's own connections take it: without
// conveyor's listen DSN parameter, which PgBouncer would refuse as a
// startup parameter.
func appDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || !u.Query().Has("conveyor_direct_dsn") {
		return dsn
	}
	q := u.Query()
	q.Del("conveyor_direct_dsn")
	u.RawQuery = q.Encode()
	return u.String()
}

// forEachBackend runs fn against every backend on a real database.
func forEachBackend(t *testing.T, fn func(t *testing.T, dsn string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.dsn(t))
		})
	}
}

type noop struct {
	N int `json:"n"`
}

func (noop) Kind() string { return "noop" }

type tagged struct {
	Tag string `json:"tag"`
}

func (tagged) Kind() string { return "tagged" }

// fast is a test configuration with short intervals.
func fast(prefix string) *conveyor.Config {
	return &conveyor.Config{
		TablePrefix:     prefix,
		Lease:           2 * time.Second,
		PromoteInterval: 20 * time.Millisecond,
		RescueInterval:  100 * time.Millisecond,
		PollMax:         100 * time.Millisecond,
		ListenPoll:      200 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second,
		Backoff:         func(int) time.Duration { return 10 * time.Millisecond },
	}
}

// open opens a migrated client on dsn; at the end of the test it is
// stopped and closed.
func open(t *testing.T, dsn string, cfg *conveyor.Config) *conveyor.Client[any] {
	return openClient(t, dsn, cfg, false)
}

// openDropped is open, and also drops the prefix's tables at the end. Open
// it first: cleanups run last-in first-out, so the other clients of the
// prefix are closed before the tables go.
func openDropped(t *testing.T, dsn string, cfg *conveyor.Config) *conveyor.Client[any] {
	return openClient(t, dsn, cfg, true)
}

func openClient(t *testing.T, dsn string, cfg *conveyor.Config, drop bool) *conveyor.Client[any] {
	t.Helper()
	ctx := context.Background()
	c, err := connect.Open(ctx, spread(t, dsn), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		if drop {
			if err := lab.DropTables(ctx, c); err != nil {
				t.Errorf("drop: %v", err)
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

func totalJobs(t *testing.T, c *conveyor.Client[any]) int64 {
	t.Helper()
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, q := range st.Queues {
		for _, k := range q.Counts {
			n += k
		}
	}
	return n
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func jobState(t *testing.T, c *conveyor.Client[any], id int64) *conveyor.JobInfo {
	t.Helper()
	j, err := c.Job(context.Background(), id)
	if err != nil {
		t.Fatalf("job %d: %v", id, err)
	}
	return j
}

// execRecord counts executions per job id without a lock shared by all
// workers being held across work.
type execRecord struct {
	mu sync.Mutex
	n  map[int64]int
}

func (r *execRecord) add(id int64) {
	r.mu.Lock()
	if r.n == nil {
		r.n = map[int64]int{}
	}
	r.n[id]++
	r.mu.Unlock()
}

func (r *execRecord) snapshot() map[int64]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int64]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// beginTx opens the application's own transaction on the backend.
func beginTx(t *testing.T, dsn string) (tx any, commit, rollback func() error) {
	t.Helper()
	tx, commit, rollback, done, err := openTx(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	return tx, commit, rollback
}

// openTx begins a transaction on a connection of its own to dsn, as an
// application would on its handle; done closes the connection. Safe to
// call from any goroutine.
func openTx(ctx context.Context, dsn string) (tx any, commit, rollback func() error, done func(), err error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"):
		conn, err := pgx.Connect(ctx, appDSN(dsn))
		if err != nil {
			return nil, nil, nil, nil, err
		}
		done := func() { conn.Close(context.Background()) }
		ptx, err := conn.Begin(ctx)
		if err != nil {
			done()
			return nil, nil, nil, nil, err
		}
		return ptx, func() error { return ptx.Commit(ctx) }, func() error { return ptx.Rollback(ctx) }, done, nil
	case strings.HasPrefix(dsn, "mysql://"):
		u, _ := url.Parse(dsn)
		db, err := sql.Open("mysql", fmt.Sprintf("%s@tcp(%s)%s?parseTime=true", u.User.String(), u.Host, u.Path))
		if err != nil {
			return nil, nil, nil, nil, err
		}
		stx, err := db.BeginTx(ctx, nil)
		if err != nil {
			db.Close()
			return nil, nil, nil, nil, err
		}
		return stx, stx.Commit, stx.Rollback, func() { db.Close() }, nil
	default:
		db, err := sql.Open("sqlite", "file:"+dsn+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			return nil, nil, nil, nil, err
		}
		stx, err := db.BeginTx(ctx, nil)
		if err != nil {
			db.Close()
			return nil, nil, nil, nil, err
		}
		return stx, stx.Commit, stx.Rollback, func() { db.Close() }, nil
	}
}

func TestTransactionalEnqueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		var rec execRecord
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
			rec.add(j.ID)
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}

		// Rolled back: never exists.
		tx, _, rollback := beginTx(t, dsn)
		if _, err := c.EnqueueTx(ctx, tx, tagged{"rollback"}, nil); err != nil {
			t.Fatalf("enqueue in tx: %v", err)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		if n := totalJobs(t, c); n != 0 {
			t.Fatalf("%d jobs exist after the enqueueing transaction rolled back", n)
		}

		// Committed: invisible to workers until commit, then worked.
		tx, commit, _ := beginTx(t, dsn)
		id, err := c.EnqueueTx(ctx, tx, tagged{"commit"}, nil)
		if err != nil {
			t.Fatalf("enqueue in tx: %v", err)
		}
		// Claims ran while the transaction was open (on SQLite they wait
		// for its write lock instead: nothing to wait for).
		if c.Backend() != "sqlite" {
			claimedSince(t, []*conveyor.Client[any]{c}, 2)
		}
		if rec.snapshot()[id] != 0 {
			t.Fatal("a worker ran a job whose transaction had not committed")
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "committed job to complete", 10*time.Second, func() bool {
			return jobState(t, c, id).State == conveyor.JobStateCompleted
		})
		if n := totalJobs(t, c); n != 1 {
			t.Fatalf("%d jobs exist, want only the committed one", n)
		}
		if got := rec.snapshot(); len(got) != 1 || got[id] != 1 {
			t.Fatalf("executions %v, want exactly job %d once", got, id)
		}
		// A transaction of the wrong type is refused with a clear error.
		if _, err := c.EnqueueTx(ctx, "not a tx", tagged{"x"}, nil); !errors.Is(err, conveyor.ErrTxType) {
			t.Fatalf("wrong tx type: %v, want ErrTxType", err)
		}
	})
}

func TestNoJobHandedToTwoWorkers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		const n = 3000
		var rec execRecord
		var done atomic.Int64
		var clients []*conveyor.Client[any]
		for i := 0; i < 3; i++ {
			cfg := fast(prefix)
			cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 20}}
			cfg.ClaimBatch = 7
			var c *conveyor.Client[any]
			if i == 0 {
				c = openDropped(t, dsn, cfg)
			} else {
				c = open(t, dsn, cfg)
			}
			conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
				rec.add(j.ID)
				done.Add(1)
				return nil
			}))
			clients = append(clients, c)
		}
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: noop{i}}
		}
		if _, err := clients[0].EnqueueBulk(ctx, items); err != nil {
			t.Fatal(err)
		}
		for _, c := range clients {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "all jobs executed", 60*time.Second, func() bool { return done.Load() >= n })
		// Once every job is completed in the database none can be
		// claimed again, and every execution that happened is recorded
		// (a second execution of a job starts before the completion
		// that ends it): the count is final, not a count after a pause.
		waitFor(t, "all completions written", 20*time.Second, func() bool {
			st, err := clients[0].Stats(ctx)
			return err == nil && len(st.Queues) == 1 && st.Queues[0].Counts[conveyor.JobStateCompleted] == n
		})
		got := rec.snapshot()
		if len(got) != n {
			t.Fatalf("%d distinct jobs executed, want %d", len(got), n)
		}
		for id, k := range got {
			if k != 1 {
				t.Fatalf("job %d executed %d times", id, k)
			}
		}
	})
}

func TestRetriesBackoffDiscard(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		var attempts atomic.Int64
		var gaps sync.Map
		var last atomic.Int64
		cfg.Backoff = func(a int) time.Duration { return time.Duration(a) * 100 * time.Millisecond }
		c := openDropped(t, dsn, cfg)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			now := time.Now().UnixNano()
			if p := last.Swap(now); p != 0 {
				gaps.Store(j.Attempt, time.Duration(now-p))
			}
			attempts.Add(1)
			return fmt.Errorf("failure %d", j.Attempt)
		}))
		id, err := c.Enqueue(ctx, noop{}, &conveyor.EnqueueOpts{MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		c.Start(ctx)
		waitFor(t, "job discarded", 20*time.Second, func() bool { return jobState(t, c, id).State == conveyor.JobStateDiscarded })
		j := jobState(t, c, id)
		if j.Attempt != 3 || attempts.Load() != 3 || len(j.Errors) != 3 {
			t.Fatalf("attempt %d, executions %d, errors %d; want 3 each", j.Attempt, attempts.Load(), len(j.Errors))
		}
		for i, e := range j.Errors {
			if e.Attempt != i+1 || e.Error != fmt.Sprintf("failure %d", i+1) {
				t.Fatalf("error %d = %+v", i, e)
			}
		}
		// Backoff after attempt a is a*100ms: the gaps must be at least that.
		for a := 2; a <= 3; a++ {
			g, _ := gaps.Load(a)
			if g.(time.Duration) < time.Duration(a-1)*100*time.Millisecond {
				t.Fatalf("attempt %d started %v after the previous one, before its backoff", a, g)
			}
		}
		// Re-enqueued by hand, it runs once more.
		if _, err := c.Retry(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "retried job discarded again", 10*time.Second, func() bool {
			j := jobState(t, c, id)
			return j.State == conveyor.JobStateDiscarded && j.Attempt == 4
		})
	})
}

// A graceful release gives the attempt number back, so the next claim
// runs the same attempt number again. The fence token is not given back:
// a remote worker, for which the engine keeps no bookkeeping of its own,
// acknowledges its released attempt late, and the database alone refuses
// it while the next claim runs; the job ends completed by the attempt that
// owns it.
func TestStaleAckAfterReleaseRefusedByDatabase(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		a := openDropped(t, dsn, fast(prefix))
		id, err := a.Enqueue(ctx, noop{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := a.RemoteWorkers().Claim(ctx, conveyor.RemoteClaim{Worker: "A", Lease: time.Minute})
		if err != nil || len(claimed) != 1 || claimed[0].ID != id || claimed[0].Attempt != 1 {
			t.Fatalf("A's claim: %+v err %v", claimed, err)
		}
		fenceA := claimed[0].Fence
		// A's attempt is released, as its shutdown would.
		if err := a.RemoteWorkers().Release(ctx, id, fenceA); err != nil {
			t.Fatalf("release: %v", err)
		}

		b := open(t, dsn, fast(prefix))
		startedB, unblockB := make(chan int, 1), make(chan struct{})
		conveyor.AddWorker(b, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			startedB <- j.Attempt
			<-unblockB
			return nil
		}))
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		var attemptB int
		select {
		case attemptB = <-startedB:
		case <-time.After(10 * time.Second):
			t.Fatal("B never started the job")
		}
		if attemptB != 1 {
			t.Fatalf("B runs attempt %d, want 1 (the released attempt given back)", attemptB)
		}
		if f, _ := conveyor.FenceForTest(b, id); f <= fenceA {
			t.Fatalf("B's fence %d is not above the released attempt's %d", f, fenceA)
		}
		// A's late acknowledgements reach the database, which refuses them.
		if err := a.RemoteWorkers().Complete(ctx, id, fenceA, nil); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("A's stale completion: %v, want ErrLeaseLost", err)
		}
		if err := a.RemoteWorkers().Snooze(ctx, id, fenceA, time.Hour); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("A's stale snooze: %v, want ErrLeaseLost", err)
		}
		if err := a.RemoteWorkers().Renew(ctx, id, fenceA, 0); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("A's stale renewal: %v, want ErrLeaseLost", err)
		}
		if n := a.Counters().StaleAcksRefused; n < 2 {
			t.Fatalf("A's stale acknowledgements counted refused: %d, want 2", n)
		}
		if j := jobState(t, b, id); j.State != conveyor.JobStateRunning || j.Attempt != 1 {
			t.Fatalf("after A's stale acknowledgements the job is %s at attempt %d, want running under B", j.State, j.Attempt)
		}
		close(unblockB)
		waitFor(t, "B's completion", 10*time.Second, func() bool { return jobState(t, b, id).State == conveyor.JobStateCompleted })
		if n := b.Counters().StaleAcksRefused; n != 0 {
			t.Fatalf("B's acknowledgement refused (%d)", n)
		}
	})
}

func TestLeaseExpiryRescueAndStaleAck(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		var ran atomic.Int64
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			ran.Add(1)
			return nil
		}))
		id, err := c.Enqueue(ctx, noop{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Another process claims the job with a short lease and dies.
		attempt, fence, err := conveyor.ClaimForTest(c, id, 300*time.Millisecond)
		if err != nil || attempt != 1 {
			t.Fatalf("dead process claim: attempt %d err %v", attempt, err)
		}
		c.Start(ctx)
		waitFor(t, "rescued job completed", 15*time.Second, func() bool {
			j := jobState(t, c, id)
			return j.State == conveyor.JobStateCompleted && j.Attempt == 2
		})
		// The dead process comes back and acknowledges: refused.
		applied, err := conveyor.AckForTest(c, id, fence)
		if err != nil || applied != 0 {
			t.Fatalf("stale acknowledgement applied %d (err %v), want refused", applied, err)
		}
		j := jobState(t, c, id)
		if j.State != conveyor.JobStateCompleted || j.Attempt != 2 || ran.Load() != 1 {
			t.Fatalf("after stale ack: %+v (ran %d)", j, ran.Load())
		}
		if len(j.Errors) != 1 || !strings.Contains(j.Errors[0].Error, "lease expired") {
			t.Fatalf("rescue not recorded: %+v", j.Errors)
		}
	})
}

func TestGracefulShutdownLeavesJobsClaimable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		cfg := fast(prefix)
		cfg.ShutdownTimeout = 300 * time.Millisecond
		c := openDropped(t, dsn, cfg)
		var started atomic.Int64
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
			started.Add(1)
			if j.Args.Tag == "quick" {
				time.Sleep(100 * time.Millisecond)
				return nil
			}
			<-ctx.Done() // a long job: interrupted by the shutdown
			return ctx.Err()
		}))
		quick, _ := c.Enqueue(ctx, tagged{"quick"}, nil)
		slow, _ := c.Enqueue(ctx, tagged{"slow"}, nil)
		c.Start(ctx)
		waitFor(t, "both started", 5*time.Second, func() bool { return started.Load() == 2 })
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if s := jobState(t, c, quick).State; s != conveyor.JobStateCompleted {
			t.Fatalf("job that finished within the shutdown timeout: %s", s)
		}
		j := jobState(t, c, slow)
		if j.State != conveyor.JobStateAvailable || j.Attempt != 0 || len(j.Errors) != 0 {
			t.Fatalf("interrupted job not released: %+v", j)
		}
		// Another client picks it up.
		c2 := open(t, dsn, fast(prefix))
		conveyor.AddWorker(c2, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error { return nil }))
		c2.Start(ctx)
		waitFor(t, "released job completed elsewhere", 10*time.Second, func() bool { return jobState(t, c2, slow).State == conveyor.JobStateCompleted })
	})
}

func TestScheduledJobsNeverRunEarly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		var mu sync.Mutex
		startedAt := map[int64]time.Time{}
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			mu.Lock()
			startedAt[j.ID] = time.Now()
			mu.Unlock()
			return nil
		}))
		c.Start(ctx)
		runAt := time.Now().Add(700 * time.Millisecond)
		a, _ := c.Enqueue(ctx, noop{1}, &conveyor.EnqueueOpts{RunAt: runAt})
		before := time.Now()
		b, _ := c.Enqueue(ctx, noop{2}, &conveyor.EnqueueOpts{Delay: 500 * time.Millisecond})
		if s := jobState(t, c, a).State; s != conveyor.JobStateScheduled {
			t.Fatalf("future job state %s", s)
		}
		waitFor(t, "scheduled jobs to run", 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(startedAt) == 2
		})
		mu.Lock()
		defer mu.Unlock()
		if startedAt[a].Before(runAt) {
			t.Fatalf("job ran %v before its RunAt", runAt.Sub(startedAt[a]))
		}
		if startedAt[b].Before(before.Add(500 * time.Millisecond)) {
			t.Fatalf("delayed job ran after %v, before its 500ms delay", startedAt[b].Sub(before))
		}
	})
}

func TestPriorityOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 1}}
		c := openDropped(t, dsn, cfg)
		var mu sync.Mutex
		var order []int
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			mu.Lock()
			order = append(order, j.Args.N)
			mu.Unlock()
			return nil
		}))
		prios := []int{5, -3, 0, 5, 100, -3, 1}
		for i, p := range prios {
			if _, err := c.Enqueue(ctx, noop{i}, &conveyor.EnqueueOpts{Priority: p}); err != nil {
				t.Fatal(err)
			}
		}
		c.Start(ctx)
		waitFor(t, "all run", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == len(prios) })
		want := []int{1, 5, 2, 6, 0, 3, 4}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Fatalf("execution order %v, want %v (priority, then enqueue order)", order, want)
		}
	})
}

func TestPanicsAndTimeoutsRecorded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
			switch j.Args.Tag {
			case "panic":
				panic("handler exploded")
			case "timeout":
				<-ctx.Done()
				return ctx.Err()
			case "cancel":
				return conveyor.JobCancel(errors.New("not worth retrying"))
			}
			return nil
		}))
		one := &conveyor.EnqueueOpts{MaxAttempts: 1}
		p, _ := c.Enqueue(ctx, tagged{"panic"}, one)
		to, _ := c.Enqueue(ctx, tagged{"timeout"}, &conveyor.EnqueueOpts{MaxAttempts: 1, Timeout: 100 * time.Millisecond})
		cn, _ := c.Enqueue(ctx, tagged{"cancel"}, nil)
		c.Start(ctx)
		waitFor(t, "all finalized", 10*time.Second, func() bool {
			return jobState(t, c, p).State == conveyor.JobStateDiscarded && jobState(t, c, to).State == conveyor.JobStateDiscarded && jobState(t, c, cn).State == conveyor.JobStateCancelled
		})
		pj := jobState(t, c, p)
		if len(pj.Errors) != 1 || !strings.Contains(pj.Errors[0].Error, "handler exploded") || !strings.Contains(pj.Errors[0].Trace, "goroutine") {
			t.Fatalf("panic not recorded with stack: %+v", pj.Errors)
		}
		tj := jobState(t, c, to)
		if len(tj.Errors) != 1 || !strings.Contains(tj.Errors[0].Error, "timed out after 100ms") {
			t.Fatalf("timeout not recorded: %+v", tj.Errors)
		}
		cj := jobState(t, c, cn)
		if cj.Attempt != 1 || len(cj.Errors) != 1 || !strings.Contains(cj.Errors[0].Error, "not worth retrying") {
			t.Fatalf("cancel not recorded: %+v", cj)
		}
	})
}

func TestMigrationsIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, &conveyor.Config{TablePrefix: prefix})
		again, err := c.Migrate(ctx)
		if err != nil || len(again) != 0 {
			t.Fatalf("second migrate applied %v, err %v", again, err)
		}
		c2, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		again, err = c2.Migrate(ctx)
		c2.Close()
		if err != nil || len(again) != 0 {
			t.Fatalf("migrate from a second client applied %v, err %v", again, err)
		}
		// A database at a newer schema is refused.
		if err := conveyor.BumpSchemaForTest(c, 999); err != nil {
			t.Fatal(err)
		}
		_, err = connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: prefix})
		if !errors.Is(err, conveyor.ErrSchemaTooNew) || !strings.Contains(err.Error(), "999") {
			t.Fatalf("open on a newer schema: %v, want ErrSchemaTooNew naming 999", err)
		}
		// An unmigrated database refuses to enqueue with a clear error.
		c3, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: testdb.Prefix()})
		if err != nil {
			t.Fatal(err)
		}
		defer c3.Close()
		if _, err := c3.Enqueue(ctx, noop{}, nil); !errors.Is(err, conveyor.ErrSchemaOutdated) {
			t.Fatalf("enqueue before migrate: %v", err)
		}
	})
}

type big struct {
	S string `json:"s"`
}

func (big) Kind() string { return "big" }

func TestBadInputRejectedNothingWritten(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.MaxArgsBytes = 1000
		c := openDropped(t, dsn, cfg)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error { return nil }))
		cases := []struct {
			name string
			args conveyor.JobArgs
			opts *conveyor.EnqueueOpts
			want error
			text string
		}{
			{"invalid json", conveyor.RawArgs{KindName: "noop", JSON: json.RawMessage(`{"n":`)}, nil, conveyor.ErrInvalidArgs, "noop"},
			{"oversized", conveyor.RawArgs{KindName: "noop", JSON: json.RawMessage(`{"s":"` + strings.Repeat("x", 2000) + `"}`)}, nil, conveyor.ErrInvalidArgs, "1000-byte limit"},
			{"nul", conveyor.RawArgs{KindName: "noop", JSON: json.RawMessage(`{"s":"a\u0000b"}`)}, nil, conveyor.ErrInvalidArgs, "NUL"},
			{"invalid utf8", conveyor.RawArgs{KindName: "noop", JSON: json.RawMessage("{\"s\":\"\xff\"}")}, nil, conveyor.ErrInvalidArgs, "UTF-8"},
			{"unknown kind", big{"x"}, nil, conveyor.ErrUnknownKind, `"big"`},
			{"bad queue", noop{}, &conveyor.EnqueueOpts{Queue: "no spaces"}, conveyor.ErrInvalidOpts, "no spaces"},
			{"priority", noop{}, &conveyor.EnqueueOpts{Priority: 1 << 20}, conveyor.ErrInvalidOpts, "priority"},
			{"negative delay", noop{}, &conveyor.EnqueueOpts{Delay: -time.Second}, conveyor.ErrInvalidOpts, "delay"},
			{"absurd attempts", noop{}, &conveyor.EnqueueOpts{MaxAttempts: -4}, conveyor.ErrInvalidOpts, "max attempts"},
		}
		for _, tc := range cases {
			_, err := c.Enqueue(ctx, tc.args, tc.opts)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("%s: err %v, want %v mentioning %q", tc.name, err, tc.want, tc.text)
			}
		}
		// A batch with one bad job inserts nothing.
		_, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: noop{1}}, {Args: noop{2}, Opts: &conveyor.EnqueueOpts{Queue: "bad queue"}}})
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), "job 1 of 2") {
			t.Fatalf("bad batch: %v", err)
		}
		if n := totalJobs(t, c); n != 0 {
			t.Fatalf("%d jobs exist after rejected input", n)
		}
	})
}

func TestUnknownKindAtExecutionFailsClearly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		producer := openDropped(t, dsn, fast(prefix)) // no workers: may enqueue any kind
		id, err := producer.Enqueue(ctx, big{"x"}, &conveyor.EnqueueOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		c := open(t, dsn, fast(prefix))
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error { return nil }))
		c.Start(ctx)
		waitFor(t, "unknown kind discarded", 10*time.Second, func() bool { return jobState(t, c, id).State == conveyor.JobStateDiscarded })
		j := jobState(t, c, id)
		if len(j.Errors) != 1 || !strings.Contains(j.Errors[0].Error, `unknown job kind "big"`) {
			t.Fatalf("reason not recorded: %+v", j.Errors)
		}
	})
}

func TestCancelRunningJobRefusesItsResult(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		started := make(chan struct{})
		finish := make(chan struct{})
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			close(started)
			<-finish
			return nil
		}))
		id, _ := c.Enqueue(ctx, noop{}, nil)
		c.Start(ctx)
		<-started
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		close(finish)
		// The handler's success is refused: by the database's fence when it
		// gets there first, or by the process itself once a renewal found
		// the job no longer running (at once on PostgreSQL, whose cancel
		// notifies every process).
		waitFor(t, "refused ack counted", 10*time.Second, func() bool {
			n := c.Counters()
			return n.StaleAcksRefused+n.LeasesLost == 1
		})
		if s := jobState(t, c, id).State; s != conveyor.JobStateCancelled {
			t.Fatalf("cancelled job became %s", s)
		}
		if _, err := c.Cancel(ctx, id); !errors.Is(err, conveyor.ErrWrongState) {
			t.Fatalf("cancel twice: %v", err)
		}
	})
}

// TestThunderingHerd is the classic failure of database queues: 4,000
// jobs scheduled for the same moment become due at once in front of 10
// workers (two clients of 5). Claims must not deadlock or surface errors,
// and every job runs exactly once.
func TestThunderingHerd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		const n = 4000
		var rec execRecord
		var done atomic.Int64
		var clients []*conveyor.Client[any]
		for i := 0; i < 2; i++ {
			cfg := fast(prefix)
			cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 5}}
			// The herd is about claims. fast's 2s lease gives a renewal
			// 1.6s, which a SQLite heartbeat queued behind the other
			// client's herd of writes overran under four busy loops
			// (retried, no lease lost, but counted as a DB error).
			cfg.Lease = 10 * time.Second
			c := openClient(t, dsn, cfg, i == 0)
			conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
				rec.add(j.ID)
				done.Add(1)
				return nil
			}))
			clients = append(clients, c)
		}
		runAt := time.Now().Add(1500 * time.Millisecond)
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: noop{i}, Opts: &conveyor.EnqueueOpts{RunAt: runAt}}
		}
		if _, err := clients[0].EnqueueBulk(ctx, items); err != nil {
			t.Fatal(err)
		}
		for _, c := range clients {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the herd to be worked", 90*time.Second, func() bool { return done.Load() >= n })
		waitFor(t, "all completions written", 20*time.Second, func() bool {
			st, err := clients[0].Stats(ctx)
			return err == nil && len(st.Queues) == 1 && st.Queues[0].Counts[conveyor.JobStateCompleted] == n
		})
		got := rec.snapshot()
		if len(got) != n {
			t.Fatalf("%d distinct jobs ran, want %d", len(got), n)
		}
		for id, k := range got {
			if k != 1 {
				t.Fatalf("job %d ran %d times", id, k)
			}
		}
		for i, c := range clients {
			cs := c.Counters()
			if cs.DBErrors != 0 || cs.FailedAttempts != 0 || cs.StaleAcksRefused != 0 {
				t.Fatalf("client %d surfaced errors: %+v", i, cs)
			}
			t.Logf("client %d: deadlock retries %d, lock timeouts %d, busy retries %d", i, cs.Driver["deadlock_retries"], cs.Driver["lock_timeouts"], cs.Driver["busy_retries"])
		}
	})
}
