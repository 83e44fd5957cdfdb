package bench

import (
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// replay records jobs 0..len(order)-1 as enqueued in sequence order, then
// started in the given order (order[rank] = seq), one microsecond apart.
func replay(order []int64) *Recorder {
	r := NewRecorder()
	first := r.Reserve(len(order))
	for i := range order {
		at := t0.Add(time.Duration(first+int64(i)) * time.Microsecond)
		r.Enqueued(first+int64(i), at, at)
	}
	for rank, seq := range order {
		r.Started(seq, t0.Add(time.Second+time.Duration(rank)*time.Microsecond))
	}
	return r
}

func TestSummarizeReportsSeededLostAndDuplicates(t *testing.T) {
	r := NewRecorder()
	const n = 10
	first := r.Reserve(n)
	for i := int64(0); i < n; i++ {
		r.Enqueued(first+i, t0, t0)
	}
	for i := int64(0); i < n; i++ {
		switch i {
		case 7: // lost: never started
		case 3: // one duplicate execution
			r.Started(i, t0.Add(time.Millisecond))
			r.Started(i, t0.Add(2*time.Millisecond))
		default:
			r.Started(i, t0.Add(time.Millisecond))
		}
	}
	s := r.Summarize()
	if s.Jobs != n || s.Executions != n || s.Lost != 1 || s.Duplicates != 1 {
		t.Fatalf("jobs %d executions %d lost %d duplicates %d; want 10 10 1 1", s.Jobs, s.Executions, s.Lost, s.Duplicates)
	}
	if !slices.Equal(s.LostSeqs, []int64{7}) || !slices.Equal(s.DuplicateSeqs, []int64{3}) {
		t.Fatalf("lost %v duplicates %v; want [7] and [3]", s.LostSeqs, s.DuplicateSeqs)
	}
	if r.Execs(3) != 2 || r.Execs(7) != 0 || r.Execs(0) != 1 {
		t.Fatalf("execs of 3, 7, 0: %d %d %d; want 2 0 1", r.Execs(3), r.Execs(7), r.Execs(0))
	}
	// A job run three times counts two duplicates; the latency of a
	// duplicated job is its first execution's.
	r.Started(5, t0.Add(time.Hour))
	r.Started(5, t0.Add(time.Hour))
	s = r.Summarize()
	if s.Duplicates != 3 || !slices.Equal(s.DuplicateSeqs, []int64{3, 5}) || s.Max != time.Millisecond {
		t.Fatalf("duplicates %d %v max %v; want 3 [3 5] 1ms", s.Duplicates, s.DuplicateSeqs, s.Max)
	}

	// The bench's result carries exactly these figures, and the run is an
	// error.
	res := &Result{}
	if err := res.fill(s, time.Second); err == nil {
		t.Fatal("a run with lost and duplicate executions did not fail")
	}
	if res.Lost != 1 || res.Duplicates != 3 || res.Jobs != n || !slices.Equal(res.LostSeqs, []int64{7}) || !slices.Equal(res.DuplicateSeqs, []int64{3, 5}) {
		t.Fatalf("result: lost %d %v duplicates %d %v jobs %d", res.Lost, res.LostSeqs, res.Duplicates, res.DuplicateSeqs, res.Jobs)
	}
	if res.JobsPerS != 9 { // 9 jobs completed in one second
		t.Fatalf("jobs/s %v, want 9", res.JobsPerS)
	}
}

func TestSummarizeRange(t *testing.T) {
	r := NewRecorder()
	a := r.Reserve(5) // phase 1: all run
	b := r.Reserve(5) // phase 2: the last one is lost
	for i := int64(0); i < 10; i++ {
		r.Enqueued(i, t0, t0)
	}
	for i := a; i < b+4; i++ {
		r.Started(i, t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	s1, s2 := r.SummarizeRange(a, b), r.SummarizeRange(b, b+5)
	if s1.Jobs != 5 || s1.Lost != 0 || s1.Max != 5*time.Millisecond {
		t.Fatalf("phase 1: %+v", s1)
	}
	if s2.Jobs != 5 || s2.Lost != 1 || !slices.Equal(s2.LostSeqs, []int64{9}) || s2.P50 != 7*time.Millisecond {
		t.Fatalf("phase 2: jobs %d lost %d %v p50 %v", s2.Jobs, s2.Lost, s2.LostSeqs, s2.P50)
	}
}

func TestLatencyPercentiles(t *testing.T) {
	r := NewRecorder()
	// Latencies 1..100ms, recorded in a scrambled order.
	for i := int64(0); i < 100; i++ {
		seq := r.Next()
		lat := time.Duration((i*37)%100+1) * time.Millisecond
		r.Enqueued(seq, t0.Add(-time.Millisecond), t0)
		r.Started(seq, t0.Add(lat))
	}
	s := r.Summarize()
	if s.P50 != 50*time.Millisecond || s.P95 != 95*time.Millisecond || s.P99 != 99*time.Millisecond || s.Max != 100*time.Millisecond {
		t.Fatalf("p50 %v p95 %v p99 %v max %v; want 50 95 99 100ms", s.P50, s.P95, s.P99, s.Max)
	}
	if s.CallP50 != 51*time.Millisecond { // the call began 1ms before the commit
		t.Fatalf("call p50 %v, want 51ms", s.CallP50)
	}
	if len(s.Latencies) != 100 {
		t.Fatalf("%d latency samples, want 100", len(s.Latencies))
	}
}

// rotated appends the ranks [from, to) with the first job moved to the
// end: it is displaced by to-from-1 places, every other job by one.
func rotated(order []int64, from, to int64) []int64 {
	for s := from + 1; s < to; s++ {
		order = append(order, s)
	}
	return append(order, from)
}

func identity(order []int64, from, to int64) []int64 {
	for s := from; s < to; s++ {
		order = append(order, s)
	}
	return order
}

func TestReorderKnownPermutations(t *testing.T) {
	for _, tc := range []struct {
		name     string
		order    []int64
		max, p99 int64
		hist     [5]int64
	}{
		{"in order", identity(nil, 0, 50), 0, 0, [5]int64{50, 0, 0, 0, 0}},
		// ranks: 2 starts first (2 places early), 0 second (1 late), 3
		// third (1 early), 1 last (2 late).
		{"small", []int64{2, 0, 3, 1}, 2, 2, [5]int64{0, 4, 0, 0, 0}},
		// 29 in place, 69 off by one, one off by 19 and one by 50: the p99
		// of 100 jobs is the second largest.
		{"p99", identity(rotated(rotated(nil, 0, 51), 51, 71), 71, 100), 50, 19, [5]int64{29, 69, 2, 0, 0}},
		// One job in each of the upper buckets.
		{"buckets", rotated(rotated(rotated(func() []int64 {
			o := identity(nil, 0, 10)
			for s := int64(19); s >= 10; s-- { // reversed: 9,7,5,3,1,1,3,5,7,9
				o = append(o, s)
			}
			return o
		}(), 20, 70), 70, 570), 570, 2070), 1499, 1, [5]int64{10, 2057, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := replay(tc.order).Summarize()
			if s.ReorderMax != tc.max || s.ReorderP99 != tc.p99 || s.ReorderHist != tc.hist {
				t.Fatalf("max %d p99 %d hist %v; want %d %d %v", s.ReorderMax, s.ReorderP99, s.ReorderHist, tc.max, tc.p99, tc.hist)
			}
			// Cross-check against a direct computation.
			var disp []int64
			for rank, seq := range tc.order {
				disp = append(disp, int64(math.Abs(float64(int64(rank)-seq))))
			}
			slices.Sort(disp)
			if want := disp[len(disp)-1]; s.ReorderMax != want {
				t.Fatalf("max %d, direct %d", s.ReorderMax, want)
			}
			if want := disp[int(math.Ceil(0.99*float64(len(disp))))-1]; s.ReorderP99 != want {
				t.Fatalf("p99 %d, direct %d", s.ReorderP99, want)
			}
		})
	}
}

// A lost job does not count as reordering of the others: ranks are among
// the jobs that started.
func TestReorderIgnoresLostJobs(t *testing.T) {
	r := NewRecorder()
	r.Reserve(5)
	for i := int64(0); i < 5; i++ {
		r.Enqueued(i, t0, t0)
	}
	for rank, seq := range []int64{0, 1, 3, 4} { // 2 never starts
		r.Started(seq, t0.Add(time.Duration(rank+1)*time.Millisecond))
	}
	s := r.Summarize()
	if s.Lost != 1 || s.ReorderMax != 0 {
		t.Fatalf("lost %d reorder max %d; want 1 and 0", s.Lost, s.ReorderMax)
	}
}

// Concurrent recording is exact (and race-free under -race): every
// execution counts, including concurrent executions of one job.
func TestConcurrentRecording(t *testing.T) {
	r := NewRecorder()
	const workers, per = 8, 20000
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				seq := r.Next()
				now := time.Now()
				r.Enqueued(seq, now, now)
				r.Started(seq, now)
				r.Started(0, now) // every worker also runs job 0 again
			}
		}()
	}
	wg.Wait()
	s := r.Summarize()
	if s.Jobs != workers*per || s.Lost != 0 || s.Duplicates != workers*per || s.Executions != 2*workers*per {
		t.Fatalf("jobs %d lost %d duplicates %d executions %d", s.Jobs, s.Lost, s.Duplicates, s.Executions)
	}
}
