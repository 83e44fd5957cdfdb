package torture

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
)

// Queue is the queue of the torture workload.
const Queue = "torture"

// QueueExit is the queue of the poison jobs that exit their process, worked
// by a process of its own so that their deaths do not hide how the other
// poison kinds are handled.
const QueueExit = "torture-exit"

// QueueLimited and QueueRated are the torture's limited queues, worked by
// every ordinary worker process beside Queue: QueueLimited runs at most
// limitedMaxRunning jobs at once across the processes, QueueRated starts
// at most a fifth of the enqueue rate per second (see LimitsOf). The
// orchestrator sets their limits before any worker starts.
const (
	QueueLimited = "torture-limited"
	QueueRated   = "torture-rated"
)

// QueueOrdered is the torture's queue of ordered keys (Ordered, see
// LimitsOf), worked by every ordinary worker process: each producer
// process enqueues the jobs of orderedKeys keys of its own, each key's
// jobs one after another, in runs that queue up behind each other (see
// runOrdered).
const QueueOrdered = "torture-ordered"

// orderedKeys is how many keys each producer process enqueues on
// QueueOrdered, and orderedRun how many jobs of a key it enqueues back to
// back, each once the last was acknowledged.
const (
	orderedKeys = 4
	orderedRun  = 4
)

// limitedMaxRunning is QueueLimited's MaxRunning.
const limitedMaxRunning = 3

// Job kinds of the torture workload.
const (
	// KindWork sleeps for its "ms" argument, honouring its context.
	KindWork = "work"
	// KindDBWork reads its own row, its neighbours and the queue
	// statistics through the client, back to back for its "ms" argument,
	// holding connections of conveyor's pool.
	KindDBWork = "dbwork"
	// KindPanic panics.
	KindPanic = "panic"
	// KindExit exits its process with status 3.
	KindExit = "exit"
	// KindHang ignores its context and never returns.
	KindHang = "hang"
	// KindFlaky sleeps for its "ms" argument like KindWork, and then
	// fails its first attempt (with flakyErr); every later attempt
	// completes.
	KindFlaky = "flaky"
)

// flakyErr is the error a KindFlaky job's first attempt fails with, as
// its handler returns it and the job's error history stores it.
const flakyErr = "torture: a flaky job fails its first attempt"

// TickName is the name of the workers' periodic schedule.
const TickName = "torture-tick"

// payload is the arguments of every torture job: a unique token, the work
// duration and the time the producer began the enqueue; for a unique job
// its key fields (see uniqueKeyOf). The periodic job has no token.
type payload struct {
	Tok string `json:"tok"`
	MS  int    `json:"ms"`
	Enq int64  `json:"enq"`
	U   string `json:"u,omitempty"`
	W   int64  `json:"w,omitempty"`
}

func (p payload) base() payload { return p }

type workJob struct{ payload }
type dbworkJob struct{ payload }
type panicJob struct{ payload }
type exitJob struct{ payload }
type hangJob struct{ payload }
type flakyJob struct{ payload }
type tickJob struct{ payload }
type batchDoneJob struct{ payload }

func (workJob) Kind() string      { return KindWork }
func (dbworkJob) Kind() string    { return KindDBWork }
func (panicJob) Kind() string     { return KindPanic }
func (exitJob) Kind() string      { return KindExit }
func (hangJob) Kind() string      { return KindHang }
func (flakyJob) Kind() string     { return KindFlaky }
func (tickJob) Kind() string      { return KindTick }
func (batchDoneJob) Kind() string { return KindBatchDone }

type torturePayload interface {
	conveyor.JobArgs
	base() payload
}

// workerFlags are the flags of a worker process (`conveyor torture worker`).
type workerFlags struct {
	role, dsn, prefix, record, proc string
	sealAt                          int64
	queue                           string
	workers, pool, goroutines       int
	lease, listenPoll, jobTimeout   time.Duration
	rate                            float64
	rollback                        float64
	longEvery                       int
	longMS, minMS, maxMS            int
	dbwork                          bool
	// uniqueShare is the share of a producer's jobs that are unique.
	uniqueShare float64
	// limitedShare and ratedShare are the shares of a producer's jobs
	// that go to QueueLimited and QueueRated; limitedMinMS and
	// limitedMaxMS bound the duration of a QueueLimited job.
	limitedShare, ratedShare   float64
	limitedMinMS, limitedMaxMS int
	// orderedRate is the rate of a producer's jobs on QueueOrdered, in
	// jobs per second over its orderedKeys keys (0: none);
	// orderedMinMS and orderedMaxMS bound their durations.
	orderedRate                float64
	orderedMinMS, orderedMaxMS int
	// tick is the interval of the workers' periodic job (0: none), and
	// tickStop the file whose appearance stops it.
	tick     time.Duration
	tickStop string
	// produceRate is the rate of plain jobs a worker process of Queue
	// enqueues itself while it works (0: none), and produceStop the
	// file whose appearance stops its enqueues: its inserts may claim
	// their own jobs for its free workers (the claims at insert of a
	// process that works the queue it enqueues on), which the separate
	// producer processes never do.
	produceRate float64
	produceStop string
	// batchRate is how many batches (of batchSize work jobs and a
	// KindBatchDone callback) a producer enqueues per second, beside its
	// jobs (0: none).
	batchRate float64
	// threads and until are the burner's busy threads and deadline;
	// blkio is a blkio cgroup the process joins before anything else.
	threads int
	until   time.Time
	blkio   string
}

