// Package torture is conveyor's fault-injection suite: it runs real worker
// processes against a real database, injects faults (processes killed or
// paused past their lease, the database restarted, connections killed,
// clocks skewed, poison jobs, a starved connection pool, saturated CPUs and
// a throttled disk, transactions rolled back), with unique and periodic
// jobs among the workload, and checks the outcome exactly from records
// kept outside the queue's tables. `conveyor torture`
// is its command; docs/torture.md describes the method.
package torture

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/lab"
)

// Execution outcomes as a handler records them.
const (
	// OutcomeOK: the handler returned nil; the worker will acknowledge
	// completion (the acknowledgement may still be refused as stale).
	OutcomeOK = "ok"
	// OutcomeError: the handler returned an error.
	OutcomeError = "error"
	// OutcomePanic: the handler panicked.
	OutcomePanic = "panic"
)

// Fault event kinds, as the checker uses them to explain duplicate and
// overlapping executions.
const (
	// EventKill: the process was killed with SIGKILL by a fault.
	EventKill = "killed"
	// EventPause: the process was stopped with SIGSTOP, then resumed.
	EventPause = "paused"
	// EventExit: the process exited on its own (a poison job called
	// os.Exit, or it crashed).
	EventExit = "exited"
	// EventWriterKill: the process was killed with SIGKILL while it held
	// SQLite's write lock (mid write transaction).
	EventWriterKill = "killed mid-write"
	// EventDBRestart: the database server was restarted (PID 0: every
	// process was cut off).
	EventDBRestart = "database restarted"
	// EventConnKill: the server killed the processes' connections.
	EventConnKill = "connections killed"
	// EventNodeKill: the cluster node the process was connected to was
	// killed, until it rejoined.
	EventNodeKill = "database node killed"
	// EventClusterStall: a multi-primary cluster committed nothing until
	// the nodes left evicted a killed node (PID 0).
	EventClusterStall = "cluster stalled evicting a dead node"
	// EventStop: the process was asked to stop gracefully (SIGTERM);
	// attempts it had not finished are released, not counted.
	EventStop = "stopped"
)

// Exec is one execution of a job as a worker process recorded it.
type Exec struct {
	// Job and Attempt identify the attempt the handler ran; Kind is the
	// job's kind.
	Job     int64
	Attempt int
	Kind    string
	// Proc names the process incarnation ("w2.1": slot w2, restarted once).
	Proc string
	// PID is the process that ran it.
	PID int
	// Start is when the handler began; End when it returned, zero when
	// the process died first.
	Start, End time.Time
	// Outcome is OutcomeOK, OutcomeError or OutcomePanic; "" when End is
	// zero.
	Outcome string
	// Err is the handler's error or panic value.
	Err string
	// Enqueued is when the producer enqueued the job (zero if unknown),
	// for pick-up latency.
	Enqueued time.Time
	// Scheduled is a periodic job's ScheduledAt as its handler saw it
	// (zero for other kinds).
	Scheduled time.Time
	// Claimed is the attempt's AttemptedAt as its handler saw it: when
	// the database claimed it, by the database's clock (zero if not
	// recorded). The rate limit is checked on it (see checkLimits).
	Claimed time.Time
	// Cancelled is when the handler saw its context end, if that was
	// before it returned (zero otherwise, and in records that predate
	// it): a cut-off happens then, and the handler may take a while
	// longer to return.
	Cancelled time.Time

	// opened is when the attempt was open at the latest, set by Check:
	// Start, or the start of a later attempt of the job if that was
	// earlier (see openedAt).
	opened time.Time
}

// openedAt is when e's attempt was open at the latest. The records do not
// hold claims, but the claims of one job follow one another: an attempt
// was claimed before any later attempt of its job started. A process
// stopped between claiming an attempt and starting its handler records
// the start when it wakes, after the attempt that replaced it.
func (e Exec) openedAt() time.Time {
	if !e.opened.IsZero() && e.opened.Before(e.Start) {
		return e.opened
	}
	return e.Start
}

// AttemptErr is one entry of a job's error history as stored.
type AttemptErr struct {
	// Attempt is the attempt the entry is about; Error its message.
	Attempt int
	Error   string
	// At is when the entry was recorded, by the database's clock (zero
	// when unknown).
	At time.Time
}

// FinalJob is a job's row as read through the public API after the drain.
type FinalJob struct {
	// ID, Queue, Kind, State, Attempt, MaxAttempts and ScheduledAt are
	// as stored.
	ID          int64
	Queue       string
	Kind        string
	State       string
	Attempt     int
	MaxAttempts int
	ScheduledAt time.Time
	// Token is the unique token the producer put in the job's arguments.
	Token string
	// U and W are the unique-key fields of the arguments of a unique
	// job (see uniqueKeyOf); U is empty for other jobs.
	U string
	W int64
	// Errors is the job's error history.
	Errors []AttemptErr
	// Batch is the batch whose callback the job is (conveyor.BatchOf), 0
	// for other jobs.
	Batch int64
	// Key is the job's limit key, "" for none.
	Key string
	// CreatedAt and FinalizedAt are as stored (the database's clock).
	CreatedAt, FinalizedAt time.Time
}

