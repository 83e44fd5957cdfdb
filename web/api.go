package web

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/conveyorq/conveyor"
)

// route is one endpoint: its method and path (under BasePath), the role
// it needs, and whether it is a dashboard page (answered with the login
// when unauthenticated), public, or part of the JSON API (and so
// described in openapi.json).
type route struct {
	method, path string
	role         Role
	html         bool
	public       bool
	api          bool
	fn           func(http.ResponseWriter, *http.Request, principal)
}

// routeTable lists every endpoint. The OpenAPI test checks that each API
// route is described in assets/openapi.json and nothing else is.
func (h *Handler) routeTable() []route {
	ro, ad := RoleReadOnly, RoleAdmin
	return []route{
		// JSON API.
		{method: "GET", path: "/api/v1/openapi.json", role: ro, api: true, fn: h.openAPI},
		{method: "GET", path: "/api/v1/jobs", role: ro, api: true, fn: h.apiListJobs},
		{method: "POST", path: "/api/v1/jobs", role: ad, api: true, fn: h.apiEnqueue},
		{method: "POST", path: "/api/v1/jobs/batch", role: ad, api: true, fn: h.apiEnqueueBatch},
		{method: "GET", path: "/api/v1/jobs/{id}", role: ro, api: true, fn: h.apiGetJob},
		{method: "GET", path: "/api/v1/batches/{id}", role: ro, api: true, fn: h.apiGetBatch},
		{method: "POST", path: "/api/v1/batches", role: ad, api: true, fn: h.apiEnqueueBatchCallback},
		{method: "POST", path: "/api/v1/workflows", role: ad, api: true, fn: h.apiEnqueueWorkflow},
		{method: "POST", path: "/api/v1/jobs/{id}/retry", role: ad, api: true, fn: h.apiAdmin("retry")},
		{method: "POST", path: "/api/v1/jobs/{id}/cancel", role: ad, api: true, fn: h.apiAdmin("cancel")},
		{method: "POST", path: "/api/v1/jobs/{id}/discard", role: ad, api: true, fn: h.apiAdmin("discard")},
		{method: "POST", path: "/api/v1/jobs/bulk", role: ad, api: true, fn: h.apiBulk},
		{method: "GET", path: "/api/v1/queues", role: ro, api: true, fn: h.apiQueues},
		{method: "POST", path: "/api/v1/queues/{queue}/pause", role: ad, api: true, fn: h.apiPause(true)},
		{method: "POST", path: "/api/v1/queues/{queue}/resume", role: ad, api: true, fn: h.apiPause(false)},
		{method: "GET", path: "/api/v1/queues/{queue}/limits", role: ro, api: true, fn: h.apiGetLimits},
		{method: "PUT", path: "/api/v1/queues/{queue}/limits", role: ad, api: true, fn: h.apiPutLimits},
		{method: "DELETE", path: "/api/v1/queues/{queue}/limits", role: ad, api: true, fn: h.apiDeleteLimits},
		{method: "GET", path: "/api/v1/queues/{queue}/weights", role: ro, api: true, fn: h.apiGetWeights},
		{method: "PUT", path: "/api/v1/queues/{queue}/weights", role: ad, api: true, fn: h.apiPutWeights},
		{method: "DELETE", path: "/api/v1/queues/{queue}/weights", role: ad, api: true, fn: h.apiDeleteWeights},
		{method: "GET", path: "/api/v1/series", role: ro, api: true, fn: h.apiSeries},
		{method: "GET", path: "/api/v1/schedules", role: ro, api: true, fn: h.apiSchedules},
		{method: "GET", path: "/api/v1/processes", role: ro, api: true, fn: h.apiProcesses},
		// Worker protocol.
		{method: "POST", path: "/api/v1/claim", role: ad, api: true, fn: h.apiClaim},
		{method: "POST", path: "/api/v1/jobs/{id}/heartbeat", role: ad, api: true, fn: h.apiHeartbeat},
		{method: "POST", path: "/api/v1/jobs/{id}/complete", role: ad, api: true, fn: h.apiComplete},
		{method: "POST", path: "/api/v1/jobs/{id}/fail", role: ad, api: true, fn: h.apiFail},
		{method: "POST", path: "/api/v1/jobs/{id}/snooze", role: ad, api: true, fn: h.apiSnooze},
		{method: "POST", path: "/api/v1/jobs/{id}/release", role: ad, api: true, fn: h.apiRelease},
		// Dashboard.
		{method: "GET", path: "/login", public: true, fn: h.loginPage},
		{method: "POST", path: "/login", public: true, fn: h.login},
		{method: "POST", path: "/logout", role: ro, html: true, fn: h.logout},
		{method: "GET", path: "/{$}", role: ro, html: true, fn: h.pageQueues},
		{method: "GET", path: "/jobs", role: ro, html: true, fn: h.pageJobs},
		{method: "GET", path: "/jobs/{id}", role: ro, html: true, fn: h.pageJob},
		{method: "GET", path: "/batches/{id}", role: ro, html: true, fn: h.pageBatch},
		{method: "POST", path: "/jobs/{id}/{action}", role: ad, html: true, fn: h.formJobAction},
		{method: "POST", path: "/jobs/bulk", role: ad, html: true, fn: h.formBulk},
		{method: "POST", path: "/queues/{queue}/{action}", role: ad, html: true, fn: h.formQueueAction},
		{method: "POST", path: "/queues/limits", role: ad, html: true, fn: h.formLimits},
		{method: "GET", path: "/static/", public: true, fn: h.serveStatic},
	}
}

