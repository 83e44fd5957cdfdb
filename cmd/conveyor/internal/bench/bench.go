package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
)

// Job is the bench's job: its sequence number, optional padding and
// simulated work.
type Job struct {
	// Seq is the job's sequence number in its recorder (enqueue rank).
	Seq int64 `json:"seq"`
	// Pad pads the arguments to Options.ArgBytes.
	Pad string `json:"pad,omitempty"`
	// WorkUS is the simulated work in microseconds.
	WorkUS int64 `json:"work_us,omitempty"`
	// Spin simulates the work by spinning the CPU instead of sleeping.
	Spin bool `json:"spin,omitempty"`
}

// Kind is "bench".
func (Job) Kind() string { return "bench" }

// Options select a workload and its parameters. Zero fields take the
// workload's defaults (see each field).
type Options struct {
	// DSN names the database, as for conveyor.Open.
	DSN string
	// Workload is drain (default), flow, latency, sweep, isolation,
	// claims, steady, dashboard, http-enqueue or http-drain.
	Workload string
	// Workers is the queue's MaxWorkers; for claims, the number of
	// claiming goroutines. Default 100 (claims: 10).
	Workers int
	// Jobs: drain and claims: jobs pre-inserted (default 100,000; claims
	// 10,000); latency: jobs enqueued one by one (default 1,000);
	// isolation: cold-queue jobs per phase (default 300); dashboard: jobs
	// loaded (default 100,000); http-enqueue and http-drain: jobs
	// enqueued or drained per run (default 100,000).
	Jobs int
	// Duration of a flow run. Default 10s.
	Duration time.Duration
	// Producers enqueue concurrently in flow (default 64) and keep the hot
	// queue full in isolation (default 16); in http-enqueue they are the
	// concurrent callers and in http-drain the HTTP workers (default 4).
	Producers int
	// Mode is how producers enqueue: "coalesced" (Enqueue per job,
	// group-committed by the client; flow's default), "batch"
	// (EnqueueMany of 100; isolation's default, which keeps the hot queue
	// saturated where coalesced calls let it run dry) or "bulk" (flow:
	// EnqueueBulk of 100, the streaming insert, to compare with coalesced).
	Mode string
	// Herd makes drain and claims insert every job scheduled for one
	// future moment, then start the workers: all become due at once (the
	// thundering herd that deadlocks pessimistic claims).
	Herd bool
	// SeparateProducer makes the latency workload enqueue through a second
	// client, as another process would: no in-process wake-up, so what is
	// measured is LISTEN/NOTIFY on PostgreSQL and the poll elsewhere.
	SeparateProducer bool
	// Interval between enqueues in latency (default 5ms) and between
	// cold-queue jobs in isolation (default 10ms).
	Interval time.Duration
	// ArgBytes pads each job's arguments to about this many bytes.
	// Default 0.
	ArgBytes int
	// Work is simulated work per job (a sleep, or a CPU spin when Spin).
	// Default 0.
	Work time.Duration
	// Spin simulates Work by spinning the CPU.
	Spin bool
	// Of is the workload a sweep repeats: latency (default), drain or
	// flow.
	Of string
	// Counts are the worker counts of a sweep. Default 1, 10, 100, 200,
	// 300.
	Counts []int
	// Strategies are the claims compared by the claims workload, in order.
	// Default all of ClaimStrategies except conveyor-b1.
	Strategies []string
	// Window is how many of the first available jobs the random
	// optimistic claim picks among. Default 2*Workers.
	Window int
	// Timeout bounds each run; a run that has not finished by then fails
	// with the jobs not done reported lost. Default 5m.
	Timeout time.Duration
	// Config is the client configuration under test (TablePrefix is
	// replaced by a fresh one unless Keep is set; Queues by the
	// workload's).
	Config conveyor.Config
	// Connect is the connections' backend settings (pool size, MySQL
	// claim strategy, SQLite synchronous mode).
	Connect connect.Options
	// Unique makes flow's producers enqueue unique jobs (unique by
	// arguments, which differ from job to job: nothing is a duplicate),
	// to measure what the unique path costs against plain jobs.
	Unique bool
	// Middleware installs this many pass-through work and enqueue
	// middlewares, to measure what the chain costs.
	Middleware int
	// Rate is steady's offered rate in jobs per second. Default 1000.
	Rate float64
	// Every is steady's reporting window. Default 30s.
	Every time.Duration
	// HoldXmin makes steady hold a read transaction open on a connection
	// of its own, after reading the run's tables (as pg_dump would), from
	// before the load until HoldFor.
	HoldXmin bool
	// HoldFor is how long the held transaction lasts. Default Duration.
	HoldFor time.Duration
	// Recovery is how long steady's load goes on after Duration (and
	// after the held transaction ended, when HoldFor is Duration).
	// Default 0.
	Recovery time.Duration
	// Limits are set on the run's queue before it starts (drain, flow,
	// latency); the limits workload sets its own.
	Limits conveyor.QueueLimits
	// Keep leaves the bench tables in place.
	Keep bool
	// Progress receives a live progress line; nil for none.
	Progress io.Writer
	// Emit, if set, receives each run's result as soon as the run ends
	// (sweep, isolation and claims make several runs).
	Emit func(*Result)

	label string // progress label
	// keyOf, if set, gives drain's job seq its key (EnqueueOpts.Key).
	keyOf func(seq int64) string
	// flood is the keys-flood workload's count of jobs of one key
	// enqueued before the small keys' (0: none).
	flood int
	// weights, if set, are the run's queue's key weights (SetKeyWeights),
	// set with Limits; with keyOf, the run reports each key's share of
	// the starts while every key had jobs (Result.KeyShares).
	weights map[string]int
	// held, if set, is called once a steady run's held transaction is
	// open and its load is about to start (tests stop the run then).
	held func()
}

