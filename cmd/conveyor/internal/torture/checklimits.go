package torture

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// Queue limits (conveyor.QueueLimits) as the records show them.
//
// Concurrency. A job of a queue with MaxRunning holds one of the queue's
// slots from the claim that starts its attempt until the attempt ends in
// the database (its outcome is written, it is released or rescued). Each
// execution's recorded interval lies within that hold, except where the
// database ended the attempt while the handler still ran:
//
//   - the recorded start follows the claim (the handler records it first
//     thing), and the recorded end precedes the outcome (the handler
//     records it before it returns to the engine, which then writes the
//     outcome and frees the slot in the same statement or transaction);
//   - a process killed with SIGKILL (or exited) holds its slot in the
//     database until its attempts are rescued, after its death: the
//     checker's effective end (the death) is earlier;
//   - an attempt the database rescued ("lease expired") while its handler
//     still ran, in a process stopped with SIGSTOP or cut off from the
//     database past its lease, was freed by that rescue at a moment the
//     records do not hold: it came after the fault that kept the lease
//     from being renewed began (the same fault the checker requires to
//     excuse the overlap of two executions of one job, faultFor). Such an
//     execution counts up to the start of that fault (nothing when the
//     fault began before the handler started: a process stopped between
//     its claim and its handler), never past it;
//   - an attempt whose claim a database restart lost (claimLost:
//     PostgreSQL's asynchronous claim commit) never held a slot the
//     database kept: its slot was lost with the claim, and it does not
//     count.
//
// Each counted interval is thus within its slot's hold in the database,
// and two holds of one slot never overlap, so at no instant may more than
// MaxRunning counted intervals of the queue be in progress
// (Findings.OverLimit). The rule is a lower bound on the slots the
// database had handed out: it can miss an excess while a killed or
// stopped process's slot awaited its rescue, never report one that was
// not there.
//
// Rate. A claim of a queue with a Rate stamps one of its Rate slots with
// the claim's clock value, the one the claim also writes as the job's
// attempted_at, and a slot is stamped again only a RatePeriod or more
// after its last stamp, so that no window of RatePeriod holds more than
// Rate claims by the database's clock. Each execution records the
// attempted_at its handler was given (Exec.Claimed), and the check
// counts those, not the handlers' own start times: the delay from claim
// to start varies (a loaded machine, a process stopped between the two),
// and start times could crowd claims made a period apart into one window.
// A claim lost in a database restart does not count (its stamp was lost
// with it). No window of RatePeriod may hold more than Rate + 1 claims
// (Findings.OverRate): one of slack for clocks read outside the
// database (SQLite's clock is the claiming process's). Claims whose
// handler never started (a process killed in between) are not recorded:
// like the concurrency rule, the count can only be short.

// limitSlack is how many claims beyond Rate a window of RatePeriod may
// hold.
const limitSlack = 1

