package torture

import (
	"strings"
	"testing"
)

// batchWorld is a world with batch 7 of jobs 30 to 32, one of which ran
// twice (its first process was killed), and its callback, job 40, which
// started after the last of them finished and read their counts.
func batchWorld() *world {
	w := newWorld()
	for i, id := range []int64{30, 31, 32} {
		j := w.job(id, "completed", 1)
		j.FinalizedAt = at(1.2 + 0.1*float64(i))
		w.exec(id, 1, 200, 1.0, 1.15+0.1*float64(i), OutcomeOK)
	}
	// Job 32's first attempt was cut short by a kill; the second
	// finished it.
	j := w.in.Jobs[32]
	j.Attempt, j.Errors = 2, []AttemptErr{expired(1)}
	w.in.Execs[len(w.in.Execs)-1].PID, w.in.Execs[len(w.in.Execs)-1].End, w.in.Execs[len(w.in.Execs)-1].Outcome = 300, at(0), ""
	w.event(EventKill, 300, 1.3, 1.3)
	w.exec(32, 2, 200, 4.0, 4.3, OutcomeOK)
	j.FinalizedAt = at(4.31)
	w.in.Batches = append(w.in.Batches, BatchRec{ID: 7, Jobs: []int64{30, 31, 32}, At: at(0.9)})
	w.callback(40, 7, "completed", 4.5, 4.6, 4.7)
	w.in.BatchSeen = append(w.in.BatchSeen, BatchSeen{Job: 40, Attempt: 1, Batch: 7, Counts: map[string]int64{"completed": 3}})
	return w
}

// callback adds job id, the callback of batch bid, created at created
// (database clock) and run once from start to end.
func (w *world) callback(id, bid int64, state string, created, start, end float64) *FinalJob {
	j := &FinalJob{ID: id, Queue: Queue, Kind: KindBatchDone, State: state, Attempt: 1, MaxAttempts: 25,
		Token: "p1.0:cb", Batch: bid, CreatedAt: at(created)}
	w.in.Jobs[id] = j
	w.exec(id, 1, 200, start, end, OutcomeOK)
	w.in.Execs[len(w.in.Execs)-1].Kind = KindBatchDone
	return j
}

func TestCheckerBatchClean(t *testing.T) {
	w := batchWorld()
	f := Check(w.in)
	if fl := f.Failures(); len(fl) > 0 {
		t.Fatalf("failures in a clean batch: %v", fl)
	}
	if f.Batches != 1 || f.Unacknowledged != 0 {
		t.Fatalf("batches %d, unacknowledged %d; want 1 and 0", f.Batches, f.Unacknowledged)
	}
	// A batch with a job still unfinished has no callback yet: fine.
	w = batchWorld()
	delete(w.in.Jobs, 40)
	w.in.BatchSeen = nil
	w.in.Jobs[31].State = "available"
	for _, l := range Check(w.in).Failures() {
		if strings.Contains(l, "batch") {
			t.Fatalf("unfinished batch without callback: %v", l)
		}
	}
}

func TestCheckerBatchPlanted(t *testing.T) {
	for _, c := range []struct {
		name  string
		plant func(w *world)
		want  string
	}{{
		name: "two callbacks",
		plant: func(w *world) {
			w.callback(41, 7, "completed", 4.6, 4.8, 4.9).Token = "p1.0:cb2"
			w.in.BatchSeen = append(w.in.BatchSeen, BatchSeen{Job: 41, Attempt: 1, Batch: 7, Counts: map[string]int64{"completed": 3}})
		},
		want: "batch 7: 2 callback jobs [40 41]",
	}, {
		name: "two callbacks of a batch nobody recorded",
		plant: func(w *world) {
			w.callback(41, 9, "completed", 4.6, 4.8, 4.9).Token = "p1.0:cb2"
			w.callback(42, 9, "completed", 4.6, 4.8, 4.9).Token = "p1.0:cb3"
		},
		want: "batch 9: 2 callback jobs [41 42]",
	}, {
		name: "no callback",
		plant: func(w *world) {
			delete(w.in.Jobs, 40)
			w.in.BatchSeen = nil
		},
		want: "batch 7: every job finished, no callback job",
	}, {
		name: "callback while a job is unfinished",
		plant: func(w *world) {
			w.in.Jobs[31].State = "retryable"
		},
		want: "callback job 40 while a job of the batch is unfinished",
	}, {
		name: "callback started before the last job's run ended",
		plant: func(w *world) {
			w.in.Execs[len(w.in.Execs)-1].Start = at(4.2)
		},
		want: "callback job 40 started at 12:00:04.200, before job 32 finished running at 12:00:04.300",
	}, {
		name: "callback created before the last job was finalized",
		plant: func(w *world) {
			w.in.Jobs[40].CreatedAt = at(4.25)
		},
		want: "created at 12:00:04.250 (database clock), before the last job was finalized at 12:00:04.310",
	}, {
		name: "callback not completed",
		plant: func(w *world) {
			w.in.Jobs[40].State = "discarded"
			w.in.Jobs[40].Errors = []AttemptErr{{Attempt: 1, Error: "boom"}}
		},
		want: "callback job 40 ended discarded",
	}, {
		name: "callback completed without a record of what it read",
		plant: func(w *world) {
			w.in.BatchSeen = nil
		},
		want: "callback job 40 completed with no record of what it read",
	}, {
		name: "callback read wrong counts",
		plant: func(w *world) {
			w.in.BatchSeen[0].Counts = map[string]int64{"completed": 2, "running": 1}
		},
		want: "read batch 7 with completed=2 running=1, the jobs ended completed=3",
	}, {
		name: "callback read another batch",
		plant: func(w *world) {
			w.in.BatchSeen[0].Batch = 8
		},
		want: "attempt 1 read batch 8",
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := batchWorld()
			c.plant(w)
			f := Check(w.in)
			var all []string
			all = append(all, f.BatchCallbackCount...)
			all = append(all, f.BatchCallbackEarly...)
			all = append(all, f.BatchCallbackNotDone...)
			all = append(all, f.BatchCountsWrong...)
			if len(all) != 1 || !strings.Contains(all[0], c.want) {
				t.Fatalf("batch findings %q, want one containing %q", all, c.want)
			}
			if len(f.Failures()) == 0 {
				t.Fatalf("no failure")
			}
		})
	}
}
