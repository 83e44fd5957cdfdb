package driver

import (
	"sync"
	"sync/atomic"
	"time"
)

// QueueSkip remembers, per queue, until when a driver's claims skip a
// step that last found nothing (for example, the look for jobs without a
// key in a key-limited queue). The zero value skips nothing; it is safe
// for concurrent use.
type QueueSkip struct {
	m sync.Map // queue -> *atomic.Int64, Unix nanoseconds
}

// Skipping reports whether queue's step is skipped now.
func (s *QueueSkip) Skipping(queue string) bool {
	v, ok := s.m.Load(queue)
	return ok && time.Now().UnixNano() < v.(*atomic.Int64).Load()
}

// SkipFor skips queue's step for d from now.
func (s *QueueSkip) SkipFor(queue string, d time.Duration) {
	v, _ := s.m.LoadOrStore(queue, new(atomic.Int64))
	v.(*atomic.Int64).Store(time.Now().Add(d).UnixNano())
}

// Forget ends queue's skip at once.
func (s *QueueSkip) Forget(queue string) { s.m.Delete(queue) }
