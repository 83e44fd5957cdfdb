package engine

import (
	"cmp"
	"slices"
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
// nothing) or, when the driver checks and takes key slots in the insert
// (driver.Capabilities.KeyedInsertClaim: SQLite), of a queue whose only
// limits are per key, with at least two attempts (an insert whose commit was not
// confirmed may have left its jobs claimed by no worker: their lease then
// expires, and the rescue that counts that attempt must leave one to
// run). A paused queue's jobs are not claimed (the statement checks). The
// workers are reserved before the insert is sent, counted as running, so
// that the fetcher's own claims never take more than the free workers,
// and given back for each job the insert did not claim.

// reservation is the workers of one fetcher reserved for an insert's jobs
// of its queue: n of them, for the jobs whose indexes in the insert jobs
// holds. unlock releases the queue's claims gate, read-locked from the
// choice to claim at insert until the insert returned.
type reservation struct {
	f      *fetcher
	n      int
	jobs   []int
	unlock func()
}

// claimable reports whether job j may be claimed at insert (see above),
// its queue aside.
func claimable(j *driver.InsertParams) bool {
	return j.UniqueKey == nil && j.Delay == 0 && j.RunAt.IsZero() && j.MaxAttempts >= 2
}

// reserveFor reserves workers for the claimable jobs of jobs, queue by
// queue, and returns the reservations and the flags of the jobs to
// claim; nil when none is to be claimed. With fewer free workers than
// claimable jobs of a queue, the jobs of the highest priorities (lowest
// values), then the first, are claimed: the others wait for a claim, as
// they would have.
//
// An insert that claims is a claim of each queue it reserved for: it
// holds the queue's claims gate from its look at the limits cache until
// settleReservations, after the insert returned, so that a
// SetQueueLimits of this process returns only once the inserts that
// chose to claim under the old limits have, as it does for the fetchers'
// claims. It never waits for a gate (tryLockClaims): while a change of a
// queue's limits holds its gate or waits for it, the insert claims none
// of that queue's jobs, which wait for a claim as they would have, and
// the inserts of every queue go on.
func (e *Engine) reserveFor(jobs []driver.InsertParams) ([]reservation, []bool) {
	if e.ic == nil || hasUnique(jobs) {
		return nil, nil
	}
	var order []string
	byQueue := map[string][]int{}
	for i := range jobs {
		if !claimable(&jobs[i]) {
			continue
		}
		q := jobs[i].Queue
		if _, ok := byQueue[q]; !ok {
			order = append(order, q)
		}
		byQueue[q] = append(byQueue[q], i)
	}
	var res []reservation
	var flags []bool
	for _, q := range order {
		idx := byQueue[q]
		if !e.mayReserve(q) {
			continue
		}
		unlock, ok := e.tryLockClaims(q)
		if !ok {
			continue
		}
		f, got := e.reserveWorkers(q, len(idx))
		if got == 0 {
			unlock()
			continue
		}
		if got < len(idx) {
			slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(jobs[a].Priority, jobs[b].Priority) })
			idx = idx[:got]
			slices.Sort(idx)
		}
		if flags == nil {
			flags = make([]bool, len(jobs))
		}
		for _, i := range idx {
			flags[i] = true
		}
		res = append(res, reservation{f: f, n: got, jobs: idx, unlock: unlock})
	}
	return res, flags
}

// mayReserve is reserveWorkers' first look, without its locks: whether
// this process has a fetcher of queue waiting for work, so that an
// insert takes no claims gate for a queue it could not claim.
func (e *Engine) mayReserve(queue string) bool {
	e.mu.Lock()
	f := e.fetchers[queue]
	e.mu.Unlock()
	return f != nil && f.idle.Load()
}

// reserveWorkers counts up to n of the free workers of this process's
// fetcher of queue as running, for jobs an insert is about to claim,
// and returns the fetcher and how many it reserved (0: none, the fetcher
// is not waiting for work, the queue may be limited, or the engine is
// stopping).
func (e *Engine) reserveWorkers(queue string, n int) (*fetcher, int) {
	if n <= 0 || e.limited(queue) && !e.claimsKeyedAtInsert(queue) {
		return nil, 0
	}
	// Under reserveMu, a Stop has either not begun or set stopping: the
	// fetchers read next are those of the engine as started now.
	e.reserveMu.Lock()
	defer e.reserveMu.Unlock()
	if e.stopping.Load() {
		return nil, 0
	}
	e.mu.Lock()
	f := e.fetchers[queue]
	e.mu.Unlock()
	if f == nil || !f.idle.Load() {
		return nil, 0
	}
	f.resMu.Lock()
	defer f.resMu.Unlock()
	k := min(int64(n), int64(f.max)-f.running.Load()-f.claiming.Load())
	if k <= 0 {
		return nil, 0
	}
	f.running.Add(k)
	e.jobWG.Add(int(k))
	return f, int(k)
}

// claimsKeyedAtInsert reports whether inserts of this process may claim
// jobs of queue although it is limited: its only limits are per key, as
// far as a fresh cache tells, and the driver's insert then checks and
// takes the jobs' key slots itself (driver.Capabilities.KeyedInsertClaim).
func (e *Engine) claimsKeyedAtInsert(queue string) bool {
	return e.keyedIC && e.keysOnly(queue)
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
// leases counted from sent, or from the first row's LeaseFrom when the
// driver knows the insert waited (for a lock) before the database
// started them, as the fetcher counts a claim's; and gives back the
// workers no row took. With rows nil (the insert failed) it gives them
// all back. It releases the reservations' claims gates first: the insert
// has returned.
func (e *Engine) settleReservations(res []reservation, rows []*driver.JobRow, sent time.Time) {
	for _, r := range res {
		r.unlock()
	}
	for _, r := range res {
		var got []*driver.JobRow
		if rows != nil {
			for _, i := range r.jobs {
				if rows[i] != nil {
					got = append(got, rows[i])
				}
			}
		}
		r.f.unreserve(r.n - len(got))
		if len(got) > 0 {
			from := sent
			if got[0].LeaseFrom.After(from) {
				// The rows are in insert order: the first one's
				// statement began first.
				from = got[0].LeaseFrom
			}
			r.f.deliverClaimed(got, from)
		}
	}
}

// deliverClaimed hands rows claimed at insert, their workers reserved,
// to the workers; once the workers are closed (Stop) it releases them
// instead, fenced, so that they are claimable again at once.
func (f *fetcher) deliverClaimed(rows []*driver.JobRow, sent time.Time) {
	f.dispMu.RLock()
	if !f.workersClosed {
		f.e.metrics.ClaimedAtInsert.Add(int64(len(rows)))
		f.deliver(rows, sent, false)
		f.dispMu.RUnlock()
		return
	}
	f.dispMu.RUnlock()
	f.unreserve(len(rows))
	f.releaseRows(rows, "jobs claimed at insert during shutdown")
}
