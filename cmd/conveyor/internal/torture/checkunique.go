package torture

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// KindTick is the workers' periodic job: it sleeps for its "ms" argument,
// honouring its context.
const KindTick = "tick"

// Unique jobs of the torture workload: the producers make a share of
// their jobs unique, with keys drawn from small pools so that duplicates
// really happen, concurrently from several processes and inside rolled
// back transactions. Two kinds of key:
//
//   - live keys ("L0".."L3" in the "u" argument, UniqueOpts{ArgsFields:
//     u}): held while the job is unfinished (the default States), so
//     a key has a sequence of jobs, none of which may overlap another;
//   - kept keys ("K0".."K3" in "u" and a one-second window number in "w",
//     UniqueOpts{ArgsFields: u, w; ByQueue; every state}): held in every
//     state, so at most one job per key may ever exist, and every
//     committed caller must be told its id.
const (
	uniqueLive = "L"
	uniqueKept = "K"
	// uniqueKeys is the size of each pool of keys.
	uniqueKeys = 4
	// keptWindow is the length of a kept key's window.
	keptWindow = time.Second
)

// uniqueKeyOf is the checker's name for the unique key of a job of kind
// on queue whose arguments have u and w: what the library's key is made
// of for the torture's UniqueOpts. "" for a job that is not unique.
func uniqueKeyOf(kind, queue, u string, w int64) string {
	switch {
	case u == "":
		return ""
	case strings.HasPrefix(u, uniqueKept):
		return fmt.Sprintf("%s/%s/%s/%d", kind, queue, u, w)
	default:
		return kind + "/" + u
	}
}

func keptKey(key string) bool {
	_, rest, _ := strings.Cut(key, "/")
	_, rest, _ = strings.Cut(rest, "/")
	return strings.HasPrefix(rest, uniqueKept)
}

func (j *FinalJob) uniqueKey() string { return uniqueKeyOf(j.Kind, j.Queue, j.U, j.W) }

// Told is what one committed enqueue of a unique job was told.
type Told struct {
	// Tok is the enqueue's token and Key the job's unique key.
	Tok, Key string
	// ID is the id returned: the new job's, or for a duplicate the
	// holder's.
	ID int64
	// Dup is the duplicate flag returned.
	Dup bool
	// Proc is the producer process.
	Proc string
	// Begin is when the enqueue call (or its transaction) began, At when
	// its commit was acknowledged.
	Begin, At time.Time
}

// Up is a worker process incarnation that ran the periodic job: from when
// its client had started (Ready) to its death (End; zero if it never
// died).
type Up struct {
	Proc  string
	PID   int
	Ready time.Time
	End   time.Time
}

// checkUnique checks the unique jobs:
//
//   - no two jobs of one live key certainly unfinished at the same moment.
//     A completed job is certainly unfinished from its first execution's
//     start (or, if earlier, the acknowledgement of its enqueue) to the
//     end of the earliest successful execution of its final attempt: the
//     completion that took effect came after that end;
//   - at most one row for each kept key;
//   - every caller told the id of a job of its own key; for a duplicate,
//     a holder whose enqueue had begun before the caller was answered
//     and, for live keys, that nobody had seen completed before the
//     caller's enqueue began.
func (in *Input) checkUnique(f *Findings, byJob map[int64][]Exec) {
	f.UniqueTold = len(in.Told)
	rows := map[string][]*FinalJob{}
	for _, j := range in.Jobs {
		if k := j.uniqueKey(); k != "" {
			rows[k] = append(rows[k], j)
		}
	}
	began, acked := map[int64]time.Time{}, map[int64]time.Time{}
	for _, t := range in.Told {
		if t.Dup {
			f.DupTold++
			continue
		}
		began[t.ID], acked[t.ID] = t.Begin, t.At
	}
	for k, js := range rows {
		if keptKey(k) {
			if len(js) > 1 {
				f.UniqueKeptTwice = append(f.UniqueKeptTwice, fmt.Sprintf("key %s in jobs %v", k, jobIDs(js)))
			}
			continue
		}
		type span struct {
			id     int64
			lo, hi time.Time
		}
		var spans []span
		for _, j := range js {
			if lo, hi, ok := liveSpan(j, byJob[j.ID], acked[j.ID]); ok {
				spans = append(spans, span{j.ID, lo, hi})
			}
		}
		sort.Slice(spans, func(a, b int) bool { return spans[a].lo.Before(spans[b].lo) })
		var cur span // the span reaching furthest so far
		for i, s := range spans {
			if i > 0 && !s.lo.After(cur.hi) {
				f.UniqueLiveTwice = append(f.UniqueLiveTwice, fmt.Sprintf("key %s: job %d unfinished [%s, %s] and job %d [%s, %s]",
					k, cur.id, clock(cur.lo), clock(cur.hi), s.id, clock(s.lo), clock(s.hi)))
			}
			if i == 0 || s.hi.After(cur.hi) {
				cur = s
			}
		}
	}
	for _, t := range in.Told {
		j := in.Jobs[t.ID]
		who := fmt.Sprintf("%s (key %s, duplicate %v)", t.Tok, t.Key, t.Dup)
		switch {
		case j == nil:
			if t.Dup { // a missing new job is counted as lost
				f.WrongHolder = append(f.WrongHolder, fmt.Sprintf("%s told job %d, which does not exist", who, t.ID))
			}
		case j.uniqueKey() != t.Key:
			f.WrongHolder = append(f.WrongHolder, fmt.Sprintf("%s told job %d, whose key is %q", who, t.ID, j.uniqueKey()))
		case t.Dup:
			if b, ok := began[t.ID]; ok && b.After(t.At) {
				f.WrongHolder = append(f.WrongHolder, fmt.Sprintf("%s told job %d at %s, whose own enqueue began at %s",
					who, t.ID, clock(t.At), clock(b)))
			}
			if a, ok := in.AppliedAt[t.ID]; ok && !keptKey(t.Key) && a.Before(t.Begin) {
				f.WrongHolder = append(f.WrongHolder, fmt.Sprintf("%s began at %s and was told job %d, seen completed at %s",
					who, clock(t.Begin), t.ID, clock(a)))
			}
		}
	}
	sort.Strings(f.UniqueLiveTwice)
	sort.Strings(f.UniqueKeptTwice)
	sort.Strings(f.WrongHolder)
}

