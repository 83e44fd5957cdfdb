package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// gatherFor bounds how long a fetcher with a backlog waits for more free
// slots before claiming less than a full batch.
const gatherFor = time.Millisecond

// fetcher is the only claimer of one queue in this process. It claims
// batches sized to the free worker slots, claims again at once while the
// queue has work, and otherwise waits for a wake-up (local enqueue,
// notification) or its poll timer.
type fetcher struct {
	e       *Engine
	queue   string
	max     int
	workCtx context.Context

	wakeCh  chan struct{} // cap 1: "the queue may have work"
	freedCh chan struct{} // cap 1: "a worker slot was freed"
	stopCh  chan struct{}
	stopped sync.Once
	jobs    chan *running // cap max: never blocks, running <= max

	running  atomic.Int64
	workerWG sync.WaitGroup
	closeW   sync.Once

	mu     sync.Mutex
	leases map[int64]*running
}

// running is one attempt in progress.
type running struct {
	row    *driver.JobRow
	ctx    context.Context
	cancel context.CancelCauseFunc
	// abandonAt, when set, is the job's timeout plus one lease: a handler
	// still running then ignores its context, and the attempt is abandoned
	// (no more heartbeats, no release) so its lease expires, the rescue
	// counts the attempt, and the job is discarded after MaxAttempts
	// instead of running forever.
	abandonAt time.Time
}

// abandoned reports whether the attempt's handler outlived its timeout by
// a whole lease.
func (it *running) abandoned(now time.Time) bool {
	return !it.abandonAt.IsZero() && now.After(it.abandonAt)
}

