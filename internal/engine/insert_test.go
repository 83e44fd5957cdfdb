package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// insertResult is what one Insert call returned.
type insertResult struct {
	ids []int64
	err error
}

// byPriority makes the fake's inserts answer each job with id 1000 plus
// its priority, so that a caller can tell its own ids; the first insert
// waits until gate is closed, after closing first. fail, when set, is the
// error of insert number failCall.
func byPriority(d *fakeDriver, first, gate chan struct{}, failCall int64, fail error) {
	var n atomic.Int64
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		k := n.Add(1)
		if k == 1 {
			close(first)
			<-gate
		}
		if k == failCall {
			return nil, fail
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, nil
	}
}

// enqueue calls e.Insert in a goroutine with one job per priority and
// returns a channel receiving its result.
func enqueue(e *Engine, prios ...int) <-chan insertResult {
	ps := make([]driver.InsertParams, len(prios))
	for i, p := range prios {
		ps[i] = driver.InsertParams{Queue: "q", Kind: "k", Priority: p}
	}
	ch := make(chan insertResult, 1)
	go func() {
		ids, _, err := e.Insert(context.Background(), ps)
		ch <- insertResult{ids, err}
	}()
	return ch
}

// priorities lists the priorities of one recorded insert call.
func priorities(c call) []int {
	out := make([]int, len(c.params))
	for i, p := range c.params {
		out[i] = p.Priority
	}
	return out
}

// Enqueues that arrive while an insert is in progress are written
// together, whole callers at a time up to InsertBatch jobs, and each
// caller gets the ids of its own jobs, in order.
func TestInserterBatchesEnqueues(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	byPriority(d, first, gate, 0, nil)
	cfg := testConfig(time.Second)
	cfg.InsertBatch = 4
	e := New(d, cfg, nil) // enqueueing needs no Start
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	// Queue the next callers in a known order behind the first insert.
	b := enqueue(e, 2, 3)
	waitFor(t, "caller b queued", func() bool { return len(e.ins.plain.in) == 1 })
	c := enqueue(e, 4, 5)
	waitFor(t, "caller c queued", func() bool { return len(e.ins.plain.in) == 2 })
	dd := enqueue(e, 6, 7)
	waitFor(t, "caller d queued", func() bool { return len(e.ins.plain.in) == 3 })
	close(gate)
	for _, w := range []struct {
		name string
		ch   <-chan insertResult
		want []int64
	}{{"a", a, []int64{1001}}, {"b", b, []int64{1002, 1003}}, {"c", c, []int64{1004, 1005}}, {"d", dd, []int64{1006, 1007}}} {
		r := recv(t, "caller "+w.name, w.ch)
		if r.err != nil || !slices.Equal(r.ids, w.want) {
			t.Fatalf("caller %s got %v, %v; want %v", w.name, r.ids, r.err, w.want)
		}
	}
	var got [][]int
	for _, c := range d.callsOf("insert") {
		got = append(got, priorities(c))
	}
	// b and c fill a batch of 4; d waits for the next one.
	if want := [][]int{{1}, {2, 3, 4, 5}, {6, 7}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("insert statements %v, want %v", got, want)
	}
}

// The callers of one write return together and call again one after
// another: the writer waits (up to half the last write's duration) to
// gather as many callers as the last batch had, so that the first of them
// is not written on its own with the others behind it.
func TestInserterGathersAsManyCallersAsLastBatch(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	second, gate2 := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		switch n.Add(1) {
		case 1:
			close(first)
			<-gate
		case 2:
			close(second)
			<-gate2
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, nil
	}
	e := New(d, testConfig(time.Second), nil)
	e.ins.gather.Store(int64(time.Minute))
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	var chs []<-chan insertResult
	for k, p := range []int{2, 3, 4} {
		chs = append(chs, enqueue(e, p))
		waitFor(t, "a caller queued", func() bool { return e.QueuedInserts() == k+1 })
	}
	close(gate)
	recv(t, "the second insert", second)
	// The second write (three callers) lasts long enough that half of it
	// outlasts the pauses between the next callers below.
	time.Sleep(time.Second)
	close(gate2)
	recv(t, "caller a", a)
	for _, ch := range chs {
		recv(t, "a caller of the second batch", ch)
	}
	// Three callers one after another, with pauses in which a writer that
	// did not wait would write what it had.
	for _, p := range []int{5, 6, 7} {
		chs = append(chs, enqueue(e, p))
		waitFor(t, "the caller taken", func() bool { return e.QueuedInserts() == 0 })
		time.Sleep(20 * time.Millisecond)
	}
	for _, ch := range chs[3:] {
		if r := recv(t, "a caller of the third batch", ch); r.err != nil || len(r.ids) != 1 {
			t.Fatalf("a caller of the third batch got %v, %v", r.ids, r.err)
		}
	}
	var got [][]int
	for _, c := range d.callsOf("insert") {
		got = append(got, priorities(c))
	}
	if want := [][]int{{1}, {2, 3, 4}, {5, 6, 7}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("insert statements %v, want %v", got, want)
	}
}

