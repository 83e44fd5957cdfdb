package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// fakeDriver is an in-memory stand-in for a backend, enough for the
// engine's loops: Claim hands out the pending jobs of the asked queue
// once, and every call the engine makes is recorded in order. Each method
// can be overridden by a hook the test sets before Start; a nil hook gives
// the behaviour of a healthy database (every lease owned, every outcome
// applied, inserts queued as pending jobs). The rest of driver.Driver is
// never called by the engine's loops (the embedded nil interface would
// panic if it were).
type fakeDriver struct {
	driver.Driver

	mu      sync.Mutex
	pending []*driver.JobRow
	claimAt time.Time // when the last non-empty claim was called
	// held is every claimed attempt (id -> fence) not yet completed or
	// released: what the database would consider running.
	held map[int64]int64
	// rows is the row of every job handed out by a claim, so that a
	// released one can be pending again, as a database would make it.
	rows   map[int64]*driver.JobRow
	calls  []call // every call, in the order it began
	nextID int64  // last id given by Insert
	// uniqueHolders maps each unique key InsertUnique stored to its job.
	uniqueHolders map[string]int64

	listen  bool        // Capabilities().Listen
	one     bool        // Capabilities().OneWriter
	wakeups chan string // what the listener delivers when listen is set
	onClaim func(driver.ClaimParams)
	claim   func(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error)
	// claimLimited answers ClaimLimited; nil hands out pending jobs as
	// Claim does, never held.
	claimLimited func(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error)
	// limits is what QueueLimits answers (guarded by mu); limitReads
	// counts the reads.
	limits     map[string]driver.QueueLimits
	limitReads atomic.Int64
	// queueLimits, when set, answers QueueLimits in place of limits.
	queueLimits func(ctx context.Context) (map[string]driver.QueueLimits, error)
	insert      func(ctx context.Context, jobs []driver.InsertParams) ([]int64, error)
	tryLead     func() (bool, error)
	promote     func() (map[string]int, error)
	rescue      func() (map[string]int, error)
	prune       func() (int64, error)
	// fireBatches answers FireBatches, given its skip; nil fires none.
	fireBatches func(skip func(int64) bool) (map[int64]int64, error)

	// maintain answers Maintain; nil does nothing.
	maintain func() (map[string]int, error)
	// registerProcess answers RegisterProcess; nil succeeds.
	registerProcess func() error
	// insertUnique, when set, answers InsertUnique in place of the fake's
	// own bookkeeping.
	insertUnique func(ctx context.Context, jobs []driver.InsertParams) ([]int64, []bool, error)

	// claimJob answers ClaimJob; without it a pending job of that id, of
	// any queue, is claimed, and another id is not found.
	claimJob  func(ctx context.Context, id int64) (*driver.JobRow, error)
	heartbeat func(ctx context.Context, leases []driver.Lease) ([]int64, error)
	complete  func(ctx context.Context, outcomes []driver.Outcome) ([]int64, error)
	released  atomic.Int64
}

// call is one recorded driver call: its operation, when it began, the
// queue (Claim), the job ids it carried, and for Heartbeat the leases and
// the lease duration asked for, for TryLead the leader id and ttl, for
// Prune the retention ages.
type call struct {
	op     string
	at     time.Time
	queue  string
	limit  int
	ids    []int64
	leases []driver.Lease
	dur    time.Duration
	dur2   time.Duration
	who    string
	out    []driver.Outcome
	params []driver.InsertParams
	done   bool // Claim: the call returned (ids is then complete)
	// limited marks a claim made through ClaimLimited (recorded as op
	// "claim" too), held one that the limits held back.
	limited, held bool
	procs         []driver.ProcessRow
}

// record appends c to the call log and returns its index.
func (d *fakeDriver) record(c call) int {
	c.at = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, c)
	return len(d.calls) - 1
}

// callsOf returns a copy of the recorded calls of operation op.
func (d *fakeDriver) callsOf(op string) []call {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []call
	for _, c := range d.calls {
		if c.op == op {
			out = append(out, c)
		}
	}
	return out
}

// count is how many calls of operation op were recorded.
func (d *fakeDriver) count(op string) int { return len(d.callsOf(op)) }

