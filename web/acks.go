package web

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// maxAckBatch is the most outcomes written in one statement.
const maxAckBatch = 500

// ackTimeout bounds one batch's write: a batch is shared by several
// requests, so it runs on a context of its own, not any one request's.
const ackTimeout = 30 * time.Second

// acks writes the outcomes of HTTP workers (complete, fail, snooze) in
// batches, as the in-process completer does: while one batch is being
// written, the outcomes that arrive wait and go together in the next
// statement and commit. Idle, an outcome is written at once, alone; under
// load, one commit serves many requests instead of one each. Each
// outcome is still fenced on its own: the driver says which were applied,
// and a request whose outcome was refused gets its 409.
type acks struct {
	drv driver.Driver

	mu      sync.Mutex
	pending []*ack
	running bool
}

// ack is one request's outcome and, once written, its result.
type ack struct {
	o       driver.Outcome
	done    chan struct{}
	applied bool
	err     error
}

func newAcks(drv driver.Driver) *acks { return &acks{drv: drv} }

// write writes o with whatever other outcomes are waiting and reports
// whether the database applied it (false: the fence is stale). When ctx
// ends first, write returns ctx's error; the outcome may still be written
// with its batch, as a single write may be after its client went away.
func (a *acks) write(ctx context.Context, o driver.Outcome) (bool, error) {
	k := &ack{o: o, done: make(chan struct{})}
	a.mu.Lock()
	a.pending = append(a.pending, k)
	if !a.running {
		a.running = true
		go a.flush()
	}
	a.mu.Unlock()
	select {
	case <-k.done:
		return k.applied, k.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// flush writes batches until nothing waits. One job's outcomes never
// share a batch: the statement would apply one of them and report the
// job's id as applied for both, so a second outcome for the same job
// waits for the next batch, where its fence decides it.
func (a *acks) flush() {
	for {
		a.mu.Lock()
		if len(a.pending) == 0 {
			a.running = false
			a.mu.Unlock()
			return
		}
		var batch, rest []*ack
		seen := make(map[int64]bool, len(a.pending))
		for _, k := range a.pending {
			if len(batch) < maxAckBatch && !seen[k.o.ID] {
				seen[k.o.ID] = true
				batch = append(batch, k)
			} else {
				rest = append(rest, k)
			}
		}
		a.pending = rest
		a.mu.Unlock()

		outcomes := make([]driver.Outcome, len(batch))
		for i, k := range batch {
			outcomes[i] = k.o
		}
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		applied, err := a.drv.Complete(ctx, outcomes)
		cancel()
		ok := make(map[int64]bool, len(applied))
		for _, id := range applied {
			ok[id] = true
		}
		for _, k := range batch {
			k.applied, k.err = ok[k.o.ID], err
			close(k.done)
		}
	}
}
