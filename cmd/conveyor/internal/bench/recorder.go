// Package bench drives conveyor against a database and measures it:
// throughput, enqueue-to-start latency, lost and duplicate executions, and
// reordering. It is the engine of `conveyor demo` and `conveyor bench`.
package bench

import (
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

const chunkBits = 16
const chunkSize = 1 << chunkBits
const maxChunks = 1 << 12 // 268M sequence numbers

type slot struct {
	enq   atomic.Int64 // unix ns when the enqueue commit was acknowledged
	call  atomic.Int64 // unix ns when the enqueue call began
	start atomic.Int64 // unix ns of the first execution's start
	end   atomic.Int64 // unix ns of the first execution's end
	// claimed is the unix ns of the first execution's claim by the
	// database's clock (the job's attempted_at), 0 when not recorded.
	claimed atomic.Int64
	execs   atomic.Int32
}

type chunk [chunkSize]slot

// Recorder keeps one slot per job sequence number. Recording touches only
// that job's slot (atomics, no lock shared by workers), so the bench does
// not become the contention it measures.
type Recorder struct {
	chunks [maxChunks]atomic.Pointer[chunk]
	n      atomic.Int64 // sequence numbers handed out
	// running counts executions under way (Begin to End), peak the most
	// at once: measured outside the queue, to check its limits.
	running, peak atomic.Int64
	// keys tracks executions per job key (KeyBegin, KeyEnd).
	keys [keyShards]keyShard
	// keyPeak is the most executions of one key at once; keyReorders
	// counts starts of a key's job enqueued before one of the key that
	// had already started.
	keyPeak, keyReorders atomic.Int64
}

// keyShards spreads the keys' states over locks of their own, so that
// workers of different keys rarely share one.
const keyShards = 64

var keySeed = maphash.MakeSeed()

type keyShard struct {
	mu sync.Mutex
	m  map[string]*keyState
}

type keyState struct {
	running int64
	last    int64 // the highest sequence number started, -1 for none
}

func (r *Recorder) keyShard(key string) *keyShard {
	return &r.keys[maphash.String(keySeed, key)%keyShards]
}

// KeyBegin records that an execution of job seq, of key key, began; KeyEnd
// that it ended. KeyPeak is the most executions of one key at once, and
// KeyReorders how many started after a later-enqueued job of their key
// (sequence numbers are enqueue order).
func (r *Recorder) KeyBegin(key string, seq int64) {
	sh := r.keyShard(key)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[string]*keyState{}
	}
	st := sh.m[key]
	if st == nil {
		st = &keyState{last: -1}
		sh.m[key] = st
	}
	st.running++
	n := st.running
	if seq < st.last {
		r.keyReorders.Add(1)
	}
	st.last = max(st.last, seq)
	sh.mu.Unlock()
	for p := r.keyPeak.Load(); n > p && !r.keyPeak.CompareAndSwap(p, n); p = r.keyPeak.Load() {
	}
}

// KeyEnd records that an execution of key, begun with KeyBegin, ended.
func (r *Recorder) KeyEnd(key string) {
	sh := r.keyShard(key)
	sh.mu.Lock()
	sh.m[key].running--
	sh.mu.Unlock()
}

// KeyPeak returns the most executions of one key under way at once.
func (r *Recorder) KeyPeak() int64 { return r.keyPeak.Load() }

// KeyReorders returns how many executions started after a job of their
// key enqueued later had started.
func (r *Recorder) KeyReorders() int64 { return r.keyReorders.Load() }

// Begin records that an execution began; End that it ended. Peak is the
// most executions under way at once.
func (r *Recorder) Begin() {
	n := r.running.Add(1)
	for p := r.peak.Load(); n > p && !r.peak.CompareAndSwap(p, n); p = r.peak.Load() {
	}
}

// End records that an execution begun with Begin ended.
func (r *Recorder) End() { r.running.Add(-1) }

// Peak returns the most executions under way at once so far.
func (r *Recorder) Peak() int64 { return r.peak.Load() }

// Claimed records the database's clock at seq's first claim (its
// attempted_at), for MaxInWindow.
func (r *Recorder) Claimed(seq int64, at time.Time) {
	if !at.IsZero() {
		r.slot(seq).claimed.CompareAndSwap(0, at.UnixNano())
	}
}

// MaxInWindow returns the most first claims of the jobs [from, to) that
// fall within any window of length d, by the database's clock (Claimed).
// A rate limit holds claims by that clock: handlers' start times lag
// their claims by a delay that varies with the workers' backlog, so they
// cannot check it to the job.
func (r *Recorder) MaxInWindow(from, to int64, d time.Duration) int64 {
	starts := make([]int64, 0, max(0, to-from))
	for i := from; i < to; i++ {
		if sl := r.slot(i); sl.execs.Load() > 0 && sl.claimed.Load() != 0 {
			starts = append(starts, sl.claimed.Load())
		}
	}
	return maxInWindow(starts, d)
}

