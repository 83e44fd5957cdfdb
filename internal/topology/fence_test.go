package topology_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// fenceJob is the job the failover tests enqueue.
type fenceJob struct{}

func (fenceJob) Kind() string { return "fence" }

// needRoot ends tb unless it runs as root, which the private servers need
// (they run as the postgres and mysql users).
func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		testdb.Missing(tb, "root, to run private database servers as their system users")
	}
}

// openFenceClient opens a migrated client on dsn, closed (bounded: its
// server may be dead by then) at the end of the test.
func openFenceClient(t *testing.T, ctx context.Context, dsn, prefix string) *conveyor.Client[any] {
	t.Helper()
	c, err := connect.OpenWith(ctx, dsn, &conveyor.Config{TablePrefix: prefix, Lease: time.Minute},
		connect.Options{ConnectTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", dsn, err)
	}
	t.Cleanup(func() { closeBounded(c) })
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", dsn, err)
	}
	return c
}

// closeBounded closes c, waiting at most 15 seconds.
func closeBounded(c *conveyor.Client[any]) {
	done := make(chan struct{})
	go func() { _ = c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
	}
}

// claimOne claims job id for a remote worker named worker.
func claimOne(t *testing.T, ctx context.Context, c *conveyor.Client[any], id int64, worker string) *conveyor.ClaimedJob {
	t.Helper()
	claimed, err := c.RemoteWorkers().Claim(ctx, conveyor.RemoteClaim{Worker: worker, Lease: time.Minute})
	if err != nil || len(claimed) != 1 || claimed[0].ID != id {
		t.Fatalf("%s's claim: %+v, %v", worker, claimed, err)
	}
	return claimed[0]
}

// checkStaleAcksRefused is the end of every failover scenario: the first
// worker's heartbeat and completion, sent with the fence of its lost
// claim through a client that has no memory of either claim, are refused
// by the new primary (the job's fence there is the second claim's), and
// the second claim completes the job.
func checkStaleAcksRefused(t *testing.T, ctx context.Context, dsn, prefix string, second *conveyor.Client[any], id int64, lost, won *conveyor.ClaimedJob) {
	t.Helper()
	if won.Fence == lost.Fence {
		t.Errorf("the new primary's claim repeats the lost claim's fence %d", won.Fence)
	}
	fresh := openFenceClient(t, ctx, dsn, prefix)
	if err := fresh.RemoteWorkers().Renew(ctx, id, lost.Fence, 0); !errors.Is(err, conveyor.ErrLeaseLost) {
		t.Fatalf("the lost claim's heartbeat on the new primary: %v, want ErrLeaseLost", err)
	}
	if err := fresh.RemoteWorkers().Complete(ctx, id, lost.Fence, nil); !errors.Is(err, conveyor.ErrLeaseLost) {
		t.Fatalf("the lost claim's completion on the new primary: %v, want ErrLeaseLost", err)
	}
	if j, err := second.Job(ctx, id); err != nil || j.State != conveyor.JobStateRunning || j.Attempt != won.Attempt {
		t.Fatalf("after the stale acknowledgements the job is %+v (%v), want running attempt %d", j, err, won.Attempt)
	}
	if err := second.RemoteWorkers().Complete(ctx, id, won.Fence, nil); err != nil {
		t.Fatalf("the second claim's completion: %v", err)
	}
	if j, err := second.Job(ctx, id); err != nil || j.State != conveyor.JobStateCompleted {
		t.Fatalf("after the second claim's completion the job is %+v (%v), want completed", j, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
