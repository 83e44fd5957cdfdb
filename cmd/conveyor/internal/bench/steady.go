package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor"
)

// SteadyFigures are a steady run's figures over time: an offered rate,
// per window, with the database's gauges at each window's end.
type SteadyFigures struct {
	// Rate is the offered rate in jobs per second: job i is due at
	// i/Rate seconds after the load began, whoever enqueues it.
	Rate float64 `json:"rate"`
	// WindowS is the reporting window and LoadS how long the load ran
	// (Options.Duration plus Options.Recovery), in seconds.
	WindowS float64 `json:"window_s"`
	LoadS   float64 `json:"load_s"` // see WindowS
	// Offered is the number of jobs due during the load, Enqueued those
	// the producers enqueued, Shortfall the difference: jobs due that
	// the producers, behind schedule when the load ended, never
	// enqueued. A producer behind schedule enqueues late rather than
	// skip a job, so lateness shows as Window.LagP99ms first.
	Offered   int64 `json:"offered"`
	Enqueued  int64 `json:"enqueued"`  // see Offered
	Shortfall int64 `json:"shortfall"` // see Offered
	// DrainS is how long after the load's end the last enqueued job
	// completed.
	DrainS float64 `json:"drain_s"`
	// Hold is the transaction held open, if any (--hold-xmin).
	Hold *HoldFigures `json:"hold,omitempty"`
	// Windows are the load's windows in order; the last may be shorter.
	Windows []Window `json:"windows"`
	// Before is the gauges before the load (and before the hold began),
	// After those once every job completed and the hold ended.
	Before *Gauges `json:"before,omitempty"`
	After  *Gauges `json:"after,omitempty"` // see Before
	// GaugeSource and CPUSource say where the gauges and the CPU shares
	// come from (or why the database's CPU share is unavailable).
	GaugeSource string `json:"gauge_source"`
	CPUSource   string `json:"cpu_source"`
	// Notes are server settings that change how to read the figures
	// (PostgreSQL with autovacuum off, say).
	Notes []string `json:"notes,omitempty"`
}

// Window is one reporting window of a steady run.
type Window struct {
	// StartS and EndS bound the window, in seconds since the load began.
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"` // see StartS
	// Held: the held transaction was open during (part of) the window.
	Held bool `json:"held"`
	// Offered jobs were due in the window; Enqueued were committed in it
	// (by enqueue acknowledgement); Started began in it (first
	// execution); Completed is the client's completion count over it.
	Offered   int64 `json:"offered"`
	Enqueued  int64 `json:"enqueued"`  // see Offered
	Started   int64 `json:"started"`   // see Offered
	Completed int64 `json:"completed"` // see Offered
	// OfferedPerS, EnqueuedPerS and CompletedPerS are the same per
	// second of the window.
	OfferedPerS   float64 `json:"offered_per_s"`
	EnqueuedPerS  float64 `json:"enqueued_per_s"`  // see OfferedPerS
	CompletedPerS float64 `json:"completed_per_s"` // see OfferedPerS
	// P50ms, P99ms and Maxms are the pick-up latency (enqueue commit to
	// handler start) of the jobs enqueued in the window, in
	// milliseconds; a job never started is not counted here but in the
	// run's Lost.
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"` // see P50ms
	Maxms float64 `json:"max_ms"` // see P50ms
	// LagP99ms is the p99 of how late the window's enqueues committed
	// after their due time: the producers' (and the enqueue path's)
	// falling behind the offered rate.
	LagP99ms float64 `json:"lag_p99_ms"`
	// Backlog is jobs enqueued and not yet completed at the window's end.
	Backlog int64 `json:"backlog"`
	// Gauges are the database's, read at the window's end.
	Gauges Gauges `json:"gauges"`
}

