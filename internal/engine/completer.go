package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// completer is the single writer of attempt outcomes, of this process's
// workers and of the remote workers it serves (remote.go): it turns many
// acknowledgements into one fenced statement per batch. A local attempt's
// lease is renewed until its outcome is written; then the completer
// settles it with its fetcher. A remote outcome's caller waits for its
// result: applied, or refused by the fence.
type completer struct {
	e    *Engine
	in   chan pending
	mu   sync.RWMutex
	shut bool
	done chan struct{}
	// closing is closed when close begins, before it waits for the lock
	// (submitters blocked on a full queue hold it); the writer then gives
	// up on a database that stays unreachable instead of blocking shutdown.
	closing     chan struct{}
	closingOnce sync.Once
	// gaveUp is set once the writer gave up at shutdown: later batches are
	// tried once and dropped (their leases expire and they are rescued).
	gaveUp bool
	// gather bounds the wait for more outcomes, ns (maxGather; tests).
	gather atomic.Int64
}

// pending is an outcome and the fetcher holding its attempt's lease, or,
// for a remote worker's outcome, the channel its result goes to.
type pending struct {
	f   *fetcher
	o   driver.Outcome
	res chan written
	// queue is the job's queue when the outcome is a remote worker's and
	// the engine knows it ("" otherwise; a local outcome's is f's).
	queue string
}

// queueOf is the queue of p's job, "" when unknown.
func (p *pending) queueOf() string {
	if p.f != nil {
		return p.f.queue
	}
	return p.queue
}

// written is the result of a remote outcome: whether the database
// applied it (false: its fence was stale), or why it was not written.
type written struct {
	applied bool
	err     error
}

// errDropped is the result of a remote outcome the completer gave up on
// at shutdown.
var errDropped = fmt.Errorf("%w: the outcome was not written: the database did not answer while the client shut down (the job's lease will expire and it will be rescued)", ErrStopped)

// closed reports whether close has begun. It never waits.
func (c *completer) closed() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

func newCompleter(e *Engine) *completer {
	c := &completer{
		e:       e,
		in:      make(chan pending, 4*e.cfg.CompleteBatch),
		done:    make(chan struct{}),
		closing: make(chan struct{}),
	}
	c.gather.Store(int64(maxGather))
	go c.run()
	return c
}

// submit queues an outcome; false if the completer is closed.
func (c *completer) submit(o pending) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.shut {
		return false
	}
	c.in <- o
	return true
}

