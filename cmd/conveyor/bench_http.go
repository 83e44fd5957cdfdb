package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// printHTTP prints the runs of the dashboard, http-enqueue and http-drain
// workloads: page times, or jobs/s over HTTP beside in process and their
// ratio.
func printHTTP(w io.Writer, rs []*bench.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if rs[0].Workload == "dashboard" {
		fmt.Fprintf(tw, "page (%s, %d jobs, %d requests each)\tp50 ms\tmax ms\t\n", rs[0].Backend, rs[0].Jobs, bench.DashboardRepeats)
		for _, r := range rs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", r.Phase, ms(r.P50ms), ms(r.Maxms))
		}
		tw.Flush()
		return
	}
	var inProc float64
	fmt.Fprintln(tw, "workload\trun\tworkers\tproducers\tjobs\tseconds\tjobs/s\tvs in-process\tlost\tdup\t")
	for _, r := range rs {
		ratio := "-"
		if r.Phase == "in-process" {
			inProc = r.JobsPerS
		} else if inProc > 0 {
			ratio = strconv.FormatFloat(r.JobsPerS/inProc, 'f', 2, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.2f\t%.0f\t%s\t%d\t%d\t\n",
			r.Workload, r.Phase, r.Workers, r.Producers, r.Jobs, r.Seconds, r.JobsPerS, ratio, r.Lost, r.Duplicates)
	}
	tw.Flush()
}
