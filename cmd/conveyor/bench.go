package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
	"github.com/conveyorq/conveyor/cmd/conveyor/internal/report"
	"github.com/conveyorq/conveyor/connect"
)

// benchCmd runs the bench's workloads on throw-away tables: in the --db
// database, else $CONVEYOR_DB, else a temporary SQLite file (never the
// queue commands' ./conveyor.db).
func benchCmd(e *env, args []string) error {
	f := e.flags("bench", "bench [--db DSN] [--workload W] [flags]", dbHelpScratch)
	workload := f.String("workload", "drain", "drain, flow, latency, sweep, isolation, claims, steady, dashboard, http-enqueue, http-drain, limits or keys")
	workers := f.Int("workers", 0, "workers: the queue's MaxWorkers (default 100); claims: claiming goroutines (default 10)")
	jobs := f.Int("jobs", 0, "jobs: drain 100000, latency 1000, claims 10000, isolation 300 cold jobs per phase; dashboard: jobs loaded; http-enqueue, http-drain: jobs per run (100000)")
	duration := f.Duration("duration", 10*time.Second, "flow, steady: how long producers run (steady: then --recovery more)")
	producers := f.Int("producers", 0, "flow: concurrent producers (default 64); isolation: hot-queue producers (default 16); steady: producers sharing the offered rate (default 8); http-enqueue: concurrent callers, http-drain: HTTP workers (default 4)")
	middleware := f.Int("middleware", 0, "install this many pass-through work and enqueue middlewares (to measure the chain's cost)")
	unique := f.Bool("unique", false, "flow: producers enqueue unique jobs (unique by their arguments, all distinct), to compare with plain ones")
	mode := f.String("mode", "", "flow, isolation: producers enqueue with coalesced (Enqueue per job; flow's default) or batch (EnqueueMany of 100; isolation's default); flow also bulk (EnqueueBulk of 100)")
	interval := f.Duration("interval", 0, "latency: time between enqueues (default 5ms); isolation: between cold-queue jobs (default 10ms)")
	separate := f.Bool("separate-producer", false, "latency: enqueue through a second client, as another process would (no in-process wake-up)")
	herd := f.Bool("herd", false, "drain, claims: schedule every job for one moment, so all become due at once")
	pollMin := f.Duration("poll-min", 0, "Config.PollMin: poll interval while work flows (SQLite, MySQL; default 10ms)")
	pollMax := f.Duration("poll-max", 0, "Config.PollMax: poll interval bound when idle (SQLite, MySQL; default 500ms)")
	argBytes := f.Int("arg-bytes", 0, "pad each job's arguments to about this many bytes")
	work := f.Duration("work", 0, "simulated work per job")
	spin := f.Bool("spin", false, "simulate work by spinning the CPU instead of sleeping")
	of := f.String("of", "latency", "sweep: the workload repeated (latency, drain or flow)")
	counts := f.String("counts", "1,10,100,200,300", "sweep: worker counts")
	strategies := f.String("strategies", strings.Join(bench.DefaultStrategies, ","), "claims: strategies compared ("+strings.Join(bench.ClaimStrategies, ", ")+")")
	var window windowFlag
	f.Var(&window, "window", "claims: a count N, the random optimistic claim picks among the first N available jobs (default 2*workers); steady: a duration, the reporting window (default 30s)")
	rate := f.Float64("rate", 0, "steady: offered jobs per second, on a fixed timetable (default 1000)")
	holdXmin := f.Bool("hold-xmin", false, "steady: hold a read transaction open (REPEATABLE READ / consistent snapshot / SQLite read) after reading the run's tables, as pg_dump would")
	holdFor := f.Duration("hold-for", 0, "steady: how long --hold-xmin holds its transaction (default --duration)")
	recovery := f.Duration("recovery", 0, "steady: keep the load on this long after --duration, to show the recovery once the held transaction ended")
	maxRunning := f.Int("max-running", 0, "drain, flow, latency: hold the queue to this many jobs running at once across processes (QueueLimits.MaxRunning; default none)")
	rateLimit := f.String("rate-limit", "", "drain, flow, latency: hold the queue to N starts per period, as N/PERIOD (for example 500/1s; QueueLimits.Rate and RatePeriod; default none)")
	timeout := f.Duration("timeout", 5*time.Minute, "bound on each run")
	asJSON := f.Bool("json", false, "print one JSON object per run instead of tables")
	reportFile := f.String("report", "", "write a self-contained HTML report with charts to this file")
	claimBatch := f.Int("claim-batch", 0, "Config.ClaimBatch (default: conveyor's default)")
	completeBatch := f.Int("complete-batch", 0, "Config.CompleteBatch (default: conveyor's default)")
	poolSize := f.Int("pool-size", 0, "connect.Options.PoolSize: conveyor's pool (default: the backend's)")
	cpuProfile := f.String("cpuprofile", "", "write a Go CPU profile of the bench process (conveyor's engine and the bench's own load) to this file, for go tool pprof")
	if err := e.parseNoArgs(f, args, true); err != nil {
		return err
	}
	if window.d != 0 && *workload != "steady" || window.n != 0 && *workload == "steady" {
		return fmt.Errorf("bench: --window is a count for claims and a duration for steady")
	}
	limits := conveyor.QueueLimits{MaxRunning: *maxRunning}
	if *rateLimit != "" {
		n, per, ok := strings.Cut(*rateLimit, "/")
		rate, nerr := strconv.Atoi(n)
		period, perr := time.ParseDuration(per)
		if !ok || nerr != nil || perr != nil || rate < 1 || period <= 0 {
			return fmt.Errorf("bench: --rate-limit %q: want N/PERIOD, for example 500/1s", *rateLimit)
		}
		limits.Rate, limits.RatePeriod = rate, period
	}
	cs, err := parseCounts(*counts)
	if err != nil {
		return err
	}
	dsn, temp, cleanup, err := e.scratchDB()
	if err != nil {
		return err
	}
	defer cleanup()
	if temp && !*asJSON {
		fmt.Fprintf(e.stdout, "conveyor bench on a temporary SQLite database (%s)\n", dsn)
	}
	o := bench.Options{
		DSN: dsn, Workload: *workload, Workers: *workers, Jobs: *jobs, Duration: *duration,
		Producers: *producers, Mode: *mode, Unique: *unique, Middleware: *middleware, Interval: *interval, SeparateProducer: *separate, Herd: *herd, ArgBytes: *argBytes, Work: *work, Spin: *spin,
		Of: *of, Counts: cs, Strategies: splitList(*strategies), Window: window.n, Timeout: *timeout,
		Rate: *rate, Every: window.d, HoldXmin: *holdXmin, HoldFor: *holdFor, Recovery: *recovery, Limits: limits,
		Progress: e.stderr,
		Config:   conveyor.Config{ClaimBatch: *claimBatch, CompleteBatch: *completeBatch, PollMin: *pollMin, PollMax: *pollMax},
		Connect:  connect.Options{PoolSize: *poolSize},
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		o.Emit = func(r *bench.Result) { enc.Encode(r) }
	}
	if *cpuProfile != "" {
		pf, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	rs, err := bench.RunAll(ctx, o)
	if !*asJSON && len(rs) > 0 {
		printResults(e.stdout, rs)
	}
	if *reportFile != "" && len(rs) > 0 {
		if rerr := writeReport(*reportFile, rs); rerr != nil {
			err = errors.Join(err, rerr)
		} else if !*asJSON {
			fmt.Fprintf(e.stdout, "\nreport: %s\n", *reportFile)
		}
	}
	return err
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: --counts: %q is not a positive worker count", p)
		}
		out = append(out, n)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func hist(h [5]int64) string {
	return fmt.Sprintf("%d/%d/%d/%d/%d", h[0], h[1], h[2], h[3], h[4])
}

// printResults prints the runs as one table, then the contention seen in
// the database per run, then the settings once.
func printResults(w io.Writer, rs []*bench.Result) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	switch rs[0].Workload {
	case "dashboard", "http-enqueue", "http-drain":
		printHTTP(w, rs)
	case "claims":
		fmt.Fprintln(tw, "strategy\tworkers\tjobs\tseconds\tjobs/s\tdeadlocks\tlock timeouts\tduplicates\tdup by deadlock\tcollisions\trounds/job\treorder max\treorder p99\tlost\t")
		for _, r := range rs {
			c := r.Claims
			if c == nil {
				c = &bench.ClaimFigures{}
			}
			rounds := "-"
			if c.RoundsPerJob > 0 {
				rounds = strconv.FormatFloat(c.RoundsPerJob, 'f', 2, 64)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t\n",
				r.Strategy, r.Workers, r.Jobs, r.Seconds, r.JobsPerS, c.Deadlocks, c.LockTimeouts, r.Duplicates, c.DeadlockDuplicates, c.Collisions, rounds, r.ReorderMax, r.ReorderP99, r.Lost)
		}
	case "limits":
		printLimits(tw, rs)
	case "keys":
		printKeys(tw, rs)
	case "isolation":
		fmt.Fprintln(tw, "cold queue\tworkers\tjobs\tp50 ms\tp95 ms\tp99 ms\tmax ms\tcall p50 ms\tcall p99 ms\tlost\tdup\thot jobs/s\thot backlog min\t")
		for _, r := range rs {
			hot, backlog := "-", "-"
			if r.HotJobsPerS > 0 {
				hot = fmt.Sprintf("%.0f", r.HotJobsPerS)
			}
			if r.HotBacklogMin != nil {
				backlog = fmt.Sprint(*r.HotBacklogMin)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t\n",
				r.Phase, r.Workers, r.Jobs, ms(r.P50ms), ms(r.P95ms), ms(r.P99ms), ms(r.Maxms), ms(r.CallP50ms), ms(r.CallP99ms), r.Lost, r.Duplicates, hot, backlog)
		}
	default:
		// Enqueue-call-to-start (which includes the enqueue's commit) where
		// jobs are enqueued while workers wait: on SQLite a waiting worker
		// starts a job before its Enqueue call returns, so commit-to-start
		// is about zero there.
		call := rs[0].Workload != "drain" && rs[0].Of != "drain"
		callHead := ""
		if call {
			callHead = "call p50 ms\tcall p99 ms\t"
		}
		enq := false
		for _, r := range rs {
			enq = enq || r.EnqueuedPerS > 0
		}
		if enq {
			callHead = "mode\tenqueued/s\t" + callHead
		}
		fmt.Fprintln(tw, "workload\tworkers\tjobs\tseconds\tjobs/s\tp50 ms\tp95 ms\tp99 ms\tmax ms\t"+callHead+"lost\tdup\treorder max\treorder p99\treorder 0/1-9/10-99/100-999/1000+\t")
		for _, r := range rs {
			name := r.Workload
			if r.Of != "" {
				name += " " + r.Of
			}
			callCols := ""
			if call {
				callCols = ms(r.CallP50ms) + "\t" + ms(r.CallP99ms) + "\t"
			}
			if enq {
				callCols = fmt.Sprintf("%s\t%.0f\t", r.Mode, r.EnqueuedPerS) + callCols
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s%d\t%d\t%d\t%d\t%s\t\n",
				name, r.Workers, r.Jobs, r.Seconds, r.JobsPerS, ms(r.P50ms), ms(r.P95ms), ms(r.P99ms), ms(r.Maxms), callCols, r.Lost, r.Duplicates, r.ReorderMax, r.ReorderP99, hist(r.ReorderHist))
		}
	}
	tw.Flush()
	if rs[0].Workload == "claims" {
		fmt.Fprintln(w, "\nreorder histogram (jobs displaced 0/1-9/10-99/100-999/1000+ places):")
		for _, r := range rs {
			fmt.Fprintf(w, "  %-12s %s\n", r.Strategy, hist(r.ReorderHist))
		}
	}
	if rs[0].Steady != nil {
		printSteady(w, rs[0])
	} else if rs[0].Workload == "dashboard" {
		printWaits(w, rs[:1]) // one run: its pages share the sampling
	} else {
		printWaits(w, rs)
	}
	printSettings(w, rs)
}

