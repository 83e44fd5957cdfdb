package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"
)

// schedulesCmd lists the periodic schedules recorded in the database by
// the processes that run them: each one's latest slot and job, and its
// next slot.
func schedulesCmd(e *env, args []string) error {
	f := e.flags("schedules", "schedules [--json]", dbHelp)
	asJSON := f.Bool("json", false, "print JSON (the shape is in the README)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	ss, err := c.Schedules(e.ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		type schedule struct {
			Name      string     `json:"name"`
			Spec      string     `json:"spec"`
			LastSlot  *time.Time `json:"last_slot"`
			LastJobID *int64     `json:"last_job_id"`
			NextSlot  *time.Time `json:"next_slot"`
		}
		out := []schedule{}
		for _, s := range ss {
			x := schedule{Name: s.Name, Spec: s.Spec}
			if !s.Last.IsZero() {
				x.LastSlot, x.LastJobID = ptr(s.Last.UTC()), ptr(s.LastJobID)
			}
			if !s.Next.IsZero() {
				x.NextSlot = ptr(s.Next.UTC())
			}
			out = append(out, x)
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSCHEDULE\tLAST SLOT\tLAST JOB\tNEXT SLOT")
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, s := range ss {
		job := "-"
		if s.LastJobID != 0 {
			job = fmt.Sprint(s.LastJobID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Spec, stamp(s.Last), job, stamp(s.Next))
	}
	if len(ss) == 0 {
		fmt.Fprintln(w, "(no schedules recorded: periodic jobs are declared in the application's code, AddPeriodic)")
	}
	return w.Flush()
}
