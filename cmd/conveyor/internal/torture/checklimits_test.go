package torture

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// limitedWorld is a world with QueueLimited at MaxRunning 3 and runs on
// it that respect the limit: three at once at most, counting a killed
// process's open execution until its death and a paused process's
// rescued one until its pause began.
func limitedWorld() *world {
	w := newWorld()
	w.in.Limits = map[string]conveyor.QueueLimits{QueueLimited: {MaxRunning: 3}}
	on := func(j *FinalJob) { j.Queue = QueueLimited }
	// Job 20: its process was killed at 1.5, mid-job; its attempt was
	// rescued and ran again later.
	on(w.job(20, "completed", 2, expired(1)))
	w.exec(20, 1, 100, 1.0, 0, "")
	w.event(EventKill, 100, 1.5, 1.5)
	w.exec(20, 2, 200, 4.0, 4.2, OutcomeOK)
	// Jobs 21 and 22 run from 1.0 and 1.1 to 3.0; job 23 starts after
	// the kill, while 21 and 22 run: three at once, not four.
	on(w.job(21, "completed", 1))
	w.exec(21, 1, 200, 1.0, 3.0, OutcomeOK)
	on(w.job(22, "completed", 1))
	w.exec(22, 1, 300, 1.1, 3.0, OutcomeOK)
	on(w.job(23, "completed", 1))
	w.exec(23, 1, 300, 1.6, 2.5, OutcomeOK)
	// Job 24 starts the instant 21 and 22 end.
	on(w.job(24, "completed", 1))
	w.exec(24, 1, 200, 3.0, 3.5, OutcomeOK)
	// Job 25: its process was stopped past its lease at 5.2; its attempt
	// was rescued, and ran again at 7.5 beside jobs 26 and 27 while the
	// stopped handler had not returned (it did at 9.0, refused).
	on(w.job(25, "completed", 2, expired(1)))
	w.exec(25, 1, 400, 5.0, 9.0, OutcomeOK)
	w.event(EventPause, 400, 5.2, 8.5)
	w.exec(25, 2, 200, 7.5, 7.7, OutcomeOK)
	on(w.job(26, "completed", 1))
	w.exec(26, 1, 300, 7.0, 8.0, OutcomeOK)
	on(w.job(27, "completed", 1))
	w.exec(27, 1, 300, 7.0, 8.0, OutcomeOK)
	return w
}

func TestCheckerLimitRespected(t *testing.T) {
	w := limitedWorld()
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures with the limit respected: %v", fl)
	}
	if f.LimitPeak[QueueLimited] != 3 {
		t.Fatalf("peak %d, want 3", f.LimitPeak[QueueLimited])
	}
	// The same records on an unlimited queue are not checked.
	w.in.Limits = nil
	if f := Check(w.in); len(f.Failures()) > 0 || len(f.LimitPeak) != 0 {
		t.Fatalf("no limits: failures %v peaks %v", f.Failures(), f.LimitPeak)
	}
}

func TestCheckerReportsPlantedOverLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		plant func(w *world)
		want  string
	}{{
		// A fourth job beside 21, 22 and 23.
		name: "fourth",
		plant: func(w *world) {
			w.job(28, "completed", 1).Queue = QueueLimited
			w.exec(28, 1, 300, 2.0, 2.2, OutcomeOK)
		},
		want: "job 28 attempt 1",
	}, {
		// The killed process's open execution holds its slot until
		// its death: a start at 1.2 beside 21 and 22 is a fourth.
		name: "beside a killed process's open execution",
		plant: func(w *world) {
			w.job(28, "completed", 1).Queue = QueueLimited
			w.exec(28, 1, 300, 1.2, 1.4, OutcomeOK)
		},
		want: "job 20 attempt 1 on w0 [12:00:01.000, 12:00:01.500)",
	}, {
		// A process stopped for less than its lease keeps its slot:
		// jobs 29 to 31 start beside its job 32.
		name: "beside a short pause",
		plant: func(w *world) {
			w.job(32, "completed", 1).Queue = QueueLimited
			w.exec(32, 1, 500, 10, 12, OutcomeOK)
			w.event(EventPause, 500, 10.5, 11)
			for id := int64(29); id <= 31; id++ {
				w.job(id, "completed", 1).Queue = QueueLimited
				w.exec(id, 1, 300, 11, 11.5, OutcomeOK)
			}
		},
		want: "job 32 attempt 1",
	}, {
		// A process that died without a kill or a rescue: its
		// execution counts until its death.
		name: "beside a dead process's execution",
		plant: func(w *world) {
			w.job(33, "completed", 2, AttemptErr{Attempt: 1, Error: "boom"})
			w.in.Jobs[33].Queue = QueueLimited
			w.exec(33, 1, 600, 13, 0, "")
			w.in.Deaths[600] = at(14)
			w.exec(33, 2, 200, 15, 15.1, OutcomeOK)
			for id := int64(34); id <= 36; id++ {
				w.job(id, "completed", 1).Queue = QueueLimited
				w.exec(id, 1, 300, 13.5, 13.8, OutcomeOK)
			}
		},
		want: "job 33 attempt 1",
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := limitedWorld()
			c.plant(w)
			f := Check(w.in)
			if len(f.OverLimit) != 1 || !strings.Contains(f.OverLimit[0], c.want) || !strings.Contains(f.OverLimit[0], "4 running") {
				t.Fatalf("over the limit: %q, want one naming %q", f.OverLimit, c.want)
			}
			assertFailure(t, f, "instants over a queue's MaxRunning")
			if f.LimitPeak[QueueLimited] != 4 {
				t.Fatalf("peak %d, want 4", f.LimitPeak[QueueLimited])
			}
		})
	}
}

// A claim lost in a database restart held no slot the database kept: its
// execution does not count against the limit; with synchronous claims it
// does.
func TestCheckerLimitClaimLost(t *testing.T) {
	w := limitedWorld()
	w.event(EventDBRestart, 0, 20, 21)
	w.job(40, "completed", 1).Queue = QueueLimited
	w.exec(40, 1, 100, 19.8, 23, OutcomeOK)
	w.exec(40, 1, 200, 22.5, 22.6, OutcomeOK)
	for id := int64(41); id <= 43; id++ {
		w.job(id, "completed", 1).Queue = QueueLimited
		w.exec(id, 1, 300, 21.2, 22, OutcomeOK)
	}
	w.in.AsyncClaims = true
	if f := Check(w.in); len(f.OverLimit) != 0 {
		t.Fatalf("over the limit with a lost claim: %v", f.OverLimit)
	}
	w.in.AsyncClaims = false
	if f := Check(w.in); len(f.OverLimit) != 1 || !strings.Contains(f.OverLimit[0], "job 40 attempt 1 on w0") {
		t.Fatalf("synchronous claims: over the limit %v, want one with job 40", f.OverLimit)
	}
}

// rateWorld has QueueRated at 5 per second and n executions on it claimed
// every step seconds from 1.0, each started 0.05s after its claim.
func rateWorld(n int, step float64) *world {
	w := newWorld()
	w.in.Limits = map[string]conveyor.QueueLimits{QueueRated: {Rate: 5, RatePeriod: time.Second}}
	for i := 0; i < n; i++ {
		id := int64(50 + i)
		w.job(id, "completed", 1).Queue = QueueRated
		c := 1 + step*float64(i)
		w.exec(id, 1, 200, c+0.05, c+0.1, OutcomeOK)
		w.in.Execs[len(w.in.Execs)-1].Claimed = at(c)
	}
	return w
}

