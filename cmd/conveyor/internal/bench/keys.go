package bench

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/conveyorq/conveyor"
)

// Key counts of the keys workload's phases.
const (
	keysLimitKeys   = 10000 // keys of the key-limit-1 phase
	keysOrderedKeys = 1000  // keys of the ordered-1000 phase
	keysDeepKeys    = 200   // keys of the ordered-deep phase
	// The flood phases: small keys of a few jobs each, enqueued one at a
	// time every keysSmallEvery, under a KeyMaxRunning of keysFloodLimit.
	keysSmallKeys  = 100
	keysSmallJobs  = 10
	keysSmallEvery = 2 * time.Millisecond
	keysFloodLimit = 5
	// The fair-weights phase: two deep keys of these weights.
	keysHeavyWeight = 3
	keysLightWeight = 1
)

// keysWorkload measures what key limits cost, in one run on fresh tables
// each phase, every phase a drain of o.Jobs no-op jobs (o.Work):
//
//   - unlimited: jobs without a key, no limits: the reference;
//   - key-limit-1: jobs spread over 10,000 keys (job i has key i mod
//     10,000) under a KeyMaxRunning of 1;
//   - ordered-1000: jobs spread over 1,000 keys, Ordered;
//   - ordered-deep: 200 keys of o.Jobs/200 jobs each, enqueued key after
//     key, Ordered;
//   - ordered-wide: every job its own key, Ordered: against ordered-deep,
//     whether a claim's cost grows with the depth of the keys;
//   - small-keys: 100 keys of 10 jobs each, enqueued one at a time every
//     2ms while the workers run, under a KeyMaxRunning of 5: their
//     enqueue-to-start latency (SmallP50ms, SmallP99ms) is the reference
//     of
//   - flood: the same, after o.Jobs jobs of one key were enqueued: a key
//     with a deep backlog must not delay the small keys' jobs;
//   - fair-small-keys and fair-flood: small-keys and flood in a Fair
//     queue without a limit per key: the flooded key is served in turns
//     with the small keys, not held;
//   - fair-weights: two deep keys of o.Jobs/2 jobs each in a Fair queue,
//     "light" (weight 1) enqueued before "heavy" (weight 3): while both
//     have jobs, heavy must start about 3 times as many (KeyShares,
//     ShareRatio); a ratio outside 2..4 fails the run.
//
// Each run checks, from executions counted by the handlers outside the
// queue, that no key ran more jobs at once than its limit and that no
// ordered key started a job before an earlier one of the key; as every
// drain, it checks that no job was lost or ran twice.
func keysWorkload(ctx context.Context, o Options) ([]*Result, error) {
	jobs := int64(o.Jobs)
	deep := max(jobs/keysDeepKeys, 1)
	phases := []struct {
		name   string
		limits conveyor.QueueLimits
		keys   int
		keyOf  func(int64) string
		ref    string
	}{
		{"unlimited", conveyor.QueueLimits{}, 0, nil, ""},
		{"key-limit-1", conveyor.QueueLimits{KeyMaxRunning: 1}, min(keysLimitKeys, o.Jobs),
			func(i int64) string { return fmt.Sprintf("k%05d", i%keysLimitKeys) }, "unlimited"},
		{"ordered-1000", conveyor.QueueLimits{Ordered: true}, min(keysOrderedKeys, o.Jobs),
			func(i int64) string { return fmt.Sprintf("k%04d", i%keysOrderedKeys) }, "unlimited"},
		{"ordered-deep", conveyor.QueueLimits{Ordered: true}, int((jobs + deep - 1) / deep),
			func(i int64) string { return fmt.Sprintf("k%03d", i/deep) }, "ordered-wide"},
		{"ordered-wide", conveyor.QueueLimits{Ordered: true}, o.Jobs,
			func(i int64) string { return fmt.Sprintf("k%07d", i) }, "unlimited"},
	}
	floods := []struct {
		name  string
		flood int
		ref   string
		fair  bool
	}{{"small-keys", 0, "", false}, {"flood", o.Jobs, "small-keys", false},
		{"fair-small-keys", 0, "", true}, {"fair-flood", o.Jobs, "fair-small-keys", true}}
	var ps phaseRuns
	for _, ph := range floods {
		ro := o
		ro.Workload, ro.Limits, ro.flood = "keys-flood", conveyor.QueueLimits{KeyMaxRunning: keysFloodLimit}, ph.flood
		if ph.fair {
			ro.Limits = conveyor.QueueLimits{Fair: true}
		}
		ro.label = "keys " + ph.name
		if !ps.run(ctx, o, ro, func(r *Result) {
			r.Workload, r.Phase, r.Keys, r.Reference = "keys", ph.name, keysSmallKeys+min(ph.flood, 1), ph.ref
		}) {
			return ps.rs, ps.err()
		}
	}
	for _, ph := range phases {
		ro := o
		ro.Workload, ro.Limits, ro.keyOf = "drain", ph.limits, ph.keyOf
		ro.label = "keys " + ph.name
		if !ps.run(ctx, o, ro, func(r *Result) {
			r.Workload, r.Phase, r.Keys, r.Reference = "keys", ph.name, ph.keys, ph.ref
		}) {
			return ps.rs, ps.err()
		}
	}
	half := max(jobs/2, 1)
	ro := o
	ro.Workload, ro.Limits, ro.label = "drain", conveyor.QueueLimits{Fair: true}, "keys fair-weights"
	ro.keyOf = func(i int64) string {
		if i < half {
			return "light"
		}
		return "heavy"
	}
	ro.weights = map[string]int{"heavy": keysHeavyWeight, "light": keysLightWeight}
	ps.run(ctx, o, ro, func(r *Result) {
		r.Workload, r.Phase, r.Keys, r.Reference = "keys", "fair-weights", min(2, o.Jobs), ""
	})
	return ps.rs, ps.err()
}

