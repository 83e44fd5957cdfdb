package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// inserter coalesces concurrent Enqueue calls into multi-row inserts: one
// statement and one commit per batch (group commit); each caller returns
// once its own jobs are committed.
type inserter struct {
	e    *Engine
	in   chan *insertReq
	mu   sync.RWMutex
	shut bool
	done chan struct{}
}

type insertReq struct {
	jobs []driver.InsertParams
	ids  []int64
	err  error
	done chan struct{}
}

func newInserter(e *Engine) *inserter {
	i := &inserter{e: e, in: make(chan *insertReq, 1024), done: make(chan struct{})}
	go i.run()
	return i
}

// insert queues jobs and waits for their commit. If ctx ends first the
// error says the jobs may or may not have been committed.
func (i *inserter) insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	req := &insertReq{jobs: jobs, done: make(chan struct{})}
	i.mu.RLock()
	if i.shut {
		i.mu.RUnlock()
		return nil, ErrStopped
	}
	select {
	case i.in <- req:
	case <-ctx.Done():
		i.mu.RUnlock()
		return nil, ctx.Err()
	}
	i.mu.RUnlock()
	select {
	case <-req.done:
		return req.ids, req.err
	case <-ctx.Done():
		return nil, fmt.Errorf("conveyor: enqueue: %w before the commit was confirmed; the job may or may not exist", ctx.Err())
	}
}

func (i *inserter) close() {
	i.mu.Lock()
	if !i.shut {
		i.shut = true
		close(i.in)
	}
	i.mu.Unlock()
	<-i.done
}

func (i *inserter) run() {
	defer close(i.done)
	max := i.e.cfg.InsertBatch
	var batch []*insertReq
	for req := range i.in {
		batch = append(batch[:0], req)
		n := len(req.jobs)
	fill:
		for n < max {
			select {
			case r, ok := <-i.in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
				n += len(r.jobs)
			default:
				break fill
			}
		}
		i.flush(batch, n)
	}
}

func (i *inserter) flush(batch []*insertReq, n int) {
	all := make([]driver.InsertParams, 0, n)
	for _, r := range batch {
		all = append(all, r.jobs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ids, err := i.e.drv.Insert(ctx, all)
	cancel()
	// A failed batch is not retried caller by caller: the failure may have
	// come after the server committed (a connection lost at commit), and a
	// retry would insert those jobs twice. Input is validated before it
	// reaches the inserter, so a batch fails for reasons common to all of
	// its callers (the database), and each caller gets the error.
	if err != nil {
		err = fmt.Errorf("conveyor: enqueue of %d jobs failed (if the connection was lost at commit they may exist): %w", len(all), err)
	}
	off := 0
	for _, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.ids = ids[off : off+len(r.jobs)]
		}
		off += len(r.jobs)
		close(r.done)
	}
	if err != nil {
		return
	}
	i.e.wakeFor(all)
}

// wakeFor nudges local fetchers of queues that received jobs due now.
func (e *Engine) wakeFor(jobs []driver.InsertParams) {
	var last string
	now := time.Now()
	for _, j := range jobs {
		if j.Delay > 0 || (!j.RunAt.IsZero() && j.RunAt.After(now)) || j.Queue == last {
			continue
		}
		last = j.Queue
		e.wake(j.Queue)
	}
}

// Insert enqueues jobs through the group-commit writer.
func (e *Engine) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	return e.ins.insert(ctx, jobs)
}

// InsertTx enqueues jobs inside the caller's transaction. Fetchers in this
// process learn of them from the notification sent at commit (PostgreSQL)
// or their next poll.
func (e *Engine) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	return e.drv.InsertTx(ctx, tx, jobs)
}

// BulkInsert streams many jobs in one transaction and wakes local fetchers.
func (e *Engine) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	n, err := e.drv.BulkInsert(ctx, jobs)
	if err == nil {
		e.wakeFor(jobs)
	}
	return n, err
}