func parseWorkerFlags(args []string, stderr io.Writer) (*workerFlags, error) {
	fs := flag.NewFlagSet("torture worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	w := &workerFlags{}
	fs.StringVar(&w.role, "role", "worker", "worker, producer, txproducer or burn")
	fs.StringVar(&w.dsn, "db", "", "database DSN")
	fs.StringVar(&w.prefix, "prefix", "", "table prefix")
	fs.StringVar(&w.record, "record", "", "record file (JSON lines)")
	fs.StringVar(&w.proc, "proc", "", "name of this process incarnation")
	fs.StringVar(&w.queue, "queue", Queue, "worker: the queue to work")
	fs.IntVar(&w.workers, "workers", 16, "worker: concurrent jobs")
	fs.IntVar(&w.pool, "pool", 0, "worker: connect.Options.PoolSize (0: backend default)")
	fs.Int64Var(&w.sealAt, "seal-at", 0, "PostgreSQL: seal segments at this size in bytes (lab.SealSegmentsAt; 0: the default)")
	fs.DurationVar(&w.lease, "lease", 2*time.Second, "worker: Config.Lease")
	fs.DurationVar(&w.listenPoll, "listen-poll", 5*time.Second, "worker: Config.ListenPoll")
	fs.DurationVar(&w.jobTimeout, "job-timeout", 20*time.Second, "worker: Config.JobTimeout")
	fs.Float64Var(&w.rate, "rate", 100, "producer: jobs per second")
	fs.IntVar(&w.goroutines, "goroutines", 4, "producer: concurrent enqueuers")
	fs.Float64Var(&w.rollback, "rollback", 0.4, "txproducer: fraction of transactions rolled back")
	fs.IntVar(&w.minMS, "min-ms", 20, "producer: shortest job (ms)")
	fs.IntVar(&w.maxMS, "max-ms", 200, "producer: longest ordinary job (ms)")
	fs.IntVar(&w.longEvery, "long-every", 0, "producer: every Nth job is long (0: none)")
	fs.IntVar(&w.longMS, "long-ms", 6000, "producer: duration of a long job (ms)")
	fs.BoolVar(&w.dbwork, "dbwork", false, "producer: enqueue dbwork jobs instead of work")
	fs.Float64Var(&w.uniqueShare, "unique-share", 0, "producers: share of the jobs that are unique, with keys from small pools")
	fs.Float64Var(&w.limitedShare, "limited-share", 0, "producers: share of the jobs enqueued on "+QueueLimited)
	fs.Float64Var(&w.ratedShare, "rated-share", 0, "producers: share of the jobs enqueued on "+QueueRated)
	fs.Float64Var(&w.orderedRate, "ordered-rate", 0, "producers: jobs per second enqueued on "+QueueOrdered+", over keys of their own")
	fs.IntVar(&w.orderedMinMS, "ordered-min-ms", 100, "producers: shortest job on "+QueueOrdered+" (ms)")
	fs.IntVar(&w.orderedMaxMS, "ordered-max-ms", 300, "producers: longest job on "+QueueOrdered+" (ms)")
	fs.IntVar(&w.limitedMinMS, "limited-min-ms", 100, "producers: shortest job on "+QueueLimited+" (ms)")
	fs.IntVar(&w.limitedMaxMS, "limited-max-ms", 200, "producers: longest job on "+QueueLimited+" (ms)")
	fs.Float64Var(&w.batchRate, "batch-rate", 0, "producer: batches per second (of "+strconv.Itoa(batchSize)+" jobs and a callback)")
	fs.DurationVar(&w.tick, "tick", 0, "worker: interval of the periodic job (0: none)")
	fs.StringVar(&w.tickStop, "tick-stop", "", "worker: the periodic job has no slot after the time written in this file, once it exists")
	fs.Float64Var(&w.produceRate, "produce-rate", 0, "worker of "+Queue+": also enqueue this many plain jobs per second (and, with --ordered-rate, ordered runs of keys of its own) while working")
	fs.StringVar(&w.produceStop, "produce-stop", "", "worker: stop the enqueues of --produce-rate once this file exists")
	fs.IntVar(&w.threads, "threads", 0, "burn: busy threads (0: twice the CPUs)")
	fs.Func("until", "burn: exit by itself at this time (RFC 3339)", func(s string) (err error) {
		w.until, err = time.Parse(time.RFC3339Nano, s)
		return err
	})
	fs.StringVar(&w.blkio, "blkio-cgroup", "", "join this blkio cgroup directory before touching the database")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if w.record == "" || w.proc == "" {
		return nil, errors.New("torture worker: --record and --proc are required")
	}
	if w.role == roleBurn {
		if w.until.IsZero() {
			return nil, errors.New("torture worker: --until is required with --role burn")
		}
		return w, nil
	}
	if w.dsn == "" || w.prefix == "" {
		return nil, errors.New("torture worker: --db and --prefix are required")
	}
	return w, nil
}

// WorkerMain is the entry point of a torture subprocess (`conveyor torture
// worker ...`, or the test binary re-executed): a worker that runs the
// torture job kinds and records every execution, a producer that enqueues
// at a steady rate and records every acknowledged enqueue, or a
// transactional producer that rolls back some of its transactions, or a
// CPU burner (the cpu faults). It writes "ready" on stdout once it is
// working and runs until SIGTERM (a graceful stop) or SIGKILL; a burner
// also ends by itself at its --until deadline.
func WorkerMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	w, err := parseWorkerFlags(args, stderr)
	if err != nil {
		return err
	}
	if w.blkio != "" {
		// Before any file is opened, so that all of this process's
		// writes go through the throttle.
		if err := joinCgroup(w.blkio, os.Getpid()); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	rec, err := newRecorder(w.record, w.proc)
	if err != nil {
		return err
	}
	rec.write(line{T: lineHello, Role: w.role})
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch w.role {
	case "worker":
		err = runWorker(ctx, w, rec, logger, stdout)
	case "producer":
		err = runProducer(ctx, w, rec, logger, stdout)
	case "txproducer":
		err = runTxProducer(ctx, w, rec, logger, stdout)
	case roleBurn:
		err = runBurner(ctx, w, stdout)
	default:
		err = fmt.Errorf("torture worker: unknown role %q", w.role)
	}
	rec.write(line{T: lineBye})
	return errors.Join(err, rec.close())
}

// workerConfig is the client configuration of torture worker processes:
// short leases so that a run is quick, fast maintenance and polls.
func workerConfig(w *workerFlags, logger *slog.Logger) *conveyor.Config {
	queues := map[string]conveyor.QueueConfig{w.queue: {MaxWorkers: w.workers}}
	if w.queue == Queue {
		// Every ordinary worker process works the limited queues too,
		// each with room for more than the limits let run.
		queues[QueueLimited] = conveyor.QueueConfig{MaxWorkers: w.workers}
		queues[QueueRated] = conveyor.QueueConfig{MaxWorkers: w.workers}
		queues[QueueOrdered] = conveyor.QueueConfig{MaxWorkers: w.workers}
	}
	return &conveyor.Config{
		Queues:          queues,
		TablePrefix:     w.prefix,
		Lease:           w.lease,
		JobTimeout:      w.jobTimeout,
		PollMin:         10 * time.Millisecond,
		PollMax:         100 * time.Millisecond,
		ListenPoll:      w.listenPoll,
		PromoteInterval: 100 * time.Millisecond,
		RescueInterval:  max(w.lease/8, 50*time.Millisecond),
		ShutdownTimeout: 3 * time.Second,
		Backoff:         func(int) time.Duration { return 100*time.Millisecond + rand.N(100*time.Millisecond) },
		Logger:          logger,
	}
}

func runWorker(ctx context.Context, w *workerFlags, rec *recorder, logger *slog.Logger, stdout io.Writer) error {
	c, err := openMigrated(ctx, w.dsn, workerConfig(w, logger), connect.Options{PoolSize: w.pool})
	if err != nil {
		return err
	}
	defer c.Close()
	if w.sealAt > 0 {
		if err := lab.SealSegmentsAt(c, w.sealAt); err != nil {
			return fmt.Errorf("--seal-at: %w", err)
		}
	}
	recordSlowRenewals(c, rec)
	recordLateClaims(c, rec)
	sleep := func(ctx context.Context, ms int) error {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	// The completion-effect log: shortly after a successful execution,
	// read the row; if it is completed at the attempt that ran, that
	// completion took effect, and the checker requires the row to end so.
	obs := make(chan applyCheck, 4096)
	go observe(ctx, c, rec, obs)
	onOK := func(id int64, attempt int) {
		select {
		case obs <- applyCheck{id, attempt, time.Now()}:
		default: // the observer is behind: skip this one
		}
	}
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[workJob]) error { return sleep(ctx, j.Args.MS) })
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[dbworkJob]) error {
		// Use conveyor's own connections back to back for the job's
		// duration, as an application that reads job state and queue
		// statistics from its handlers does: with a small pool the
		// heartbeat, claims and completions must queue behind these.
		deadline := time.Now().Add(time.Duration(j.Args.MS) * time.Millisecond)
		for time.Now().Before(deadline) {
			if _, err := c.Job(ctx, j.ID); err != nil {
				return err
			}
			if _, err := c.Jobs(ctx, conveyor.JobFilter{AfterID: max(0, j.ID-50), Limit: 50}); err != nil {
				return err
			}
			if _, err := c.Stats(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[panicJob]) error { panic("torture: poison job panics") })
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[exitJob]) error {
		os.Exit(3)
		return nil
	})
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[hangJob]) error {
		select {} // ignores its context and never returns
	})
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[flakyJob]) error {
		if err := sleep(ctx, j.Args.MS); err != nil {
			return err
		}
		if j.Attempt == 1 {
			// The failed job waits for its retry (Backoff, below): an
			// ordered key's job holds its key meanwhile.
			return errors.New(flakyErr)
		}
		return nil
	})
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[tickJob]) error { return sleep(ctx, j.Args.MS) })
	add(c, rec, onOK, func(ctx context.Context, j *conveyor.Job[batchDoneJob]) error {
		// A batch's callback: record what its batch says of its jobs.
		id, ok := conveyor.BatchOf(j.JobInfo)
		if !ok {
			return errors.New("torture: a batch callback that names no batch")
		}
		b, err := c.Batch(ctx, id)
		if err != nil {
			return err
		}
		counts := map[string]int64{}
		for st, n := range b.Counts {
			counts[string(st)] = int64(n)
		}
		rec.write(line{T: lineBatchCB, Job: j.ID, Att: j.Attempt, Bat: id, C: counts})
		return nil
	})
	if w.tick > 0 {
		// Every worker process runs the schedule: the database must keep
		// one job per slot whichever of them are killed, paused or
		// restarted. Its jobs go to the ordinary queue (the exit
		// worker's run it too but does not work that queue).
		err := c.AddPeriodic(conveyor.PeriodicJob{
			Name:     TickName,
			Schedule: &stoppable{Schedule: conveyor.Every(w.tick), path: w.tickStop},
			Args:     tickJob{payload{MS: 5}},
			Opts:     &conveyor.EnqueueOpts{Queue: Queue},
		})
		if err != nil {
			return err
		}
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	rec.write(line{T: lineReady})
	fmt.Fprintln(stdout, "ready")
	produced := make(chan struct{})
	if w.produceRate > 0 && w.queue == Queue {
		go func() {
			defer close(produced)
			produceWhileWorking(ctx, c, w, rec)
		}()
	} else {
		close(produced)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		rec.write(line{T: lineCounters, C: c.Counters().Map()})
	}
	// SIGTERM: stop gracefully (unfinished attempts are released), once
	// the enqueues this process began have returned.
	<-produced
	err = c.Stop(context.Background())
	rec.write(line{T: lineCounters, C: c.Counters().Map()})
	return err
}

