package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor"
)

// Job is the bench's job: its sequence number, optional padding and
// simulated work.
type Job struct {
	Seq    int64  `json:"seq"`
	Pad    string `json:"pad,omitempty"`
	WorkUS int64  `json:"work_us,omitempty"`
	Spin   bool   `json:"spin,omitempty"`
}

// Kind is "bench".
func (Job) Kind() string { return "bench" }

// Options select a workload and its parameters.
type Options struct {
	DSN      string
	Workload string // drain, flow, latency
	// Workers is the queue's MaxWorkers.
	Workers int
	// Jobs: drain: jobs pre-inserted; latency: jobs enqueued one by one.
	Jobs int
	// Duration of a flow run.
	Duration time.Duration
	// Producers and Mode ("coalesced": Enqueue per job from each producer,
	// group-committed; "batch": EnqueueMany of 100) for flow.
	Producers int
	Mode      string
	// Interval between enqueues in the latency workload.
	Interval time.Duration
	// ArgBytes pads each job's arguments; Work is simulated work per job
	// (sleep, or CPU spin when Spin).
	ArgBytes int
	Work     time.Duration
	Spin     bool
	// Config is the client configuration under test (TablePrefix is
	// replaced by a fresh one unless Keep is set).
	Config conveyor.Config
	// Keep leaves the bench tables in place.
	Keep bool
	// Progress receives a live progress line; nil for none.
	Progress io.Writer
}

// Result is one run's figures. JSON field names are stable.
type Result struct {
	Workload    string            `json:"workload"`
	Backend     string            `json:"backend"`
	Workers     int               `json:"workers"`
	Producers   int               `json:"producers,omitempty"`
	Jobs        int64             `json:"jobs"`
	Seconds     float64           `json:"seconds"`
	JobsPerS    float64           `json:"jobs_per_s"`
	P50ms       float64           `json:"p50_ms"`
	P95ms       float64           `json:"p95_ms"`
	P99ms       float64           `json:"p99_ms"`
	Maxms       float64           `json:"max_ms"`
	Lost        int64             `json:"lost"`
	Duplicates  int64             `json:"duplicates"`
	ReorderMax  int64             `json:"reorder_max"`
	ReorderP99  int64             `json:"reorder_p99"`
	ReorderHist [5]int64          `json:"reorder_hist"`
	Waits       map[string]any    `json:"waits"`
	Settings    map[string]string `json:"settings"`
	Counters    map[string]int64  `json:"counters"`
	// Latencies are the raw samples (not in JSON) for charts.
	Latencies []time.Duration `json:"-"`
}