// Event is a fault applied during a run.
type Event struct {
	// Kind is one of the Event constants.
	Kind string
	// PID is the process it hit; 0 for database-side faults, which hit
	// every process.
	PID int
	// Start and End bound the fault; End equals Start for a kill.
	Start, End time.Time
}

// Input is what the checker reads: the records of every process, the
// final rows and the faults applied.
type Input struct {
	// Lease is the workers' lease. Database-side faults are taken to
	// affect leases until one lease after they end.
	Lease time.Duration
	// Acked maps every acknowledged enqueue's job id to its token, and
	// AckedAt to when the producer had the acknowledgement (the job was
	// committed by then; zero or missing when unknown).
	Acked   map[int64]string
	AckedAt map[int64]time.Time
	// RolledBack holds the tokens of transactional enqueues whose
	// transaction was rolled back.
	RolledBack map[string]bool
	// Execs are every execution recorded by every worker process.
	Execs []Exec
	// Jobs are the final rows of every job under the run's prefix.
	Jobs map[int64]*FinalJob
	// Events are the faults applied.
	Events []Event
	// Deaths maps a process id to when it exited, for executions that
	// have no end.
	Deaths map[int]time.Time
	// Poison lists the kinds that must end discarded.
	Poison map[string]bool
	// Limits are the queue limits set for the run, by queue (see
	// checkLimits); nil when none.
	Limits map[string]conveyor.QueueLimits
	// AsyncClaims says the backend's claims commit without waiting for
	// the disk (PostgreSQL): a database restart may lose a claim made
	// just before it, and the job's attempt then runs again under the
	// same attempt number (see claimLost).
	AsyncClaims bool
	// Applied lists, per job, the attempts a worker saw completed in the
	// row shortly after they ran (the completion-effect log; sampled),
	// and AppliedAt when a worker first saw the job completed.
	Applied   map[int64][]int
	AppliedAt map[int64]time.Time
	// Told is what every committed enqueue of a unique job was told.
	Told []Told
	// Tick is the interval of the workers' periodic job (0: none);
	// TickStop when the schedule was told to stop (no slot after it is
	// required); Ups the worker process incarnations that ran it.
	Tick     time.Duration
	TickStop time.Time
	Ups      []Up
	// SlowRenewals lists, per process id, the lease renewals its engine
	// reported as slower than the heartbeat interval (lab.OnSlowRenewal,
	// recorded as slowbeat lines): on a loaded machine a renewal can come back too late to
	// save a lease, and the engine then cuts the handlers off before the
	// lease can expire (see slowRenewal).
	SlowRenewals map[int][]Renewal
	// LateClaims lists, per process id, the claims its engine reported
	// as slower than the heartbeat interval (lab.OnLateClaim, recorded as
	// late lines before the claimed handlers started): a claim that
	// waited in a stall of the database leaves its jobs little of their
	// first lease, and the engine may have to cut them off before any
	// renewal of theirs gets through (see lateClaim).
	LateClaims map[int][]LateClaim
	// Batches are the batches the producers enqueued, and BatchSeen what
	// each execution of a batch's callback read of its batch (see
	// checkBatches).
	Batches   []BatchRec
	BatchSeen []BatchSeen
	// DBOffset is the database's clock minus the run's (non-zero only
	// where a fault skews the database's clock), to read AttemptErr.At
	// by the run's clock.
	DBOffset time.Duration
}

// Renewal is one lease renewal: when it was sent and when it returned.
type Renewal struct {
	Sent, Done time.Time
}

// LateClaim is one claim that came back later than the heartbeat
// interval: when it was sent (its jobs' leases run from then), when it
// came back (before any renewal of its jobs was sent), the deadline at
// which the engine cuts its jobs off unless a renewal gets through, and
// its attempts.
type LateClaim struct {
	Sent, Back, Deadline time.Time
	Jobs                 []JobAttempt
}

// JobAttempt names one attempt of a job.
type JobAttempt struct {
	ID      int64 // the job's id
	Attempt int   // the attempt's number
}