// applyCheck is a successful execution whose effect the observer checks.
type applyCheck struct {
	id      int64
	attempt int
	at      time.Time
}

// observe reads the row of each successful execution 300ms after it
// returned and records an "applied" line when the row is completed at that
// attempt.
func observe(ctx context.Context, c *conveyor.Client[any], rec *recorder, in <-chan applyCheck) {
	for {
		var o applyCheck
		select {
		case o = <-in:
		case <-ctx.Done():
			return
		}
		if d := time.Until(o.at.Add(300 * time.Millisecond)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		jctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		j, err := c.Job(jctx, o.id)
		cancel()
		if err == nil && j.State == "completed" && j.Attempt == o.attempt {
			rec.write(line{T: lineApplied, Job: o.id, Att: o.attempt})
		}
	}
}

// add registers a recording worker for kind T: the start is recorded
// before the handler runs and the end before the engine sees the result;
// onOK is told of each successful execution.
func add[T torturePayload](c *conveyor.Client[any], rec *recorder, onOK func(int64, int), h func(context.Context, *conveyor.Job[T]) error) {
	var zero T
	kind := zero.Kind()
	err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[T]) (err error) {
		l := line{T: lineStart, Job: j.ID, Att: j.Attempt, Kind: kind, Enq: j.Args.base().Enq}
		if !j.AttemptedAt.IsZero() {
			l.Cl = j.AttemptedAt.UnixNano()
		}
		if kind == KindTick {
			l.Sch = j.ScheduledAt.UnixNano()
		}
		rec.write(l)
		// When the context ends (a cut-off, a cancel, a shutdown): the
		// checker places a cut-off by it, not by the handler's return,
		// which may come later (a statement under way finishing).
		var cut atomic.Int64
		stop := context.AfterFunc(ctx, func() { cut.Store(time.Now().UnixNano()) })
		defer func() {
			stop()
			c := cut.Load()
			if r := recover(); r != nil {
				rec.write(line{T: lineEnd, Job: j.ID, Att: j.Attempt, Out: OutcomePanic, Err: fmt.Sprint(r), Cut: c})
				panic(r)
			}
			if err != nil {
				rec.write(line{T: lineEnd, Job: j.ID, Att: j.Attempt, Out: OutcomeError, Err: err.Error(), Cut: c})
			} else {
				rec.write(line{T: lineEnd, Job: j.ID, Att: j.Attempt, Out: OutcomeOK, Cut: c})
				onOK(j.ID, j.Attempt)
			}
		}()
		return h(ctx, j)
	}))
	if err != nil {
		panic(err)
	}
}