func TestCheckerRate(t *testing.T) {
	// Five a second, then Rate + 1 (the slack) within one second: fine.
	w := rateWorld(12, 0.2)
	w.job(70, "completed", 1).Queue = QueueRated
	w.exec(70, 1, 300, 1.5, 1.6, OutcomeOK)
	w.in.Execs[len(w.in.Execs)-1].Claimed = at(1.45)
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures within the rate: %v", fl)
	}
	if f.RatePeak[QueueRated] != 6 {
		t.Fatalf("rate peak %d, want 6", f.RatePeak[QueueRated])
	}
	// Two more in that second: Rate + 2.
	w.job(71, "completed", 1).Queue = QueueRated
	w.exec(71, 1, 300, 1.7, 1.8, OutcomeOK)
	w.in.Execs[len(w.in.Execs)-1].Claimed = at(1.65)
	f = Check(w.in)
	if len(f.OverRate) != 1 || !strings.Contains(f.OverRate[0], "7 claims within 1s from 12:00:01.000") {
		t.Fatalf("over the rate: %q", f.OverRate)
	}
	assertFailure(t, f, "windows over a queue's Rate")
}

// The rate is checked on the claims (the database's clock), not on the
// handlers' starts: claims a period apart whose handlers started
// together (a process stopped between claim and start) are within it;
// claims crowded into one window are not, whenever their handlers
// started.
func TestCheckerRateByClaims(t *testing.T) {
	w := rateWorld(10, 0.2)
	for i := range w.in.Execs {
		if w.in.Execs[i].Job >= 50 {
			w.in.Execs[i].Start = at(3.0 + 0.001*float64(i))
			w.in.Execs[i].End = at(3.1)
		}
	}
	if f := Check(w.in); len(f.OverRate) != 0 {
		t.Fatalf("over the rate by starts only: %v", f.OverRate)
	}
	w = rateWorld(10, 0.05)
	for i := range w.in.Execs {
		if w.in.Execs[i].Job >= 50 {
			w.in.Execs[i].Start = at(1 + 0.3*float64(i))
			w.in.Execs[i].End = w.in.Execs[i].Start.Add(time.Millisecond)
		}
	}
	if f := Check(w.in); len(f.OverRate) != 1 || !strings.Contains(f.OverRate[0], "10 claims") {
		t.Fatalf("claims crowded, starts spread: over the rate %v", f.OverRate)
	}
}

// orderedWorld is a world with QueueOrdered ordered and four keys whose
// jobs ran one at a time in enqueue order: key a's jobs 30 (its process
// killed mid-job, then run again), 31 and 33; key b's 32 and 34, beside
// key a's; key e's flaky job 60, which failed its first attempt and held
// the key for its retry while 61 and 62 waited; key f's job 70, whose
// process was stopped past its lease mid-job and whose attempt was
// rescued and run again elsewhere, and 71 and 72 after it, while the
// stopped handler had not returned (a zombie: its acknowledgement was
// refused).
func orderedWorld() *world {
	w := newWorld()
	w.in.Limits = map[string]conveyor.QueueLimits{QueueOrdered: {Ordered: true}}
	w.in.AckedAt = map[int64]time.Time{}
	on := func(j *FinalJob, key string) { j.Queue, j.Key = QueueOrdered, key }
	on(w.job(30, "completed", 2, expired(1)), "a")
	w.exec(30, 1, 500, 1.0, 0, "")
	w.event(EventKill, 500, 1.2, 1.2)
	w.exec(30, 2, 200, 1.5, 1.7, OutcomeOK)
	on(w.job(31, "completed", 1), "a")
	w.exec(31, 1, 100, 1.7, 1.9, OutcomeOK)
	on(w.job(32, "completed", 1), "b")
	w.exec(32, 1, 300, 1.1, 1.8, OutcomeOK)
	on(w.job(33, "completed", 1), "a")
	w.exec(33, 1, 200, 2.0, 2.1, OutcomeOK)
	on(w.job(34, "completed", 1), "b")
	w.exec(34, 1, 300, 1.8, 2.5, OutcomeOK)

	j := w.job(60, "completed", 2, AttemptErr{Attempt: 1, Error: flakyErr})
	j.Kind = KindFlaky
	on(j, "e")
	w.in.AckedAt[60] = at(2.95)
	w.exec(60, 1, 100, 3.0, 3.2, OutcomeError)
	w.exec(60, 2, 200, 3.4, 3.6, OutcomeOK)
	on(w.job(61, "completed", 1), "e")
	w.in.AckedAt[61] = at(3.05)
	w.exec(61, 1, 300, 3.6, 3.8, OutcomeOK)
	on(w.job(62, "completed", 1), "e")
	w.in.AckedAt[62] = at(3.1)
	w.exec(62, 1, 100, 3.9, 4.0, OutcomeOK)

	on(w.job(70, "completed", 2, expired(1)), "f")
	w.in.AckedAt[70] = at(4.9)
	w.exec(70, 1, 400, 5.0, 9.0, OutcomeOK)
	w.event(EventPause, 400, 5.2, 8.5)
	w.exec(70, 2, 200, 7.5, 7.7, OutcomeOK)
	on(w.job(71, "completed", 1), "f")
	w.in.AckedAt[71] = at(5.1)
	w.exec(71, 1, 300, 7.8, 8.0, OutcomeOK)
	on(w.job(72, "completed", 1), "f")
	w.in.AckedAt[72] = at(5.15)
	w.exec(72, 1, 200, 8.1, 8.2, OutcomeOK)
	return w
}

