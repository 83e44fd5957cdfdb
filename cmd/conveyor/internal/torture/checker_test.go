package torture

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/lab"
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
	w.job(42, "completed", 2, expired(1), AttemptErr{Attempt: 1, Error: "handler failed"})
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
	j := w.job(70, "discarded", 3, AttemptErr{Attempt: 1, Error: "job panicked"}, AttemptErr{Attempt: 2, Error: "job panicked"}, AttemptErr{Attempt: 3, Error: "job panicked"})
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

// A paused process whose attempt nobody rescued during the pause cuts
// the handler off when it wakes: explained by the pause. The same error
// on a process that was never paused is not.
func TestCheckerLeaseDeadlineAfterPause(t *testing.T) {
	const cutOff = lab.LeaseDeadlineMessage
	w := newWorld()
	w.job(80, "completed", 2, AttemptErr{Attempt: 1, Error: cutOff})
	w.exec(80, 1, 300, 1, 6.6, OutcomeError)
	w.event(EventPause, 300, 1.2, 6.5)
	w.exec(80, 2, 200, 7, 7.1, OutcomeOK)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	if f.DuplicateCauses["cut off after its lease: paused"] != 1 {
		t.Fatalf("causes %v", f.DuplicateCauses)
	}

	w = newWorld()
	w.job(81, "completed", 2, AttemptErr{Attempt: 1, Error: cutOff})
	w.exec(81, 1, 300, 1, 3, OutcomeError)
	w.exec(81, 2, 200, 4, 4.1, OutcomeOK)
	assertFailure(t, Check(w.in), "1 unexplained duplicate executions")
}

// TestCheckerLeaseDeadlineAfterSlowRenewal: an attempt its engine cut off
// with no fault is explained only by a renewal of its own process that was
// out at the cut-off (the engine reported it as slow); a slow renewal of
// another process, or one back before the cut-off, explains nothing.
func TestCheckerLeaseDeadlineAfterSlowRenewal(t *testing.T) {
	const cutOff = lab.LeaseDeadlineMessage
	planted := func(renewals map[int][]Renewal) *Findings {
		w := newWorld()
		w.job(82, "completed", 2, AttemptErr{Attempt: 1, Error: cutOff})
		w.exec(82, 1, 300, 1, 3, OutcomeError)
		w.exec(82, 2, 300, 3.3, 3.4, OutcomeOK)
		w.in.SlowRenewals = renewals
		return Check(w.in)
	}
	f := planted(map[int][]Renewal{300: {{Sent: at(1.6), Done: at(3.2)}}})
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	if f.DuplicateCauses[slowRenewalCause] != 1 {
		t.Fatalf("causes %v", f.DuplicateCauses)
	}
	assertFailure(t, planted(nil), "1 unexplained duplicate executions")
	assertFailure(t, planted(map[int][]Renewal{200: {{Sent: at(1.6), Done: at(3.2)}}}), "1 unexplained duplicate executions")
	assertFailure(t, planted(map[int][]Renewal{300: {{Sent: at(1.6), Done: at(2.9)}}}), "1 unexplained duplicate executions")
}

// TestCheckerLeaseDeadlineHandlerReturnsLate: the cut-off is when the
// handler's context ended, which its end record carries; the handler may
// return after the renewal came back (a statement under way finishing
// first). Such an attempt is explained by the renewal out at the cut-off;
// one whose context ended after the renewal came back is not.
func TestCheckerLeaseDeadlineHandlerReturnsLate(t *testing.T) {
	const cutOff = lab.LeaseDeadlineMessage
	planted := func(cancelled float64) *Findings {
		w := newWorld()
		w.job(85, "completed", 2, AttemptErr{Attempt: 1, Error: cutOff})
		w.exec(85, 1, 300, 1, 3, OutcomeError)
		w.in.Execs[len(w.in.Execs)-1].Cancelled = at(cancelled)
		w.exec(85, 2, 300, 3.3, 3.4, OutcomeOK)
		w.in.SlowRenewals = map[int][]Renewal{300: {{Sent: at(1.6), Done: at(2.9)}}}
		return Check(w.in)
	}
	f := planted(2.8)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	if f.DuplicateCauses[slowRenewalCause] != 1 {
		t.Fatalf("causes %v", f.DuplicateCauses)
	}
	assertFailure(t, planted(2.95), "1 unexplained duplicate executions")
	assertFailure(t, planted(1.5), "1 unexplained duplicate executions")
}