// Result is one run's figures. JSON field names are stable.
type Result struct {
	// Workload is the workload run: drain, flow, latency, sweep,
	// isolation, claims or steady.
	Workload string `json:"workload"`
	// Of is the workload a sweep run repeats.
	Of string `json:"of,omitempty"`
	// Phase of an isolation run: cold-idle, cold-under-hot or hot; of an
	// http-enqueue or http-drain run: in-process or http; of a dashboard
	// run: the page timed (P50ms and Maxms are then its request times).
	Phase string `json:"phase,omitempty"`
	// Strategy of a claims run.
	Strategy string `json:"strategy,omitempty"`
	// Unique: a flow run whose jobs were unique (Options.Unique).
	Unique bool `json:"unique,omitempty"`
	// Middleware is the number of pass-through middlewares installed.
	Middleware int `json:"middleware,omitempty"`
	// Backend is sqlite, postgres or mysql.
	Backend string `json:"backend"`
	// Workers is the queue's MaxWorkers (claims: claiming goroutines).
	Workers int `json:"workers"`
	// Producers is the number of enqueuing goroutines (flow, isolation).
	Producers int `json:"producers,omitempty"`
	// Jobs is the number of jobs the run enqueued and checked.
	Jobs int64 `json:"jobs"`
	// Seconds is the measured time.
	Seconds float64 `json:"seconds"`
	// JobsPerS is completed jobs per second of measured time.
	JobsPerS float64 `json:"jobs_per_s"`
	// EnqueuedPerS is, in flow, the jobs the producers enqueued per second
	// of the time they ran (--duration): the enqueue rate on its own, where
	// JobsPerS is bounded by the slower of enqueueing and draining.
	EnqueuedPerS float64 `json:"enqueued_per_s,omitempty"`
	// Mode is flow's producer mode (coalesced, batch or bulk).
	Mode string `json:"mode,omitempty"`
	// P50ms, P95ms, P99ms and Maxms are percentiles of the
	// enqueue-commit-to-start latency, in milliseconds.
	P50ms float64 `json:"p50_ms"`
	P95ms float64 `json:"p95_ms"` // see P50ms
	P99ms float64 `json:"p99_ms"` // see P50ms
	Maxms float64 `json:"max_ms"` // see P50ms
	// CallP50ms and CallP99ms are percentiles of the enqueue-call-to-start
	// latency (which includes the enqueue's commit).
	CallP50ms float64 `json:"call_p50_ms"`
	CallP99ms float64 `json:"call_p99_ms"` // see CallP50ms
	// Lost counts jobs enqueued and never started.
	Lost int64 `json:"lost"`
	// LostSeqs names up to 100 lost jobs by sequence number.
	LostSeqs []int64 `json:"lost_seqs,omitempty"`
	// Duplicates counts executions beyond each job's first.
	Duplicates int64 `json:"duplicates"`
	// DuplicateSeqs names up to 100 jobs that ran more than once.
	DuplicateSeqs []int64 `json:"duplicate_seqs,omitempty"`
	// ReorderMax and ReorderP99 are the maximum and p99 of the distance
	// between a job's enqueue rank and its start rank.
	ReorderMax int64 `json:"reorder_max"`
	ReorderP99 int64 `json:"reorder_p99"` // see ReorderMax
	// ReorderHist counts jobs by displacement: 0, 1-9, 10-99, 100-999,
	// 1000+ places.
	ReorderHist [5]int64 `json:"reorder_hist"`
	// Waits is the contention seen inside the database during the run:
	// "events" (map of WaitEvent by wait event, sampled every
	// SampleInterval on PostgreSQL and MySQL), deltas of the server's
	// counters (deadlocks, row lock waits...), "busy_retries" on SQLite,
	// and the client's own retry counters under "client".
	Waits map[string]any `json:"waits"`
	// Settings that decide the result: backend, server version,
	// durability, conveyor's configuration, cores.
	Settings map[string]string `json:"settings"`
	// Counters are the client's counters at the end of the run.
	Counters map[string]int64 `json:"counters,omitempty"`
	// HotJobsPerS is the hot queue's throughput during an isolation
	// run's loaded phase.
	HotJobsPerS float64 `json:"hot_jobs_per_s,omitempty"`
	// HotBacklogMin is the smallest hot-queue backlog sampled during the
	// loaded phase: above zero, the hot queue was saturated throughout.
	HotBacklogMin *int64 `json:"hot_backlog_min,omitempty"`
	// Claims are a claims run's contention figures.
	Claims *ClaimFigures `json:"claims,omitempty"`
	// Steady are a steady run's figures over time.
	Steady *SteadyFigures `json:"steady,omitempty"`
	// Limits are the queue limits the run was held to (nil: none).
	Limits *conveyor.QueueLimits `json:"limits,omitempty"`
	// PeakRunning is the most executions under way at once, counted by
	// the bench's handler outside the queue.
	PeakRunning int64 `json:"peak_running"`
	// MaxStartsInWindow, for a rate-limited run, is the most first claims
	// within any window of the rate's period, by the database's clock
	// (the jobs' attempted_at).
	MaxStartsInWindow int64 `json:"max_starts_in_window,omitempty"`
	// KeyMaxStartsInWindow, for a run with a rate per key, is the most
	// first claims of one key within any window of the key rate's
	// period, by the database's clock.
	KeyMaxStartsInWindow int64 `json:"key_max_starts_in_window,omitempty"`
	// Allowed, for a run held below its workers by a limit, is the
	// jobs/s the limit allows (slots / work per job, or the rate).
	Allowed float64 `json:"allowed_jobs_per_s,omitempty"`
	// KeyPeakRunning is the most executions of one job key under way at
	// once, counted by the handlers outside the queue (0: no keyed job).
	KeyPeakRunning int64 `json:"key_peak_running,omitempty"`
	// KeyReorders counts executions that started after a job of their
	// key enqueued later had started (an ordered key must have none).
	KeyReorders int64 `json:"key_reorders,omitempty"`
	// Keys is the number of distinct job keys of a keys run's phase.
	Keys int `json:"keys,omitempty"`
	// Reference is the phase of the same run a keys phase is compared to.
	Reference string `json:"reference,omitempty"`
	// SmallP50ms and SmallP99ms, in a keys run's flood phases, are the
	// percentiles of the small keys' jobs' enqueue-commit-to-start
	// latency.
	SmallP50ms float64 `json:"small_p50_ms,omitempty"`
	SmallP99ms float64 `json:"small_p99_ms,omitempty"` // see SmallP50ms
	// SmallJobs is the number of small keys' jobs those percentiles
	// cover (started ones): a percentile of 0 is a job started before
	// its Enqueue returned (claimed by its own insert), not a gap.
	SmallJobs int64 `json:"small_jobs,omitempty"`
	// KeyWeights are the key weights of a keys run's fair-weights phase.
	KeyWeights map[string]int `json:"key_weights,omitempty"`
	// KeyShares, in a keys run's fair-weights phase, are the starts of
	// each key while every key still had jobs to start: up to the first
	// claim of the last job of the key that ran out first, by the
	// database's clock.
	KeyShares map[string]int64 `json:"key_shares,omitempty"`
	// ShareRatio is the heaviest key's share of KeyShares over the
	// lightest's, which the weights put at their ratio.
	ShareRatio float64 `json:"share_ratio,omitempty"`
	// PickupP50ms and PickupP99ms, for a run whose limits bind, are the
	// median and 99th percentile of how long a job freed by the limits
	// waited to start: under a concurrency limit, from the end of an
	// execution to the start of the one it made room for, by the
	// handlers' clock (a slot passes from one job to the next inside a
	// process, without a write the database could date); under a rate,
	// from the moment the window had room to the claim, by the
	// database's clock (see pickup). PickupN is how many waits they
	// summarize.
	PickupP50ms float64 `json:"pickup_p50_ms,omitempty"`
	PickupP99ms float64 `json:"pickup_p99_ms,omitempty"`
	PickupN     int     `json:"pickup_n,omitempty"`
	// SlotsBusy, for a run whose MaxRunning binds, is the share of the
	// limit's slots' time spent in executions, from the first start to
	// the last end, by the handlers' clock: the rate the slots allow for
	// the jobs as they ran (a sleep of 5ms takes longer on a busy
	// machine) is reached at 1.
	SlotsBusy float64 `json:"slots_busy,omitempty"`
	// Latencies are the raw samples (not in JSON) for charts.
	Latencies []time.Duration `json:"-"`
}

