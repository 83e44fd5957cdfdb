package engine

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// errBoom is the database failure the fake driver reports when told to.
var errBoom = errors.New("boom: the database is unreachable")

// heldBy lists, sorted, the attempts whose lease queue's fetcher holds.
func heldBy(e *Engine, queue string) []int64 {
	f := e.fetchers[queue]
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []int64
	for id := range f.leases {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Outcomes that queue up while a write is in progress are written
// together, in batches of at most CompleteBatch sorted by job id, and
// each exactly once.
func TestCompleterBatchesOutcomes(t *testing.T) {
	const n = 8
	d := &fakeDriver{}
	d.add(jobs(n)...)
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": n}
	cfg.CompleteBatch = 3
	first, gate := make(chan struct{}), make(chan struct{})
	var writes atomic.Int64
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		if writes.Add(1) == 1 {
			close(first)
			<-gate
		}
		return applied(outs), nil
	}
	rest := make(chan struct{})
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		if row.ID != 1 {
			<-rest
		}
		return nil
	}})
	recv(t, "the first write", first)
	close(rest)
	waitFor(t, "the other outcomes queued behind the first write", func() bool { return len(e.comp.in) == n-1 })
	close(gate)
	waitFor(t, "every outcome written", func() bool { return e.Metrics().Completed.Load() == n })
	cs := d.callsOf("complete")
	if !slices.Equal(cs[0].ids, []int64{1}) {
		t.Fatalf("first write %v, want [1]", cs[0].ids)
	}
	if len(cs[1].ids) != cfg.CompleteBatch {
		t.Fatalf("second write carried %d outcomes, want a full batch of %d from the %d queued", len(cs[1].ids), cfg.CompleteBatch, n-1)
	}
	var all []int64
	for _, c := range cs {
		if len(c.ids) > cfg.CompleteBatch || !slices.IsSorted(c.ids) {
			t.Fatalf("write %v: want at most %d outcomes sorted by id", c.ids, cfg.CompleteBatch)
		}
		all = append(all, c.ids...)
	}
	if want := "[1 2 3 4 5 6 7 8]"; idSet(all) != want || len(all) != n {
		t.Fatalf("outcomes written %v, want each of %s once", all, want)
	}
	if len(cs) >= n {
		t.Fatalf("%d writes for %d outcomes: nothing was batched", len(cs), n)
	}
}

// A write of outcomes that fails is retried with the same outcomes until
// it succeeds: no outcome is lost, none is written twice, and until then
// the attempts keep their leases (none is released at shutdown).
func TestCompleterRetriesFailedWrite(t *testing.T) {
	const n = 3
	d := &fakeDriver{}
	d.add(jobs(n)...)
	var writes atomic.Int64
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		if writes.Add(1) <= 2 {
			return nil, errBoom
		}
		return applied(outs), nil
	}
	e := startEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "every outcome written", func() bool { return e.Metrics().Completed.Load() == n })
	cs := d.callsOf("complete")
	if len(cs) < 3 {
		t.Fatalf("%d writes, want the two failures and a success", len(cs))
	}
	if !slices.Equal(cs[1].ids, cs[0].ids) || !slices.Equal(cs[2].ids, cs[0].ids) {
		t.Fatalf("writes %v, %v, %v: a failed batch must be retried as it was", cs[0].ids, cs[1].ids, cs[2].ids)
	}
	var ok []int64
	for _, c := range cs[2:] {
		ok = append(ok, c.ids...)
	}
	if idSet(ok) != "[1 2 3]" || len(ok) != n {
		t.Fatalf("outcomes written successfully %v, want each of 1, 2, 3 once", ok)
	}
	if got := e.Metrics().DBErrors.Load(); got != 2 {
		t.Fatalf("db_errors %d, want 2", got)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := d.released.Load(); r != 0 || len(d.heldIDs()) != 0 {
		t.Fatalf("released %d, still held %v: every outcome should have been written", r, d.heldIDs())
	}
}

// An outcome the database refuses (the attempt no longer owns the job)
// is dropped: not retried, not counted as completed but as a stale
// acknowledgement, and its lease is let go. A failed attempt's applied
// outcome is not counted as completed either.
func TestCompleterDropsRefusedOutcomes(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobs(3)...)
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		var ids []int64
		for _, o := range outs {
			if o.ID != 2 { // job 2 was taken by another attempt
				ids = append(ids, o.ID)
			}
		}
		return ids, nil
	}
	e := startEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		if row.ID == 3 {
			return errors.New("handler failed")
		}
		return nil
	}})
	written := func() []int64 {
		var ids []int64
		for _, c := range d.callsOf("complete") {
			ids = append(ids, c.ids...)
		}
		return ids
	}
	waitFor(t, "every outcome written and settled", func() bool {
		return len(written()) == 3 && e.Metrics().StaleAcksRefused.Load() == 1 && len(heldBy(e, "q")) == 0
	})
	if ids := written(); idSet(ids) != "[1 2 3]" {
		t.Fatalf("outcomes sent %v, want each of 1, 2, 3 once (a refused one is not retried)", ids)
	}
	if got := e.Metrics().Completed.Load(); got != 1 {
		t.Fatalf("completed %d, want 1: job 2's outcome was refused and job 3 failed", got)
	}
	if got := e.Metrics().Failed.Load(); got != 1 {
		t.Fatalf("failed %d, want 1", got)
	}
	for _, c := range d.callsOf("complete") {
		for _, o := range c.out {
			if o.ID == 3 && o.State != driver.StateRetryable {
				t.Fatalf("job 3's outcome %+v, want retryable", o)
			}
		}
	}
	// Time for a retry of the refused outcome, were it wrongly retried.
	time.Sleep(20 * time.Millisecond)
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := written(); len(ids) != 3 {
		t.Fatalf("outcomes sent %v, want 3: a refused outcome is not retried", ids)
	}
	if r := d.released.Load(); r != 0 {
		t.Fatalf("%d leases released at shutdown, want 0: every attempt was settled", r)
	}
}

