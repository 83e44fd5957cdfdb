package conveyor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/conveyorq/conveyor/internal/driver"
)

// WorkflowJob is one job of a workflow (EnqueueWorkflow).
type WorkflowJob struct {
	// Name names the job within its workflow (unique, non-empty).
	Name string
	// Args are the job's arguments; their Kind picks the worker.
	Args JobArgs
	// Opts are the job's options; nil takes the defaults.
	Opts *EnqueueOpts
	// DependsOn names the jobs of the workflow this one waits for.
	DependsOn []string
}

// OnDependencyFailure says what becomes of a workflow job whose
// dependency was discarded or cancelled.
type OnDependencyFailure int

const (
	// CancelDependents cancels it (the default): its handler does not
	// run, and its own dependents are cancelled in turn.
	CancelDependents OnDependencyFailure = iota
	// RunDependents runs it anyway, once every dependency has finished.
	RunDependents
)

// WorkflowOpts are a workflow's options; nil takes the defaults.
type WorkflowOpts struct {
	// OnDependencyFailure applies to every job of the workflow.
	OnDependencyFailure OnDependencyFailure
}

// Workflow is what EnqueueWorkflow enqueued, by job name.
type Workflow struct {
	// JobIDs are the ids of the jobs without dependencies, enqueued at
	// once.
	JobIDs map[string]int64
	// BatchIDs are, for each job with dependencies, the batch whose
	// callback it is: Client.Batch tells its CallbackID once enqueued.
	BatchIDs map[string]int64
}

// workflowCancelKey is the metadata key that makes a workflow job
// cancelled instead of run when a dependency did not complete.
const workflowCancelKey = "conveyor.cancel_on_dependency_failure"

// EnqueueWorkflow enqueues a workflow: jobs with dependencies, in one
// transaction of its own. A job without dependencies is enqueued at once.
// A job with dependencies is the callback of a batch (EnqueueBatch) whose
// members are its dependencies: it is enqueued exactly once, by the
// maintenance leader, after every dependency has finished, and reads
// their states and results with Client.Batch(ctx, id) where id is
// BatchOf(job.JobInfo). Under CancelDependents (the default), a job one of
// whose dependencies did not complete is cancelled when a worker of this
// package (or the TypeScript client's Worker) picks it up, before its
// handler runs (other HTTP workers get it and must check the batch
// themselves). Names must be unique and non-empty,
// dependencies must name jobs of the workflow, there must be no cycle
// and the policy must be one of the two; otherwise ErrInvalidOpts and
// nothing is enqueued. Unique jobs
// are refused as in batches. A database error says, as Enqueue's, that
// nothing was inserted or that the workflow may exist.
func (c *Client[TTx]) EnqueueWorkflow(ctx context.Context, jobs []WorkflowJob, opts *WorkflowOpts) (*Workflow, error) {
	return c.enqueueWorkflow(ctx, nil, jobs, opts)
}

// EnqueueWorkflowTx is EnqueueWorkflow inside the caller's transaction.
func (c *Client[TTx]) EnqueueWorkflowTx(ctx context.Context, tx TTx, jobs []WorkflowJob, opts *WorkflowOpts) (*Workflow, error) {
	return c.enqueueWorkflow(ctx, c.unwrap(tx), jobs, opts)
}

func (c *Client[TTx]) enqueueWorkflow(ctx context.Context, tx any, jobs []WorkflowJob, opts *WorkflowOpts) (*Workflow, error) {
	order, err := workflowOrder(jobs)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.OnDependencyFailure != CancelDependents && opts.OnDependencyFailure != RunDependents {
		return nil, fmt.Errorf("%w: workflow: OnDependencyFailure %d is neither CancelDependents nor RunDependents", ErrInvalidOpts, opts.OnDependencyFailure)
	}
	cancel := opts == nil || opts.OnDependencyFailure == CancelDependents
	// Roots first, then the others in dependency order; items follow
	// that order.
	items := make([]EnqueueItem, len(order))
	for k, i := range order {
		j := jobs[i]
		o := EnqueueOpts{}
		if j.Opts != nil {
			o = *j.Opts
		}
		if len(j.DependsOn) > 0 && cancel {
			o.reserved = map[string]string{workflowCancelKey: "1"}
		}
		items[k] = EnqueueItem{Args: j.Args, Opts: &o}
	}
	roots := 0
	for roots < len(order) && len(jobs[order[roots]].DependsOn) == 0 {
		roots++
	}
	at := make(map[string]int, len(jobs)) // name -> position in order
	for k, i := range order {
		at[jobs[i].Name] = k
	}
	wf := &Workflow{JobIDs: map[string]int64{}, BatchIDs: map[string]int64{}}
	err = c.enqueueThrough(ctx, items, func(ctx context.Context, ps []driver.InsertParams) error {
		if len(ps) != len(items) {
			return fmt.Errorf("conveyor: enqueue workflow: the enqueue middleware passed on %d jobs for %d", len(ps), len(items))
		}
		for i := range ps {
			if ps[i].UniqueKey != nil {
				return fmt.Errorf("%w: workflow job %q is unique; workflows take no unique jobs", ErrInvalidOpts, jobs[order[i]].Name)
			}
		}
		var bs []driver.BatchParams
		for k := roots; k < len(order); k++ {
			b := driver.BatchParams{Callback: ps[k]}
			for _, dep := range jobs[order[k]].DependsOn {
				if p := at[dep]; p < roots {
					b.Jobs = append(b.Jobs, p)
				} else {
					b.After = append(b.After, p-roots)
				}
			}
			bs = append(bs, b)
		}
		ids, bids, err := c.drv.InsertBatches(ctx, tx, ps[:roots], bs)
		if err != nil {
			if tx == nil {
				return ownTxError(len(ps), err)
			}
			return driver.ForeignTx(c.drv.Name(), err)
		}
		for k := range roots {
			wf.JobIDs[jobs[order[k]].Name] = ids[k]
		}
		for k := roots; k < len(order); k++ {
			wf.BatchIDs[jobs[order[k]].Name] = bids[k-roots]
		}
		return nil
	})
	var ie *itemError
	if errors.As(err, &ie) && ie.count == len(items) {
		// Named by the job's name, not its place in dependency order.
		err = fmt.Errorf("workflow job %q: %w", jobs[order[ie.index]].Name, ie.err)
	}
	if err != nil {
		return nil, err
	}
	return wf, nil
}

