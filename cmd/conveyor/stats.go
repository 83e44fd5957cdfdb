package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
)

// statsCmd prints per queue the counts by state and the age of the oldest
// available job. The client's process counters are left out: a one-shot
// command claims nothing, so they would always be 0.
func statsCmd(e *env, args []string) error {
	f := e.flags("stats", "stats [--json]", dbHelp)
	asJSON := f.Bool("json", false, "print JSON (the shape is in the README)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.Stats(e.ctx)
	if err != nil {
		return err
	}
	sort.Slice(s.Queues, func(i, j int) bool { return s.Queues[i].Queue < s.Queues[j].Queue })
	if *asJSON {
		type queue struct {
			Queue  string                      `json:"queue"`
			Counts map[conveyor.JobState]int64 `json:"counts"`
			// OldestAvailableMS is null when no job is available.
			OldestAvailableMS *int64 `json:"oldest_available_ms"`
			// PausedAt is null when the queue is not paused.
			PausedAt *time.Time `json:"paused_at"`
		}
		out := struct {
			Backend string  `json:"backend"`
			Queues  []queue `json:"queues"`
		}{Backend: c.Backend(), Queues: []queue{}}
		for _, x := range s.Queues {
			q := queue{Queue: x.Queue, Counts: x.Counts}
			if x.Counts[conveyor.JobStateAvailable] > 0 {
				q.OldestAvailableMS = ptr(x.OldestAvailable.Milliseconds())
			}
			if !x.PausedAt.IsZero() {
				q.PausedAt = ptr(x.PausedAt.UTC())
			}
			out.Queues = append(out.Queues, q)
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprint(w, "QUEUE")
	for _, st := range conveyor.JobStates() {
		fmt.Fprintf(w, "\t%s", strings.ToUpper(string(st)))
	}
	fmt.Fprintln(w, "\tOLDEST AVAILABLE\tPAUSED SINCE")
	for _, x := range s.Queues {
		fmt.Fprintf(w, "%s", x.Queue)
		for _, st := range conveyor.JobStates() {
			fmt.Fprintf(w, "\t%d", x.Counts[st])
		}
		oldest := "-"
		if x.Counts[conveyor.JobStateAvailable] > 0 {
			oldest = x.OldestAvailable.Round(time.Millisecond).String()
		}
		paused := "-"
		if !x.PausedAt.IsZero() {
			paused = x.PausedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "\t%s\t%s\n", oldest, paused)
	}
	if len(s.Queues) == 0 {
		fmt.Fprintln(w, "(no jobs)")
	}
	return w.Flush()
}
