package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/bench"
)

// tempSQLite makes a throw-away SQLite database path and its cleanup.
func tempSQLite() (string, func(), error) {
	dir, err := os.MkdirTemp("", "conveyor-bench-")
	if err != nil {
		return "", nil, err
	}
	return filepath.Join(dir, "bench.db"), func() { os.RemoveAll(dir) }, nil
}

func printResult(w io.Writer, r *bench.Result) {
	fmt.Fprintf(w, "%-8s %-8s workers=%-4d jobs=%-7d %8.0f jobs/s  p50=%.2fms p95=%.2fms p99=%.2fms max=%.2fms  lost=%d dup=%d reorder max=%d p99=%d\n",
		r.Workload, r.Backend, r.Workers, r.Jobs, r.JobsPerS, r.P50ms, r.P95ms, r.P99ms, r.Maxms, r.Lost, r.Duplicates, r.ReorderMax, r.ReorderP99)
}

// demo enqueues and works no-op jobs on a temporary SQLite database.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("demo", flag.ContinueOnError)
	f.SetOutput(stderr)
	jobs := f.Int("jobs", 100000, "no-op jobs to drain")
	workers := f.Int("workers", 100, "workers")
	if err := f.Parse(args); err != nil {
		return err
	}
	path, cleanup, err := tempSQLite()
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintf(stdout, "conveyor demo on a temporary SQLite database (%s)\n", path)
	fmt.Fprintf(stdout, "1. drain: %d no-op jobs inserted in bulk, then worked by %d workers\n", *jobs, *workers)
	d, err := bench.Run(ctx, bench.Options{DSN: path, Workload: "drain", Workers: *workers, Jobs: *jobs, Progress: stdout})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "2. pick-up latency: an idle queue, one job enqueued every 5ms")
	l, err := bench.Run(ctx, bench.Options{DSN: path, Workload: "latency", Workers: *workers, Jobs: 500, Interval: 5 * time.Millisecond, Progress: stdout})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nthroughput:        %.0f jobs/s (%d jobs in %.2fs)\n", d.JobsPerS, d.Jobs, d.Seconds)
	fmt.Fprintf(stdout, "pick-up latency:   p50 %.2fms  p95 %.2fms  p99 %.2fms  max %.2fms (from enqueue commit to handler start)\n", l.P50ms, l.P95ms, l.P99ms, l.Maxms)
	fmt.Fprintf(stdout, "executions:        %d lost, %d duplicates\n", d.Lost+l.Lost, d.Duplicates+l.Duplicates)
	fmt.Fprintf(stdout, "sqlite:            %s, synchronous=%s (durable against a process crash)\n", d.Settings["sqlite_version"], d.Settings["synchronous"])
	return nil
}

func benchCmd(ctx context.Context, args []string, dsn string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("bench", flag.ContinueOnError)
	f.SetOutput(stderr)
	workload := f.String("workload", "drain", "drain, flow or latency")
	workers := f.Int("workers", 100, "workers (the queue's MaxWorkers)")
	jobs := f.Int("jobs", 0, "jobs (drain default 100000, latency default 1000)")
	duration := f.Duration("duration", 10*time.Second, "flow: how long producers run")
	producers := f.Int("producers", 64, "flow: concurrent producers")
	mode := f.String("mode", "coalesced", "flow: coalesced (Enqueue per job) or batch (EnqueueMany of 100)")
	interval := f.Duration("interval", 5*time.Millisecond, "latency: time between enqueues")
	argBytes := f.Int("arg-bytes", 0, "pad each job's arguments to about this many bytes")
	work := f.Duration("work", 0, "simulated work per job")
	spin := f.Bool("spin", false, "simulate work by spinning the CPU instead of sleeping")
	asJSON := f.Bool("json", false, "print one JSON object per run")
	claimBatch := f.Int("claim-batch", 0, "Config.ClaimBatch (default: conveyor's default)")
	completeBatch := f.Int("complete-batch", 0, "Config.CompleteBatch (default: conveyor's default)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if dsn == "" {
		path, cleanup, err := tempSQLite()
		if err != nil {
			return err
		}
		defer cleanup()
		dsn = path
	}
	var progress io.Writer = stderr
	r, err := bench.Run(ctx, bench.Options{
		DSN: dsn, Workload: *workload, Workers: *workers, Jobs: *jobs, Duration: *duration,
		Producers: *producers, Mode: *mode, Interval: *interval, ArgBytes: *argBytes, Work: *work, Spin: *spin,
		Progress: progress,
		Config:   conveyor.Config{ClaimBatch: *claimBatch, CompleteBatch: *completeBatch},
	})
	if r != nil {
		if *asJSON {
			json.NewEncoder(stdout).Encode(r)
		} else {
			printResult(stdout, r)
		}
	}
	return err
}
