package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// beforeFireKey keys the function WithBeforeFire puts in a context.
type beforeFireKey struct{}

// WithBeforeFire returns ctx carrying f, which a driver's FireBatches
// called with that context runs with each batch's id after it read the
// batch as finished and before the transaction that fires it begins: the
// drivers' tests use it to change a member (a retry by hand) in between.
func WithBeforeFire(ctx context.Context, f func(batchID int64)) context.Context {
	return context.WithValue(ctx, beforeFireKey{}, f)
}

// beforeFire runs the function WithBeforeFire put in ctx, if any.
func beforeFire(ctx context.Context, batchID int64) {
	if f, ok := ctx.Value(beforeFireKey{}).(func(int64)); ok && f != nil {
		f(batchID)
	}
}

// inFireKey keys the function WithInFire puts in a context.
type inFireKey struct{}

// WithInFire returns ctx carrying f, which a driver's FireBatches called
// with that context runs with each batch's id inside the transaction
// that fires the batch, once it read the batch again and found it ready,
// before it inserts the callback: the drivers' tests use it to retry a
// member by hand while the firing holds its locks.
func WithInFire(ctx context.Context, f func(batchID int64)) context.Context {
	return context.WithValue(ctx, inFireKey{}, f)
}

// InFire runs the function WithInFire put in ctx, if any; a driver's
// fire of one batch calls it (see WithInFire).
func InFire(ctx context.Context, batchID int64) {
	if f, ok := ctx.Value(inFireKey{}).(func(int64)); ok && f != nil {
		f(batchID)
	}
}

// ReadyBatch is a batch that FireBatches' read found finished: its id
// and its callback as stored (InsertParams encoded as JSON).
type ReadyBatch struct {
	ID       int64
	Callback string
}

// ErrBatchNotReady is returned by a driver's fire of one batch
// (FireReady's fire) when the batch, read again in the firing
// transaction, was fired by another caller meanwhile or has a member
// that is no longer finished (a retry by hand): nothing was written.
var ErrBatchNotReady = errors.New("batch no longer ready to fire")

// BatchFailure is one batch whose callback FireBatches could not enqueue.
type BatchFailure struct {
	// BatchID is the batch's id.
	BatchID int64
	// Err is why.
	Err error
}

// BatchFireError is FireBatches' error when the callbacks of some
// batches could not be enqueued: the other batches were fired, and
// those are tried again at the next call.
type BatchFireError struct {
	// Failed are the batches not fired, in the order they were tried.
	Failed []BatchFailure
}

// Error names every failed batch and why.
func (e *BatchFireError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fire batches: %d failed:", len(e.Failed))
	for i, f := range e.Failed {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " batch %d: %v", f.BatchID, f.Err)
	}
	return b.String()
}

// Unwrap returns the failures' errors.
func (e *BatchFireError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// FireReady is the loop of a driver's FireBatches. It reads finished
// batches with read (ids past after, oldest first, up to n) and fires
// each with fire, which enqueues the callback (given its batch id in the
// metadata) in a transaction of its own that reads the batch again, and
// returns the callback's id, or ErrBatchNotReady when the batch was no
// longer ready. A batch that fails is recorded and the others are fired
// all the same; while fewer than limit were fired, the read goes on past
// the last batch tried, so that batches failing every time (however
// many) cannot keep the ones after them from firing. It returns the
// callbacks' ids by batch id and, when a batch failed, a
// *BatchFireError naming each; an error of read ends the call. A batch
// for which skip (nil: none) reports true is passed over, unfired and
// uncounted, as a failing one is.
func FireReady(ctx context.Context, limit int, skip func(batchID int64) bool,
	read func(ctx context.Context, after int64, n int) ([]ReadyBatch, error),
	fire func(ctx context.Context, batchID int64, callback InsertParams) (int64, error),
) (map[int64]int64, error) {
	fired := map[int64]int64{}
	var failed []BatchFailure
	after := int64(0)
	for len(fired) < limit && ctx.Err() == nil {
		n := limit - len(fired)
		rs, err := read(ctx, after, n)
		if err != nil {
			return fired, err
		}
		for _, r := range rs {
			after = r.ID
			if skip != nil && skip(r.ID) {
				continue
			}
			var p InsertParams
			if err := json.Unmarshal([]byte(r.Callback), &p); err != nil {
				failed = append(failed, BatchFailure{r.ID, fmt.Errorf("callback: %w", err)})
				continue
			}
			if p, err = CallbackForBatch(p, r.ID); err != nil {
				failed = append(failed, BatchFailure{r.ID, err})
				continue
			}
			beforeFire(ctx, r.ID)
			id, err := fire(ctx, r.ID, p)
			switch {
			case errors.Is(err, ErrBatchNotReady):
			case err != nil:
				if ctx.Err() != nil {
					return fired, err
				}
				failed = append(failed, BatchFailure{r.ID, err})
			default:
				fired[r.ID] = id
			}
		}
		if len(rs) < n {
			break
		}
	}
	if len(failed) > 0 {
		return fired, &BatchFireError{Failed: failed}
	}
	return fired, nil
}