func openMigrated(ctx context.Context, dsn string, cfg *conveyor.Config, opts connect.Options) (*conveyor.Client[any], error) {
	var c *conveyor.Client[any]
	var err error
	// The database may be restarting: retry for a while.
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err = connect.OpenWith(ctx, dsn, cfg, opts)
		if err == nil {
			if _, err = c.Migrate(ctx); err == nil {
				return c, nil
			}
			c.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stoppable is a schedule that has no slot after the time written in a
// file, once that file exists: the orchestrator stops the periodic job
// at the end of the load, so that the queue can drain.
type stoppable struct {
	conveyor.Schedule
	path string
	mu   sync.Mutex
	stop time.Time
}

func (s *stoppable) Next(t time.Time) time.Time {
	n := s.Schedule.Next(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop.IsZero() && s.path != "" {
		if b, err := os.ReadFile(s.path); err == nil {
			s.stop, _ = time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		}
	}
	if !s.stop.IsZero() && n.After(s.stop) {
		return time.Time{}
	}
	return n
}

// jobSpec says what the next job of a producer is: its kind, duration,
// and for a unique job its key fields and options.
type jobSpec struct {
	queue  string
	kind   string
	ms     int
	u      string
	w      int64
	unique *conveyor.UniqueOpts
	lkey   string // the job's limit key (EnqueueOpts.Key)
}

// The torture's unique options (see uniqueKeyOf).
var (
	liveUnique = &conveyor.UniqueOpts{ArgsFields: []string{"u"}}
	keptUnique = &conveyor.UniqueOpts{ArgsFields: []string{"u", "w"}, ByQueue: true, States: conveyor.JobStates()}
)

// key is the spec's unique key, as the checker names it.
func (s jobSpec) key() string { return uniqueKeyOf(s.kind, Queue, s.u, s.w) }

// opts are the spec's enqueue options.
func (s jobSpec) opts() *conveyor.EnqueueOpts {
	return &conveyor.EnqueueOpts{Queue: s.queue, Unique: s.unique, Key: s.lkey}
}

func (w *workerFlags) nextJob(n int64) jobSpec {
	kind := KindWork
	if w.dbwork {
		kind = KindDBWork
	}
	s := jobSpec{queue: Queue, kind: kind, ms: w.minMS + rand.IntN(max(1, w.maxMS-w.minMS+1))}
	if w.longEvery > 0 && n%int64(w.longEvery) == 0 {
		s = jobSpec{queue: Queue, kind: KindWork, ms: w.longMS}
	} else {
		// The limited queues get plain work jobs, never unique ones.
		switch x := rand.Float64(); {
		case x < w.limitedShare:
			return jobSpec{queue: QueueLimited, kind: KindWork, ms: w.limitedMinMS + rand.IntN(max(1, w.limitedMaxMS-w.limitedMinMS+1))}
		case x < w.limitedShare+w.ratedShare:
			return s.on(QueueRated)
		}
	}
	if w.uniqueShare > 0 && rand.Float64() < w.uniqueShare {
		k := rand.IntN(uniqueKeys)
		if rand.IntN(2) == 0 {
			s.u, s.unique = fmt.Sprintf("%s%d", uniqueLive, k), liveUnique
		} else {
			s.u, s.w, s.unique = fmt.Sprintf("%s%d", uniqueKept, k), time.Now().UnixNano()/int64(keptWindow), keptUnique
		}
	}
	return s
}

// on returns s enqueued on queue instead, as a plain work job.
func (s jobSpec) on(queue string) jobSpec {
	s.queue, s.kind = queue, KindWork
	return s
}

func encodePayload(tok string, s jobSpec) json.RawMessage {
	b, _ := json.Marshal(payload{Tok: tok, MS: s.ms, Enq: time.Now().UnixNano(), U: s.u, W: s.w})
	return b
}

// pace runs f from g goroutines at rate calls per second in total until
// ctx ends.
func pace(ctx context.Context, g int, rate float64, f func(ctx context.Context)) {
	var wg sync.WaitGroup
	interval := time.Duration(float64(g) * float64(time.Second) / max(rate, 0.1))
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the goroutines over one interval.
			next := time.Now().Add(interval * time.Duration(i) / time.Duration(g))
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return
					}
				}
				next = next.Add(interval)
				if lag := time.Since(next); lag > time.Second {
					next = time.Now() // do not burst after a stall
				}
				f(ctx)
			}
		}()
	}
	wg.Wait()
}