// Findings is the checker's verdict on one run.
type Findings struct {
	// Enqueued counts acknowledged enqueues; Completed, Discarded and
	// Cancelled count the final states of every row.
	Enqueued, Completed, Discarded, Cancelled int
	// Lost: acknowledged, but neither completed nor discarded/cancelled
	// with a recorded reason (missing rows included). Must be empty.
	Lost []int64
	// CompletedTwice: completed, and an earlier attempt of the same job
	// also finished successfully and left no trace of being superseded (no
	// error entry for that attempt): its completion took effect and the job
	// ran and completed again. Must be empty.
	CompletedTwice []int64
	// CompletionsUndone: a worker saw the row completed at attempt k, yet
	// it did not end completed at k (it ran again, or was reset). Must be
	// empty.
	CompletionsUndone []int64
	// StaleApplied: completed at attempt A although no execution of
	// attempt A returned success, or although attempt A was already failed
	// or rescued (it has an error entry): the completion that took effect
	// came from a superseded attempt; or any attempt with two error
	// entries (a failure or rescue applied to an attempt that had already
	// ended). Must be empty.
	StaleApplied []int64
	// Duplicates counts executions beyond the first of each job;
	// DuplicateCauses counts them by the fault that explains them.
	Duplicates      int
	DuplicateCauses map[string]int
	// Unexplained describes duplicate executions no fault explains (a
	// lease that expired while its process was live, an attempt that
	// ended without trace). Must be empty.
	Unexplained []string
	// Overlaps describes pairs of executions of one job that overlapped
	// in time while the earlier one's lease was live (or with the same
	// attempt). Must be empty. OverlapsExplained counts overlaps whose
	// earlier execution's process was paused, killed or cut off past its
	// lease and whose attempt the database records as rescued.
	Overlaps          []string
	OverlapsExplained int
	// LateAcks counts successful executions of attempts that were
	// superseded: their acknowledgements must have been refused.
	LateAcks int
	// RolledBackPresent lists tokens of rolled-back enqueues that exist.
	RolledBackPresent []string
	// DuplicateRows lists tokens stored in more than one row (one enqueue
	// inserted twice).
	DuplicateRows []string
	// Stuck lists jobs not in a final state after the drain.
	Stuck []int64
	// PoisonNotDiscarded lists poison jobs that did not end discarded.
	PoisonNotDiscarded []int64
	// Unacknowledged counts rows nobody recorded an acknowledgement for
	// (an enqueue whose result was an error, or a producer killed between
	// its commit and its record): allowed. Periodic jobs and batch
	// callbacks are not counted.
	Unacknowledged int

	// Unique jobs (see checkUnique). UniqueTold counts the committed
	// enqueues of unique jobs and DupTold those told they were
	// duplicates.
	UniqueTold, DupTold int
	// UniqueLiveTwice: two jobs of one key certainly unfinished at the
	// same moment (key freed when a job finishes). Must be empty.
	UniqueLiveTwice []string
	// UniqueKeptTwice: two rows of one key whose jobs keep their key in
	// every state, so that at most one may ever exist. Must be empty.
	UniqueKeptTwice []string
	// WrongHolder: an enqueue told an id that is not its key's holder
	// (no such job, a job of another key, one that did not exist yet or
	// had already finished). Must be empty.
	WrongHolder []string

	// Periodic jobs (see checkPeriodic). Slots counts the slots from the
	// first to the last with a job; SlotsTwice lists slots with more than
	// one job and SlotsMissed slots without one although a worker process
	// ran the schedule all along: both must be empty. SlotsSkippedDown
	// counts slots without a job while no worker process was up (allowed
	// by design). OffSlot lists periodic jobs not due on a slot and
	// PeriodicNotCompleted those that did not end completed: must be
	// empty.
	Slots, SlotsSkippedDown int
	SlotsTwice, SlotsMissed []string
	OffSlot                 []string
	PeriodicNotCompleted    []int64

	// Queue limits (see checkLimits). OverLimit: instants at which more
	// executions of a queue with MaxRunning were in progress than it
	// allows, each with the executions. OverRate: windows of a queue's
	// RatePeriod holding more than Rate + 1 claims. Both must be empty.
	// LimitPeak is the most executions of each queue with MaxRunning in
	// progress at once, RatePeak the most claims of each queue with a
	// Rate within one RatePeriod.
	OverLimit, OverRate []string
	LimitPeak, RatePeak map[string]int
	// Limits per key and ordered keys (see checkLimits, checkOrder).
	// OverKey: instants at which more executions of one key were in
	// progress than its queue's KeyMaxRunning; OrderedAtOnce: instants at
	// which two executions of one key of an Ordered queue were;
	// OutOfOrder: a job of an ordered key that started before an earlier
	// job of its key (enqueued before it) had finished, or while one
	// never did. All must be empty. KeyPeak is the most executions of
	// one key at once. OrderedKeys and OrderedJobs count the ordered keys
	// and their acknowledged jobs checked; OrderedWait is the most jobs
	// of one key waiting (acknowledged, not started) while one of its
	// jobs ran, and OrderedHeld counts the failed jobs a later job of
	// their key waited for (see checkOrder).
	OverKey, OrderedAtOnce, OutOfOrder []string
	KeyPeak                            int
	OrderedKeys, OrderedJobs           int
	OrderedWait, OrderedHeld           int

	// Batches (see checkBatches). Batches counts the recorded batches.
	// BatchCallbackCount: a batch with two callback jobs, a finished one
	// with none, or an unfinished one with one. BatchCallbackEarly: a
	// callback enqueued before its batch's last job finished.
	// BatchCallbackNotDone: a callback that did not end completed, or did
	// without recording what it read. BatchCountsWrong: a callback that
	// read counts of states other than its jobs' final states. All must
	// be empty. BatchGapRun is the smallest time from the end of a
	// batch's last job's finishing execution to its callback's first
	// start (records), BatchGapDB the smallest from that job's
	// finalization to the callback's creation (database clock); nil when
	// there was none.
	Batches                                int
	BatchCallbackCount, BatchCallbackEarly []string
	BatchCallbackNotDone, BatchCountsWrong []string
	BatchGapRun, BatchGapDB                *time.Duration
}

