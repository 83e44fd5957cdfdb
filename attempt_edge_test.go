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