// TestCheckerLeaseDeadlineInHandlerError: a handler cut off in a call of
// its own that honours the context (a database read) returns that call's
// error, and the engine appends the cut-off's cause in parentheses. Such
// an attempt is explained as a cut-off by the same evidence as one whose
// handler returned the cause: its own process's renewal out at the
// cut-off, or a pause past the lease. An error that only mentions the
// cause elsewhere, or ends with another cause, explains nothing.
func TestCheckerLeaseDeadlineInHandlerError(t *testing.T) {
	wrapped := "conveyor/postgres: paused queues: context canceled (" + lab.LeaseDeadlineMessage + ")"
	slow := map[int][]Renewal{300: {{Sent: at(1.6), Done: at(3.2)}}}
	planted := func(msg string, renewals map[int][]Renewal) *Findings {
		w := newWorld()
		w.job(83, "completed", 2, AttemptErr{Attempt: 1, Error: msg})
		w.exec(83, 1, 300, 1, 3, OutcomeError)
		w.exec(83, 2, 200, 3.3, 3.4, OutcomeOK)
		w.in.SlowRenewals = renewals
		return Check(w.in)
	}
	f := planted(wrapped, slow)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	if f.DuplicateCauses[slowRenewalCause] != 1 {
		t.Fatalf("causes %v", f.DuplicateCauses)
	}
	assertFailure(t, planted(wrapped, nil), "1 unexplained duplicate executions")
	assertFailure(t, planted(wrapped, map[int][]Renewal{300: {{Sent: at(1.6), Done: at(2.9)}}}), "1 unexplained duplicate executions")
	assertFailure(t, planted("read failed: context canceled ("+lab.LeaseDeadlineMessage+") and then: boom", slow), "1 unexplained duplicate executions")
	assertFailure(t, planted("read failed: context canceled (conveyor: client shutting down)", slow), "1 unexplained duplicate executions")

	w := newWorld()
	w.job(84, "completed", 2, AttemptErr{Attempt: 1, Error: wrapped})
	w.exec(84, 1, 300, 1, 6.6, OutcomeError)
	w.event(EventPause, 300, 1.2, 6.5)
	w.exec(84, 2, 200, 7, 7.1, OutcomeOK)
	f = Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("paused: failures: %v", fl)
	}
	if f.DuplicateCauses["cut off after its lease: paused"] != 1 {
		t.Fatalf("paused: causes %v", f.DuplicateCauses)
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
	r.write(line{T: lineStart, Job: 7, Att: 1, Kind: KindWork, At: at(1).UnixNano(), Cl: at(0.9).UnixNano()})
	r.write(line{T: lineEnd, Job: 7, Att: 1, Out: OutcomeOK, At: at(2).UnixNano()})
	r.write(line{T: lineStart, Job: 8, Att: 2, Kind: KindWork, At: at(3).UnixNano()})
	r.write(line{T: lineEnq, Job: 9, Tok: "x:1", Kind: KindWork})
	r.write(line{T: lineCounters, C: map[string]int64{"stale_acks_refused": 4}})
	// A duplicate told the holder's id: not an acknowledgement of job 9.
	r.write(line{T: lineEnq, Job: 9, Tok: "x:2", Kind: KindWork, U: "work/L1", Dup: true, B: at(0.5).UnixNano()})
	r.write(line{T: lineRollback, Tok: "x:3", U: "work/L1", Dup: true})
	r.write(line{T: lineReady, At: at(0.1).UnixNano()})
	r.write(line{T: lineStart, Job: 10, Att: 1, Kind: KindTick, Sch: at(0.2).UnixNano()})
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	rs, err := readRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.execs) != 3 || rs.execs[0].Outcome != OutcomeOK || !rs.execs[0].End.Equal(at(2)) || !rs.execs[1].End.IsZero() {
		t.Fatalf("execs %+v", rs.execs)
	}
	if rs.acked[9] != "x:1" || rs.sumCounter("stale_acks_refused") != 4 || rs.pids["w1.0"] == 0 {
		t.Fatalf("records %+v", rs)
	}
	if len(rs.told) != 1 || rs.told[0].ID != 9 || !rs.told[0].Dup || !rs.told[0].Begin.Equal(at(0.5)) || rs.toldRolledBack != 1 || rs.dupRolledBack != 1 {
		t.Fatalf("told %+v, rolled back %d/%d", rs.told, rs.toldRolledBack, rs.dupRolledBack)
	}
	if !rs.execs[0].Claimed.Equal(at(0.9)) || !rs.execs[1].Claimed.IsZero() {
		t.Fatalf("claimed %v and %v, want %v and none", rs.execs[0].Claimed, rs.execs[1].Claimed, at(0.9))
	}
	if !rs.ready["w1.0"].Equal(at(0.1)) || !rs.execs[2].Scheduled.Equal(at(0.2)) {
		t.Fatalf("ready %v, execs %+v", rs.ready, rs.execs)
	}
}