// When a batch's insert fails and the driver cannot tell whether it
// committed (a connection lost at commit), every caller of that batch gets
// the error, which says its jobs may exist, and nothing is written again
// (a retry could insert them twice); the callers of other batches are
// unaffected, and an enqueue after Close is refused.
func TestInserterErrorReachesEveryCallerOfBatch(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	byPriority(d, first, gate, 2, errBoom)
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	b := enqueue(e, 2)
	waitFor(t, "caller b queued", func() bool { return len(e.ins.plain.in) == 1 })
	c := enqueue(e, 3, 4)
	waitFor(t, "caller c queued", func() bool { return len(e.ins.plain.in) == 2 })
	close(gate)
	if r := recv(t, "caller a", a); r.err != nil || !slices.Equal(r.ids, []int64{1001}) {
		t.Fatalf("caller a of the first batch got %v, %v; want [1001]", r.ids, r.err)
	}
	for name, ch := range map[string]<-chan insertResult{"b": b, "c": c} {
		if r := recv(t, "caller "+name, ch); !errors.Is(r.err, errBoom) || r.ids != nil || !strings.Contains(r.err.Error(), "may exist") {
			t.Fatalf("caller %s of the failed batch got %v, %v; want the insert's error, saying the jobs may exist", name, r.ids, r.err)
		}
	}
	if r := recv(t, "a caller after the failure", enqueue(e, 5)); r.err != nil || !slices.Equal(r.ids, []int64{1005}) {
		t.Fatalf("caller after the failed batch got %v, %v; want [1005]", r.ids, r.err)
	}
	if n := d.count("insert"); n != 3 {
		t.Fatalf("%d insert statements, want 3: a batch that may have committed is not written again", n)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k"}}); !errors.Is(err, ErrStopped) {
		t.Fatalf("enqueue after Close: %v, want ErrStopped", err)
	}
}

// errBadRow is a row the database refuses: the statement, and so its
// whole transaction, fails and commits nothing.
var errBadRow = errors.New("the database refused a row")

// poisoned reports whether jobs include one of priority 66 (a bad row) or
// with unique key "poison".
func poisoned(jobs []driver.InsertParams) bool {
	return slices.ContainsFunc(jobs, func(j driver.InsertParams) bool { return j.Priority == 66 || string(j.UniqueKey) == "poison" })
}

// rejectPoison makes the fake refuse, with nothing committed, every
// insert that holds a poisoned job; the first insert waits until gate is
// closed, after closing first. Inserted jobs get 1000 plus their priority.
func rejectPoison(d *fakeDriver, first, gate chan struct{}) {
	var n atomic.Int64
	ids := func(ps []driver.InsertParams) []int64 {
		out := make([]int64, len(ps))
		for i, p := range ps {
			out[i] = int64(1000 + p.Priority)
		}
		return out
	}
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		if n.Add(1) == 1 {
			close(first)
			<-gate
		}
		if poisoned(ps) {
			return nil, driver.NotCommitted(errBadRow)
		}
		return ids(ps), nil
	}
	d.insertUnique = func(_ context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
		if poisoned(ps) {
			return nil, nil, driver.NotCommitted(errBadRow)
		}
		return ids(ps), make([]bool, len(ps)), nil
	}
}

