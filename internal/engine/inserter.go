package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// inserter coalesces concurrent Enqueue calls into multi-row inserts: one
// statement and one commit per batch (group commit); each caller returns
// once its own jobs are committed.
//
// Its writers each write their batches one at a time: one for the callers
// whose jobs are all plain (one multi-row insert per batch), and
// uniqueLanes for the callers with unique jobs (whose plain jobs go in the
// same transaction, so that every call commits whole or not at all). A
// unique insert can wait for a lock held by an application's open
// transaction that inserted the same key, for as long as that transaction
// stays open (up to flushTimeout): only the callers of its lane wait
// behind it. Plain enqueues keep being written, also those of the
// goroutine that holds the transaction and enqueues before committing it,
// and so do unique enqueues of other keys, in the other lanes: a call goes
// to the lane that has a call with one of its keys not yet written (so
// that one process's calls with a key are written in order and never wait
// for each other in the database), else to the first lane not stalled
// (see freeLane), so that calls gather in one lane's batches while it
// flows.
// A call whose keys have unwritten calls in more than one lane waits,
// unqueued, until they are in at most one (written there, two calls of
// one key would wait for each other in the database, and two calls with
// their keys in opposite orders would deadlock): one such call at a time
// holds its keys of the other lanes, so that a later call with one of
// them waits behind it and those lanes finish with the key.
//
// Each caller is told what happened to its own jobs. A caller's jobs are
// all in one transaction of one writer, and the caller gets that
// transaction's outcome: its ids, or the error. When the transaction of
// several callers failed and the driver knows nothing of it was committed
// (driver.IsNotCommitted: a refused row, a connection lost before the
// commit, a lock wait that timed out), each of those callers' jobs is
// written again on its own, so that one caller's bad job does not fail the
// others; when the outcome is unknown (a connection lost while
// committing), no job is written twice: each caller of that transaction
// is told its jobs may or may not exist. Close stops taking calls and
// returns once every writer has written every call already queued.
type inserter struct {
	e      *Engine
	plain  *writer
	uniq   []*writer    // uniqueLanes
	gather atomic.Int64 // bound on the wait to gather a batch, ns (maxGather; tests)
	mu     sync.RWMutex
	shut   bool
	taken  atomic.Int64 // calls the writers took from their queues (tests)

	// lanes maps the unique keys of the calls given to a unique lane and
	// not yet written to that lane and their number; load counts those
	// calls per lane.
	lanesMu sync.Mutex
	lanes   map[string]*laneKey
	load    []int
	// spanner is the call whose keys had unwritten calls in several lanes
	// that holds its keys of the other lanes (held) while it waits;
	// changed, when set, is closed at the next change of the lanes, for
	// the calls that wait; spanWaiting counts those calls (tests).
	spanner     *insertReq
	held        map[string]bool
	changed     chan struct{}
	spanWaiting atomic.Int64
	// oneLane puts every call with unique jobs in the first lane (tests
	// that line unique callers up behind one another).
	oneLane atomic.Bool
}

// uniqueLanes is how many writers write the calls with unique jobs.
const uniqueLanes = 4

// laneKey is the lane of the unwritten calls with one unique key, and how
// many they are.
type laneKey struct{ lane, n int }

// writer is one of the inserter's writers: the calls it is to write, and
// done, closed once it has written them all after in was closed.
type writer struct {
	in   chan *insertReq
	done chan struct{}
	// hold is held by the writer around each write; a test holding it
	// keeps the writer's next batch from being written.
	hold sync.Mutex
	// written, if set, is called with each batch once it is written.
	written func([]*insertReq)
	// writing is when the write in progress began (Unix ns), 0 between
	// writes.
	writing atomic.Int64
}

type insertReq struct {
	ctx  context.Context // the caller's: once it ends, its jobs are not written again
	jobs []driver.InsertParams
	ids  []int64
	dup  []bool // per job: a unique job whose key was held (ids has the holder)
	err  error
	done chan struct{}
	lane int // its unique lane, for a call with unique jobs
}

// flushTimeout bounds one write of a batch, and separately the writes
// again of its callers one by one after it failed.
const flushTimeout = 30 * time.Second

// maxGather bounds how long a writer waits to gather a batch (see run).
const maxGather = 2 * time.Millisecond

func newInserter(e *Engine) *inserter {
	i := &inserter{e: e, plain: newWriter(), lanes: map[string]*laneKey{}, load: make([]int, uniqueLanes)}
	i.gather.Store(int64(maxGather))
	go i.run(i.plain)
	for range uniqueLanes {
		w := newWriter()
		w.written = i.unlane
		i.uniq = append(i.uniq, w)
		go i.run(w)
	}
	return i
}

