package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/conveyorq/conveyor"
)

// Defaults of the limits workload's held phases.
const (
	limitsSlots     = 10                   // the small concurrency limit
	limitsWork      = 5 * time.Millisecond // work per job in the held phases
	limitsHeldJobs  = 3000                 // jobs of each held phase
	limitsRate      = 500                  // jobs started per limitsPeriod
	limitsPeriod    = time.Second
	limitsRateJobs  = 3 * limitsRate
	limitsAboveMult = 2 // the limit above the workers, in workers
	// The key-rate phase: keys of limitsKeyRate starts per limitsPeriod
	// each, limitsKeyRateJobs jobs spread over them.
	limitsKeyRateKeys = 100
	limitsKeyRate     = 10
	limitsKeyRateJobs = 3 * limitsKeyRate * limitsKeyRateKeys
)

// limits measures what queue limits cost and whether they hold, in one
// run on fresh tables each phase:
//
//   - unlimited: a drain of o.Jobs no-op jobs (o.Work), the reference;
//   - limit-above: the same drain under a MaxRunning of twice the
//     workers, which never binds: its jobs/s against unlimited is what
//     consulting the limit costs;
//   - limit-10: 100 workers (o.Workers) held to MaxRunning 10, each job
//     sleeping 5ms (o.Work when set): the limit allows 10 / 5ms = 2,000
//     jobs/s, and PeakRunning, counted by the handler outside the queue,
//     must not pass 10;
//   - rate: a Rate of 500 per second over 1,500 jobs: the run takes about
//     3s and MaxStartsInWindow, the most claims in any window of the
//     period by the database's clock, must not pass the rate;
//   - key-rate: a KeyRate of 10 per second on each of 100 keys over
//     3,000 jobs (job i has key i mod 100): the run takes about 2s and
//     KeyMaxStartsInWindow, the most claims of one key in any window of
//     the period, must not pass the key's rate.
//
// The report's ratios are jobs/s against unlimited (limit-above) and
// against the limit's allowance (limit-10, rate).
func limits(ctx context.Context, o Options) ([]*Result, error) {
	work := o.Work
	if work == 0 {
		work = limitsWork
	}
	phases := []struct {
		name    string
		limits  conveyor.QueueLimits
		jobs    int
		work    time.Duration
		allowed float64
		keyOf   func(int64) string
	}{
		{"unlimited", conveyor.QueueLimits{}, o.Jobs, o.Work, 0, nil},
		{"limit-above", conveyor.QueueLimits{MaxRunning: limitsAboveMult * o.Workers}, o.Jobs, o.Work, 0, nil},
		{"limit-10", conveyor.QueueLimits{MaxRunning: limitsSlots}, limitsHeldJobs, work, limitsSlots / work.Seconds(), nil},
		// Rate N per period P lets J jobs start in (ceil(J/N) - 1) periods:
		// N at once, then N more each period.
		{"rate", conveyor.QueueLimits{Rate: limitsRate, RatePeriod: limitsPeriod}, limitsRateJobs, 0,
			limitsRateJobs / (float64((limitsRateJobs+limitsRate-1)/limitsRate-1) * limitsPeriod.Seconds()), nil},
		// The same per key: each key's jobs start KeyRate at once, then
		// KeyRate more each period.
		{"key-rate", conveyor.QueueLimits{KeyRate: limitsKeyRate, KeyRatePeriod: limitsPeriod}, limitsKeyRateJobs, 0,
			limitsKeyRateJobs / (float64(limitsKeyRateJobs/limitsKeyRateKeys/limitsKeyRate-1) * limitsPeriod.Seconds()),
			func(i int64) string { return fmt.Sprintf("k%03d", i%limitsKeyRateKeys) }},
	}
	var ps phaseRuns
	for _, ph := range phases {
		ro := o
		ro.Workload, ro.Jobs, ro.Work, ro.Limits, ro.keyOf = "drain", ph.jobs, ph.work, ph.limits, ph.keyOf
		ro.label = "limits " + ph.name
		if !ps.run(ctx, o, ro, func(r *Result) {
			r.Workload, r.Phase, r.Allowed = "limits", ph.name, ph.allowed
		}) {
			break
		}
	}
	return ps.rs, ps.err()
}

// phaseRuns collects the runs of a workload made of phases (limits, keys)
// and their errors.
type phaseRuns struct {
	rs   []*Result
	errs []error
}

// run runs ro (a phase of o's workload), names its result with name,
// checks it against its limits (checkHeld), emits it through o and keeps
// it. It returns false when the workload must stop: the run gave no
// result, or the context ended.
func (ps *phaseRuns) run(ctx context.Context, o, ro Options, name func(*Result)) bool {
	ro.Emit = nil
	r, err := Run(ctx, ro)
	if r == nil {
		ps.errs = append(ps.errs, err)
		return false
	}
	name(r)
	if err == nil {
		err = checkHeld(r)
	}
	o.emit(r)
	ps.rs = append(ps.rs, r)
	if err != nil {
		ps.errs = append(ps.errs, err)
		return ctx.Err() == nil
	}
	return true
}

