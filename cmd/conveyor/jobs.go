package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/web"
)

// jobsCmd lists jobs.
func jobsCmd(e *env, args []string) error {
	f := e.flags("jobs", "jobs [--state S] [--queue Q] [--kind K] [--limit N] [--after ID] [--json]", dbHelp)
	state := f.String("state", "", "comma-separated `states`")
	queue := f.String("queue", "", "`queue`")
	kind := f.String("kind", "", "`kind`")
	limit := f.Int("limit", 50, "maximum jobs listed (1 or more)")
	after := f.Int64("after", 0, "list jobs with ids after this `ID`")
	asJSON := f.Bool("json", false, "print a JSON array (the shape is in the README)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	switch {
	case *limit < 1:
		return usageError("jobs", fmt.Sprintf("--limit %d: must be 1 or more", *limit))
	case *after < 0:
		return usageError("jobs", fmt.Sprintf("--after %d: must be a job id (or 0, the default, for the first page)", *after))
	// A name no job can have would list nothing: refused, as enqueue
	// refuses it, so that a typo is not read as an empty queue.
	case *queue != "" && conveyor.ValidQueueName(*queue) != nil:
		return fmt.Errorf("jobs: --queue %q: %w", *queue, conveyor.ValidQueueName(*queue))
	case *kind != "" && conveyor.ValidKindName(*kind) != nil:
		return fmt.Errorf("jobs: --kind %q: %w", *kind, conveyor.ValidKindName(*kind))
	}
	var states []conveyor.JobState
	if *state != "" {
		for _, name := range strings.Split(*state, ",") {
			st, err := conveyor.ParseJobState(strings.TrimSpace(name))
			if err != nil {
				return err
			}
			states = append(states, st)
		}
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	list, err := c.Jobs(e.ctx, conveyor.JobFilter{States: states, Queue: *queue, Kind: *kind, Limit: *limit, AfterID: *after})
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]web.JobJSON, len(list))
		for i, j := range list {
			out[i] = web.NewJobJSON(j)
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tQUEUE\tKIND\tSTATE\tATTEMPT\tPRIORITY\tSCHEDULED\tLAST ERROR")
	for _, j := range list {
		last := ""
		if n := len(j.Errors); n > 0 {
			last = firstLine(j.Errors[n-1].Error, 60)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", j.ID, j.Queue, j.Kind, j.State, j.Attempt, j.MaxAttempts, j.Priority, j.ScheduledAt.Local().Format(time.DateTime), last)
	}
	return w.Flush()
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