// lane picks the unique lane of req (see inserter) and counts req in it
// until unlane. When req must wait first (its keys have unwritten calls
// in several lanes, or another waiting call holds one of them), it
// returns nil and a channel closed once the lanes change.
func (i *inserter) lane(req *insertReq) (*writer, <-chan struct{}) {
	i.lanesMu.Lock()
	defer i.lanesMu.Unlock()
	lane, spans := -1, false
	for _, j := range req.jobs {
		if j.UniqueKey == nil {
			continue
		}
		if i.held[string(j.UniqueKey)] && i.spanner != req {
			return nil, i.waitChange()
		}
		if lk := i.lanes[string(j.UniqueKey)]; lk != nil {
			if lane < 0 {
				lane = lk.lane
			} else if lk.lane != lane {
				spans = true
			}
		}
	}
	if spans {
		if i.spanner != nil && i.spanner != req {
			return nil, i.waitChange()
		}
		i.spanner = req
		if i.held == nil {
			i.held = map[string]bool{}
		}
		for _, j := range req.jobs {
			if lk := i.lanes[string(j.UniqueKey)]; j.UniqueKey != nil && lk != nil && lk.lane != lane {
				i.held[string(j.UniqueKey)] = true
			}
		}
		return nil, i.waitChange()
	}
	i.unhold(req)
	if lane < 0 {
		lane = i.freeLane()
	}
	req.lane = lane
	i.load[lane]++
	for _, j := range req.jobs {
		if j.UniqueKey == nil {
			continue
		}
		lk := i.lanes[string(j.UniqueKey)]
		if lk == nil {
			lk = &laneKey{lane: lane}
			i.lanes[string(j.UniqueKey)] = lk
		}
		lk.n++
	}
	return i.uniq[lane], nil
}

// laneStall is how long a lane's write may take before new calls go to
// another lane: a unique insert waiting for an application's transaction.
const laneStall = 100 * time.Millisecond

// freeLane picks the lane of a call none of whose keys has an unwritten
// call: the first lane whose write, if any, began less than laneStall
// ago, so that calls gather in one lane's batches as long as it flows;
// when every lane is stalled, the one with the fewest calls not yet
// written. lanesMu is held.
func (i *inserter) freeLane() int {
	if i.oneLane.Load() {
		return 0
	}
	now := time.Now().UnixNano()
	for l, w := range i.uniq {
		if since := w.writing.Load(); since == 0 || now-since < int64(laneStall) {
			return l
		}
	}
	lane := 0
	for l, n := range i.load {
		if n < i.load[lane] {
			lane = l
		}
	}
	return lane
}

// waitChange returns the channel closed at the next change of the lanes;
// lanesMu is held.
func (i *inserter) waitChange() <-chan struct{} {
	if i.changed == nil {
		i.changed = make(chan struct{})
	}
	return i.changed
}

// signal closes the channel of the calls waiting for a change of the
// lanes; lanesMu is held.
func (i *inserter) signal() {
	if i.changed != nil {
		close(i.changed)
		i.changed = nil
	}
}

// unhold releases the keys req holds, if it is the spanner; lanesMu is
// held.
func (i *inserter) unhold(req *insertReq) {
	if i.spanner == req {
		i.spanner, i.held = nil, nil
		i.signal()
	}
}

// abandon releases the keys of req, a call that waited for a lane and
// will not be queued (its context ended, or the inserter closed).
func (i *inserter) abandon(req *insertReq) {
	i.lanesMu.Lock()
	defer i.lanesMu.Unlock()
	i.unhold(req)
}

// unlane stops counting reqs in their lanes: they were written, or they
// were never queued.
func (i *inserter) unlane(reqs []*insertReq) {
	i.lanesMu.Lock()
	defer i.lanesMu.Unlock()
	for _, r := range reqs {
		i.load[r.lane]--
		for _, j := range r.jobs {
			if j.UniqueKey == nil {
				continue
			}
			k := string(j.UniqueKey)
			if lk := i.lanes[k]; lk != nil {
				if lk.n--; lk.n == 0 {
					delete(i.lanes, k)
				}
			}
		}
	}
	i.signal()
}

func newWriter() *writer {
	return &writer{in: make(chan *insertReq, 1024), done: make(chan struct{})}
}