// submitCtx queues a remote outcome unless ctx ends first; false if the
// completer is closed.
func (c *completer) submitCtx(ctx context.Context, o pending) (bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.shut {
		return false, nil
	}
	select {
	case c.in <- o:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// close flushes queued outcomes and stops the writer.
func (c *completer) close() {
	c.closingOnce.Do(func() { close(c.closing) })
	c.mu.Lock()
	if !c.shut {
		c.shut = true
		close(c.in)
	}
	c.mu.Unlock()
	<-c.done
}

func (c *completer) run() {
	defer close(c.done)
	max := c.e.cfg.CompleteBatch
	batch := make([]driver.Outcome, 0, max)
	owners := make([]pending, 0, max)
	in := make(map[int64]bool, max)
	// later holds outcomes of jobs already in the batch being filled: one
	// statement would apply one of them and report the job's id as
	// applied for both, so the second waits for the next batch, where its
	// fence decides it. (Two outcomes of one job come from remote workers
	// repeating a request, or from an attempt rescued and claimed again
	// while its first worker still answers.)
	var later []pending
	add := func(p pending) {
		if in[p.o.ID] {
			later = append(later, p)
			return
		}
		in[p.o.ID] = true
		batch, owners = append(batch, p.o), append(owners, p)
	}
	open := true
	// lastWrite is how long the last write took, the bound on the next
	// gathering (see gatherFor).
	var lastWrite time.Duration
	for open || len(later) > 0 {
		batch, owners = batch[:0], owners[:0]
		clear(in)
		carried := later
		later = nil
		for _, p := range carried {
			if len(batch) < max {
				add(p)
			} else {
				later = append(later, p)
			}
		}
		if len(batch) == 0 {
			p, ok := <-c.in
			if !ok {
				open = false
				continue
			}
			add(p)
		}
		var expire <-chan time.Time
	fill:
		for open && len(batch) < max {
			select {
			case p, ok := <-c.in:
				if !ok {
					open = false
					break fill
				}
				add(p)
				continue
			default:
			}
			if expire == nil {
				wait := c.gatherFor(owners, lastWrite)
				if wait <= 0 {
					break fill
				}
				expire = time.After(wait)
			}
			select {
			case p, ok := <-c.in:
				if !ok {
					open = false
					break fill
				}
				add(p)
			case <-expire:
				break fill
			case <-c.closing:
				break fill
			}
		}
		// In id order, so that concurrent writers of the same rows (this
		// process's heartbeat, another process's completer) lock them in
		// the same order.
		sort.Sort(byID{batch, owners})
		began := time.Now()
		applied, err := c.write(batch)
		lastWrite = time.Since(began)
		settleAll(batch, owners, applied, err)
		if len(applied) > 0 && c.e.anyLimited() {
			c.freed(owners)
		}
	}
}

// gatherFor is how long the writer waits for more outcomes before it
// writes a batch that is not full: as long as the last
// write took, at most maxGather, so that while attempts end one after
// another each statement and commit carries those of a write's time
// rather than the one or two that ended during the last round trip
// (gather, maxGather but in tests).
// It does not wait when a queue may be limited (an outcome frees the
// slot another attempt waits for), when the batch holds a remote
// worker's outcome (its caller waits for the answer), at shutdown, or on
// a database with one writer (SQLite: a larger batch holds every other
// write back for longer, and the flow gained nothing from it).
func (c *completer) gatherFor(owners []pending, lastWrite time.Duration) time.Duration {
	if lastWrite <= 0 || c.e.oneWriter || c.closed() || c.e.anyLimited() {
		return 0
	}
	for i := range owners {
		if owners[i].f == nil {
			return 0
		}
	}
	return min(lastWrite, time.Duration(c.gather.Load()))
}

// freed wakes the fetchers and held remote claims of the limited
// queues among owners' jobs: their attempts ended, so slots of those
// queues' limits are free. It is not called when no queue is limited;
// otherwise a job of an unlimited queue costs a lookup in memory.
func (c *completer) freed(owners []pending) {
	var last string
	for i := range owners {
		q := owners[i].queueOf()
		if q == "" || q == last {
			continue
		}
		last = q
		if c.e.limited(q) {
			c.e.slotFreed(q)
		}
	}
}

// settleAll settles every outcome of batch with its owner, taking each
// fetcher's lock once for its run of outcomes (a queue's fetcher owns most
// of a batch; its workers take that lock before and after every job), and
// sends remote outcomes their result: applied (ids from the driver), or
// err when the batch, or the rest of it, was not written.
func settleAll(batch []driver.Outcome, owners []pending, applied []int64, err error) {
	var ok map[int64]bool
	for i := 0; i < len(batch); {
		f := owners[i].f
		if f == nil {
			if ok == nil {
				ok = make(map[int64]bool, len(applied))
				for _, id := range applied {
					ok[id] = true
				}
			}
			if ok[batch[i].ID] {
				// Applied before the write of the rest was given up.
				owners[i].res <- written{applied: true}
			} else {
				owners[i].res <- written{err: err}
			}
			i++
			continue
		}
		f.mu.Lock()
		for ; i < len(batch) && owners[i].f == f; i++ {
			f.settleLocked(batch[i].ID, batch[i].Fence)
		}
		f.mu.Unlock()
	}
}

// write writes one batch, retrying until the database answers; it
// returns the ids applied, or errDropped when it gave up at shutdown
// (with the ids applied before it gave up). A failed write may have
// applied part of the batch (a backend whose Complete takes more than
// one statement): those the driver reports applied are kept and only
// the rest is written again, since written again an applied outcome
// would be refused by its fence as stale.
func (c *completer) write(batch []driver.Outcome) ([]int64, error) {
	e := c.e
	var giveUp <-chan time.Time
	var done []int64 // applied by writes that failed
	todo := batch
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		applied, err := e.drv.Complete(ctx, todo)
		cancel()
		e.metrics.OutcomeRounds.Add(1)
		if err == nil {
			applied = append(done, applied...)
			e.written(batch, applied)
			return applied, nil
		}
		if len(applied) > 0 {
			done = append(done, applied...)
			todo = unapplied(todo, applied)
			if len(todo) == 0 {
				e.written(batch, done)
				return done, nil
			}
		}
		e.metrics.DBErrors.Add(1)
		e.warn("conveyor: writing job outcomes failed (retrying)", "jobs", len(todo), "error", err)
		if c.gaveUp {
			e.warn("conveyor: dropped job outcomes at shutdown; their leases will expire and the jobs will be rescued", "jobs", len(todo))
			return done, errDropped
		}
		if giveUp == nil {
			select {
			case <-c.closing:
				giveUp = time.After(10 * time.Second)
			default:
			}
		}
		select {
		case <-time.After(errBackoff(try)):
		case <-giveUp:
			c.gaveUp = true // only the writer goroutine reads or writes it
			e.warn("conveyor: gave up writing job outcomes at shutdown; their leases will expire and the jobs will be rescued", "jobs", len(todo))
			return done, errDropped
		}
	}
}

// unapplied returns the outcomes of batch whose id is not in applied, in
// a new slice.
func unapplied(batch []driver.Outcome, applied []int64) []driver.Outcome {
	in := make(map[int64]bool, len(applied))
	for _, id := range applied {
		in[id] = true
	}
	out := make([]driver.Outcome, 0, len(batch))
	for _, o := range batch {
		if !in[o.ID] {
			out = append(out, o)
		}
	}
	return out
}

// written counts a batch of outcomes the database answered: the
// completions applied, and the outcomes its fence refused as stale.
func (e *Engine) written(batch []driver.Outcome, applied []int64) {
	ok := make(map[int64]struct{}, len(applied))
	for _, id := range applied {
		ok[id] = struct{}{}
	}
	var done int64
	for _, o := range batch {
		if _, in := ok[o.ID]; in && o.State == driver.StateCompleted {
			done++
		}
	}
	e.metrics.Completed.Add(done)
	e.metrics.StaleAcksRefused.Add(int64(len(batch) - len(applied)))
}

// byID sorts a batch of outcomes and their owners together by job id.
type byID struct {
	o []driver.Outcome
	f []pending
}

func (b byID) Len() int           { return len(b.o) }
func (b byID) Less(i, j int) bool { return b.o[i].ID < b.o[j].ID }
func (b byID) Swap(i, j int) {
	b.o[i], b.o[j] = b.o[j], b.o[i]
	b.f[i], b.f[j] = b.f[j], b.f[i]
}
