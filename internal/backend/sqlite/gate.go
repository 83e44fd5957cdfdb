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
// and inserts and lose its lease while its process is alive. The gate
// queues writers in two classes, each first come first served: the lease
// path (heartbeat, complete, release) always goes before everything else
// that waits, so it waits for at most the one write in progress in this
// process. Every driver of this process on the same file shares one gate
// (see gateFor), so two clients of one file do not race each other on the
// file lock either.
type gate struct {
	mu   sync.Mutex
	held bool
	high []chan struct{}
	low  []chan struct{}
	refs int // drivers using it; guarded by gatesMu
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

// acquire waits for the write connection; lease selects the lease class.
// It returns ctx's error if ctx ends first, owning nothing.
func (g *gate) acquire(ctx context.Context, lease bool) error {
	g.mu.Lock()
	if !g.held {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	if lease {
		g.high = append(g.high, ch)
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
	if g.remove(ch) {
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	// Granted while ctx ended: pass it on.
	<-ch
	g.release()
	return ctx.Err()
}

// remove takes ch out of its queue; false if it was already granted.
func (g *gate) remove(ch chan struct{}) bool {
	for _, q := range []*[]chan struct{}{&g.high, &g.low} {
		for i, c := range *q {
			if c == ch {
				*q = append((*q)[:i], (*q)[i+1:]...)
				return true
			}
		}
	}
	return false
}

// release hands the connection to the next lease-path waiter, else the
// next other waiter, else frees it.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var next chan struct{}
	switch {
	case len(g.high) > 0:
		next, g.high = g.high[0], g.high[1:]
	case len(g.low) > 0:
		next, g.low = g.low[0], g.low[1:]
	default:
		g.held = false
		return
	}
	next <- struct{}{}
}
