package web

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Bounds of the worker protocol.
const (
	maxClaimLimit = 1000
	minLease      = time.Second
	maxLease      = time.Hour
	// pollMin and pollMax bound the re-claims of a long-polling claim:
	// 50ms after an empty claim, doubling to 1s.
	pollMin, pollMax = 50 * time.Millisecond, time.Second
	maxErrorBytes    = 64 << 10
	maxTraceBytes    = 256 << 10
)

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

// lease reads lease_ms: the client's Lease when 0, else 1s to 1h.
func (h *Handler) lease(w http.ResponseWriter, ms int64) (time.Duration, bool) {
	if ms == 0 {
		return h.c.Config().Lease, true
	}
	d, err := msDuration("lease_ms", ms, minLease, maxLease)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, false
	}
	return d, true
}

// apiClaim claims up to limit available jobs of a queue, fenced as the
// in-process fetchers claim them. With wait_ms it long-polls: it claims
// again after 50ms, doubling to 1s, and at once when this handler
// enqueues into the queue, retries or resumes it, or (on PostgreSQL) a
// notification says any process did, until a job comes or the wait (at
// most MaxClaimWait) ends; then it answers with no jobs.
func (h *Handler) apiClaim(w http.ResponseWriter, r *http.Request, p principal) {
	var in claimJSON
	if !h.decode(w, r, &in) {
		return
	}
	if in.Queue == "" {
		in.Queue = "default"
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
	case in.Limit < 1 || in.Limit > maxClaimLimit:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %d: must be 1 to %d", in.Limit, maxClaimLimit))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case len(in.Worker) > 200 || strings.IndexFunc(in.Worker, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		writeError(w, http.StatusBadRequest, "worker: at most 200 printable characters")
		return
	}
	if err := checkQueueName(in.Queue); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	worker := "http:" + in.Worker
	if in.Worker == "" {
		worker = "http:" + r.RemoteAddr
	}
	pid, host := processID(in.Worker, r.RemoteAddr), remoteHost(r.RemoteAddr)
	deadline := time.Now().Add(wait)
	backoff := pollMin
	if wait > 0 {
		h.listenStart()
		defer h.listenDone()
	}
	for {
		woken := h.wake.wait(in.Queue) // before the claim, so an enqueue during it is not missed
		h.workers.claiming(r.Context(), pid, host, in.Queue)
		rows, err := h.claim(r.Context(), driver.ClaimParams{Queue: in.Queue, Limit: in.Limit, Lease: lease, Worker: worker})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		h.workers.claimed(pid, rows)
		left := time.Until(deadline)
		if len(rows) > 0 || left <= 0 {
			out := struct {
				Jobs []jobJSON `json:"jobs"`
			}{Jobs: make([]jobJSON, len(rows))}
			for i, row := range rows {
				out.Jobs[i] = rowJSON(row)
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-woken:
			backoff = pollMin
		case <-t.C:
			backoff = min(2*backoff, pollMax)
		case <-r.Context().Done():
			t.Stop()
			h.fail(w, r, r.Context().Err())
			return
		}
		t.Stop()
	}
}

// claim claims on a context that the client's disconnect does not cancel
// (a claim cut off half way could have committed), and gives the jobs
// back at once if the request ended meanwhile, so that they do not wait
// for their lease to expire.
func (h *Handler) claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.RequestTimeout)
	defer cancel()
	rows, err := h.drv.Claim(cctx, p)
	if err != nil || ctx.Err() == nil || len(rows) == 0 {
		return rows, err
	}
	leases := make([]driver.Lease, len(rows))
	for i, row := range rows {
		leases[i] = driver.Lease{ID: row.ID, Fence: row.Fence}
	}
	if _, rerr := h.drv.Release(cctx, leases); rerr != nil {
		h.opts.Logger.Error("conveyor web: releasing the jobs of a claim whose request ended", "err", rerr)
	}
	return nil, ctx.Err()
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
	if !h.decode(w, r, &in) {
		return
	}
	lease, ok := h.lease(w, in.LeaseMS)
	if !ok {
		return
	}
	owned, err := h.drv.Heartbeat(r.Context(), []driver.Lease{{ID: id, Fence: in.Fence}}, lease)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(owned) != 1 {
		h.workers.done(id)
		writeError(w, http.StatusConflict, staleMsg(id, in.Fence))
		return
	}
	h.workers.beat(r.Context(), id)
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
	}
	if !h.decode(w, r, &in) {
		return
	}
	h.outcome(w, r, driver.Outcome{ID: id, Fence: in.Fence, State: driver.StateCompleted})
}

