package engine

import (
	"context"
	"fmt"
	"slices"
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
	dup  []bool // per job: a unique job whose key was held (ids has the holder)
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
func (i *inserter) insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, []bool, error) {
	req := &insertReq{jobs: jobs, done: make(chan struct{})}
	i.mu.RLock()
	if i.shut {
		i.mu.RUnlock()
		return nil, nil, ErrStopped
	}
	select {
	case i.in <- req:
	case <-ctx.Done():
		i.mu.RUnlock()
		return nil, nil, ctx.Err()
	}
	i.mu.RUnlock()
	select {
	case <-req.done:
		return req.ids, req.dup, req.err
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("conveyor: enqueue: %w before the commit was confirmed; the job may or may not exist", ctx.Err())
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
	ids, dup, err := i.e.insertSplit(ctx, nil, all)
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
			r.ids, r.dup = ids[off:off+len(r.jobs)], dup[off:off+len(r.jobs)]
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

// insertSplit inserts jobs in tx, or without one (each driver call its own
// transaction) when tx is nil: plain jobs with Insert or InsertTx, unique
// ones with InsertUnique, once per distinct key (a later job of the batch
// with the key of an earlier one is its duplicate). A batch mixing both
// kinds outside a transaction is two inserts.
func (e *Engine) insertSplit(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	if !slices.ContainsFunc(jobs, func(j driver.InsertParams) bool { return j.UniqueKey != nil }) {
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
	var plain, uniq []driver.InsertParams
	var plainAt, uniqAt []int
	first := map[string]int{} // key -> index in uniq
	alias := map[int]int{}    // job index -> index in uniq of its key's first job
	for i := range jobs {
		if jobs[i].UniqueKey == nil {
			plain, plainAt = append(plain, jobs[i]), append(plainAt, i)
			continue
		}
		if k, ok := first[string(jobs[i].UniqueKey)]; ok {
			alias[i] = k
			continue
		}
		first[string(jobs[i].UniqueKey)] = len(uniq)
		uniq, uniqAt = append(uniq, jobs[i]), append(uniqAt, i)
	}
	if len(plain) > 0 {
		var got []int64
		var err error
		if tx == nil {
			got, err = e.drv.Insert(ctx, plain)
		} else {
			got, err = e.drv.InsertTx(ctx, tx, plain)
		}
		if err != nil {
			return nil, nil, err
		}
		for k, i := range plainAt {
			ids[i] = got[k]
		}
	}
	if len(uniq) > 0 {
		got, gotDup, err := e.drv.InsertUnique(ctx, tx, uniq)
		if err != nil {
			return nil, nil, err
		}
		for k, i := range uniqAt {
			ids[i], dup[i] = got[k], gotDup[k]
		}
		for i, k := range alias {
			ids[i], dup[i] = got[k], true
		}
	}
	return ids, dup, nil
}

// BulkInsert streams many jobs in one transaction and wakes local fetchers.
func (e *Engine) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	var plain, uniq []driver.InsertParams
	for _, j := range jobs {
		if j.UniqueKey == nil {
			plain = append(plain, j)
		} else {
			uniq = append(uniq, j)
		}
	}
	if len(uniq) > 0 {
		// Unique jobs go through InsertUnique, which refuses held keys one
		// by one, in chunks; only the inserted ones are counted.
		var n int64
		if len(plain) > 0 {
			c, err := e.drv.BulkInsert(ctx, plain)
			if err != nil {
				return 0, err
			}
			n = c
		}
		for len(uniq) > 0 {
			chunk := uniq[:min(len(uniq), e.cfg.InsertBatch)]
			uniq = uniq[len(chunk):]
			_, dup, err := e.insertSplit(ctx, nil, chunk)
			if err != nil {
				return n, err
			}
			for _, d := range dup {
				if !d {
					n++
				}
			}
		}
		e.wakeFor(jobs)
		return n, nil
	}
	n, err := e.drv.BulkInsert(ctx, jobs)
	if err == nil {
		e.wakeFor(jobs)
	}
	return n, err
}
