package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/conveyorq/conveyor"
)

// Key counts of the keys workload's phases.
const (
	keysLimitKeys   = 10000 // keys of the key-limit-1 phase
	keysOrderedKeys = 1000  // keys of the ordered-1000 phase
	keysDeepKeys    = 200   // keys of the ordered-deep phase
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
//     whether a claim's cost grows with the depth of the keys.
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
	var rs []*Result
	var errs []error
	for _, ph := range phases {
		ro := o
		ro.Workload, ro.Limits, ro.keyOf = "drain", ph.limits, ph.keyOf
		ro.label = "keys " + ph.name
		ro.Emit = nil
		r, err := Run(ctx, ro)
		if r == nil {
			return rs, errors.Join(append(errs, err)...)
		}
		r.Workload, r.Phase, r.Keys, r.Reference = "keys", ph.name, ph.keys, ph.ref
		if err == nil {
			err = checkHeld(r)
		}
		o.emit(r)
		rs = append(rs, r)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	return rs, errors.Join(errs...)
}