// enqueueJobs calls e.Insert with jobs in a goroutine and returns a
// channel receiving its result.
func enqueueJobs(ctx context.Context, e *Engine, jobs ...driver.InsertParams) <-chan insertResult {
	ch := make(chan insertResult, 1)
	go func() {
		ids, _, err := e.Insert(ctx, jobs)
		ch <- insertResult{ids, err}
	}()
	return ch
}

// A bad row in one caller's jobs fails the insert of the batch, which
// commits nothing; every caller is then written again on its own, so that
// the others' jobs are inserted and only that caller gets the error, all
// of its jobs refused with the bad one.
func TestInserterIsolatesCallerAfterNothingCommitted(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	rejectPoison(d, first, gate)
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	b := enqueue(e, 2)
	waitFor(t, "caller b queued", func() bool { return e.QueuedInserts() == 1 })
	c := enqueue(e, 66, 3)
	waitFor(t, "caller c queued", func() bool { return e.QueuedInserts() == 2 })
	dd := enqueue(e, 4, 5)
	waitFor(t, "caller d queued", func() bool { return e.QueuedInserts() == 3 })
	close(gate)
	for _, w := range []struct {
		name string
		ch   <-chan insertResult
		want []int64
	}{{"a", a, []int64{1001}}, {"b", b, []int64{1002}}, {"d", dd, []int64{1004, 1005}}} {
		if r := recv(t, "caller "+w.name, w.ch); r.err != nil || !slices.Equal(r.ids, w.want) {
			t.Fatalf("caller %s got %v, %v; want %v", w.name, r.ids, r.err, w.want)
		}
	}
	if r := recv(t, "caller c", c); !errors.Is(r.err, errBadRow) || r.ids != nil || !strings.Contains(r.err.Error(), "none was inserted") {
		t.Fatalf("caller c, with the bad row, got %v, %v; want the row's error saying none was inserted", r.ids, r.err)
	}
	var got [][]int
	for _, c := range d.callsOf("insert") {
		got = append(got, priorities(c))
	}
	if want := [][]int{{1}, {2, 66, 3, 4, 5}, {2}, {66, 3}, {4, 5}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("insert statements %v, want %v", got, want)
	}
}

// Plain and unique callers are written by two writers, each caller's jobs
// in one transaction: while a unique insert waits (for a key an
// application's open transaction holds), plain callers are written and
// get their ids, and the unique callers queued meanwhile are written
// together after it; when their transaction fails, each call with unique
// jobs commits whole or not at all.
func TestInserterMixedBatchTellsEachCaller(t *testing.T) {
	u := func(key string, prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", Priority: prio, UniqueKey: []byte(key)}
	}
	p := func(prio int) driver.InsertParams { return driver.InsertParams{Queue: "q", Kind: "k", Priority: prio} }
	for _, tc := range []struct {
		name    string
		fail    error // the error of the transaction of unique jobs
		isolate bool  // whether its callers are written again one by one
	}{
		{"nothing committed", driver.NotCommitted(errBadRow), true},
		{"outcome unknown", errBoom, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDriver{}
			first, gate := make(chan struct{}), make(chan struct{})
			rejectPoison(d, nil, nil) // for its insertUnique; insert is below
			d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
				if poisoned(ps) {
					return nil, driver.NotCommitted(errBadRow)
				}
				ids := make([]int64, len(ps))
				for i, p := range ps {
					ids[i] = int64(1000 + p.Priority)
				}
				return ids, nil
			}
			unique := d.insertUnique
			var n atomic.Int64
			d.insertUnique = func(ctx context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
				switch {
				case n.Add(1) == 1: // the unique insert that waits for a lock
					close(first)
					<-gate
				case !tc.isolate:
					return nil, nil, tc.fail
				}
				return unique(ctx, ps)
			}
			e := New(d, testConfig(time.Second), nil)
			e.OneUniqueLane() // the unique callers queue behind the first
			t.Cleanup(func() { e.Close(context.Background()) })
			ctx := context.Background()
			a := enqueueJobs(ctx, e, u("held", 1))
			recv(t, "the first unique insert", first)
			// Awaited before the gate opens: a plain caller does not wait
			// behind the unique insert.
			if r := recv(t, "the plain caller", enqueueJobs(ctx, e, p(2))); r.err != nil || !slices.Equal(r.ids, []int64{1002}) {
				t.Fatalf("the plain caller got %v, %v; want its committed job [1002]", r.ids, r.err)
			}
			good := enqueueJobs(ctx, e, u("k1", 3), p(4))
			waitFor(t, "the unique caller queued", func() bool { return e.QueuedInserts() == 1 })
			bad := enqueueJobs(ctx, e, p(5), u("poison", 6))
			waitFor(t, "the poisoned caller queued", func() bool { return e.QueuedInserts() == 2 })
			close(gate)
			if r := recv(t, "caller a", a); r.err != nil || !slices.Equal(r.ids, []int64{1001}) {
				t.Fatalf("caller a got %v, %v; want [1001]", r.ids, r.err)
			}
			rg, rb := recv(t, "the unique caller", good), recv(t, "the poisoned caller", bad)
			if tc.isolate {
				if rg.err != nil || !slices.Equal(rg.ids, []int64{1003, 1004}) {
					t.Fatalf("the unique caller got %v, %v; want [1003 1004]", rg.ids, rg.err)
				}
				if !errors.Is(rb.err, errBadRow) || !strings.Contains(rb.err.Error(), "none was inserted") {
					t.Fatalf("the poisoned caller got %v, %v; want the bad row's error", rb.ids, rb.err)
				}
			} else {
				for _, r := range []insertResult{rg, rb} {
					if !errors.Is(r.err, errBoom) || !strings.Contains(r.err.Error(), "may exist") {
						t.Fatalf("a caller of the transaction whose outcome is unknown got %v, %v; want its error saying the jobs may exist", r.ids, r.err)
					}
				}
			}
			// Each call's plain and unique jobs went to the database
			// together, in the same transaction.
			var got [][]int
			for _, c := range d.callsOf("insertunique") {
				got = append(got, priorities(c))
			}
			want := [][]int{{1}, {3, 4, 5, 6}}
			if tc.isolate {
				want = append(want, []int{3, 4}, []int{5, 6})
			}
			if !slices.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("InsertUnique calls %v, want %v", got, want)
			}
			if n := d.count("insert"); n != 1 {
				t.Fatalf("%d plain inserts, want 1 (the plain caller's)", n)
			}
		})
	}
}

