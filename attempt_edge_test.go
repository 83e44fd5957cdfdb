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

// A handler's error is stored as text with its attempt. One carrying a
// NUL character (an error wrapping bytes read off a socket or a file) or
// invalid UTF-8 is stored made valid, as a remote worker's is: on
// PostgreSQL a NUL in the error refused the whole outcome batch's
// statement, which the completer retried for ever, so that no outcome of
// the process was written again.
func TestHandlerErrorWithNULIsStored(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			if j.Args.N == 1 {
				return errors.New("bad\x00bytes \xff here")
			}
			return nil
		}))
		bad, err := c.Enqueue(ctx, noop{N: 1}, &conveyor.EnqueueOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the failing job discarded", 20*time.Second, func() bool {
			return jobState(t, c, bad).State == conveyor.JobStateDiscarded
		})
		j := jobState(t, c, bad)
		if len(j.Errors) != 1 || !strings.HasPrefix(j.Errors[0].Error, "bad") || strings.Contains(j.Errors[0].Error, "\x00") {
			t.Fatalf("errors recorded: %+v", j.Errors)
		}
		// Outcomes after it are written.
		good, err := c.Enqueue(ctx, noop{N: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the next job completed", 20*time.Second, func() bool {
			return jobState(t, c, good).State == conveyor.JobStateCompleted
		})
	})
}

// A running job cancelled by hand and retried at once is claimed again,
// here in the process whose handler of the cancelled attempt still runs
// (its next heartbeat has not found the cancel yet). The new claim
// replaced the old attempt in the process's bookkeeping without
// cancelling it, so no heartbeat ever found it gone: the cancelled
// attempt's handler ran on beside the new one until it returned by
// itself.
func TestCancelThenRetryCancelsTheOldHandler(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		// No renewal during the test: only the new claim can tell the
		// process the first attempt is over.
		cfg.Lease, cfg.HeartbeatInterval = 2*time.Minute, time.Minute
		c := openDropped(t, dsn, cfg)
		type run struct {
			attempt int
			ctx     context.Context
		}
		runs := make(chan run, 4)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			runs <- run{j.Attempt, ctx}
			<-ctx.Done()
			return ctx.Err()
		}))
		id, err := c.Enqueue(ctx, noop{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		first := <-runs
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Retry(ctx, id); err != nil {
			t.Fatal(err)
		}
		var second run
		select {
		case second = <-runs:
		case <-time.After(30 * time.Second):
			t.Fatal("the retried job did not start again within 30s")
		}
		select {
		case <-first.ctx.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("the cancelled attempt's handler (attempt %d) still runs beside the new one (attempt %d): its context was not cancelled", first.attempt, second.attempt)
		}
		if second.ctx.Err() != nil {
			t.Fatalf("the new attempt's context ended: %v", context.Cause(second.ctx))
		}
	})
}
