package engine

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Registration of remote workers in the processes table.
const (
	// remoteProcInterval is the most often one remote worker's row is
	// written: the first call of the worker after it passed refreshes it.
	remoteProcInterval = 5 * time.Second
	// remoteProcTTL is how long a remote worker's row stays alive after a
	// refresh, and how long a queue counts as worked by it after its last
	// claim there (or renewal of a job of it).
	remoteProcTTL = 30 * time.Second
	// remoteHeldTTL forgets a claimed job that was neither renewed nor
	// settled for longer than the longest lease a remote worker may take.
	remoteHeldTTL = time.Hour + time.Minute
)

// remoteProcs keeps, in memory, the remote workers this engine serves and
// writes each one's row in the processes table (kind "http") at most once
// per remoteProcInterval, from the call that finds the row due: a claim
// (before its claim statement, and at each retry of a waiting claim, so a
// worker waiting on an empty queue stays alive) or a renewal of a job this
// engine handed out (so a worker busy with long jobs, which does not
// claim, stays alive too). A worker's queues are those it claimed from, or
// renewed a job of, within remoteProcTTL. Remote workers say no goodbye: a
// stopped worker's row expires.
type remoteProcs struct {
	e *Engine

	mu        sync.Mutex
	workers   map[string]*remoteProc // by process id
	jobs      map[int64]heldJob      // jobs handed out, by id (the latest attempt)
	lastSweep time.Time
}

// remoteProc is one remote worker as this engine saw it.
type remoteProc struct {
	host    string
	queues  map[string]time.Time // when last claimed from or renewed a job of
	written time.Time            // when its row was last written (or tried)
	writing bool
}

// heldJob is a job handed out by a remote claim, until its outcome: its
// worker, queue and fence (the attempt's, so that a stale attempt's call
// does not forget a later one).
type heldJob struct {
	worker, queue string
	fence         int64
	at            time.Time
}

func newRemoteProcs(e *Engine) *remoteProcs {
	return &remoteProcs{e: e, workers: map[string]*remoteProc{}, jobs: map[int64]heldJob{}}
}

// claiming records that worker id (at host) claims from queue, and
// writes its row if due.
func (rp *remoteProcs) claiming(ctx context.Context, id, host, queue string) {
	if id == "" {
		return
	}
	now := time.Now()
	rp.mu.Lock()
	w := rp.workers[id]
	if w == nil {
		w = &remoteProc{queues: map[string]time.Time{}}
		rp.workers[id] = w
	}
	w.host = host
	w.queues[queue] = now
	rp.mu.Unlock()
	rp.refresh(ctx, id)
}

// claimed records the jobs a claim handed to worker id.
func (rp *remoteProcs) claimed(id string, rows []*driver.JobRow) {
	now := time.Now()
	rp.mu.Lock()
	defer rp.mu.Unlock()
	for _, r := range rows {
		rp.jobs[r.ID] = heldJob{worker: id, queue: r.Queue, fence: r.Fence, at: now}
	}
}

// beat records a renewed lease of job: its worker still works its queue.
func (rp *remoteProcs) beat(ctx context.Context, job int64) {
	now := time.Now()
	rp.mu.Lock()
	j, ok := rp.jobs[job]
	w := rp.workers[j.worker]
	if !ok || w == nil {
		rp.mu.Unlock()
		return // handed out by another process, or forgotten
	}
	j.at = now
	rp.jobs[job] = j
	w.queues[j.queue] = now
	rp.mu.Unlock()
	rp.refresh(ctx, j.worker)
}

// done forgets a job whose attempt under fence ended (an outcome, a
// release, or a refusal: it is no longer held under the fence the worker
// knows). A job handed out since under another fence is kept: a stale
// worker's refused call does not end the current attempt.
func (rp *remoteProcs) done(job, fence int64) {
	rp.mu.Lock()
	if j, ok := rp.jobs[job]; ok && j.fence == fence {
		delete(rp.jobs, job)
	}
	rp.mu.Unlock()
}

// queueOf is the queue of a job handed out here, "" if unknown.
func (rp *remoteProcs) queueOf(job int64) string {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.jobs[job].queue
}

// refresh writes worker id's row when remoteProcInterval passed since
// the last write and no other call is writing it. A failed write is
// logged and tried again a second later; it never fails the call.
func (rp *remoteProcs) refresh(ctx context.Context, id string) {
	now := time.Now()
	rp.mu.Lock()
	rp.sweep(now)
	w := rp.workers[id]
	if w == nil || w.writing || now.Sub(w.written) < remoteProcInterval {
		rp.mu.Unlock()
		return
	}
	w.writing = true
	row := driver.ProcessRow{ID: id, Kind: driver.ProcessHTTP, Host: w.host, Queues: map[string]int{}}
	for q, at := range w.queues {
		if now.Sub(at) <= remoteProcTTL {
			row.Queues[q] = 0
		} else {
			delete(w.queues, q)
		}
	}
	rp.mu.Unlock()

	// Not cut short by the worker going away: the row says it was here.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	err := rp.e.drv.RegisterProcess(wctx, row, remoteProcTTL)
	cancel()

	rp.mu.Lock()
	w.writing = false
	w.written = now
	if err != nil {
		w.written = now.Add(time.Second - remoteProcInterval)
	}
	rp.mu.Unlock()
	if err != nil {
		rp.e.metrics.DBErrors.Add(1)
		rp.e.warn("conveyor: registering a remote worker in the processes table failed (retrying)", "worker", id, "error", err)
	}
}

// sweep forgets workers silent for longer than their row lives and jobs
// held longer than any lease, at most once per remoteProcTTL. rp.mu is
// held.
func (rp *remoteProcs) sweep(now time.Time) {
	if now.Sub(rp.lastSweep) < remoteProcTTL {
		return
	}
	rp.lastSweep = now
	for id, j := range rp.jobs {
		if now.Sub(j.at) > remoteHeldTTL {
			delete(rp.jobs, id)
		}
	}
	for id, w := range rp.workers {
		if !w.writing && now.Sub(w.written) > remoteProcTTL && now.Sub(latest(w.queues)) > remoteProcTTL {
			delete(rp.workers, id)
		}
	}
}

// latest is the latest of the times in m (zero when empty).
func latest(m map[string]time.Time) time.Time {
	var t time.Time
	for _, x := range m {
		if x.After(t) {
			t = x
		}
	}
	return t
}