// allCalls returns a copy of the whole call log.
func (d *fakeDriver) allCalls() []call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// add makes rows claimable, as a commit by another process would.
func (d *fakeDriver) add(rows ...*driver.JobRow) {
	d.mu.Lock()
	d.pending = append(d.pending, rows...)
	d.mu.Unlock()
}

// stillPending lists the ids of jobs never claimed.
func (d *fakeDriver) stillPending() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []int64
	for _, r := range d.pending {
		ids = append(ids, r.ID)
	}
	return ids
}

// heldIDs lists, sorted, the attempts claimed and neither completed nor
// released.
func (d *fakeDriver) heldIDs() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []int64
	for id := range d.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Name names the fake backend.
func (d *fakeDriver) Name() string { return "fake" }

// Capabilities offers a push channel only when listen is set.
func (d *fakeDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Listen: d.listen, OneWriter: d.one}
}

// Claim records the claim, then hands out jobs through the claim hook or
// takePending, and marks them held.
func (d *fakeDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if d.onClaim != nil {
		d.onClaim(p)
	}
	i := d.record(call{op: "claim", queue: p.Queue, limit: p.Limit})
	var out []*driver.JobRow
	var err error
	if d.claim != nil {
		out, err = d.claim(ctx, p)
	} else {
		out = d.takePending(p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(out) > 0 {
		d.claimAt = time.Now()
	}
	if d.held == nil {
		d.held = map[int64]int64{}
	}
	for _, r := range out {
		d.hold(r)
		d.calls[i].ids = append(d.calls[i].ids, r.ID)
	}
	d.calls[i].done = true
	return out, err
}

// ClaimLimited records the claim as a "claim" marked limited, then
// answers through the claimLimited hook, or as Claim does through the
// claim hook or takePending (never held),
// and marks the jobs held.
func (d *fakeDriver) ClaimLimited(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	if d.onClaim != nil {
		d.onClaim(p)
	}
	i := d.record(call{op: "claim", queue: p.Queue, limit: p.Limit, limited: true})
	var res driver.ClaimResult
	var err error
	switch {
	case d.claimLimited != nil:
		res, err = d.claimLimited(ctx, p)
	case d.claim != nil: // a queue without limits is claimed as Claim claims it
		res.Rows, err = d.claim(ctx, p)
	default:
		res.Rows = d.takePending(p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(res.Rows) > 0 {
		d.claimAt = time.Now()
	}
	if d.held == nil {
		d.held = map[int64]int64{}
	}
	for _, r := range res.Rows {
		d.hold(r)
		d.calls[i].ids = append(d.calls[i].ids, r.ID)
	}
	d.calls[i].held = res.Held
	d.calls[i].done = true
	return res, err
}

// QueueLimits answers through the queueLimits hook, or the limits set in
// d.limits, and counts the read.
func (d *fakeDriver) QueueLimits(ctx context.Context) (map[string]driver.QueueLimits, error) {
	d.limitReads.Add(1)
	if d.queueLimits != nil {
		return d.queueLimits(ctx)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]driver.QueueLimits, len(d.limits))
	for q, l := range d.limits {
		out[q] = l
	}
	return out, nil
}

// setLimits sets queue's limits as another process would (the engine
// learns it at its next read).
func (d *fakeDriver) setLimits(queue string, l driver.QueueLimits) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limits == nil {
		d.limits = map[string]driver.QueueLimits{}
	}
	if l.IsZero() {
		delete(d.limits, queue)
	} else {
		d.limits[queue] = l
	}
}

// ClaimJob records the claim of job id (its lease in dur, the worker in
// who) and answers through the claimJob hook, or takes that job from the
// pending ones; a job it hands out is held.
func (d *fakeDriver) ClaimJob(ctx context.Context, id int64, lease time.Duration, worker string) (*driver.JobRow, error) {
	d.record(call{op: "claimjob", ids: []int64{id}, dur: lease, who: worker})
	var r *driver.JobRow
	var err error
	if d.claimJob != nil {
		r, err = d.claimJob(ctx, id)
	} else {
		d.mu.Lock()
		for i, p := range d.pending {
			if p.ID == id {
				r = p
				d.pending = slices.Delete(d.pending, i, i+1)
				break
			}
		}
		d.mu.Unlock()
		if r == nil {
			err = fmt.Errorf("fake: job %d: %w", id, driver.ErrNotFound)
		}
	}
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.hold(r)
	d.mu.Unlock()
	return r, nil
}

// hold marks claimed row r held and keeps it for a release (d.mu held).
func (d *fakeDriver) hold(r *driver.JobRow) {
	if d.held == nil {
		d.held = map[int64]int64{}
	}
	if d.rows == nil {
		d.rows = map[int64]*driver.JobRow{}
	}
	d.held[r.ID] = r.Fence
	d.rows[r.ID] = r
}

// takePending removes and returns up to p.Limit pending jobs of p.Queue,
// oldest first: the default claim.
func (d *fakeDriver) takePending(p driver.ClaimParams) []*driver.JobRow {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*driver.JobRow
	rest := d.pending[:0:0]
	for _, r := range d.pending {
		if r.Queue == p.Queue && len(out) < p.Limit {
			out = append(out, r)
		} else {
			rest = append(rest, r)
		}
	}
	d.pending = rest
	return out
}

// claimsOf returns the recorded claims of queue.
func (d *fakeDriver) claimsOf(queue string) []call {
	var out []call
	for _, c := range d.callsOf("claim") {
		if c.queue == queue {
			out = append(out, c)
		}
	}
	return out
}

// idle reports whether queue's latest claim has returned, empty: with
// nothing left to wake it, the queue's fetcher is waiting for a wake-up
// or its poll timer.
func (d *fakeDriver) idle(queue string) bool {
	cs := d.claimsOf(queue)
	return len(cs) > 0 && cs[len(cs)-1].done && len(cs[len(cs)-1].ids) == 0
}

// PauseQueue is not used by the engine's loops.
func (d *fakeDriver) PauseQueue(context.Context, string, bool) error { return nil }

// RecordSchedule is not used by the engine.
func (d *fakeDriver) RecordSchedule(context.Context, driver.ScheduleRow) error { return nil }

// Schedules reports none.
func (d *fakeDriver) Schedules(context.Context) ([]driver.ScheduleRow, error) { return nil, nil }

// RegisterProcess records the registration (the row in procs, the ttl in
// dur) and answers through the registerProcess hook.
func (d *fakeDriver) RegisterProcess(_ context.Context, p driver.ProcessRow, ttl time.Duration) error {
	d.record(call{op: "register", who: p.ID, dur: ttl, procs: []driver.ProcessRow{p}})
	if d.registerProcess != nil {
		return d.registerProcess()
	}
	return nil
}

// RemoveProcess records the removal.
func (d *fakeDriver) RemoveProcess(_ context.Context, id string) error {
	d.record(call{op: "unregister", who: id})
	return nil
}

// Processes reports none.
func (d *fakeDriver) Processes(context.Context) ([]driver.ProcessRow, error) { return nil, nil }

// PruneProcesses records the age.
func (d *fakeDriver) PruneProcesses(_ context.Context, age time.Duration) (int64, error) {
	d.record(call{op: "pruneprocesses", dur: age})
	return 0, nil
}

// PruneSchedules records the call and its age; it deletes nothing.
func (d *fakeDriver) PruneSchedules(_ context.Context, age time.Duration) (int64, error) {
	d.record(call{op: "pruneschedules", dur: age})
	return 0, nil
}

// PausedQueues reports no paused queue.
func (d *fakeDriver) PausedQueues(context.Context) (map[string]time.Time, error) {
	return map[string]time.Time{}, nil
}

// Heartbeat records the renewal and answers through the heartbeat hook;
// without one every lease is still owned.
func (d *fakeDriver) Heartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	d.record(call{op: "heartbeat", leases: slices.Clone(leases), ids: owned(leases), dur: lease})
	if d.heartbeat == nil {
		return owned(leases), nil
	}
	return d.heartbeat(ctx, leases)
}

// Complete records the outcomes and answers through the complete hook;
// without one every outcome is applied. Applied ones are no longer held.
func (d *fakeDriver) Complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	d.record(call{op: "complete", ids: applied(outcomes), out: slices.Clone(outcomes)})
	var ids []int64
	var err error
	if d.complete == nil {
		ids = applied(outcomes)
	} else {
		ids, err = d.complete(ctx, outcomes)
	}
	if err == nil {
		d.mu.Lock()
		for _, id := range ids {
			delete(d.held, id)
			delete(d.rows, id)
		}
		d.mu.Unlock()
	}
	return ids, err
}