// failJSON is the body of POST /api/v1/jobs/{id}/fail.
type failJSON struct {
	Fence int64  `json:"fence"`
	Error string `json:"error"`
	Trace string `json:"trace"`
	// Cancel ends the job as cancelled, without retry.
	Cancel bool `json:"cancel"`
	// RetryInMS overrides the client's backoff; 0 uses it.
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
	if !h.decode(w, r, &in) {
		return
	}
	if in.RetryInMS < 0 || in.RetryInMS > 30*24*3600*1000 {
		writeError(w, http.StatusBadRequest, "retry_in_ms: must be 0 to 30 days")
		return
	}
	if strings.TrimSpace(in.Error) == "" {
		in.Error = "failed (no error message given by the HTTP worker)"
	}
	// The attempt number and its limit decide between retryable and
	// discarded; they are read first, and the fenced write below refuses
	// the outcome if another claim took the job meanwhile.
	row, err := h.drv.GetJob(r.Context(), id)
	if err != nil {
		h.fail(w, r, fmt.Errorf("job %d: %w", id, err))
		return
	}
	if row.Fence != in.Fence || row.State != driver.StateRunning {
		h.workers.done(id)
		writeError(w, http.StatusConflict, staleMsg(id, in.Fence))
		return
	}
	o := driver.Outcome{ID: id, Fence: in.Fence, Attempt: row.Attempt, Err: &driver.AttemptError{
		Attempt: row.Attempt, At: time.Now().UTC(),
		Error: clean(in.Error, maxErrorBytes), Trace: clean(in.Trace, maxTraceBytes),
	}}
	switch {
	case in.Cancel:
		o.State = driver.StateCancelled
	case row.Attempt >= row.MaxAttempts:
		o.State = driver.StateDiscarded
	default:
		o.State = driver.StateRetryable
		o.RetryIn = time.Duration(in.RetryInMS) * time.Millisecond
		if o.RetryIn == 0 {
			o.RetryIn = h.c.Config().Backoff(row.Attempt)
		}
	}
	h.outcome(w, r, o)
}

// clean makes a worker's error text storable: valid UTF-8, no NUL (which
// databases refuse in JSON), at most n bytes.
func clean(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + " [truncated]"
	}
	return s
}

// outcome writes one fenced outcome, batched with other requests' (see
// acks): 200 with the new state, or 409 when the fence is stale (nothing
// is written then).
func (h *Handler) outcome(w http.ResponseWriter, r *http.Request, o driver.Outcome) {
	applied, err := h.acks.write(r.Context(), o)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.workers.done(o.ID)
	if !applied {
		writeError(w, http.StatusConflict, staleMsg(o.ID, o.Fence))
		return
	}
	// No h.stats.invalidate(): workers' outcomes come by the thousand, and
	// each would make the next dashboard refresh read the counts again.
	writeJSON(w, http.StatusOK, map[string]any{"id": o.ID, "state": o.State})
}

// maxSnooze is the longest snooze.
const maxSnooze = 30 * 24 * time.Hour

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
	if !h.decode(w, r, &in) {
		return
	}
	d, err := msDuration("delay_ms", in.DelayMS, 0, maxSnooze)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.outcome(w, r, driver.Outcome{ID: id, Fence: in.Fence, State: driver.StateScheduled, RetryIn: d})
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
	if !h.decode(w, r, &in) {
		return
	}
	n, err := h.drv.Release(r.Context(), []driver.Lease{{ID: id, Fence: in.Fence}})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.workers.done(id)
	if n != 1 {
		writeError(w, http.StatusConflict, staleMsg(id, in.Fence))
		return
	}
	row, err := h.drv.GetJob(r.Context(), id)
	if err == nil {
		h.wake.notify(row.Queue)
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": driver.StateAvailable})
}
