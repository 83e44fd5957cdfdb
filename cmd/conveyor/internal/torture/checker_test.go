package torture

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// world builds checker inputs: a few jobs that all went well, to which
// each test adds its planted fault.
type world struct{ in *Input }

func newWorld() *world {
	in := &Input{Lease: 2 * time.Second, Acked: map[int64]string{}, RolledBack: map[string]bool{},
		Jobs: map[int64]*FinalJob{}, Deaths: map[int]time.Time{}, Poison: map[string]bool{}}
	w := &world{in}
	for id := int64(1); id <= 3; id++ {
		w.job(id, "completed", 1)
		w.exec(id, 1, 100, 0.1*float64(id), 0.1*float64(id)+0.05, OutcomeOK)
	}
	return w
}

func (w *world) job(id int64, state string, attempt int, errs ...AttemptErr) *FinalJob {
	tok := "p1.0:" + string(rune('a'+id))
	w.in.Acked[id] = tok
	j := &FinalJob{ID: id, Kind: KindWork, State: state, Attempt: attempt, MaxAttempts: 25, Token: tok, Errors: errs}
	w.in.Jobs[id] = j
	return j
}

func (w *world) exec(id int64, attempt, pid int, start, end float64, out string) {
	e := Exec{Job: id, Attempt: attempt, Kind: KindWork, PID: pid, Proc: "w" + string(rune('0'+pid%10)), Start: at(start), Outcome: out}
	if end > 0 {
		e.End = at(end)
	}
	w.in.Execs = append(w.in.Execs, e)
}

func (w *world) event(kind string, pid int, start, end float64) {
	w.in.Events = append(w.in.Events, Event{Kind: kind, PID: pid, Start: at(start), End: at(end)})
	if kind == EventKill || kind == EventExit {
		w.in.Deaths[pid] = at(start)
	}
}

func expired(attempt int) AttemptErr {
	return AttemptErr{Attempt: attempt, Error: "lease expired: host/100/ab stopped heartbeating"}
}

func TestCheckerCleanRunHasNoFailures(t *testing.T) {
	w := newWorld()
	// Job 10: its first process was killed mid-job; rescued and completed
	// by another. An explained duplicate, no overlap.
	w.job(10, "completed", 2, expired(1))
	w.exec(10, 1, 100, 1, 0, "")
	w.event(EventKill, 100, 1.5, 1.5)
	w.exec(10, 2, 200, 4, 4.2, OutcomeOK)
	// Job 11: its process was paused past the lease; another ran it
	// meanwhile; the late ack was refused (the DB says attempt 1 expired).
	w.job(11, "completed", 2, expired(1))
	w.exec(11, 1, 300, 1, 7, OutcomeOK)
	w.event(EventPause, 300, 1.2, 6.5)
	w.exec(11, 2, 200, 4, 4.5, OutcomeOK)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures in a clean run: %v", fl)
	}
	if f.Duplicates != 2 || f.DuplicateCauses["lease expired: killed"] != 1 || f.DuplicateCauses["lease expired: paused"] != 1 {
		t.Fatalf("duplicates %d %v", f.Duplicates, f.DuplicateCauses)
	}
	if f.OverlapsExplained != 1 || f.LateAcks != 1 || f.Completed != 5 || f.Enqueued != 5 {
		t.Fatalf("explained overlaps %d, late acks %d, completed %d, enqueued %d", f.OverlapsExplained, f.LateAcks, f.Completed, f.Enqueued)
	}
}

func TestCheckerReportsPlantedLoss(t *testing.T) {
	w := newWorld()
	w.job(20, "available", 0)             // never ran
	w.in.Acked[21] = "p1.0:gone"          // acknowledged, row missing
	w.job(22, "discarded", 1)             // discarded without a reason
	w.job(23, "discarded", 3, expired(3)) // discarded with a reason: not lost
	f := Check(w.in)
	if !slices.Equal(f.Lost, []int64{20, 21, 22}) {
		t.Fatalf("lost %v, want [20 21 22]", f.Lost)
	}
	if !slices.Equal(f.Stuck, []int64{20}) {
		t.Fatalf("stuck %v", f.Stuck)
	}
	assertFailure(t, f, "3 lost")
}