// steady offers o.Rate jobs/s from o.Producers producers for o.Duration
// plus o.Recovery, with o.Workers workers, and reports per o.Every
// window; with o.HoldXmin a read transaction holds a snapshot from before
// the load until o.HoldFor.
func steady(ctx context.Context, o Options) ([]*Result, error) {
	if o.Rate <= 0 || math.IsInf(o.Rate, 0) || math.IsNaN(o.Rate) {
		return nil, fmt.Errorf("bench: steady: --rate must be a positive number of jobs per second")
	}
	if o.Every <= 0 || o.Duration <= 0 || o.Recovery < 0 || o.HoldFor < 0 {
		return nil, fmt.Errorf("bench: steady: --window, --duration must be positive, --recovery and --hold-for not negative")
	}
	rec := NewRecorder()
	c, err := openClient(ctx, o, map[string]int{conveyor.DefaultQueue: o.Workers}, map[string]*Recorder{conveyor.DefaultQueue: rec})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	prefix := c.Config().TablePrefix
	backend := c.Backend()
	res := &Result{Workload: "steady", Backend: backend, Workers: o.Workers, Producers: o.Producers, Middleware: o.Middleware}
	load := o.Duration + o.Recovery
	fig := &SteadyFigures{Rate: o.Rate, WindowS: o.Every.Seconds(), LoadS: load.Seconds()}
	res.Steady = fig

	g, err := newGauger(ctx, o.DSN, backend, prefix)
	if err != nil {
		closeClient(ctx, c, o, res)
		return nil, fmt.Errorf("bench: steady: gauges: %w", err)
	}
	defer g.close()
	fig.GaugeSource, fig.CPUSource = g.source(), g.cpu.source
	fig.Notes = steadyNotes(ctx, g)

	if err := c.Start(ctx); err != nil {
		closeClient(ctx, c, o, res)
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // let every worker park
	tb := time.Now()
	before := g.read(ctx)
	fig.Before = &before

	holdFor := o.HoldFor
	if holdFor == 0 {
		holdFor = o.Duration
	}
	holdFor = min(holdFor, load)
	var hold *heldTx
	if o.HoldXmin {
		// A safety net should the process be stopped without running its
		// deferred release: the server ends the session itself.
		hold, err = holdSnapshot(ctx, o.DSN, backend, prefix, holdFor+time.Minute)
		if err != nil {
			closeClient(ctx, c, o, res)
			return nil, fmt.Errorf("bench: steady: --hold-xmin: %w", err)
		}
		defer hold.release()
	}
	t0 := time.Now().Add(50 * time.Millisecond)
	before.AtS = tb.Sub(t0).Seconds()
	g.t0 = t0
	end := t0.Add(load)
	if hold != nil {
		hold.start(t0)
		time.AfterFunc(time.Until(t0.Add(holdFor)), hold.release)
		if o.held != nil {
			o.held()
		}
	}

	// The windows' boundaries: completions and gauges at each.
	nw := int(math.Ceil(float64(load) / float64(o.Every)))
	bounds := make([]time.Time, nw+1)
	for i := range bounds {
		bounds[i] = t0.Add(min(load, time.Duration(i)*o.Every))
	}
	fig.Windows = make([]Window, nw)
	quit := make(chan struct{}) // producers failed: stop sampling
	var enqueued atomic.Int64
	var swg sync.WaitGroup
	swg.Add(1)
	go func() {
		defer swg.Done()
		comp0 := c.Counters().Map()["completed"]
		for i := 1; i <= nw; i++ {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				return
			case <-time.After(time.Until(bounds[i])):
			}
			comp := c.Counters().Map()["completed"]
			w := &fig.Windows[i-1]
			w.Completed = comp - comp0
			w.Backlog = enqueued.Load() - comp
			comp0 = comp
			w.Gauges = g.read(context.WithoutCancel(ctx))
		}
	}()

	stop := make(chan struct{})
	pw := progress(o.Progress, o.label, 0, func() int64 { return c.Counters().Map()["completed"] }, stop)
	offered := jobsDueBefore(load, o.Rate)
	due := func(i int64) time.Time { return t0.Add(dueAt(i, o.Rate)) }
	var ticket atomic.Int64
	firstRefused := atomic.Int64{}
	firstRefused.Store(offered)
	var perr error
	var once sync.Once
	var pwg sync.WaitGroup
	mk := jobMaker(o)
	for p := 0; p < o.Producers; p++ {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for {
				i := ticket.Add(1) - 1
				if i >= offered {
					return
				}
				if d := time.Until(due(i)); d > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(d):
					}
				}
				if ctx.Err() != nil || time.Now().After(end) {
					// Behind schedule when the load ended (or stopped):
					// this job and the later ones are the shortfall.
					for {
						f := firstRefused.Load()
						if i >= f || firstRefused.CompareAndSwap(f, i) {
							break
						}
					}
					return
				}
				call := time.Now()
				if _, err := c.Enqueue(ctx, mk(i), nil); err != nil {
					once.Do(func() { perr = err })
					for {
						f := firstRefused.Load()
						if i >= f || firstRefused.CompareAndSwap(f, i) {
							break
						}
					}
					return
				}
				rec.Enqueued(i, call, time.Now())
				enqueued.Add(1)
			}
		}()
	}
	pwg.Wait()
	k := firstRefused.Load() // jobs [0, k) were enqueued
	fig.Offered, fig.Enqueued, fig.Shortfall = offered, k, offered-k
	if perr != nil {
		close(quit)
	}
	swg.Wait()
	var werr error
	if perr == nil && ctx.Err() == nil {
		werr = waitCompleted(ctx, c, k, o.Timeout)
	}
	fig.DrainS = max(0, time.Since(end).Seconds())
	close(stop)
	pw.Wait()
	hold.release()
	holdEnd := -1.0
	if hold != nil {
		fig.Hold = hold.figures()
		holdEnd = fig.Hold.EndS
	}
	after := g.read(context.WithoutCancel(ctx))
	fig.After = &after

	fillWindows(fig, rec, t0, k, bounds, holdEnd)
	counters := c.Counters().Map()
	cerr := closeClient(ctx, c, o, res)
	res.Waits = map[string]any{
		"source": "not sampled in steady runs (a 10ms sampler would weigh on the database CPU share measured); see the windows' gauges",
	}
	if cl := clientContention(counters); len(cl) > 0 {
		res.Waits["client"] = cl
	}
	ferr := res.fill(rec.SummarizeRange(0, k), load+time.Duration(fig.DrainS*1e9))
	if err := errors.Join(perr, werr, cerr, ctx.Err()); err != nil {
		return []*Result{res}, err
	}
	return []*Result{res}, ferr
}

