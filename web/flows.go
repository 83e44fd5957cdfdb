package web

import (
	"fmt"
	"net/http"

	"github.com/conveyorq/conveyor"
)

// batchRequestJSON is the body of POST /api/v1/batches: the batch's jobs
// and its callback (conveyor.Client.EnqueueBatch).
type batchRequestJSON struct {
	Jobs     []enqueueJSON `json:"jobs"`
	Callback *enqueueJSON  `json:"callback"`
}

// batchEnqueuedJSON answers POST /api/v1/batches.
type batchEnqueuedJSON struct {
	// BatchID is the new batch's id (GET /api/v1/batches/{id}).
	BatchID int64 `json:"batch_id"`
	// IDs are the batch's jobs' ids, in order.
	IDs []int64 `json:"ids"`
}

// apiEnqueueBatchCallback enqueues a batch with its callback.
func (h *Handler) apiEnqueueBatchCallback(w http.ResponseWriter, r *http.Request, _ principal) {
	var in batchRequestJSON
	if !h.decode(w, r, &in) {
		return
	}
	switch {
	case len(in.Jobs) == 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"jobs" is empty: send 1 to %d jobs`, maxBatch))
		return
	case len(in.Jobs) > maxBatch:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`%d jobs in "jobs": at most %d`, len(in.Jobs), maxBatch))
		return
	case in.Callback == nil:
		writeError(w, http.StatusBadRequest, `"callback" is missing: a batch needs the job to enqueue once its jobs have finished`)
		return
	}
	items := make([]conveyor.EnqueueItem, len(in.Jobs))
	for i, j := range in.Jobs {
		if err := j.validate(); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("job %d: %v", i, err))
			return
		}
		items[i] = j.item()
	}
	if err := in.Callback.validate(); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("callback: %v", err))
		return
	}
	id, ids, err := h.c.EnqueueBatch(r.Context(), items, in.Callback.item())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, batchEnqueuedJSON{BatchID: id, IDs: ids})
}

// workflowJobJSON is one job of POST /api/v1/workflows: a job to enqueue
// with its name and the names of the jobs it waits for.
type workflowJobJSON struct {
	Name      string   `json:"name"`
	DependsOn []string `json:"depends_on"`
	enqueueJSON
}

// workflowRequestJSON is the body of POST /api/v1/workflows
// (conveyor.Client.EnqueueWorkflow).
type workflowRequestJSON struct {
	Jobs []workflowJobJSON `json:"jobs"`
	// OnDependencyFailure is "cancel" (the default) or "run".
	OnDependencyFailure string `json:"on_dependency_failure"`
}

// workflowEnqueuedJSON answers POST /api/v1/workflows.
type workflowEnqueuedJSON struct {
	// JobIDs are the ids of the jobs without dependencies, by name.
	JobIDs map[string]int64 `json:"job_ids"`
	// BatchIDs are, by name, for each job with dependencies, the batch
	// whose callback it is.
	BatchIDs map[string]int64 `json:"batch_ids"`
}

// apiEnqueueWorkflow enqueues a workflow.
func (h *Handler) apiEnqueueWorkflow(w http.ResponseWriter, r *http.Request, _ principal) {
	var in workflowRequestJSON
	if !h.decode(w, r, &in) {
		return
	}
	switch {
	case len(in.Jobs) == 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"jobs" is empty: send 1 to %d jobs`, maxBatch))
		return
	case len(in.Jobs) > maxBatch:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`%d jobs in "jobs": at most %d`, len(in.Jobs), maxBatch))
		return
	}
	opts := &conveyor.WorkflowOpts{}
	switch in.OnDependencyFailure {
	case "", "cancel":
		opts.OnDependencyFailure = conveyor.CancelDependents
	case "run":
		opts.OnDependencyFailure = conveyor.RunDependents
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`on_dependency_failure %q: must be "cancel" (the default) or "run"`, in.OnDependencyFailure))
		return
	}
	jobs := make([]conveyor.WorkflowJob, len(in.Jobs))
	for i, j := range in.Jobs {
		if err := j.validate(); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("job %d (%q): %v", i, j.Name, err))
			return
		}
		it := j.item()
		jobs[i] = conveyor.WorkflowJob{Name: j.Name, Args: it.Args, Opts: it.Opts, DependsOn: j.DependsOn}
	}
	wf, err := h.c.EnqueueWorkflow(r.Context(), jobs, opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, workflowEnqueuedJSON{JobIDs: wf.JobIDs, BatchIDs: wf.BatchIDs})
}