func TestCheckerReportsPlantedDoubleCompletion(t *testing.T) {
	w := newWorld()
	// Attempt 1 completed (no error entry: its completion took effect),
	// then something made the job runnable again and attempt 2 completed.
	w.job(30, "completed", 2)
	w.exec(30, 1, 100, 1, 1.1, OutcomeOK)
	w.exec(30, 2, 200, 5, 5.1, OutcomeOK)
	// Job 31: a rescuer overwrote a completed job (it recorded a rescue
	// for attempt 1, so the history looks like a refused late
	// acknowledgement), and attempt 2 completed it again. A worker saw
	// attempt 1 completed in the row: the completion-effect log catches
	// it.
	w.job(31, "completed", 2, expired(1))
	w.exec(31, 1, 100, 1, 1.1, OutcomeOK)
	w.exec(31, 2, 200, 5, 5.1, OutcomeOK)
	w.in.Applied = map[int64][]int{31: {1}, 1: {1}}
	f := Check(w.in)
	if !slices.Equal(f.CompletedTwice, []int64{30}) {
		t.Fatalf("completed twice %v", f.CompletedTwice)
	}
	if !slices.Equal(f.CompletionsUndone, []int64{31}) {
		t.Fatalf("completions undone %v", f.CompletionsUndone)
	}
	assertFailure(t, f, "1 completions seen applied and then undone")
	assertFailure(t, f, "1 completed twice")
	// The second execution has no fault behind it either.
	assertFailure(t, f, "completed, yet the job ran again")
}

func TestCheckerReportsPlantedStaleAck(t *testing.T) {
	w := newWorld()
	// Attempt 1 was rescued (lease expired) and its process then
	// acknowledged; attempt 2 was killed before finishing. The job is
	// completed at attempt 2, which never succeeded: the completion came
	// from attempt 1's stale acknowledgement.
	w.job(40, "completed", 2, expired(1))
	w.exec(40, 1, 100, 1, 8, OutcomeOK)
	w.event(EventPause, 100, 1.5, 7)
	w.exec(40, 2, 200, 5, 0, "")
	w.event(EventKill, 200, 6, 6)
	// Job 41: completed at attempt 1 although attempt 1 was rescued.
	w.job(41, "completed", 1, expired(1))
	w.exec(41, 1, 300, 1, 1.2, OutcomeOK)
	// Job 42: attempt 1 was rescued, then its late failure was applied
	// too (two entries for one attempt).
	w.job(42, "completed", 2, expired(1), AttemptErr{1, "handler failed"})
	w.exec(42, 1, 100, 1, 8, OutcomeError)
	w.exec(42, 2, 200, 9, 9.1, OutcomeOK)
	f := Check(w.in)
	if !slices.Equal(f.StaleApplied, []int64{40, 41, 42}) {
		t.Fatalf("stale applied %v", f.StaleApplied)
	}
	assertFailure(t, f, "3 stale acknowledgements applied")
}

func TestCheckerReportsPlantedOverlap(t *testing.T) {
	w := newWorld()
	// Attempt 1 ran from 1s to 10s on a live, connected process that was
	// never paused, yet the job was rescued and attempt 2 ran from 5s.
	w.job(50, "completed", 2, expired(1))
	w.exec(50, 1, 100, 1, 10, OutcomeError)
	w.exec(50, 2, 200, 5, 6, OutcomeOK)
	// Job 51: the same attempt handed to two processes at once.
	w.job(51, "completed", 1)
	w.exec(51, 1, 100, 1, 3, OutcomeOK)
	w.exec(51, 1, 200, 2, 4, OutcomeOK)
	f := Check(w.in)
	if len(f.Overlaps) != 2 || !strings.Contains(f.Overlaps[0], "job 50") || !strings.Contains(f.Overlaps[1], "job 51") {
		t.Fatalf("overlaps %v", f.Overlaps)
	}
	assertFailure(t, f, "2 overlapping executions")
	assertFailure(t, f, "premature rescue")
	assertFailure(t, f, "attempt run twice without a shutdown")
}

