package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/conveyorq/conveyor"
)

// The worker protocol is conveyor.RemoteWorkers over HTTP: the client's
// engine claims, renews and settles HTTP workers' jobs as it does its own
// workers'. This file decodes and checks the requests and maps the
// results to HTTP.

// claimJSON is the body of POST /api/v1/claim.
type claimJSON struct {
	Queue   string `json:"queue"`
	Limit   int    `json:"limit"`
	WaitMS  int64  `json:"wait_ms"`
	LeaseMS int64  `json:"lease_ms"`
	Worker  string `json:"worker"`
}

// staleMsg is the 409 of an acknowledgement whose fence is outdated.
func staleMsg(id, fence int64) string {
	return fmt.Sprintf("job %d is no longer held under fence %d: its lease expired and it was rescued, or it was released, cancelled, discarded or finished; stop working it and do not retry this request", id, fence)
}

// fenceOK refuses, with 400 naming the field, an acknowledgement whose
// fence no claim can have given: absent (0) or negative; claims number
// them from 1. Answered 409, a request that left it out would tell its
// worker that the job was lost and to stop working it.
func fenceOK(w http.ResponseWriter, fence int64) bool {
	if fence < 1 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("fence %d: required, the fence the claim returned with the job (1 or more)", fence))
		return false
	}
	return true
}

// lease reads lease_ms: 0 (the client's Lease) or 1s to 1h.
func (h *Handler) lease(w http.ResponseWriter, ms int64) (time.Duration, bool) {
	if ms == 0 {
		return 0, true
	}
	d, err := msDuration("lease_ms", ms, conveyor.MinRemoteLease, conveyor.MaxRemoteLease)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, false
	}
	return d, true
}

// apiClaim claims up to limit available jobs of a queue
// (conveyor.RemoteWorkers.Claim). With wait_ms it long-polls, up to
// MaxClaimWait: it claims again after 50ms, doubling to 1s, and at once
// when the client enqueues into the queue, retries or resumes it, or (on
// PostgreSQL) a notification says any process did; then it answers with
// no jobs, as it does when the handler is closed meanwhile.
func (h *Handler) apiClaim(w http.ResponseWriter, r *http.Request, _ principal) {
	var in claimJSON
	if !h.decode(w, r, &in) {
		return
	}
	if in.Limit == 0 {
		in.Limit = 1
	}
	lease, ok := h.lease(w, in.LeaseMS)
	if !ok {
		return
	}
	wait, err := msDuration("wait_ms", in.WaitMS, 0, h.opts.MaxClaimWait)
	switch {
	case in.Limit < 1 || in.Limit > conveyor.MaxRemoteClaim:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %d: must be 1 to %d", in.Limit, conveyor.MaxRemoteClaim))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case len(in.Worker) > conveyor.MaxRemoteWorkerName || strings.IndexFunc(in.Worker, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("worker: at most %d printable characters", conveyor.MaxRemoteWorkerName))
		return
	}
	if in.Queue != "" {
		if err := checkQueueName(in.Queue); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	// A long poll ends early, with no jobs, when the handler is closed;
	// once it is, claims do not wait.
	ctx := r.Context()
	if h.closing.Err() != nil {
		wait = 0
	} else if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(h.closing, cancel)()
	}
	jobs, err := h.rw.Claim(ctx, conveyor.RemoteClaim{
		Queue: in.Queue, Limit: in.Limit, Lease: lease, Wait: wait,
		Worker: in.Worker, Addr: r.RemoteAddr, Protocol: "http",
	})
	// A wait the handler's Close ended answers with no jobs; any other
	// error is the error.
	if err != nil && !(errors.Is(err, context.Canceled) && h.closing.Err() != nil && r.Context().Err() == nil) {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Jobs []JobJSON `json:"jobs"`
	}{Jobs: make([]JobJSON, len(jobs))}
	for i, j := range jobs {
		out.Jobs[i] = claimedJSON(j)
	}
	writeJSON(w, http.StatusOK, out)
}

// fenceJSON is the body of heartbeat, complete and release.
type fenceJSON struct {
	Fence   int64 `json:"fence"`
	LeaseMS int64 `json:"lease_ms"`
}

// apiHeartbeat renews a claimed job's lease: 200 while the claim still
// owns the job, 409 once it does not.
func (h *Handler) apiHeartbeat(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var in fenceJSON
	if !h.decode(w, r, &in) || !fenceOK(w, in.Fence) {
		return
	}
	lease, ok := h.lease(w, in.LeaseMS)
	if !ok {
		return
	}
	if err := h.rw.Renew(r.Context(), id, in.Fence, lease); err != nil {
		h.workerFail(w, r, id, in.Fence, err)
		return
	}
	if lease == 0 {
		lease = h.c.Config().Lease
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "lease_ms": lease.Milliseconds()})
}

