package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor"
)

// Queues of the isolation workload.
const (
	hotQueue  = "hot"
	coldQueue = "cold"
)

// isolation measures the cold queue's pick-up latency (one job every
// o.Interval, o.Jobs jobs) first with the hot queue idle, then while
// o.Producers goroutines keep the hot queue saturated, on one client that
// works both queues with o.Workers workers each. It returns three
// results: cold-idle, cold-under-hot and hot.
func isolation(ctx context.Context, o Options) ([]*Result, error) {
	hotRec, coldRec := NewRecorder(), NewRecorder()
	c, err := openClient(ctx, o,
		map[string]int{hotQueue: o.Workers, coldQueue: o.Workers},
		map[string]*Recorder{hotQueue: hotRec, coldQueue: coldRec})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mk := jobMaker(o)
	backend := c.Backend()
	target := int64(max(500, 20*o.Workers)) // hot backlog kept
	newResult := func(phase string) *Result {
		return &Result{Workload: "isolation", Phase: phase, Backend: backend, Workers: o.Workers, Producers: o.Producers}
	}
	idle, loaded, hot := newResult("cold-idle"), newResult("cold-under-hot"), newResult("hot")
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // let every worker park

	// Phase 1: the cold queue alone.
	w := startWaits(ctx, o.DSN, backend)
	c0 := c.Counters().Map()
	from1 := coldRec.Issued()
	el1, err1 := coldPhase(ctx, c, coldRec, o, mk, "isolation cold-idle")
	to1 := coldRec.Issued()
	c1 := c.Counters().Map()
	idle.Waits = w.finish(ctx, diffCounters(c1, c0))

	// Phase 2: the same with the hot queue saturated.
	var hotEnq atomic.Int64
	if err1 == nil {
		err1 = prefillHot(ctx, c, hotRec, mk, target, &hotEnq)
	}
	// The hot backlog: hot jobs enqueued (or being enqueued) and not yet
	// claimed. Cold jobs are claimed within milliseconds of their enqueue,
	// so claimed minus cold jobs enqueued approximates the hot jobs
	// claimed; the estimate is clamped at zero.
	backlog := func() int64 { return max(0, hotEnq.Load()-(c.Counters().Map()["claimed"]-coldRec.Issued())) }
	stopHot := make(chan struct{})
	var hwg sync.WaitGroup
	var herr error
	var honce sync.Once
	if err1 == nil {
		for p := 0; p < o.Producers; p++ {
			hwg.Add(1)
			go func() {
				defer hwg.Done()
				if err := hotProducer(ctx, c, hotRec, o, mk, target, &hotEnq, backlog, stopHot); err != nil {
					honce.Do(func() { herr = err })
				}
			}()
		}
	}
	var minBacklog atomic.Int64
	minBacklog.Store(1 << 62)
	measuring := make(chan struct{})
	var mwg sync.WaitGroup
	if err1 == nil {
		mwg.Add(1)
		go func() { // sample the backlog while the cold queue is measured
			defer mwg.Done()
			tick := time.NewTicker(SampleInterval)
			defer tick.Stop()
			for {
				select {
				case <-measuring:
					return
				case <-stopHot:
					return
				case <-tick.C:
					if b := backlog(); b < minBacklog.Load() {
						minBacklog.Store(b)
					}
				}
			}
		}()
		time.Sleep(500 * time.Millisecond) // let the hot load settle
	}
	var el2 time.Duration
	var err2 error
	from2, to2 := coldRec.Issued(), coldRec.Issued()
	hotDone := int64(0)
	if err1 == nil {
		w = startWaits(ctx, o.DSN, backend)
		c2 := c.Counters().Map()
		el2, err2 = coldPhase(ctx, c, coldRec, o, mk, "isolation cold-under-hot")
		to2 = coldRec.Issued()
		c3 := c.Counters().Map()
		close(measuring)
		mwg.Wait()
		hotDone = c3["completed"] - c2["completed"] - (to2 - from2)
		close(stopHot)
		hwg.Wait()
		loaded.Waits = w.finish(ctx, diffCounters(c3, c2))
		hot.Waits = loaded.Waits
		// Let the hot backlog drain so that every hot job can be checked.
		if err2 == nil && herr == nil {
			err2 = waitCompleted(ctx, c, hotEnq.Load()+to2, o.Timeout)
		}
	}
	cerr := closeClient(ctx, c, o, idle)
	for _, r := range []*Result{loaded, hot} {
		r.Counters, r.Settings = idle.Counters, idle.Settings
	}
	idle.Settings["isolation_cold_interval"] = o.Interval.String()
	idle.Settings["isolation_hot_producers"] = fmt.Sprintf("%d (%s)", o.Producers, o.Mode)
	idle.Settings["isolation_hot_backlog_target"] = fmt.Sprint(target)
	idle.Settings["isolation_queues"] = fmt.Sprintf("hot and cold, MaxWorkers %d each, one client", o.Workers)
	if err := errors.Join(err1, err2, herr, cerr); err != nil {
		idle.fill(coldRec.SummarizeRange(from1, to1), el1)
		o.emit(idle)
		return []*Result{idle}, err
	}
	var errs []error
	errs = append(errs, idle.fill(coldRec.SummarizeRange(from1, to1), el1))
	errs = append(errs, loaded.fill(coldRec.SummarizeRange(from2, to2), el2))
	errs = append(errs, hot.fill(hotRec.Summarize(), el2))
	rate := float64(hotDone) / el2.Seconds()
	loaded.HotJobsPerS, hot.HotJobsPerS, hot.JobsPerS = rate, rate, rate
	mb := minBacklog.Load()
	loaded.HotBacklogMin, hot.HotBacklogMin = &mb, &mb
	rs := []*Result{idle, loaded, hot}
	for _, r := range rs {
		o.emit(r)
	}
	return rs, errors.Join(errs...)
}