func (o *Options) defaults() {
	if o.Workload == "" {
		o.Workload = "drain"
	}
	if o.Workers == 0 {
		o.Workers = 100
	}
	if o.Jobs == 0 {
		switch o.Workload {
		case "latency":
			o.Jobs = 1000
		default:
			o.Jobs = 100000
		}
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Producers == 0 {
		o.Producers = 64
	}
	if o.Mode == "" {
		o.Mode = "coalesced"
	}
	if o.Interval == 0 {
		o.Interval = 5 * time.Millisecond
	}
}

// Run runs one workload on a fresh set of tables and returns its figures.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	cfg := o.Config
	if !o.Keep || cfg.TablePrefix == "" {
		var b [3]byte
		_, _ = rand.Read(b[:])
		cfg.TablePrefix = "bench" + hex.EncodeToString(b[:]) + "_"
	}
	cfg.Queues = map[string]conveyor.QueueConfig{conveyor.DefaultQueue: {MaxWorkers: o.Workers}}
	c, err := conveyor.Open(ctx, o.DSN, &cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.Migrate(ctx); err != nil {
		return nil, err
	}
	if !o.Keep {
		defer c.DropTables(context.Background())
	}
	rec := NewRecorder()
	pad := strings.Repeat("x", o.ArgBytes)
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[Job]) error {
		rec.Started(j.Args.Seq, time.Now())
		if j.Args.WorkUS > 0 {
			d := time.Duration(j.Args.WorkUS) * time.Microsecond
			if j.Args.Spin {
				for end := time.Now().Add(d); time.Now().Before(end); {
				}
			} else {
				time.Sleep(d)
			}
		}
		return nil
	})); err != nil {
		return nil, err
	}
	mk := func(seq int64) Job {
		return Job{Seq: seq, Pad: pad, WorkUS: o.Work.Microseconds(), Spin: o.Spin}
	}
	res := &Result{Workload: o.Workload, Backend: c.Backend(), Workers: o.Workers}
	var elapsed time.Duration
	switch o.Workload {
	case "drain":
		elapsed, err = drain(ctx, c, rec, o, mk)
	case "latency":
		elapsed, err = latency(ctx, c, rec, o, mk)
	case "flow":
		res.Producers = o.Producers
		elapsed, err = flow(ctx, c, rec, o, mk)
	default:
		return nil, fmt.Errorf("bench: unknown workload %q (drain, flow, latency)", o.Workload)
	}
	if err != nil {
		return nil, err
	}
	if err := c.Stop(ctx); err != nil {
		return nil, err
	}
	s := rec.Summarize()
	res.Jobs = s.Jobs
	res.Seconds = elapsed.Seconds()
	res.JobsPerS = float64(s.Jobs-s.Lost) / elapsed.Seconds()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res.P50ms, res.P95ms, res.P99ms, res.Maxms = ms(s.P50), ms(s.P95), ms(s.P99), ms(s.Max)
	res.Lost, res.Duplicates = s.Lost, s.Duplicates
	res.ReorderMax, res.ReorderP99, res.ReorderHist = s.ReorderMax, s.ReorderP99, s.ReorderHist
	res.Latencies = s.Latencies
	res.Counters = c.Counters()
	res.Waits = map[string]any{}
	for k, v := range res.Counters {
		if strings.Contains(k, "busy") || strings.Contains(k, "deadlock") || strings.Contains(k, "lock") {
			res.Waits[k] = v
		}
	}
	res.Settings, _ = c.ServerInfo(ctx)
	if res.Settings == nil {
		res.Settings = map[string]string{}
	}
	cc := c.Config()
	res.Settings["cores"] = fmt.Sprint(runtime.NumCPU())
	res.Settings["gomaxprocs"] = fmt.Sprint(runtime.GOMAXPROCS(0))
	res.Settings["claim_batch"] = fmt.Sprint(cc.ClaimBatch)
	res.Settings["complete_batch"] = fmt.Sprint(cc.CompleteBatch)
	res.Settings["insert_batch"] = fmt.Sprint(cc.InsertBatch)
	res.Settings["lease"] = cc.Lease.String()
	if s.Lost > 0 || s.Duplicates > 0 {
		return res, fmt.Errorf("bench: %d lost and %d duplicate executions", s.Lost, s.Duplicates)
	}
	return res, nil
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
func waitCompleted(ctx context.Context, c *conveyor.Client, n int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for c.Counters()["completed"] < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: only %d of %d jobs completed after %v", c.Counters()["completed"], n, limit)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func drain(ctx context.Context, c *conveyor.Client, rec *Recorder, o Options, mk func(int64) Job) (time.Duration, error) {
	const chunk = 10000
	for off := 0; off < o.Jobs; off += chunk {
		n := min(chunk, o.Jobs-off)
		first := rec.Reserve(n)
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i))}
		}
		t0 := time.Now()
		if _, err := c.EnqueueBulk(ctx, items); err != nil {
			return 0, err
		}
		t1 := time.Now()
		for i := range items {
			rec.Enqueued(first+int64(i), t0, t1)
		}
	}
	stop := make(chan struct{})
	wg := progress(o.Progress, "drain", int64(o.Jobs), func() int64 { return c.Counters()["completed"] }, stop)
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	err := waitCompleted(ctx, c, int64(o.Jobs), 10*time.Minute)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}

func latency(ctx context.Context, c *conveyor.Client, rec *Recorder, o Options, mk func(int64) Job) (time.Duration, error) {
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	time.Sleep(200 * time.Millisecond) // let every worker park
	stop := make(chan struct{})
	wg := progress(o.Progress, "latency", int64(o.Jobs), func() int64 { return c.Counters()["completed"] }, stop)
	t0 := time.Now()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for i := 0; i < o.Jobs; i++ {
		<-tick.C
		seq := rec.Next()
		call := time.Now()
		if _, err := c.Enqueue(ctx, mk(seq), nil); err != nil {
			close(stop)
			wg.Wait()
			return 0, err
		}
		rec.Enqueued(seq, call, time.Now())
	}
	err := waitCompleted(ctx, c, int64(o.Jobs), time.Minute)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}

func flow(ctx context.Context, c *conveyor.Client, rec *Recorder, o Options, mk func(int64) Job) (time.Duration, error) {
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	stop := make(chan struct{})
	wg := progress(o.Progress, "flow", 0, func() int64 { return c.Counters()["completed"] }, stop)
	t0 := time.Now()
	end := t0.Add(o.Duration)
	var enq atomic.Int64
	var perr error
	var once sync.Once
	var pwg sync.WaitGroup
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
					if _, err = c.Enqueue(ctx, mk(seq), nil); err == nil {
						rec.Enqueued(seq, call, time.Now())
						enq.Add(1)
					}
				case "batch":
					const b = 100
					first := rec.Reserve(b)
					items := make([]conveyor.EnqueueItem, b)
					for i := range items {
						items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i))}
					}
					call := time.Now()
					if _, err = c.EnqueueMany(ctx, items); err == nil {
						now := time.Now()
						for i := range items {
							rec.Enqueued(first+int64(i), call, now)
						}
						enq.Add(b)
					}
				default:
					err = fmt.Errorf("bench: unknown producer mode %q (coalesced, batch)", o.Mode)
				}
				if err != nil {
					once.Do(func() { perr = err })
					return
				}
			}
		}()
	}
	pwg.Wait()
	if perr != nil {
		close(stop)
		wg.Wait()
		return 0, perr
	}
	err := waitCompleted(ctx, c, enq.Load(), 5*time.Minute)
	el := time.Since(t0)
	close(stop)
	wg.Wait()
	return el, err
}