// err joins the phases' errors.
func (ps *phaseRuns) err() error { return errors.Join(ps.errs...) }

// checkHeld reports a run whose executions, counted outside the queue,
// went past its limits.
func checkHeld(r *Result) error {
	if r.Limits == nil {
		return nil
	}
	if m := r.Limits.MaxRunning; m > 0 && r.PeakRunning > int64(m) {
		return fmt.Errorf("bench: %s: %d executions at once under a MaxRunning of %d", r.label(), r.PeakRunning, m)
	}
	if rt := r.Limits.Rate; rt > 0 && r.MaxStartsInWindow > int64(rt) {
		return fmt.Errorf("bench: %s: %d starts within %v under a Rate of %d", r.label(), r.MaxStartsInWindow, r.Limits.RatePeriod, rt)
	}
	if kr := r.Limits.KeyRate; kr > 0 && r.KeyMaxStartsInWindow > int64(kr) {
		return fmt.Errorf("bench: %s: %d starts of one key within %v under a KeyRate of %d", r.label(), r.KeyMaxStartsInWindow, r.Limits.KeyRatePeriod, kr)
	}
	perKey := int64(r.Limits.KeyMaxRunning)
	if r.Limits.Ordered {
		perKey = 1
	}
	if perKey > 0 && r.KeyPeakRunning > perKey {
		return fmt.Errorf("bench: %s: %d executions of one key at once under a limit of %d per key", r.label(), r.KeyPeakRunning, perKey)
	}
	if r.Limits.Ordered && r.KeyReorders > 0 {
		return fmt.Errorf("bench: %s: %d executions started after a later job of their ordered key", r.label(), r.KeyReorders)
	}
	return checkShares(r)
}

// pickupPage is how many jobs one read of pickup lists.
const pickupPage = 1000

// pickup measures, after a run held by a rate, how long a job freed by
// the limits waited to start, by the database's clock:
//
//   - under a Rate of n per period, the i-th start needs the (i-n)-th
//     to have left the window: its wait is from that moment (the
//     earlier start's attempted_at plus the period) to the start (the
//     claim's attempted_at);
//   - under a KeyRate alone, the same within each key's starts.
//
// The clock is the claim's transaction start (now()), a little before its
// commit. It reads every completed job of the queue (the run's tables are
// its own) and returns the waits in time order, nil when no rate binds.
// A binding MaxRunning is measured from the executions instead (the
// drain's runner, with pickupWaits): its slots pass from one job to the
// next inside a process, and no claim or outcome the database dates marks
// the moment.
func pickup(ctx context.Context, c *conveyor.Client[any], l conveyor.QueueLimits, workers int) ([]time.Duration, error) {
	conc := l.MaxRunning > 0 && l.MaxRunning < workers
	keyRate := !conc && l.Rate == 0 && l.KeyRate > 0
	if conc || l.Rate == 0 && !keyRate {
		return nil, nil
	}
	var starts []int64
	byKey := map[string][]int64{}
	for after := int64(0); ; {
		js, err := c.Jobs(ctx, conveyor.JobFilter{States: []conveyor.JobState{conveyor.JobStateCompleted},
			Queue: conveyor.DefaultQueue, Limit: pickupPage, AfterID: after})
		if err != nil {
			return nil, err
		}
		for _, j := range js {
			starts = append(starts, j.AttemptedAt.UnixNano())
			if keyRate && j.Key != "" {
				byKey[j.Key] = append(byKey[j.Key], j.AttemptedAt.UnixNano())
			}
		}
		if len(js) < pickupPage {
			break
		}
		after = js[len(js)-1].ID
	}
	if keyRate {
		// Each key is a rate of its own: its i-th start waits for its
		// (i-KeyRate)-th to leave the key's window.
		var waits []time.Duration
		kl := conveyor.QueueLimits{Rate: l.KeyRate, RatePeriod: l.KeyRatePeriod}
		for _, ks := range byKey {
			waits = append(waits, pickupWaits(ks, ks, kl, false)...)
		}
		return waits, nil
	}
	return pickupWaits(starts, nil, l, false), nil
}

// pickupWaits computes pickup's waits from the jobs' starts and ends
// (unix ns, in any order): after each end, under the concurrency limit
// (conc), else after each start left the rate's window.
func pickupWaits(starts, ends []int64, l conveyor.QueueLimits, conc bool) []time.Duration {
	starts, ends = slices.Clone(starts), slices.Clone(ends)
	slices.Sort(starts)
	slices.Sort(ends)
	var waits []time.Duration
	add := func(from, to int64) { waits = append(waits, time.Duration(max(0, to-from))) }
	if conc {
		m := l.MaxRunning
		for i := 0; i+m < len(starts) && i < len(ends); i++ {
			add(ends[i], starts[i+m])
		}
	} else {
		n, p := l.Rate, int64(l.RatePeriod)
		for i := n; i < len(starts); i++ {
			add(starts[i-n]+p, starts[i])
		}
	}
	return waits
}

// quantile returns the q-quantile (0..1) of sorted ds, in milliseconds.
func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	i := min(len(ds)-1, int(q*float64(len(ds))))
	return float64(ds[i]) / float64(time.Millisecond)
}
