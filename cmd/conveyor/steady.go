package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// windowFlag is --window: a count for claims (the random claim's window),
// a duration for steady (the reporting window).
type windowFlag struct {
	n int
	d time.Duration
}

// String returns the flag's value.
func (w *windowFlag) String() string {
	if w == nil || (w.n == 0 && w.d == 0) {
		return ""
	}
	if w.d != 0 {
		return w.d.String()
	}
	return strconv.Itoa(w.n)
}

// Set parses a positive count or a positive duration.
func (w *windowFlag) Set(s string) error {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 {
			return fmt.Errorf("must be positive")
		}
		w.n, w.d = n, 0
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("want a count (claims) or a positive duration (steady)")
	}
	w.n, w.d = 0, d
	return nil
}

// printSteady prints a steady run's windows and what they were measured
// under.
func printSteady(w io.Writer, r *bench.Result) {
	f := r.Steady
	fmt.Fprintf(w, "\noffered %.0f jobs/s for %.0fs (%d producers, %d workers): %d offered, %d enqueued, %d short; last job done %.1fs after the load ended\n",
		f.Rate, f.LoadS, r.Producers, r.Workers, f.Offered, f.Enqueued, f.Shortfall, f.DrainS)
	if h := f.Hold; h != nil {
		state := "released"
		if !h.Released {
			state = "NOT released"
		}
		fmt.Fprintf(w, "held: %s, then count(*) of %s (%d rows); open %.1fs..%.1fs, %s", h.Statement, strings.Join(h.Tables, ", "), h.Rows, h.StartS, h.EndS, state)
		if h.ReleaseError != "" {
			fmt.Fprintf(w, " (%s)", h.ReleaseError)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	head, rows := bench.WindowTable(f)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintf(w, "\ngauges: %s\nCPU: %s\n", f.GaugeSource, f.CPUSource)
	for _, n := range f.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	var errs []string
	for _, wd := range f.Windows {
		if wd.Gauges.Error != "" {
			errs = append(errs, fmt.Sprintf("%s-%ss: %s", strconv.FormatFloat(wd.StartS, 'f', -1, 64), strconv.FormatFloat(wd.EndS, 'f', -1, 64), wd.Gauges.Error))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "gauge errors: %s\n", strings.Join(errs, "; "))
	}
	if c := bench.WaitCounters(r); len(c) > 0 {
		fmt.Fprintf(w, "client: %s\n", strings.Join(c, "  "))
	}
}
