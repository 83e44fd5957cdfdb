package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Shutdown with remote workers: a remote outcome honours its context on
// a full completer queue, the engine's lock is not held across a closing
// completer, a waiting remote claim ends at Close, and a Close during a
// running Stop keeps the outcomes of jobs that finish meanwhile.

// stuckCompleter returns a fake whose Complete blocks until release is
// closed, an engine on it, and the engine's completer once its writer is
// stuck on a first remote outcome and its queue is full of others.
func stuckCompleter(t *testing.T) (*fakeDriver, *Engine, *completer, chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	d := &fakeDriver{complete: func(ctx context.Context, os []driver.Outcome) ([]int64, error) {
		<-release
		ids := make([]int64, len(os))
		for i, o := range os {
			ids[i] = o.ID
		}
		return ids, nil
	}}
	e := New(d, testConfig(10*time.Second), nil)
	bg := context.Background()
	go e.CompleteRemote(bg, 1, 1, nil)
	waitFor(t, "the first batch", func() bool { return d.count("complete") == 1 })
	c := e.completer()
	for id := int64(2); id < 2+int64(cap(c.in)); id++ {
		go e.CompleteRemote(bg, id, 1, nil)
	}
	waitFor(t, "the completer's queue full", func() bool { return len(c.in) == cap(c.in) })
	return d, e, c, release
}

// settleRemote says it returns ctx's error when ctx ends first; a remote
// outcome blocked on the completer's full queue (the database not
// answering) must return too, not hold its request until the database
// answers.
func TestSettleRemoteHonoursCtxOnFullQueue(t *testing.T) {
	_, e, _, release := stuckCompleter(t)
	defer func() { close(release); e.Close(context.Background()) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.CompleteRemote(ctx, 1000, 1, nil) }()
	cancel()
	if err := recv(t, "CompleteRemote to return after its context was cancelled", done); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// While Stop (or Close) waits to close a completer whose writer is stuck
// on the database, a remote outcome calling e.completer() must not hold
// the engine's lock while it waits for the completer's: wake (every
// enqueue's, the listener's) and isClosed (every remote call's) take it.
func TestEngineLockNotHeldAcrossCompleterClose(t *testing.T) {
	_, e, c, release := stuckCompleter(t)
	defer func() { close(release); e.Close(context.Background()) }()
	go e.CompleteRemote(context.Background(), 5000, 1, nil) // blocked in submit, holding c.mu.RLock
	time.Sleep(50 * time.Millisecond)
	go c.close() // as Stop does: waits for c.mu.Lock
	waitFor(t, "close to begin", func() bool {
		select {
		case <-c.closing:
			return true
		default:
			return false
		}
	})
	time.Sleep(50 * time.Millisecond)
	go e.CompleteRemote(context.Background(), 5001, 1, nil) // e.completer(): e.mu, then c.closed()
	time.Sleep(50 * time.Millisecond)
	woke := make(chan struct{})
	go func() { e.wake("q"); close(woke) }()
	recv(t, "wake while a completer closes", woke)
}

// A remote claim waiting for a job ends when the engine is closed: it
// does not go on claiming through the driver, which the client closes
// right after the engine.
func TestWaitingClaimEndsAtClose(t *testing.T) {
	var closed atomic.Bool
	var after atomic.Int64
	d := &fakeDriver{onClaim: func(driver.ClaimParams) {
		if closed.Load() {
			after.Add(1)
		}
	}}
	e := New(d, testConfig(10*time.Second), nil)
	got := make(chan error, 1)
	go func() {
		_, err := e.ClaimRemote(context.Background(), RemoteClaim{Queue: "r", Limit: 1, Lease: time.Minute, Wait: time.Hour})
		got <- err
	}()
	waitFor(t, "the first claim", func() bool { return d.count("claim") >= 1 })
	closed.Store(true)
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	recv(t, "the waiting claim to end after Close", got)
	if n := after.Load(); n > 1 {
		t.Errorf("%d claims reached the driver after Close", n)
	}
}

// Close while Stop waits for running jobs: a job that finishes within
// the shutdown grace has its outcome written (as before remote outcomes
// shared the completer), not dropped and the job released to run again.
func TestCloseDuringStopKeepsOutcomes(t *testing.T) {
	d := &fakeDriver{}
	cfg := testConfig(10 * time.Second)
	cfg.ShutdownTimeout = 20 * time.Second
	started, unblock := make(chan struct{}), make(chan struct{})
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		close(started)
		<-unblock
		return nil
	}})
	d.add(job(1))
	e.Wake("q")
	recv(t, "the job to start", started)
	stopped := stopAsync(e)
	waitFor(t, "Stop to begin", func() bool { return e.stopping.Load() })
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // let Close run while Stop waits for the job
	close(unblock)
	recv(t, "Stop", stopped)
	recv(t, "Close", closed)
	if got := completedIDs(d); len(got) != 1 {
		t.Fatalf("completed %v, want job 1 (released %d times)", got, d.released.Load())
	}
}
