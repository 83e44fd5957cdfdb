package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/torture"
)

// tortureCmd runs the fault-injection suite (`conveyor torture`), or, as
// `conveyor torture worker ...`, one of its worker processes. g is the
// global flag set, whose --db applies when the command's own is not given.
func tortureCmd(ctx context.Context, args []string, g *flag.FlagSet, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "worker" {
		return torture.WorkerMain(ctx, args[1:], stdout, stderr)
	}
	f := flag.NewFlagSet("torture", flag.ContinueOnError)
	f.SetOutput(stderr)
	dsn := f.String("db", "", "database: loopback postgres://... or mysql://..., or a SQLite path (default: a temporary SQLite file)")
	duration := f.Duration("duration", 5*time.Minute, "total load time, split across the faults")
	faultList := f.String("faults", "", "comma-separated faults to run (default: all that apply)")
	asJSON := f.Bool("json", false, "print the rows as JSON")
	workers := f.Int("workers", 3, "worker processes")
	concurrency := f.Int("concurrency", 16, "concurrent jobs per worker process")
	rate := f.Float64("rate", 100, "jobs enqueued per second")
	lease := f.Duration("lease", 2*time.Second, "the workers' lease (phase lengths, drains and fault bounds scale with it)")
	noRestart := f.Bool("no-restart", false, "leave out the fault that restarts the database server")
	smallPool := f.Int("small-pool", 1, "PoolSize of the workers in the smallpool fault")
	poison := f.String("poison", "panic,exit,hang", "poison kinds the poison fault enqueues")
	keep := f.Bool("keep", false, "keep each phase's tables and records")
	f.Usage = func() {
		fmt.Fprintln(stderr, "usage: conveyor torture [--db DSN] [--duration D] [--faults LIST] [--json] [flags]")
		fmt.Fprintln(stderr, "\nRuns real worker processes against the database, injects faults and checks that no")
		fmt.Fprintln(stderr, "job is lost or completed twice. Exits non-zero on any violation. Faults:")
		for _, n := range torture.FaultNames() {
			fmt.Fprintf(stderr, "  %-11s %s\n", n[0], n[1])
		}
		fmt.Fprintln(stderr, "\nflags:")
		f.PrintDefaults()
	}
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *dsn == "" {
		g.Visit(func(fl *flag.Flag) {
			if fl.Name == "db" {
				*dsn = fl.Value.String()
			}
		})
	}
	opts := torture.Options{
		DSN: *dsn, Duration: *duration, Workers: *workers, Concurrency: *concurrency,
		Rate: *rate, Lease: *lease, NoRestart: *noRestart, Keep: *keep, Log: stderr,
		SmallPool: *smallPool, PoisonKinds: []string{},
	}
	for _, k := range strings.Split(*poison, ",") {
		if k = strings.TrimSpace(k); k != "" {
			opts.PoisonKinds = append(opts.PoisonKinds, k)
		}
	}
	if *faultList != "" {
		opts.Faults = strings.Split(*faultList, ",")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	opts.Exe, opts.ExeArgs = exe, []string{"torture", "worker"}
	rows, err := torture.Run(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
	} else if err := torture.WriteTable(stdout, rows); err != nil {
		return err
	}
	bad := 0
	for i := range rows {
		if !rows[i].OK() {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d faults", torture.ErrViolations, bad, len(rows))
	}
	return nil
}
