package bench

import (
	"context"
	"errors"
	"fmt"
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
//     period by the database's clock, must not pass the rate.
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
	}{
		{"unlimited", conveyor.QueueLimits{}, o.Jobs, o.Work, 0},
		{"limit-above", conveyor.QueueLimits{MaxRunning: limitsAboveMult * o.Workers}, o.Jobs, o.Work, 0},
		{"limit-10", conveyor.QueueLimits{MaxRunning: limitsSlots}, limitsHeldJobs, work, limitsSlots / work.Seconds()},
		// Rate N per period P lets J jobs start in (ceil(J/N) - 1) periods:
		// N at once, then N more each period.
		{"rate", conveyor.QueueLimits{Rate: limitsRate, RatePeriod: limitsPeriod}, limitsRateJobs, 0,
			limitsRateJobs / (float64((limitsRateJobs+limitsRate-1)/limitsRate-1) * limitsPeriod.Seconds())},
	}
	var rs []*Result
	var errs []error
	for _, ph := range phases {
		ro := o
		ro.Workload, ro.Jobs, ro.Work, ro.Limits = "drain", ph.jobs, ph.work, ph.limits
		ro.label = "limits " + ph.name
		ro.Emit = nil
		r, err := Run(ctx, ro)
		if r == nil {
			return rs, errors.Join(append(errs, err)...)
		}
		r.Workload, r.Phase, r.Allowed = "limits", ph.name, ph.allowed
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
	return nil
}