// fill copies a summary's figures into the result; elapsed is the
// measured time. It returns an error if jobs were lost or duplicated.
func (r *Result) fill(s Summary, elapsed time.Duration) error {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r.Jobs = s.Jobs
	r.Seconds = elapsed.Seconds()
	if elapsed > 0 {
		r.JobsPerS = float64(s.Jobs-s.Lost) / elapsed.Seconds()
	}
	r.P50ms, r.P95ms, r.P99ms, r.Maxms = ms(s.P50), ms(s.P95), ms(s.P99), ms(s.Max)
	r.CallP50ms, r.CallP99ms = ms(s.CallP50), ms(s.CallP99)
	r.Lost, r.Duplicates = s.Lost, s.Duplicates
	r.LostSeqs, r.DuplicateSeqs = s.LostSeqs, s.DuplicateSeqs
	r.ReorderMax, r.ReorderP99, r.ReorderHist = s.ReorderMax, s.ReorderP99, s.ReorderHist
	r.Latencies = s.Latencies
	if s.Lost > 0 || s.Duplicates > 0 {
		return fmt.Errorf("bench: %s: %d lost and %d duplicate executions (first lost %v, first duplicated %v)",
			r.label(), s.Lost, s.Duplicates, s.LostSeqs, s.DuplicateSeqs)
	}
	return nil
}

