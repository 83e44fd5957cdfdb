package torture

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// KindBatchDone is the callback of the producers' batches: it reads its
// batch (Client.Batch) and records the counts of its jobs' states.
const KindBatchDone = "batchdone"

// Batches (conveyor.Client.EnqueueBatch) as the records show them.
//
// A producer records each batch it enqueued (its id and its jobs' ids)
// after the commit; the callback's handler records what Client.Batch told
// it (the counts of the jobs' states) before it returns. The final rows
// name each callback's batch (conveyor.BatchOf). For every recorded batch:
//
//   - once every job of the batch has finished, exactly one callback row
//     exists; while one has not, none does; no batch has two
//     (Findings.BatchCallbackCount);
//   - the callback was enqueued only after the last of its jobs finished:
//     its first execution started after the end of the execution whose
//     completion finished each job (the same machine's clock; the
//     completion took effect after that end and the callback was enqueued
//     after the completion), and its row was created no earlier than each
//     job's row was finalized (the database's clock, which stamps both;
//     on SQLite the writing processes', which share the machine's clock),
//     each with batchClockSlack of slack (Findings.BatchCallbackEarly);
//   - the callback ended completed (Findings.BatchCallbackNotDone), after
//     at least one execution recorded what it saw;
//   - every execution of the callback saw the counts of its jobs' final
//     states (Findings.BatchCountsWrong): the jobs were final before the
//     callback existed, so their states could not change since.

// batchClockSlack is the slack of the callback's timing rules, for the
// clock readings they compare (a wall clock stepped by NTP, timestamps
// of the database rounded to its precision).
const batchClockSlack = 10 * time.Millisecond

// BatchRec is a batch a producer enqueued: its id, its jobs' ids in order
// and when the enqueue was acknowledged.
type BatchRec struct {
	ID   int64
	Jobs []int64
	At   time.Time
}

// BatchSeen is what an execution of a batch's callback read of its batch:
// the counts of its jobs by state.
type BatchSeen struct {
	Job     int64
	Attempt int
	Batch   int64
	Counts  map[string]int64
}

// finalState reports whether a job state is final.
func finalState(s string) bool {
	return s == "completed" || s == "discarded" || s == "cancelled"
}