// Close returns once both writers have written every call queued: the
// unique callers queued behind a unique insert that waits, and a plain
// caller queued behind a plain write in progress; an enqueue after it
// starts is refused.
func TestInserterCloseFlushesBothWriters(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	plainFirst, plainGate := make(chan struct{}), make(chan struct{})
	var n, m atomic.Int64
	d.insertUnique = func(_ context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
		if n.Add(1) == 1 {
			close(first)
			<-gate
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, make([]bool, len(ps)), nil
	}
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		if m.Add(1) == 1 {
			close(plainFirst)
			<-plainGate
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, nil
	}
	e := New(d, testConfig(time.Second), nil)
	e.OneUniqueLane() // the unique callers queue behind the first
	ctx := context.Background()
	u := func(key string, prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", Priority: prio, UniqueKey: []byte(key)}
	}
	a := enqueueJobs(ctx, e, u("a", 1))
	recv(t, "the first unique insert", first)
	b := enqueueJobs(ctx, e, u("b", 2))
	waitFor(t, "the second unique caller queued", func() bool { return e.QueuedInserts() == 1 })
	p1 := enqueue(e, 3)
	recv(t, "the first plain insert", plainFirst)
	p2 := enqueue(e, 4)
	waitFor(t, "the second plain caller queued", func() bool { return e.QueuedInserts() == 2 })
	closed := make(chan error, 1)
	go func() { closed <- e.Close(ctx) }()
	waitFor(t, "Close taking no more enqueues", func() bool {
		e.ins.mu.RLock()
		defer e.ins.mu.RUnlock()
		return e.ins.shut
	})
	if _, _, err := e.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k"}}); !errors.Is(err, ErrStopped) {
		t.Fatalf("an enqueue while closing: %v, want ErrStopped", err)
	}
	close(plainGate)
	for name, ch := range map[string]<-chan insertResult{"p1": p1, "p2": p2} {
		if r := recv(t, "plain caller "+name, ch); r.err != nil || len(r.ids) != 1 {
			t.Fatalf("plain caller %s got %v, %v", name, r.ids, r.err)
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while unique callers were still to be written", err)
	default:
	}
	close(gate)
	for name, ch := range map[string]<-chan insertResult{"a": a, "b": b} {
		if r := recv(t, "unique caller "+name, ch); r.err != nil || len(r.ids) != 1 {
			t.Fatalf("unique caller %s got %v, %v", name, r.ids, r.err)
		}
	}
	if err := recv(t, "Close", closed); err != nil {
		t.Fatal(err)
	}
}

// After a batch that committed nothing, a caller that has already given
// up (its context ended: it was told its jobs may or may not exist) is not
// written again.
func TestInserterSkipsCallerThatGaveUp(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	rejectPoison(d, first, gate)
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	ctx, cancel := context.WithCancel(context.Background())
	gone := enqueueJobs(ctx, e, driver.InsertParams{Queue: "q", Kind: "k", Priority: 7})
	waitFor(t, "the caller queued", func() bool { return e.QueuedInserts() == 1 })
	bad := enqueue(e, 66)
	waitFor(t, "the bad caller queued", func() bool { return e.QueuedInserts() == 2 })
	cancel()
	if r := recv(t, "the caller that gave up", gone); !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "may or may not exist") {
		t.Fatalf("the caller that gave up got %v, %v", r.ids, r.err)
	}
	close(gate)
	recv(t, "caller a", a)
	if r := recv(t, "the bad caller", bad); !errors.Is(r.err, errBadRow) {
		t.Fatalf("the bad caller got %v, %v", r.ids, r.err)
	}
	var got [][]int
	for _, c := range d.callsOf("insert") {
		got = append(got, priorities(c))
	}
	if want := [][]int{{1}, {7, 66}, {66}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("insert statements %v, want %v: the caller that gave up is not written again", got, want)
	}
}

