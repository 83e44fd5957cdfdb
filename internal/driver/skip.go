package driver

import (
	"sync"
	"sync/atomic"
	"time"
)

// QueueSkip remembers, per queue, until when a driver's claims skip a
// step that last found nothing (for example, the look for jobs without a
// key in a key-limited queue), and forgets it when something the step
// looks for may have arrived (Forget). The zero value skips nothing; it
// is safe for concurrent use.
//
// A claim takes a mark (Look) before the statement of the step, whose
// snapshot is then no older than the mark, and records the skip with
// that mark (SkipFor): a Forget of the queue since the mark cancels the
// skip, so that a claim whose statement ran before a job arrived does
// not hide the job from the claims after the Forget.
type QueueSkip struct {
	m sync.Map     // queue -> *skipEntry, never deleted
	n atomic.Int32 // entries in m: while none, Forget reads nothing else
}

// skipEntry is one queue's skip.
type skipEntry struct {
	until atomic.Int64  // Unix nanoseconds; 0: none
	gen   atomic.Uint64 // Forget calls
}

// Look reports whether queue's step is skipped now and, when it is not,
// returns the mark to give SkipFor should the step find nothing. A claim
// takes it before the statement of the step. The first Look of a queue
// makes its entry.
func (s *QueueSkip) Look(queue string) (skip bool, mark uint64) {
	v, ok := s.m.Load(queue)
	if !ok {
		var loaded bool
		if v, loaded = s.m.LoadOrStore(queue, &skipEntry{}); !loaded {
			s.n.Add(1)
		}
	}
	e := v.(*skipEntry)
	if time.Now().UnixNano() < e.until.Load() {
		return true, 0
	}
	return false, e.gen.Load()
}

// SkipFor skips queue's step for d from now, unless queue was forgotten
// since mark (from Look) was taken.
func (s *QueueSkip) SkipFor(queue string, d time.Duration, mark uint64) {
	v, ok := s.m.Load(queue)
	if !ok {
		return
	}
	e := v.(*skipEntry)
	e.until.Store(time.Now().Add(d).UnixNano())
	// Forget bumps gen, then clears until: a Forget whose bump this read
	// misses clears the store above after it.
	if e.gen.Load() != mark {
		e.until.Store(0)
	}
}

// Forget ends queue's skip at once and cancels the skips of the claims
// that took their mark before it. A queue no claim has skipped costs one
// atomic read, or a lookup once any queue has been.
func (s *QueueSkip) Forget(queue string) {
	if s.n.Load() == 0 {
		return
	}
	v, ok := s.m.Load(queue)
	if !ok {
		return
	}
	e := v.(*skipEntry)
	e.gen.Add(1)
	e.until.Store(0)
}

// ForgetKeyless forgets the queue of every job of jobs without a key
// (InsertParams.Key): a driver calls it when it inserts jobs, after
// their commit when the transaction is its own. Consecutive jobs of one
// queue forget it once.
func (s *QueueSkip) ForgetKeyless(jobs []InsertParams) {
	if s.n.Load() == 0 {
		return
	}
	last := -1
	for i := range jobs {
		if jobs[i].Key != "" || last >= 0 && jobs[last].Queue == jobs[i].Queue {
			continue
		}
		last = i
		s.Forget(jobs[i].Queue)
	}
}
