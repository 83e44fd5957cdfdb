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

// On every backend a job enqueued, one at a time, by the process that
// works its queue while its workers wait is claimed by its own insert
// (Counters.ClaimedAtInsert) and runs once, at attempt 1; a paused
// queue's job is written available and waits for the resume.
func TestOwnEnqueueClaimedAtInsert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 4}}
		c := openDropped(t, dsn, cfg)
		type run struct {
			id      int64
			attempt int
		}
		ran := make(chan run, 64)
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			ran <- run{j.ID, j.Attempt}
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer c.Stop(ctx)
		enqueueAndWait := func(i int) {
			t.Helper()
			id, err := c.Enqueue(ctx, noop{N: i}, nil)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-ran:
				if r.id != id || r.attempt != 1 {
					t.Fatalf("ran job %d at attempt %d, want job %d at attempt 1", r.id, r.attempt, id)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("job %d never ran", id)
			}
		}
		enqueueAndWait(0) // the start's claim is behind
		before := c.Counters().ClaimedAtInsert
		const n = 20
		for i := 1; i <= n; i++ {
			enqueueAndWait(i)
			time.Sleep(5 * time.Millisecond)
		}
		got := c.Counters().ClaimedAtInsert - before
		t.Logf("%d of %d jobs claimed by their own insert", got, n)
		if got < n/2 {
			t.Fatalf("%d of %d jobs enqueued one at a time beside idle workers were claimed by their own insert, want most", got, n)
		}
		if err := c.PauseQueue(ctx, "default"); err != nil {
			t.Fatal(err)
		}
		id, err := c.Enqueue(ctx, noop{N: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-ran:
			t.Fatalf("job %d ran in a paused queue", r.id)
		case <-time.After(300 * time.Millisecond):
		}
		if j, err := c.Job(ctx, id); err != nil || j.State != conveyor.JobStateAvailable {
			t.Fatalf("paused queue's job: %+v, %v; want available", j, err)
		}
		if err := c.ResumeQueue(ctx, "default"); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-ran:
			if r.id != id {
				t.Fatalf("ran job %d after the resume, want %d", r.id, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d never ran after the resume", id)
		}
	})
}
