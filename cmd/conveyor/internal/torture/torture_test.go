package torture

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// workerEnv makes the test binary, re-executed, a torture worker process
// instead of a test run.
const workerEnv = "CONVEYOR_TORTURE_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := WorkerMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "torture worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// faultsEnv, when set, names the faults (comma-separated, see FaultNames)
// that the torture tests run instead of every one that applies, to run a
// phase alone: CONVEYOR_TORTURE_FAULTS=poison go test -run
// TestTorturePostgresSegmentsHeld.
const faultsEnv = "CONVEYOR_TORTURE_FAULTS"

// shortRun runs every fault that applies to dsn's backend for about
// perFault each, with worker processes re-executed from the test binary,
// and fails the test on any violation.
func shortRun(t *testing.T, dsn string, set ...func(*Options)) []Row {
	if testing.Short() {
		t.Skip("torture run skipped in -short mode")
	}
	opts := Options{
		DSN:         dsn,
		Duration:    time.Second, // every fault gets MinPhase
		Exe:         os.Args[0],
		Env:         []string{workerEnv + "=1"},
		Workers:     3,
		Concurrency: 12,
		Rate:        50,
		// Restarting a shared server breaks other tests running at the
		// same time: CI sets CONVEYOR_TORTURE_RESTART=1 for a run where
		// nothing else uses the servers.
		NoRestart:   os.Getenv("CONVEYOR_TORTURE_RESTART") != "1" && backendOf(dsn) != "sqlite",
		PoisonKinds: []string{KindPanic, KindExit, KindHang},
		Log:         testWriter{t},
	}
	opts.SmallPool = 1
	if fs := os.Getenv(faultsEnv); fs != "" {
		opts.Faults = strings.Split(fs, ",")
	}
	for _, f := range set {
		f(&opts)
	}
	start := time.Now()
	rows, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteTable(&b, rows)
	t.Logf("torture on %s in %v:\n%s", backendOf(dsn), time.Since(start).Round(time.Second), b.String())
	for _, r := range rows {
		if r.Skipped != "" && !strings.HasPrefix(r.Skipped, "database restarts disabled") {
			if strings.HasPrefix(r.Fault, "skew") && (os.Getenv("CONVEYOR_TORTURE_REQUIRE_SKEW") == "1" || testdb.Strict()) {
				t.Errorf("%s: skipped: %s", r.Fault, r.Skipped)
			} else {
				t.Logf("SKIPPED %s on %s: %s", r.Fault, r.Backend, r.Skipped)
			}
		}
		for _, f := range r.Failures {
			t.Errorf("%s on %s: %s", r.Fault, r.Backend, f)
		}
	}
	return rows
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestTortureSQLite(t *testing.T) {
	requireClaimsAtInsert(t, shortRun(t, filepath.Join(t.TempDir(), "torture.db")))
}

// requireClaimsAtInsert fails a run in which no worker process's insert
// claimed a job of its own (every backend has claims at insert): the
// faults would then have proved nothing of that path.
func requireClaimsAtInsert(t *testing.T, rows []Row) {
	t.Helper()
	var n int64
	ran := false
	for _, r := range rows {
		if r.Skipped == "" {
			ran = true
			n += r.ClaimedAtInsert
		}
	}
	if ran && n == 0 {
		t.Errorf("no phase had a job claimed by its own insert: the workers' own enqueues never took that path")
	}
	t.Logf("%d jobs claimed by their own insert over the run", n)
}

// The backends run one after the other. Side by side, each suite's
// twelve race-instrumented processes and its database server competed
// with the other's on two cores, on top of the suite's own cpu fault:
// under an outside load as well, the MySQL server answered renewals of
// 2s leases in up to 1.3s and handlers were stopped before their leases
// could expire, which the checker rightly counts as duplicate executions.
// Each suite now has the machine (and its outside load) to itself; the
// cpu fault still saturates every core within it.

// PostgreSQL's segment tables (docs/postgres-storage.md) through every
// fault, rotated and truncated while nothing holds them; the run below
// holds a transaction.
func TestTorturePostgres(t *testing.T) {
	requireClaimsAtInsert(t, shortRun(t, testdb.Postgres(t)))
}

// The segment tables through every fault, with a REPEATABLE READ
// transaction that read the phase's tables held open for the whole of
// each phase, as pg_dump would: segment rotation must neither wait for it
// nor lose or repeat a job.
func TestTorturePostgresSegmentsHeld(t *testing.T) {
	rows := shortRun(t, testdb.Postgres(t), func(o *Options) {
		o.HoldXmin = true
	})
	for _, r := range rows {
		if r.Skipped != "" {
			continue
		}
		var held bool
		var reclaims int64 = -1
		for _, n := range r.Notes {
			held = held || strings.HasPrefix(n, "held: BEGIN ISOLATION LEVEL REPEATABLE READ transaction")
			var seal, tables int64
			_, _ = fmt.Sscanf(n, "segments: sealed at %d bytes; %d tables registered at the end, %d reclaims", &seal, &tables, &reclaims)
		}
		if !held {
			t.Errorf("%s: the phase did not run with a held transaction: notes %q", r.Fault, r.Notes)
		}
		// The workers seal segments at 16 KiB: in seconds of load at 50
		// jobs/s they must have sealed and truncated some while the
		// transaction was held, or the run proved nothing of rotation.
		if reclaims <= 0 {
			t.Errorf("%s: no segment was reclaimed during the phase (notes %q)", r.Fault, r.Notes)
		}
	}
}

func TestTortureMySQL(t *testing.T) {
	requireClaimsAtInsert(t, shortRun(t, testdb.MySQL(t)))
}

// heldSnapshotFaults are the faults TestTortureMySQLSnapshotHeld runs
// (every fault again would add minutes to the package): those that matter
// most under a held snapshot, a worker process killed or stopped past its
// lease (its jobs rescued), the server restarted (where restarts are
// enabled; the restart ends the snapshot), every core saturated, and
// poison jobs retried until discarded.
var heldSnapshotFaults = []string{"kill", "pause", "restart", "cpu", "poison"}

// The faults of heldSnapshotFaults on MySQL, with a consistent snapshot
// (START TRANSACTION WITH CONSISTENT SNAPSHOT, after reading the phase's
// tables, as mariadb-dump --single-transaction holds) held open on a
// connection of its own for the whole of each phase: purge is held back
// and nothing may be lost, run twice or left stuck. Each phase must also
// prove that the snapshot lasted: at the end the held transaction still
// counts the rows it counted at its start, though the tables now hold
// more, and information_schema.innodb_trx shows it begun before the
// workers started.
func TestTortureMySQLSnapshotHeld(t *testing.T) {
	rows := shortRun(t, testdb.MySQL(t), func(o *Options) {
		o.HoldXmin = true
		if os.Getenv(faultsEnv) == "" {
			o.Faults = heldSnapshotFaults
		}
	})
	for _, r := range rows {
		if r.Skipped != "" {
			continue
		}
		var held, checked bool
		for _, n := range r.Notes {
			held = held || strings.HasPrefix(n, "held: START TRANSACTION WITH CONSISTENT SNAPSHOT transaction")
			if r.Fault == "restart" && strings.HasPrefix(n, "held snapshot: ended by the server's restart") {
				checked = true // the restart ends it: nothing to prove
			}
			var start, end, now, conn, age int64
			var open bool
			var heldS float64
			if _, err := fmt.Sscanf(n, "held snapshot: %d rows at its start, %d at the end in the held transaction, %d in the tables now; open in information_schema.innodb_trx %t (connection %d), begun %ds ago, held %fs",
				&start, &end, &now, &open, &conn, &age, &heldS); err != nil {
				continue
			}
			checked = true
			if end != start || now <= start {
				t.Errorf("%s: the held transaction counted %d rows at its start and %d at the end, the tables %d: the snapshot did not last, or nothing was written past it", r.Fault, start, end, now)
			}
			if !open || age < int64(heldS)-1 {
				t.Errorf("%s: connection %d's transaction open in innodb_trx %t, begun %ds ago, held %.1fs: not the transaction opened before the workers", r.Fault, conn, open, age, heldS)
			}
			if heldS < MinPhase.Seconds() {
				t.Errorf("%s: held %.1fs, under the phase's %v of load", r.Fault, heldS, MinPhase)
			}
		}
		if !held {
			t.Errorf("%s: the phase did not run with a held snapshot: notes %q", r.Fault, r.Notes)
		}
		if !checked {
			t.Errorf("%s: no check that the snapshot lasted the phase: notes %q", r.Fault, r.Notes)
		}
	}
}

// patroniRunsEnv, when set to N, makes TestTorturePatroni run each of its
// faults N times, for the figures it logs.
const patroniRunsEnv = "CONVEYOR_TORTURE_PATRONI_RUNS"

// TestTorturePatroni runs the switchover and failover faults against a
// Patroni cluster of three nodes with synchronous replication, which the
// workers and producers reach through a multi-host DSN with
// target_session_attrs=read-write, with every check of the suite. It
// logs the time from each fault to the first job completed on the new
// primary (p50 and p99 over the runs; CONVEYOR_TORTURE_PATRONI_RUNS=N
// runs each fault N times).
func TestTorturePatroni(t *testing.T) {
	if testing.Short() {
		t.Skip("torture run skipped in -short mode")
	}
	runs := 1
	if v := os.Getenv(patroniRunsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a count", patroniRunsEnv, v)
		}
		runs = n
	}
	cluster := topology.StartPatroniT(t, topology.PatroniOptions{})
	var names []string
	for i := 0; i < runs; i++ {
		names = append(names, "switchover", "failover")
	}
	rows := shortRun(t, cluster.DSN("test"), func(o *Options) {
		o.Faults = names
		o.Patroni = &PatroniCluster{REST: cluster.RESTEndpoints(), DataDirs: cluster.DataDirs()}
	})
	took, writable, share := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for _, r := range rows {
		if r.Skipped != "" {
			t.Errorf("%s: skipped: %s", r.Fault, r.Skipped)
			continue
		}
		found := false
		for _, n := range r.Notes {
			var s, w float64
			if _, err := fmt.Sscanf(n, "fault to first completion on the new primary: %fs (new primary writable after %fs)", &s, &w); err == nil {
				took[r.Fault] = append(took[r.Fault], s)
				writable[r.Fault] = append(writable[r.Fault], w)
				share[r.Fault] = append(share[r.Fault], s-w)
				found = true
			}
		}
		if !found && len(r.Failures) == 0 {
			t.Errorf("%s: no completion on the new primary noted: %q", r.Fault, r.Notes)
		}
	}
	for _, f := range []string{"switchover", "failover"} {
		xs := took[f]
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		pct := func(p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
		t.Logf("%s: fault to first completion on the new primary over %d runs: p50 %.2fs, p99 %.2fs (all %v); new primary writable after %.2f-%.2fs; conveyor's share %.2f-%.2fs",
			f, len(xs), pct(0.5), pct(0.99), xs, slices.Min(writable[f]), slices.Max(writable[f]), slices.Min(share[f]), slices.Max(share[f]))
	}
}

// TestTortureGalera runs the node-kill fault (and a worker kill) against
// a 3-node MariaDB Galera cluster of its own, every node taking writes,
// with the worker processes spread over the nodes. The killed node is
// restarted and rejoins by an incremental state transfer.
func TestTortureGalera(t *testing.T) {
	if testing.Short() {
		t.Skip("torture run skipped in -short mode")
	}
	topology.NeedGalera(t)
	ctx := context.Background()
	g, err := topology.StartGalera(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	faults := []string{"node-kill", "kill"}
	if fs := os.Getenv(faultsEnv); fs != "" {
		faults = strings.Split(fs, ",")
	}
	rows := shortRun(t, g.DSN(1), func(o *Options) {
		o.Faults = faults
		o.NoRestart = true // the node-kill fault restarts a node itself
		o.Cluster = &Cluster{
			DSNs: g.DSNs(),
			Kill: func(i int) error {
				g.KillNode(i + 1)
				if g.Pid(i+1) != 0 {
					return fmt.Errorf("galera node %d still running", i+1)
				}
				return nil
			},
			Evicted: func(ctx context.Context) error { return g.WaitSize(ctx, len(g.Nodes)-1, time.Minute) },
			Restart: func(ctx context.Context, i int) error {
				if err := g.RestartNode(ctx, i+1); err != nil {
					return err
				}
				return g.WaitSize(ctx, len(g.Nodes), time.Minute)
			},
		}
	})
	for _, r := range rows {
		if r.Fault == "node-kill" && r.Skipped != "" {
			t.Errorf("node-kill skipped: %s", r.Skipped)
		}
	}
}