func runProducer(ctx context.Context, w *workerFlags, rec *recorder, logger *slog.Logger, stdout io.Writer) error {
	c, err := openMigrated(ctx, w.dsn, &conveyor.Config{TablePrefix: w.prefix, Logger: logger}, connect.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintln(stdout, "ready")
	var seq atomic.Int64
	var wg sync.WaitGroup
	if w.batchRate > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pace(ctx, 1, w.batchRate, func(ctx context.Context) { enqueueBatch(ctx, c, w, rec, seq.Add(1)) })
		}()
	}
	startOrdered(ctx, &wg, c, w, rec, &seq)
	defer wg.Wait()
	if w.limitedShare > 0 {
		limitedBurst(c, w, rec, &seq)
	}
	pace(ctx, w.goroutines, w.rate, func(ctx context.Context) { enqueueOne(ctx, c, w, rec, seq.Add(1)) })
	return nil
}

// enqueueOne enqueues the producer's job number n (w.nextJob) and records
// its acknowledgement, or the error that left its outcome unknown (then it
// pauses for 100ms, or until ctx ends).
func enqueueOne(ctx context.Context, c *conveyor.Client[any], w *workerFlags, rec *recorder, n int64) {
	tok := fmt.Sprintf("%s:%d", w.proc, n)
	spec := w.nextJob(n)
	// The enqueue is not tied to ctx: SIGTERM must not turn a commit
	// into an unknown outcome. EnqueueMany of one job is coalesced
	// like Enqueue, and says whether a unique job was a duplicate.
	ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	begin := time.Now()
	res, err := c.EnqueueMany(ectx, []conveyor.EnqueueItem{{Args: conveyor.RawArgs{KindName: spec.kind, JSON: encodePayload(tok, spec)}, Opts: spec.opts()}})
	cancel()
	if err != nil {
		rec.write(line{T: lineAmbig, Tok: tok, Err: err.Error()})
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
		return
	}
	l := line{T: lineEnq, Job: res[0].ID, Tok: tok, Kind: spec.kind}
	if spec.unique != nil {
		l.U, l.Dup, l.B = spec.key(), res[0].Duplicate, begin.UnixNano()
	}
	rec.write(l)
}

