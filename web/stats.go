package web

import (
	"context"
	"sync"
	"time"

	"github.com/conveyorq/conveyor"
)

// seriesLen is how many samples the ring buffer keeps (30 minutes at the
// default 5s interval).
const seriesLen = 360

// statsCache shares one reading of Client.Stats (and of
// Client.Processes, a small table read with it, so that the queues and
// the processes working them are seen together) among every request for
// maxAge, reads it again at most once at a time, and records a sample
// for the throughput chart at most every interval. Client.Stats groups
// the whole jobs table by queue and state, so its cost grows with the
// table; this bounds how often it runs whatever the number of open
// dashboards (once per maxAge at most), and it never runs while nobody
// asks.
type statsCache struct {
	c        client
	maxAge   time.Duration
	interval time.Duration

	fetch sync.Mutex // held while reading Stats: one reader at a time

	mu      sync.Mutex
	last    *reading
	samples []sample // ring buffer, oldest first once full
	next    int
}

// reading is one reading of the queues' statistics and of the processes.
type reading struct {
	Stats     *conveyor.Stats
	Processes []conveyor.ProcessInfo
	At        time.Time
}

// sample is one point of the throughput chart.
type sample struct {
	At jsonTime `json:"t"`
	// Available, Running and Waiting (scheduled + retryable) are the
	// totals over every queue.
	Available int64 `json:"available"`
	Running   int64 `json:"running"`
	Waiting   int64 `json:"waiting"`
	// Finished is the total of completed, discarded and cancelled jobs
	// still in the table.
	Finished int64 `json:"finished"`
	// OldestAvailableMS is the age of the oldest available job of any
	// queue (0 when none waits): how long the longest waiter has waited
	// so far, an upper view of pick-up latency.
	OldestAvailableMS int64 `json:"oldest_available_ms"`
	// FinishedPerSec is the rise of Finished per second since the
	// previous sample; null for the first. Pruning removes finished
	// jobs, so a fall is shown as 0, and a rate spanning a prune is low.
	FinishedPerSec *float64 `json:"finished_per_s"`
}

func newStatsCache(c client, maxAge, interval time.Duration) *statsCache {
	return &statsCache{c: c, maxAge: maxAge, interval: interval}
}

// get returns a reading no older than maxAge.
func (s *statsCache) get(ctx context.Context) (*reading, error) {
	if rd := s.fresh(); rd != nil {
		return rd, nil
	}
	s.fetch.Lock()
	defer s.fetch.Unlock()
	if rd := s.fresh(); rd != nil { // read by another request meanwhile
		return rd, nil
	}
	st, err := s.c.Stats(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := s.c.Processes(ctx)
	if err != nil {
		return nil, err
	}
	rd := &reading{Stats: st, Processes: ps, At: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = rd
	s.record(st, rd.At)
	return rd, nil
}

func (s *statsCache) fresh() *reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.last.At) < s.maxAge {
		return s.last
	}
	return nil
}

// invalidate makes the next get read again (after a state change made
// here, so that the dashboard shows it at once).
func (s *statsCache) invalidate() {
	s.mu.Lock()
	s.last = nil
	s.mu.Unlock()
}

// record appends a sample when the previous one is at least interval
// old. s.mu is held.
func (s *statsCache) record(st *conveyor.Stats, now time.Time) {
	var prev *sample
	if n := len(s.samples); n > 0 {
		prev = &s.samples[(s.next-1+n)%n]
		if now.Sub(time.Time(prev.At)) < s.interval {
			return
		}
	}
	x := sample{At: jsonTime(now)}
	for _, q := range st.Queues {
		x.Available += q.Counts[conveyor.JobStateAvailable]
		x.Running += q.Counts[conveyor.JobStateRunning]
		x.Waiting += q.Counts[conveyor.JobStateScheduled] + q.Counts[conveyor.JobStateRetryable]
		x.Finished += q.Counts[conveyor.JobStateCompleted] + q.Counts[conveyor.JobStateDiscarded] + q.Counts[conveyor.JobStateCancelled]
		if q.Counts[conveyor.JobStateAvailable] > 0 && q.PausedAt.IsZero() {
			x.OldestAvailableMS = max(x.OldestAvailableMS, q.OldestAvailable.Milliseconds())
		}
	}
	if prev != nil {
		rate := max(0, float64(x.Finished-prev.Finished)/now.Sub(time.Time(prev.At)).Seconds())
		x.FinishedPerSec = &rate
	}
	if len(s.samples) < seriesLen {
		s.samples = append(s.samples, x)
		s.next = len(s.samples) % seriesLen
		return
	}
	s.samples[s.next] = x
	s.next = (s.next + 1) % seriesLen
}

// seriesJSON is the answer of GET /api/v1/series.
type seriesJSON struct {
	// IntervalMS is the spacing of samples while someone looks.
	IntervalMS int64    `json:"interval_ms"`
	Samples    []sample `json:"samples"`
}

// series returns the samples, oldest first.
func (s *statsCache) series() seriesJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := seriesJSON{IntervalMS: s.interval.Milliseconds(), Samples: make([]sample, 0, len(s.samples))}
	if len(s.samples) < seriesLen {
		out.Samples = append(out.Samples, s.samples...)
		return out
	}
	out.Samples = append(out.Samples, s.samples[s.next:]...)
	out.Samples = append(out.Samples, s.samples[:s.next]...)
	return out
}