// Failures lists the violations in f, one line each; empty means the run
// kept every promise.
func (f *Findings) Failures() []string {
	var out []string
	add := func(n int, what string, detail any) {
		if n > 0 {
			out = append(out, fmt.Sprintf("%d %s: %v", n, what, detail))
		}
	}
	add(len(f.Lost), "lost", head(f.Lost))
	add(len(f.CompletedTwice), "completed twice", head(f.CompletedTwice))
	add(len(f.CompletionsUndone), "completions seen applied and then undone", head(f.CompletionsUndone))
	add(len(f.StaleApplied), "stale acknowledgements applied", head(f.StaleApplied))
	add(len(f.Overlaps), "overlapping executions", headS(f.Overlaps))
	add(len(f.Unexplained), "unexplained duplicate executions", headS(f.Unexplained))
	add(len(f.RolledBackPresent), "rolled-back enqueues present", headS(f.RolledBackPresent))
	add(len(f.DuplicateRows), "enqueues stored twice", headS(f.DuplicateRows))
	add(len(f.Stuck), "jobs stuck in a non-final state", head(f.Stuck))
	add(len(f.PoisonNotDiscarded), "poison jobs not discarded", head(f.PoisonNotDiscarded))
	add(len(f.UniqueLiveTwice), "duplicate unique jobs unfinished at once", headS(f.UniqueLiveTwice))
	add(len(f.UniqueKeptTwice), "unique keys held by two kept jobs", headS(f.UniqueKeptTwice))
	add(len(f.WrongHolder), "enqueues told an id that is not the key's holder", headS(f.WrongHolder))
	add(len(f.SlotsTwice), "periodic slots fired twice", headS(f.SlotsTwice))
	add(len(f.SlotsMissed), "periodic slots missed while a worker process ran the schedule", headS(f.SlotsMissed))
	add(len(f.OffSlot), "periodic jobs not due on a slot", headS(f.OffSlot))
	add(len(f.PeriodicNotCompleted), "periodic jobs not completed", head(f.PeriodicNotCompleted))
	add(len(f.OverLimit), "instants over a queue's MaxRunning", headS(f.OverLimit))
	add(len(f.OverRate), "windows over a queue's Rate", headS(f.OverRate))
	add(len(f.OverKey), "instants over a key's limit", headS(f.OverKey))
	add(len(f.OrderedAtOnce), "instants with two jobs of an ordered key running at once", headS(f.OrderedAtOnce))
	add(len(f.OutOfOrder), "jobs of an ordered key started out of order", headS(f.OutOfOrder))
	add(len(f.BatchCallbackCount), "batches without exactly one callback job once finished", headS(f.BatchCallbackCount))
	add(len(f.BatchCallbackEarly), "batch callbacks enqueued before their last job finished", headS(f.BatchCallbackEarly))
	add(len(f.BatchCallbackNotDone), "batch callbacks not completed", headS(f.BatchCallbackNotDone))
	add(len(f.BatchCountsWrong), "batch callbacks that read wrong counts", headS(f.BatchCountsWrong))
	return out
}

func head[T any](xs []T) []T {
	if len(xs) > 5 {
		return xs[:5]
	}
	return xs
}

func headS(xs []string) string {
	s := strings.Join(head(xs), "; ")
	if len(xs) > 5 {
		s += "; ..."
	}
	return s
}

// leaseExpiredPrefix starts the error a rescue records for an attempt
// whose lease expired (see driver.Driver.Rescue).
const leaseExpiredPrefix = "lease expired"

// cutOffErr reports whether msg, an attempt's error entry as stored in
// the database, says that its engine cut the handler off because the
// lease could not be renewed in time: the handler returned the cut-off's
// cause (lab.LeaseDeadlineMessage starts the entry), or an error of its
// own from a call the cancellation interrupted, a database read for one,
// to which the engine appended the cause in parentheses (the entry ends
// with it); lab.CutOff decides. It is the attempt's side of the evidence;
// the cause of the cut-off (a pause, a slow renewal) must be found in the
// records as well.
func cutOffErr(msg string) bool { return lab.CutOff(msg) }