// checkLimits applies the queue limits in in.Limits to the executions
// (see above).
func (in *Input) checkLimits(f *Findings, byJob map[int64][]Exec) {
	if len(in.Limits) == 0 {
		return
	}
	spans := map[string][]span{}
	keySpans := map[[2]string][]span{} // by queue and key
	claims := map[string][]Exec{}
	for id, es := range byJob {
		j := in.Jobs[id]
		if j == nil {
			continue
		}
		l, ok := in.Limits[j.Queue]
		if !ok || l.IsZero() {
			continue
		}
		errAt := map[int][]string{}
		for _, e := range j.Errors {
			errAt[e.Attempt] = append(errAt[e.Attempt], e.Error)
		}
		for i, e := range es {
			if in.lostClaim(e, es[i+1:]) {
				continue
			}
			claims[j.Queue] = append(claims[j.Queue], e)
			end := in.slotEnd(e, errAt[e.Attempt])
			if end.After(e.Start) {
				spans[j.Queue] = append(spans[j.Queue], span{e, e.Start, end})
				if j.Key != "" {
					k := [2]string{j.Queue, j.Key}
					keySpans[k] = append(keySpans[k], span{e, e.Start, end})
				}
			}
		}
	}
	if f.LimitPeak == nil {
		f.LimitPeak, f.RatePeak = map[string]int{}, map[string]int{}
	}
	for _, q := range slices.Sorted(maps.Keys(in.Limits)) {
		l := in.Limits[q]
		if l.MaxRunning > 0 {
			peak, over := overLimit(spans[q], l.MaxRunning, "queue "+q, "MaxRunning")
			f.LimitPeak[q] = peak
			f.OverLimit = append(f.OverLimit, over...)
		}
		if l.Rate > 0 {
			var ts []time.Time
			seen := map[[2]int64]bool{}
			for _, e := range claims[q] {
				t := e.claimedAt()
				k := [2]int64{e.Job, t.UnixNano()}
				if seen[k] { // one claim recorded twice
					continue
				}
				seen[k] = true
				ts = append(ts, t)
			}
			f.RatePeak[q], _ = maxInWindow(ts, l.RatePeriod)
			// One finding per crowded window, from its first claim.
			slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
			for i := 0; i < len(ts); i++ {
				k := i
				for k < len(ts) && ts[k].Sub(ts[i]) < l.RatePeriod {
					k++
				}
				if k-i > l.Rate+limitSlack {
					f.OverRate = append(f.OverRate, fmt.Sprintf("queue %s: %d claims within %v from %s, Rate %d (plus %d)",
						q, k-i, l.RatePeriod, clock(ts[i]), l.Rate, limitSlack))
					i = k - 1
				}
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(keySpans), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) }) {
		l := in.Limits[k[0]]
		per := l.KeyMaxRunning
		if l.Ordered {
			per = 1
		}
		if per <= 0 {
			continue
		}
		peak, over := overLimit(keySpans[k], per, fmt.Sprintf("queue %s key %s", k[0], k[1]), "per key")
		if l.Ordered {
			f.OrderedAtOnce = append(f.OrderedAtOnce, over...)
		} else {
			f.OverKey = append(f.OverKey, over...)
		}
		f.KeyPeak = maxInt(f.KeyPeak, peak)
	}
	in.checkOrder(f, byJob, keySpans)
	sort.Strings(f.OverLimit)
	sort.Strings(f.OverRate)
	sort.Strings(f.OverKey)
	sort.Strings(f.OrderedAtOnce)
	sort.Strings(f.OutOfOrder)
}