// checkBatches applies the batch rules above to in.Batches.
func (in *Input) checkBatches(f *Findings, byJob map[int64][]Exec) {
	callbacks := map[int64][]int64{} // batch -> callback rows
	for id, j := range in.Jobs {
		if j.Batch != 0 {
			callbacks[j.Batch] = append(callbacks[j.Batch], id)
		}
	}
	for _, ids := range callbacks {
		slices.Sort(ids)
	}
	seen := map[int64][]BatchSeen{} // callback job -> what it saw
	for _, s := range in.BatchSeen {
		seen[s.Job] = append(seen[s.Job], s)
	}
	recorded := map[int64]bool{}
	for _, b := range in.Batches {
		recorded[b.ID] = true
		f.Batches++
		cbs := callbacks[b.ID]
		finished := true
		want := map[string]int64{}
		var lastEnd, lastFinal time.Time
		var lastJob int64
		for _, m := range b.Jobs {
			j := in.Jobs[m]
			if j == nil || !finalState(j.State) {
				finished = false
				continue
			}
			want[j.State]++
			if e, ok := finishingExec(j, byJob[m]); ok && e.After(lastEnd) {
				lastEnd, lastJob = e, m
			}
			if j.FinalizedAt.After(lastFinal) {
				lastFinal = j.FinalizedAt
			}
		}
		switch {
		case len(cbs) > 1:
			f.BatchCallbackCount = append(f.BatchCallbackCount, fmt.Sprintf("batch %d: %d callback jobs %v", b.ID, len(cbs), cbs))
		case finished && len(cbs) == 0:
			f.BatchCallbackCount = append(f.BatchCallbackCount, fmt.Sprintf("batch %d: every job finished, no callback job", b.ID))
		case !finished && len(cbs) > 0:
			f.BatchCallbackCount = append(f.BatchCallbackCount, fmt.Sprintf("batch %d: callback job %d while a job of the batch is unfinished", b.ID, cbs[0]))
		}
		if len(cbs) == 0 {
			continue
		}
		cb := in.Jobs[cbs[0]]
		if cb.State != "completed" {
			f.BatchCallbackNotDone = append(f.BatchCallbackNotDone, fmt.Sprintf("batch %d: callback job %d ended %s", b.ID, cb.ID, cb.State))
		} else if len(seen[cb.ID]) == 0 {
			f.BatchCallbackNotDone = append(f.BatchCallbackNotDone, fmt.Sprintf("batch %d: callback job %d completed with no record of what it read", b.ID, cb.ID))
		}
		var first time.Time
		for _, e := range byJob[cb.ID] {
			if first.IsZero() || e.Start.Before(first) {
				first = e.Start
			}
		}
		if !first.IsZero() && !lastEnd.IsZero() {
			f.BatchGapRun = minGap(f.BatchGapRun, first.Sub(lastEnd))
		}
		if !cb.CreatedAt.IsZero() && !lastFinal.IsZero() {
			f.BatchGapDB = minGap(f.BatchGapDB, cb.CreatedAt.Sub(lastFinal))
		}
		if !first.IsZero() && !lastEnd.IsZero() && first.Add(batchClockSlack).Before(lastEnd) {
			f.BatchCallbackEarly = append(f.BatchCallbackEarly, fmt.Sprintf("batch %d: callback job %d started at %s, before job %d finished running at %s",
				b.ID, cb.ID, clock(first), lastJob, clock(lastEnd)))
		}
		if !cb.CreatedAt.IsZero() && !lastFinal.IsZero() && cb.CreatedAt.Add(batchClockSlack).Before(lastFinal) {
			f.BatchCallbackEarly = append(f.BatchCallbackEarly, fmt.Sprintf("batch %d: callback job %d created at %s (database clock), before the last job was finalized at %s",
				b.ID, cb.ID, clock(cb.CreatedAt), clock(lastFinal)))
		}
		if !finished {
			continue
		}
		for _, s := range seen[cb.ID] {
			if s.Batch != b.ID || !maps.Equal(s.Counts, want) {
				f.BatchCountsWrong = append(f.BatchCountsWrong, fmt.Sprintf("batch %d: callback job %d attempt %d read batch %d with %s, the jobs ended %s",
					b.ID, cb.ID, s.Attempt, s.Batch, countsString(s.Counts), countsString(want)))
			}
		}
	}
	// A batch nobody recorded (its enqueue's outcome unknown) is not
	// checked, except that it may never have two callbacks.
	for bid, cbs := range callbacks {
		if !recorded[bid] && len(cbs) > 1 {
			f.BatchCallbackCount = append(f.BatchCallbackCount, fmt.Sprintf("batch %d: %d callback jobs %v", bid, len(cbs), cbs))
		}
	}
	sort.Strings(f.BatchCallbackCount)
	sort.Strings(f.BatchCallbackEarly)
	sort.Strings(f.BatchCallbackNotDone)
	sort.Strings(f.BatchCountsWrong)
}

// minGap is the smaller of the gaps so far (nil: none) and g.
func minGap(so *time.Duration, g time.Duration) *time.Duration {
	if so == nil || g < *so {
		return &g
	}
	return so
}

// finishingExec is when the execution that finished job j returned: for
// a completed job the earliest successful end of its final attempt (the
// completion took effect after it), otherwise the latest end of any
// execution of its final attempt; false when none is recorded.
func finishingExec(j *FinalJob, es []Exec) (time.Time, bool) {
	var t time.Time
	for _, e := range es {
		if e.Attempt != j.Attempt || e.End.IsZero() {
			continue
		}
		if j.State == "completed" {
			if e.Outcome == OutcomeOK && (t.IsZero() || e.End.Before(t)) {
				t = e.End
			}
		} else if e.End.After(t) {
			t = e.End
		}
	}
	return t, !t.IsZero()
}

// countsString renders state counts as "completed=5 discarded=1".
func countsString(c map[string]int64) string {
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s=%d", s, c[s]))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " ")
}