func (r *Result) label() string {
	l := r.Workload
	for _, x := range []string{r.Of, r.Phase, r.Strategy} {
		if x != "" {
			l += "/" + x
		}
	}
	return l
}

func (o *Options) defaults() {
	if o.Workload == "" {
		o.Workload = "drain"
	}
	if o.Workers == 0 {
		o.Workers = 100
		if o.Workload == "claims" {
			o.Workers = 10
		}
	}
	if o.Jobs == 0 {
		switch o.Workload {
		case "latency":
			o.Jobs = 1000
		case "isolation":
			o.Jobs = 300
		case "claims":
			o.Jobs = 10000
		case "sweep":
			// left to the repeated workload
		default:
			o.Jobs = 100000
		}
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Producers == 0 && o.Workload != "sweep" {
		switch o.Workload {
		case "isolation":
			o.Producers = 16
		case "steady":
			o.Producers = 8
		case "http-enqueue", "http-drain":
			o.Producers = 4
		default:
			o.Producers = 64
		}
	}
	if o.Mode == "" {
		// Coalesced Enqueue calls cannot keep a hot queue's workers busy
		// (the backlog runs dry); batches can.
		o.Mode = "coalesced"
		if o.Workload == "isolation" {
			o.Mode = "batch"
		}
	}
	if o.Interval == 0 && o.Workload != "sweep" {
		o.Interval = 5 * time.Millisecond
		if o.Workload == "isolation" {
			o.Interval = 10 * time.Millisecond
		}
	}
	if o.Of == "" {
		o.Of = "latency"
	}
	if len(o.Counts) == 0 {
		o.Counts = []int{1, 10, 100, 200, 300}
	}
	if len(o.Strategies) == 0 {
		o.Strategies = []string{"conveyor", "pessimistic", "optimistic", "random"}
	}
	if o.Window == 0 {
		o.Window = 2 * o.Workers
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Rate == 0 {
		o.Rate = 1000
	}
	if o.Every == 0 {
		o.Every = 30 * time.Second
	}
	if o.label == "" {
		o.label = o.Workload
	}
}

// RunAll runs the workload o selects, including the composite ones
// (sweep, isolation, claims), and returns one result per run. Results
// with lost or duplicated jobs are returned together with an error.
func RunAll(ctx context.Context, o Options) ([]*Result, error) {
	o.defaults()
	if o.Mode != "coalesced" && o.Mode != "batch" && (o.Mode != "bulk" || o.Workload == "isolation") {
		return nil, fmt.Errorf("bench: unknown producer mode %q (coalesced, batch; flow also bulk)", o.Mode)
	}
	var rs []*Result
	var err error
	switch o.Workload {
	case "drain", "flow", "latency":
		var r *Result
		r, err = Run(ctx, o)
		if r != nil {
			rs = append(rs, r)
		}
	case "sweep":
		rs, err = sweep(ctx, o)
	case "isolation":
		rs, err = isolation(ctx, o)
	case "claims":
		rs, err = claims(ctx, o)
	case "steady":
		rs, err = steady(ctx, o)
		for _, r := range rs {
			o.emit(r)
		}
	case "dashboard":
		rs, err = dashboard(ctx, o)
	case "http-enqueue":
		rs, err = httpEnqueue(ctx, o)
	case "http-drain":
		rs, err = httpDrain(ctx, o)
	case "limits":
		rs, err = limits(ctx, o)
	case "keys":
		rs, err = keysWorkload(ctx, o)
	default:
		return nil, fmt.Errorf("bench: unknown workload %q (drain, flow, latency, sweep, isolation, claims, steady, dashboard, http-enqueue, http-drain, limits, keys)", o.Workload)
	}
	return rs, err
}

func (o Options) emit(r *Result) {
	if o.Emit != nil && r != nil {
		o.Emit(r)
	}
}

// benchConfig returns the client configuration of a run: o.Config on a
// fresh table prefix (unless Keep) with the given queues.
func benchConfig(o Options, queues map[string]int) conveyor.Config {
	cfg := o.Config
	if !o.Keep || cfg.TablePrefix == "" {
		cfg.TablePrefix = freshPrefix("bench")
	}
	cfg.Queues = map[string]conveyor.QueueConfig{}
	for q, w := range queues {
		cfg.Queues[q] = conveyor.QueueConfig{MaxWorkers: w}
	}
	for range o.Middleware {
		cfg.WorkMiddleware = append(cfg.WorkMiddleware, func(ctx context.Context, _ *conveyor.JobInfo, next func(context.Context) error) error {
			return next(ctx)
		})
		cfg.EnqueueMiddleware = append(cfg.EnqueueMiddleware, func(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
			return next(ctx, items)
		})
	}
	return cfg
}

// freshPrefix returns base followed by six random hex digits and "_".
func freshPrefix(base string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return base + hex.EncodeToString(b[:]) + "_"
}

// openClient opens and migrates a client on fresh tables and registers
// the bench worker, which records each execution in the recorder of the
// job's queue and then performs the simulated work.
func openClient(ctx context.Context, o Options, queues map[string]int, recs map[string]*Recorder) (*conveyor.Client[any], error) {
	cfg := benchConfig(o, queues)
	c, err := connect.OpenWith(ctx, o.DSN, &cfg, o.Connect)
	if err != nil {
		return nil, err
	}
	if _, err := c.Migrate(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[Job]) error {
		rec := recs[j.Queue]
		if rec == nil {
			return conveyor.JobCancel(fmt.Errorf("bench: job in unexpected queue %q", j.Queue))
		}
		rec.Started(j.Args.Seq, time.Now())
		rec.Claimed(j.Args.Seq, j.AttemptedAt)
		rec.Begin()
		if j.Key != "" {
			rec.KeyBegin(j.Key, j.Args.Seq)
		}
		simulate(time.Duration(j.Args.WorkUS)*time.Microsecond, j.Args.Spin)
		if j.Key != "" {
			rec.KeyEnd(j.Key)
		}
		rec.Ended(j.Args.Seq, time.Now())
		rec.End()
		return nil
	})); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// simulate performs d of simulated work: a sleep, or a CPU spin.
func simulate(d time.Duration, spin bool) {
	if d <= 0 {
		return
	}
	if spin {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
		return
	}
	time.Sleep(d)
}

// slotsBusy is the share of m slots' time, from the first start to the
// last end, that the executions (starts[i] to ends[i], unix ns) took.
func slotsBusy(starts, ends []int64, m int) float64 {
	if len(starts) == 0 || m <= 0 {
		return 0
	}
	first, last := slices.Min(starts), slices.Max(ends)
	var busy int64
	for i := range starts {
		busy += ends[i] - starts[i]
	}
	if last <= first {
		return 0
	}
	return float64(busy) / (float64(m) * float64(last-first))
}

// jobMaker returns the function that builds job seq's arguments.
func jobMaker(o Options) func(int64) Job {
	pad := strings.Repeat("x", o.ArgBytes)
	return func(seq int64) Job {
		return Job{Seq: seq, Pad: pad, WorkUS: o.Work.Microseconds(), Spin: o.Spin}
	}
}

// closeClient ends a run's client: stop, read counters and settings, drop
// the tables (unless Keep), close. It fills res.Counters and res.Settings
// and returns the first error.
func closeClient(ctx context.Context, c *conveyor.Client[any], o Options, res *Result) error {
	err := c.Stop(ctx)
	res.Counters = c.Counters().Map()
	if o.Limits != (conveyor.QueueLimits{}) && err == nil {
		// After Stop: every outcome is written.
		waits, perr := pickup(ctx, c, o.Limits, o.Workers)
		slices.Sort(waits)
		res.PickupP50ms, res.PickupP99ms, res.PickupN = quantile(waits, 0.5), quantile(waits, 0.99), len(waits)
		err = perr
	}
	res.Settings = clientSettings(ctx, c, o.Connect)
	if !o.Keep {
		err = errors.Join(err, lab.DropTables(context.WithoutCancel(ctx), c))
	}
	return errors.Join(err, c.Close())
}

// clientSettings describes the server and the client's configuration.
func clientSettings(ctx context.Context, c *conveyor.Client[any], conn connect.Options) map[string]string {
	s, err := c.ServerInfo(ctx)
	if s == nil {
		s = map[string]string{}
	}
	if err != nil {
		s["server_info_error"] = err.Error()
	}
	cc := c.Config()
	s["cores"] = fmt.Sprint(runtime.NumCPU())
	s["gomaxprocs"] = fmt.Sprint(runtime.GOMAXPROCS(0))
	s["claim_batch"] = fmt.Sprint(cc.ClaimBatch)
	s["complete_batch"] = fmt.Sprint(cc.CompleteBatch)
	s["insert_batch"] = fmt.Sprint(cc.InsertBatch)
	s["lease"] = cc.Lease.String()
	switch c.Backend() {
	case "postgres":
		s["listen_poll"] = cc.ListenPoll.String()
	default:
		s["poll"] = cc.PollMin.String() + ".." + cc.PollMax.String()
	}
	if conn.PoolSize > 0 {
		s["pool_size"] = fmt.Sprint(conn.PoolSize)
	}
	if conn.ClaimStrategy != "" {
		s["claim_strategy"] = conn.ClaimStrategy
	}
	return s
}

// Run runs one drain, flow or latency workload on a fresh set of tables
// and returns its figures. A run with lost or duplicated jobs returns its
// result and an error.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	rec := NewRecorder()
	c, err := openClient(ctx, o, map[string]int{conveyor.DefaultQueue: o.Workers}, map[string]*Recorder{conveyor.DefaultQueue: rec})
	if err != nil {
		return nil, err
	}
	defer c.Close() // in case of an early return; closing twice is harmless
	if !o.Limits.IsZero() {
		if err := c.SetQueueLimits(ctx, conveyor.DefaultQueue, o.Limits); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	if len(o.weights) > 0 {
		if err := c.SetKeyWeights(ctx, conveyor.DefaultQueue, o.weights); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	mk := jobMaker(o)
	res := &Result{Workload: o.Workload, Backend: c.Backend(), Workers: o.Workers, Middleware: o.Middleware}
	if !o.Limits.IsZero() {
		l := o.Limits
		res.Limits = &l
	}
	w := startWaits(ctx, o.DSN, c.Backend())
	var elapsed time.Duration
	switch o.Workload {
	case "drain":
		elapsed, err = drain(ctx, c, rec, o, mk)
	case "latency":
		elapsed, err = latency(ctx, c, rec, o, mk)
	case "keys-flood":
		elapsed, err = keysFlood(ctx, c, rec, o, mk, res)
	case "flow":
		res.Producers = o.Producers
		res.Unique = o.Unique
		res.Mode = o.Mode
		elapsed, err = flow(ctx, c, rec, o, mk, res)
	default:
		err = fmt.Errorf("bench: unknown workload %q (drain, flow, latency)", o.Workload)
	}
	w.stop()
	cerr := closeClient(ctx, c, o, res)
	res.Waits = w.finish(ctx, res.Counters)
	ferr := res.fill(rec.Summarize(), elapsed)
	res.PeakRunning = rec.Peak()
	res.KeyPeakRunning, res.KeyReorders = rec.KeyPeak(), rec.KeyReorders()
	if l := o.Limits; l.MaxRunning > 0 && l.MaxRunning < o.Workers {
		// A binding concurrency limit: the waits of the jobs it held,
		// from the executions' own starts and ends (see pickupWaits).
		starts, ends := rec.Executions(0, rec.Issued())
		waits := pickupWaits(starts, ends, l, true)
		slices.Sort(waits)
		res.PickupP50ms, res.PickupP99ms, res.PickupN = quantile(waits, 0.5), quantile(waits, 0.99), len(waits)
		res.SlotsBusy = slotsBusy(starts, ends, l.MaxRunning)
	}
	if o.Limits.Rate > 0 {
		res.MaxStartsInWindow = rec.MaxInWindow(0, rec.Issued(), o.Limits.RatePeriod)
	}
	if o.Limits.KeyRate > 0 && o.keyOf != nil {
		res.KeyMaxStartsInWindow = rec.KeyMaxInWindow(0, rec.Issued(), o.Limits.KeyRatePeriod, o.keyOf)
	}
	if len(o.weights) > 0 && o.keyOf != nil {
		res.KeyWeights = o.weights
		res.KeyShares = rec.KeyShares(0, rec.Issued(), o.keyOf)
		res.ShareRatio = shareRatio(res.KeyShares, o.weights)
	}
	o.emit(res)
	if err != nil || cerr != nil {
		// The figures show how far the run got; the error says why it
		// stopped (a lost/duplicate report would only repeat it).
		return res, errors.Join(err, cerr)
	}
	return res, ferr
}

// progress prints a live line until stop is closed.
func progress(w io.Writer, label string, total int64, done func() int64, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	if w == nil {
		return &wg
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		print := func() {
			d := done()
			el := time.Since(t0).Seconds()
			if total > 0 {
				fmt.Fprintf(w, "\r%s: %d/%d jobs  %.0f jobs/s  %.1fs   ", label, d, total, float64(d)/el, el)
			} else {
				fmt.Fprintf(w, "\r%s: %d jobs  %.0f jobs/s  %.1fs   ", label, d, float64(d)/el, el)
			}
		}
		for {
			select {
			case <-stop:
				print()
				fmt.Fprintln(w)
				return
			case <-tick.C:
				print()
			}
		}
	}()
	return &wg
}

// waitCompleted waits until the client has committed n completions.
func waitCompleted(ctx context.Context, c *conveyor.Client[any], n int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for c.Counters().Map()["completed"] < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: only %d of %d jobs completed after %v", c.Counters().Map()["completed"], n, limit)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func drain(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job) (time.Duration, error) {
	const chunk = 10000
	var opts *conveyor.EnqueueOpts
	var due time.Time
	if o.Herd {
		due = time.Now().Add(2 * time.Second)
		opts = &conveyor.EnqueueOpts{RunAt: due}
	}
	for off := 0; off < o.Jobs; off += chunk {
		n := min(chunk, o.Jobs-off)
		first := rec.Reserve(n)
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i)), Opts: opts}
			if o.keyOf != nil {
				ko := conveyor.EnqueueOpts{Key: o.keyOf(first + int64(i))}
				if opts != nil {
					ko.RunAt = opts.RunAt
				}
				items[i].Opts = &ko
			}
		}
		t0 := time.Now()
		if _, err := c.EnqueueBulk(ctx, items); err != nil {
			return 0, err
		}
		t1 := time.Now()
		if o.Herd { // latency counts from the moment all became due
			t0, t1 = due, due
		}
		for i := range items {
			rec.Enqueued(first+int64(i), t0, t1)
		}
	}
	stop := make(chan struct{})
	wg := progress(o.Progress, o.label, int64(o.Jobs), func() int64 { return c.Counters().Map()["completed"] }, stop)
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	if o.Herd {
		time.Sleep(time.Until(due))
		t0 = due
	}
	err := waitCompleted(ctx, c, int64(o.Jobs), o.Timeout)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}