// serveStatic serves the embedded script and style sheet (no directory
// listing).
func (h *Handler) serveStatic(w http.ResponseWriter, r *http.Request, _ principal) {
	if strings.HasSuffix(r.URL.Path, "/") {
		http.NotFound(w, r)
		return
	}
	h.static.ServeHTTP(w, r)
}

// claimedJSON converts a claimed job: the job GET /api/v1/jobs/{id}
// answers, plus its fence.
func claimedJSON(j *conveyor.ClaimedJob) JobJSON {
	out := NewJobJSON(j.JobInfo)
	out.Fence = ptr(j.Fence)
	return out
}

// fail answers an error from the client: 400 for invalid input, 404, 409
// for a state that does not allow it or a unique key another job holds,
// 503 for a schema to migrate, 500 otherwise (the detail goes to the log,
// not the answer).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := h.classify(r, err)
	writeError(w, status, msg)
}

func (h *Handler) classify(r *http.Request, err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "conveyor: ")
	switch {
	case errors.Is(err, conveyor.ErrInvalidArgs), errors.Is(err, conveyor.ErrInvalidOpts), errors.Is(err, conveyor.ErrUnknownKind), errors.Is(err, conveyor.ErrInvalidClaim):
		return http.StatusBadRequest, msg
	case errors.Is(err, conveyor.ErrNotFound), errors.Is(err, conveyor.ErrBatchNotFound):
		return http.StatusNotFound, msg
	case errors.Is(err, conveyor.ErrWrongState), errors.Is(err, conveyor.ErrUniqueConflict):
		return http.StatusConflict, msg
	case errors.Is(err, conveyor.ErrSchemaOutdated), errors.Is(err, conveyor.ErrSchemaTooNew), errors.Is(err, conveyor.ErrClosed):
		return http.StatusServiceUnavailable, msg
	case errors.Is(err, conveyor.ErrUnconfirmed):
		// Not a plain failure: sending the jobs again may enqueue them
		// twice.
		h.opts.Logger.ErrorContext(r.Context(), "conveyor web: enqueue not confirmed", "method", r.Method, "path", r.URL.Path, "err", err)
		return http.StatusInternalServerError, "enqueue failed before the database confirmed the commit: the jobs may or may not exist (detail logged by the server)"
	case r.Context().Err() != nil:
		return http.StatusServiceUnavailable, "request timed out or was cancelled: " + r.Context().Err().Error()
	}
	h.opts.Logger.ErrorContext(r.Context(), "conveyor web: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	return http.StatusInternalServerError, "internal error (logged by the server)"
}

// pathID parses the {id} path value.
func pathID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is not a job id", r.PathValue("id")))
		return 0, false
	}
	return id, true
}

func (h *Handler) openAPI(w http.ResponseWriter, r *http.Request, _ principal) {
	b, err := assets.ReadFile("assets/openapi.json")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = w.Write(b)
}