var farFuture = time.Unix(1<<40, 0)

// Check computes the findings of one run. It is exact given its inputs:
// every execution is recorded before it has any effect on the queue, and
// every attempt that does not complete a job leaves an error entry (a
// failure or a rescue), except one released at shutdown, which is run
// again under the same attempt number.
func Check(in *Input) *Findings {
	f := &Findings{DuplicateCauses: map[string]int{}, Enqueued: len(in.Acked)}
	byJob := map[int64][]Exec{}
	for _, e := range in.Execs {
		byJob[e.Job] = append(byJob[e.Job], e)
	}
	for _, es := range byJob {
		// In the order of the attempts, which is the order of their
		// claims (an attempt given back, by a release or a snooze, runs
		// again under the same number, in the order of its starts).
		sort.Slice(es, func(i, j int) bool {
			if es[i].Attempt != es[j].Attempt {
				return es[i].Attempt < es[j].Attempt
			}
			return es[i].Start.Before(es[j].Start)
		})
		var next time.Time // earliest start of a later attempt
		for i := len(es) - 1; i >= 0; {
			k := i
			for k >= 0 && es[k].Attempt == es[i].Attempt {
				es[k].opened = next
				k--
			}
			for m := k + 1; m <= i; m++ {
				if next.IsZero() || es[m].Start.Before(next) {
					next = es[m].Start
				}
			}
			i = k
		}
	}

	// Lost: acknowledged and not finished with a reason.
	for id := range in.Acked {
		j := in.Jobs[id]
		switch {
		case j == nil:
			f.Lost = append(f.Lost, id)
		case j.State == "completed":
		case (j.State == "discarded" || j.State == "cancelled") && len(j.Errors) > 0:
		default:
			f.Lost = append(f.Lost, id)
		}
	}

	// Rows: states, tokens, stuck and poison jobs.
	tokens := map[string][]int64{}
	for id, j := range in.Jobs {
		switch j.State {
		case "completed":
			f.Completed++
		case "discarded":
			f.Discarded++
		case "cancelled":
			f.Cancelled++
		default:
			f.Stuck = append(f.Stuck, id)
		}
		if in.Poison[j.Kind] && j.State != "discarded" {
			f.PoisonNotDiscarded = append(f.PoisonNotDiscarded, id)
		}
		if j.Token != "" {
			tokens[j.Token] = append(tokens[j.Token], id)
			if in.RolledBack[j.Token] {
				f.RolledBackPresent = append(f.RolledBackPresent, fmt.Sprintf("%s (job %d)", j.Token, id))
			}
		}
		if _, ok := in.Acked[id]; !ok && j.Kind != KindTick && j.Batch == 0 {
			f.Unacknowledged++
		}
	}
	for tok, ids := range tokens {
		if len(ids) > 1 {
			sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
			f.DuplicateRows = append(f.DuplicateRows, fmt.Sprintf("%s in jobs %v", tok, ids))
		}
	}

	// Completions seen applied must be the final state.
	for id, atts := range in.Applied {
		j := in.Jobs[id]
		for _, a := range atts {
			if j == nil || j.State != "completed" || j.Attempt != a {
				f.CompletionsUndone = append(f.CompletionsUndone, id)
				break
			}
		}
	}

	// Per job: completion, stale acknowledgements, duplicates, overlaps.
	for id, j := range in.Jobs {
		es := byJob[id]
		errAt := map[int][]string{}
		for _, e := range j.Errors {
			errAt[e.Attempt] = append(errAt[e.Attempt], e.Error)
		}
		okAt := map[int]bool{}
		for _, e := range es {
			if e.Outcome == OutcomeOK {
				okAt[e.Attempt] = true
			}
		}
		stale := false
		for _, msgs := range errAt {
			// One attempt ends once: two entries mean a stale outcome (or
			// a rescue) was applied to an attempt that had already ended.
			if len(msgs) > 1 {
				stale = true
			}
		}
		if j.State == "completed" {
			a := j.Attempt
			if !okAt[a] || len(errAt[a]) > 0 {
				stale = true
			}
			for k := 1; k < a; k++ {
				if okAt[k] && len(errAt[k]) == 0 && !rerun(es, k) {
					f.CompletedTwice = append(f.CompletedTwice, id)
					break
				}
			}
		}
		if stale {
			f.StaleApplied = append(f.StaleApplied, id)
		}
		for _, e := range es {
			if e.Outcome == OutcomeOK && (len(errAt[e.Attempt]) > 0 || (j.State == "completed" && e.Attempt != j.Attempt)) {
				f.LateAcks++
			}
		}
		for i := 0; i+1 < len(es); i++ {
			f.Duplicates++
			cause, ok := in.cause(es[i], es[i+1:], j, errAt)
			if ok {
				f.DuplicateCauses[cause]++
			} else {
				f.Unexplained = append(f.Unexplained, fmt.Sprintf("job %d attempt %d on %s: %s", id, es[i].Attempt, es[i].Proc, cause))
			}
		}
		for a := 0; a < len(es); a++ {
			for b := a + 1; b < len(es); b++ {
				e1, e2 := es[a], es[b]
				end1 := in.effectiveEnd(e1)
				if !e2.Start.Before(end1) {
					continue
				}
				desc := fmt.Sprintf("job %d: attempt %d on %s [%s, %s] and attempt %d on %s from %s",
					id, e1.Attempt, e1.Proc, clock(e1.Start), clockOrDash(e1.End), e2.Attempt, e2.Proc, clock(e2.Start))
				if e1.Attempt == e2.Attempt && in.claimLost(e1, e2) {
					f.OverlapsExplained++
					continue
				}
				if e1.Attempt != e2.Attempt && abandoned(j, errAt[e1.Attempt]) {
					f.OverlapsExplained++
					continue
				}
				if e1.Attempt != e2.Attempt && rescued(errAt[e1.Attempt]) {
					if _, ok := in.faultFor(e1, e2.Start); ok {
						f.OverlapsExplained++
						continue
					}
				}
				f.Overlaps = append(f.Overlaps, desc)
			}
		}
	}
	in.checkUnique(f, byJob)
	in.checkPeriodic(f, byJob)
	in.checkLimits(f, byJob)
	in.checkBatches(f, byJob)
	for _, s := range [][]int64{f.Lost, f.CompletedTwice, f.CompletionsUndone, f.StaleApplied, f.Stuck, f.PoisonNotDiscarded, f.PeriodicNotCompleted} {
		sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	}
	sort.Strings(f.Unexplained)
	sort.Strings(f.Overlaps)
	sort.Strings(f.DuplicateRows)
	sort.Strings(f.RolledBackPresent)
	return f
}

