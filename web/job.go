package web

import (
	"encoding/json"
	"time"

	"github.com/conveyorq/conveyor"
)

// JobJSON is a job as conveyor's JSON interfaces write it: the HTTP API
// (a job, a page of jobs, a claim, an admin action's answer) and the
// command's `conveyor job --json` and `conveyor jobs --json`. NewJobJSON
// makes it; both write exactly what it encodes to, so a program reads a
// job the same way from either.
//
// Keys are snake_case. Times are RFC 3339 strings in UTC with
// microseconds (JSONTime). A time or value that is absent is null, never
// a zero time or an empty string. Durations are whole milliseconds under
// keys ending in _ms. errors is [] for a job that never failed; metadata,
// key and result are null for a job without any; fence is present on claimed jobs only.
//
// It is not conveyor.JobInfo's own encoding (json.Marshal of a JobInfo
// keeps Go's field names and time layout).
type JobJSON struct {
	// ID is the job's id.
	ID int64 `json:"id"`
	// Queue is the queue the job is in.
	Queue string `json:"queue"`
	// Kind names the worker that runs it.
	Kind string `json:"kind"`
	// State is one of conveyor.JobStates().
	State string `json:"state"`
	// Args are the arguments as stored; {} for a job stored without any.
	Args json.RawMessage `json:"args"`
	// Priority: smaller runs first.
	Priority int `json:"priority"`
	// Attempt counts the attempts started so far.
	Attempt int `json:"attempt"`
	// MaxAttempts is the most attempts the job gets.
	MaxAttempts int `json:"max_attempts"`
	// TimeoutMS is the job's own timeout in milliseconds: null for the
	// workers' default, -1 for none.
	TimeoutMS *int64 `json:"timeout_ms"`
	// CreatedAt is when the job was enqueued.
	CreatedAt *JSONTime `json:"created_at"`
	// ScheduledAt is when the job is, or was, due.
	ScheduledAt *JSONTime `json:"scheduled_at"`
	// AttemptedAt is when the latest attempt was claimed; null before
	// the first.
	AttemptedAt *JSONTime `json:"attempted_at"`
	// AttemptedBy identifies who ran the latest attempt; null before the
	// first.
	AttemptedBy *string `json:"attempted_by"`
	// LeaseExpiresAt is when a running attempt's lease ends unless
	// renewed; null unless running.
	LeaseExpiresAt *JSONTime `json:"lease_expires_at"`
	// FinalizedAt is when the job completed, was discarded or cancelled.
	FinalizedAt *JSONTime `json:"finalized_at"`
	// Errors holds every failed attempt, oldest first; [] for none.
	Errors []AttemptJSON `json:"errors"`
	// Metadata is the job's metadata (conveyor.EnqueueOpts.Metadata);
	// null when it has none.
	Metadata map[string]string `json:"metadata"`
	// Key is the job's limit key (conveyor.EnqueueOpts.Key); null when
	// it has none.
	Key *string `json:"key"`
	// Result is the JSON value the attempt that completed the job set
	// (conveyor.SetResult, or an HTTP worker's completion); null when
	// there is none, and in job lists and claims, which do not read it.
	Result json.RawMessage `json:"result"`
	// Fence is set on claimed jobs only: the token that heartbeat,
	// complete, fail, snooze and release must send back.
	Fence *int64 `json:"fence,omitempty"`
	// BatchID is the batch the job is a member of (GET
	// /api/v1/batches/{id}), the first of a workflow's job several steps
	// wait for (conveyor.JobInfo.BatchID); absent when it is in none,
	// and in job lists and claims, which do not read it.
	BatchID int64 `json:"batch_id,omitempty"`
	// CallbackOf is the batch whose callback the job is; absent when it
	// is no batch's callback, and in job lists and claims.
	CallbackOf int64 `json:"callback_of,omitempty"`
}

// AttemptJSON is one failed attempt in JobJSON.Errors.
type AttemptJSON struct {
	// Attempt is the attempt's number, from 1.
	Attempt int `json:"attempt"`
	// At is when it failed.
	At *JSONTime `json:"at"`
	// Error is the error's text.
	Error string `json:"error"`
	// Trace is the stack trace of a panic (or the one a worker sent);
	// null without one.
	Trace *string `json:"trace"`
}

// JSONTime is a time as JobJSON and the rest of the API write it: RFC
// 3339 in UTC with microseconds, e.g. "2025-06-01T10:00:00.123456Z".
type JSONTime time.Time

// jsonTimeLayout is the layout of every time in the API.
const jsonTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// MarshalJSON writes the time in UTC with microseconds.
func (t JSONTime) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format(jsonTimeLayout) + `"`), nil
}

