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
	waitFor(t, "caller b queued", func() bool { return len(e.ins.in) == 1 })
	c := enqueue(e, 4, 5)
	waitFor(t, "caller c queued", func() bool { return len(e.ins.in) == 2 })
	dd := enqueue(e, 6, 7)
	waitFor(t, "caller d queued", func() bool { return len(e.ins.in) == 3 })
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

// When a batch's insert fails, every caller of that batch gets the error
// (the insert is not retried caller by caller: it may have committed), the
// callers of other batches are unaffected, and an enqueue after Close is
// refused.
func TestInserterErrorReachesEveryCallerOfBatch(t *testing.T) {
	d := &fakeDriver{}
	first, gate := make(chan struct{}), make(chan struct{})
	byPriority(d, first, gate, 2, errBoom)
	e := New(d, testConfig(time.Second), nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	a := enqueue(e, 1)
	recv(t, "the first insert", first)
	b := enqueue(e, 2)
	waitFor(t, "caller b queued", func() bool { return len(e.ins.in) == 1 })
	c := enqueue(e, 3, 4)
	waitFor(t, "caller c queued", func() bool { return len(e.ins.in) == 2 })
	close(gate)
	if r := recv(t, "caller a", a); r.err != nil || !slices.Equal(r.ids, []int64{1001}) {
		t.Fatalf("caller a of the first batch got %v, %v; want [1001]", r.ids, r.err)
	}
	for name, ch := range map[string]<-chan insertResult{"b": b, "c": c} {
		if r := recv(t, "caller "+name, ch); !errors.Is(r.err, errBoom) || r.ids != nil {
			t.Fatalf("caller %s of the failed batch got %v, %v; want the insert's error", name, r.ids, r.err)
		}
	}
	if r := recv(t, "a caller after the failure", enqueue(e, 5)); r.err != nil || !slices.Equal(r.ids, []int64{1005}) {
		t.Fatalf("caller after the failed batch got %v, %v; want [1005]", r.ids, r.err)
	}
	if n := d.count("insert"); n != 3 {
		t.Fatalf("%d insert statements, want 3: a failed batch is not retried", n)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k"}}); !errors.Is(err, ErrStopped) {
		t.Fatalf("enqueue after Close: %v, want ErrStopped", err)
	}
}

// A batch mixing plain and unique jobs goes to Insert and InsertUnique;
// a unique job whose key an earlier job of the batch has is that job's
// duplicate without reaching the driver, and every caller gets its own ids
// and flags in order.
func TestInsertSplitsUniqueJobs(t *testing.T) {
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
	if n := len(d.callsOf("insertunique")); n != 1 {
		t.Fatalf("%d InsertUnique calls, want 1", n)
	}
	if got := d.callsOf("insertunique")[0].params; len(got) != 2 {
		t.Fatalf("InsertUnique got %d jobs, want the 2 distinct keys", len(got))
	}
	if got := d.callsOf("insert"); len(got) != 1 || len(got[0].params) != 2 {
		t.Fatalf("insert calls %v, want one with the 2 plain jobs", got)
	}
	// The key is held now: a later enqueue is a duplicate of the holder.
	again, dup, err := e.Insert(context.Background(), []driver.InsertParams{u("b")})
	if err != nil || !dup[0] || again[0] != ids[3] {
		t.Fatalf("again: ids %v dup %v err %v", again, dup, err)
	}
	// In a transaction, the same split, with the caller's transaction.
	if _, _, err := e.InsertTx(context.Background(), nil, []driver.InsertParams{plain}); !errors.Is(err, driver.ErrTxType) {
		t.Fatalf("nil transaction: %v, want ErrTxType", err)
	}
}
