package web

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// listenIdle is how long the handler keeps its listener open after the
// last long-polling claim ended.
const listenIdle = 30 * time.Second

// listening wakes long-polling claims from the database's notifications
// (PostgreSQL's LISTEN), as the in-process fetchers are woken, so that a
// job enqueued by any process is claimed at once rather than at the next
// poll. The listener is opened at the first long poll and closed
// listenIdle after the last one, or by Close.
type listening struct {
	mu      sync.Mutex
	waiters int
	running bool
	closed  bool
	cancel  context.CancelFunc
	idle    *time.Timer
	done    chan struct{}
}

// listenStart registers a long-polling claim, starting the listener if
// the backend has one and it is not running.
func (h *Handler) listenStart() {
	if !h.drv.Capabilities().Listen {
		return
	}
	l := &h.listen
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiters++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.running || l.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.running, l.cancel, l.done = true, cancel, make(chan struct{})
	go h.listenLoop(ctx, l.done)
}

// listenDone unregisters a long-polling claim; the listener stops
// listenIdle after the last one.
func (h *Handler) listenDone() {
	if !h.drv.Capabilities().Listen {
		return
	}
	l := &h.listen
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiters--
	if l.waiters > 0 || !l.running {
		return
	}
	l.idle = time.AfterFunc(listenIdle, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.waiters == 0 && l.running {
			l.cancel()
			l.running = false
		}
	})
}

func (h *Handler) listenLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	defer func() {
		h.listen.mu.Lock()
		if h.listen.done == done {
			h.listen.running = false
		}
		h.listen.mu.Unlock()
	}()
	ln, err := h.drv.Listen(ctx)
	if err != nil {
		if ctx.Err() == nil {
			h.opts.Logger.Warn("conveyor web: no notifications for long-polling claims (they poll)", "err", err)
		}
		return
	}
	defer ln.Close()
	for {
		q, err := ln.Wait(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			h.opts.Logger.Warn("conveyor web: waiting for notifications", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		case q == driver.CancelNotice:
		case q == "": // reconnected: something may have been missed
			h.wake.notifyAll()
		default:
			h.wake.notify(q)
		}
	}
}

// Close stops the handler's listener for long-polling claims (opened on
// PostgreSQL at the first long poll) and waits for it. The handler keeps
// serving; its long polls then only poll. Close does not close the
// client.
func (h *Handler) Close() error {
	l := &h.listen
	l.mu.Lock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
	}
	done := l.done
	if l.running {
		l.cancel()
	}
	l.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}
