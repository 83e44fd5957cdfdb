package engine

import (
	"context"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Claims at insert. A process that enqueues jobs of a queue it works,
// while its fetcher of that queue waits for work (its last claim found
// the queue without a job to take) and some of its workers are free, has
// its group-commit insert claim those jobs for the free workers in the
// insert's own statement (driver.InsertClaimer): each such job is written
// as running, leased to this process, and starts as soon as the insert
// commits, without a wake-up, a claim round trip, or the move from ready
// to running that the claim would have made.
//
// Only plain enqueues through the group-commit writer claim (not unique
// ones, not jobs in the caller's transaction, not bulk or batch inserts),
// and only jobs due at once, of a queue this process has no limits
// recorded for (the cache of limits says so; an unknown cache claims
// nothing), with at least two attempts (an insert whose commit was not
// confirmed may have left its jobs claimed by no worker: their lease then
// expires, and the rescue that counts that attempt must leave one to
// run). A paused queue's jobs are not claimed (the statement checks). The
// workers are reserved before the insert is sent, counted as running, so
// that the fetcher's own claims never take more than the free workers,
// and given back for each job the insert did not claim.

// reservation is the workers of one fetcher reserved for an insert's jobs
// of its queue: jobs holds their indexes in the insert.
type reservation struct {
	f    *fetcher
	jobs []int
}

// claimable reports whether job j may be claimed at insert (see above),
// its queue aside.
func claimable(j *driver.InsertParams) bool {
	return j.UniqueKey == nil && j.Delay == 0 && j.RunAt.IsZero() && j.MaxAttempts >= 2
}

// reserveFor reserves workers for the claimable jobs of jobs, queue by
// queue, and returns the reservations and the flags of the jobs to
// claim; nil when none is to be claimed.
func (e *Engine) reserveFor(jobs []driver.InsertParams) ([]reservation, []bool) {
	if e.ic == nil || hasUnique(jobs) {
		return nil, nil
	}
	var res []reservation
	var flags []bool
	at := map[string]int{} // queue -> its reservation in res, -1 for none
	for i := range jobs {
		j := &jobs[i]
		if !claimable(j) {
			continue
		}
		k, tried := at[j.Queue]
		if !tried {
			// One reservation per queue, for its claimable jobs of the
			// batch (as many as there are free workers).
			want := 0
			for l := i; l < len(jobs); l++ {
				if jobs[l].Queue == j.Queue && claimable(&jobs[l]) {
					want++
				}
			}
			k = -1
			if f, got := e.reserveWorkers(j.Queue, want); got > 0 {
				k = len(res)
				res = append(res, reservation{f: f, jobs: make([]int, 0, got)})
			}
			at[j.Queue] = k
		}
		if k < 0 || len(res[k].jobs) == cap(res[k].jobs) {
			continue
		}
		if flags == nil {
			flags = make([]bool, len(jobs))
		}
		flags[i] = true
		res[k].jobs = append(res[k].jobs, i)
	}
	return res, flags
}

// reserveWorkers counts up to n of the free workers of this process's
// fetcher of queue as running, for jobs an insert is about to claim,
// and returns the fetcher and how many it reserved (0: none, the fetcher
// is not waiting for work, the queue may be limited, or the engine is
// stopping).
func (e *Engine) reserveWorkers(queue string, n int) (*fetcher, int) {
	e.mu.Lock()
	f := e.fetchers[queue]
	e.mu.Unlock()
	if f == nil || n <= 0 || !f.idle.Load() || e.limited(queue) {
		return nil, 0
	}
	e.reserveMu.Lock()
	defer e.reserveMu.Unlock()
	if e.stopping.Load() {
		return nil, 0
	}
	for {
		running := f.running.Load()
		k := min(int64(n), int64(f.max)-running-f.claiming.Load())
		if k <= 0 {
			return nil, 0
		}
		if f.running.CompareAndSwap(running, running+k) {
			e.jobWG.Add(int(k))
			return f, int(k)
		}
	}
}

// unreserve gives back n workers reserveWorkers reserved that no job
// will take.
func (f *fetcher) unreserve(n int) {
	if n <= 0 {
		return
	}
	f.running.Add(-int64(n))
	f.e.jobWG.Add(-n)
	signal(f.freedCh)
}

// settleReservations hands each reservation's claimed rows (rows, by job
// index; nil for a job not claimed) to its fetcher's workers, their
// leases counted from sent, and gives back the workers no row took;
// with rows nil (the insert failed) it gives them all back.
func (e *Engine) settleReservations(res []reservation, rows []*driver.JobRow, sent time.Time) {
	for _, r := range res {
		var got []*driver.JobRow
		if rows != nil {
			for _, i := range r.jobs {
				if rows[i] != nil {
					got = append(got, rows[i])
				}
			}
		}
		r.f.unreserve(cap(r.jobs) - len(got))
		if len(got) > 0 {
			e.metrics.ClaimedAtInsert.Add(int64(len(got)))
			r.f.deliverClaimed(got, sent)
		}
	}
}

// deliverClaimed hands rows claimed at insert, their workers reserved,
// to the workers; once the workers are closed (Stop) it releases them
// instead, fenced, so that they are claimable again at once.
func (f *fetcher) deliverClaimed(rows []*driver.JobRow, sent time.Time) {
	f.dispMu.RLock()
	if !f.workersClosed {
		f.deliver(rows, sent)
		f.dispMu.RUnlock()
		return
	}
	f.dispMu.RUnlock()
	f.unreserve(len(rows))
	leases := make([]driver.Lease, len(rows))
	for i, r := range rows {
		leases[i] = driver.Lease{ID: r.ID, Fence: r.Fence}
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.e.cfg.Lease)
	defer cancel()
	n, err := f.e.drv.Release(ctx, leases)
	f.e.metrics.Released.Add(n)
	if err != nil {
		f.e.metrics.DBErrors.Add(1)
		f.e.warn("conveyor: releasing jobs claimed at insert during shutdown failed; they will be rescued", "queue", f.queue, "error", err)
	}
}
