package engine

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// completer is the single writer of attempt outcomes: it turns many
// acknowledgements into one fenced statement per batch. An attempt's lease
// is renewed until its outcome is written; then the completer settles it
// with its fetcher.
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
}

// pending is an outcome and the fetcher holding its attempt's lease.
type pending struct {
	f *fetcher
	o driver.Outcome
}

func newCompleter(e *Engine) *completer {
	c := &completer{
		e:       e,
		in:      make(chan pending, 4*e.cfg.CompleteBatch),
		done:    make(chan struct{}),
		closing: make(chan struct{}),
	}
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
	owners := make([]*fetcher, 0, max)
	for p := range c.in {
		batch, owners = append(batch[:0], p.o), append(owners[:0], p.f)
	fill:
		for len(batch) < max {
			select {
			case p, ok := <-c.in:
				if !ok {
					break fill
				}
				batch, owners = append(batch, p.o), append(owners, p.f)
			default:
				break fill
			}
		}
		// In id order, so that concurrent writers of the same rows (this
		// process's heartbeat, another process's completer) lock them in
		// the same order.
		sort.Sort(byID{batch, owners})
		c.write(batch)
		settleAll(batch, owners)
	}
}

// settleAll settles every outcome of batch with its owner, taking each
// owner's lock once for its run of outcomes (a queue's fetcher owns most
// of a batch; its workers take that lock before and after every job).
func settleAll(batch []driver.Outcome, owners []*fetcher) {
	for i := 0; i < len(batch); {
		f := owners[i]
		f.mu.Lock()
		for ; i < len(batch) && owners[i] == f; i++ {
			f.settleLocked(batch[i].ID, batch[i].Fence)
		}
		f.mu.Unlock()
	}
}

func (c *completer) write(batch []driver.Outcome) {
	e := c.e
	var giveUp <-chan time.Time
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		applied, err := e.drv.Complete(ctx, batch)
		cancel()
		if err == nil {
			e.written(batch, applied)
			return
		}
		e.metrics.DBErrors.Add(1)
		e.warn("conveyor: writing job outcomes failed (retrying)", "jobs", len(batch), "error", err)
		if c.gaveUp {
			e.warn("conveyor: dropped job outcomes at shutdown; their leases will expire and the jobs will be rescued", "jobs", len(batch))
			return
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
			e.warn("conveyor: gave up writing job outcomes at shutdown; their leases will expire and the jobs will be rescued", "jobs", len(batch))
			return
		}
	}
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
	f []*fetcher
}

func (b byID) Len() int           { return len(b.o) }
func (b byID) Less(i, j int) bool { return b.o[i].ID < b.o[j].ID }
func (b byID) Swap(i, j int) {
	b.o[i], b.o[j] = b.o[j], b.o[i]
	b.f[i], b.f[j] = b.f[j], b.f[i]
}
