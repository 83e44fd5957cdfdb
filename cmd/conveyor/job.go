package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// jobCmd prints one job with every attempt's error.
func jobCmd(e *env, args []string) error {
	f := e.flags("job", "job ID [--json]", dbHelp)
	asJSON := f.Bool("json", false, "print JSON (the shape is in the README)")
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	id, err := parseID("job", pos)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	j, err := c.Job(e.ctx, id)
	if err != nil {
		return err // "get job 7: job not found"
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(toJobJSON(j))
	}
	t := func(x time.Time) string {
		if x.IsZero() {
			return "-"
		}
		return x.Local().Format(time.RFC3339Nano)
	}
	attempted := t(j.AttemptedAt)
	if j.AttemptedBy != "" {
		attempted += " by " + j.AttemptedBy
	}
	fmt.Fprintf(e.stdout, "id:           %d\nqueue:        %s\nkind:         %s\nstate:        %s\nattempt:      %d of %d\npriority:     %d\nargs:         %s\ncreated:      %s\nscheduled:    %s\nattempted:    %s\nlease until:  %s\nfinalized:    %s\n",
		j.ID, j.Queue, j.Kind, j.State, j.Attempt, j.MaxAttempts, j.Priority, j.EncodedArgs, t(j.CreatedAt), t(j.ScheduledAt), attempted, t(j.LeaseExpiresAt), t(j.FinalizedAt))
	for _, a := range j.Errors {
		fmt.Fprintf(e.stdout, "error (attempt %d at %s): %s\n", a.Attempt, t(a.At), a.Error)
		if a.Trace != "" {
			fmt.Fprintf(e.stdout, "  %s\n", strings.ReplaceAll(strings.TrimSpace(a.Trace), "\n", "\n  "))
		}
	}
	return nil
}

// jobJSON is a job as jobs --json and job --json print it: snake_case
// keys, times in RFC 3339 UTC with microseconds, null for a time or value
// that is absent, durations in whole milliseconds.
type jobJSON struct {
	ID          int64             `json:"id"`
	Queue       string            `json:"queue"`
	Kind        string            `json:"kind"`
	State       conveyor.JobState `json:"state"`
	Args        json.RawMessage   `json:"args"`
	Priority    int               `json:"priority"`
	Attempt     int               `json:"attempt"`
	MaxAttempts int               `json:"max_attempts"`
	// TimeoutMS is the job's own timeout: null for the workers' default,
	// -1 for none.
	TimeoutMS      *int64        `json:"timeout_ms"`
	CreatedAt      *string       `json:"created_at"`
	ScheduledAt    *string       `json:"scheduled_at"`
	AttemptedAt    *string       `json:"attempted_at"`
	AttemptedBy    *string       `json:"attempted_by"`
	LeaseExpiresAt *string       `json:"lease_expires_at"`
	FinalizedAt    *string       `json:"finalized_at"`
	Errors         []attemptJSON `json:"errors"`
	// Metadata is the job's metadata (EnqueueOpts.Metadata), null when it
	// has none.
	Metadata map[string]string `json:"metadata"`
}

// attemptJSON is one failed attempt in jobJSON.
type attemptJSON struct {
	Attempt int     `json:"attempt"`
	At      *string `json:"at"`
	Error   string  `json:"error"`
	Trace   *string `json:"trace"`
}

// jsonTime is the layout of times in the JSON output.
const jsonTime = "2006-01-02T15:04:05.000000Z07:00"

func toJobJSON(j *conveyor.JobInfo) jobJSON {
	out := jobJSON{
		ID: j.ID, Queue: j.Queue, Kind: j.Kind, State: j.State, Args: j.EncodedArgs,
		Priority: j.Priority, Attempt: j.Attempt, MaxAttempts: j.MaxAttempts,
		CreatedAt: timeOrNull(j.CreatedAt), ScheduledAt: timeOrNull(j.ScheduledAt),
		AttemptedAt: timeOrNull(j.AttemptedAt), AttemptedBy: stringOrNull(j.AttemptedBy),
		LeaseExpiresAt: timeOrNull(j.LeaseExpiresAt), FinalizedAt: timeOrNull(j.FinalizedAt),
		Errors: []attemptJSON{}, Metadata: j.Metadata,
	}
	if len(out.Args) == 0 {
		out.Args = nil
	}
	switch {
	case j.Timeout < 0:
		out.TimeoutMS = ptr(int64(-1))
	case j.Timeout > 0:
		out.TimeoutMS = ptr(j.Timeout.Milliseconds())
	}
	for _, a := range j.Errors {
		out.Errors = append(out.Errors, attemptJSON{Attempt: a.Attempt, At: timeOrNull(a.At), Error: a.Error, Trace: stringOrNull(a.Trace)})
	}
	return out
}

func timeOrNull(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	return ptr(t.UTC().Format(jsonTime))
}

func stringOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func ptr[T any](v T) *T { return &v }