// produceWhileWorking is a worker's own enqueues (--produce-rate): plain
// jobs at w.produceRate per second and, with w.orderedRate, ordered runs
// of orderedKeys keys of its own, through the client that works their
// queues, until ctx ends or the file w.produceStop exists. It returns
// once every enqueue it began has returned.
func produceWhileWorking(ctx context.Context, c *conveyor.Client[any], w *workerFlags, rec *recorder) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if w.produceStop != "" {
				if _, err := os.Stat(w.produceStop); err == nil {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var seq atomic.Int64
	startOrdered(ctx, &wg, c, w, rec, &seq)
	pace(ctx, 2, w.produceRate, func(ctx context.Context) { enqueueOne(ctx, c, w, rec, seq.Add(1)) })
	cancel()
	wg.Wait()
}

// limitedBurstJobs is how many jobs a producer enqueues on QueueLimited
// at once when it starts, and limitedBurstMS how long each runs.
const (
	limitedBurstJobs = limitedMaxRunning + 2
	limitedBurstMS   = 1500
)

// limitedBurst enqueues limitedBurstJobs long jobs on QueueLimited in one
// call, so that the concurrency limit binds in every phase whatever rate
// the machine achieves: the checker fails a phase where it never bound,
// since its check would have proved nothing, and on a saturated machine
// the paced share of limited jobs alone may never overlap enough.
func limitedBurst(c *conveyor.Client[any], w *workerFlags, rec *recorder, seq *atomic.Int64) {
	items := make([]conveyor.EnqueueItem, limitedBurstJobs)
	toks := make([]string, len(items))
	for i := range items {
		toks[i] = fmt.Sprintf("%s:%d", w.proc, seq.Add(1))
		spec := jobSpec{queue: QueueLimited, kind: KindWork, ms: max(w.limitedMaxMS, limitedBurstMS)}
		items[i] = conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: spec.kind, JSON: encodePayload(toks[i], spec)}, Opts: spec.opts()}
	}
	// Not tied to ctx, like every enqueue of a producer.
	ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := c.EnqueueMany(ectx, items)
	cancel()
	for i, tok := range toks {
		if err != nil {
			rec.write(line{T: lineAmbig, Tok: tok, Err: err.Error()})
			continue
		}
		rec.write(line{T: lineEnq, Job: res[i].ID, Tok: tok, Kind: KindWork})
	}
}

// startOrdered starts, with w.orderedRate, one goroutine per ordered key
// of this process (runOrdered), counted in wg.
func startOrdered(ctx context.Context, wg *sync.WaitGroup, c *conveyor.Client[any], w *workerFlags, rec *recorder, seq *atomic.Int64) {
	if w.orderedRate <= 0 {
		return
	}
	for i := range orderedKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runOrdered(ctx, c, w, rec, fmt.Sprintf("%s-k%d", w.proc, i), seq)
		}()
	}
}