// KeyMaxInWindow is MaxInWindow per key: the most first claims of the
// jobs [from, to) of any one key (keyOf gives a job seq's key) within any
// window of length d, by the database's clock.
func (r *Recorder) KeyMaxInWindow(from, to int64, d time.Duration, keyOf func(int64) string) int64 {
	byKey := map[string][]int64{}
	for i := from; i < to; i++ {
		if sl := r.slot(i); sl.execs.Load() > 0 && sl.claimed.Load() != 0 {
			k := keyOf(i)
			byKey[k] = append(byKey[k], sl.claimed.Load())
		}
	}
	var best int64
	for _, starts := range byKey {
		best = max(best, maxInWindow(starts, d))
	}
	return best
}

// KeyShares counts the first claims of each key of the jobs [from, to)
// (keyOf gives a job seq's key) made while every key still had jobs to
// start: up to the first claim of the last job of the key that ran out
// first, by the database's clock (claims of one statement share it).
func (r *Recorder) KeyShares(from, to int64, keyOf func(int64) string) map[string]int64 {
	byKey := map[string][]int64{}
	for i := from; i < to; i++ {
		if sl := r.slot(i); sl.execs.Load() > 0 && sl.claimed.Load() != 0 {
			k := keyOf(i)
			byKey[k] = append(byKey[k], sl.claimed.Load())
		}
	}
	return sharesWhileAll(byKey)
}

// sharesWhileAll counts, of each key's claims (unix ns, in any order),
// those no later than the last claim of the key whose last claim came
// first.
func sharesWhileAll(byKey map[string][]int64) map[string]int64 {
	end := int64(math.MaxInt64)
	for _, cs := range byKey {
		end = min(end, slices.Max(cs))
	}
	out := make(map[string]int64, len(byKey))
	for k, cs := range byKey {
		for _, c := range cs {
			if c <= end {
				out[k]++
			}
		}
	}
	return out
}

// maxInWindow returns the most of starts (unix ns, in any order; sorted
// in place) within any window of length d.
func maxInWindow(starts []int64, d time.Duration) int64 {
	slices.Sort(starts)
	var best int64
	lo := 0
	for hi := range starts {
		for starts[hi]-starts[lo] >= int64(d) {
			lo++
		}
		best = max(best, int64(hi-lo+1))
	}
	return best
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{} }

func (r *Recorder) slot(seq int64) *slot {
	ci := seq >> chunkBits
	c := r.chunks[ci].Load()
	if c == nil {
		nc := new(chunk)
		if r.chunks[ci].CompareAndSwap(nil, nc) {
			c = nc
		} else {
			c = r.chunks[ci].Load()
		}
	}
	return &c[seq&(chunkSize-1)]
}

// Next hands out the next sequence number (enqueue rank).
func (r *Recorder) Next() int64 { return r.n.Add(1) - 1 }

// Reserve hands out n consecutive sequence numbers and returns the first.
func (r *Recorder) Reserve(n int) int64 { return r.n.Add(int64(n)) - int64(n) }

// Enqueued records that seq's enqueue began at call and was committed at
// committed.
func (r *Recorder) Enqueued(seq int64, call, committed time.Time) {
	s := r.slot(seq)
	s.call.Store(call.UnixNano())
	s.enq.Store(committed.UnixNano())
}

// Started records one execution of seq starting at t.
func (r *Recorder) Started(seq int64, t time.Time) {
	s := r.slot(seq)
	if s.execs.Add(1) == 1 {
		s.start.Store(t.UnixNano())
	}
}

// Ended records that the execution of seq begun first ended at t (a
// later one of the same job is not recorded).
func (r *Recorder) Ended(seq int64, t time.Time) {
	r.slot(seq).end.CompareAndSwap(0, t.UnixNano())
}

// Executions returns the starts and ends (unix ns, by this process's
// clock) of the first executions of the jobs of [from, to) that ended.
func (r *Recorder) Executions(from, to int64) (starts, ends []int64) {
	for seq := from; seq < to; seq++ {
		s := r.slot(seq)
		if e := s.end.Load(); e != 0 {
			starts, ends = append(starts, s.start.Load()), append(ends, e)
		}
	}
	return starts, ends
}

// maxListed caps Summary.LostSeqs and Summary.DuplicateSeqs.
const maxListed = 100

// Execs returns how many executions of seq were recorded.
func (r *Recorder) Execs(seq int64) int { return int(r.slot(seq).execs.Load()) }

