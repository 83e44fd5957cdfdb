package conveyor_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// otherKind is a kind registered while remote workers are served.
type otherKind struct{}

func (otherKind) Kind() string { return "other_kind" }

// A remote worker's failure on a client that is not started reads the
// kinds' settings while AddWorker may add one (under -race, a data race
// before the engine kept them copy on write).
func TestAddWorkerWhileRemoteFail(t *testing.T) {
	ctx := context.Background()
	c := openDropped(t, filepath.Join(t.TempDir(), "c.db"), fast(testdb.Prefix()))
	rw := c.RemoteWorkers()
	if _, err := c.Enqueue(ctx, tagged{Tag: "a"}, nil); err != nil {
		t.Fatal(err)
	}
	jobs, err := rw.Claim(ctx, conveyor.RemoteClaim{Lease: time.Minute})
	if err != nil || len(jobs) != 1 {
		t.Fatal(jobs, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[otherKind]) error { return nil }),
			conveyor.WorkerOpts{Backoff: func(int) time.Duration { return time.Hour }})
	}()
	if _, err := rw.Fail(ctx, jobs[0].ID, jobs[0].Fence, conveyor.RemoteFailure{Error: "x"}); err != nil {
		t.Fatal(err)
	}
	<-done
}