// insert queues jobs for the writer of their kind (see inserter) and waits
// for their commit. If ctx ends first the error says the jobs may or may
// not have been committed.
func (i *inserter) insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, []bool, error) {
	req := &insertReq{ctx: ctx, jobs: jobs, done: make(chan struct{})}
	var w *writer
	for w == nil {
		i.mu.RLock()
		if i.shut {
			i.mu.RUnlock()
			i.abandon(req)
			return nil, nil, ErrStopped
		}
		if !hasUnique(jobs) {
			w = i.plain
			break
		}
		var wait <-chan struct{}
		if w, wait = i.lane(req); w != nil {
			break
		}
		// Its keys are in several lanes, or held by a call that waits
		// for that: it waits, unqueued and without the lock (close
		// does not wait for it), until the lanes change.
		i.mu.RUnlock()
		i.spanWaiting.Add(1)
		select {
		case <-wait:
			i.spanWaiting.Add(-1)
		case <-ctx.Done():
			i.spanWaiting.Add(-1)
			i.abandon(req)
			return nil, nil, ctx.Err()
		}
	}
	select {
	case w.in <- req:
	case <-ctx.Done():
		if w.written != nil {
			w.written([]*insertReq{req})
		}
		i.mu.RUnlock()
		return nil, nil, ctx.Err()
	}
	i.mu.RUnlock()
	select {
	case <-req.done:
		return req.ids, req.dup, req.err
	case <-ctx.Done():
		return nil, nil, Unconfirmed(fmt.Errorf("conveyor: enqueue: %w before the commit was confirmed; the job may or may not exist", ctx.Err()))
	}
}

// queued is how many enqueue calls wait for a writer (tests).
func (i *inserter) queued() int {
	n := len(i.plain.in)
	for _, w := range i.uniq {
		n += len(w.in)
	}
	return n
}

func (i *inserter) close() {
	i.mu.Lock()
	if !i.shut {
		i.shut = true
		close(i.plain.in)
		for _, w := range i.uniq {
			close(w.in)
		}
	}
	i.mu.Unlock()
	<-i.plain.done
	for _, w := range i.uniq {
		<-w.done
	}
}

// run writes w's batches, one at a time. A batch takes every caller
// already waiting, up to InsertBatch jobs. When it holds fewer callers
// than the batch before it, the writer waits a little for more (at most
// half the last write's duration, at most gather): the callers of a write
// return together and most call again at once, and without the wait the
// first of them would be written on its own, the others behind it, so
// that every other commit carried a handful of jobs. A lone caller after
// a lone caller is written at once.
func (i *inserter) run(w *writer) {
	defer close(w.done)
	max := i.e.cfg.InsertBatch
	var batch []*insertReq
	var timer *time.Timer
	prevCallers, prevDur := 0, time.Duration(0)
	for req := range w.in {
		batch = append(batch[:0], req)
		n := len(req.jobs)
		var expire <-chan time.Time
	fill:
		for n < max {
			select {
			case r, ok := <-w.in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
				n += len(r.jobs)
				continue
			default:
			}
			if len(batch) >= prevCallers {
				break fill
			}
			if expire == nil {
				wait := min(prevDur/2, time.Duration(i.gather.Load()))
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				expire = timer.C
			}
			select {
			case r, ok := <-w.in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
				n += len(r.jobs)
			case <-expire:
				break fill
			}
		}
		if expire != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		i.taken.Add(int64(len(batch)))
		w.hold.Lock()
		t0 := time.Now()
		w.writing.Store(t0.UnixNano())
		i.write(batch)
		w.writing.Store(0)
		prevCallers, prevDur = len(batch), time.Since(t0)
		w.hold.Unlock()
		if w.written != nil {
			w.written(batch)
		}
	}
}

// write writes the jobs of reqs in one transaction and tells each caller
// its outcome; after a failure that committed nothing, it writes each
// caller's jobs again on its own (see inserter).
func (i *inserter) write(reqs []*insertReq) {
	if len(reqs) == 0 {
		return
	}
	err := i.try(reqs, time.Now().Add(flushTimeout))
	if err == nil {
		return
	}
	if len(reqs) == 1 || !driver.IsNotCommitted(err) {
		for _, r := range reqs {
			i.fail(r, err)
		}
		return
	}
	deadline := time.Now().Add(flushTimeout)
	for _, r := range reqs {
		if r.ctx.Err() != nil || !time.Now().Before(deadline) {
			// The caller gave up (it was told its job may or may not
			// exist), or there is no time left: nothing of it was
			// committed, and it is not written again.
			i.fail(r, err)
			continue
		}
		if rerr := i.try([]*insertReq{r}, deadline); rerr != nil {
			i.fail(r, rerr)
		}
	}
}

