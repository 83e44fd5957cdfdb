package torture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/engine"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// The tests below are regressions for engine and backend bugs this suite
// found (all fixed): each failed before its fix.

type hangForever struct{}

func (hangForever) Kind() string { return "hang_forever" }

// A handler that ignores its context and never returns must be discarded
// after its maximum attempts (issue 5, poison jobs). The engine keeps its
// lease alive forever instead: the worker goroutine never returns, so the
// attempt stays in the fetcher's lease map and every heartbeat renews it;
// the job stays "running" for as long as the process lives, and at a
// graceful stop it is released with its attempt given back, so it never
// uses up its attempts either.
func TestHangingHandlerDiscarded(t *testing.T) {
	ctx := context.Background()
	c, err := connect.Open(ctx, filepath.Join(t.TempDir(), "hang.db"), &conveyor.Config{
		Lease: time.Second, JobTimeout: 300 * time.Millisecond, ShutdownTimeout: 500 * time.Millisecond,
		RescueInterval: 100 * time.Millisecond, PromoteInterval: 50 * time.Millisecond,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer c.Close()
	defer close(release) // let the stuck handler go before Close
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[hangForever]) error {
		<-release // ignores ctx
		return nil
	}))
	id, err := c.Enqueue(ctx, hangForever{}, &conveyor.EnqueueOpts{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Two attempts of 300ms timeout plus a lease each are well within 8s.
	var j *conveyor.JobInfo
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if j, err = c.Job(ctx, id); err != nil {
			t.Fatal(err)
		}
		if j.State == "discarded" {
			return
		}
	}
	c.Stop(ctx)
	after, _ := c.Job(ctx, id)
	t.Fatalf("a handler that never returns was not discarded after 2 attempts: after 8s the job is %s at attempt %d (lease renewed until %v); after Stop it is %s at attempt %d",
		j.State, j.Attempt, j.LeaseExpiresAt.Format(time.TimeOnly), after.State, after.Attempt)
}

// lossyDriver plays a database whose connection breaks while the server
// commits an insert: the rows are committed but the client gets an
// error. Only Insert is implemented.
type lossyDriver struct {
	driver.Driver
	gate chan struct{}

	mu    sync.Mutex
	calls int
	rows  []driver.InsertParams
}

func (d *lossyDriver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	d.mu.Lock()
	d.calls++
	n := d.calls
	d.mu.Unlock()
	if n == 1 {
		<-d.gate // hold the writer so that the next callers share one batch
	}
	d.mu.Lock()
	first := len(d.rows)
	d.rows = append(d.rows, jobs...) // committed
	d.mu.Unlock()
	if n == 2 {
		return nil, errors.New("unexpected EOF (connection lost while committing)")
	}
	ids := make([]int64, len(jobs))
	for i := range ids {
		ids[i] = int64(first + i + 1)
	}
	return ids, nil
}

// When a coalesced insert fails, the inserter re-inserts each caller's
// jobs alone (engine/inserter.go, inserter.flush). If the failure was a
// lost connection after the server committed, the jobs of the first
// statement exist already, and the retry inserts them a second time: one
// Enqueue call, two jobs that both run.
func TestInserterNoReinsertAfterAmbiguousFailure(t *testing.T) {
	d := &lossyDriver{gate: make(chan struct{})}
	e := engine.New(d, engine.Config{InsertBatch: 100}, nil)
	defer e.Close(context.Background())
	job := func(tag string) []driver.InsertParams {
		return []driver.InsertParams{{Queue: "q", Kind: "k", Args: json.RawMessage(fmt.Sprintf(`{"tag":%q}`, tag)), MaxAttempts: 1}}
	}
	first := make(chan error, 1)
	go func() { _, _, err := e.Insert(context.Background(), job("first")); first <- err }()
	for {
		d.mu.Lock()
		n := d.calls
		d.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, tag := range []string{"a", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); _, _, errs[i] = e.Insert(context.Background(), job(tag)) }()
	}
	time.Sleep(100 * time.Millisecond) // both callers are queued behind the held writer
	close(d.gate)
	wg.Wait()
	<-first
	count := map[string]int{}
	for _, r := range d.rows {
		count[string(r.Args)]++
	}
	for _, tag := range []string{"a", "b"} {
		if n := count[fmt.Sprintf(`{"tag":%q}`, tag)]; n != 1 {
			t.Errorf("job %q: its Enqueue returned %v, and the database holds it %d times", tag, errs[tagIndex(tag)], n)
		}
	}
}

func tagIndex(tag string) int {
	if tag == "a" {
		return 0
	}
	return 1
}

type poolJob struct{}

func (poolJob) Kind() string { return "pool_job" }

// With PoolSize 1 the MySQL backend deadlocks on its first claim: Claim
// runs in a transaction (inTx) that holds the pool's only connection, and
// the statement cache (mysql.Driver.stmt) prepares a statement it has not
// seen yet with d.db.PrepareContext, which waits for a second connection
// forever. Any PoolSize can deadlock the same way when as many
// transactions (claims, rescue, promotion) each meet a statement not yet
// prepared (a new IN-list bucket size, for one) at the same time.
// Stop then hangs too: the fetcher never returns from Claim.
func TestMySQLPoolSizeOne(t *testing.T) {
	dsn := testdb.MySQL(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	c, err := connect.OpenWith(ctx, dsn, &conveyor.Config{TablePrefix: prefix}, connect.Options{PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[poolJob]) error {
		close(done)
		return nil
	}))
	if _, err := c.Enqueue(ctx, poolJob{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(15 * time.Second):
			t.Errorf("Close did not return within 15s (the fetcher is stuck in Claim); the client is leaked")
		}
		if d, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: prefix}); err == nil {
			seam.DropTables(ctx, d)
			d.Close()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("PoolSize 1: the job was not claimed within 10s (claimed %d)", c.Counters().Claimed)
	}
}