// started counts the jobs of [from, to) that have started at least once.
// It reads every slot of the range: for waiting and progress lines, not
// for hot paths.
func (r *Recorder) started(from, to int64) int64 {
	var n int64
	for i := from; i < to; i++ {
		if r.slot(i).execs.Load() > 0 {
			n++
		}
	}
	return n
}

// Summary is what a run's executions show.
type Summary struct {
	Jobs       int64 // sequence numbers summarized
	Executions int64 // executions recorded
	Lost       int64 // enqueued, never started
	Duplicates int64 // executions beyond the first
	// LostSeqs and DuplicateSeqs name the first 100 lost jobs and jobs run
	// more than once (by sequence number), so that a report can be checked
	// against the database.
	LostSeqs, DuplicateSeqs []int64
	P50, P95, P99, Max      time.Duration // enqueue-commit-to-start latency
	CallP50, CallP99        time.Duration // enqueue-call-to-start (includes the commit)
	ReorderMax              int64         // largest |start rank - enqueue rank|
	ReorderP99              int64         // p99 of |start rank - enqueue rank|
	// ReorderHist counts jobs by displacement bucket: 0, 1-9, 10-99,
	// 100-999, 1000+.
	ReorderHist [5]int64
	// Latencies holds every latency sample (for histograms).
	Latencies []time.Duration
}

// Issued returns how many sequence numbers have been handed out.
func (r *Recorder) Issued() int64 { return r.n.Load() }

// Summarize computes the summary over sequence numbers [0, Issued()).
func (r *Recorder) Summarize() Summary { return r.SummarizeRange(0, r.n.Load()) }

// SummarizeRange computes the summary over sequence numbers [from, to),
// for example one phase of a run that shares a recorder with another.
func (r *Recorder) SummarizeRange(from, to int64) Summary {
	n := max(0, to-from)
	var s Summary
	s.Jobs = n
	type st struct {
		seq   int64
		start int64
	}
	starts := make([]st, 0, n)
	lat := make([]time.Duration, 0, n)
	call := make([]time.Duration, 0, n)
	for i := from; i < to; i++ {
		sl := r.slot(i)
		e := int64(sl.execs.Load())
		s.Executions += e
		if e == 0 {
			s.Lost++
			if len(s.LostSeqs) < maxListed {
				s.LostSeqs = append(s.LostSeqs, i)
			}
			continue
		}
		s.Duplicates += e - 1
		if e > 1 && len(s.DuplicateSeqs) < maxListed {
			s.DuplicateSeqs = append(s.DuplicateSeqs, i)
		}
		start := sl.start.Load()
		starts = append(starts, st{i, start})
		if enq := sl.enq.Load(); enq != 0 {
			lat = append(lat, time.Duration(max(0, start-enq)))
		}
		if c := sl.call.Load(); c != 0 {
			call = append(call, time.Duration(max(0, start-c)))
		}
	}
	s.P50, s.P95, s.P99, s.Max = pct(lat, 0.50), pct(lat, 0.95), pct(lat, 0.99), pct(lat, 1)
	s.CallP50, s.CallP99 = pct(call, 0.50), pct(call, 0.99)
	s.Latencies = lat
	// Reordering: start rank against enqueue rank, among started jobs.
	sort.Slice(starts, func(i, j int) bool {
		if starts[i].start != starts[j].start {
			return starts[i].start < starts[j].start
		}
		return starts[i].seq < starts[j].seq
	})
	byEnq := make([]int64, len(starts))
	for i := range starts {
		byEnq[i] = starts[i].seq
	}
	sort.Slice(byEnq, func(i, j int) bool { return byEnq[i] < byEnq[j] })
	enqRank := make(map[int64]int64, len(byEnq))
	for i, seq := range byEnq {
		enqRank[seq] = int64(i)
	}
	disp := make([]int64, len(starts))
	for rank, x := range starts {
		d := int64(rank) - enqRank[x.seq]
		if d < 0 {
			d = -d
		}
		disp[rank] = d
		switch {
		case d == 0:
			s.ReorderHist[0]++
		case d < 10:
			s.ReorderHist[1]++
		case d < 100:
			s.ReorderHist[2]++
		case d < 1000:
			s.ReorderHist[3]++
		default:
			s.ReorderHist[4]++
		}
	}
	sort.Slice(disp, func(i, j int) bool { return disp[i] < disp[j] })
	if len(disp) > 0 {
		s.ReorderMax = disp[len(disp)-1]
		s.ReorderP99 = disp[int(math.Ceil(0.99*float64(len(disp))))-1]
	}
	return s
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), d...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(math.Ceil(p*float64(len(c)))) - 1
	return c[max(0, i)]
}
