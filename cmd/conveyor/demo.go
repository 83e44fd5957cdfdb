package main

import (
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// demoCmd enqueues and works no-op jobs on throw-away tables: in the --db
// database, else $CONVEYOR_DB, else a temporary SQLite file.
func demoCmd(e *env, args []string) error {
	f := e.flags("demo", "demo [--db DSN] [--jobs N] [--workers N]", dbHelpScratch)
	jobs := f.Int("jobs", 100000, "no-op jobs to drain")
	workers := f.Int("workers", 100, "workers")
	if err := e.parseNoArgs(f, args, true); err != nil {
		return err
	}
	dsn, temp, cleanup, err := e.scratchDB()
	if err != nil {
		return err
	}
	defer cleanup()
	if temp {
		fmt.Fprintf(e.stdout, "conveyor demo on a temporary SQLite database (%s)\n", dsn)
	} else {
		fmt.Fprintf(e.stdout, "conveyor demo on throw-away tables in %s\n", backendOf(dsn))
	}
	fmt.Fprintf(e.stdout, "1. drain: %d no-op jobs inserted in bulk, then worked by %d workers\n", *jobs, *workers)
	d, err := bench.Run(e.ctx, bench.Options{DSN: dsn, Workload: "drain", Workers: *workers, Jobs: *jobs, Progress: e.stdout})
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "2. pick-up latency: an idle queue, one job enqueued every 5ms")
	l, err := bench.Run(e.ctx, bench.Options{DSN: dsn, Workload: "latency", Workers: *workers, Jobs: 500, Interval: 5 * time.Millisecond, Progress: e.stdout})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\nthroughput:        %.0f jobs/s (%d jobs in %.2fs)\n", d.JobsPerS, d.Jobs, d.Seconds)
	fmt.Fprintf(e.stdout, "pick-up latency:   p50 %.2fms  p95 %.2fms  p99 %.2fms  max %.2fms (from enqueue commit to handler start)\n", l.P50ms, l.P95ms, l.P99ms, l.Maxms)
	fmt.Fprintf(e.stdout, "executions:        %d lost, %d duplicates\n", d.Lost+l.Lost, d.Duplicates+l.Duplicates)
	if d.Backend == "sqlite" {
		fmt.Fprintf(e.stdout, "sqlite:            %s, synchronous=%s (durable against a process crash)\n", d.Settings["sqlite_version"], d.Settings["synchronous"])
	} else {
		fmt.Fprintf(e.stdout, "%-18s %s\n", d.Backend+":", d.Settings["server_version"])
	}
	return nil
}