// A call mixing plain and unique jobs is one InsertUnique, one
// transaction; a unique job whose key an earlier job of the call has is
// that job's duplicate without reaching the driver, and the caller gets
// its ids and flags in order. EnqueueBulk with unique jobs is one
// transaction too.
func TestInsertMixedCallIsOneTransaction(t *testing.T) {
	d := &fakeDriver{}
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	u := func(key string) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", UniqueKey: []byte(key)}
	}
	plain := driver.InsertParams{Queue: "q", Kind: "k"}
	ids, dup, err := e.Insert(context.Background(), []driver.InsertParams{u("a"), plain, u("a"), u("b"), plain})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dup, []bool{false, false, true, false, false}) || ids[2] != ids[0] || ids[3] == ids[0] || ids[1] == ids[4] {
		t.Fatalf("ids %v dup %v", ids, dup)
	}
	if calls := d.callsOf("insertunique"); len(calls) != 1 || len(calls[0].params) != 4 {
		t.Fatalf("InsertUnique calls %v, want one with the 2 plain jobs and the 2 distinct keys", calls)
	}
	if n := d.count("insert"); n != 0 {
		t.Fatalf("%d plain inserts, want none: the call is one transaction", n)
	}
	// The key is held now: a later enqueue is a duplicate of the holder.
	again, dup, err := e.Insert(context.Background(), []driver.InsertParams{u("b")})
	if err != nil || !dup[0] || again[0] != ids[3] {
		t.Fatalf("again: ids %v dup %v err %v", again, dup, err)
	}
	// EnqueueBulk: one InsertUnique (the fake has no BulkInsert), counting
	// the jobs inserted.
	n, err := e.BulkInsert(context.Background(), []driver.InsertParams{plain, u("b"), u("c"), u("c"), plain})
	if err != nil || n != 3 {
		t.Fatalf("bulk: %d, %v; want 3 inserted (2 plain, c)", n, err)
	}
	if calls := d.callsOf("insertunique"); len(calls) != 3 || len(calls[2].params) != 4 {
		t.Fatalf("InsertUnique calls %v, want the bulk's 4 distinct jobs in one", calls)
	}
	// In a transaction, the same, with the caller's transaction.
	if _, _, err := e.InsertTx(context.Background(), nil, []driver.InsertParams{plain}); !errors.Is(err, driver.ErrTxType) {
		t.Fatalf("nil transaction: %v, want ErrTxType", err)
	}
}