func runName(r *bench.Result) string {
	switch {
	case r.Strategy != "":
		return r.Strategy
	case r.Phase != "":
		return r.Phase
	case r.Of != "":
		return fmt.Sprintf("%s workers=%d", r.Of, r.Workers)
	}
	return r.Workload
}

// printWaits prints, per run, the database's wait events (most sampled
// first) and its contention counters.
func printWaits(w io.Writer, rs []*bench.Result) {
	src, _ := rs[0].Waits["source"].(string)
	fmt.Fprintf(w, "\ncontention inside the database (%s):\n", src)
	if len(rs) == 1 {
		evs := bench.TopWaits(rs[0], 12)
		if len(evs) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  wait event\tsamples\tshare\t")
			for _, e := range evs {
				fmt.Fprintf(tw, "  %s\t%d\t%.1f%%\t\n", e.Event, e.Count, 100*e.Share)
			}
			tw.Flush()
		}
		if c := bench.WaitCounters(rs[0]); len(c) > 0 {
			fmt.Fprintf(w, "  %s\n", strings.Join(c, "  "))
		}
		printPS(w, rs[0])
		return
	}
	for _, r := range rs {
		var parts []string
		for _, e := range bench.TopWaits(r, 4) {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", e.Event, 100*e.Share))
		}
		line := strings.Join(parts, ", ")
		if c := bench.WaitCounters(r); len(c) > 0 {
			if line != "" {
				line += "; "
			}
			line += strings.Join(c, " ")
		}
		fmt.Fprintf(w, "  %-22s %s\n", runName(r), line)
	}
}