// Ordered keys as the records show them. The jobs of a key of an Ordered
// queue run one at a time (checked above: at no instant two counted
// intervals of one key, the intervals the queue's MaxRunning is checked
// on, Findings.OrderedAtOnce), in the order they were enqueued, a job
// that failed holding its key until its retry completes it (or it is
// discarded or cancelled). The torture enqueues each key's jobs one
// after another from one goroutine, each once the last was acknowledged,
// so that the order of ids is the order of enqueues; jobs whose enqueue
// was not acknowledged are left out (one may have committed after a
// later one).
//
// Of two acknowledged jobs A before B of one key, B's claim came after A
// freed the key for good: after the statement that completed A, or that
// discarded or cancelled it. Each job's times are taken so that the
// check errs on missing a violation, never on inventing one:
//
//   - B's first start is the earliest start of its counted executions
//     (not those whose claim a database restart lost, lostClaim), not
//     its first attempt's: a process stopped between the claim and the
//     handler's start (SIGSTOP) records its attempt's start only on
//     waking, after a later attempt of the same job, rescued meanwhile,
//     ran elsewhere. Every start follows its claim;
//   - A finished at the end of the execution that finished it: for a
//     completed job the earliest end of a successful execution of its
//     final attempt (the completion that took effect came after it: the
//     end is recorded before the handler returns to the engine); for a
//     discarded or cancelled one the earliest end of an execution of
//     its final attempt as slotEnd counts it (an attempt rescued while
//     its process was stopped or cut off past its lease counts up to
//     the start of that fault, before the rescue that ended it). An
//     execution whose claim a database restart lost may bound it too:
//     the earliest end is the safe one. An execution of an attempt that
//     did not finish the job (a zombie whose attempt was rescued, a
//     failed attempt waiting for its retry) is not A's finish: B must
//     wait for the retry. A job with no such execution (a completion no
//     successful execution of its final attempt explains, a finding of
//     its own; a job cancelled or discarded before it ran) bounds
//     nothing;
//   - a job not in a final state after the drain never finished: every
//     later job of its key that ran at all ran out of order.
//
// B started out of order (Findings.OutOfOrder) when its first start is
// before the finish of an earlier job of its key, or it ran while an
// earlier one never finished. Times of different processes compare: they
// share the machine's clock.
//
// The check proves something only where jobs of a key waited: the peak of
// jobs of one key waiting (acknowledged, not yet started) at an instant
// a counted execution of the key was in progress (Findings.OrderedWait),
// and the failed jobs during whose retry wait a later job of their key
// had been acknowledged and had not started (Findings.OrderedHeld: the
// hold on failure exercised).
func (in *Input) checkOrder(f *Findings, byJob map[int64][]Exec, keySpans map[[2]string][]span) {
	keyed := map[[2]string][]int64{}
	for id, j := range in.Jobs {
		if j.Key == "" || !in.Limits[j.Queue].Ordered {
			continue
		}
		if _, ok := in.Acked[id]; !ok {
			continue
		}
		k := [2]string{j.Queue, j.Key}
		keyed[k] = append(keyed[k], id)
	}
	type ordered struct {
		id         int64
		ran        bool      // it has a counted execution
		first      time.Time // its earliest counted start
		done       time.Time // its finish (see above), when finished
		finished   bool      // in a final state with a known finish
		unfinished bool      // not in a final state
		acked      time.Time // its enqueue's acknowledgement (zero if unknown)
		failed     []time.Time
	}
	of := func(id int64) ordered {
		j, es := in.Jobs[id], byJob[id]
		o := ordered{id: id, acked: in.AckedAt[id]}
		errAt := map[int][]string{}
		for _, e := range j.Errors {
			errAt[e.Attempt] = append(errAt[e.Attempt], e.Error)
		}
		for i, e := range es {
			// Every execution may bound the finish (the earliest of them
			// counts), one whose claim was lost included.
			var end time.Time
			switch j.State {
			case "completed":
				if e.Attempt == j.Attempt && e.Outcome == OutcomeOK && !e.End.IsZero() {
					end = e.End
				}
			case "discarded", "cancelled":
				if e.Attempt == j.Attempt {
					end = in.slotEnd(e, errAt[e.Attempt])
				}
			}
			if !end.IsZero() && (!o.finished || end.Before(o.done)) {
				o.done, o.finished = end, true
			}
			if in.lostClaim(e, es[i+1:]) {
				continue
			}
			if !o.ran || e.Start.Before(o.first) {
				o.first, o.ran = e.Start, true
			}
			// A failure that took effect: the job waited for its retry.
			if e.Outcome != OutcomeOK && !e.End.IsZero() && e.Attempt < j.Attempt &&
				len(errAt[e.Attempt]) > 0 && !rescued(errAt[e.Attempt]) {
				o.failed = append(o.failed, e.End)
			}
		}
		switch j.State {
		case "completed", "discarded", "cancelled":
		default:
			o.unfinished = true
		}
		return o
	}
	for _, k := range slices.SortedFunc(maps.Keys(keyed), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) }) {
		ids := keyed[k]
		slices.Sort(ids)
		jobs := make([]ordered, len(ids))
		for i, id := range ids {
			jobs[i] = of(id)
		}
		var bound ordered // the latest finish of the jobs before
		var open *ordered // the first job before that never finished
		for i := range jobs {
			b := &jobs[i]
			if b.ran {
				switch {
				case open != nil:
					f.OutOfOrder = append(f.OutOfOrder, fmt.Sprintf("queue %s key %s: job %d started at %s while job %d enqueued before it was unfinished (%s after the drain)",
						k[0], k[1], b.id, clock(b.first), open.id, in.Jobs[open.id].State))
				case bound.finished && b.first.Before(bound.done):
					f.OutOfOrder = append(f.OutOfOrder, fmt.Sprintf("queue %s key %s: job %d started at %s, before job %d enqueued before it finished (the run that finished it ended at %s)",
						k[0], k[1], b.id, clock(b.first), bound.id, clock(bound.done)))
				}
			}
			if b.unfinished && open == nil {
				open = b
			}
			if b.finished && (!bound.finished || b.done.After(bound.done)) {
				bound = *b
			}
		}
		// How many of the key's jobs waited while one of them ran, and
		// which failed jobs a later one waited for.
		waiting := func(t time.Time, after int) int {
			n := 0
			for _, o := range jobs[after:] {
				if !o.acked.IsZero() && !o.acked.After(t) && (!o.ran || o.first.After(t)) {
					n++
				}
			}
			return n
		}
		spans := keySpans[k]
		running := func(t time.Time) bool {
			for _, s := range spans {
				if !t.Before(s.start) && t.Before(s.end) {
					return true
				}
			}
			return false
		}
		for _, o := range jobs {
			for _, t := range []time.Time{o.acked, o.first} {
				if !t.IsZero() && running(t) {
					f.OrderedWait = maxInt(f.OrderedWait, waiting(t, 0))
				}
			}
		}
		for _, s := range spans {
			if running(s.start) {
				f.OrderedWait = maxInt(f.OrderedWait, waiting(s.start, 0))
			}
		}
		for i, o := range jobs {
			for _, t := range o.failed {
				if waiting(t, i+1) > 0 {
					f.OrderedHeld++
					break
				}
			}
		}
		f.OrderedKeys++
		f.OrderedJobs += len(ids)
	}
}

