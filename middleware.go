package conveyor

import (
	"context"

	"github.com/conveyorq/conveyor/internal/driver"
)

// WorkMiddleware wraps each attempt of a job, for logging, tracing,
// metrics or tenancy: it runs before the handler, calls next to run the
// rest of the chain and the handler (with a context of its choosing, for
// example carrying a span or a tenant), and sees the error next returns,
// which it may return as it is or replace. A middleware that does not call
// next skips the handler; its return value is the attempt's outcome as a
// handler's would be (nil completes, JobSnooze snoozes, JobCancel
// cancels). The job's timeout, panic recovery and lease apply to the whole
// chain. The job is the one stored, arguments still encoded
// (JobInfo.EncodedArgs); a middleware must not keep it past the attempt.
type WorkMiddleware func(ctx context.Context, job *JobInfo, next func(ctx context.Context) error) error

// EnqueueMiddleware wraps each enqueue call (Enqueue, EnqueueMany, their
// Tx forms, EnqueueBulk) before anything is checked or sent: it may
// change the items (a copy is passed: change the slice it gives next, not
// the caller's), call next with a context of its choosing, and see the
// error. Not calling next refuses the enqueue with the error it returns.
// Only EnqueueBulk takes more or fewer items than it was given; the calls
// that return one result per job (and batches and workflows) refuse that,
// writing nothing.
type EnqueueMiddleware func(ctx context.Context, items []EnqueueItem, next func(ctx context.Context, items []EnqueueItem) error) error

// chainWork runs the handler h inside mws, the first outermost.
func chainWork(mws []WorkMiddleware, job *JobInfo, h func(ctx context.Context) error) func(ctx context.Context) error {
	for i := len(mws) - 1; i >= 0; i-- {
		mw, next := mws[i], h
		h = func(ctx context.Context) error { return mw(ctx, job, next) }
	}
	return h
}

// enqueueThrough runs the client's enqueue middleware, the first
// outermost, around the enqueue proper: the schema check, the items
// checked and encoded, and insert, which runs unless the call was given
// no jobs: a middleware that passed on none is seen by insert, which
// refuses that when its call returns one result per job given (or is a
// batch or a workflow).
func (c *Client[TTx]) enqueueThrough(ctx context.Context, items []EnqueueItem, insert func(ctx context.Context, ps []driver.InsertParams) error) error {
	given := len(items)
	do := func(ctx context.Context, items []EnqueueItem) error {
		if err := c.ready(ctx); err != nil {
			return err
		}
		ps, err := c.params(items)
		if err != nil || given == 0 {
			return err
		}
		return insert(ctx, ps)
	}
	mws := c.cfg.EnqueueMiddleware
	if len(mws) == 0 {
		return do(ctx, items)
	}
	h := do
	for i := len(mws) - 1; i >= 0; i-- {
		mw, next := mws[i], h
		h = func(ctx context.Context, items []EnqueueItem) error { return mw(ctx, items, next) }
	}
	return h(ctx, append([]EnqueueItem(nil), items...))
}