// A write that fails after the driver committed part of the batch (a
// backend whose outcomes take more than one statement: MySQL's parts,
// PostgreSQL's second pass over every running segment) reports the
// outcomes it applied with its error. The completer keeps them as
// applied and writes only the rest again: written again, an applied
// outcome is refused by its fence (the job no longer runs), and a remote
// worker whose completion was applied was answered that its lease was
// lost, a stale acknowledgement was counted, and the completion was not.
func TestCompleterKeepsOutcomesAppliedBeforeAnError(t *testing.T) {
	d := &fakeDriver{}
	done := map[int64]bool{} // what the database applied
	var writes atomic.Int64
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		var ids []int64
		for _, o := range outs {
			if !done[o.ID] {
				done[o.ID] = true
				ids = append(ids, o.ID)
			}
		}
		if writes.Add(1) == 1 {
			return ids, errBoom // committed, then the connection broke
		}
		return ids, nil
	}
	cfg := testConfig(10 * time.Second)
	e := startEngine(t, d, cfg, nil)
	if err := e.CompleteRemote(context.Background(), 7, 1, nil); err != nil {
		t.Fatalf("a completion applied before the write failed: %v", err)
	}
	m := e.Metrics()
	if m.Completed.Load() != 1 || m.StaleAcksRefused.Load() != 0 {
		t.Fatalf("completed %d, stale acknowledgements %d; want 1 and 0", m.Completed.Load(), m.StaleAcksRefused.Load())
	}
	for _, c := range d.callsOf("complete")[1:] {
		if slices.Contains(c.ids, 7) {
			t.Fatalf("the applied outcome was written again: %v", c.ids)
		}
	}
}

// While attempts end one after another, the writer waits for more
// outcomes before it writes a batch that is not full, as long as its last
// write took: outcomes that end one by one after a write go out together
// in the next.
func TestCompleterGathersOutcomes(t *testing.T) {
	const n = 4
	d := &fakeDriver{}
	d.add(jobs(n)...)
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": n}
	cfg.CompleteBatch = 3
	var writes atomic.Int64
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		if writes.Add(1) == 1 {
			// The last write's duration bounds the wait: far longer than
			// the next outcomes take to end.
			time.Sleep(2 * time.Second)
		}
		return applied(outs), nil
	}
	next := make([]chan struct{}, n+1)
	for i := range next {
		next[i] = make(chan struct{})
	}
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		<-next[row.ID]
		return nil
	}})
	// A bound on the wait no test machine reaches (maxGather otherwise).
	e.comp.gather.Store(int64(time.Hour))
	waitFor(t, "the limits read", func() bool { return e.limits.Load() != nil })
	close(next[1])
	waitFor(t, "the first write", func() bool { return e.Metrics().Completed.Load() == 1 })
	for id := 2; id <= n; id++ {
		close(next[id])
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "every outcome written", func() bool { return e.Metrics().Completed.Load() == n })
	cs := d.callsOf("complete")
	if len(cs) != 2 || !slices.Equal(cs[1].ids, []int64{2, 3, 4}) {
		var got [][]int64
		for _, c := range cs {
			got = append(got, c.ids)
		}
		t.Fatalf("writes %v; want [1] then [2 3 4]", got)
	}
}

// The writer does not wait for more outcomes when a queue may be limited
// (its outcomes free slots other attempts wait for), on a database with
// one writer, when the batch holds a remote worker's outcome (its caller
// waits for the answer), before its first write, or once it is closing.
func TestCompleterGatherFor(t *testing.T) {
	d := &fakeDriver{}
	e := startEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	waitFor(t, "the limits read", func() bool { return e.limits.Load() != nil })
	c := e.comp
	f := e.fetchers["q"]
	local, remote := []pending{{f: f}}, []pending{{f: f}, {res: make(chan written, 1)}}
	last := time.Millisecond
	if got := c.gatherFor(local, last); got != last {
		t.Fatalf("local outcomes after a write of %v: wait %v, want %v", last, got, last)
	}
	if got := c.gatherFor(local, time.Hour); got != maxGather {
		t.Fatalf("after a write of an hour: wait %v, want the bound %v", got, maxGather)
	}
	for name, got := range map[string]time.Duration{
		"before the first write": c.gatherFor(local, 0),
		"a remote outcome":       c.gatherFor(remote, last),
	} {
		if got != 0 {
			t.Fatalf("%s: wait %v, want none", name, got)
		}
	}
	e.oneWriter = true
	if got := c.gatherFor(local, last); got != 0 {
		t.Fatalf("one writer: wait %v, want none", got)
	}
	e.oneWriter = false
	d.setLimits("q", driver.QueueLimits{MaxRunning: 3})
	if err := e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the limits read again", func() bool { return e.anyLimited() })
	if got := c.gatherFor(local, last); got != 0 {
		t.Fatalf("a limited queue: wait %v, want none", got)
	}
}