// rerun reports whether attempt k was executed again under the same
// number, which only a release at shutdown does.
func rerun(es []Exec, k int) bool {
	n := 0
	for _, e := range es {
		if e.Attempt == k {
			n++
		}
	}
	return n > 1
}

// abandonedCause explains the executions of a handler that ignores its
// context: one lease after its timeout the engine stops renewing the
// lease, the attempt is rescued and counted, and the job runs again while
// the stuck goroutine (which Go cannot stop) lives on.
const abandonedCause = "abandoned: the handler ignored its context past its timeout"

// abandoned reports whether an attempt of job j was abandoned by the
// engine: a hang poison job whose attempt was rescued.
func abandoned(j *FinalJob, errs []string) bool {
	return j.Kind == KindHang && rescued(errs)
}

func rescued(errs []string) bool {
	for _, e := range errs {
		if strings.HasPrefix(e, leaseExpiredPrefix) {
			return true
		}
	}
	return false
}

// claimLostCause explains a second execution of one attempt after a
// database restart, a switchover or a failover lost the first one's
// claim (the new primary never had it).
const claimLostCause = "claim lost in a database restart or failover (asynchronous claim commit)"

// claimLostWindow bounds how far from a database restart an attempt may
// have been opened for the restart to have lost its claim: a claim that
// commits asynchronously reaches the disk within three wal_writer_delay
// (600ms by default), and sooner with the next synchronous commit.
const claimLostWindow = time.Second

// claimLost reports whether later, an execution of the same attempt as e,
// is explained by a database restart (or a switchover or failover of the
// primary: see clusterEvent) that lost e's claim: claims commit
// asynchronously, e's attempt was opened within claimLostWindow of the
// restart, and later started after the restart began (the database, not
// a process, handed the attempt out again).
func (in *Input) claimLost(e, later Exec) bool {
	if !in.AsyncClaims {
		return false
	}
	opened := e.openedAt()
	for _, ev := range in.Events {
		if !clusterEvent(ev.Kind) {
			continue
		}
		if opened.After(ev.Start.Add(-claimLostWindow)) && opened.Before(ev.End.Add(claimLostWindow)) &&
			later.Start.After(ev.Start) {
			return true
		}
	}
	return false
}

// effectiveEnd is when an execution stopped running: its recorded end,
// else its process's death, else never.
func (in *Input) effectiveEnd(e Exec) time.Time {
	if !e.End.IsZero() {
		return e.End
	}
	if t, ok := in.Deaths[e.PID]; ok {
		return t
	}
	return farFuture
}

