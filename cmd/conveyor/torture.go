package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/torture"
)

// tortureRun runs the suite (a variable so that tests can see the options
// without running it).
var tortureRun = torture.Run

// tortureCmd runs the fault-injection suite (`conveyor torture`), or, as
// `conveyor torture worker ...`, one of its worker processes. Its database
// is --db only (never $CONVEYOR_DB), and it restarts a database server
// only when --restart-server is given.
func tortureCmd(e *env, args []string) error {
	if len(args) > 0 && args[0] == "worker" {
		return torture.WorkerMain(e.ctx, args[1:], e.stdout, e.stderr)
	}
	f := e.flags("torture", "torture [--db DSN] [--duration D] [--faults LIST] [--json] [flags]",
		"loopback postgres://... or mysql://... `DSN`, or a SQLite path (default: a temporary SQLite file)")
	duration := f.Duration("duration", 5*time.Minute, "total load time, split across the faults")
	faultList := f.String("faults", "", "comma-separated faults to run (default: all that apply)")
	asJSON := f.Bool("json", false, "print the rows as JSON")
	workers := f.Int("workers", 3, "worker processes")
	concurrency := f.Int("concurrency", 16, "concurrent jobs per worker process")
	rate := f.Float64("rate", 100, "jobs enqueued per second")
	lease := f.Duration("lease", 2*time.Second, "the workers' lease (phase lengths, drains and fault bounds scale with it)")
	restartServer := f.Bool("restart-server", false, "also run the restart fault on PostgreSQL and MariaDB, which restarts the database server (on SQLite it kills the writing process and always runs)")
	noRestart := f.Bool("no-restart", false, "accepted for compatibility and does nothing: servers are restarted only with --restart-server")
	smallPool := f.Int("small-pool", 1, "PoolSize of the workers in the smallpool fault")
	poison := f.String("poison", "panic,exit,hang", "poison kinds the poison fault enqueues")
	keep := f.Bool("keep", false, "keep each phase's tables and records")
	sealAt := f.Int64("seal-at", 16<<10, "PostgreSQL: seal segments at this size in bytes, so that a short run rotates them")
	holdXmin := f.Bool("hold-xmin", false, "PostgreSQL and MySQL: hold a transaction that read the phase's tables open through each phase, as a dump would (REPEATABLE READ, as pg_dump; a consistent snapshot, as mariadb-dump --single-transaction)")
	patroniREST := f.String("patroni-rest", "", "PostgreSQL: comma-separated Patroni REST API URLs (on loopback) of the cluster behind a multi-host --db, for the switchover and failover faults")
	patroniDirs := f.String("patroni-data-dirs", "", "PostgreSQL: the Patroni nodes' data directories, in the order of --patroni-rest (the failover fault kills the primary's postmaster)")
	var about strings.Builder
	about.WriteString("Runs real worker processes against the database, injects faults and checks that no\njob is lost or completed twice. Exits non-zero on any violation. Faults:\n")
	for _, n := range torture.FaultNames() {
		fmt.Fprintf(&about, "  %-11s %s\n", n[0], n[1])
	}
	f.about = strings.TrimSuffix(about.String(), "\n")
	if err := e.parseNoArgs(f, args, true); err != nil {
		return err
	}
	if *restartServer && *noRestart {
		return usageError("torture", "--restart-server and --no-restart contradict each other")
	}
	dsn := e.db.val
	opts := torture.Options{
		DSN: dsn, Duration: *duration, Workers: *workers, Concurrency: *concurrency,
		Rate: *rate, Lease: *lease, Keep: *keep, Log: e.stderr,
		// SQLite's restart fault restarts no server: it always runs.
		NoRestart: !*restartServer && dsn != "" && backendOf(dsn) != "sqlite", // "": a temporary SQLite file
		SmallPool: *smallPool, PoisonKinds: []string{}, HoldXmin: *holdXmin, SealAt: *sealAt,
	}
	for _, k := range strings.Split(*poison, ",") {
		if k = strings.TrimSpace(k); k != "" {
			opts.PoisonKinds = append(opts.PoisonKinds, k)
		}
	}
	if *faultList != "" {
		opts.Faults = strings.Split(*faultList, ",")
	}
	if *patroniREST != "" {
		c := &torture.PatroniCluster{REST: strings.Split(*patroniREST, ",")}
		if *patroniDirs != "" {
			c.DataDirs = strings.Split(*patroniDirs, ",")
		}
		if len(c.DataDirs) != 0 && len(c.DataDirs) != len(c.REST) {
			return usageError("torture", "--patroni-data-dirs must name one directory per --patroni-rest URL")
		}
		opts.Patroni = c
	} else if *patroniDirs != "" {
		return usageError("torture", "--patroni-data-dirs needs --patroni-rest")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	opts.Exe, opts.ExeArgs = exe, []string{"torture", "worker"}
	rows, err := tortureRun(e.ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
	} else if err := torture.WriteTable(e.stdout, rows); err != nil {
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
