package driver

import (
	"sync"
	"sync/atomic"
	"time"
)

// QueueSkip remembers, per queue, until when a driver's claims skip a
// step that last found nothing, and forgets it when something the step
// looks for may have arrived (Forget). The zero value skips nothing
// until a Skip, and then skips for DefaultSkip; it is safe for
// concurrent use.
//
// Every backend uses one for the look for jobs without a key in a
// key-limited queue: that look reads the queue's claim order and passes
// over the keyed jobs before the first job without one, so in a queue
// whose ready jobs all have a key (the usual key-limited queue) it reads
// all of them to find nothing. After a claim found none, the queue's
// claims skip the look for For, and a job without a key another process
// inserts waits at most that much longer. The driver's own inserts of
// such a job end the skip after their commit (ForgetKeyless). An insert
// in the caller's transaction ends it before that commit: a claim looking
// between the two finds nothing and skips again, and the job may wait
// For longer, as one another process inserted.
//
// A claim takes a mark (Look) before the statement of the step, whose
// snapshot is then no older than the mark, and records the skip with
// that mark (SkipFor): a Forget of the queue since the mark cancels the
// skip, so that a claim whose statement ran before a job arrived does
// not hide the job from the claims after the Forget.
type QueueSkip struct {
	// For is how long a Skip lasts; zero means DefaultSkip. Set it
	// before the first Skip.
	For time.Duration

	m sync.Map     // queue -> *skipEntry, never deleted
	n atomic.Int32 // entries in m: while none, Forget reads nothing else
}

// DefaultSkip is how long a Skip lasts when QueueSkip.For is zero.
const DefaultSkip = time.Second

// skipEntry is one queue's skip.
type skipEntry struct {
	until atomic.Int64  // Unix nanoseconds; 0: none
	gen   atomic.Uint64 // Forget calls
}

// Look reports whether queue's step is to run now (not skipped) and, when
// it is, returns the mark to give Skip should the step find nothing. A
// claim takes it before the statement of the step. The first Look of a
// queue makes its entry.
func (s *QueueSkip) Look(queue string) (look bool, mark uint64) {
	v, ok := s.m.Load(queue)
	if !ok {
		var loaded bool
		if v, loaded = s.m.LoadOrStore(queue, &skipEntry{}); !loaded {
			s.n.Add(1)
		}
	}
	e := v.(*skipEntry)
	if time.Now().UnixNano() < e.until.Load() {
		return false, 0
	}
	return true, e.gen.Load()
}

// Skip skips queue's step for For from now, unless queue was forgotten
// since mark (from Look) was taken: a claim calls it when the step it
// looked with found nothing.
func (s *QueueSkip) Skip(queue string, mark uint64) {
	v, ok := s.m.Load(queue)
	if !ok {
		return
	}
	e := v.(*skipEntry)
	d := s.For
	if d == 0 {
		d = DefaultSkip
	}
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