// execOf returns job id's recorded execution of attempt.
func (w *world) execOf(id int64, attempt int) *Exec {
	for i := range w.in.Execs {
		if e := &w.in.Execs[i]; e.Job == id && e.Attempt == attempt {
			return e
		}
	}
	panic("no such execution")
}

func TestCheckerOrderedKeysRespected(t *testing.T) {
	w := orderedWorld()
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures with ordered keys respected: %v", fl)
	}
	if f.KeyPeak != 1 || f.OrderedKeys != 4 || f.OrderedJobs != 11 {
		t.Fatalf("key peak %d, ordered keys %d, jobs %d; want 1, 4 and 11", f.KeyPeak, f.OrderedKeys, f.OrderedJobs)
	}
	// Two of key e waited while job 60's first attempt ran, and two of
	// key f while job 70's did (until its process was stopped); 61
	// waited for 60's retry.
	if f.OrderedWait != 2 || f.OrderedHeld != 1 {
		t.Fatalf("most waiting %d, failed jobs waited for %d; want 2 and 1", f.OrderedWait, f.OrderedHeld)
	}
	if f.DuplicateCauses[flakyCause] != 1 || f.OverlapsExplained != 1 {
		t.Fatalf("duplicate causes %v, explained overlaps %d", f.DuplicateCauses, f.OverlapsExplained)
	}
	// The same records on a queue without limits are not checked.
	w.in.Limits = nil
	if f := Check(w.in); len(f.Failures()) > 0 || f.OrderedJobs != 0 || f.OrderedWait != 0 {
		t.Fatalf("no limits: failures %v, ordered jobs %d, waiting %d", f.Failures(), f.OrderedJobs, f.OrderedWait)
	}
}

// Job 70's zombie ran until 9.0, beside its own second attempt and jobs
// 71 and 72 of its key: its attempt was rescued while its process was
// stopped past its lease, so it counts only until the stop, and it is not
// what finished job 70. Without the stop nothing explains the rescue,
// and the zombie counts whole.
func TestCheckerOrderedKeyZombieExcused(t *testing.T) {
	w := orderedWorld()
	f := Check(w.in)
	if len(f.OrderedAtOnce) > 0 || len(f.OutOfOrder) > 0 {
		t.Fatalf("zombie reported: at once %v, out of order %v", f.OrderedAtOnce, f.OutOfOrder)
	}
	w.in.Events = slices.DeleteFunc(w.in.Events, func(ev Event) bool { return ev.Kind == EventPause })
	f = Check(w.in)
	if len(f.OrderedAtOnce) == 0 || !strings.Contains(f.OrderedAtOnce[0], "key f: 2 running") {
		t.Fatalf("no stop: at once %q, want key f named", f.OrderedAtOnce)
	}
	// The order held all the same: job 70's second attempt finished it
	// before 71 started.
	if len(f.OutOfOrder) > 0 {
		t.Fatalf("no stop: out of order %v", f.OutOfOrder)
	}
	assertFailure(t, f, "instants with two jobs of an ordered key running at once")
}