// unique makes job id a unique job of key u (a live key "L..." or a kept
// key "K..." of window w) and records that its enqueue, begun at begin,
// was acknowledged at ack as a new job.
func (w *world) unique(id int64, u string, win int64, begin, ack float64) *FinalJob {
	j := w.in.Jobs[id]
	j.Queue, j.U, j.W = Queue, u, win
	w.told(j.Token, j.uniqueKey(), id, false, begin, ack)
	return j
}

// told records that an enqueue of key was told id (and dup).
func (w *world) told(tok, key string, id int64, dup bool, begin, ack float64) {
	w.in.Told = append(w.in.Told, Told{Tok: tok, Key: key, ID: id, Dup: dup, Proc: "p1.0", Begin: at(begin), At: at(ack)})
}

func TestCheckerUniqueCleanRun(t *testing.T) {
	w := newWorld()
	// Live key L1: job 100, then, once it finished, job 101; a duplicate
	// told job 100 while it ran.
	w.job(100, "completed", 1)
	w.exec(100, 1, 100, 1, 1.1, OutcomeOK)
	a := w.unique(100, "L1", 0, 0.9, 0.95)
	w.job(101, "completed", 1)
	w.exec(101, 1, 100, 2, 2.1, OutcomeOK)
	w.unique(101, "L1", 0, 1.8, 1.9)
	w.told("p2.0:1", a.uniqueKey(), 100, true, 1.02, 1.05)
	// Kept key K1 of window 5: one job, and two callers told it, one of
	// them after it completed.
	w.job(102, "completed", 1)
	w.exec(102, 1, 200, 3, 3.1, OutcomeOK)
	k := w.unique(102, "K1", 5, 2.9, 2.95)
	w.told("p2.0:2", k.uniqueKey(), 102, true, 2.92, 2.99)
	w.told("p2.0:3", k.uniqueKey(), 102, true, 4, 4.01)
	w.in.AppliedAt = map[int64]time.Time{102: at(3.5)}
	// The same kept key in the next window is another key.
	w.job(103, "completed", 1)
	w.exec(103, 1, 200, 3.2, 3.3, OutcomeOK)
	w.unique(103, "K1", 6, 3.1, 3.15)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures in a clean run: %v", fl)
	}
	if f.UniqueTold != 7 || f.DupTold != 3 {
		t.Fatalf("unique told %d, duplicates told %d", f.UniqueTold, f.DupTold)
	}
}