// shareRatio is the heaviest key's share of the starts over the
// lightest's (by weights, the first in key order among equals); 0 when
// the lightest started none.
func shareRatio(shares map[string]int64, weights map[string]int) float64 {
	var heavy, light string
	for _, k := range sortedKeys(weights) {
		if heavy == "" || weights[k] > weights[heavy] {
			heavy = k
		}
		if light == "" || weights[k] < weights[light] {
			light = k
		}
	}
	if shares[light] == 0 {
		return 0
	}
	return float64(shares[heavy]) / float64(shares[light])
}

// checkShares reports a run whose keys' shares of the starts are off
// their weights' ratio by more than a third of it (2 to 4 for weights 3
// and 1).
func checkShares(r *Result) error {
	if r.KeyShares == nil || len(r.KeyWeights) < 2 {
		return nil
	}
	lo, hi := 0, 0
	for _, w := range r.KeyWeights {
		if lo == 0 || w < lo {
			lo = w
		}
		hi = max(hi, w)
	}
	want := float64(hi) / float64(lo)
	if r.ShareRatio < want*2/3 || r.ShareRatio > want*4/3 {
		return fmt.Errorf("bench: %s: the keys started %v while all had jobs, a ratio of %.2f under weights %v (want %.2f to %.2f)",
			r.label(), r.KeyShares, r.ShareRatio, r.KeyWeights, want*2/3, want*4/3)
	}
	return nil
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// keysFlood runs a flood phase of the keys workload (see keysWorkload):
// o.flood jobs of key "flood" enqueued in bulk before the workers start,
// then the small keys' jobs one at a time while they run; it records the
// small keys' latency in res and returns the time from the start of the
// workers to the last job's completion.
func keysFlood(ctx context.Context, c *conveyor.Client[any], rec *Recorder, o Options, mk func(int64) Job, res *Result) (time.Duration, error) {
	flood := &conveyor.EnqueueOpts{Key: "flood"}
	for off := 0; off < o.flood; off += 10000 {
		n := min(10000, o.flood-off)
		first := rec.Reserve(n)
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i)), Opts: flood}
		}
		t0 := time.Now()
		if _, err := c.EnqueueBulk(ctx, items); err != nil {
			return 0, err
		}
		t1 := time.Now()
		for i := range items {
			rec.Enqueued(first+int64(i), t0, t1)
		}
	}
	small := keysSmallKeys * keysSmallJobs
	total := int64(o.flood + small)
	stop := make(chan struct{})
	wg := progress(o.Progress, o.label, total, func() int64 { return c.Counters().Map()["completed"] }, stop)
	defer func() { close(stop); wg.Wait() }()
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	from := rec.Issued()
	tick := time.NewTicker(keysSmallEvery)
	defer tick.Stop()
	for i := 0; i < small; i++ {
		<-tick.C
		seq := rec.Next()
		call := time.Now()
		if _, err := c.Enqueue(ctx, mk(seq), &conveyor.EnqueueOpts{Key: fmt.Sprintf("s%03d", i%keysSmallKeys)}); err != nil {
			return 0, err
		}
		rec.Enqueued(seq, call, time.Now())
	}
	err := waitCompleted(ctx, c, total, o.Timeout)
	el := time.Since(t0)
	s := rec.SummarizeRange(from, from+int64(small))
	res.SmallP50ms, res.SmallP99ms = float64(s.P50.Microseconds())/1000, float64(s.P99.Microseconds())/1000
	res.SmallJobs = s.Jobs - s.Lost
	return el, err
}