// try inserts the jobs of reqs in one transaction; on success it gives
// each caller its ids and returns nil, on failure it returns the error
// and tells no one.
func (i *inserter) try(reqs []*insertReq, deadline time.Time) error {
	var all []driver.InsertParams
	if len(reqs) == 1 {
		all = reqs[0].jobs
	} else {
		n := 0
		for _, r := range reqs {
			n += len(r.jobs)
		}
		all = make([]driver.InsertParams, 0, n)
		for _, r := range reqs {
			all = append(all, r.jobs...)
		}
	}
	// Jobs this process's idle workers of their queue can take are
	// claimed by the insert itself (insertclaim.go). A job flagged to be
	// claimed may send no notification: no count is taken for it.
	res, flags := i.e.reserveFor(all)
	var taken []string
	if i.e.drv.Capabilities().Listen {
		taken = i.e.self.take(all, flags)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	var (
		ids     []int64
		dup     []bool
		claimed []*driver.JobRow
		err     error
	)
	sent := time.Now()
	if flags != nil {
		ids, claimed, err = i.e.ic.InsertClaiming(ctx, all, driver.InsertClaim{Claim: flags, Lease: i.e.cfg.Lease, Worker: i.e.id})
		if err == nil {
			dup = make([]bool, len(all))
		}
	} else {
		ids, dup, err = i.e.insertSplit(ctx, nil, all)
	}
	cancel()
	i.e.metrics.InsertRounds.Add(1)
	// A claimed job's queue is not notified: for the counts, it is as if
	// it had not gone in.
	i.e.self.give(taken, all, notified(dup, claimed), err != nil)
	if err != nil {
		i.e.settleReservations(res, nil, sent)
		// A notification passed over meanwhile on the strength of these
		// counts is made up for here (see selfNotes).
		for _, q := range taken {
			i.e.wake(q)
		}
		return err
	}
	off := 0
	for _, r := range reqs {
		r.ids, r.dup = ids[off:off+len(r.jobs)], dup[off:off+len(r.jobs)]
		off += len(r.jobs)
		close(r.done)
	}
	i.e.settleReservations(res, claimed, sent)
	i.e.wakeFor(all, claimed)
	return nil
}

// notified merges dup (held unique jobs) and claimed (jobs claimed at
// insert, nil for none) into the jobs whose insert sent no notification
// of their queue (nil for none).
func notified(dup []bool, claimed []*driver.JobRow) []bool {
	if claimed == nil {
		return dup
	}
	out := make([]bool, len(claimed))
	for k, r := range claimed {
		out[k] = r != nil || (dup != nil && dup[k])
	}
	return out
}

// fail tells r's caller that its jobs were not inserted (err marked
// NotCommitted), or that they may have been.
func (i *inserter) fail(r *insertReq, err error) {
	if driver.IsNotCommitted(err) {
		r.err = fmt.Errorf("conveyor: enqueue of %d job(s) failed, none was inserted: %w", len(r.jobs), err)
	} else {
		r.err = Unconfirmed(fmt.Errorf("conveyor: enqueue of %d job(s) failed before the commit was confirmed, so they may exist: %w", len(r.jobs), err))
	}
	close(r.done)
}

// ErrUnconfirmed is matched (errors.Is) by the errors Unconfirmed marks.
var ErrUnconfirmed = errors.New("conveyor: enqueue not confirmed: the jobs may or may not exist")

// unconfirmed marks the error of an enqueue whose jobs may or may not
// have been committed.
type unconfirmed struct{ err error }

func (e unconfirmed) Error() string        { return e.err.Error() }
func (e unconfirmed) Unwrap() error        { return e.err }
func (e unconfirmed) Is(target error) bool { return target == ErrUnconfirmed }

// Unconfirmed marks err (nil stays nil) as the error of an enqueue whose
// jobs may or may not exist: the connection was lost while committing, or
// the caller stopped waiting first. The message is err's; errors.Is
// matches it with ErrUnconfirmed.
func Unconfirmed(err error) error {
	if err == nil || errors.Is(err, ErrUnconfirmed) {
		return err
	}
	return unconfirmed{err}
}

// hasUnique reports whether any of jobs is unique.
func hasUnique(jobs []driver.InsertParams) bool {
	return slices.ContainsFunc(jobs, func(j driver.InsertParams) bool { return j.UniqueKey != nil })
}

// wakeFor nudges local fetchers of queues that received jobs due now,
// but for the jobs claimed at insert (claimed, by index; nil for none).
func (e *Engine) wakeFor(jobs []driver.InsertParams, claimed []*driver.JobRow) {
	var last string
	now := time.Now()
	for k, j := range jobs {
		if j.Delay > 0 || (!j.RunAt.IsZero() && j.RunAt.After(now)) || j.Queue == last || claimed != nil && claimed[k] != nil {
			continue
		}
		last = j.Queue
		e.wake(j.Queue)
	}
}

// Insert enqueues jobs through the group-commit writer and returns their
// ids and, per job, whether it was a unique job whose key was held (its id
// is then the holder's).
func (e *Engine) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, []bool, error) {
	return e.ins.insert(ctx, jobs)
}

