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

// finishedWindow is how far back the queues page and GET /api/v1/queues
// count finished jobs (completed, discarded, cancelled): the jobs
// finished in the last finishedWindow, by Client.Overview.
const finishedWindow = 5 * time.Minute

// statsCache shares one reading of Client.Overview (and of
// Client.Processes, a small table read with it, so that the queues and
// the processes working them are seen together) among every request for
// maxAge, reads it again at most once at a time, and records a sample
// for the throughput chart at most every interval. Overview reads the
// unfinished jobs and the jobs finished in the last finishedWindow
// through their indexes, so its cost grows with those, not with the
// table; this bounds how often it runs whatever the number of open
// dashboards (once per maxAge at most), and it never runs while nobody
// asks.
type statsCache struct {
	c        client
	maxAge   time.Duration
	interval time.Duration

	fetch sync.Mutex // held while reading: one reader at a time

	mu      sync.Mutex
	last    *reading
	samples []sample // ring buffer, oldest first once full
	next    int
}

// reading is one reading of the queues' statistics and of the processes.
type reading struct {
	// Stats are from Overview: finished counts cover FinishedSince on.
	Stats     *conveyor.Stats
	Processes []conveyor.ProcessInfo
	// Weights are the key weights of every queue, read only when a
	// queue is fair (nil otherwise).
	Weights map[string]map[string]int
	At      time.Time
	// Took is how long the reading took; it is reused for at least
	// readCostFactor times that (see fresh).
	Took time.Duration
}

// readCostFactor bounds the share of the database's time the dashboard's
// counts take: a reading that took d is reused for at least
// readCostFactor*d, so that counting a large backlog (Overview's cost
// grows with the unfinished jobs) takes at most a tenth of one
// connection's time however often, and by however many, it is asked for.
const readCostFactor = 10

// sample is one point of the throughput chart.
type sample struct {
	At JSONTime `json:"t"`
	// Available, Running and Waiting (scheduled + retryable) are the
	// totals over every queue.
	Available int64 `json:"available"`
	Running   int64 `json:"running"`
	Waiting   int64 `json:"waiting"`
	// Finished is the number of jobs finished (completed, discarded,
	// cancelled) since the previous sample; null for the first.
	Finished *int64 `json:"finished"`
	// OldestAvailableMS is the age of the oldest available job of any
	// queue (0 when none waits): how long the longest waiter has waited
	// so far, an upper view of pick-up latency.
	OldestAvailableMS int64 `json:"oldest_available_ms"`
	// FinishedPerSec is Finished divided by the time since the previous
	// sample; null for the first.
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
	now := time.Now()
	st, err := s.c.Overview(ctx, now.Add(-finishedWindow))
	if err != nil {
		return nil, err
	}
	// A chart sample is due: count what finished since the previous one
	// (a second Overview, at most once per interval).
	var finished *int64
	prev, due := s.due(now)
	if due && !prev.IsZero() {
		fin, err := s.c.Overview(ctx, prev)
		if err != nil {
			return nil, err
		}
		n := finishedTotal(fin)
		finished = &n
	}
	ps, err := s.c.Processes(ctx)
	if err != nil {
		return nil, err
	}
	var weights map[string]map[string]int
	for _, q := range st.Queues {
		if q.Limits != nil && q.Limits.Fair {
			if weights, err = s.c.KeyWeights(ctx); err != nil {
				return nil, err
			}
			break
		}
	}
	rd := &reading{Stats: st, Processes: ps, Weights: weights, At: now, Took: time.Since(now)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = rd
	if due {
		s.record(st, now, prev, finished)
	}
	return rd, nil
}

// finishedTotal is the number of finished jobs st counts.
func finishedTotal(st *conveyor.Stats) int64 {
	var n int64
	for _, q := range st.Queues {
		n += q.Counts[conveyor.JobStateCompleted] + q.Counts[conveyor.JobStateDiscarded] + q.Counts[conveyor.JobStateCancelled]
	}
	return n
}

// due tells whether a sample taken at now is due (the previous one is at
// least interval old, or there is none) and returns the previous
// sample's time (zero when there is none). Only get records samples,
// under s.fetch, so the answer holds until it records.
func (s *statsCache) due(now time.Time) (prev time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.samples)
	if n == 0 {
		return time.Time{}, true
	}
	prev = time.Time(s.samples[(s.next-1+n)%n].At)
	return prev, now.Sub(prev) >= s.interval
}

func (s *statsCache) fresh() *reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return nil
	}
	age := s.maxAge
	if age >= time.Millisecond { // below: every request reads (tests)
		age = max(age, readCostFactor*s.last.Took)
	}
	if time.Since(s.last.At) < age {
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

// record appends a sample taken at now; prev is the previous sample's
// time (zero for the first) and finished the jobs finished since prev.
// s.mu is held.
func (s *statsCache) record(st *conveyor.Stats, now, prev time.Time, finished *int64) {
	x := sample{At: JSONTime(now), Finished: finished}
	for _, q := range st.Queues {
		x.Available += q.Counts[conveyor.JobStateAvailable]
		x.Running += q.Counts[conveyor.JobStateRunning]
		x.Waiting += q.Counts[conveyor.JobStateScheduled] + q.Counts[conveyor.JobStateRetryable]
		if q.Counts[conveyor.JobStateAvailable] > 0 && q.PausedAt.IsZero() {
			x.OldestAvailableMS = max(x.OldestAvailableMS, q.OldestAvailable.Milliseconds())
		}
	}
	if finished != nil && now.After(prev) {
		rate := float64(*finished) / now.Sub(prev).Seconds()
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