// runOrdered enqueues jobs of key on QueueOrdered until ctx ends, in
// runs of orderedRun jobs at orderedRate / orderedKeys jobs per second on
// average: the jobs of a run one after another, each once the last was
// acknowledged (or refused), so that the order of the key's acknowledged
// ids is the order of its enqueues, which the checker holds its starts
// to. A run is enqueued faster than its first job runs, so that the
// key's later jobs wait for it (the checker fails a phase where the
// order never made two jobs of a key wait). Every other run starts with a
// KindFlaky job, which fails its first attempt and holds the key while
// it waits for its retry.
func runOrdered(ctx context.Context, c *conveyor.Client[any], w *workerFlags, rec *recorder, key string, seq *atomic.Int64) {
	interval := time.Duration(float64(orderedRun*orderedKeys) * float64(time.Second) / w.orderedRate)
	for n := 0; ; n++ {
		// Jittered, so that the keys of one producer do not enqueue in
		// lockstep; the first run at once, so that every key has one
		// however short the phase.
		wait := interval/2 + rand.N(interval)
		if n == 0 {
			wait = rand.N(min(interval, time.Second))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		for i := 0; i < orderedRun && ctx.Err() == nil; i++ {
			tok := fmt.Sprintf("%s:%d", w.proc, seq.Add(1))
			spec := jobSpec{queue: QueueOrdered, kind: KindWork, ms: w.orderedMinMS + rand.IntN(max(1, w.orderedMaxMS-w.orderedMinMS+1)), lkey: key}
			if i == 0 && n%2 == 0 {
				// As long as the longest, so that the rest of the run
				// has been acknowledged, and waits, when it fails.
				spec.kind, spec.ms = KindFlaky, w.orderedMaxMS
			}
			// Not tied to ctx, like every enqueue of a producer.
			ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := c.EnqueueMany(ectx, []conveyor.EnqueueItem{{Args: conveyor.RawArgs{KindName: spec.kind, JSON: encodePayload(tok, spec)}, Opts: spec.opts()}})
			cancel()
			if err != nil {
				rec.write(line{T: lineAmbig, Tok: tok, Err: err.Error()})
				continue
			}
			rec.write(line{T: lineEnq, Job: res[0].ID, Tok: tok, Kind: spec.kind})
		}
	}
}

// batchSize is how many jobs a producer's batch holds.
const batchSize = 5

// enqueueBatch enqueues one batch of batchSize work jobs on Queue with a
// KindBatchDone callback, and records each job's enqueue and the batch.
func enqueueBatch(ctx context.Context, c *conveyor.Client[any], w *workerFlags, rec *recorder, n int64) {
	items := make([]conveyor.EnqueueItem, batchSize)
	toks := make([]string, batchSize)
	for i := range items {
		toks[i] = fmt.Sprintf("%s:%d.%d", w.proc, n, i)
		spec := jobSpec{queue: Queue, kind: KindWork, ms: w.minMS + rand.IntN(max(1, w.maxMS-w.minMS+1))}
		items[i] = conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: spec.kind, JSON: encodePayload(toks[i], spec)}, Opts: spec.opts()}
	}
	cb := conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: KindBatchDone,
		JSON: encodePayload(fmt.Sprintf("%s:%d.cb", w.proc, n), jobSpec{kind: KindBatchDone, ms: 5})},
		Opts: &conveyor.EnqueueOpts{Queue: Queue}}
	// Not tied to ctx, like the jobs' enqueues.
	ectx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	bid, ids, err := c.EnqueueBatch(ectx, items, cb)
	cancel()
	if err != nil {
		for _, tok := range toks {
			rec.write(line{T: lineAmbig, Tok: tok, Err: err.Error()})
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
		return
	}
	for i, id := range ids {
		rec.write(line{T: lineEnq, Job: id, Tok: toks[i], Kind: KindWork})
	}
	rec.write(line{T: lineBatch, Bat: bid, IDs: ids})
}

// txBeginner opens transactions of the type EnqueueTx takes on the
// backend.
type txBeginner struct {
	pg   *pgxpool.Pool
	sql  *sql.DB
	path string // SQLite: the database file
}

type txHandle struct {
	tx       any
	commit   func(context.Context) error
	rollback func(context.Context) error
}

func openTxBeginner(ctx context.Context, dsn string, n int) (*txBeginner, error) {
	switch backendOf(dsn) {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(n)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return &txBeginner{pg: p}, nil
	default:
		db, err := openSQL(dsn, true)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(n)
		b := &txBeginner{sql: db}
		if backendOf(dsn) == "sqlite" {
			b.path, _ = sqlitePath(dsn)
		}
		return b, nil
	}
}