// UnmarshalJSON reads an RFC 3339 time.
func (t *JSONTime) UnmarshalJSON(b []byte) error {
	var x time.Time
	if err := x.UnmarshalJSON(b); err != nil {
		return err
	}
	*t = JSONTime(x)
	return nil
}

// NewJobJSON returns j in the shape of JobJSON, without a fence. j's
// metadata is copied by reference; an empty map becomes null.
func NewJobJSON(j *conveyor.JobInfo) JobJSON {
	out := JobJSON{
		ID: j.ID, Queue: j.Queue, Kind: j.Kind, State: string(j.State), Args: j.EncodedArgs,
		Priority: j.Priority, Attempt: j.Attempt, MaxAttempts: j.MaxAttempts,
		CreatedAt: timeOrNull(j.CreatedAt), ScheduledAt: timeOrNull(j.ScheduledAt),
		AttemptedAt: timeOrNull(j.AttemptedAt), AttemptedBy: stringOrNull(j.AttemptedBy),
		LeaseExpiresAt: timeOrNull(j.LeaseExpiresAt), FinalizedAt: timeOrNull(j.FinalizedAt),
		Errors: []AttemptJSON{}, Key: stringOrNull(j.Key),
		BatchID: j.BatchID, CallbackOf: j.CallbackOf,
	}
	if len(out.Args) == 0 {
		out.Args = json.RawMessage("{}")
	}
	switch {
	case j.Timeout < 0:
		out.TimeoutMS = ptr(int64(-1))
	case j.Timeout > 0:
		out.TimeoutMS = ptr(j.Timeout.Milliseconds())
	}
	for _, a := range j.Errors {
		out.Errors = append(out.Errors, AttemptJSON{Attempt: a.Attempt, At: timeOrNull(a.At), Error: a.Error, Trace: stringOrNull(a.Trace)})
	}
	if len(j.Metadata) > 0 {
		out.Metadata = j.Metadata
	}
	if len(j.Result) > 0 {
		out.Result = j.Result
	}
	return out
}

func timeOrNull(t time.Time) *JSONTime {
	if t.IsZero() {
		return nil
	}
	u := JSONTime(t)
	return &u
}

func stringOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func ptr[T any](v T) *T { return &v }

// BatchJSON is a batch as the HTTP API (GET /api/v1/batches/{id}) and
// `conveyor batch --json` write it. callback_id and fired_at are null
// until every job of the batch has finished and the callback was
// enqueued; counts has every state that some job is in ("" for jobs
// retention deleted).
type BatchJSON struct {
	// ID is the batch's id.
	ID int64 `json:"id"`
	// CreatedAt is when the batch was enqueued.
	CreatedAt *JSONTime `json:"created_at"`
	// Finished is whether every job has finished and none is still to
	// be enqueued (WaitingFor is empty).
	Finished bool `json:"finished"`
	// CallbackKind is the callback job's kind.
	CallbackKind string `json:"callback_kind"`
	// CallbackID is the callback job's id once enqueued.
	CallbackID *int64 `json:"callback_id"`
	// FiredAt is when the callback was enqueued.
	FiredAt *JSONTime `json:"fired_at"`
	// Counts counts the jobs by state.
	Counts map[string]int `json:"counts"`
	// Jobs are the batch's jobs by id.
	Jobs []BatchJobJSON `json:"jobs"`
	// WaitingFor are the batches of a workflow step's dependencies not
	// enqueued yet (conveyor.Batch.WaitingFor); empty when none.
	WaitingFor []int64 `json:"waiting_for"`
}

// BatchJobJSON is one job of a batch in BatchJSON.
type BatchJobJSON struct {
	// ID is the job's id.
	ID int64 `json:"id"`
	// State is its state, "" once retention deleted it.
	State string `json:"state"`
	// Result is its result, null for none.
	Result json.RawMessage `json:"result"`
}

// NewBatchJSON returns b in the shape of BatchJSON.
func NewBatchJSON(b *conveyor.Batch) BatchJSON {
	out := BatchJSON{ID: b.ID, CreatedAt: timeOrNull(b.CreatedAt), Finished: b.Finished(), CallbackKind: b.CallbackKind,
		FiredAt: timeOrNull(b.FiredAt), Counts: map[string]int{}, Jobs: make([]BatchJobJSON, len(b.Jobs)),
		WaitingFor: append([]int64{}, b.WaitingFor...)}
	if b.CallbackID != 0 {
		out.CallbackID = ptr(b.CallbackID)
	}
	for st, n := range b.Counts {
		out.Counts[string(st)] = n
	}
	for i, j := range b.Jobs {
		out.Jobs[i] = BatchJobJSON{ID: j.ID, State: string(j.State), Result: j.Result}
	}
	return out
}