// enqueueJSON is one job to enqueue.
type enqueueJSON struct {
	Kind        string          `json:"kind"`
	Args        json.RawMessage `json:"args"`
	Queue       string          `json:"queue"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	TimeoutMS   int64           `json:"timeout_ms"`
	RunAt       *time.Time      `json:"run_at"`
	DelayMS     int64           `json:"delay_ms"`
	Unique      *uniqueJSON     `json:"unique"`
	// Metadata is the job's metadata (conveyor.EnqueueOpts.Metadata),
	// checked by the client: a key or value with a NUL character, or more
	// than conveyor.MaxMetadataBytes encoded, is refused with 400.
	Metadata map[string]string `json:"metadata"`
	// Key is the job's limit key (conveyor.EnqueueOpts.Key): 1 to
	// conveyor.MaxKeyBytes bytes without NUL characters; "" or absent for
	// none. A longer key, or one with a NUL, is refused with 400.
	Key string `json:"key"`
}

// uniqueJSON are a unique job's options (conveyor.UniqueOpts).
type uniqueJSON struct {
	ByArgs     bool     `json:"by_args"`
	ArgsFields []string `json:"args_fields"`
	ByQueue    bool     `json:"by_queue"`
	ByPeriodMS int64    `json:"by_period_ms"`
	States     []string `json:"states"`
}

// Bounds of an enqueued job's durations: the engine's own (it refuses a
// longer timeout or delay), checked here on the milliseconds before they
// are converted, where a larger value would wrap around.
const (
	maxJobTimeout = 30 * 24 * time.Hour
	maxJobDelay   = 10 * 365 * 24 * time.Hour
	// maxUniquePeriod bounds unique.by_period_ms as delays are bounded.
	maxUniquePeriod = maxJobDelay
)

// msDuration converts the milliseconds of field to a duration after
// checking that they lie in lo..hi, so that a value too large for a
// time.Duration is refused rather than wrapped around into range.
func msDuration(field string, ms int64, lo, hi time.Duration) (time.Duration, error) {
	switch {
	case ms < 0 && lo >= 0:
		return 0, fmt.Errorf("%s %d is negative: must be %d to %d", field, ms, lo.Milliseconds(), hi.Milliseconds())
	case ms < lo.Milliseconds() || ms > hi.Milliseconds():
		return 0, fmt.Errorf("%s %d: must be %d to %d", field, ms, lo.Milliseconds(), hi.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// check range-checks the job's durations, naming the field at fault.
func (e enqueueJSON) check() error {
	if e.TimeoutMS > 0 { // negative: no timeout; 0: the workers' default
		if _, err := msDuration("timeout_ms", e.TimeoutMS, time.Millisecond, maxJobTimeout); err != nil {
			return fmt.Errorf("%w (or -1 for no timeout, 0 for the workers' default)", err)
		}
	}
	if _, err := msDuration("delay_ms", e.DelayMS, 0, maxJobDelay); err != nil {
		return err
	}
	if err := checkKey(e.Key); err != nil {
		return err
	}
	if e.Unique != nil {
		if _, err := msDuration("unique.by_period_ms", e.Unique.ByPeriodMS, 0, maxUniquePeriod); err != nil {
			return err
		}
	}
	return nil
}

// checkKey refuses a job's limit key the client would refuse, naming the
// field: more than conveyor.MaxKeyBytes bytes, or a NUL character (JSON
// decoding has already made the text valid UTF-8).
func checkKey(key string) error {
	switch {
	case len(key) > conveyor.MaxKeyBytes:
		return fmt.Errorf("key is %d bytes: at most %d", len(key), conveyor.MaxKeyBytes)
	case !utf8.ValidString(key) || strings.ContainsRune(key, 0):
		return fmt.Errorf("key %q: must be UTF-8 without NUL characters", key)
	}
	return nil
}

// validate checks what the web layer checks before the client sees the
// job: its durations (check) and its unique states.
func (e enqueueJSON) validate() error {
	if err := e.check(); err != nil {
		return err
	}
	if e.Unique != nil {
		for _, st := range e.Unique.States {
			if _, err := conveyor.ParseJobState(st); err != nil {
				return fmt.Errorf("unique: %s", strings.TrimPrefix(err.Error(), "conveyor: "))
			}
		}
	}
	return nil
}

// item is the job to enqueue; call check first.
func (e enqueueJSON) item() conveyor.EnqueueItem {
	args := e.Args
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	o := &conveyor.EnqueueOpts{Queue: e.Queue, Priority: e.Priority, MaxAttempts: e.MaxAttempts,
		Delay: time.Duration(e.DelayMS) * time.Millisecond, Metadata: e.Metadata, Key: e.Key}
	switch {
	case e.TimeoutMS < 0:
		o.Timeout = -1
	case e.TimeoutMS > 0:
		o.Timeout = time.Duration(e.TimeoutMS) * time.Millisecond
	}
	if e.RunAt != nil {
		o.RunAt = *e.RunAt
	}
	if u := e.Unique; u != nil {
		o.Unique = &conveyor.UniqueOpts{ByArgs: u.ByArgs, ArgsFields: u.ArgsFields, ByQueue: u.ByQueue,
			ByPeriod: time.Duration(u.ByPeriodMS) * time.Millisecond}
		for _, st := range u.States {
			o.Unique.States = append(o.Unique.States, conveyor.JobState(st))
		}
	}
	return conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: e.Kind, JSON: args}, Opts: o}
}

// maxBatch is the most jobs one batch enqueue takes.
const maxBatch = 1000

// enqueuedJSON is one job's result of an enqueue.
type enqueuedJSON struct {
	// ID is the new job's id, or for a unique job whose key was held the
	// id of the job holding it.
	ID int64 `json:"id"`
	// Duplicate is set when nothing was inserted because the unique key
	// was held.
	Duplicate bool `json:"duplicate"`
}

func (h *Handler) enqueue(w http.ResponseWriter, r *http.Request, jobs []enqueueJSON) ([]enqueuedJSON, bool) {
	items := make([]conveyor.EnqueueItem, len(jobs))
	for i, j := range jobs {
		if err := j.validate(); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("job %d: %v", i, err))
			return nil, false
		}
		items[i] = j.item()
	}
	rs, err := h.c.EnqueueMany(r.Context(), items)
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	out := make([]enqueuedJSON, len(rs))
	for i, x := range rs {
		out[i] = enqueuedJSON{ID: x.ID, Duplicate: x.Duplicate}
	}
	// The client wakes this process's waiting claims of the queues.
	// No h.stats.invalidate(): programs enqueue continuously, and each
	// call would make the next dashboard refresh read the counts again.
	return out, true
}

func (h *Handler) apiEnqueue(w http.ResponseWriter, r *http.Request, _ principal) {
	var in enqueueJSON
	if !h.decode(w, r, &in) {
		return
	}
	rs, ok := h.enqueue(w, r, []enqueueJSON{in})
	if !ok {
		return
	}
	status := http.StatusCreated
	if rs[0].Duplicate {
		status = http.StatusOK
	}
	writeJSON(w, status, rs[0])
}

func (h *Handler) apiEnqueueBatch(w http.ResponseWriter, r *http.Request, _ principal) {
	var in struct {
		Jobs []enqueueJSON `json:"jobs"`
	}
	if !h.decode(w, r, &in) {
		return
	}
	switch {
	case len(in.Jobs) == 0:
		writeError(w, http.StatusBadRequest, `"jobs" is empty: send 1 to 1000 jobs`)
		return
	case len(in.Jobs) > maxBatch:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%d jobs in one batch: at most %d", len(in.Jobs), maxBatch))
		return
	}
	rs, ok := h.enqueue(w, r, in.Jobs)
	if !ok {
		return
	}
	out := struct {
		IDs     []int64        `json:"ids"`
		Results []enqueuedJSON `json:"results"`
	}{IDs: make([]int64, len(rs)), Results: rs}
	for i, x := range rs {
		out.IDs[i] = x.ID
	}
	writeJSON(w, http.StatusCreated, out)
}

func (h *Handler) apiGetJob(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	j, err := h.c.Job(r.Context(), id)
	if err != nil {
		h.fail(w, r, fmt.Errorf("job %d: %w", id, err))
		return
	}
	writeJSON(w, http.StatusOK, NewJobJSON(j))
}

// batchPageJSON is the answer of GET /api/v1/batches/{id}: the batch
// with one page of its jobs, in id order, after after= (0 for the first
// page): at most limit= of them (maxListLimit without it) and
// listPageBytes of their encoding (a first job larger than that alone).
// Counts, Finished and TotalJobs are over every job of the batch.
type batchPageJSON struct {
	BatchJSON
	// TotalJobs is how many jobs the batch has, on every page.
	TotalJobs int `json:"total_jobs"`
	// NextAfter is the after= of the next page; null on the last one.
	NextAfter *int64 `json:"next_after"`
	// Truncated is set when the page ended at MaxPageBytes with fewer
	// jobs than limit asked for; NextAfter continues after its last job.
	Truncated bool `json:"truncated"`
	// MaxPageBytes is listPageBytes.
	MaxPageBytes int `json:"max_page_bytes"`
}

// parseBatchQuery reads a batch page's after= and limit=.
func parseBatchQuery(r *http.Request) (after int64, limit int, err error) {
	q := r.URL.Query()
	limit = maxListLimit
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("after=%q is not a job id", v)
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return 0, 0, fmt.Errorf("limit=%q: must be 1 to %d", v, maxListLimit)
		}
		limit = n
	}
	return after, limit, nil
}

// batchPage returns the page of b's jobs after after: at most limit jobs
// and maxBytes of their encoding (at least one job), whether more follow,
// and whether maxBytes ended the page before limit did.
func batchPage(b BatchJSON, after int64, limit, maxBytes int) (page []BatchJobJSON, more, truncated bool) {
	jobs := b.Jobs
	start, _ := slices.BinarySearchFunc(jobs, after+1, func(j BatchJobJSON, id int64) int { return cmp.Compare(j.ID, id) })
	jobs = jobs[start:]
	size := 0
	for i, j := range jobs {
		if i == limit {
			return jobs[:i], true, false
		}
		enc, _ := json.Marshal(j)
		if size += len(enc) + 1; i > 0 && size > maxBytes {
			return jobs[:i], true, true
		}
	}
	return jobs, false, false
}

// apiGetBatch answers a batch with a page of its jobs (batchPageJSON).
func (h *Handler) apiGetBatch(w http.ResponseWriter, r *http.Request, _ principal) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	after, limit, err := parseBatchQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	b, err := h.c.Batch(r.Context(), id)
	if err != nil {
		h.fail(w, r, fmt.Errorf("batch %d: %w", id, err))
		return
	}
	out := batchPageJSON{BatchJSON: NewBatchJSON(b), TotalJobs: len(b.Jobs), MaxPageBytes: listPageBytes}
	page, more, truncated := batchPage(out.BatchJSON, after, limit, listPageBytes)
	out.Jobs, out.Truncated = page, truncated
	if more {
		out.NextAfter = ptr(page[len(page)-1].ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// jobQuery is a job list's filter, from the query string.
type jobQuery struct {
	States []conveyor.JobState
	Queue  string
	Kind   string
	Text   string // substring of the arguments (bounded scan)
	After  int64
	// Before bounds the ids from above (before=): the cursor of a
	// newest-first list's next page.
	Before int64
	// Desc lists newest first (order=desc).
	Desc  bool
	Limit int
	// Summary lists jobSummaryJSON rows (view=summary) instead of whole
	// jobs.
	Summary bool
}

// Bounds of a job listing.
const (
	defaultListLimit = 50
	maxListLimit     = 500
	// textScanLimit is how many jobs a search of the arguments' text
	// reads at most per request.
	textScanLimit = 2000
	// listPageBytes bounds a page of a job list: a page ends before the
	// job that would take its jobs, as encoded, past this many bytes
	// (it keeps at least one), says so with truncated, and its
	// next_after continues after the last job it holds.
	listPageBytes = 4 << 20
	// listReadBytes is about how many bytes of jobs one query of a
	// listing reads: a listing reads its rows in queries of
	// listReadBytes divided by the largest job it has read so far (by
	// MaxArgsBytes before the first), so that it holds about this much
	// of rows at a time, whatever limit asks for and however large the
	// jobs.
	listReadBytes = 4 << 20
	// listReadCapBytes caps the jobs one query asks for, whatever the
	// jobs read so far, at this divided by MaxArgsBytes (64 with the
	// default 1 MiB): the most a query of small jobs followed by large
	// ones can read.
	listReadCapBytes = 64 << 20
	// maxReadRows is the most jobs one query of a listing asks for.
	maxReadRows = 500
)

func parseJobQuery(r *http.Request) (jobQuery, error) {
	q := r.URL.Query()
	f := jobQuery{Queue: q.Get("queue"), Kind: q.Get("kind"), Text: q.Get("q"), Limit: defaultListLimit}
	// A name no job can have would list nothing: refused, as enqueue
	// refuses it, so that a typo is not read as an empty queue.
	if f.Queue != "" {
		if err := conveyor.ValidQueueName(f.Queue); err != nil {
			return f, fmt.Errorf("queue=%q: %w", f.Queue, err)
		}
	}
	if f.Kind != "" {
		if err := conveyor.ValidKindName(f.Kind); err != nil {
			return f, fmt.Errorf("kind=%q: %w", f.Kind, err)
		}
	}
	for _, s := range q["state"] {
		for _, name := range strings.Split(s, ",") {
			if name = strings.TrimSpace(name); name == "" {
				continue
			}
			st, err := conveyor.ParseJobState(name)
			if err != nil {
				return f, errors.New(strings.TrimPrefix(err.Error(), "conveyor: "))
			}
			f.States = append(f.States, st)
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return f, fmt.Errorf("after=%q is not a job id", v)
		}
		f.After = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return f, fmt.Errorf("before=%q is not a job id", v)
		}
		f.Before = n
	}
	switch v := q.Get("order"); v {
	case "", "asc":
	case "desc":
		f.Desc = true
	default:
		return f, fmt.Errorf("order=%q: asc or desc", v)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return f, fmt.Errorf("limit=%q: must be 1 to %d", v, maxListLimit)
		}
		f.Limit = n
	}
	if len(f.Text) > 200 {
		return f, errors.New("q: at most 200 bytes of search text")
	}
	switch v := q.Get("view"); v {
	case "", "full":
	case "summary":
		f.Summary = true
	default:
		return f, fmt.Errorf("view=%q: full or summary", v)
	}
	return f, nil
}

// jobPage is one page of a job list, the answer of GET /api/v1/jobs
// (apiListJobs writes it job by job).
type jobPage struct {
	Jobs []JobJSON `json:"jobs"`
	pageInfo
}

// pageInfo is what a page of a job list says besides its jobs.
type pageInfo struct {
	// NextAfter is the after= of the next page in id order; null on the
	// last one, and in a newest-first list (order=desc).
	NextAfter *int64 `json:"next_after"`
	// NextBefore is the before= of the next page of a newest-first list
	// (order=desc): the older jobs; null on the last one, and in id
	// order.
	NextBefore *int64 `json:"next_before"`
	// Scanned is how many jobs were read to answer a text search (q=),
	// at most ScanLimit; 0 without one.
	Scanned int `json:"scanned"`
	// ScanLimit is the most jobs one text search reads.
	ScanLimit int `json:"scan_limit"`
	// Truncated is set when the page ended at MaxPageBytes with fewer
	// jobs than limit asked for; NextAfter (NextBefore) continues after
	// its last job.
	Truncated bool `json:"truncated"`
	// MaxPageBytes is listPageBytes: the most bytes of jobs one page
	// holds (besides a first job larger than that, alone on its page).
	MaxPageBytes int `json:"max_page_bytes"`
}

// jobSummaryJSON is a job in a list read with view=summary, as the
// dashboard lists them: the job's fields, with a preview of its
// arguments and the first line of its last error instead of all of
// them, so that a row is small whatever the job holds.
type jobSummaryJSON struct {
	ID          int64     `json:"id"`
	Queue       string    `json:"queue"`
	Kind        string    `json:"kind"`
	State       string    `json:"state"`
	Priority    int       `json:"priority"`
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	CreatedAt   *JSONTime `json:"created_at"`
	ScheduledAt *JSONTime `json:"scheduled_at"`
	AttemptedAt *JSONTime `json:"attempted_at"`
	AttemptedBy *string   `json:"attempted_by"`
	FinalizedAt *JSONTime `json:"finalized_at"`
	// Key is the job's limit key; null when it has none.
	Key *string `json:"key"`
	// ArgsPreview is the start of the arguments' JSON on one line, at
	// most previewBytes of it, ending in "…" when cut.
	ArgsPreview string `json:"args_preview"`
	// ArgsBytes is the size of the arguments' JSON as stored.
	ArgsBytes int `json:"args_bytes"`
	// ErrorCount is how many attempts failed.
	ErrorCount int `json:"error_count"`
	// LastError is the first line of the last failed attempt's error, at
	// most previewBytes of it, ending in "…" when cut; null without one.
	LastError *string `json:"last_error"`
}

// previewBytes bounds the texts of a summary row.
const previewBytes = 120

func toJobSummary(j *conveyor.JobInfo) jobSummaryJSON {
	out := jobSummaryJSON{
		ID: j.ID, Queue: j.Queue, Kind: j.Kind, State: string(j.State),
		Priority: j.Priority, Attempt: j.Attempt, MaxAttempts: j.MaxAttempts,
		CreatedAt: timeOrNull(j.CreatedAt), ScheduledAt: timeOrNull(j.ScheduledAt),
		AttemptedAt: timeOrNull(j.AttemptedAt), AttemptedBy: stringOrNull(j.AttemptedBy),
		FinalizedAt: timeOrNull(j.FinalizedAt), Key: stringOrNull(j.Key),
		ArgsBytes: len(j.EncodedArgs), ErrorCount: len(j.Errors),
	}
	args := j.EncodedArgs
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	text, cut, _ := formatJSON(args, previewBytes, 0)
	if cut {
		text += "…"
	}
	out.ArgsPreview = text
	if n := len(j.Errors); n > 0 {
		line, _, _ := strings.Cut(j.Errors[n-1].Error, "\n")
		if len(line) > previewBytes {
			line = strings.ToValidUTF8(line[:previewBytes], "") + "…"
		}
		out.LastError = &line
	}
	return out
}

// size is about how many bytes the summary takes in a page.
func (s *jobSummaryJSON) size() int {
	n := 400 + len(s.Queue) + len(s.Kind) + len(s.ArgsPreview)
	if s.Key != nil {
		n += len(*s.Key)
	}
	if s.AttemptedBy != nil {
		n += len(*s.AttemptedBy)
	}
	if s.LastError != nil {
		n += len(*s.LastError)
	}
	return n
}

// readBytes is about how many bytes a job read from the database holds.
func readBytes(j *conveyor.JobInfo) int {
	n := 256 + len(j.Queue) + len(j.Kind) + len(j.AttemptedBy) + len(j.Key) + len(j.EncodedArgs)
	for _, e := range j.Errors {
		n += 64 + len(e.Error) + len(e.Trace)
	}
	return n
}

// listJobs reads one page of the jobs f selects, in id order (newest
// first with f.Desc, from f.Before down), and returns each as row makes
// it, with the page's info. row returns the
// bytes the job takes in the page; the page ends before the job that
// would take it past listPageBytes (Truncated; at least one job is
// kept). Without a text search it reads up to f.Limit jobs; with one, at
// most textScanLimit jobs past the cursor, keeping those whose arguments
// contain the text (case-insensitively). Either way it reads in queries
// of about listReadBytes (see there), dropping each job once row made
// it, so that what it holds is the page plus one query's rows.
func listJobs[T any](h *Handler, r *http.Request, f jobQuery, row func(*conveyor.JobInfo) (T, int, error)) ([]T, pageInfo, error) {
	cf := conveyor.JobFilter{States: f.States, Queue: f.Queue, Kind: f.Kind, AfterID: f.After, BeforeID: f.Before, Desc: f.Desc}
	info := pageInfo{ScanLimit: textScanLimit, MaxPageBytes: listPageBytes}
	// The cursor moves past each job read: up in id order, down newest
	// first; next is where the next page starts.
	cursor := &cf.AfterID
	next := &info.NextAfter
	if f.Desc {
		cursor, next = &cf.BeforeID, &info.NextBefore
	}
	out := []T{}
	maxArgs := h.c.Config().MaxArgsBytes
	if maxArgs <= 0 {
		maxArgs = 1 << 20
	}
	largest := maxArgs // the largest job read so far; before any, the largest one may be
	first, size := true, 0
	var m *argsMatcher
	if f.Text != "" {
		m = newArgsMatcher(f.Text)
	}
	for {
		want := f.Limit - len(out)
		if m != nil {
			want = textScanLimit - info.Scanned
		}
		cf.Limit = min(want, maxReadRows, max(1, listReadBytes/largest), max(1, listReadCapBytes/maxArgs))
		list, err := h.c.Jobs(r.Context(), cf)
		if err != nil {
			return nil, info, err
		}
		if first {
			first, largest = false, 1 // from now on, what was read
		}
		for i, j := range list {
			list[i] = nil // held by nothing once handled
			largest = max(largest, readBytes(j))
			if m != nil {
				info.Scanned++
				if !m.match(j.EncodedArgs) {
					*cursor = j.ID
					continue
				}
			}
			v, n, err := row(j)
			if err != nil {
				return nil, info, fmt.Errorf("job %d: %w", j.ID, err)
			}
			if len(out) > 0 && size+n > listPageBytes {
				if m != nil {
					info.Scanned-- // the next page reads it again
				}
				info.Truncated, *next = true, ptr(*cursor)
				return out, info, nil
			}
			out, size, *cursor = append(out, v), size+n, j.ID
			if len(out) == f.Limit {
				*next = ptr(j.ID)
				return out, info, nil
			}
		}
		if len(list) < cf.Limit {
			return out, info, nil // the end of the table
		}
		if m != nil && info.Scanned >= textScanLimit {
			*next = ptr(*cursor)
			return out, info, nil
		}
	}
}

// argsMatcher finds a text in jobs' arguments, case-insensitively, with
// encoding/json's escapes of '<', '>' and '&' read as the characters (as
// typed). It folds each job's arguments into one buffer it reuses, so a
// search holds one job's arguments twice at most, not a copy per job.
type argsMatcher struct {
	needle, buf []byte
}

func newArgsMatcher(text string) *argsMatcher {
	return &argsMatcher{needle: []byte(strings.ToLower(text))}
}

// match reports whether args contain the text, as
// strings.Contains(strings.ToLower(unescaped args), strings.ToLower(text))
// would.
func (m *argsMatcher) match(args []byte) bool {
	b := m.buf[:0]
	for i := 0; i < len(args); {
		c := args[i]
		if c == '\\' && i+5 < len(args) && args[i+1] == 'u' && args[i+2] == '0' && args[i+3] == '0' {
			if x := htmlEscape(args[i+4], args[i+5]); x != 0 {
				b = append(b, x)
				i += 6
				continue
			}
		}
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b = append(b, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(args[i:])
		b = utf8.AppendRune(b, unicode.ToLower(r)) // invalid UTF-8 as U+FFFD, as strings.ToLower does
		i += n
	}
	m.buf = b
	return bytes.Contains(b, m.needle)
}

func (h *Handler) apiListJobs(w http.ResponseWriter, r *http.Request, _ principal) {
	f, err := parseJobQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Each job is encoded as it is read; the page is then written job by
	// job, so that it is never encoded whole in one buffer.
	encode := func(j *conveyor.JobInfo) ([]byte, int, error) {
		b, err := json.Marshal(NewJobJSON(j))
		return b, len(b), err
	}
	if f.Summary {
		encode = func(j *conveyor.JobInfo) ([]byte, int, error) {
			b, err := json.Marshal(toJobSummary(j))
			return b, len(b), err
		}
	}
	rows, info, err := listJobs(h, r, f, encode)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	tail, err := json.Marshal(info)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	bw.WriteString(`{"jobs":[`)
	for i, b := range rows {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(b)
		rows[i] = nil
	}
	bw.WriteString("],")
	bw.Write(tail[1:]) // the info's fields and its closing brace
	bw.WriteByte('\n')
	_ = bw.Flush()
}

// adminAction runs retry, cancel or discard on job id.
func (h *Handler) adminAction(r *http.Request, action string, id int64) (*conveyor.JobInfo, error) {
	switch action {
	case "retry":
		return h.c.Retry(r.Context(), id) // which wakes the queue's waiting claims
	case "cancel":
		return h.c.Cancel(r.Context(), id)
	case "discard":
		return h.c.Discard(r.Context(), id)
	}
	return nil, fmt.Errorf("unknown action %q", action)
}

func (h *Handler) apiAdmin(action string) func(http.ResponseWriter, *http.Request, principal) {
	return func(w http.ResponseWriter, r *http.Request, _ principal) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		j, err := h.adminAction(r, action, id)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, NewJobJSON(j))
	}
}

// maxBulk is the most jobs one bulk action takes.
const maxBulk = 500

// bulkResult is the outcome of a bulk action for one job.
type bulkResult struct {
	ID int64 `json:"id"`
	// State is the job's state after the action; null when it was refused.
	State *string `json:"state"`
	// Error says why it was refused; null when it was applied.
	Error *string `json:"error"`
}

// bulk runs action on each id, one after the other; a job the action
// does not apply to is reported, not fatal.
func (h *Handler) bulk(r *http.Request, action string, ids []int64) ([]bulkResult, error) {
	out := make([]bulkResult, 0, len(ids))
	for _, id := range ids {
		j, err := h.adminAction(r, action, id)
		switch {
		case err == nil:
			out = append(out, bulkResult{ID: id, State: ptr(string(j.State))})
		case errors.Is(err, conveyor.ErrNotFound) || errors.Is(err, conveyor.ErrWrongState) || errors.Is(err, conveyor.ErrUniqueConflict):
			out = append(out, bulkResult{ID: id, Error: ptr(strings.TrimPrefix(err.Error(), "conveyor: "))})
		default:
			return out, err
		}
	}
	h.stats.invalidate()
	return out, nil
}

// checkBulk validates a bulk action's input.
func checkBulk(action string, ids []int64) error {
	switch action {
	case "retry", "cancel", "discard":
	default:
		return fmt.Errorf("action %q: retry, cancel or discard", action)
	}
	if len(ids) == 0 || len(ids) > maxBulk {
		return fmt.Errorf("%d ids: send 1 to %d", len(ids), maxBulk)
	}
	for _, id := range ids {
		if id <= 0 {
			return fmt.Errorf("%d is not a job id", id)
		}
	}
	return nil
}

// apiBulk retries, cancels or discards up to maxBulk jobs.
func (h *Handler) apiBulk(w http.ResponseWriter, r *http.Request, _ principal) {
	var in struct {
		Action string  `json:"action"`
		IDs    []int64 `json:"ids"`
	}
	if !h.decode(w, r, &in) {
		return
	}
	if err := checkBulk(in.Action, in.IDs); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	res, err := h.bulk(r, in.Action, in.IDs)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string][]bulkResult{"results": res})
}

// queueJSON is one queue's statistics.
type queueJSON struct {
	Queue  string           `json:"queue"`
	Counts map[string]int64 `json:"counts"`
	// OldestAvailableMS is the age of the oldest available job; null
	// when none is available.
	OldestAvailableMS *int64 `json:"oldest_available_ms"`
	Paused            bool   `json:"paused"`
	// PausedAt is null when the queue is not paused.
	PausedAt *JSONTime `json:"paused_at"`
	// Processes is how many alive processes work the queue.
	Processes int `json:"processes"`
	// Unworked is set when jobs are available and no alive process
	// works the queue: they wait until one starts.
	Unworked bool `json:"unworked"`
	// Limits are the queue's flow limits; null when it has none.
	Limits *limitsJSON `json:"limits"`
	// LimitUse is how much of Limits is in use; null without Limits.
	LimitUse *limitUseJSON `json:"limit_use"`
	// Held says why available jobs are not started although workers may
	// be free: "paused", "concurrency" (MaxRunning jobs run), "rate" (the
	// rate window is full) or "key" (every available job's key is at its
	// key_max_running, or waits for an earlier job of its ordered key);
	// null when nothing holds them.
	Held *string `json:"held"`
	// AwaitingDependencies is how many jobs of the queue wait for their
	// dependencies (batch callbacks and workflow jobs not enqueued yet);
	// they are in no state of Counts.
	AwaitingDependencies int64 `json:"awaiting_dependencies"`
	// WeightedKeys is how many keys of a fair queue have a weight (GET
	// /api/v1/queues/{queue}/weights lists them); 0 for a queue that is
	// not fair.
	WeightedKeys int `json:"weighted_keys"`
}

// queuesJSON is the answer of GET /api/v1/queues.
type queuesJSON struct {
	Backend string      `json:"backend"`
	Queues  []queueJSON `json:"queues"`
	// ReadAt is when the counts were read (they are shared by every
	// request for StatsMaxAge).
	ReadAt JSONTime `json:"read_at"`
	// FinishedWindowS is how far back, in seconds, the finished states
	// (completed, discarded, cancelled) are counted: jobs finished since
	// FinishedSince. The unfinished states count every job.
	FinishedWindowS int64    `json:"finished_window_s"`
	FinishedSince   JSONTime `json:"finished_since"`
}

func toQueuesJSON(backend string, rd *reading) queuesJSON {
	out := queuesJSON{Backend: backend, Queues: []queueJSON{}, ReadAt: JSONTime(rd.At),
		FinishedWindowS: int64(finishedWindow / time.Second), FinishedSince: JSONTime(rd.Stats.FinishedSince)}
	working := map[string]int{}
	for _, p := range rd.Processes {
		if p.Alive {
			for q := range p.Queues {
				working[q]++
			}
		}
	}
	for _, x := range rd.Stats.Queues {
		q := queueJSON{Queue: x.Queue, Counts: map[string]int64{}, Paused: !x.PausedAt.IsZero(), PausedAt: timeOrNull(x.PausedAt)}
		q.Processes = working[x.Queue]
		q.AwaitingDependencies = x.AwaitingDependencies
		q.Limits, q.LimitUse = toLimitsJSON(x.Limits), toLimitUseJSON(x.LimitUse)
		if x.Limits != nil && x.Limits.Fair {
			q.WeightedKeys = len(rd.Weights[x.Queue])
		}
		if x.Held != "" {
			q.Held = ptr(x.Held)
		}
		q.Unworked = q.Processes == 0 && x.Counts[conveyor.JobStateAvailable] > 0
		for _, st := range conveyor.JobStates() {
			q.Counts[string(st)] = x.Counts[st]
		}
		if x.Counts[conveyor.JobStateAvailable] > 0 {
			q.OldestAvailableMS = ptr(x.OldestAvailable.Milliseconds())
		}
		out.Queues = append(out.Queues, q)
	}
	sort.Slice(out.Queues, func(i, j int) bool { return out.Queues[i].Queue < out.Queues[j].Queue })
	return out
}

func (h *Handler) apiQueues(w http.ResponseWriter, r *http.Request, _ principal) {
	rd, err := h.stats.get(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toQueuesJSON(h.c.Backend(), rd))
}

func (h *Handler) setPaused(r *http.Request, queue string, paused bool) error {
	var err error
	if paused {
		err = h.c.PauseQueue(r.Context(), queue)
	} else {
		err = h.c.ResumeQueue(r.Context(), queue) // which wakes its waiting claims
	}
	h.stats.invalidate()
	return err
}

func (h *Handler) apiPause(paused bool) func(http.ResponseWriter, *http.Request, principal) {
	return func(w http.ResponseWriter, r *http.Request, _ principal) {
		q := r.PathValue("queue")
		if err := h.setPaused(r, q, paused); err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"queue": q, "paused": paused})
	}
}

func (h *Handler) apiSeries(w http.ResponseWriter, r *http.Request, _ principal) {
	if _, err := h.stats.get(r.Context()); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h.stats.series())
}

// scheduleJSON is one periodic schedule.
type scheduleJSON struct {
	Name string `json:"name"`
	Spec string `json:"spec"`
	// Last is the latest slot a job was made for and LastJobID that
	// job's id; null before the first.
	Last      *JSONTime `json:"last"`
	LastJobID *int64    `json:"last_job_id"`
	// Next is the next slot; null when unknown.
	Next *JSONTime `json:"next"`
}

func (h *Handler) schedules(r *http.Request) ([]scheduleJSON, error) {
	list, err := h.c.Schedules(r.Context())
	if err != nil {
		return nil, err
	}
	out := make([]scheduleJSON, 0, len(list))
	for _, s := range list {
		x := scheduleJSON{Name: s.Name, Spec: s.Spec, Last: timeOrNull(s.Last), Next: timeOrNull(s.Next)}
		if s.LastJobID != 0 {
			x.LastJobID = ptr(s.LastJobID)
		}
		out = append(out, x)
	}
	return out, nil
}

// apiSchedules lists the periodic schedules recorded in the database.
func (h *Handler) apiSchedules(w http.ResponseWriter, r *http.Request, _ principal) {
	list, err := h.schedules(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string][]scheduleJSON{"schedules": list})
}