// A process stopped between claiming job 40 of key d and starting its
// handler records that start only on waking, after the job's second
// attempt (rescued meanwhile) and job 41 after it ran elsewhere: the
// order held, since job 40 first ran before 41 started.
func TestCheckerOrderedKeyStaleStartAfterPause(t *testing.T) {
	w := orderedWorld()
	on := func(j *FinalJob) { j.Queue, j.Key = QueueOrdered, "d" }
	on(w.job(40, "completed", 2, expired(1)))
	w.event(EventPause, 500, 3.0, 8.0)
	w.exec(40, 1, 500, 8.0, 8.01, "error")
	w.exec(40, 2, 200, 5.6, 5.7, OutcomeOK)
	on(w.job(41, "completed", 1))
	w.exec(41, 1, 300, 5.8, 5.9, OutcomeOK)
	f := Check(w.in)
	if len(f.OutOfOrder) > 0 {
		t.Fatalf("out of order: %v", f.OutOfOrder)
	}
	// The same with job 41 started before job 40 ever ran: reported.
	w.in.Execs[len(w.in.Execs)-1].Start, w.in.Execs[len(w.in.Execs)-1].End = at(5.5), at(5.55)
	if f := Check(w.in); len(f.OutOfOrder) != 1 || !strings.Contains(f.OutOfOrder[0], "job 41 started") {
		t.Fatalf("out of order %v, want job 41 named", f.OutOfOrder)
	}
}

func TestCheckerReportsPlantedKeyFaults(t *testing.T) {
	for _, c := range []struct {
		name  string
		plant func(w *world)
		want  string
	}{{
		// Job 37 of key b runs beside job 34.
		name: "two of a key at once",
		plant: func(w *world) {
			j := w.job(37, "completed", 1)
			j.Queue, j.Key = QueueOrdered, "b"
			w.exec(37, 1, 200, 2.4, 2.6, OutcomeOK)
		},
		want: "key b: 2 running",
	}, {
		// Job 31 of key a started before job 30 first did.
		name: "overtaken",
		plant: func(w *world) {
			w.in.Execs = append(w.in.Execs, Exec{Job: 31, Attempt: 1, Kind: KindWork, PID: 400, Proc: "w4", Start: at(0.5), End: at(0.6), Outcome: OutcomeOK})
		},
		want: "job 31 started",
	}, {
		// Job 35 of key a still waits, though 36 after it ran; a job
		// cancelled before it ran holds nothing.
		name: "skipped",
		plant: func(w *world) {
			for id, st := range map[int64]string{35: "available", 36: "completed", 37: "cancelled", 38: "completed"} {
				j := w.job(id, st, 0)
				j.Queue, j.Key = QueueOrdered, "c"
			}
			w.exec(36, 1, 100, 2.2, 2.3, OutcomeOK)
			w.exec(38, 1, 100, 2.4, 2.5, OutcomeOK)
		},
		want: "while job 35 enqueued before it was unfinished (available after the drain)",
	}, {
		// Job 61 of key e started while job 60, failed, waited for its
		// retry: the failed job holds its key.
		name: "past a failed job",
		plant: func(w *world) {
			e := w.execOf(61, 1)
			e.Start, e.End = at(3.25), at(3.35)
		},
		want: "job 61 started at 12:00:03.250, before job 60 enqueued before it finished (the run that finished it ended at 12:00:03.600)",
	}, {
		// Job 61 of key e started beside job 60's retry: two at once,
		// and out of order.
		name: "beside a retry",
		plant: func(w *world) {
			e := w.execOf(61, 1)
			e.Start, e.End = at(3.5), at(3.55)
		},
		want: "key e: 2 running at 12:00:03.500",
	}, {
		// Job 72 of key f started after job 71 but before it ended.
		name: "before its predecessor ended",
		plant: func(w *world) {
			e := w.execOf(72, 1)
			e.Start, e.End = at(7.9), at(8.3)
		},
		want: "job 72 started at 12:00:07.900, before job 71",
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := orderedWorld()
			c.plant(w)
			fl := strings.Join(Check(w.in).Failures(), "\n")
			if !strings.Contains(fl, c.want) {
				t.Fatalf("failures %q, want one naming %q", fl, c.want)
			}
		})
	}
}