func latency(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job) (time.Duration, error) {
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	producer := c
	if o.SeparateProducer {
		cfg := c.Config()
		p, err := connect.OpenWith(ctx, o.DSN, &cfg, o.Connect)
		if err != nil {
			return 0, err
		}
		defer p.Close()
		producer = p
	}
	time.Sleep(time.Second) // let every worker park and idle polls back off
	stop := make(chan struct{})
	wg := progress(o.Progress, o.label, int64(o.Jobs), func() int64 { return c.Counters().Map()["completed"] }, stop)
	t0 := time.Now()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for i := 0; i < o.Jobs; i++ {
		<-tick.C
		seq := rec.Next()
		call := time.Now()
		if _, err := producer.Enqueue(ctx, mk(seq), nil); err != nil {
			close(stop)
			wg.Wait()
			return 0, err
		}
		rec.Enqueued(seq, call, time.Now())
	}
	err := waitCompleted(ctx, c, int64(o.Jobs), o.Timeout)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}

func flow(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job, res *Result) (time.Duration, error) {
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	stop := make(chan struct{})
	wg := progress(o.Progress, o.label, 0, func() int64 { return c.Counters().Map()["completed"] }, stop)
	t0 := time.Now()
	end := t0.Add(o.Duration)
	var enq atomic.Int64
	var perr error
	var once sync.Once
	var pwg sync.WaitGroup
	var opts *conveyor.EnqueueOpts
	if o.Unique {
		opts = &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
	}
	for p := 0; p < o.Producers; p++ {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for time.Now().Before(end) {
				var err error
				switch o.Mode {
				case "coalesced":
					seq := rec.Next()
					call := time.Now()
					if _, err = c.Enqueue(ctx, mk(seq), opts); err == nil {
						rec.Enqueued(seq, call, time.Now())
						enq.Add(1)
					}
				case "batch", "bulk":
					const b = 100
					first := rec.Reserve(b)
					items := make([]conveyor.EnqueueItem, b)
					for i := range items {
						items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i)), Opts: opts}
					}
					call := time.Now()
					if o.Mode == "bulk" {
						_, err = c.EnqueueBulk(ctx, items)
					} else {
						_, err = c.EnqueueMany(ctx, items)
					}
					if err == nil {
						now := time.Now()
						for i := range items {
							rec.Enqueued(first+int64(i), call, now)
						}
						enq.Add(b)
					}
				default:
					err = fmt.Errorf("bench: unknown producer mode %q (coalesced, batch, bulk)", o.Mode)
				}
				if err != nil {
					once.Do(func() { perr = err })
					return
				}
			}
		}()
	}
	pwg.Wait()
	res.EnqueuedPerS = float64(enq.Load()) / time.Since(t0).Seconds()
	if perr != nil {
		close(stop)
		wg.Wait()
		return 0, perr
	}
	err := waitCompleted(ctx, c, enq.Load(), o.Timeout)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}