func printPS(w io.Writer, r *bench.Result) {
	ps, ok := r.Waits["performance_schema"].(map[string]bench.PSWait)
	if !ok || len(ps) == 0 {
		return
	}
	fmt.Fprintln(w, "  performance_schema waits (top by time):")
	type kv struct {
		k string
		v bench.PSWait
	}
	var all []kv
	for k, v := range ps {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v.MS > all[j].v.MS })
	for _, e := range all {
		fmt.Fprintf(w, "    %-50s %8d  %.1fms\n", e.k, e.v.Count, e.v.MS)
	}
}

// printSettings prints the settings that decide the results once: a
// setting that differs between runs lists each run's value.
func printSettings(w io.Writer, rs []*bench.Result) {
	fmt.Fprintln(w, "\nsettings:")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, row := range report.SettingRows(rs) {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], row[1])
	}
	tw.Flush()
}

// writeReport writes the HTML report (a variable so that tests can
// replace it).
var writeReport = report.WriteFile

// printKeys prints a keys run: each phase's throughput against the phase
// it is compared to (a flood phase's small keys' p99 latency against the
// small keys alone; the fair-weights phase's starts of each key while
// both had jobs), and the most executions of one key at once and the
// out-of-order starts, counted outside the queue.
func printKeys(tw *tabwriter.Writer, rs []*bench.Result) {
	by, small := map[string]float64{}, map[string]float64{}
	for _, r := range rs {
		by[r.Phase], small[r.Phase] = r.JobsPerS, r.SmallP99ms
	}
	fmt.Fprintln(tw, "phase\tlimits\tkeys\tworkers\tjobs\tseconds\tjobs/s\tratio\tpeak per key\tout of order\tp99 ms\tsmall keys p50/p99 ms\tlost\tdup\t")
	for _, r := range rs {
		lim, ratio, sm, order := "none", "-", "-", "-"
		if l := r.Limits; l != nil {
			switch {
			case l.Ordered:
				lim, order = "ordered", fmt.Sprint(r.KeyReorders)
			case l.KeyMaxRunning > 0:
				lim = fmt.Sprintf("%d per key", l.KeyMaxRunning)
			case l.Fair:
				lim = "fair"
			}
		}
		switch {
		case r.KeyShares != nil:
			ratio = fmt.Sprintf("starts %s: %.2f", sharesText(r.KeyShares, r.KeyWeights), r.ShareRatio)
		case r.SmallJobs > 0:
			sm = ms(r.SmallP50ms) + " / " + ms(r.SmallP99ms)
			switch ref, ok := small[r.Reference]; {
			case !ok:
			case ref >= minRatioRef:
				ratio = fmt.Sprintf("small p99 %.2fx %s", r.SmallP99ms/ref, r.Reference)
			default:
				// The reference's jobs started as their Enqueue returned
				// (claimed by their own insert): a ratio to it would be
				// a ratio to the clock's jitter.
				ratio = fmt.Sprintf("small p99 %s ms, %s under %s ms", ms(r.SmallP99ms), r.Reference, ms(minRatioRef))
			}
		case by[r.Reference] > 0:
			ratio = fmt.Sprintf("%.2f of %s", r.JobsPerS/by[r.Reference], r.Reference)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.2f\t%.0f\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t\n",
			r.Phase, lim, r.Keys, r.Workers, r.Jobs, r.Seconds, r.JobsPerS, ratio, r.KeyPeakRunning, order, ms(r.P99ms), sm, r.Lost, r.Duplicates)
	}
}