func TestCheckerReportsPlantedDuplicateUniqueJob(t *testing.T) {
	w := newWorld()
	// Live key L2: job 110 ran from 1s to 1.5s, and job 111 of the same
	// key was inserted (its caller told "not a duplicate") and ran from
	// 1.2s: two holders of one key at once.
	w.job(110, "completed", 1)
	w.exec(110, 1, 100, 1, 1.5, OutcomeOK)
	w.unique(110, "L2", 0, 0.8, 0.9)
	w.job(111, "completed", 1)
	w.exec(111, 1, 200, 1.2, 1.3, OutcomeOK)
	w.unique(111, "L2", 0, 1.1, 1.15)
	// Live key L3: job 113 ran from 3.2s to 3.3s while job 112, whose
	// enqueue was acknowledged at 3s, had not run yet.
	w.job(112, "completed", 1)
	w.exec(112, 1, 100, 3.5, 3.6, OutcomeOK)
	w.unique(112, "L3", 0, 2.9, 3)
	w.job(113, "completed", 1)
	w.exec(113, 1, 200, 3.2, 3.3, OutcomeOK)
	w.unique(113, "L3", 0, 3.05, 3.1)
	// Kept key K0 of window 7: two rows.
	w.job(114, "completed", 1)
	w.exec(114, 1, 100, 5, 5.1, OutcomeOK)
	w.unique(114, "K0", 7, 4.8, 4.9)
	w.job(115, "completed", 1)
	w.exec(115, 1, 200, 6, 6.1, OutcomeOK)
	w.unique(115, "K0", 7, 5.8, 5.9)
	f := Check(w.in)
	if len(f.UniqueLiveTwice) != 2 || !strings.Contains(f.UniqueLiveTwice[0], "job 110") || !strings.Contains(f.UniqueLiveTwice[1], "job 113") {
		t.Fatalf("unique live twice %v", f.UniqueLiveTwice)
	}
	if len(f.UniqueKeptTwice) != 1 || !strings.Contains(f.UniqueKeptTwice[0], "[114 115]") {
		t.Fatalf("unique kept twice %v", f.UniqueKeptTwice)
	}
	assertFailure(t, f, "2 duplicate unique jobs unfinished at once")
	assertFailure(t, f, "1 unique keys held by two kept jobs")
}

func TestCheckerReportsPlantedWrongHolder(t *testing.T) {
	w := newWorld()
	w.job(120, "completed", 1)
	w.exec(120, 1, 100, 1, 1.1, OutcomeOK)
	j := w.unique(120, "L1", 0, 0.5, 0.6)
	w.in.AppliedAt = map[int64]time.Time{120: at(1.4)}
	w.job(121, "completed", 1)
	w.exec(121, 1, 100, 9, 9.1, OutcomeOK)
	late := w.unique(121, "L2", 0, 8, 8.1)
	w.told("p2.0:1", j.uniqueKey(), 999, true, 2, 2.1)          // no such job
	w.told("p2.0:2", "work/L3", 120, true, 0.7, 0.8)            // a job of another key
	w.told("p2.0:3", j.uniqueKey(), 120, true, 2, 2.1)          // seen completed at 1.4s
	w.told("p2.0:4", late.uniqueKey(), 121, true, 7, 7.5)       // its enqueue began at 8s
	w.told("p2.0:5", "work/torture/K1/3", 1, false, 0.01, 0.02) // a new job that is not unique
	f := Check(w.in)
	if len(f.WrongHolder) != 5 {
		t.Fatalf("wrong holders %v", f.WrongHolder)
	}
	for _, want := range []string{"does not exist", `whose key is "work/L1"`, "seen completed", "whose own enqueue began", `whose key is ""`} {
		if !strings.Contains(strings.Join(f.WrongHolder, "\n"), want) {
			t.Errorf("no wrong holder mentions %q: %v", want, f.WrongHolder)
		}
	}
	assertFailure(t, f, "5 enqueues told an id that is not the key's holder")
}

// ticks adds a periodic job per slot index of a 200ms schedule.
func (w *world) ticks(from int64, idx ...float64) {
	for i, s := range idx {
		id := from + int64(i)
		w.in.Jobs[id] = &FinalJob{ID: id, Queue: Queue, Kind: KindTick, State: "completed", Attempt: 1, MaxAttempts: 25, ScheduledAt: at(s * 0.2)}
		w.in.Execs = append(w.in.Execs, Exec{Job: id, Attempt: 1, Kind: KindTick, PID: 100, Proc: "w1.0",
			Start: at(s*0.2 + 0.01), End: at(s*0.2 + 0.02), Outcome: OutcomeOK, Scheduled: at(s * 0.2)})
	}
}

