package conveyor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// ErrBatchNotFound: no batch with that id.
var ErrBatchNotFound = driver.ErrBatchNotFound

// Batch is a batch as stored: its jobs' states and results, and its
// callback once enqueued.
type Batch struct {
	// ID is the batch's id.
	ID int64
	// CreatedAt is when the batch was enqueued (database clock).
	CreatedAt time.Time
	// CallbackID is the callback job's id, 0 until every job of the batch
	// has finished and the callback was enqueued; FiredAt is when that
	// happened (zero until then).
	CallbackID int64
	FiredAt    time.Time
	// CallbackKind is the callback job's kind.
	CallbackKind string
	// Counts counts the batch's jobs by state; jobs deleted by retention
	// since (Config.CompletedRetention, DiscardedRetention) count under
	// the empty state.
	Counts map[JobState]int
	// Jobs are the batch's jobs by id.
	Jobs []BatchJob
	// WaitingFor are, for a workflow step's batch, the batches of its
	// dependencies that are steps themselves and not enqueued yet (their
	// callbacks, the dependencies' jobs, do not exist yet), by id: each
	// dependency becomes one of Jobs once enqueued. Empty for a batch of
	// EnqueueBatch.
	WaitingFor []int64 `json:",omitempty"`
}

// BatchJob is one job of a batch.
type BatchJob struct {
	// ID is the job's id.
	ID int64
	// State is the job's state; "" once retention deleted it.
	State JobState
	// Result is the job's result (SetResult), nil for none.
	Result json.RawMessage `json:",omitempty"`
}

// Finished reports whether every job of the batch has finished
// (completed, discarded or cancelled, or deleted by retention), and none
// is still to be enqueued (WaitingFor is empty).
func (b *Batch) Finished() bool {
	if len(b.WaitingFor) > 0 {
		return false
	}
	for _, j := range b.Jobs {
		switch j.State {
		case JobStateCompleted, JobStateDiscarded, JobStateCancelled, "":
		default:
			return false
		}
	}
	return true
}

// EnqueueBatch enqueues jobs as one batch, with callback: a job enqueued
// exactly once, by the maintenance leader within about PromoteInterval,
// once every job of the batch has finished (completed, discarded or
// cancelled); until then the callback is kept with the batch, not as a
// job. The callback finds its batch with BatchOf and reads the jobs'
// states and results with Client.Batch. The jobs and the batch are
// inserted in one transaction of their own; it returns the batch's id and
// the jobs' ids in order, or an error saying, as Enqueue's, that none was
// inserted or that they may exist. Jobs and callback are validated as EnqueueMany
// validates them (enqueue middleware included); unique jobs are refused
// with ErrInvalidOpts, as is an empty batch.
func (c *Client[TTx]) EnqueueBatch(ctx context.Context, jobs []EnqueueItem, callback EnqueueItem) (int64, []int64, error) {
	return c.enqueueBatch(ctx, nil, jobs, callback)
}

// EnqueueBatchTx is EnqueueBatch inside the caller's transaction: the
// batch exists, and its jobs can run, once tx commits.
func (c *Client[TTx]) EnqueueBatchTx(ctx context.Context, tx TTx, jobs []EnqueueItem, callback EnqueueItem) (int64, []int64, error) {
	return c.enqueueBatch(ctx, c.unwrap(tx), jobs, callback)
}

func (c *Client[TTx]) enqueueBatch(ctx context.Context, tx any, jobs []EnqueueItem, callback EnqueueItem) (int64, []int64, error) {
	if len(jobs) == 0 {
		return 0, nil, fmt.Errorf("%w: a batch needs at least one job", ErrInvalidOpts)
	}
	items := append(append(make([]EnqueueItem, 0, len(jobs)+1), jobs...), callback)
	var batchID int64
	var ids []int64
	err := c.enqueueThrough(ctx, items, func(ctx context.Context, ps []driver.InsertParams) error {
		if len(ps) != len(items) {
			return fmt.Errorf("conveyor: enqueue batch: the enqueue middleware passed on %d jobs for %d", len(ps), len(items))
		}
		for i := range ps {
			if ps[i].UniqueKey != nil {
				what := fmt.Sprintf("job %d", i)
				if i == len(ps)-1 {
					what = "the callback"
				}
				return fmt.Errorf("%w: batch: %s is unique; batches take no unique jobs", ErrInvalidOpts, what)
			}
		}
		members := make([]int, len(ps)-1)
		for i := range members {
			members[i] = i
		}
		var err error
		var bids []int64
		ids, bids, err = c.drv.InsertBatches(ctx, tx, ps[:len(ps)-1], []driver.BatchParams{{Callback: ps[len(ps)-1], Jobs: members}})
		if err != nil {
			if tx == nil {
				return ownTxError(len(ps), err)
			}
			return driver.ForeignTx(c.drv.Name(), err)
		}
		batchID = bids[0]
		return nil
	})
	var ie *itemError
	if errors.As(err, &ie) && ie.count == len(items) {
		// Named as the caller named them: jobs, and the callback.
		if ie.index == len(jobs) {
			err = fmt.Errorf("batch callback: %w", ie.err)
		} else {
			err = fmt.Errorf("batch job %d of %d: %w", ie.index, len(jobs), ie.err)
		}
	}
	if err != nil {
		return 0, nil, err
	}
	return batchID, ids, nil
}

// Batch returns batch id (ErrBatchNotFound if there is none) with every
// job's state and result, and for a workflow step the batches of its
// dependencies not enqueued yet.
func (c *Client[TTx]) Batch(ctx context.Context, id int64) (*Batch, error) {
	r, err := c.drv.GetBatch(ctx, id)
	if err != nil {
		return nil, err
	}
	b := &Batch{ID: r.ID, CreatedAt: r.CreatedAt, CallbackID: r.CallbackID, FiredAt: r.FiredAt,
		CallbackKind: r.Callback.Kind, Counts: map[JobState]int{}, Jobs: make([]BatchJob, len(r.Members)), WaitingFor: r.Waiting}
	for i, m := range r.Members {
		b.Jobs[i] = BatchJob{ID: m.ID, State: JobState(m.State), Result: m.Result}
		b.Counts[JobState(m.State)]++
	}
	return b, nil
}

// BatchOf returns the id of the batch whose callback job is (the job's
// metadata names it), or false for a job that is no batch's callback.
func BatchOf(job *JobInfo) (int64, bool) {
	if job == nil {
		return 0, false
	}
	id, err := strconv.ParseInt(job.Metadata[driver.BatchMetaKey], 10, 64)
	return id, err == nil && id > 0
}
