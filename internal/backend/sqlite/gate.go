package sqlite

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// intentSuffix names the side file of the cross-process half of the gate.
const intentSuffix = "-conveyor-lease"

// maxYield bounds how long a write waits for another process's pending
// lease renewal. A renewal waits for at most the one write in progress in
// each process, so it normally clears in milliseconds. The bound matters
// when the announcing process was stopped (SIGSTOP, a debugger)
// mid-renewal, and on a machine so starved that the writes in progress
// take longer: then waiting is skipped for stuckFor, or until the
// announcements are seen gone.
const maxYield = 250 * time.Millisecond

// stuckFor is how long writes stop yielding after a yield ran out. Not
// until the announcements are seen gone: on a starved machine, with a
// few processes renewing, some renewal is nearly always pending, and
// writes would never yield again just when renewals need it most. A
// stopped announcer costs other processes' ordinary writes at most
// maxYield in every maxYield+stuckFor, never their renewals (which do
// not yield).
const stuckFor = time.Second

// gate orders this process's writes to one database file. SQLite has one
// writer at a time, database/sql hands a freed connection to a waiter
// chosen at random, and SQLite's busy handler polls with sleeps of up to
// 100ms, so under load a heartbeat could wait behind any number of claims
// and inserts and lose its lease while its process is alive. Ordinary
// writes (claims, inserts, maintenance) take the gate in turn, first come
// first served, on the driver's write connection. A lease-path write
// (heartbeat, complete, release) does not take it: it runs on a
// connection of its own and only announces itself, and while one is
// pending no ordinary write starts, so it waits for at most the one write
// in progress in this process, and for that one only briefly
// (maxWaitOrdinary): it may itself be waiting for another process's
// lock. Every driver of this process on the same file shares one gate
// (see gateFor).
//
// Other processes writing the same file are ordered by a side file
// (intentFile): while a heartbeat of this process is pending it holds a
// read lock there, and an ordinary write of any process, before each try
// at SQLite's lock, waits while another process holds one (yield). Of
// the lease path only heartbeats announce themselves across processes:
// they are one batch per HeartbeatInterval per process, so other
// processes are held back rarely and briefly, and a completion that waits
// keeps its lease through them.
//
// An ordinary write that has waited for SQLite's lock longer than
// writeBusyTimeoutMS marks itself starved on a second byte of the side
// file until it ends, and the ordinary writes of other processes that
// have not waited that long yield to it (a starved one yields to
// heartbeats only). SQLite's busy handler sleeps longer the longer a
// connection has waited (1, 2, 5 ... 100 ms between tries), so without
// this the write waiting longest tried least often: on a busy file the
// back-to-back inserts of producer processes won the lock nearly every
// time it came free, and a worker's claims starved for seconds.
type gate struct {
	mu        sync.Mutex
	held      bool
	lease     int // lease-path writes pending
	announced int // of those, heartbeats announced in the side file
	// inflight: an ordinary write is running a statement or transaction
	// on SQLite (never while it only waits to retry); idle is closed when
	// it ends. leaseDone is closed when no lease-path write is pending.
	inflight  bool
	idle      chan struct{}
	leaseDone chan struct{}
	low       []chan struct{}
	refs      int // drivers using it; guarded by gatesMu
	// file is the database file (gateKey): its side file, WAL and shared
	// memory are named after it.
	file string

	side    *intentFile // nil: this process's writes only (sideErr says why)
	sideErr error
	// starved: the side file marks this process's ordinary write as
	// starved (starve). Only the gate's holder touches it.
	starved bool
	// stuckUntil (Unix nanoseconds): a yield to heartbeats ran out;
	// writes do not yield to them again before then, unless the
	// announcements are seen gone. starvedStuckUntil: the same for
	// starved writes.
	stuckUntil        atomic.Int64
	starvedStuckUntil atomic.Int64
}

var (
	gatesMu sync.Mutex
	gates   = map[string]*gate{}
)