// span is an execution's interval counted against a limit.
type span struct {
	e          Exec
	start, end time.Time
}

// overLimit returns the most spans of ss in progress at one instant and
// one finding (named by what and limit) per entry into an excess of max:
// an interval is [start, end), so ends come before starts at one instant.
func overLimit(ss []span, max int, what, limit string) (int, []string) {
	type edge struct {
		at    time.Time
		delta int
		i     int
	}
	edges := make([]edge, 0, 2*len(ss))
	for i, s := range ss {
		edges = append(edges, edge{s.start, 1, i}, edge{s.end, -1, i})
	}
	sort.Slice(edges, func(a, b int) bool {
		if !edges[a].at.Equal(edges[b].at) {
			return edges[a].at.Before(edges[b].at)
		}
		return edges[a].delta < edges[b].delta
	})
	open := map[int]bool{}
	peak := 0
	var out []string
	for _, ed := range edges {
		if ed.delta < 0 {
			delete(open, ed.i)
			continue
		}
		open[ed.i] = true
		peak = maxInt(peak, len(open))
		if len(open) == max+1 {
			// Entering an excess: name what ran at that instant.
			var who []string
			for _, i := range slices.Sorted(maps.Keys(open)) {
				s := ss[i]
				who = append(who, fmt.Sprintf("job %d attempt %d on %s [%s, %s)", s.e.Job, s.e.Attempt, s.e.Proc, clock(s.start), clock(s.end)))
			}
			sort.Strings(who)
			out = append(out, fmt.Sprintf("%s: %d running at %s, %s %d: %s",
				what, len(open), clock(ed.at), limit, max, strings.Join(who, ", ")))
		}
	}
	return peak, out
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// lostClaim reports whether e's claim was lost in a database restart: a
// later execution of the same attempt is explained by claimLost.
func (in *Input) lostClaim(e Exec, later []Exec) bool {
	for _, l := range later {
		if l.Attempt == e.Attempt && in.claimLost(e, l) {
			return true
		}
	}
	return false
}

// slotEnd is when execution e stops counting against its queue's
// MaxRunning: its effective end, or, when the database rescued its
// attempt (errs are the attempt's error entries) because a fault kept
// its lease from being renewed, the start of that fault if earlier (the
// rescue freed the slot some time after it), but not before e's start.
func (in *Input) slotEnd(e Exec, errs []string) time.Time {
	end := in.effectiveEnd(e)
	if !rescued(errs) {
		return end
	}
	ev, ok := in.faultFor(e, farFuture)
	if !ok {
		// A rescue no fault explains is a finding of its own
		// (Unexplained); count the execution whole.
		return end
	}
	if ev.Start.Before(end) {
		end = ev.Start
	}
	if end.Before(e.Start) {
		end = e.Start
	}
	return end
}

// claimedAt is when e's attempt was claimed by the database's clock, or
// its start when that was not recorded.
func (e Exec) claimedAt() time.Time {
	if !e.Claimed.IsZero() {
		return e.Claimed
	}
	return e.Start
}

// maxInWindow is the most of ts within any window of d (from one of
// them, inclusive, to d later, exclusive) and where that window starts.
func maxInWindow(ts []time.Time, d time.Duration) (int, time.Time) {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	top, at := 0, time.Time{}
	k := 0
	for i, s := range ts {
		for k < len(ts) && ts[k].Sub(s) < d {
			k++
		}
		if k-i > top {
			top, at = k-i, s
		}
	}
	return top, at
}

// LimitsOf are the torture's limited queues and their limits for a run
// whose producers enqueue rate jobs per second in all: QueueLimited runs
// at most three jobs at once, QueueRated starts at most a fifth of the
// enqueue rate per second (Rate 20 per second at the default 100),
// QueueOrdered runs each key's jobs one at a time in enqueue order.
func LimitsOf(rate float64) map[string]conveyor.QueueLimits {
	return map[string]conveyor.QueueLimits{
		QueueLimited: {MaxRunning: limitedMaxRunning},
		QueueRated:   {Rate: max(2, int(rate/5+0.5)), RatePeriod: time.Second},
		QueueOrdered: {Ordered: true},
	}
}