func TestCheckerPeriodicCleanRun(t *testing.T) {
	w := newWorld()
	w.in.Tick = 200 * time.Millisecond
	w.in.Ups = []Up{{Proc: "w1.0", PID: 100, Ready: at(-5)}}
	w.ticks(200, 10, 11, 12, 13, 14, 15)
	// Slot 16's job failed once and was retried later: the row's
	// ScheduledAt moved, its first execution saw the slot.
	w.ticks(206, 16)
	w.in.Jobs[206].ScheduledAt = at(5.123)
	// Slots 17 to 19 passed while the only worker process was dead,
	// and the schedule skipped them.
	w.in.Ups = append(w.in.Ups, Up{Proc: "w1.1", PID: 101, Ready: at(4.5)})
	w.in.Ups[0].End = at(3.3)
	w.ticks(207, 20, 21, 22, 23, 24)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures in a clean run: %v", fl)
	}
	if f.Slots != 15 || f.SlotsSkippedDown != 3 {
		t.Fatalf("slots %d, skipped while down %d", f.Slots, f.SlotsSkippedDown)
	}
}

func TestCheckerReportsPlantedDoubleFiredSlot(t *testing.T) {
	w := newWorld()
	w.in.Tick = 200 * time.Millisecond
	w.in.Ups = []Up{{Proc: "w1.0", PID: 100, Ready: at(-5)}, {Proc: "w2.0", PID: 200, Ready: at(-5), End: at(2.1)}}
	// Slot 13 fired twice (a process restarted or resumed enqueued it
	// again); slot 15 has no job although w1.0 ran the schedule all
	// along; job 230 is due between two slots.
	w.ticks(220, 10, 11, 12, 13, 13, 14, 16, 17)
	w.ticks(230, 18.5)
	// A periodic job left unfinished.
	w.in.Jobs[227].State = "retryable"
	f := Check(w.in)
	if len(f.SlotsTwice) != 1 || !strings.Contains(f.SlotsTwice[0], "[223 224]") {
		t.Fatalf("slots twice %v", f.SlotsTwice)
	}
	if len(f.SlotsMissed) != 1 || !strings.Contains(f.SlotsMissed[0], "12:00:03.000") || !strings.Contains(f.SlotsMissed[0], "w1.0") {
		t.Fatalf("slots missed %v", f.SlotsMissed)
	}
	assertFailure(t, f, "1 periodic slots fired twice")
	assertFailure(t, f, "1 periodic slots missed while a worker process ran the schedule")
	assertFailure(t, f, "1 periodic jobs not due on a slot")
	assertFailure(t, f, "1 periodic jobs not completed")
	// A slot missed while a database fault was on is still required of a
	// process that outlived the fault; of one that died during it, not.
	w = newWorld()
	w.in.Tick = 200 * time.Millisecond
	w.in.Ups = []Up{{Proc: "w1.0", PID: 100, Ready: at(-5), End: at(6)}}
	w.ticks(240, 10, 11, 13)
	w.event(EventDBRestart, 0, 2.3, 5)
	if f := Check(w.in); f.SlotsSkippedDown != 1 || len(f.SlotsMissed) != 0 {
		t.Fatalf("slot missed during a fault its process died in: missed %v, skipped %d", f.SlotsMissed, f.SlotsSkippedDown)
	}
	w.in.Ups[0].End = at(9)
	if f := Check(w.in); len(f.SlotsMissed) != 1 {
		t.Fatalf("slot missed by a process that outlived the fault: missed %v", f.SlotsMissed)
	}
}

// A process stopped after it claimed an attempt and before the handler
// recorded its start: the attempt was rescued and the job completed by
// another process meanwhile, and the handler records its start when the
// process wakes, after the next attempt's. The attempt was open from its
// claim, before the next one: explained by the pause, not taken for a
// rerun of the completed attempt.
func TestCheckerAttemptStartedAfterItsSuccessor(t *testing.T) {
	w := newWorld()
	w.job(82, "completed", 2, expired(1))
	w.exec(82, 2, 200, 4, 4.2, OutcomeOK)
	w.event(EventPause, 300, 1.2, 6.5)
	w.exec(82, 1, 300, 6.51, 6.6, OutcomeOK)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	if f.DuplicateCauses["lease expired: paused"] != 1 || f.OverlapsExplained != 1 {
		t.Fatalf("causes %v, explained overlaps %d", f.DuplicateCauses, f.OverlapsExplained)
	}

	// The same records without the pause: a premature rescue.
	w = newWorld()
	w.job(83, "completed", 2, expired(1))
	w.exec(83, 2, 200, 4, 4.2, OutcomeOK)
	w.exec(83, 1, 300, 6.51, 6.6, OutcomeOK)
	assertFailure(t, Check(w.in), "premature rescue")
}

