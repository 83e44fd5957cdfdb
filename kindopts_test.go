package conveyor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// declared is a kind whose arguments declare its default enqueue options.
type declared struct {
	N int `json:"n"`
}

func (declared) Kind() string { return "declared" }

// EnqueueOpts declares every field, so that each override shows.
func (declared) EnqueueOpts() conveyor.EnqueueOpts {
	return conveyor.EnqueueOpts{Queue: "declared_q", Priority: 5, MaxAttempts: 4, Timeout: 2 * time.Second, Delay: time.Hour}
}

// Options declared by the arguments apply on every enqueue path when the
// call gives none; a call's non-zero fields win one by one, and a call's
// schedule (RunAt or Delay) replaces the declared schedule as a whole.
func TestArgsDeclaredEnqueueOpts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		type want struct {
			queue    string
			priority int
			attempts int
			timeout  time.Duration
			state    conveyor.JobState
			delayed  bool // scheduled about an hour from now
		}
		defaults := want{"declared_q", 5, 4, 2 * time.Second, conveyor.JobStateScheduled, true}
		check := func(what string, id int64, w want) {
			t.Helper()
			j := jobState(t, c, id)
			if j.Queue != w.queue || j.Priority != w.priority || j.MaxAttempts != w.attempts || j.Timeout != w.timeout || j.State != w.state {
				t.Errorf("%s: queue %q priority %d max attempts %d timeout %v state %s; want %q %d %d %v %s",
					what, j.Queue, j.Priority, j.MaxAttempts, j.Timeout, j.State, w.queue, w.priority, w.attempts, w.timeout, w.state)
			}
			if in := j.ScheduledAt.Sub(j.CreatedAt); w.delayed != (in > 59*time.Minute && in < 61*time.Minute) {
				t.Errorf("%s: scheduled %v after its creation, delayed an hour: %v", what, in, w.delayed)
			}
		}

		id, err := c.Enqueue(ctx, declared{1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		check("Enqueue, no options", id, defaults)
		id, err = c.Enqueue(ctx, declared{2}, &conveyor.EnqueueOpts{})
		if err != nil {
			t.Fatal(err)
		}
		check("Enqueue, zero options", id, defaults)

		id, err = c.Enqueue(ctx, declared{3}, &conveyor.EnqueueOpts{Priority: -3})
		if err != nil {
			t.Fatal(err)
		}
		check("Enqueue, priority given", id, want{"declared_q", -3, 4, 2 * time.Second, conveyor.JobStateScheduled, true})

		id, err = c.Enqueue(ctx, declared{4}, &conveyor.EnqueueOpts{Queue: "other", Priority: 7, MaxAttempts: 9, Timeout: -1, RunAt: time.Now().Add(-time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		// A negative timeout (none) is stored as -1ms.
		check("Enqueue, everything given", id, want{"other", 7, 9, -time.Millisecond, conveyor.JobStateAvailable, false})

		ids, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: declared{5}}, {Args: declared{6}, Opts: &conveyor.EnqueueOpts{MaxAttempts: 2}}, {Args: noop{}}})
		if err != nil {
			t.Fatal(err)
		}
		check("EnqueueMany, no options", ids[0].ID, defaults)
		check("EnqueueMany, attempts given", ids[1].ID, want{"declared_q", 5, 2, 2 * time.Second, conveyor.JobStateScheduled, true})
		check("EnqueueMany, arguments that declare nothing", ids[2].ID, want{conveyor.DefaultQueue, 0, 25, 0, conveyor.JobStateAvailable, false})

		tx, commit, _ := beginTx(t, dsn)
		id, err = c.EnqueueTx(ctx, tx, declared{7}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids, err = c.EnqueueManyTx(ctx, tx, []conveyor.EnqueueItem{{Args: declared{8}, Opts: &conveyor.EnqueueOpts{Delay: time.Millisecond}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		check("EnqueueTx, no options", id, defaults)
		if j := jobState(t, c, ids[0].ID); j.Queue != "declared_q" || j.ScheduledAt.Sub(j.CreatedAt) > time.Minute {
			t.Errorf("EnqueueManyTx with a delay of 1ms: queue %q, scheduled %v after creation; want declared_q, the call's delay", j.Queue, j.ScheduledAt.Sub(j.CreatedAt))
		}

		if n, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: declared{9}}, {Args: declared{10}}}); err != nil || n != 2 {
			t.Fatalf("EnqueueBulk: %d, %v", n, err)
		}
		all, err := c.Jobs(ctx, conveyor.JobFilter{Kind: "declared", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		bulk := 0
		for _, j := range all {
			if strings.Contains(string(j.EncodedArgs), `"n":9`) || strings.Contains(string(j.EncodedArgs), `"n":10`) {
				check("EnqueueBulk, no options", j.ID, defaults)
				bulk++
			}
		}
		if bulk != 2 {
			t.Fatalf("found %d of the 2 bulk jobs", bulk)
		}
	})
}

// invalidDeclared declares options out of range: the enqueue is refused.
type invalidDeclared struct{}

func (invalidDeclared) Kind() string { return "invalid_declared" }

func (invalidDeclared) EnqueueOpts() conveyor.EnqueueOpts {
	return conveyor.EnqueueOpts{Priority: conveyor.MaxPriority + 1}
}

func TestArgsDeclaredEnqueueOptsValidated(t *testing.T) {
	ctx := context.Background()
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	if _, err := c.Enqueue(ctx, invalidDeclared{}, nil); !errors.Is(err, conveyor.ErrInvalidOpts) {
		t.Fatalf("declared priority out of range: %v, want ErrInvalidOpts", err)
	}
	if _, err := c.Enqueue(ctx, invalidDeclared{}, &conveyor.EnqueueOpts{Priority: 1}); err != nil {
		t.Fatalf("declared priority overridden by the call: %v", err)
	}
}

// slowKind is a kind registered with its own WorkerOpts.
type slowKind struct {
	Block bool `json:"block"`
}

func (slowKind) Kind() string { return "slow_kind" }

// A kind's WorkerOpts replace the client's JobTimeout and Backoff for its
// jobs: the handler's context ends at the kind's timeout although the
// client's is an hour, and the failed attempt is scheduled after the
// kind's backoff (an hour) although the client's is 10ms. A job's own
// timeout still beats its kind's. Checked on the stored job, not by
// timing retries.
func TestWorkerOptsTimeoutAndBackoff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.JobTimeout = time.Hour
		c := openDropped(t, dsn, cfg)
		deadlines := make(chan time.Duration, 2)
		err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[slowKind]) error {
			dl, _ := ctx.Deadline()
			deadlines <- time.Until(dl)
			<-ctx.Done()
			return ctx.Err()
		}), conveyor.WorkerOpts{
			Timeout: 150 * time.Millisecond,
			Backoff: func(attempt int) time.Duration { return time.Duration(attempt) * time.Hour },
		})
		if err != nil {
			t.Fatal(err)
		}
		kindTimeout, err := c.Enqueue(ctx, slowKind{true}, &conveyor.EnqueueOpts{MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		ownTimeout, err := c.Enqueue(ctx, slowKind{true}, &conveyor.EnqueueOpts{MaxAttempts: 3, Timeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			select {
			case left := <-deadlines:
				if left <= 0 || left > 150*time.Millisecond {
					t.Fatalf("handler's deadline %v away at its start, want at most the kind's 150ms", left)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("handlers never ran")
			}
		}
		waitFor(t, "both attempts failed", 20*time.Second, func() bool {
			return jobState(t, c, kindTimeout).State == conveyor.JobStateRetryable && jobState(t, c, ownTimeout).State == conveyor.JobStateRetryable
		})
		for id, after := range map[int64]string{kindTimeout: "timed out after 150ms", ownTimeout: "timed out after 50ms"} {
			j := jobState(t, c, id)
			if len(j.Errors) != 1 || !strings.Contains(j.Errors[0].Error, after) {
				t.Errorf("job %d: errors %+v, want one saying %q", id, j.Errors, after)
			}
			// Retried after the kind's backoff for attempt 1 (an hour) from
			// when the outcome was written, not the client's 10ms.
			if wait := j.ScheduledAt.Sub(j.AttemptedAt); wait < time.Hour || wait > time.Hour+time.Minute {
				t.Errorf("job %d: retry scheduled %v after the attempt, want the kind's hour", id, wait)
			}
		}
	})
}

func TestAddWorkerOptsRefused(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	w := conveyor.WorkFunc(func(context.Context, *conveyor.Job[slowKind]) error { return nil })
	if err := conveyor.AddWorker(c, w, conveyor.WorkerOpts{}, conveyor.WorkerOpts{}); err == nil || !strings.Contains(err.Error(), "at most one") {
		t.Fatalf("two WorkerOpts: %v", err)
	}
	if err := conveyor.AddWorker(c, w, conveyor.WorkerOpts{Timeout: 31 * 24 * time.Hour}); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("a 31-day timeout: %v", err)
	}
	if err := conveyor.AddWorker(c, w, conveyor.WorkerOpts{Timeout: time.Second}); err != nil {
		t.Fatalf("valid WorkerOpts after refused ones: %v", err)
	}
}