// Release records the release, lets the attempts go and counts them; a
// job a claim handed out is pending again (fence + 1) once its held
// attempt is released.
func (d *fakeDriver) Release(ctx context.Context, leases []driver.Lease) (int64, error) {
	d.record(call{op: "release", leases: slices.Clone(leases), ids: owned(leases)})
	d.mu.Lock()
	for _, l := range leases {
		fence, ok := d.held[l.ID]
		delete(d.held, l.ID)
		// Pending again under a new fence, as a database makes a
		// released job available again.
		if r := d.rows[l.ID]; ok && fence == l.Fence && r != nil {
			again := *r
			again.Fence++
			d.pending = append(d.pending, &again)
		}
		delete(d.rows, l.ID)
	}
	d.mu.Unlock()
	d.released.Add(int64(len(leases)))
	return int64(len(leases)), nil
}

// Insert records the jobs and answers through the insert hook; without
// one each job gets the next id and becomes pending.
func (d *fakeDriver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	d.record(call{op: "insert", params: slices.Clone(jobs)})
	if d.insert != nil {
		return d.insert(ctx, jobs)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		d.nextID++
		ids[i] = d.nextID
		d.pending = append(d.pending, &driver.JobRow{ID: d.nextID, Queue: j.Queue, Kind: j.Kind, Args: j.Args,
			State: driver.StateRunning, Attempt: 1, Fence: 1, MaxAttempts: max(j.MaxAttempts, 1), TimeoutMS: j.TimeoutMS})
	}
	return ids, nil
}

