package sqlite

import (
	"context"
	"path/filepath"
	"sync"
)

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
// in progress in this process (never behind one that is itself waiting
// for another process's lock). Every driver of this process on the same
// file shares one gate (see gateFor).
type gate struct {
	mu    sync.Mutex
	held  bool
	lease int // lease-path writes pending
	low   []chan struct{}
	refs  int // drivers using it; guarded by gatesMu
}

var (
	gatesMu sync.Mutex
	gates   = map[string]*gate{}
)

// gateFor returns the gate of the database file at path, shared by every
// driver of this process on that file, and a function to call once the
// driver is closed.
func gateFor(path string) (*gate, func()) {
	key := path
	if abs, err := filepath.Abs(path); err == nil {
		key = abs
		if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
			key = filepath.Join(dir, filepath.Base(abs))
		}
	}
	gatesMu.Lock()
	defer gatesMu.Unlock()
	g := gates[key]
	if g == nil {
		g = &gate{}
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
			}
		})
	}
}

// acquire waits for the write connection for an ordinary write. It
// returns ctx's error if ctx ends first, owning nothing.
func (g *gate) acquire(ctx context.Context) error {
	g.mu.Lock()
	if !g.held && g.lease == 0 {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	g.low = append(g.low, ch)
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

// leaseBegin announces a lease-path write: no ordinary write starts until
// leaseEnd.
func (g *gate) leaseBegin() {
	g.mu.Lock()
	g.lease++
	g.mu.Unlock()
}

// leaseEnd ends a lease-path write.
func (g *gate) leaseEnd() {
	g.mu.Lock()
	g.lease--
	g.grant()
	g.mu.Unlock()
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