func (b *txBeginner) begin(ctx context.Context) (*txHandle, error) {
	if b.pg != nil {
		tx, err := b.pg.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &txHandle{tx: tx, commit: tx.Commit, rollback: tx.Rollback}, nil
	}
	if b.path != "" {
		// The application's own handle begins BEGIN IMMEDIATE
		// transactions back to back; on SQLite it lets conveyor's pending
		// lease renewals go first, as the README tells applications to.
		if err := lab.YieldToLeases(ctx, b.path); err != nil {
			return nil, err
		}
	}
	tx, err := b.sql.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &txHandle{tx: tx,
		commit:   func(context.Context) error { return tx.Commit() },
		rollback: func(context.Context) error { return tx.Rollback() }}, nil
}

func (b *txBeginner) close() {
	if b.pg != nil {
		b.pg.Close()
	}
	if b.sql != nil {
		b.sql.Close()
	}
}

func runTxProducer(ctx context.Context, w *workerFlags, rec *recorder, logger *slog.Logger, stdout io.Writer) error {
	c, err := openMigrated(ctx, w.dsn, &conveyor.Config{TablePrefix: w.prefix, Logger: logger}, connect.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	tb, err := openTxBeginner(ctx, w.dsn, w.goroutines)
	if err != nil {
		return err
	}
	defer tb.close()
	fmt.Fprintln(stdout, "ready")
	var seq atomic.Int64
	pace(ctx, w.goroutines, w.rate/2, func(ctx context.Context) {
		bctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n := 1 + rand.IntN(3)
		items := make([]conveyor.EnqueueItem, n)
		toks := make([]string, n)
		specs := make([]jobSpec, n)
		for i := range items {
			k := seq.Add(1)
			toks[i] = fmt.Sprintf("%s:%d", w.proc, k)
			specs[i] = w.nextJob(k)
			items[i] = conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: specs[i].kind, JSON: encodePayload(toks[i], specs[i])}, Opts: specs[i].opts()}
		}
		// told records what item i was told (r: its result, nil if none).
		told := func(t string, i int, r *conveyor.EnqueueResult, begin time.Time, err error) {
			l := line{T: t, Tok: toks[i], Kind: specs[i].kind}
			if err != nil {
				l.Err = err.Error()
			}
			if r != nil {
				l.Job = r.ID
				if specs[i].unique != nil {
					l.U, l.Dup, l.B = specs[i].key(), r.Duplicate, begin.UnixNano()
				}
			}
			rec.write(l)
		}
		begin := time.Now()
		h, err := tb.begin(bctx)
		if err != nil {
			logger.Warn("torture: begin failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			return
		}
		ids, err := c.EnqueueManyTx(bctx, h.tx, items)
		if err != nil {
			_ = h.rollback(bctx)
			for i := range toks {
				told(lineRollback, i, nil, begin, err)
			}
			return
		}
		// Other transactions run meanwhile: hold this one open a moment.
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		if rand.Float64() < w.rollback {
			if err := h.rollback(bctx); err != nil {
				// A failed rollback: the transaction is gone either way
				// (nothing was committed).
				logger.Warn("torture: rollback failed", "err", err)
			}
			for i := range toks {
				told(lineRollback, i, &ids[i], begin, nil)
			}
			return
		}
		if err := h.commit(bctx); err != nil {
			for i := range toks {
				told(lineAmbig, i, nil, begin, err)
			}
			return
		}
		for i := range ids {
			told(lineEnq, i, &ids[i], begin, nil)
		}
	})
	return nil
}

// recordSlowRenewals records each lease renewal of c's engine slower
// than the heartbeat interval (lab.OnSlowRenewal) as a slowbeat line, at
// the time it returned, the checker's evidence for an attempt cut off
// because its renewal came back too late (see Input.SlowRenewals).
func recordSlowRenewals(c *conveyor.Client[any], rec *recorder) {
	lab.OnSlowRenewal(c, func(r lab.SlowRenewal) {
		rec.write(line{T: lineSlowBeat, At: r.Sent.Add(r.Took).UnixNano(), Took: int64(r.Took)})
	})
}

// recordLateClaims records each claim of c's engine that came back later
// than the heartbeat interval (lab.OnLateClaim) as a late line,
// before the claimed jobs' handlers start: the checker's evidence for an
// attempt cut off because its claim left it too little of its lease (see
// Input.LateClaims).
func recordLateClaims(c *conveyor.Client[any], rec *recorder) {
	lab.OnLateClaim(c, func(r lab.LateClaim) { rec.write(lateClaimLine(r)) })
}

// lateClaimLine is the record line of a late claim.
func lateClaimLine(r lab.LateClaim) line {
	l := line{T: lineLate, At: r.Back.UnixNano(), B: r.Sent.UnixNano(), Dl: r.Deadline.UnixNano()}
	for _, j := range r.Jobs {
		l.IDs, l.Atts = append(l.IDs, j.ID), append(l.Atts, j.Attempt)
	}
	return l
}