// InsertTx enqueues jobs inside the caller's transaction, as Insert.
// Fetchers in this process learn of them from the notification sent at
// commit (PostgreSQL) or their next poll.
func (e *Engine) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if tx == nil {
		return nil, nil, fmt.Errorf("conveyor: enqueue in a nil transaction: %w", driver.ErrTxType)
	}
	return e.insertSplit(ctx, tx, jobs)
}

// insertSplit inserts jobs in tx, or without one (in one transaction of
// the driver's own) when tx is nil: a batch of plain jobs with Insert or
// InsertTx, one with unique jobs with InsertUnique, which inserts its
// plain jobs in the same transaction. Unique jobs are inserted once per
// distinct key: a later job of the batch with the key of an earlier one
// is its duplicate.
func (e *Engine) insertSplit(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if !hasUnique(jobs) {
		// The common batch, no unique job: one insert, as before unique
		// jobs existed.
		var ids []int64
		var err error
		if tx == nil {
			ids, err = e.drv.Insert(ctx, jobs)
		} else {
			ids, err = e.drv.InsertTx(ctx, tx, jobs)
		}
		if err != nil {
			return nil, nil, err
		}
		return ids, make([]bool, len(jobs)), nil
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	var send []driver.InsertParams
	var sentAt []int
	first := map[string]int{} // key -> index in send
	alias := map[int]int{}    // job index -> index in send of its key's first job
	for i := range jobs {
		if k := jobs[i].UniqueKey; k != nil {
			if at, ok := first[string(k)]; ok {
				alias[i] = at
				continue
			}
			first[string(k)] = len(send)
		}
		send, sentAt = append(send, jobs[i]), append(sentAt, i)
	}
	got, gotDup, err := e.drv.InsertUnique(ctx, tx, send)
	if err != nil {
		return nil, nil, err
	}
	for k, i := range sentAt {
		ids[i], dup[i] = got[k], gotDup[k]
	}
	for i, k := range alias {
		ids[i], dup[i] = got[k], true
	}
	return ids, dup, nil
}

// BulkInsert streams many jobs in one transaction and wakes local
// fetchers. A batch with unique jobs goes through InsertUnique (plain
// jobs in the same transaction); only the jobs inserted are counted.
func (e *Engine) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	if hasUnique(jobs) {
		_, dup, err := e.insertSplit(ctx, nil, jobs)
		if err != nil {
			return 0, err
		}
		var n int64
		for _, d := range dup {
			if !d {
				n++
			}
		}
		e.wakeFor(jobs, nil)
		return n, nil
	}
	n, err := e.drv.BulkInsert(ctx, jobs)
	if err == nil {
		e.wakeFor(jobs, nil)
	}
	return n, err
}

// QueuedInserts is how many Insert calls wait for the group-commit
// writers, and TakenInserts how many they have taken so far: for tests
// that line callers up behind a write in progress.
func (e *Engine) QueuedInserts() int { return e.ins.queued() }

// TakenInserts: see QueuedInserts.
func (e *Engine) TakenInserts() int64 { return e.ins.taken.Load() }

// OneUniqueLane makes the engine write every call with unique jobs in one
// lane, one batch after another, as a single writer would: for tests that
// line unique callers up behind a waiting one.
func (e *Engine) OneUniqueLane() { e.ins.oneLane.Store(true) }

// HoldPlainInserts keeps the writer of plain jobs from writing its next
// batch until release is called, as a write in progress would: for tests
// that line callers of plain jobs up behind it. Unique callers are held
// by an application's transaction holding a key.
func (e *Engine) HoldPlainInserts() (release func()) {
	e.ins.plain.hold.Lock()
	var once sync.Once
	return func() { once.Do(e.ins.plain.hold.Unlock) }
}