// InsertUnique records the call and answers through the insertUnique
// hook; without one it inserts every job without a key, and every job
// whose key no job inserted through it holds yet; the others get the
// holder's id.
func (d *fakeDriver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	d.record(call{op: "insertunique", params: slices.Clone(jobs)})
	if d.insertUnique != nil {
		return d.insertUnique(ctx, jobs)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.uniqueHolders == nil {
		d.uniqueHolders = map[string]int64{}
	}
	ids, dup := make([]int64, len(jobs)), make([]bool, len(jobs))
	for i, j := range jobs {
		if id, ok := d.uniqueHolders[string(j.UniqueKey)]; ok && j.UniqueKey != nil {
			ids[i], dup[i] = id, true
			continue
		}
		d.nextID++
		ids[i] = d.nextID
		if j.UniqueKey != nil {
			d.uniqueHolders[string(j.UniqueKey)] = d.nextID
		}
	}
	return ids, dup, nil
}

// TryLead records the attempt and answers through the tryLead hook;
// without one another process leads.
func (d *fakeDriver) TryLead(_ context.Context, id string, ttl time.Duration) (bool, error) {
	d.record(call{op: "trylead", who: id, dur: ttl})
	if d.tryLead == nil {
		return false, nil
	}
	return d.tryLead()
}

// Maintain records the call and answers through the maintain hook.
func (d *fakeDriver) Maintain(context.Context) (map[string]int, error) {
	d.record(call{op: "maintain"})
	if d.maintain == nil {
		return nil, nil
	}
	return d.maintain()
}

// Promote records the call and answers through the promote hook.
// FireBatches answers through the fireBatches hook, else fires none.
func (d *fakeDriver) FireBatches(_ context.Context, _ int, skip func(int64) bool) (map[int64]int64, error) {
	d.record(call{op: "fire"})
	if d.fireBatches == nil {
		return nil, nil
	}
	return d.fireBatches(skip)
}

func (d *fakeDriver) Promote(context.Context, int) (map[string]int, error) {
	d.record(call{op: "promote"})
	if d.promote == nil {
		return nil, nil
	}
	return d.promote()
}

// Rescue records the call and answers through the rescue hook.
func (d *fakeDriver) Rescue(context.Context, int) (map[string]int, error) {
	d.record(call{op: "rescue"})
	if d.rescue == nil {
		return nil, nil
	}
	return d.rescue()
}

// Prune records the retentions and answers through the prune hook.
func (d *fakeDriver) Prune(_ context.Context, completedAge, discardedAge time.Duration, _ int) (int64, error) {
	d.record(call{op: "prune", dur: completedAge, dur2: discardedAge})
	if d.prune == nil {
		return 0, nil
	}
	return d.prune()
}

// Listen returns a listener fed by the wakeups channel.
func (d *fakeDriver) Listen(context.Context) (driver.Listener, error) {
	return fakeListener{d.wakeups}, nil
}

// listenFailure, sent as a queue name to a fakeListener, makes its Wait
// fail (a lost connection) instead of delivering a queue.
const listenFailure = "!fail"

// fakeListener delivers the queue names the test sends on its channel.
type fakeListener struct{ ch chan string }

// Wait returns the next queue name sent, or fails on listenFailure.
func (l fakeListener) Wait(ctx context.Context) (string, error) {
	select {
	case q := <-l.ch:
		if q == listenFailure {
			return "", errors.New("listener connection lost")
		}
		return q, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Close does nothing: the channel belongs to the test.
func (l fakeListener) Close() error { return nil }

// owned returns the ids of leases: a heartbeat answer in which every lease
// is still owned.
func owned(leases []driver.Lease) []int64 {
	ids := make([]int64, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	return ids
}

// applied returns the ids of outcomes: a completion answer in which every
// outcome took effect.
func applied(outcomes []driver.Outcome) []int64 {
	ids := make([]int64, len(outcomes))
	for i, o := range outcomes {
		ids[i] = o.ID
	}
	return ids
}

// testConfig is a configuration for one queue "q" of 4 workers with the
// given lease, short polls, and maintenance that never runs.
func testConfig(lease time.Duration) Config {
	return Config{
		Queues:            map[string]int{"q": 4},
		ClaimBatch:        10,
		CompleteBatch:     10,
		InsertBatch:       10,
		Lease:             lease,
		HeartbeatInterval: lease / 3,
		PollMin:           5 * time.Millisecond,
		PollMax:           20 * time.Millisecond,
		ListenPoll:        time.Second,
		PromoteInterval:   time.Hour,
		RescueInterval:    time.Hour,
		PruneInterval:     time.Hour,
		ShutdownTimeout:   time.Second,
		Backoff:           func(int) time.Duration { return time.Millisecond },
	}
}

// job is attempt 1 of job id of kind "k" in queue "q", fenced by 7.
func job(id int64) *driver.JobRow {
	return &driver.JobRow{ID: id, Queue: "q", Kind: "k", State: driver.StateRunning, Attempt: 1, Fence: 7, MaxAttempts: 5}
}

// jobIn is attempt 1 of job id of kind "k" in queue, fenced by fence.
func jobIn(queue string, id, fence int64) *driver.JobRow {
	r := job(id)
	r.Queue, r.Fence = queue, fence
	return r
}

// jobs returns jobs 1 to n of queue "q", each fenced by 100 plus its id.
func jobs(n int) []*driver.JobRow {
	out := make([]*driver.JobRow, n)
	for i := range out {
		out[i] = jobIn("q", int64(i+1), int64(101+i))
	}
	return out
}

// guard is how long a test waits for something that should happen within
// milliseconds before it declares the engine stuck: a failure guard only,
// generous for a loaded machine.
const guard = 10 * time.Second

// waitFor polls cond until it holds, failing the test after guard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv receives from ch, failing the test after guard.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// startEngine creates and starts an engine on d and closes it when the
// test ends (closing twice is harmless).
func startEngine(t *testing.T, d *fakeDriver, cfg Config, handlers map[string]Handler) *Engine {
	t.Helper()
	e := New(d, cfg, handlers)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// stopAsync calls e.Stop in a goroutine and returns a channel receiving
// its result.
func stopAsync(e *Engine) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- e.Stop(context.Background()) }()
	return ch
}

// completedIDs lists, in write order, the ids of outcomes the fake
// accepted with state completed, by reading the completion calls (with the
// default complete hook every outcome is accepted).
func completedIDs(d *fakeDriver) []int64 {
	var ids []int64
	for _, c := range d.callsOf("complete") {
		for _, o := range c.out {
			if o.State == driver.StateCompleted {
				ids = append(ids, o.ID)
			}
		}
	}
	return ids
}

// idSet formats ids sorted, for messages and comparisons.
func idSet(ids []int64) string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return fmt.Sprint(s)
}
