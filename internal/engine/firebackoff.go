package engine

import "time"

// fireBackoff spaces out the maintenance leader's tries of the batches
// whose callback could not be enqueued: after a batch's nth failure in a
// row FireBatches skips it for base doubled n-1 times, at most max. It is
// the leader's memory only: a process that is not (or no longer) the
// leader holds none (reset), so a new leader tries each failing batch
// once at once and then backs off on its own. Skipping never fires
// anything: the callback is still enqueued exactly once, by the firing
// transaction, whenever a try succeeds. An entry not tried again within
// max after its time (the batch fired, was retried by hand, or was left
// past a full round) is forgotten, so the map holds only batches failing
// lately.
type fireBackoff struct {
	base, max time.Duration
	m         map[int64]fireTry
}

// fireTry is one failing batch: its failures in a row and when it may
// be tried again.
type fireTry struct {
	fails int
	next  time.Time
}

// skip returns the function FireBatches asks, at now: true for a batch
// whose wait is not over. Nil when no batch waits.
func (b *fireBackoff) skip(now time.Time) func(int64) bool {
	if len(b.m) == 0 {
		return nil
	}
	return func(id int64) bool {
		t, ok := b.m[id]
		return ok && now.Before(t.next)
	}
}

// failed records a failure of batch id at now and returns the wait
// before its next try (0 when backing off is off: base is not
// positive).
func (b *fireBackoff) failed(id int64, now time.Time) time.Duration {
	if b.base <= 0 {
		return 0
	}
	if b.m == nil {
		b.m = map[int64]fireTry{}
	}
	t := b.m[id]
	t.fails++
	wait := b.base
	for i := 1; i < t.fails && wait < b.max; i++ {
		wait *= 2
	}
	wait = min(wait, max(b.max, b.base))
	t.next = now.Add(wait)
	b.m[id] = t
	return wait
}

// fired forgets batch id: its callback is enqueued.
func (b *fireBackoff) fired(id int64) { delete(b.m, id) }

// forget drops the entries whose wait ended more than max before now.
func (b *fireBackoff) forget(now time.Time) {
	for id, t := range b.m {
		if now.Sub(t.next) > max(b.max, b.base) {
			delete(b.m, id)
		}
	}
}

// reset forgets every batch (leadership lost).
func (b *fireBackoff) reset() { b.m = nil }
