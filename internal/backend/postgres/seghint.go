package postgres

import (
	"math"
	"sync"
	"time"
)

// Claim hints: where a queue's next claim may start in the ready segments.
//
// A claim reads the claim index (queue, priority, pos) of every live ready
// segment from the queue's start. The entries of the jobs claimed before
// stay in the index until vacuum removes them (and none can while a
// snapshot is held), so in a deep queue each claim walked past every job
// claimed from the segment so far: a drain of 100,000 jobs spent a fifth
// of the server's CPU there, growing with the depth. After a claim that
// took a full batch, the next one starts past the last job it took,
// (priority, pos) > hint, a bound the index positions on.
//
// A job can appear below the hint: one whose inserting transaction
// committed after the claim's snapshot (pos is drawn when the row is
// written, not when it commits), one of a higher priority enqueued since,
// one moved into ready by a promotion, rescue, release, retry or reclaim,
// or one another process's claim had locked (and skipped) and then gave
// back by rolling back. A hinted claim never loses such a job; it may pass
// it over for a while, bounded thus:
//   - every path that makes a job available notifies its queue on the wake
//     channel at commit (a reclaim notifies !segments); the listener's
//     notification, like every write of this driver into ready, starts the
//     queue's hint over, and a claim does not set a hint if a wake arrived
//     while it ran (wake generations), so a job committed after a claim's
//     snapshot is claimed by the first claim after its notification;
//   - a hinted claim that comes back short claims the rest from the
//     queue's start at once (the queue may look drained only because of
//     the hint);
//   - a hint lasts hintTTL from the claim that read the queue from its
//     start (a lost notification, a rolled-back claim of another process,
//     a maintenance round that failed after moving jobs): hinted claims
//     that follow move it forward but do not extend it, so a queue's
//     claims read it from its start at least once per hintTTL however
//     long its backlog lasts;
//   - a listener that reconnects starts every hint over.
// Priorities hold the same way: a job of a higher priority than the hint's
// is enqueued with a notification.

// hintTTL bounds how long a hint is used before a claim reads the queue
// from its start again.
const hintTTL = time.Second

// claimHint is where the next claim of a queue starts: past (prio, pos).
type claimHint struct {
	prio int32
	pos  int64
	// gen and all are the wake generations the claim that set the hint
	// began under; until is when it expires.
	gen, all uint64
	until    time.Time
}

// noHint is a bound below every job: (priority, pos) > (MinInt32,
// MinInt64) holds for every row (pos is a sequence's value, or 0).
var noHint = claimHint{prio: math.MinInt32, pos: math.MinInt64}

// claimHints holds the hints of the queues this process claims.
type claimHints struct {
	mu    sync.Mutex
	all   uint64            // bumped by wakeAll
	gens  map[string]uint64 // bumped by wake(queue)
	hints map[string]claimHint
}

// begin returns where a claim of queue starts (noHint, false when it has
// no valid hint) and the generations the claim begins under, for set.
// A queue is tracked from its first claim on: wakes of queues this
// process never claimed are not kept.
func (h *claimHints) begin(queue string, now time.Time) (claimHint, bool, uint64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gen, ok := h.gens[queue]
	if !ok {
		if h.gens == nil {
			h.gens = map[string]uint64{}
		}
		h.gens[queue] = 0
	}
	if c, ok := h.hints[queue]; ok && c.gen == gen && c.all == h.all && now.Before(c.until) {
		return c, true, gen, h.all
	}
	return noHint, false, gen, h.all
}

// set records the hint of queue after a claim that took a full batch
// ending at (prio, pos), unless a wake came since the claim began. from is
// the hint that claim started past (noHint: the queue's start): a hint
// expires hintTTL after the last claim from the queue's start.
func (h *claimHints) set(queue string, prio int32, pos int64, from claimHint, gen, all uint64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gens[queue] != gen || h.all != all {
		return
	}
	until := from.until
	if until.IsZero() {
		until = now.Add(hintTTL)
	}
	if h.hints == nil {
		h.hints = map[string]claimHint{}
	}
	h.hints[queue] = claimHint{prio: prio, pos: pos, gen: gen, all: all, until: until}
}

// drop forgets queue's hint (its last claim came back short).
func (h *claimHints) drop(queue string) {
	h.mu.Lock()
	delete(h.hints, queue)
	h.mu.Unlock()
}

// wake starts the hints of queues over: jobs may have become available
// in them below their hints.
func (h *claimHints) wake(queues ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, q := range queues {
		if gen, ok := h.gens[q]; ok {
			h.gens[q] = gen + 1
			delete(h.hints, q)
		}
	}
}

// wakeAll starts every queue's hint over.
func (h *claimHints) wakeAll() {
	h.mu.Lock()
	h.all++
	clear(h.hints)
	h.mu.Unlock()
}
