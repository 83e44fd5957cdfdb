package torture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
)

// Options configure a torture run. Zero fields take the defaults below.
type Options struct {
	// DSN is the database: a loopback postgres:// or mysql:// URL, or a
	// SQLite file path. Default: a temporary SQLite file.
	DSN string
	// Duration is the total load time, split evenly across the faults
	// (each gets at least MinPhase and four leases). Default 5m.
	Duration time.Duration
	// Faults names the faults to run (see FaultNames); empty runs every
	// fault that applies to the backend.
	Faults []string
	// Exe is the program that runs WorkerMain, started once per worker
	// process; ExeArgs come before the worker flags and Env is added to its
	// environment. Default: this executable with "torture worker".
	Exe     string
	ExeArgs []string
	Env     []string
	// Workers is the number of worker processes. Default 3.
	Workers int
	// Concurrency is each worker process's MaxWorkers. Default 16.
	Concurrency int
	// Rate is the producer's enqueue rate in jobs per second. Default 100.
	Rate float64
	// Lease is the workers' lease. Default 2s. The phases' lengths, drain
	// timeouts, fault durations and bounds, and the workers' job timeout
	// scale with it.
	Lease time.Duration
	// Patroni is the Patroni cluster behind DSN, for the switchover and
	// failover faults; without it they are skipped.
	Patroni *PatroniCluster
	// NoRestart leaves out the fault that restarts the database server
	// (which breaks anyone else using it at the time).
	NoRestart bool
	// SmallPool is the PoolSize of the smallpool fault's workers. Default 1.
	SmallPool int
	// PoisonKinds are the poison kinds the poison fault enqueues.
	// Default: panic, exit and hang.
	PoisonKinds []string
	// UniqueShare is the share of the producers' jobs that are unique
	// (keys from small pools, so that duplicates happen). Default 0.25;
	// negative: none.
	UniqueShare float64
	// Tick is the interval of the periodic job every worker process
	// runs. Default a tenth of the lease; negative: none.
	Tick time.Duration
	// HoldXmin holds a transaction that has read every table of the
	// phase open, on a connection of its own, from before the workers
	// start until the queue has drained, as a dump would: on PostgreSQL
	// a REPEATABLE READ transaction, as pg_dump's, which blocks vacuum
	// through the faults; on MySQL a consistent snapshot (START
	// TRANSACTION WITH CONSISTENT SNAPSHOT, as mariadb-dump
	// --single-transaction's), which holds back purge, and which the
	// phase then checks lasted (see checkHeldSnapshot). Not on SQLite.
	// (The restart fault's restart ends it.)
	HoldXmin bool
	// SealAt is the size at which the workers seal a PostgreSQL segment
	// table (four times as much for done and dead): small, so
	// that a phase of seconds rotates and reclaims segments many times,
	// during the faults and under the held transaction. Default 16 KiB.
	SealAt int64
	// Keep keeps each phase's tables and record directory.
	Keep bool
	// Cluster, when set, is a multi-primary cluster (MariaDB Galera) whose
	// first node is DSN (default: that node): the worker and producer
	// processes are spread over its nodes, and the node-kill fault
	// applies.
	Cluster *Cluster
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Cluster is a multi-primary cluster of database servers where every node
// takes writes (MariaDB Galera), for the node-kill fault. The test or
// tool that started the cluster supplies how to kill and restart a node.
type Cluster struct {
	// DSNs are the nodes' DSNs. Worker process wN runs on node
	// (N-1) mod len(DSNs), the first producer on the first node (as the
	// orchestrator's own client does) and the second on the last.
	DSNs []string
	// Kill kills node i (an index into DSNs) as a crash would (SIGKILL of
	// its server process).
	Kill func(i int) error
	// Evicted waits until the nodes left have evicted a killed node and
	// take writes again.
	Evicted func(ctx context.Context) error
	// Restart starts node i again and waits until it has rejoined the
	// cluster; nil leaves a killed node down for the rest of the phase.
	Restart func(ctx context.Context, i int) error
}

// MinPhase is the shortest load time a fault phase gets; with a lease
// longer than a quarter of it, a phase gets at least four leases.
const MinPhase = 8 * time.Second

// minPhase is the shortest load time of a phase with lease: long enough
// for leases to expire and jobs to be rescued several times over.
func minPhase(lease time.Duration) time.Duration {
	return max(MinPhase, 4*lease)
}

// drainTimeout is how long a phase waits for the queue to drain by
// default: enough for the jobs of a process killed at the end of the load
// to be rescued (a lease) and run, with room for a backlog. Faults with
// longer jobs or slower rescues add to it.
func drainTimeout(lease time.Duration) time.Duration {
	return max(30*time.Second, 3*lease)
}

// jobTimeout is the workers' JobTimeout: longer than any torture job (the
// longest run three leases, kept alive by heartbeats).
func jobTimeout(lease time.Duration) time.Duration {
	return max(20*time.Second, 4*lease)
}

// exclusive keeps the phases of faults that load the whole machine (see
// fault.exclusive) from running at the same time as any other phase of
// this process: they take it for writing, the others for reading.
var exclusive sync.RWMutex

func (o *Options) defaults() error {
	if o.Duration <= 0 {
		o.Duration = 5 * time.Minute
	}
	if o.Workers <= 0 {
		o.Workers = 3
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.Rate <= 0 {
		o.Rate = 100
	}
	if o.Lease <= 0 {
		o.Lease = 2 * time.Second
	}
	if o.SmallPool <= 0 {
		o.SmallPool = 1
	}
	if o.SealAt <= 0 {
		o.SealAt = 16 << 10
	}
	if o.UniqueShare == 0 {
		o.UniqueShare = 0.25
	}
	if o.Tick == 0 {
		o.Tick = o.Lease / 10
	}
	if o.PoisonKinds == nil {
		o.PoisonKinds = []string{KindPanic, KindExit, KindHang}
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Exe, o.ExeArgs = exe, []string{"torture", "worker"}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// Row is the outcome of one fault on one backend.
type Row struct {
	Fault   string `json:"fault"`
	Backend string `json:"backend"`
	// Skipped says why the fault does not apply (the row is then empty).
	Skipped string `json:"skipped,omitempty"`
	// Injected says what was done.
	Injected string `json:"injected"`
	// Seconds is the phase's wall time, drain included.
	Seconds   float64 `json:"seconds"`
	Enqueued  int     `json:"enqueued"`
	Completed int     `json:"completed"`
	Discarded int     `json:"discarded"`
	// Lost, CompletedTwice, StaleApplied and Overlaps must be 0.
	Lost           int `json:"lost"`
	CompletedTwice int `json:"completed_twice"`
	StaleApplied   int `json:"stale_acks_applied"`
	// StaleRefused sums the workers' stale_acks_refused counters.
	StaleRefused int64 `json:"stale_acks_refused"`
	// ClaimedAtInsert sums the workers' claimed_at_insert counters: jobs
	// a worker process enqueued and its insert claimed for its own free
	// workers.
	ClaimedAtInsert int64 `json:"claimed_at_insert"`
	// LateAcks counts successful executions of superseded attempts.
	LateAcks int `json:"late_acks"`
	// Duplicates counts executions beyond the first of each job, and
	// DuplicateCauses explains them.
	Duplicates        int            `json:"duplicate_executions"`
	DuplicateCauses   map[string]int `json:"duplicate_causes"`
	Overlaps          int            `json:"overlaps"`
	OverlapsExplained int            `json:"overlaps_explained"`
	// RecoveryS is the recovery time in seconds: nil when the fault lasts
	// the whole phase, -1 when throughput did not come back.
	RecoveryS *float64 `json:"recovery_s"`
	// UniqueTold counts the committed enqueues of unique jobs, and
	// DupTold those told they were duplicates; their violations are in
	// Failures.
	UniqueTold int `json:"unique_enqueues"`
	DupTold    int `json:"duplicates_told"`
	// Slots counts the periodic job's slots from the first to the last
	// with a job, and SlotsSkippedDown those without one while no worker
	// process ran the schedule (allowed); -1 when the phase ran none.
	Slots            int `json:"periodic_slots"`
	SlotsSkippedDown int `json:"periodic_slots_skipped_down"`
	// Notes are measurements and observations; Failures are violations.
	Notes    []string `json:"notes,omitempty"`
	Failures []string `json:"failures,omitempty"`
	// Dir is the phase's record directory when kept.
	Dir string `json:"dir,omitempty"`
}

// OK reports whether the row has no violation.
func (r *Row) OK() bool { return len(r.Failures) == 0 }

// phase is one fault on one backend: its own table prefix, worker
// processes, producer and records.
type phase struct {
	o       *Options
	f       *fault
	backend string
	dsn     string
	prefix  string
	dir     string
	budget  time.Duration

	client *conveyor.Client[any]
	adm    *admin
	hold   *bench.Hold // Options.HoldXmin's transaction, until tearDown
	heldAt time.Time   // when hold was opened
	sup    *supervisor
	rec    *recorder

	workerArgs []string
	// producerRole is the role of the first producer (p1), p1Args its own
	// arguments; producerArgs go to both producers (the second, p2, is
	// always a plain producer).
	producerRole string
	p1Args       []string
	producerArgs []string
	p2Args       []string
	// tick is the interval of the workers' periodic job (0: none); it is
	// stopped at tickStop by a file at tickStopPath.
	tick         time.Duration
	tickStopPath string
	tickStop     time.Time
	// produceStopPath is the file whose appearance ends the worker
	// processes' own enqueues (--produce-stop), written when the load ends.
	produceStopPath string
	rate            float64 // the producer's rate (Options.Rate unless the fault lowers it)
	limits          map[string]conveyor.QueueLimits
	poison          map[string]bool
	drainTimeout    time.Duration
	// cleanups run at the very end of the phase, after its processes are
	// gone, in the order they were added.
	cleanups []func()

	loadStart, faultStart, faultEnd, loadEnd time.Time
	// nodeStallEnd is when the nodes left evicted the killed node (node-kill).
	nodeStallEnd    time.Time
	whole           bool
	injected        []string
	notes, failures []string
	private         *privateServer
	// dbOffset is the database's clock minus the run's, measured where a
	// fault skews it (zero otherwise: one machine, one clock).
	dbOffset    time.Duration
	expectExits bool
	// nodeOf maps a process slot to its node, with Options.Cluster.
	nodeOf map[string]int

	// The cpu faults: the CPU burner, and the disk throttle with what
	// went through it.
	burn               *burnState
	throttle           *blkioThrottle
	diskIOs, diskBytes int64
}

func (p *phase) logf(format string, args ...any) {
	fmt.Fprintf(p.o.Log, "  [%s %s] %s\n", p.backend, p.f.name, fmt.Sprintf(format, args...))
}

func (p *phase) note(format string, args ...any) {
	p.notes = append(p.notes, fmt.Sprintf(format, args...))
}
func (p *phase) fail(format string, args ...any) {
	p.failures = append(p.failures, fmt.Sprintf(format, args...))
}

// sleepUntil waits until t or ctx's end.
func sleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// Run runs the selected faults one after the other against opts.DSN and
// returns one row per fault. An error means the suite itself could not
// run; violations are in the rows.
func Run(ctx context.Context, opts Options) ([]Row, error) {
	o := &opts
	if err := o.defaults(); err != nil {
		return nil, err
	}
	var cleanup func()
	if o.DSN == "" {
		dir, err := os.MkdirTemp("", "conveyor-torture-db-")
		if err != nil {
			return nil, err
		}
		cleanup = func() { os.RemoveAll(dir) }
		o.DSN = filepath.Join(dir, "torture.db")
	}
	if cleanup != nil {
		defer cleanup()
	}
	if o.Cluster != nil {
		if len(o.Cluster.DSNs) < 2 || o.Cluster.Kill == nil || o.Cluster.Evicted == nil {
			return nil, errors.New("torture: a cluster needs two or more DSNs, Kill and Evicted")
		}
		if o.DSN == "" {
			o.DSN = o.Cluster.DSNs[0]
		}
		if o.DSN != o.Cluster.DSNs[0] {
			return nil, fmt.Errorf("torture: the DSN %s is not the cluster's first node %s", o.DSN, o.Cluster.DSNs[0])
		}
		for _, d := range o.Cluster.DSNs {
			if err := checkLoopback(d); err != nil {
				return nil, err
			}
		}
	}
	if err := checkLoopback(o.DSN); err != nil {
		return nil, err
	}
	if o.Patroni != nil {
		if err := o.Patroni.checkREST(); err != nil {
			return nil, err
		}
	}
	backend := backendOf(o.DSN)
	if o.HoldXmin && backend != "postgres" && backend != "mysql" {
		return nil, fmt.Errorf("torture: --hold-xmin is a PostgreSQL and MySQL setting; this database is %s", backend)
	}
	if backend == "mysql" {
		// go-sql-driver logs dropped connections to stderr by default.
		_ = gomysql.SetLogger(log.New(o.Log, "  [mysql driver] ", 0))
	}
	if backend == "sqlite" {
		p, err := absPath(o.DSN)
		if err != nil {
			return nil, err
		}
		o.DSN = p
	}
	fs, err := selectFaults(o.Faults)
	if err != nil {
		return nil, err
	}
	var run []*fault
	var rows []Row
	for _, f := range fs {
		if why := f.applies(backend); why != "" {
			if len(o.Faults) > 0 { // asked for by name: say why not
				rows = append(rows, Row{Fault: f.name, Backend: backend, Skipped: why})
			}
			continue
		}
		if f.patroni && o.Patroni == nil {
			if len(o.Faults) > 0 {
				rows = append(rows, Row{Fault: f.name, Backend: backend, Skipped: "needs a Patroni cluster behind the DSN (Options.Patroni)"})
			}
			continue
		}
		if f.cluster && o.Cluster == nil {
			if len(o.Faults) > 0 {
				rows = append(rows, Row{Fault: f.name, Backend: backend, Skipped: "needs a multi-primary cluster (Options.Cluster)"})
			}
			continue
		}
		if f.restarts && o.NoRestart {
			rows = append(rows, Row{Fault: f.name, Backend: backend, Skipped: "database restarts disabled"})
			continue
		}
		run = append(run, f)
	}
	if len(run) == 0 {
		return rows, nil
	}
	budget := max(o.Duration/time.Duration(len(run)), minPhase(o.Lease))
	for _, f := range run {
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
		fmt.Fprintf(o.Log, "%s on %s: %v of load\n", f.name, backend, budget.Round(time.Second))
		row := runPhase(ctx, o, f, backend, budget)
		for _, fl := range row.Failures {
			fmt.Fprintf(o.Log, "  FAIL: %s\n", fl)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func newPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "tt" + hex.EncodeToString(b[:]) + "_"
}

func runPhase(ctx context.Context, o *Options, f *fault, backend string, budget time.Duration) (row Row) {
	if f.exclusive {
		exclusive.Lock()
		defer exclusive.Unlock()
	} else {
		exclusive.RLock()
		defer exclusive.RUnlock()
	}
	begin := time.Now()
	p := &phase{o: o, f: f, backend: backend, dsn: o.DSN, prefix: newPrefix(), budget: budget, rate: o.Rate,
		drainTimeout: drainTimeout(o.Lease), poison: map[string]bool{}, producerRole: "producer", tick: max(o.Tick, 0)}
	row = Row{Fault: f.name, Backend: backend}
	defer func() {
		for _, c := range p.cleanups {
			c()
		}
		row.Seconds = time.Since(begin).Seconds()
		row.Notes = append(row.Notes, p.notes...)
		row.Failures = append(row.Failures, p.failures...)
	}()
	if f.prepare != nil {
		if err := f.prepare(ctx, p); err != nil {
			row.Skipped = err.Error()
			return row
		}
	}
	if p.private != nil {
		defer p.private.stop()
	}
	if err := p.setUp(ctx); err != nil {
		p.fail("setting up: %v", err)
		p.tearDown(ctx, &row)
		return row
	}
	err := p.load(ctx)
	if err != nil {
		p.fail("%v", err)
	}
	p.finish(ctx, &row)
	p.tearDown(ctx, &row)
	return row
}

func (p *phase) setUp(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "conveyor-torture-"+p.backend+"-"+strings.NewReplacer("+", "p", "-", "m").Replace(p.f.name)+"-")
	if err != nil {
		return err
	}
	p.dir = dir
	p.rec, err = newRecorder(filepath.Join(dir, "orchestrator.jsonl"), "orchestrator")
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	p.client, err = openMigrated(ctx, p.dsn, &conveyor.Config{TablePrefix: p.prefix, Logger: quiet}, connect.Options{})
	if err != nil {
		return fmt.Errorf("opening %s: %w", p.backend, err)
	}
	p.adm, err = openAdmin(ctx, p.dsn, p.prefix)
	if err != nil {
		return err
	}
	if p.o.HoldXmin {
		// Safety net: the server ends it if this process dies first.
		p.hold, err = bench.HoldSnapshot(ctx, p.dsn, p.backend, p.prefix, time.Hour)
		if err != nil {
			return fmt.Errorf("holding a transaction open (--hold-xmin): %w", err)
		}
		p.heldAt = time.Now()
	}
	// The limited queues' limits, in the database before any worker
	// process claims (see LimitsOf and checkLimits).
	p.limits = LimitsOf(p.rate)
	for _, q := range slices.Sorted(maps.Keys(p.limits)) {
		if err := p.client.SetQueueLimits(ctx, q, p.limits[q]); err != nil {
			return fmt.Errorf("setting the limits of %s: %w", q, err)
		}
	}
	p.sup = newSupervisor(p.o.Exe, p.o.ExeArgs, p.o.Env, dir, p.logf)
	common := []string{"--db", withAppName(p.dsn, "conveyor-torture"), "--prefix", p.prefix}
	if p.backend == "postgres" {
		common = append(common, "--seal-at", strconv.FormatInt(p.o.SealAt, 10))
	}
	p.workerArgs = slices.Concat(common, []string{"--workers", strconv.Itoa(p.o.Concurrency), "--lease", p.o.Lease.String(),
		"--job-timeout", jobTimeout(p.o.Lease).String()}, p.workerArgs)
	if p.tick > 0 {
		p.tickStopPath = filepath.Join(dir, "tick-stop")
		p.workerArgs = append(p.workerArgs, "--tick", p.tick.String(), "--tick-stop", p.tickStopPath)
	}
	// Two producer processes enqueue unique jobs with the same keys: the
	// first at the fault's rate share, the second at the rest (a quarter
	// beside the transactional producer, else half).
	share := 0.5
	if p.producerRole != "producer" {
		share = 0.75
	}
	rate := func(r float64) string { return strconv.FormatFloat(r, 'f', -1, 64) }
	lo, hi := limitedJobMS(p.rate)
	orate, olo, ohi := orderedLoad(p.rate)
	prod := slices.Concat(common, []string{"--unique-share", rate(max(p.o.UniqueShare, 0)),
		"--limited-share", rate(limitedShare), "--rated-share", rate(ratedShare),
		"--limited-min-ms", strconv.Itoa(lo), "--limited-max-ms", strconv.Itoa(hi),
		"--batch-rate", rate(batchRate), "--ordered-rate", rate(orate),
		"--ordered-min-ms", strconv.Itoa(olo), "--ordered-max-ms", strconv.Itoa(ohi)}, p.producerArgs)
	// The worker processes of Queue enqueue a share of their own, plain
	// jobs and ordered runs, taken from the second producer's: their
	// inserts may claim the jobs for their own free workers (claims at
	// insert), which a process that works no queue never does.
	workShare := 0.2
	if p.producerRole != "producer" {
		workShare = 0.1
	}
	p.produceStopPath = filepath.Join(dir, "produce-stop")
	p.workerArgs = append(p.workerArgs, "--produce-rate", rate(p.rate*workShare/float64(max(p.o.Workers, 1))),
		"--produce-stop", p.produceStopPath, "--ordered-rate", rate(orate/float64(max(p.o.Workers, 1))),
		"--ordered-min-ms", strconv.Itoa(olo), "--ordered-max-ms", strconv.Itoa(ohi))
	p.p2Args = slices.Concat(prod, []string{"--rate", rate(p.rate * (1 - share - workShare))})
	p.producerArgs = slices.Concat(prod, []string{"--rate", rate(p.rate * share)}, p.p1Args)
	for i := 1; i <= p.o.Workers; i++ {
		name := fmt.Sprintf("w%d", i)
		if err := p.sup.start(ctx, name, "worker", p.onNode(name, i-1, p.workerArgs)); err != nil {
			return err
		}
	}
	return nil
}

// onNode returns args (which name the phase's DSN after --db) for the
// process called name on node i of the cluster, recording where it runs,
// or args unchanged without a cluster.
func (p *phase) onNode(name string, i int, args []string) []string {
	c := p.o.Cluster
	if c == nil {
		return args
	}
	i %= len(c.DSNs)
	if p.nodeOf == nil {
		p.nodeOf = map[string]int{}
	}
	p.nodeOf[name] = i
	out := slices.Clone(args)
	for k := 0; k+1 < len(out); k++ {
		if out[k] == "--db" {
			out[k+1] = withAppName(c.DSNs[i], "conveyor-torture")
		}
	}
	return out
}

// load runs the producer for the phase's budget and applies the fault.
func (p *phase) load(ctx context.Context) error {
	// The producers start side by side: each waits for its client.
	errs := make(chan error, 2)
	p1, p2 := p.onNode("p1", 0, p.producerArgs), p.p2Args
	if p.o.Cluster != nil {
		p2 = p.onNode("p2", len(p.o.Cluster.DSNs)-1, p.p2Args)
	}
	go func() { errs <- p.sup.start(ctx, "p1", p.producerRole, p1) }()
	go func() { errs <- p.sup.start(ctx, "p2", "producer", p2) }()
	if err := errors.Join(<-errs, <-errs); err != nil {
		return err
	}
	p.loadStart = time.Now()
	p.whole = p.f.whole
	if !p.whole {
		// A steady flow before the fault, to measure recovery against.
		warm := min(max(p.budget/3, 3*time.Second), 5*time.Second)
		sleepUntil(ctx, p.loadStart.Add(warm))
	}
	p.faultStart = time.Now()
	err := p.f.inject(ctx, p)
	if p.faultEnd.IsZero() {
		p.faultEnd = time.Now()
	}
	p.loadEnd = p.loadStart.Add(p.budget)
	if !p.whole {
		// Load after the fault, to measure recovery and pick-ups on: at
		// least 4s, and past one lease (checkReconnect looks at the jobs
		// enqueued from a lease + 1s after the fault on).
		p.loadEnd = latest(p.loadEnd, p.faultEnd.Add(max(4*time.Second, p.o.Lease+2*time.Second)))
	}
	sleepUntil(ctx, p.loadEnd)
	if p.tick > 0 {
		err = errors.Join(err, p.stopTicks())
	}
	if p.produceStopPath != "" {
		err = errors.Join(err, os.WriteFile(p.produceStopPath, nil, 0o644))
	}
	p.sup.stopRole(p.producerRole, 35*time.Second)
	if p.producerRole != "producer" {
		p.sup.stopRole("producer", 35*time.Second)
	}
	return err
}

// stopTicks ends the workers' periodic schedule now: it writes the time
// to the file their schedule reads (renamed into place, so that it is
// never read half-written).
func (p *phase) stopTicks() error {
	p.tickStop = time.Now()
	tmp := p.tickStopPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(p.tickStop.Format(time.RFC3339Nano)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p.tickStopPath)
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// drain waits until no job is left to run, up to the phase's drain
// timeout, by the client's Stats, as an application would; on
// PostgreSQL it checks Stats against the segment tables (see drainQueue).
// A job Stats missed fails the phase.
func (p *phase) drain(ctx context.Context) (left int64, err error) {
	fired := map[int64]bool{}
	stats := func(ctx context.Context) (int64, error) {
		// Batches first: a callback enqueued after this reading is
		// counted by the Stats below.
		left, err := p.batchesUnfired(ctx, fired)
		if err != nil {
			return 0, err
		}
		st, err := p.client.Stats(ctx)
		if err != nil {
			return 0, err
		}
		for _, q := range st.Queues {
			for _, s := range []conveyor.JobState{"available", "scheduled", "running", "retryable"} {
				left += q.Counts[s]
			}
		}
		return left, nil
	}
	var tables func(context.Context) (map[int64]string, error)
	if p.adm != nil && p.adm.pg != nil {
		tables = p.adm.unfinishedSegRows
	}
	return drainQueue(ctx, time.Now().Add(p.drainTimeout), 200*time.Millisecond, stats, tables, func(at time.Time, missed []string) {
		p.fail("drain: the client's Stats counted no unfinished job at %s, yet the tables held %d committed before it was called: %s",
			clock(at), len(missed), strings.Join(head(missed), "; "))
	})
}

// batchRate is how many batches each plain producer enqueues per second.
const batchRate = 1.0

// batchesUnfired counts the recorded batches whose callback has not been
// enqueued yet (the maintenance leader enqueues it shortly after their
// last job finished), skipping those in fired and adding the ones found
// fired to it.
func (p *phase) batchesUnfired(ctx context.Context, fired map[int64]bool) (int64, error) {
	rs, err := readRecords(p.dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, b := range rs.batches {
		if fired[b.ID] {
			continue
		}
		got, err := p.client.Batch(ctx, b.ID)
		if err != nil {
			return 0, fmt.Errorf("batch %d: %w", b.ID, err)
		}
		if got.CallbackID != 0 {
			fired[b.ID] = true
			continue
		}
		n++
	}
	return n, nil
}

// drainQueue polls stats (the unfinished jobs Stats counts) every poll
// until it counts none, or until deadline, and returns its last count.
// With tables (the orchestrator's own reading of the unfinished rows, nil
// when it has none), each time stats counts none the tables are read too,
// and the drain goes on while they hold a job, so that the phase's checks
// see a drained queue whatever Stats said. A job found unfinished by two
// such readings was committed and unfinished all along between them, so
// the Stats call between them must have counted it: if it counted none,
// missed is called once, with when that call was made and the jobs it
// missed (missedByStats).
func drainQueue(ctx context.Context, deadline time.Time, poll time.Duration,
	stats func(context.Context) (int64, error), tables func(context.Context) (map[int64]string, error),
	missed func(at time.Time, jobs []string)) (left int64, err error) {
	var seen map[int64]string // the tables' last reading
	reported := false
	for {
		asked := time.Now()
		var n int64
		if n, err = stats(ctx); err == nil {
			left = n
			if left == 0 && tables != nil {
				if rows, terr := tables(ctx); terr == nil {
					if m := missedByStats(seen, rows); len(m) > 0 && !reported {
						reported = true
						missed(asked, m)
					}
					seen, left = rows, int64(len(rows))
				}
			}
			if left == 0 {
				return 0, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return left, err
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
		}
	}
}

// missedByStats lists the jobs unfinished in both readings of the tables,
// prev and cur, between which Stats counted no unfinished job: each was
// committed by prev's reading, before Stats was called, and a job never
// becomes unfinished again once final (the suite retries none by hand),
// so it was unfinished all along, when Stats read too. In id order, each
// as "job ID STATE at attempt N".
func missedByStats(prev, cur map[int64]string) []string {
	var ids []int64
	for id := range cur {
		if _, ok := prev[id]; ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("job %d %s", id, cur[id])
	}
	return out
}

// finish drains the queue, stops the workers and checks the records.
func (p *phase) finish(ctx context.Context, row *Row) {
	drainStart := time.Now()
	left, err := p.drain(ctx)
	if err != nil {
		p.fail("drain: %v", err)
	}
	if left > 0 {
		p.note("%d jobs still not final %v after the load ended (%d claims by the workers so far)", left, p.drainTimeout, p.claimed())
	} else {
		p.note("drained in %.1fs", time.Since(drainStart).Seconds())
	}
	if p.f.stop != nil {
		p.f.stop(ctx, p)
	}
	p.sup.stopRole("worker", 15*time.Second)
	p.sup.close()

	rs, err := readRecords(p.dir)
	if err != nil {
		p.fail("reading records: %v", err)
		return
	}
	if rs.bad > 0 {
		p.note("%d unreadable record lines", rs.bad)
	}
	jobs, err := p.finalJobs(ctx)
	if err != nil {
		p.fail("reading jobs: %v", err)
		return
	}
	if p.adm != nil && p.adm.pg != nil {
		jobs = p.checkFinalRead(ctx, jobs)
	}
	events, deaths := p.sup.snapshot()
	in := &Input{Lease: p.o.Lease, Acked: rs.acked, AckedAt: rs.ackedAt, RolledBack: rs.rolledBack, Execs: rs.execs,
		Jobs: jobs, Events: events, Deaths: deaths, Poison: p.poison, Applied: rs.applied,
		AppliedAt: rs.appliedAt, Told: rs.told, Tick: p.tick, TickStop: p.tickStop,
		AsyncClaims: p.backend == "postgres", SlowRenewals: rs.slowBeats, LateClaims: rs.lateClaims, Limits: p.limits,
		Batches: rs.batches, BatchSeen: rs.batchSeen, DBOffset: p.dbOffset}
	for proc, at := range rs.ready {
		pid := rs.pids[proc]
		in.Ups = append(in.Ups, Up{Proc: proc, PID: pid, Ready: at, End: deaths[pid]})
	}
	sort.Slice(in.Ups, func(a, b int) bool { return in.Ups[a].Ready.Before(in.Ups[b].Ready) })
	fd := Check(in)
	row.Enqueued, row.Completed, row.Discarded = fd.Enqueued, fd.Completed, fd.Discarded
	twice := map[int64]bool{}
	for _, id := range append(slices.Clone(fd.CompletedTwice), fd.CompletionsUndone...) {
		twice[id] = true
	}
	row.Lost, row.CompletedTwice, row.StaleApplied = len(fd.Lost), len(twice), len(fd.StaleApplied)
	seen := 0
	for _, atts := range rs.applied {
		seen += len(atts)
	}
	p.note("completion-effect log: %d of %d completions seen applied by the workers", seen, fd.Completed)
	row.StaleRefused = rs.sumCounter("stale_acks_refused")
	row.ClaimedAtInsert = rs.sumCounter("claimed_at_insert")
	if row.ClaimedAtInsert > 0 {
		p.note("%d jobs claimed by their own insert (%s)", row.ClaimedAtInsert, rs.counterBy("claimed_at_insert"))
	}
	row.LateAcks = fd.LateAcks
	row.Duplicates, row.DuplicateCauses = fd.Duplicates, fd.DuplicateCauses
	row.Overlaps, row.OverlapsExplained = len(fd.Overlaps), fd.OverlapsExplained
	p.failures = append(p.failures, fd.Failures()...)
	row.UniqueTold, row.DupTold = fd.UniqueTold, fd.DupTold
	if fd.UniqueTold > 0 || rs.toldRolledBack > 0 {
		p.note("unique jobs: %d committed enqueues, %d told duplicate (%d rows); in rolled-back transactions %d more, %d told duplicate",
			fd.UniqueTold, fd.DupTold, fd.UniqueTold-fd.DupTold, rs.toldRolledBack, rs.dupRolledBack)
	}
	row.Slots, row.SlotsSkippedDown = fd.Slots, fd.SlotsSkippedDown
	if p.tick > 0 {
		p.note("periodic job every %v: %d slots with one job each, %d skipped while no worker process ran the schedule",
			p.tick, fd.Slots-len(fd.SlotsTwice)-len(fd.SlotsMissed)-fd.SlotsSkippedDown, fd.SlotsSkippedDown)
		if fd.Slots == 0 {
			p.fail("the periodic job never ran")
		}
	} else {
		row.Slots = -1
	}
	p.noteLimits(fd)
	if fd.Batches > 0 {
		cbs := 0
		for _, j := range jobs {
			if j.Batch != 0 {
				cbs++
			}
		}
		gap := func(d *time.Duration) string {
			if d == nil {
				return "-"
			}
			return d.Round(time.Microsecond).String()
		}
		p.note("batches: %d enqueued, %d callback jobs, %d callback reads recorded; callbacks at the soonest %s after their last job's run ended, created %s after its finalization (database clock)",
			fd.Batches, cbs, len(rs.batchSeen), gap(fd.BatchGapRun), gap(fd.BatchGapDB))
	}
	if fd.Unacknowledged > 0 {
		p.note("%d rows without an acknowledged enqueue (%d enqueues ended in an error)", fd.Unacknowledged, rs.ambiguous)
	}
	if !p.whole {
		var done []time.Time
		for _, e := range rs.execs {
			if e.Outcome == OutcomeOK {
				done = append(done, e.End)
			}
		}
		if d, ok := Recovery(done, p.faultStart, p.faultEnd, p.loadEnd); ok {
			s := d.Seconds()
			row.RecoveryS = &s
		} else {
			s := -1.0
			row.RecoveryS = &s
		}
	}
	if n := rs.sumCounter("leases_lost"); n > 0 {
		p.note("leases lost: %s", rs.counterBy("leases_lost"))
	}
	if n := rs.sumCounter("rescued"); n > 0 {
		p.note("rescued: %d", n)
	}
	if p.backend == "postgres" {
		if n := rs.sumCounter("listen_reconnects"); n > 0 {
			p.note("listener reconnects: %d", n)
		}
	}
	for _, l := range scanLogs(p.dir) {
		p.fail("worker log: %s", l)
	}
	if !p.expectExits {
		for _, e := range p.sup.unexpectedExits() {
			p.fail("process exited by itself: %s", e)
		}
	}
	if p.f.check != nil {
		p.f.check(ctx, p, rs, fd, in)
	}
	row.Injected = strings.Join(p.injected, "; ")
}

// The shares of the producers' jobs enqueued on the limited queues.
const (
	limitedShare = 0.125
	ratedShare   = 0.125
	// orderedShare is the rate each producer process enqueues on
	// QueueOrdered, as a share of the run's rate.
	orderedShare = 0.1
)

// orderedLoad is what each producer process enqueues on QueueOrdered for
// an enqueue rate of rate jobs per second: perProducer jobs per second
// (its orderedShare of the rate) and their durations. On average the jobs
// keep each key busy a third of the time (a key runs one job at a time),
// so that a key's run of orderedRun jobs, enqueued faster than its first
// job runs, queues up behind it, and the key has drained the run well
// before its next one, stalls and retries included. A job runs at least
// 50ms, so that a run queues up however quick the enqueues, and at most
// 600ms, so that a run drains within a few seconds; at high rates the
// share is capped to keep the keys a third busy with jobs of 50-150ms.
func orderedLoad(rate float64) (perProducer float64, lo, hi int) {
	const minMean, maxMean = 100, 400 // ms
	perProducer = min(max(rate*orderedShare, 0.1), orderedKeys*1000/(3*minMean))
	mean := 1000 / (3 * perProducer / orderedKeys)
	mean = min(max(mean, minMean), maxMean)
	return perProducer, int(mean / 2), int(mean * 3 / 2)
}

// limitedJobMS bounds the durations of QueueLimited's jobs for an enqueue
// rate of rate jobs per second: on average its limitedShare of them keep
// four fifths of its MaxRunning busy, so that the limit binds whenever
// more than the average arrive at once and after every stall, while the
// queue still keeps up with its share of the load.
func limitedJobMS(rate float64) (lo, hi int) {
	mean := 0.8 * limitedMaxRunning / max(rate*limitedShare, 0.1) * 1000
	mean = min(max(mean, 40), 2000)
	return int(mean / 2), int(mean * 3 / 2)
}

// noteLimits notes the peaks the limited queues reached, and fails a
// phase where the concurrency limit never bound (the check would have
// proved nothing).
func (p *phase) noteLimits(fd *Findings) {
	for _, q := range slices.Sorted(maps.Keys(p.limits)) {
		l := p.limits[q]
		if l.MaxRunning > 0 {
			p.note("%s: at most %d jobs running at once (MaxRunning %d)", q, fd.LimitPeak[q], l.MaxRunning)
			if fd.LimitPeak[q] < l.MaxRunning {
				p.fail("%s: at most %d jobs ran at once, under its MaxRunning %d: the limit never bound", q, fd.LimitPeak[q], l.MaxRunning)
			}
		}
		if l.Rate > 0 {
			p.note("%s: at most %d claims within %v (Rate %d)", q, fd.RatePeak[q], l.RatePeriod, l.Rate)
		}
		if l.Ordered {
			p.note("%s: %d keys, %d jobs checked; at most %d of one key running at once, at most %d of one key waiting while one ran; %d failed jobs held their key while a later one waited",
				q, fd.OrderedKeys, fd.OrderedJobs, fd.KeyPeak, fd.OrderedWait, fd.OrderedHeld)
			if fd.OrderedWait < 2 {
				p.fail("%s: never more than %d jobs of one key waited while one ran: the order never bound", q, fd.OrderedWait)
			}
		}
	}
}

// claimed sums the workers' claimed counters from their records.
func (p *phase) claimed() int64 {
	rs, err := readRecords(p.dir)
	if err != nil {
		return -1
	}
	return rs.sumCounter("claimed")
}

// checkFinalRead compares the final rows the client's Jobs returned with
// the orchestrator's own reading of the segment tables (admin.segRows; by
// then nothing moves them: the workers have stopped). A job Jobs left out,
// or returned in another state or at another attempt, fails the phase,
// naming it, and Jobs is read again, a few times, until it agrees, so that
// the checks run on the rows as stored instead of reporting such a job
// lost. It returns the rows the checks use.
func (p *phase) checkFinalRead(ctx context.Context, jobs map[int64]*FinalJob) map[int64]*FinalJob {
	for try := 0; ; try++ {
		rows, err := p.adm.segRows(ctx, false)
		if err != nil {
			p.note("final read: reading the segment tables: %v", err)
			return jobs
		}
		diff := finalReadDiff(jobs, rows)
		if len(diff) == 0 {
			return jobs
		}
		if try == 0 {
			p.fail("final read: the client's Jobs returned %d jobs unlike the tables: %s", len(diff), strings.Join(head(diff), "; "))
		}
		if try == 5 {
			p.note("final read: the client's Jobs still disagreed with the tables after %d readings; checked as Jobs returned them", try+1)
			return jobs
		}
		time.Sleep(500 * time.Millisecond)
		again, err := p.finalJobs(ctx)
		if err != nil {
			return jobs
		}
		jobs = again
	}
}

// finalReadDiff lists, in id order, the jobs on which jobs (the client's
// Jobs) and rows (the tables: id -> "STATE at attempt N") disagree.
func finalReadDiff(jobs map[int64]*FinalJob, rows map[int64]string) []string {
	ids := map[int64]bool{}
	for id := range jobs {
		ids[id] = true
	}
	for id := range rows {
		ids[id] = true
	}
	var out []string
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		row, stored := rows[id]
		j := jobs[id]
		switch {
		case j == nil:
			out = append(out, fmt.Sprintf("job %d missing (%s in the tables)", id, row))
		case !stored:
			out = append(out, fmt.Sprintf("job %d %s at attempt %d (not in the tables)", id, j.State, j.Attempt))
		case fmt.Sprintf("%s at attempt %d", j.State, j.Attempt) != row:
			out = append(out, fmt.Sprintf("job %d %s at attempt %d (%s in the tables)", id, j.State, j.Attempt, row))
		}
	}
	return out
}

// finalJobs reads every job under the phase's prefix through the public
// API.
func (p *phase) finalJobs(ctx context.Context) (map[int64]*FinalJob, error) {
	out := map[int64]*FinalJob{}
	var after int64
	for {
		var page []*conveyor.JobInfo
		var err error
		for try := 0; try < 50; try++ { // the database may still be coming back
			page, err = p.client.Jobs(ctx, conveyor.JobFilter{AfterID: after, Limit: 1000})
			if err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			return nil, err
		}
		for _, j := range page {
			fj := &FinalJob{ID: j.ID, Queue: j.Queue, Kind: j.Kind, State: string(j.State), Attempt: j.Attempt,
				MaxAttempts: j.MaxAttempts, ScheduledAt: j.ScheduledAt, CreatedAt: j.CreatedAt, FinalizedAt: j.FinalizedAt}
			fj.Batch, _ = conveyor.BatchOf(j)
			fj.Key = j.Key
			var pl payload
			if json.Unmarshal(j.EncodedArgs, &pl) == nil {
				fj.Token, fj.U, fj.W = pl.Tok, pl.U, pl.W
			}
			for _, e := range j.Errors {
				fj.Errors = append(fj.Errors, AttemptErr{Attempt: e.Attempt, Error: e.Error, At: e.At})
			}
			out[j.ID] = fj
			after = j.ID
		}
		if len(page) < 1000 {
			return out, nil
		}
	}
}

func (p *phase) tearDown(ctx context.Context, row *Row) {
	if p.sup != nil {
		p.sup.close()
	}
	if p.backend == "postgres" && p.adm != nil {
		n, reclaims, highest, err := p.adm.segRotation(context.WithoutCancel(ctx))
		if err != nil {
			p.note("segments: reading the registry: %v", err)
		} else {
			p.note("segments: sealed at %d bytes; %d tables registered at the end, %d reclaims (truncations) of them, %d tables created in all",
				p.o.SealAt, n, reclaims, highest)
		}
	}
	if p.hold != nil && p.backend == "mysql" && !p.loadStart.IsZero() {
		p.checkHeldSnapshot(ctx)
	}
	if p.hold != nil {
		// Before the tables are dropped: a DROP waits for the held
		// transaction's locks.
		f := p.hold.Release()
		how := "rolled back"
		if f.ReleaseError != "" {
			how = "ended with its session (" + firstLine(f.ReleaseError) + ")"
		}
		p.note("held: %s transaction that read %d tables (%d rows), open %.1fs from before the workers started until the queue drained, then %s",
			f.Statement, len(f.Tables), f.Rows, f.EndS, how)
	}
	if p.rec != nil {
		p.rec.close()
	}
	if p.adm != nil {
		p.adm.close()
	}
	if p.client != nil {
		if !p.o.Keep {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			if err := lab.DropTables(dctx, p.client); err != nil {
				p.note("dropping tables: %v", err)
			}
			cancel()
		}
		p.client.Close()
	}
	if p.dir != "" {
		if p.o.Keep || len(p.failures) > 0 {
			row.Dir = p.dir
			if len(p.failures) > 0 && !p.o.Keep {
				p.note("records kept in %s", p.dir)
			}
		} else {
			os.RemoveAll(p.dir)
		}
	}
}

// leader returns the worker slot that holds maintenance leadership, or "".
func (p *phase) leader(ctx context.Context) string {
	pid, err := p.adm.leaderPID(ctx)
	if err != nil || pid == 0 {
		return ""
	}
	return p.sup.pids("worker")[pid]
}

// pickWorker returns a live worker slot that is not the leader (the
// leader if wantLeader is set), preferring one with jobs in flight: it
// waits up to two seconds for one that runs at least two jobs. It returns
// "" if there is none.
func (p *phase) pickWorker(ctx context.Context, wantLeader bool) string {
	leader := p.leader(ctx)
	if wantLeader {
		return leader
	}
	var live []string
	for _, n := range p.sup.names("worker") {
		if n != leader && p.sup.current(n) != 0 {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return ""
	}
	best, bestN := live[0], -1
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		open := p.inFlight()
		for _, n := range live {
			if open[n] > bestN {
				best, bestN = n, open[n]
			}
		}
		if bestN >= 2 {
			break
		}
		bestN = -1
		time.Sleep(50 * time.Millisecond)
	}
	return best
}

// inFlight counts, per worker slot, the executions its current process
// has started and not finished, from the records.
func (p *phase) inFlight() map[string]int {
	rs, err := readRecords(p.dir)
	if err != nil {
		return nil
	}
	pids := p.sup.pids("worker")
	out := map[string]int{}
	for _, e := range rs.execs {
		if e.End.IsZero() && pids[e.PID] != "" {
			out[pids[e.PID]]++
		}
	}
	return out
}

// rescueLatency measures, for the executions a kill cut short, how long
// until the next execution of the same job started: best over them all,
// worst over the jobs of unlimited queues (a limited queue's rescued job
// may wait for a slot or the rate's window after its rescue).
func rescueLatency(in *Input, kind string) (n int, best, worst time.Duration, unrescued int) {
	next := map[int64][]Exec{}
	for _, e := range in.Execs {
		next[e.Job] = append(next[e.Job], e)
	}
	for _, ev := range in.Events {
		if ev.Kind != kind {
			continue
		}
		for _, e := range in.Execs {
			if e.PID != ev.PID || !e.End.IsZero() {
				continue
			}
			n++
			var first time.Time
			for _, l := range next[e.Job] {
				// Not an execution of the killed process: one it recorded
				// between the kill's time and its death is no restart.
				if l.PID != ev.PID && l.Start.After(ev.Start) && (first.IsZero() || l.Start.Before(first)) {
					first = l.Start
				}
			}
			if first.IsZero() {
				unrescued++
				continue
			}
			d := first.Sub(ev.Start)
			if best == 0 || d < best {
				best = d
			}
			// A rescued job of a limited queue starts again when a slot
			// frees or the rate's window has room, which may be well
			// after its rescue: its start bounds how early the rescue
			// came, not how late.
			if j := in.Jobs[e.Job]; j == nil || (j.Queue != QueueLimited && j.Queue != QueueRated) {
				worst = max(worst, d)
			}
		}
	}
	return n, best, worst, unrescued
}

// pickupLatency returns the median time from enqueue to first start of
// the jobs enqueued in [from, to).
func pickupLatency(execs []Exec, from, to time.Time) (time.Duration, int) {
	first := map[int64]Exec{}
	for _, e := range execs {
		if e.Enqueued.IsZero() || e.Enqueued.Before(from) || !e.Enqueued.Before(to) {
			continue
		}
		if f, ok := first[e.Job]; !ok || e.Start.Before(f.Start) {
			first[e.Job] = e
		}
	}
	var ls []time.Duration
	for _, e := range first {
		ls = append(ls, e.Start.Sub(e.Enqueued))
	}
	if len(ls) == 0 {
		return 0, 0
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	return ls[len(ls)/2], len(ls)
}

// ErrViolations is returned by callers (the command) when a run found
// violations.
var ErrViolations = errors.New("torture: violations found")