// clientContention picks the client's retry counters.
func clientContention(counters map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, k := range []string{"deadlock_retries", "lock_timeouts", "serialization_retries", "busy_retries", "starved_writes", "claim_conflicts"} {
		if v, ok := counters[k]; ok {
			out[k] = v
		}
	}
	return out
}

// fillWindows computes the windows' job figures from the recorder: jobs
// [0, k) were enqueued; job i was due at i/Rate. holdEnd is when the
// held transaction ended (seconds since t0), -1 for none.
func fillWindows(fig *SteadyFigures, rec *Recorder, t0 time.Time, k int64, bounds []time.Time, holdEnd float64) {
	nw := len(fig.Windows)
	idx := func(ns int64) int {
		d := time.Duration(ns - t0.UnixNano())
		i := int(d / time.Duration(fig.WindowS*1e9))
		return min(max(i, 0), nw-1)
	}
	lat := make([][]time.Duration, nw)
	lag := make([][]time.Duration, nw)
	for i := int64(0); i < k; i++ {
		s := rec.slot(i)
		enq := s.enq.Load()
		if enq == 0 {
			continue
		}
		w := idx(enq)
		fig.Windows[w].Enqueued++
		dueNS := t0.Add(dueAt(i, fig.Rate)).UnixNano()
		lag[w] = append(lag[w], time.Duration(max(0, enq-dueNS)))
		if s.execs.Load() > 0 {
			st := s.start.Load()
			lat[w] = append(lat[w], time.Duration(max(0, st-enq)))
			if st < bounds[nw].UnixNano() {
				fig.Windows[idx(st)].Started++
			}
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for i := range fig.Windows {
		w := &fig.Windows[i]
		w.StartS, w.EndS = bounds[i].Sub(t0).Seconds(), bounds[i+1].Sub(t0).Seconds()
		span := w.EndS - w.StartS
		// Jobs due in [StartS, EndS): i/Rate in range.
		lo := jobsDueBefore(bounds[i].Sub(t0), fig.Rate)
		hi := jobsDueBefore(bounds[i+1].Sub(t0), fig.Rate)
		w.Offered = min(hi, fig.Offered) - min(lo, fig.Offered)
		if span > 0 {
			w.OfferedPerS = float64(w.Offered) / span
			w.EnqueuedPerS = float64(w.Enqueued) / span
			w.CompletedPerS = float64(w.Completed) / span
		}
		sort.Slice(lat[i], func(a, b int) bool { return lat[i][a] < lat[i][b] })
		sort.Slice(lag[i], func(a, b int) bool { return lag[i][a] < lag[i][b] })
		w.P50ms, w.P99ms, w.Maxms = ms(sortedPct(lat[i], 0.5)), ms(sortedPct(lat[i], 0.99)), ms(sortedPct(lat[i], 1))
		w.LagP99ms = ms(sortedPct(lag[i], 0.99))
		// Open for more than a moment of the window (the rollback ends a
		// little after its time, more so on a loaded machine).
		w.Held = holdEnd-w.StartS > 0.05*span
	}
}

// dueAt is when job i is due, after the load's start: i/rate seconds.
func dueAt(i int64, rate float64) time.Duration {
	return time.Duration(float64(i) * 1e9 / rate)
}

// jobsDueBefore is how many jobs are due before d: the least n with
// dueAt(n) >= d. Rounding d*rate up alone miscounts when the product
// lands a hair above an integer (1.1s at 100/s is 110.00000000000001).
func jobsDueBefore(d time.Duration, rate float64) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(math.Ceil(d.Seconds() * rate))
	for n > 0 && dueAt(n-1, rate) >= d {
		n--
	}
	for dueAt(n, rate) < d {
		n++
	}
	return n
}

// sortedPct is pct of an already sorted slice.
func sortedPct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[max(0, int(math.Ceil(p*float64(len(d))))-1)]
}

// steadyNotes reads the server settings that change how a steady run's
// figures read.
func steadyNotes(ctx context.Context, g *gauger) []string {
	var notes []string
	switch g.backend {
	case "postgres":
		var av string
		if err := g.pg.QueryRow(ctx, "SHOW autovacuum").Scan(&av); err == nil && av != "on" {
			notes = append(notes, "autovacuum is "+av+" on this server (not stock): dead tuples are not reclaimed whether or not a snapshot is held")
		}
	}
	return notes
}