func TestCheckerReportsRolledBackAndDuplicateRows(t *testing.T) {
	w := newWorld()
	w.in.RolledBack["p9:1"] = true
	j := w.job(60, "completed", 1)
	j.Token = "p9:1"
	w.exec(60, 1, 100, 1, 1.1, OutcomeOK)
	k := w.job(61, "completed", 1)
	k.Token = w.in.Jobs[1].Token
	w.exec(61, 1, 100, 1, 1.1, OutcomeOK)
	f := Check(w.in)
	assertFailure(t, f, "1 rolled-back enqueues present")
	assertFailure(t, f, "1 enqueues stored twice")
}

func TestCheckerPoisonAndExplainedFailures(t *testing.T) {
	w := newWorld()
	w.in.Poison[KindPanic] = true
	j := w.job(70, "discarded", 3, AttemptErr{1, "job panicked"}, AttemptErr{2, "job panicked"}, AttemptErr{3, "job panicked"})
	j.Kind = KindPanic
	for a := 1; a <= 3; a++ {
		w.exec(70, a, 100, float64(a), float64(a)+0.01, OutcomePanic)
	}
	// A poison exit job: the process dies after the handler of another
	// job returned but before its outcome was written; that job's attempt
	// is rescued, explained by the exit.
	w.job(71, "completed", 2, expired(1))
	w.exec(71, 1, 100, 5, 5.01, OutcomeOK)
	w.event(EventExit, 100, 5.02, 5.02)
	w.exec(71, 2, 200, 8, 8.1, OutcomeOK)
	// A job still running after the drain, of a poison kind.
	h := w.job(72, "running", 1)
	h.Kind = KindPanic
	f := Check(w.in)
	if f.DuplicateCauses["poison panic failed"] != 2 || f.DuplicateCauses["lease expired: exited"] != 1 {
		t.Fatalf("causes %v, unexplained %v", f.DuplicateCauses, f.Unexplained)
	}
	if !slices.Equal(f.PoisonNotDiscarded, []int64{72}) || !slices.Equal(f.Lost, []int64{72}) {
		t.Fatalf("poison not discarded %v, lost %v", f.PoisonNotDiscarded, f.Lost)
	}
}

func assertFailure(t *testing.T, f *Findings, want string) {
	t.Helper()
	for _, l := range f.Failures() {
		if strings.Contains(l, want) {
			return
		}
	}
	t.Errorf("no failure mentions %q; failures: %v", want, f.Failures())
}

func TestRecovery(t *testing.T) {
	// 100/s for 10s, nothing from 10s to 12s, back at 100/s from 13.5s.
	var done []time.Time
	for ms := 0; ms < 20000; ms += 10 {
		s := float64(ms) / 1000
		if s >= 10 && s < 13.5 {
			continue
		}
		done = append(done, at(s))
	}
	d, ok := Recovery(done, at(10), at(12), at(20))
	// Within the 1s window's resolution (80% of the level is reached
	// 0.2s early).
	if !ok || d < 1200*time.Millisecond || d > 1600*time.Millisecond {
		t.Fatalf("recovery %v %v, want 1.5s", d, ok)
	}
	if _, ok := Recovery(done, at(13.6), at(14), at(14.5)); ok {
		t.Fatal("recovered with no pre-fault level")
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r, err := newRecorder(filepath.Join(dir, "w1.0.jsonl"), "w1.0")
	if err != nil {
		t.Fatal(err)
	}
	r.write(line{T: lineHello, Role: "worker"})
	r.write(line{T: lineStart, Job: 7, Att: 1, Kind: KindWork, At: at(1).UnixNano()})
	r.write(line{T: lineEnd, Job: 7, Att: 1, Out: OutcomeOK, At: at(2).UnixNano()})
	r.write(line{T: lineStart, Job: 8, Att: 2, Kind: KindWork, At: at(3).UnixNano()})
	r.write(line{T: lineEnq, Job: 9, Tok: "x:1", Kind: KindWork})
	r.write(line{T: lineCounters, C: map[string]int64{"stale_acks_refused": 4}})
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	rs, err := readRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.execs) != 2 || rs.execs[0].Outcome != OutcomeOK || !rs.execs[0].End.Equal(at(2)) || !rs.execs[1].End.IsZero() {
		t.Fatalf("execs %+v", rs.execs)
	}
	if rs.acked[9] != "x:1" || rs.sumCounter("stale_acks_refused") != 4 || rs.pids["w1.0"] == 0 {
		t.Fatalf("records %+v", rs)
	}
}