// coldPhase enqueues o.Jobs cold-queue jobs, one every o.Interval, and
// waits until each has started. It returns the time from the first
// enqueue to the last start.
func coldPhase(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job, label string) (time.Duration, error) {
	from := rec.Issued()
	to := from + int64(o.Jobs)
	stop := make(chan struct{})
	wg := progress(o.Progress, label, int64(o.Jobs), func() int64 { return rec.started(from, to) }, stop)
	defer wg.Wait()
	defer close(stop)
	opts := &conveyor.EnqueueOpts{Queue: coldQueue}
	t0 := time.Now()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for i := 0; i < o.Jobs; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		seq := rec.Next()
		call := time.Now()
		if _, err := c.Enqueue(ctx, mk(seq), opts); err != nil {
			return 0, err
		}
		rec.Enqueued(seq, call, time.Now())
	}
	deadline := time.Now().Add(o.Timeout)
	for rec.started(from, to) < to-from {
		if time.Now().After(deadline) {
			return time.Since(t0), fmt.Errorf("bench: %s: only %d of %d cold jobs started after %v", label, rec.started(from, to), to-from, o.Timeout)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(t0), nil
}

// prefillHot bulk-inserts target hot jobs, so that the hot queue is
// saturated from the start of the loaded phase.
func prefillHot(ctx context.Context, c *conveyor.Client[any], rec *Recorder, mk func(int64) Job, target int64, enq *atomic.Int64) error {
	opts := &conveyor.EnqueueOpts{Queue: hotQueue}
	first := rec.Reserve(int(target))
	items := make([]conveyor.EnqueueItem, target)
	for i := range items {
		items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i)), Opts: opts}
	}
	t0 := time.Now()
	if _, err := c.EnqueueBulk(ctx, items); err != nil {
		return err
	}
	t1 := time.Now()
	for i := range items {
		rec.Enqueued(first+int64(i), t0, t1)
	}
	enq.Add(target)
	return nil
}

// hotProducer enqueues hot jobs (one per Enqueue, or 100 per EnqueueMany
// in batch mode) whenever the backlog is under target, until stop.
func hotProducer(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job, target int64, enq *atomic.Int64, backlog func() int64, stop <-chan struct{}) error {
	opts := &conveyor.EnqueueOpts{Queue: hotQueue}
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if backlog() >= target {
			time.Sleep(time.Millisecond)
			continue
		}
		switch o.Mode {
		case "batch":
			const b = 100
			first := rec.Reserve(b)
			items := make([]conveyor.EnqueueItem, b)
			for i := range items {
				items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i)), Opts: opts}
			}
			enq.Add(b) // counted before the call: workers may claim them before it returns
			call := time.Now()
			if _, err := c.EnqueueMany(ctx, items); err != nil {
				return err
			}
			now := time.Now()
			for i := range items {
				rec.Enqueued(first+int64(i), call, now)
			}
		default:
			seq := rec.Next()
			enq.Add(1)
			call := time.Now()
			if _, err := c.Enqueue(ctx, mk(seq), opts); err != nil {
				return err
			}
			rec.Enqueued(seq, call, time.Now())
		}
	}
}

// diffCounters returns a-b per counter.
func diffCounters(a, b map[string]int64) map[string]int64 {
	d := make(map[string]int64, len(a))
	for k, v := range a {
		d[k] = v - b[k]
	}
	return d
}
