package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/web"
)

// jobCmd prints one job with every attempt's error.
func jobCmd(e *env, args []string) error {
	f := e.flags("job", "job ID [--json]", dbHelp)
	asJSON := f.Bool("json", false, "print JSON, the shape of the HTTP API's jobs (in the README)")
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
		return json.NewEncoder(e.stdout).Encode(web.NewJobJSON(j))
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
	key := j.Key
	if key == "" {
		key = "-"
	}
	fmt.Fprintf(e.stdout, "id:           %d\nqueue:        %s\nkind:         %s\nkey:          %s\nstate:        %s\nattempt:      %d of %d\npriority:     %d\nargs:         %s\ncreated:      %s\nscheduled:    %s\nattempted:    %s\nlease until:  %s\nfinalized:    %s\n",
		j.ID, j.Queue, j.Kind, key, j.State, j.Attempt, j.MaxAttempts, j.Priority, j.EncodedArgs, t(j.CreatedAt), t(j.ScheduledAt), attempted, t(j.LeaseExpiresAt), t(j.FinalizedAt))
	if j.BatchID != 0 {
		fmt.Fprintf(e.stdout, "batch:        %d\n", j.BatchID)
	}
	if j.CallbackOf != 0 {
		fmt.Fprintf(e.stdout, "callback of:  batch %d\n", j.CallbackOf)
	}
	if len(j.Result) > 0 {
		fmt.Fprintf(e.stdout, "result:       %s\n", j.Result)
	}
	for _, a := range j.Errors {
		fmt.Fprintf(e.stdout, "error (attempt %d at %s): %s\n", a.Attempt, t(a.At), a.Error)
		if a.Trace != "" {
			fmt.Fprintf(e.stdout, "  %s\n", strings.ReplaceAll(strings.TrimSpace(a.Trace), "\n", "\n  "))
		}
	}
	return nil
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

// batchCmd prints one batch: its callback and its jobs' states and
// results.
func batchCmd(e *env, args []string) error {
	f := e.flags("batch", "batch ID [--json]", dbHelp)
	asJSON := f.Bool("json", false, "print JSON, the shape of the HTTP API's batches")
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	id, err := parseID("batch", pos)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := c.Batch(e.ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(web.NewBatchJSON(b))
	}
	cb := "waiting for every job to finish"
	if b.CallbackID != 0 {
		cb = fmt.Sprintf("job %d, enqueued %s", b.CallbackID, b.FiredAt.Local().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(e.stdout, "id:           %d\ncreated:      %s\njobs:         %d\n",
		b.ID, b.CreatedAt.Local().Format(time.RFC3339Nano), len(b.Jobs))
	if len(b.WaitingFor) > 0 {
		// A workflow job's dependencies that are not jobs yet.
		ids := make([]string, len(b.WaitingFor))
		for i, id := range b.WaitingFor {
			ids[i] = strconv.FormatInt(id, 10)
		}
		fmt.Fprintf(e.stdout, "waiting for:  batch %s (jobs not enqueued yet)\n", strings.Join(ids, ", batch "))
	}
	fmt.Fprintf(e.stdout, "callback:     %s (%s)\n", b.CallbackKind, cb)
	for _, j := range b.Jobs {
		st := string(j.State)
		if st == "" {
			st = "(deleted)"
		}
		if len(j.Result) > 0 {
			fmt.Fprintf(e.stdout, "  %d %s %s\n", j.ID, st, j.Result)
		} else {
			fmt.Fprintf(e.stdout, "  %d %s\n", j.ID, st)
		}
	}
	return nil
}
