package torture

import (
	"testing"
	"time"
)

// TestRescueLatencyLeavesOutLimitedQueuesWorst: a killed process's jobs
// start again after their rescue; one of a limited queue may then wait
// for a slot, so its late start does not count as a late rescue, while
// an unlimited queue's does, and either counts for an early one.
func TestRescueLatencyLeavesOutLimitedQueuesWorst(t *testing.T) {
	t0 := time.Unix(1800000000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	in := &Input{
		Events: []Event{{Kind: EventKill, PID: 7, Start: at(0), End: at(0)}},
		Jobs: map[int64]*FinalJob{
			1: {ID: 1, Queue: Queue},
			2: {ID: 2, Queue: QueueLimited},
			3: {ID: 3, Queue: QueueRated},
		},
		Execs: []Exec{
			{Job: 1, Attempt: 1, PID: 7, Start: at(-1)},
			{Job: 2, Attempt: 1, PID: 7, Start: at(-1)},
			{Job: 3, Attempt: 1, PID: 7, Start: at(-1)},
			{Job: 1, Attempt: 2, PID: 8, Start: at(2), End: at(2.1)},
			{Job: 2, Attempt: 2, PID: 8, Start: at(9), End: at(9.1)},
			{Job: 3, Attempt: 2, PID: 8, Start: at(1.5), End: at(1.6)},
		},
	}
	n, best, worst, unrescued := rescueLatency(in, EventKill)
	if n != 3 || unrescued != 0 || best != 1500*time.Millisecond || worst != 2*time.Second {
		t.Fatalf("n %d, best %v, worst %v, unrescued %d; want 3, 1.5s (the rated job), 2s (the unlimited job, not the limited one's 9s), 0", n, best, worst, unrescued)
	}
}

// TestKillRaceWithLastStart: the kill's time is read just before the
// signal is sent, and the victim records one more start before it dies.
// That start is neither the job's restart (rescueLatency would report a
// rescue microseconds after the kill) nor an execution the kill missed
// (the checker would call its rescue premature).
func TestKillRaceWithLastStart(t *testing.T) {
	w := newWorld()
	w.job(20, "completed", 2, expired(1))
	w.event(EventKill, 500, 1.0, 1.0)
	w.in.Deaths[500] = at(1.003)
	w.exec(20, 1, 500, 1.0005, 0, "")
	w.exec(20, 2, 200, 3.0, 3.1, OutcomeOK)
	if fl := Check(w.in).Failures(); len(fl) > 0 {
		t.Fatalf("failures: %v", fl)
	}
	n, best, _, unrescued := rescueLatency(w.in, EventKill)
	if n != 1 || unrescued != 0 || best != 2*time.Second {
		t.Fatalf("n %d, best %v, unrescued %d; want 1, 2s (the other process's start), 0", n, best, unrescued)
	}
}
