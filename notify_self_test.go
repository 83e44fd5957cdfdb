package conveyor_test

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// On PostgreSQL a job enqueued in the worker's own process is claimed
// once: the enqueue wakes the queue's fetcher in process, and the
// notification the same enqueue sends, received a moment later, makes no
// second, empty claim.
func TestNotifyOwnEnqueueClaimsOnce(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	cfg := fast(testdb.Prefix())
	cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 10}}
	// Only wake-ups claim: no poll falls inside the test.
	cfg.ListenPoll, cfg.PollMax = time.Hour, time.Hour
	c := openDropped(t, dsn, cfg)
	ran := make(chan int64, 1)
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
		ran <- j.ID
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	run := func() {
		t.Helper()
		id, err := c.Enqueue(ctx, noop{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-ran:
			if id != id {
				t.Fatalf("ran job %d, want %d", id, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d never ran", id)
		}
	}
	run() // the listener is up and the start's claim is behind
	time.Sleep(50 * time.Millisecond)
	before := c.Counters().ClaimRounds
	const n = 20
	for range n {
		run()
		// Room for the enqueue's notification to arrive (and, wrongly,
		// make a claim) before the next enqueue.
		time.Sleep(20 * time.Millisecond)
	}
	got := c.Counters().ClaimRounds - before
	t.Logf("%d claim rounds for %d jobs", got, n)
	if got > n+2 {
		t.Fatalf("%d claim rounds for %d jobs enqueued in process one at a time, want about one each", got, n)
	}
}