// A unique caller waiting for a lock does not hold up the unique callers
// of other keys, which go to another lane; a caller with the waiting
// call's key goes to its lane, behind it, and so does the next caller of
// a key that caller also has.
func TestInserterUniqueLanes(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	d.insertUnique = func(_ context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
		if n.Add(1) == 1 {
			close(first)
			<-gate
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, make([]bool, len(ps)), nil
	}
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	ctx := context.Background()
	u := func(key string, prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", Priority: prio, UniqueKey: []byte(key)}
	}
	a := enqueueJobs(ctx, e, u("held", 1))
	recv(t, "the first unique insert", first)
	time.Sleep(2 * laneStall) // its lane is stalled: new calls of other keys go to another
	for k := range 2 * uniqueLanes {
		r := recv(t, "a unique caller of another key", enqueueJobs(ctx, e, u(fmt.Sprintf("other%d", k), 10+k)))
		if r.err != nil || !slices.Equal(r.ids, []int64{int64(1010 + k)}) {
			t.Fatalf("a unique caller of another key while one waits got %v, %v; want it written", r.ids, r.err)
		}
	}
	same := enqueueJobs(ctx, e, u("x", 2), u("held", 3))
	waitFor(t, "the caller with the held key queued", func() bool { return e.QueuedInserts() == 1 })
	next := enqueueJobs(ctx, e, u("x", 4))
	waitFor(t, "the caller with its other key queued", func() bool { return e.QueuedInserts() == 2 })
	select {
	case r := <-same:
		t.Fatalf("a caller with the held key returned %v, %v before the held one", r.ids, r.err)
	default:
	}
	close(gate)
	for name, ch := range map[string]<-chan insertResult{"held": a, "same": same, "next": next} {
		if r := recv(t, "caller "+name, ch); r.err != nil {
			t.Fatalf("caller %s: %v", name, r.err)
		}
	}
	// The lanes forget a call just after telling its caller.
	waitFor(t, "the lanes to count no call", func() bool {
		e.ins.lanesMu.Lock()
		defer e.ins.lanesMu.Unlock()
		return len(e.ins.lanes) == 0 && !slices.ContainsFunc(e.ins.load, func(n int) bool { return n != 0 })
	})
}

// A call whose unique keys have unwritten calls in two lanes is not
// written in one of them while the other lane still has an unwritten
// call of one of its keys: in the database the two writes would wait for
// each other (and two such calls with their keys in opposite orders
// would deadlock). It waits until its keys are in at most one lane, and
// goes there; a later call of a key it waits for goes behind it.
func TestInserterCallSpanningLanes(t *testing.T) {
	d := &fakeDriver{}
	gates := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	in := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	var mu sync.Mutex
	flying := map[string]int{} // key -> writes in progress with it
	seen := map[string]bool{}
	var overlap atomic.Value
	d.insertUnique = func(_ context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
		var keys []string
		var block string
		mu.Lock()
		for _, p := range ps {
			k := string(p.UniqueKey)
			if flying[k] > 0 {
				overlap.Store(fmt.Sprintf("key %s written by two lanes at once", k))
			}
			flying[k]++
			keys = append(keys, k)
			if !seen[k] {
				seen[k], block = true, k
			}
		}
		mu.Unlock()
		if block != "" {
			close(in[block])
			<-gates[block]
		}
		mu.Lock()
		for _, k := range keys {
			flying[k]--
		}
		mu.Unlock()
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(1000 + p.Priority)
		}
		return ids, make([]bool, len(ps)), nil
	}
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	release := openOnce(t, gates["a"], gates["b"])
	ctx := context.Background()
	u := func(key string, prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", Priority: prio, UniqueKey: []byte(key)}
	}
	c1 := enqueueJobs(ctx, e, u("a", 1))
	recv(t, "the write of a", in["a"])
	time.Sleep(2 * laneStall) // its lane is stalled: new calls of other keys go to another
	c2 := enqueueJobs(ctx, e, u("b", 2))
	recv(t, "the write of b in another lane", in["b"])
	c3 := enqueueJobs(ctx, e, u("a", 3), u("b", 4))
	waitFor(t, "the call with both keys queued or waiting", func() bool { return e.QueuedInserts()+spanWaiting(e) == 1 })
	c4 := enqueueJobs(ctx, e, u("b", 5))
	waitFor(t, "the next call of b queued or waiting", func() bool { return e.QueuedInserts()+spanWaiting(e) == 2 })
	release[0]()
	if r := recv(t, "the call of a", c1); r.err != nil {
		t.Fatalf("call of a: %v", r.err)
	}
	// Either the call with both keys was written, or it is queued in the
	// lane of b (behind the write of b), as is the next call of b.
	waitFor(t, "the call with both keys written or queued", func() bool { return len(c3) > 0 || e.QueuedInserts() == 2 })
	release[1]()
	for name, ch := range map[string]<-chan insertResult{"b": c2, "a+b": c3, "next b": c4} {
		if r := recv(t, "caller "+name, ch); r.err != nil {
			t.Fatalf("caller %s: %v", name, r.err)
		}
	}
	if o := overlap.Load(); o != nil {
		t.Fatal(o)
	}
	waitFor(t, "the lanes to count no call", func() bool {
		e.ins.lanesMu.Lock()
		defer e.ins.lanesMu.Unlock()
		return len(e.ins.lanes) == 0 && !slices.ContainsFunc(e.ins.load, func(n int) bool { return n != 0 })
	})
}