func newFetcher(e *Engine, queue string, max int, workCtx context.Context) *fetcher {
	return &fetcher{
		e: e, queue: queue, max: max, workCtx: workCtx,
		wakeCh:  make(chan struct{}, 1),
		freedCh: make(chan struct{}, 1),
		stopCh:  make(chan struct{}),
		jobs:    make(chan *running, max),
		leases:  make(map[int64]*running, max),
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (f *fetcher) nudge()        { signal(f.wakeCh) }
func (f *fetcher) stopFetching() { f.stopped.Do(func() { close(f.stopCh) }) }

func (f *fetcher) run(ctx context.Context) {
	e := f.e
	listening := e.drv.Capabilities().Listen
	interval := e.cfg.PollMin
	if listening {
		interval = e.cfg.ListenPoll
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	more := true // claim at once on start
	errs := 0
	want := min(f.max, e.cfg.ClaimBatch)
	var gathering time.Time // when a backlogged fetcher began waiting for slots
	for {
		select {
		case <-f.stopCh:
			return
		default:
		}
		running := int(f.running.Load())
		free := f.max - running
		if free <= 0 {
			select {
			case <-f.freedCh:
			case <-f.stopCh:
				return
			}
			continue
		}
		if more && running > 0 && free < want {
			// The queue has a backlog and only a few slots are free: wait
			// briefly for more to free up, so that one claim takes a full
			// batch instead of many claims taking a few rows each.
			if gathering.IsZero() {
				gathering = time.Now()
			}
			if left := gatherFor - time.Since(gathering); left > 0 {
				select {
				case <-f.freedCh:
				case <-time.After(left):
				case <-f.stopCh:
					return
				}
				continue
			}
		}
		gathering = time.Time{}
		if !more {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(interval)
			select {
			case <-f.wakeCh:
			case <-timer.C:
			case <-f.stopCh:
				return
			}
		}
		limit := min(free, e.cfg.ClaimBatch)
		rows, err := e.drv.Claim(ctx, driver.ClaimParams{Queue: f.queue, Limit: limit, Lease: e.cfg.Lease, Worker: e.id})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			errs++
			e.metrics.DBErrors.Add(1)
			e.logf("conveyor: claim on queue %q failed (retrying): %v", f.queue, err)
			select {
			case <-time.After(errBackoff(errs)):
			case <-f.stopCh:
				return
			}
			more = true
			continue
		}
		errs = 0
		e.metrics.ClaimRounds.Add(1)
		f.dispatch(rows)
		more = len(rows) == limit
		if !listening {
			// Adaptive poll: fast while work flows, backing off when idle.
			if len(rows) > 0 {
				interval = e.cfg.PollMin
			} else {
				interval = min(interval*2, e.cfg.PollMax)
			}
		}
	}
}

func (f *fetcher) dispatch(rows []*driver.JobRow) {
	if len(rows) == 0 {
		return
	}
	f.e.metrics.Claimed.Add(int64(len(rows)))
	f.running.Add(int64(len(rows)))
	f.e.jobWG.Add(len(rows))
	f.mu.Lock()
	items := make([]*running, len(rows))
	for i, r := range rows {
		ctx, cancel := context.WithCancelCause(f.workCtx)
		it := &running{row: r, ctx: ctx, cancel: cancel}
		if t := f.e.timeout(r); t > 0 {
			it.abandonAt = time.Now().Add(t + f.e.cfg.Lease)
		}
		f.leases[r.ID] = it
		items[i] = it
	}
	f.mu.Unlock()
	for _, it := range items {
		f.jobs <- it
	}
}

func (f *fetcher) startWorkers() {
	f.workerWG.Add(f.max)
	for range f.max {
		go f.worker()
	}
}

// closeWorkers lets idle workers exit; the fetch loop has already stopped.
func (f *fetcher) closeWorkers() { f.closeW.Do(func() { close(f.jobs) }) }

func (f *fetcher) worker() {
	defer f.workerWG.Done()
	e := f.e
	for it := range f.jobs {
		err, trace := e.runJob(it.ctx, it.row)
		cause := context.Cause(it.ctx)
		switch {
		case err != nil && errors.Is(cause, errShutdown):
			// Interrupted by shutdown: keep the lease so Stop releases
			// the job instead of counting a failure.
		case f.removeLease(it.row.ID):
			if err != nil {
				e.metrics.Failed.Add(1)
			}
			if !e.comp.submit(e.outcome(it.row, err, trace)) {
				// The completer closed under us: Stop has released or will
				// rescue the job.
				f.restoreLease(it)
			}
		default:
			// Released by Stop while the handler ignored its context: the
			// outcome is dropped, the job belongs to a future attempt.
		}
		it.cancel(nil)
		f.running.Add(-1)
		signal(f.freedCh)
		e.jobWG.Done()
	}
}

func (f *fetcher) removeLease(id int64) bool {
	f.mu.Lock()
	_, ok := f.leases[id]
	delete(f.leases, id)
	f.mu.Unlock()
	return ok
}

func (f *fetcher) restoreLease(it *running) {
	f.mu.Lock()
	f.leases[it.row.ID] = it
	f.mu.Unlock()
}

// snapshot lists the attempts this fetcher holds, for the heartbeat.
func (f *fetcher) snapshot(dst []driver.Lease) []driver.Lease {
	now := time.Now()
	f.mu.Lock()
	for id, it := range f.leases {
		if it.abandoned(now) {
			continue
		}
		dst = append(dst, driver.Lease{ID: id, Attempt: it.row.Attempt})
	}
	f.mu.Unlock()
	return dst
}

// loseLeases cancels held attempts whose ids are not in owned.
func (f *fetcher) loseLeases(asked map[int64]int, owned map[int64]bool) int {
	n := 0
	f.mu.Lock()
	for id, it := range f.leases {
		if a, ok := asked[id]; ok && a == it.row.Attempt && !owned[id] {
			delete(f.leases, id)
			it.cancel(errLeaseLost)
			n++
		}
	}
	f.mu.Unlock()
	return n
}

// takeAllLeases removes and returns every held attempt (shutdown).
func (f *fetcher) takeAllLeases() []driver.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	out := make([]driver.Lease, 0, len(f.leases))
	for id, it := range f.leases {
		delete(f.leases, id)
		if it.abandoned(now) {
			continue // left to expire and be rescued, the attempt counted
		}
		out = append(out, driver.Lease{ID: id, Attempt: it.row.Attempt})
	}
	return out
}
