package conveyortest

import (
	"context"
	"testing"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/seam"
)

// Result is what Work did with a job.
type Result struct {
	// Job is the job as stored once its outcome was written: its State
	// (completed, retryable, cancelled or discarded), its Errors (the
	// attempt's error last) and, when retryable, the ScheduledAt of its
	// retry.
	Job *conveyor.JobInfo
	// Err is the error the handler returned, nil when it succeeded. A
	// panic, a timeout and a kind without a registered worker are errors,
	// as in a running client.
	Err error
	// Applied is false when the database refused the outcome because the
	// job stopped being this attempt's while the handler ran (cancelled
	// or discarded meanwhile); Job then shows what it became.
	Applied bool
}

// Work claims job id and runs it through the worker registered on c for
// its kind, in the calling goroutine, as a started client runs a job: the
// job is claimed by id whatever its queue and schedule (it must be
// available, scheduled or retryable: a scheduled or retryable job runs
// now), fenced and leased (the lease is renewed while the handler runs);
// the handler runs with its timeout (the job's, else the kind's
// WorkerOpts.Timeout, else Config.JobTimeout) and panic recovery; its
// outcome is written to the database, the failed attempt's error recorded
// and its retry scheduled with the kind's backoff, before Work returns.
// The client need not be started, and Work takes none of its worker
// slots. The handler's context is t.Context() (see WorkContext).
//
// Work fails t if the job cannot be claimed (no such job, or running or
// finished), or if its outcome could not be written.
func Work[TTx any](t testing.TB, c *conveyor.Client[TTx], id int64) *Result {
	t.Helper()
	return WorkContext(t.Context(), t, c, id)
}

// WorkContext is Work with the handler's context derived from ctx (its
// values reach the handler). If ctx ends while the handler runs, the
// handler's context is cancelled and, if the handler then fails, the
// attempt is released (the job is available again, the attempt not
// counted) and t fails.
func WorkContext[TTx any](ctx context.Context, t testing.TB, c *conveyor.Client[TTx], id int64) *Result {
	t.Helper()
	w, err := seam.WorkOne(ctx, c, id)
	if err != nil {
		t.Fatalf("conveyortest: working job %d: %v", id, err)
	}
	j, err := c.Job(context.WithoutCancel(ctx), id)
	if err != nil {
		t.Fatalf("conveyortest: job %d after its attempt: %v", id, err)
	}
	return &Result{Job: j, Err: w.Err, Applied: w.Applied}
}
