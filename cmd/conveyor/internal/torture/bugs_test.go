package torture

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
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
			lab.DropTables(ctx, d)
			d.Close()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("PoolSize 1: the job was not claimed within 10s (claimed %d)", c.Counters().Claimed)
	}
}
