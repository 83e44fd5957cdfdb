package engine

import (
	"sync"

	"github.com/conveyorq/conveyor/internal/driver"
)

// selfNotes counts, per queue, the wake-up notifications this process's
// own group-commit inserts are about to send or have sent and the listener
// has not yet received. Such an insert wakes its queue's fetcher in
// process as soon as it returns, so its notification, arriving a moment
// later, would only make the fetcher claim a second time and find
// nothing. The listener passes over a notification of a queue while that
// queue's count is above zero, decrementing it.
//
// Passing over a notification that was not the process's own (another
// process's insert, a freed slot) is safe too: a count above zero means an
// in-process insert of the queue has not yet been resolved (its wake-up
// still to come) or its notification, committed after the one passed
// over, is still to be received; either way a wake-up of the queue
// follows. That holds as long as a count never stands for a notification
// that will not come, hence:
//
//   - a count is taken before the insert commits, only for queues with a
//     job due at once that the insert is not to claim (the insert
//     statement always notifies those; a job it claims notifies nothing,
//     see insertclaim.go);
//   - after the insert, it is given back for each queue that received no
//     job (every job of it a held unique key, or the insert failed) and
//     the insert then wakes the queue in process all the same;
//   - counts are forgotten whenever the listener (re)connects, since a
//     notification sent before that is never received.
//
// Giving back or forgetting more than was taken only makes the listener
// pass over fewer notifications. Notifications of a queue held back by
// its limits are never passed over (the listener also frees its slot),
// and the other notices (cancel, reconnection) are not queue names.
type selfNotes struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts one notification for each queue of jobs that has a job due
// at once not flagged in claim (the jobs the insert is to claim; nil for
// none), and returns those queues for give.
func (s *selfNotes) take(jobs []driver.InsertParams, claim []bool) []string {
	var qs []string
	for i, j := range jobs {
		if j.Delay != 0 || !j.RunAt.IsZero() || claim != nil && claim[i] {
			continue
		}
		if len(qs) > 0 && qs[len(qs)-1] == j.Queue {
			continue
		}
		qs = append(qs, j.Queue)
	}
	if len(qs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	seen := make(map[string]bool, len(qs))
	out := qs[:0]
	for _, q := range qs {
		if seen[q] {
			continue
		}
		seen[q] = true
		s.n[q]++
		out = append(out, q)
	}
	return out
}

// give returns the counts of queues taken by take whose notification
// will not come: every queue when failed, else each queue none of whose
// jobs due at once went in (dup reports the held unique jobs, nil for
// none).
func (s *selfNotes) give(qs []string, jobs []driver.InsertParams, dup []bool, failed bool) {
	if len(qs) == 0 {
		return
	}
	var in map[string]bool
	if !failed {
		in = make(map[string]bool, len(qs))
		for i, j := range jobs {
			if j.Delay == 0 && j.RunAt.IsZero() && (dup == nil || !dup[i]) {
				in[j.Queue] = true
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range qs {
		if in[q] {
			continue
		}
		if s.n[q] > 1 {
			s.n[q]--
		} else {
			delete(s.n, q)
		}
	}
}

// own reports whether a notification of queue is to be passed over, and
// counts it received.
func (s *selfNotes) own(queue string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.n[queue]
	if c == 0 {
		return false
	}
	if c > 1 {
		s.n[queue] = c - 1
	} else {
		delete(s.n, queue)
	}
	return true
}

// forget drops every count: the listener (re)connected.
func (s *selfNotes) forget() {
	s.mu.Lock()
	clear(s.n)
	s.mu.Unlock()
}