// gateFor returns the gate of the database file at path, shared by every
// driver of this process on that file, and a function to call once the
// driver is closed.
func gateFor(path string) (*gate, func()) {
	key := gateKey(path)
	gatesMu.Lock()
	defer gatesMu.Unlock()
	g := gates[key]
	if g == nil {
		g = &gate{file: key}
		g.side, g.sideErr = openIntentFile(key)
		gates[key] = g
	}
	g.refs++
	var once sync.Once
	return g, func() {
		once.Do(func() {
			gatesMu.Lock()
			defer gatesMu.Unlock()
			if g.refs--; g.refs == 0 {
				delete(gates, key)
				if g.side != nil {
					g.side.close()
				}
			}
		})
	}
}

// gateKey is the absolute path of the database file with every symbolic
// link resolved, its name's included, as SQLite resolves it (its WAL and
// shared memory are next to the file a link points to), so that every
// spelling of one file shares a gate and the side file, and the
// checkpointer finds the WAL SQLite writes. A link that points nowhere
// yet is followed too: SQLite creates the file it names.
func gateKey(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	for range 40 { // a bound against a loop of links
		dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
		if err != nil {
			break
		}
		abs = filepath.Join(dir, filepath.Base(abs))
		target, err := os.Readlink(abs)
		if err != nil {
			break // not a link
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		abs = filepath.Clean(target)
	}
	return abs
}

// acquire waits for the write connection for an ordinary write; first
// puts it ahead of every write already waiting (completions). It returns
// ctx's error if ctx ends first, owning nothing.
func (g *gate) acquire(ctx context.Context, first bool) error {
	g.mu.Lock()
	if !g.held && g.lease == 0 {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	if first {
		g.low = append([]chan struct{}{ch}, g.low...)
	} else {
		g.low = append(g.low, ch)
	}
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	for i, c := range g.low {
		if c == ch {
			g.low = append(g.low[:i], g.low[i+1:]...)
			g.mu.Unlock()
			return ctx.Err()
		}
	}
	g.mu.Unlock()
	// Granted while ctx ended: pass it on.
	<-ch
	g.release()
	return ctx.Err()
}

// release ends an ordinary write.
func (g *gate) release() {
	g.mu.Lock()
	g.held = false
	g.grant()
	g.mu.Unlock()
}

// leaseBegin announces a lease-path write: no ordinary write of this
// process starts until leaseEnd. A heartbeat (across) also announces
// itself to other processes.
func (g *gate) leaseBegin(across bool) {
	g.mu.Lock()
	g.lease++
	if across && g.side != nil {
		if g.announced == 0 {
			// A failed lock leaves other processes unaware; the write
			// goes ahead all the same.
			_ = g.side.announce()
		}
		g.announced++
	}
	g.mu.Unlock()
}

// leaseEnd ends a lease-path write begun with the same across.
func (g *gate) leaseEnd(across bool) {
	g.mu.Lock()
	g.lease--
	if across && g.side != nil {
		if g.announced--; g.announced == 0 {
			_ = g.side.withdraw()
		}
	}
	if g.lease == 0 && g.leaseDone != nil {
		close(g.leaseDone)
		g.leaseDone = nil
	}
	g.grant()
	g.mu.Unlock()
}

// maxWaitOrdinary bounds how long a lease-path write waits for the
// ordinary write of this process that is running on SQLite. That write
// may not hold the lock at all: it may be asleep in SQLite's busy handler
// (busy_timeout) behind another process's write, and other processes stop
// yielding to this process's heartbeat after maxYield. Past the bound the
// lease-path write polls for the lock itself, which it takes as soon as it
// is free, ahead of the sleeping ordinary write.
const maxWaitOrdinary = 10 * time.Millisecond

// waitOrdinary waits, for a lease-path write, until the ordinary write of
// this process that is running on SQLite (if any) ends, for at most
// maxWaitOrdinary. An ordinary write that holds the lock normally ends
// within it, and then the two never meet on SQLite's lock, where the
// ordinary write would lose and sleep in the busy handler. Called after
// leaseBegin, so no new ordinary write starts meanwhile.
func (g *gate) waitOrdinary(ctx context.Context) error {
	g.mu.Lock()
	ch := g.idle
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	t := time.NewTimer(maxWaitOrdinary)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// begin marks one try of an ordinary write as running on SQLite, once no
// lease-path write of this process is pending; end ends it.
func (g *gate) begin(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.lease == 0 {
			g.inflight = true
			g.idle = make(chan struct{})
			g.mu.Unlock()
			return nil
		}
		if g.leaseDone == nil {
			g.leaseDone = make(chan struct{})
		}
		ch := g.leaseDone
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// end ends what begin marked.
func (g *gate) end() {
	g.mu.Lock()
	g.inflight = false
	close(g.idle)
	g.idle = nil
	g.mu.Unlock()
}

// starve marks, for other processes, the ordinary write of this process
// that holds the gate as starved: it has waited for SQLite's lock longer
// than writeBusyTimeoutMS, and their ordinary writes now yield to it
// until unstarve. Called by the gate's holder only.
func (g *gate) starve() {
	if g.side == nil || g.starved {
		return
	}
	// A failed lock leaves other processes unaware; the write goes on
	// all the same.
	if g.side.starve() == nil {
		g.starved = true
	}
}

// unstarve ends what starve marked, if it did.
func (g *gate) unstarve() {
	if g.starved {
		_ = g.side.unstarve()
		g.starved = false
	}
}

// Bytes of the side file: a read lock on leaseByte marks a pending lease
// renewal, one on starvedByte an ordinary write that has waited for
// SQLite's lock longer than writeBusyTimeoutMS.
const (
	leaseByte   = 0
	starvedByte = 1
)

// yield waits while another process has a heartbeat pending on the file
// or, unless leasesOnly, a starved ordinary write, for at most maxYield
// each; it returns early only when ctx ends. Ordinary writes call it
// before each try at SQLite's lock; a starved one yields to heartbeats
// only.
func (g *gate) yield(ctx context.Context, leasesOnly bool) {
	if g.side == nil {
		return
	}
	g.yieldTo(ctx, leaseByte, &g.stuckUntil)
	if !leasesOnly {
		g.yieldTo(ctx, starvedByte, &g.starvedStuckUntil)
	}
}

// yieldTo waits while another process holds a read lock on byte at of
// the side file, for at most maxYield, and then not again until stuckFor
// has passed (*stuck, Unix nanoseconds) or the lock is seen gone.
func (g *gate) yieldTo(ctx context.Context, at int64, stuck *atomic.Int64) {
	if until := stuck.Load(); until != 0 {
		if !g.side.othersPending(at) {
			stuck.Store(0)
			return
		}
		if time.Now().UnixNano() < until {
			return
		}
	}
	start := time.Now()
	for g.side.othersPending(at) {
		if time.Since(start) > maxYield {
			stuck.Store(time.Now().Add(stuckFor).UnixNano())
			return
		}
		if pollPause(ctx) != nil {
			return
		}
	}
}

// pollInterval is one polling interval: 0.25 to 0.75ms, jittered so
// that pollers do not move in step.
func pollInterval() time.Duration {
	return 250*time.Microsecond + rand.N(500*time.Microsecond)
}

// pollPause sleeps for the polling interval of lease writes and of writes
// that wait for them (0.25 to 0.75ms, jittered so that pollers do not move
// in step), or until ctx ends, returning ctx's error then.
func pollPause(ctx context.Context) error {
	t := time.NewTimer(pollInterval())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// YieldToLeases waits, for at most a quarter of a second, while a lease
// renewal of a conveyor client on the SQLite database at path is pending,
// in this process or another. SQLite has one writer at a time and no
// queue: an application that begins its write transactions back to back
// on its own handle can take the lock again before a renewal polling for
// it sees it free. Calling this before beginning such a transaction lets
// the renewal go first. It returns at once when no conveyor client of this
// process has path open, and ctx's error if ctx ends first.
func YieldToLeases(ctx context.Context, path string) error {
	key := gateKey(path)
	gatesMu.Lock()
	g := gates[key]
	gatesMu.Unlock()
	if g == nil {
		return nil
	}
	start := time.Now()
	for {
		g.mu.Lock()
		local := g.lease > 0
		g.mu.Unlock()
		if !local {
			break
		}
		if time.Since(start) > maxYield {
			return nil
		}
		if err := pollPause(ctx); err != nil {
			return err
		}
	}
	g.yield(ctx, true)
	return ctx.Err()
}

// grant hands the write connection to the next ordinary writer when it
// is free and no lease-path write is pending. g.mu is held.
func (g *gate) grant() {
	if g.held || g.lease > 0 || len(g.low) == 0 {
		return
	}
	next := g.low[0]
	g.low = g.low[1:]
	g.held = true
	next <- struct{}{}
}