// apiComplete records a claimed job's success, fenced.
func (h *Handler) apiComplete(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var in struct {
		Fence int64 `json:"fence"`
		// Result is the attempt's result, any JSON value; absent or
		// null stores none.
		Result json.RawMessage `json:"result"`
	}
	if !h.decode(w, r, &in) || !fenceOK(w, in.Fence) {
		return
	}
	if string(in.Result) == "null" {
		in.Result = nil
	}
	if err := h.rw.Complete(r.Context(), id, in.Fence, in.Result); err != nil {
		if errors.Is(err, conveyor.ErrInvalidResult) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if errors.Is(err, conveyor.ErrLeaseLost) {
			h.repeated(w, r, id, in.Fence, err, func() (conveyor.JobState, bool, error) {
				ok, err := h.rw.CompleteRecorded(r.Context(), id, in.Fence)
				return conveyor.JobStateCompleted, ok, err
			})
			return
		}
		h.workerFail(w, r, id, in.Fence, err)
		return
	}
	// No h.stats.invalidate(): workers' outcomes come by the thousand, and
	// each would make the next dashboard refresh read the counts again.
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": conveyor.JobStateCompleted})
}

// repeated answers an outcome refused as stale (err is ErrLeaseLost):
// when recorded says that the same outcome of the same attempt was
// already written (a request sent again after its answer was lost), 200
// with the state it left and "already_recorded": true, as the first
// request's answer would have been; otherwise the 409 of a stale fence.
func (h *Handler) repeated(w http.ResponseWriter, r *http.Request, id, fence int64, err error, recorded func() (conveyor.JobState, bool, error)) {
	st, ok, rerr := recorded()
	switch {
	case rerr != nil:
		// Unknown: not a 409, which would tell the worker its outcome
		// was not written; the worker may send it again.
		h.fail(w, r, rerr)
	case ok:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": st, "already_recorded": true})
	default:
		h.workerFail(w, r, id, fence, err)
	}
}

// failJSON is the body of POST /api/v1/jobs/{id}/fail.
type failJSON struct {
	Fence int64  `json:"fence"`
	Error string `json:"error"`
	Trace string `json:"trace"`
	// Cancel ends the job as cancelled, without retry.
	Cancel bool `json:"cancel"`
	// RetryInMS overrides the kind's backoff; 0 uses it.
	RetryInMS int64 `json:"retry_in_ms"`
}

// apiFail records a claimed job's failed attempt, fenced: retryable with
// backoff, discarded when it was the last attempt, cancelled on request.
func (h *Handler) apiFail(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var in failJSON
	if !h.decode(w, r, &in) || !fenceOK(w, in.Fence) {
		return
	}
	if in.RetryInMS < 0 || in.RetryInMS > conveyor.MaxSnooze.Milliseconds() {
		writeError(w, http.StatusBadRequest, "retry_in_ms: must be 0 to 30 days")
		return
	}
	f := conveyor.RemoteFailure{
		Error: in.Error, Trace: in.Trace, Cancel: in.Cancel,
		RetryIn: time.Duration(in.RetryInMS) * time.Millisecond,
	}
	st, err := h.rw.Fail(r.Context(), id, in.Fence, f)
	if errors.Is(err, conveyor.ErrLeaseLost) {
		h.repeated(w, r, id, in.Fence, err, func() (conveyor.JobState, bool, error) {
			return h.rw.FailRecorded(r.Context(), id, in.Fence, f)
		})
		return
	}
	if err != nil {
		h.workerFail(w, r, id, in.Fence, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": st})
}

// workerFail answers a worker protocol call that failed: 409 when the
// fence is stale (nothing was written), else as any client error.
func (h *Handler) workerFail(w http.ResponseWriter, r *http.Request, id, fence int64, err error) {
	if errors.Is(err, conveyor.ErrLeaseLost) {
		writeError(w, http.StatusConflict, staleMsg(id, fence))
		return
	}
	h.fail(w, r, err)
}

// apiSnooze puts a claimed job back for later without using an attempt
// (the driver's snooze outcome: scheduled after delay_ms, the attempt
// given back, the fence kept), fenced.
func (h *Handler) apiSnooze(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var in struct {
		Fence   int64 `json:"fence"`
		DelayMS int64 `json:"delay_ms"`
	}
	if !h.decode(w, r, &in) || !fenceOK(w, in.Fence) {
		return
	}
	d, err := msDuration("delay_ms", in.DelayMS, 0, conveyor.MaxSnooze)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.rw.Snooze(r.Context(), id, in.Fence, d); err != nil {
		if errors.Is(err, conveyor.ErrLeaseLost) {
			h.repeated(w, r, id, in.Fence, err, func() (conveyor.JobState, bool, error) {
				ok, err := h.rw.SnoozeRecorded(r.Context(), id, in.Fence)
				return conveyor.JobStateScheduled, ok, err
			})
			return
		}
		h.workerFail(w, r, id, in.Fence, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": conveyor.JobStateScheduled})
}

// apiRelease gives a claimed job back without counting the attempt (a
// worker shutting down), fenced: later acknowledgements under this fence
// are refused.
func (h *Handler) apiRelease(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var in struct {
		Fence int64 `json:"fence"`
	}
	if !h.decode(w, r, &in) || !fenceOK(w, in.Fence) {
		return
	}
	if err := h.rw.Release(r.Context(), id, in.Fence); err != nil {
		h.workerFail(w, r, id, in.Fence, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": conveyor.JobStateAvailable})
}
