package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
)

// statsCmd prints per queue the counts by state, the age of the oldest
// available job, the pause, the limits with their use (key limits
// included), and what holds the queue's jobs ("key" when every available
// job waits for its key). The client's process counters are left out: a one-shot
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
		out := struct {
			Backend string           `json:"backend"`
			Queues  []queueStatsJSON `json:"queues"`
		}{Backend: c.Backend(), Queues: []queueStatsJSON{}}
		for _, x := range s.Queues {
			out.Queues = append(out.Queues, toQueueStatsJSON(x))
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprint(w, "QUEUE")
	for _, st := range conveyor.JobStates() {
		fmt.Fprintf(w, "\t%s", strings.ToUpper(string(st)))
	}
	fmt.Fprintln(w, "\tAWAITING DEPENDENCIES\tOLDEST AVAILABLE\tPAUSED SINCE\tLIMITS\tHELD")
	for _, x := range s.Queues {
		fmt.Fprintf(w, "%s", x.Queue)
		for _, st := range conveyor.JobStates() {
			fmt.Fprintf(w, "\t%d", x.Counts[st])
		}
		fmt.Fprintf(w, "\t%d", x.AwaitingDependencies)
		oldest := "-"
		if x.Counts[conveyor.JobStateAvailable] > 0 {
			oldest = x.OldestAvailable.Round(time.Millisecond).String()
		}
		paused := "-"
		if !x.PausedAt.IsZero() {
			paused = x.PausedAt.UTC().Format(time.RFC3339)
		}
		limits := "-"
		run, rate := limitUseText(x)
		if parts := slices.DeleteFunc([]string{prefixed("running ", run), prefixed("rate ", rate), keyUseText(x)}, func(s string) bool { return s == "" }); len(parts) > 0 {
			limits = strings.Join(parts, ", ")
		}
		fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\n", oldest, paused, limits, dash(x.Held))
	}
	if len(s.Queues) == 0 {
		fmt.Fprintln(w, "(no jobs)")
	}
	return w.Flush()
}

// prefixed is p+s, or "" for an empty s.
func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}