// On PostgreSQL a claim commits asynchronously: a database restart may
// lose it, and the same attempt then runs again (overlapping the first
// until its lease renewal is refused). That is explained only near a
// restart and only when claims are asynchronous.
func TestCheckerClaimLostInRestart(t *testing.T) {
	w := newWorld()
	w.event(EventDBRestart, 0, 5, 11)
	// Job 60: attempt 1 opened 0.2s before the restart began; the restart
	// lost its claim and attempt 1 ran again after it, overlapping.
	w.job(60, "completed", 1)
	w.exec(60, 1, 100, 4.8, 12, OutcomeOK)
	w.exec(60, 1, 200, 11.5, 11.6, OutcomeOK)
	// Job 61: attempt 1 opened long before the restart: no claim of it
	// could be lost, its re-run is unexplained.
	w.job(61, "completed", 1)
	w.exec(61, 1, 100, 1, 2, OutcomeOK)
	w.exec(61, 1, 200, 11.5, 11.6, OutcomeOK)
	w.in.AsyncClaims = true
	f := Check(w.in)
	if len(f.Unexplained) != 1 || !strings.Contains(f.Unexplained[0], "job 61") {
		t.Fatalf("unexplained %v, want only job 61's re-run", f.Unexplained)
	}
	if f.DuplicateCauses[claimLostCause] != 1 || len(f.Overlaps) != 0 {
		t.Fatalf("causes %v overlaps %v; want job 60 explained by the lost claim, no overlap", f.DuplicateCauses, f.Overlaps)
	}
	// The same records with synchronous claims: both re-runs unexplained,
	// job 60's overlap too.
	w.in.AsyncClaims = false
	f = Check(w.in)
	if len(f.Unexplained) != 2 || len(f.Overlaps) != 1 || !strings.Contains(f.Overlaps[0], "job 60") {
		t.Fatalf("with synchronous claims: unexplained %v overlaps %v", f.Unexplained, f.Overlaps)
	}
	assertFailure(t, f, "attempt run twice without a shutdown")
}

// An attempt whose handler returned but whose outcome its process had
// not written when it was killed, more than a lease later (a write that
// waited on a loaded machine): rescued after the kill, it is explained
// by the kill; rescued while the process lived, it is premature. The
// rescue's time is by the database's clock, read through DBOffset.
func TestCheckerRescueAfterDeathOfAFinishedHandler(t *testing.T) {
	for _, c := range []struct {
		name      string
		offset    float64 // the database's clock minus the run's, s
		rescuedAt float64 // by the database's clock, s
		explained bool
	}{
		{"rescued after the kill", 0, 6, true},
		{"rescued while the process lived", 0, 4, false},
		{"database clock ahead, after the kill", 300, 306, true},
		{"database clock ahead, while it lived", 300, 304, false},
		{"database clock behind, after the kill", -300, -294, true},
		{"database clock behind, while it lived", -300, -296, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld()
			w.in.DBOffset = time.Duration(c.offset * float64(time.Second))
			w.job(90, "completed", 2, AttemptErr{Attempt: 1, Error: "lease expired: host/100/ab stopped heartbeating", At: at(c.rescuedAt)})
			w.exec(90, 1, 100, 1, 1.1, OutcomeOK) // returned; the lease would end by 3.1 unrenewed
			w.event(EventKill, 100, 5, 5)
			w.exec(90, 2, 200, 7, 7.1, OutcomeOK)
			f := Check(w.in)
			if c.explained {
				if fl := f.Failures(); len(fl) > 0 {
					t.Fatalf("failures: %v", fl)
				}
				if f.DuplicateCauses[diedBeforeRescueCause+EventKill] != 1 {
					t.Fatalf("causes %v", f.DuplicateCauses)
				}
				return
			}
			assertFailure(t, f, "premature rescue")
		})
	}
}