// liveSpan is an interval during which completed job j was certainly
// unfinished (see checkUnique); ok is false when the records cannot tell.
func liveSpan(j *FinalJob, es []Exec, ack time.Time) (lo, hi time.Time, ok bool) {
	if j.State != "completed" {
		return lo, hi, false
	}
	for _, e := range es {
		if lo.IsZero() || e.Start.Before(lo) {
			lo = e.Start
		}
		if e.Attempt == j.Attempt && e.Outcome == OutcomeOK && (hi.IsZero() || e.End.Before(hi)) {
			hi = e.End
		}
	}
	if lo.IsZero() || hi.IsZero() {
		return lo, hi, false
	}
	if !ack.IsZero() && ack.Before(lo) {
		lo = ack // committed by then, and completed only after hi
	}
	return lo, hi, true
}

func jobIDs(js []*FinalJob) []int64 {
	ids := make([]int64, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	return ids
}

// checkPeriodic checks the workers' periodic job: every job of it is due
// on a slot (its first execution's ScheduledAt, which a retry after a
// failure would move, else the row's), no slot has two jobs, and every
// slot from the first to the last with a job has one, unless no worker
// process ran the schedule around it (see slotRequired).
func (in *Input) checkPeriodic(f *Findings, byJob map[int64][]Exec) {
	if in.Tick <= 0 {
		return
	}
	d := int64(in.Tick)
	slots := map[int64][]int64{}
	for id, j := range in.Jobs {
		if j.Kind != KindTick {
			continue
		}
		if j.State != "completed" {
			f.PeriodicNotCompleted = append(f.PeriodicNotCompleted, id)
		}
		due, first := j.ScheduledAt, time.Time{}
		for _, e := range byJob[id] {
			if !e.Scheduled.IsZero() && (first.IsZero() || e.Start.Before(first)) {
				due, first = e.Scheduled, e.Start
			}
		}
		n := due.UnixNano()
		idx := (n + d/2) / d
		if off := time.Duration(n - idx*d); off > time.Millisecond || off < -time.Millisecond {
			f.OffSlot = append(f.OffSlot, fmt.Sprintf("job %d due %s, %v from a slot of %v", id, due.Format(time.RFC3339Nano), off, in.Tick))
			continue
		}
		slots[idx] = append(slots[idx], id)
	}
	if len(slots) == 0 {
		return
	}
	first, last := int64(-1), int64(-1)
	for idx := range slots {
		if first < 0 || idx < first {
			first = idx
		}
		last = max(last, idx)
	}
	for idx := first; idx <= last; idx++ {
		f.Slots++
		s := time.Unix(0, idx*d)
		switch ids := slots[idx]; {
		case len(ids) > 1:
			sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
			f.SlotsTwice = append(f.SlotsTwice, fmt.Sprintf("slot %s in jobs %v", clock(s), ids))
		case len(ids) == 0:
			if u, ok := in.slotRequired(s); ok {
				f.SlotsMissed = append(f.SlotsMissed, fmt.Sprintf("slot %s (%s ran the schedule from %s to %s)",
					clock(s), u.Proc, clock(u.Ready), clockOrDash(u.End)))
			} else {
				f.SlotsSkippedDown++
			}
		}
	}
	sort.Strings(f.SlotsTwice)
	sort.Strings(f.SlotsMissed)
	sort.Strings(f.OffSlot)
}

// slotRequired reports whether slot s must have a job: it is not after
// the schedule was stopped, and some worker process had started its
// client at least a lease before s (its periodic loop reads the schedules
// once before its first slot, retried with a backoff of a few seconds
// after a database fault) and lived until a lease after s, or after every
// database fault and pause of its own that delayed its enqueue of s (it
// catches up on its missed slots when the database or the process comes
// back).
func (in *Input) slotRequired(s time.Time) (Up, bool) {
	if !in.TickStop.IsZero() && s.After(in.TickStop) {
		return Up{}, false
	}
	g := in.Lease
	for _, u := range in.Ups {
		ready := u.Ready
		for _, ev := range in.Events {
			// A database fault around its start: the first read of
			// the schedules is retried after 1s, 2s, 4s...
			if ev.PID == 0 && ev.Start.Before(ready.Add(g)) && ev.End.After(ready.Add(-g)) {
				ready = latest(ready, ev.End.Add(4*time.Second))
			}
		}
		if ready.After(s.Add(-g)) {
			continue
		}
		deadline := s.Add(g)
		for changed := true; changed; {
			changed = false
			for _, ev := range in.Events {
				if ev.PID != 0 && (ev.PID != u.PID || ev.Kind != EventPause) {
					continue
				}
				if ev.Start.After(deadline) || ev.End.Before(s.Add(-g)) {
					continue
				}
				if e := ev.End.Add(g); e.After(deadline) {
					deadline, changed = e, true
				}
			}
		}
		if u.End.IsZero() || !u.End.Before(deadline) {
			return u, true
		}
	}
	return Up{}, false
}