// spanWaiting is how many calls wait for their keys to be in one lane.
func spanWaiting(e *Engine) int { return int(e.ins.spanWaiting.Load()) }

// A call waiting for its keys to be in one lane that gives up (its
// context ends) releases the keys it holds: a later call of one of them
// is queued, and the lanes end up counting nothing.
func TestInserterSpanningCallGivesUp(t *testing.T) {
	d := &fakeDriver{}
	gates := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	in := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	var mu sync.Mutex
	seen := map[string]bool{}
	d.insertUnique = func(_ context.Context, ps []driver.InsertParams) ([]int64, []bool, error) {
		var block string
		mu.Lock()
		for _, p := range ps {
			if k := string(p.UniqueKey); !seen[k] {
				seen[k], block = true, k
			}
		}
		mu.Unlock()
		if block != "" {
			close(in[block])
			<-gates[block]
		}
		return make([]int64, len(ps)), make([]bool, len(ps)), nil
	}
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	release := openOnce(t, gates["a"], gates["b"])
	ctx := context.Background()
	u := func(key string) driver.InsertParams {
		return driver.InsertParams{Queue: "q", Kind: "k", UniqueKey: []byte(key)}
	}
	c1 := enqueueJobs(ctx, e, u("a"))
	recv(t, "the write of a", in["a"])
	time.Sleep(2 * laneStall) // its lane is stalled: new calls of other keys go to another
	c2 := enqueueJobs(ctx, e, u("b"))
	recv(t, "the write of b in another lane", in["b"])
	cctx, cancel := context.WithCancel(ctx)
	c3 := enqueueJobs(cctx, e, u("a"), u("b"))
	waitFor(t, "the call with both keys waiting", func() bool { return spanWaiting(e) == 1 })
	cancel()
	if r := recv(t, "the call that gave up", c3); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the call that gave up: %v, want context.Canceled", r.err)
	}
	c4 := enqueueJobs(ctx, e, u("b"))
	waitFor(t, "the next call of b queued", func() bool { return e.QueuedInserts() == 1 })
	release[0]()
	release[1]()
	for name, ch := range map[string]<-chan insertResult{"a": c1, "b": c2, "next b": c4} {
		if r := recv(t, "caller "+name, ch); r.err != nil {
			t.Fatalf("caller %s: %v", name, r.err)
		}
	}
	waitFor(t, "the lanes to count no call", func() bool {
		e.ins.lanesMu.Lock()
		defer e.ins.lanesMu.Unlock()
		return len(e.ins.lanes) == 0 && e.ins.spanner == nil && !slices.ContainsFunc(e.ins.load, func(n int) bool { return n != 0 })
	})
}

// openOnce returns, for each gate, a function closing it once; the gates
// still open when the test ends are closed then (before the engine is
// closed), so that a failing test does not leave writers waiting.
func openOnce(t *testing.T, gates ...chan struct{}) []func() {
	fs := make([]func(), len(gates))
	for i, g := range gates {
		fs[i] = sync.OnceFunc(func() { close(g) })
	}
	t.Cleanup(func() {
		for _, f := range fs {
			f()
		}
	})
	return fs
}