// workflowOrder checks jobs' names and dependencies and returns their
// indexes with the jobs without dependencies first, in the order given,
// then every job after all of its dependencies. It takes time in
// proportion to the jobs and their dependencies (Kahn's algorithm), so
// that a workflow of many jobs, or a job with many dependencies, is
// checked as fast as it is encoded.
func workflowOrder(jobs []WorkflowJob) ([]int, error) {
	if len(jobs) == 0 {
		return nil, fmt.Errorf("%w: a workflow needs at least one job", ErrInvalidOpts)
	}
	index := make(map[string]int, len(jobs))
	for i, j := range jobs {
		if j.Name == "" {
			return nil, fmt.Errorf("%w: workflow job %d has no name", ErrInvalidOpts, i)
		}
		if _, dup := index[j.Name]; dup {
			return nil, fmt.Errorf("%w: workflow job name %q is used twice", ErrInvalidOpts, j.Name)
		}
		index[j.Name] = i
	}
	// deps[i] are job i's dependencies by index; dependents the reverse.
	deps := make([][]int, len(jobs))
	dependents := make([][]int, len(jobs))
	seenBy := make([]int, len(jobs)) // 1 + the last job that named it
	for i, j := range jobs {
		deps[i] = make([]int, 0, len(j.DependsOn))
		for _, d := range j.DependsOn {
			k, ok := index[d]
			switch {
			case !ok:
				return nil, fmt.Errorf("%w: workflow job %q depends on %q, which is not in the workflow", ErrInvalidOpts, j.Name, d)
			case k == i || seenBy[k] == i+1:
				return nil, fmt.Errorf("%w: workflow job %q: dependency %q on itself or named twice", ErrInvalidOpts, j.Name, d)
			}
			seenBy[k] = i + 1
			deps[i] = append(deps[i], k)
			dependents[k] = append(dependents[k], i)
		}
	}
	order := make([]int, 0, len(jobs))
	waiting := make([]int, len(jobs)) // dependencies not ordered yet
	for i := range jobs {
		waiting[i] = len(deps[i])
		if waiting[i] == 0 {
			order = append(order, i)
		}
	}
	for k := 0; k < len(order); k++ {
		for _, i := range dependents[order[k]] {
			if waiting[i]--; waiting[i] == 0 {
				order = append(order, i)
			}
		}
	}
	if len(order) < len(jobs) {
		return nil, cycleError(jobs, deps, waiting)
	}
	return order, nil
}

// cycleError names a cycle of the jobs left unordered (waiting[i] > 0):
// each of them waits for another one of them, so following such a
// dependency from the first of them comes back to a job already passed.
func cycleError(jobs []WorkflowJob, deps [][]int, waiting []int) error {
	at := map[int]int{} // job -> its place on the path
	var path []int
	i := 0
	for waiting[i] == 0 {
		i++
	}
	for {
		if p, ok := at[i]; ok {
			path = path[p:]
			break
		}
		at[i] = len(path)
		path = append(path, i)
		for _, d := range deps[i] {
			if waiting[d] > 0 {
				i = d
				break
			}
		}
	}
	const most = 10 // links named at most
	var b strings.Builder
	for k, i := range path {
		next := path[(k+1)%len(path)]
		switch {
		case k == most:
			fmt.Fprintf(&b, ", ... (%d jobs in all)", len(path))
		case k > most:
			continue
		case k == 0:
			fmt.Fprintf(&b, "%q depends on %q", jobs[i].Name, jobs[next].Name)
		default:
			fmt.Fprintf(&b, ", %q on %q", jobs[i].Name, jobs[next].Name)
		}
	}
	return fmt.Errorf("%w: the workflow's dependencies have a cycle: %s", ErrInvalidOpts, b.String())
}

// dependencyFailure returns the error that cancels job, a workflow job
// under CancelDependents one of whose dependencies did not complete, or
// nil when the job should run.
func (c *Client[TTx]) dependencyFailure(ctx context.Context, job *JobInfo) error {
	if job.Metadata[workflowCancelKey] != "1" {
		return nil
	}
	id, ok := BatchOf(job)
	if !ok {
		return nil
	}
	b, err := c.Batch(ctx, id)
	if err != nil {
		return fmt.Errorf("reading the dependencies of workflow job %d: %w", job.ID, err)
	}
	for _, d := range b.Jobs {
		if d.State != JobStateCompleted {
			state := string(d.State)
			if state == "" {
				state = "deleted"
			}
			return JobCancel(fmt.Errorf("dependency job %d is %s", d.ID, state))
		}
	}
	return nil
}