// cause explains why execution e did not finish job j, so that a later
// execution ran: the fault behind it and whether that is an allowed cause.
func (in *Input) cause(e Exec, later []Exec, j *FinalJob, errAt map[int][]string) (string, bool) {
	for _, l := range later {
		if l.Attempt == e.Attempt {
			for _, ev := range in.Events {
				if ev.Kind == EventStop && ev.PID == e.PID && !ev.Start.Before(e.Start) {
					return "released at shutdown", true
				}
			}
			if in.claimLost(e, l) {
				return claimLostCause, true
			}
			return "attempt run twice without a shutdown", false
		}
	}
	msgs := errAt[e.Attempt]
	if abandoned(j, msgs) {
		return abandonedCause, true
	}
	if rescued(msgs) {
		if ev, ok := in.faultFor(e, farFuture); ok {
			return "lease expired: " + ev.Kind, true
		}
		if ev, ok := in.diedBeforeRescue(e, j); ok {
			return diedBeforeRescueCause + ev.Kind, true
		}
		return "lease expired while its process was live and connected (premature rescue)", false
	}
	if len(msgs) > 0 {
		if in.Poison[j.Kind] {
			return "poison " + j.Kind + " failed", true
		}
		if j.Kind == KindFlaky && e.Attempt == 1 && strings.HasPrefix(msgs[0], flakyErr) {
			return flakyCause, true
		}
		if ev, ok := in.faultFor(e, farFuture); ok {
			switch {
			case ev.PID == 0:
				return "failed during fault: " + ev.Kind, true
			case ev.Kind == EventPause && cutOffErr(msgs[0]):
				// Stopped past its lease and resumed before any other
				// process rescued the attempt (the paused process may
				// have been the leader that rescues): its deadline loop
				// cut the handler off on waking, as it must.
				return "cut off after its lease: " + ev.Kind, true
			}
		}
		if cutOffErr(msgs[0]) && in.slowRenewal(e) {
			return slowRenewalCause, true
		}
		if cutOffErr(msgs[0]) && in.lateClaim(e) {
			return lateClaimCause, true
		}
		return "failed: " + firstLine(msgs[0]), false
	}
	if e.Outcome == OutcomeOK {
		return "completed, yet the job ran again", false
	}
	return "attempt ended without an error entry", false
}

// flakyCause explains the retry of a KindFlaky job, whose first attempt
// fails by design (with flakyErr).
const flakyCause = "flaky: its first attempt failed as it was made to"

// diedBeforeRescueCause explains a rescue of an attempt whose handler
// had returned but whose outcome its process had not yet written (on a
// loaded machine the write can wait longer than a lease) when the
// process died: the lease was taken after the death, from nobody.
const diedBeforeRescueCause = "lease expired after its process died with the outcome unwritten: "

// diedBeforeRescue finds the death (kill or exit) of e's process that
// came before the rescue of e's attempt was recorded, for an execution
// whose handler had returned: faultFor only looks one lease past the
// handler's return, and a process whose outcome write waited longer than
// that may die later still with the outcome unwritten. A rescue recorded
// while the process lived is not explained here.
func (in *Input) diedBeforeRescue(e Exec, j *FinalJob) (Event, bool) {
	if e.End.IsZero() {
		return Event{}, false
	}
	var rescuedAt time.Time
	for _, ae := range j.Errors {
		if ae.Attempt == e.Attempt && strings.HasPrefix(ae.Error, leaseExpiredPrefix) && !ae.At.IsZero() {
			rescuedAt = ae.At.Add(-in.DBOffset)
		}
	}
	if rescuedAt.IsZero() {
		return Event{}, false
	}
	for _, ev := range in.Events {
		if ev.PID != e.PID || (ev.Kind != EventKill && ev.Kind != EventExit && ev.Kind != EventWriterKill) {
			continue
		}
		if !ev.Start.Before(e.End) && !rescuedAt.Before(ev.Start) {
			return ev, true
		}
	}
	return Event{}, false
}

// slowRenewalCause explains an attempt that its engine cut off because a
// renewal of its lease was still out when the lease was about to expire.
const slowRenewalCause = "cut off: its lease renewal was slow (a loaded machine)"

// cutOffAt is when e's handler was cut off: when it saw its context end
// (Cancelled), or, without that record, its end; zero without either.
func cutOffAt(e Exec) time.Time {
	if !e.Cancelled.IsZero() {
		return e.Cancelled
	}
	return e.End
}

// slowRenewal reports whether e's process had a lease renewal out when
// e's handler was cut off: sent before the cut-off and back only after
// it. The cut-off is when the handler saw its context end (Cancelled),
// or, without that record, its end. It is the engine's own evidence that
// the renewal, not the handler or the queue, was late; an attempt cut
// off without one stays unexplained.
func (in *Input) slowRenewal(e Exec) bool {
	cut := cutOffAt(e)
	if cut.IsZero() {
		return false
	}
	for _, r := range in.SlowRenewals[e.PID] {
		if !r.Sent.After(cut) && !r.Done.Before(cut) {
			return true
		}
	}
	return false
}