// minRatioRef is the smallest p99 (ms) printKeys divides by: below it,
// the small keys' jobs started within microseconds of their commit.
const minRatioRef = 0.05

// sharesText is each key's starts with its weight, heaviest first:
// "heavy 3000 (weight 3) : light 1000 (weight 1)".
func sharesText(shares map[string]int64, weights map[string]int) string {
	keys := make([]string, 0, len(shares))
	for k := range shares {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if weights[keys[i]] != weights[keys[j]] {
			return weights[keys[i]] > weights[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d (weight %d)", k, shares[k], max(weights[k], 1))
	}
	return strings.Join(parts, " : ")
}

// printLimits prints a limits run: each phase's throughput, its ratio to
// the unlimited drain (or to what its limit allows), and the most
// executions at once and starts in a window, counted outside the queue.
func printLimits(tw *tabwriter.Writer, rs []*bench.Result) {
	var base float64
	for _, r := range rs {
		if r.Phase == "unlimited" {
			base = r.JobsPerS
		}
	}
	fmt.Fprintln(tw, "phase\tlimits\tworkers\tjobs\tseconds\tjobs/s\tallowed jobs/s\tratio\tslots busy\tpeak running\tmost claims in a period\tpick-up p50/p99 ms\tp99 ms\tlost\tdup\t")
	for _, r := range rs {
		lim, allowed, ratio, win, pick, busy := "none", "-", "-", "-", "-", "-"
		if r.SlotsBusy > 0 {
			busy = fmt.Sprintf("%.2f", r.SlotsBusy)
		}
		if r.PickupN > 0 {
			pick = ms(r.PickupP50ms) + " / " + ms(r.PickupP99ms)
		}
		if l := r.Limits; l != nil {
			var parts []string
			if l.MaxRunning > 0 {
				parts = append(parts, fmt.Sprintf("max running %d", l.MaxRunning))
			}
			if l.Rate > 0 {
				parts = append(parts, fmt.Sprintf("rate %d per %v", l.Rate, l.RatePeriod))
				win = fmt.Sprint(r.MaxStartsInWindow)
			}
			if l.KeyRate > 0 {
				parts = append(parts, fmt.Sprintf("rate %d per %v per key", l.KeyRate, l.KeyRatePeriod))
				win = fmt.Sprintf("%d of one key", r.KeyMaxStartsInWindow)
			}
			lim = strings.Join(parts, ", ")
		}
		switch {
		case r.Allowed > 0:
			allowed = fmt.Sprintf("%.0f", r.Allowed)
			ratio = fmt.Sprintf("%.2f of allowed", r.JobsPerS/r.Allowed)
		case base > 0 && r.Phase != "unlimited":
			ratio = fmt.Sprintf("%.2f of unlimited", r.JobsPerS/base)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t\n",
			r.Phase, lim, r.Workers, r.Jobs, r.Seconds, r.JobsPerS, allowed, ratio, busy, r.PeakRunning, win, pick, ms(r.P99ms), r.Lost, r.Duplicates)
	}
}