// TestCheckerLeaseDeadlineAfterLateClaim: an attempt cut off at the
// deadline of a claim its engine recorded as late, which came back with
// less than two heartbeat intervals (0.8s of a 2s lease) before that
// deadline, is explained; without that record (a prompt claim), with the
// record of another process or attempt, with a claim that left time for
// a renewal, cut off before the claim's deadline, or after the deadline
// a renewal sent once the claim was back could give, it is not.
func TestCheckerLeaseDeadlineAfterLateClaim(t *testing.T) {
	const cutOff = lab.LeaseDeadlineMessage
	// The attempt starts at 2.5 and is cut off at 2.6 (cancelled, when
	// given, or its end).
	planted := func(cancelled float64, claims map[int][]LateClaim) *Findings {
		w := newWorld()
		w.job(86, "completed", 2, AttemptErr{Attempt: 1, Error: cutOff})
		end := 2.6
		if cancelled > 0 {
			end = 2.75
		}
		w.exec(86, 1, 300, 2.5, end, OutcomeError)
		if cancelled > 0 {
			w.in.Execs[len(w.in.Execs)-1].Cancelled = at(cancelled)
		}
		w.exec(86, 2, 300, 3, 3.1, OutcomeOK)
		w.in.LateClaims = claims
		return Check(w.in)
	}
	// claim is a late claim of job 86's attempt att, sent and back at the
	// given times, with the engine's deadline (sent + 1.6s).
	claim := func(pid int, id int64, att int, sent, back float64) map[int][]LateClaim {
		return map[int][]LateClaim{pid: {{Sent: at(sent), Back: at(back), Deadline: at(sent + 1.6),
			Jobs: []JobAttempt{{ID: 85, Attempt: 1}, {ID: id, Attempt: att}}}}}
	}
	// A claim of the same attempt after this execution's start (a later
	// one) does not hide the claim that handed it over.
	later := claim(300, 86, 1, 1, 2.45)
	later[300] = append(later[300], LateClaim{Sent: at(2.0), Back: at(2.9), Deadline: at(3.6), Jobs: []JobAttempt{{ID: 86, Attempt: 1}}})
	for _, claims := range []map[int][]LateClaim{claim(300, 86, 1, 1, 2.45), later} {
		f := planted(0, claims)
		if fl := f.Failures(); len(fl) > 0 {
			t.Fatalf("failures: %v", fl)
		}
		if f.DuplicateCauses[lateClaimCause] != 1 {
			t.Fatalf("causes %v", f.DuplicateCauses)
		}
	}
	for _, cancelled := range []float64{0, 2.6} {
		f := planted(cancelled, claim(300, 86, 1, 1, 2.45))
		if fl := f.Failures(); len(fl) > 0 {
			t.Fatalf("failures: %v", fl)
		}
		if f.DuplicateCauses[lateClaimCause] != 1 {
			t.Fatalf("causes %v", f.DuplicateCauses)
		}
	}
	for what, claims := range map[string]map[int][]LateClaim{
		"no late claim (a prompt one)":                 nil,
		"another process's late claim":                 claim(200, 86, 1, 1, 2.45),
		"a late claim of another attempt":              claim(300, 86, 2, 1, 2.45),
		"a late claim of another job":                  claim(300, 87, 1, 1, 2.45),
		"a claim back 1.1s before its deadline":        claim(300, 86, 1, 1, 1.5),
		"a cut-off 0.2s before the claim's deadline":   claim(300, 86, 1, 1.2, 2.45),
		"a cut-off past a renewal's possible deadline": claim(300, 86, 1, 0, 0.9),
		// The same attempt number claimed late again (a snooze or a
		// release keeps it) before this start, in time for a renewal:
		// the earlier record is not this execution's claim.
		"a later claim of the same attempt in time": {300: {
			{Sent: at(1), Back: at(2.45), Deadline: at(2.6), Jobs: []JobAttempt{{ID: 86, Attempt: 1}}},
			{Sent: at(2.2), Back: at(2.46), Deadline: at(3.8), Jobs: []JobAttempt{{ID: 86, Attempt: 1}}}}},
		"a late claim back after the start": claim(300, 86, 1, 1, 2.51),
	} {
		t.Run(what, func(t *testing.T) {
			assertFailure(t, planted(0, claims), "1 unexplained duplicate executions")
		})
	}
}