// lateClaimCause explains an attempt that its engine cut off at the
// deadline its claim left it, because that claim came back late.
const lateClaimCause = "cut off: its claim came back late, with too little of its lease left for a renewal"

// lateClaim reports whether e was cut off at the deadline of the claim
// that handed it over, when its engine reported that claim as late
// (LateClaims): the engine's own record of when the claim was sent and
// came back, written before e's handler started. It takes three things,
// each the engine's own numbers:
//   - the claim came back with less than two heartbeat intervals (the
//     workers run the default, Lease/5) before its deadline: the round of
//     renewals already out when it came back, up to an interval unless it
//     was reported slow, and the first round holding its jobs, up to
//     another, could both take that long;
//   - the cut-off came at or after that deadline: never before it;
//   - and before any renewal sent once the claim was back could have
//     moved the deadline (Back + Lease - Lease/5): a cut-off later than
//     that was not the claim's.
//
// A handler cut off sooner after a prompt claim, or with a claim that left
// it time for a renewal, stays unexplained (unless a slow renewal was out
// at its cut-off: slowRenewal).
func (in *Input) lateClaim(e Exec) bool {
	cut := cutOffAt(e)
	if cut.IsZero() {
		return false
	}
	// The claim that handed e over: the last late one of its attempt
	// back before its start (a snoozed or released job is claimed again
	// under the same attempt number).
	var c *LateClaim
	for i, lc := range in.LateClaims[e.PID] {
		if !lc.Back.After(e.Start) && slices.Contains(lc.Jobs, JobAttempt{ID: e.Job, Attempt: e.Attempt}) &&
			(c == nil || lc.Back.After(c.Back)) {
			c = &in.LateClaims[e.PID][i]
		}
	}
	hb, margin := in.Lease/5, in.Lease/5
	return c != nil && c.Deadline.Sub(c.Back) < 2*hb && !cut.Before(c.Deadline) &&
		cut.Before(c.Back.Add(in.Lease-margin))
}

// faultFor finds a fault that hit e's process (or every process) while
// e's attempt was open, up to until: from its start to one lease after
// its handler returned (the outcome is written by the process's completer
// after the handler returns, and the lease is no longer renewed then), or
// to its process's death. Process faults are a kill, an exit or a pause;
// database faults are taken to cost leases for one lease after they end.
func (in *Input) faultFor(e Exec, until time.Time) (Event, bool) {
	end := in.effectiveEnd(e)
	if !e.End.IsZero() {
		end = e.End.Add(in.Lease)
		if d, ok := in.Deaths[e.PID]; ok && d.Before(end) && !d.Before(e.End) {
			end = d
		}
	}
	if until.Before(end) {
		end = until
	}
	var best Event
	found := false
	for _, ev := range in.Events {
		if ev.Kind == EventStop {
			continue
		}
		if ev.PID != 0 && ev.PID != e.PID {
			continue
		}
		evEnd := ev.End
		if ev.PID == 0 {
			evEnd = evEnd.Add(in.Lease)
		}
		if ev.Kind == EventKill {
			// The kill's time is read just before the signal is sent:
			// the process may record a start before it dies, which is
			// when it was reaped.
			if d, ok := in.Deaths[ev.PID]; ok && d.After(evEnd) {
				evEnd = d
			}
		}
		// Instantaneous process faults (kill, exit) count when they fall
		// in [opened, end]; windows when they intersect it.
		if ev.Start.After(end) || evEnd.Before(e.openedAt()) {
			continue
		}
		if !found || (best.PID == 0 && ev.PID != 0) {
			best, found = ev, true
		}
	}
	return best, found
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

func clock(t time.Time) string { return t.Format("15:04:05.000") }

func clockOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return clock(t)
}

// Recovery returns how long after faultEnd the completion rate first came
// back to 80% of its level in the three seconds before faultStart,
// measured over sliding one-second windows of the completion times. ok is
// false when there was no pre-fault level or it never came back before
// loadEnd.
func Recovery(completions []time.Time, faultStart, faultEnd, loadEnd time.Time) (d time.Duration, ok bool) {
	const pre = 3 * time.Second
	ts := slices.Clone(completions)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	count := func(from, to time.Time) int {
		i, _ := slices.BinarySearchFunc(ts, from, func(a, b time.Time) int { return a.Compare(b) })
		j, _ := slices.BinarySearchFunc(ts, to, func(a, b time.Time) int { return a.Compare(b) })
		return j - i
	}
	level := float64(count(faultStart.Add(-pre), faultStart)) / pre.Seconds()
	if level <= 0 {
		return 0, false
	}
	const step = 100 * time.Millisecond
	for t := faultEnd; !t.Add(time.Second).After(loadEnd); t = t.Add(step) {
		if float64(count(t, t.Add(time.Second))) >= 0.8*level {
			return t.Sub(faultEnd), true
		}
	}
	return 0, false
}
