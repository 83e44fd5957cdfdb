package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// The driver's own writes wake other processes from a transaction of
// their own, after the commit: the insert statement run with its own
// notifications off sends none, and each write still wakes exactly the
// queues that received a job available at once, by the database's clock.
func TestWritesNotifyAfterTheirCommit(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	l, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// The statement itself: with inline off, its transaction notifies
	// nothing; with inline on (the caller's transaction), it does.
	for _, inline := range []bool{false, true} {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.seg.insert(ctx, pgxQuerier(tx), []driver.InsertParams{pj("stmt")}, inline); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want := "[]"
		if inline {
			want = "[stmt]"
		}
		if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != want {
			t.Fatalf("insert statement with inline %v notified %v, want %s", inline, got, want)
		}
	}

	// Insert: a run-at passed wakes its queue, a run-at to come and a
	// delay do not (promotion wakes them).
	past, future, delayed := pj("past"), pj("future"), pj("delayed")
	past.RunAt = time.Now().Add(-time.Minute)
	future.RunAt = time.Now().Add(time.Hour)
	delayed.Delay = time.Hour
	if _, err := d.Insert(ctx, []driver.InsertParams{past, future, delayed, past}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[past]" {
		t.Fatalf("insert notified %v, want [past]", got)
	}

	// InsertClaiming: the queue of a job claimed by its insert is not
	// woken, the others are.
	if _, _, err := d.InsertClaiming(ctx, []driver.InsertParams{pj("claimed"), pj("left")},
		driver.InsertClaim{Claim: []bool{true, false}, Lease: time.Minute, Worker: "w"}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[left]" {
		t.Fatalf("insert claiming notified %v, want [left]", got)
	}

	// InsertUnique in its own transaction: a queue whose only job's key
	// was held is not woken.
	u := func(q, key string) driver.InsertParams {
		p := pj(q)
		p.UniqueKey = []byte(key)
		return p
	}
	if _, _, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u("held", "k1")}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[held]" {
		t.Fatalf("first unique insert notified %v, want [held]", got)
	}
	_, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u("held", "k1"), u("fresh", "k2")})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dup) != "[true false]" {
		t.Fatalf("held keys %v, want [true false]", dup)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[fresh]" {
		t.Fatalf("second unique insert notified %v, want [fresh]", got)
	}

	// BulkInsert wakes after its commit too.
	if n, err := d.BulkInsert(ctx, []driver.InsertParams{pj("bulk"), future}); err != nil || n != 2 {
		t.Fatalf("bulk insert %d %v", n, err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[bulk]" {
		t.Fatalf("bulk insert notified %v, want [bulk]", got)
	}
	if n := d.Counters()["notify_lost"]; n != 0 {
		t.Fatalf("notify_lost %d", n)
	}
}

// An insert refused by the server leaves its connection out of any
// transaction and commits nothing; the pool's connections stay usable.
func TestNotifyingInsertRefusedRollsBack(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	bad := pj("bad")
	bad.Args = []byte(`{"not json`)
	for range 3 {
		if _, err := d.Insert(ctx, []driver.InsertParams{pj("bad"), bad}); err == nil {
			t.Fatal("an insert of invalid JSON arguments succeeded")
		} else if !driver.IsNotCommitted(err) {
			t.Fatalf("refused insert not marked not committed: %v", err)
		}
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("bad")}); err != nil {
		t.Fatal(err)
	}
	st, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Queue == "bad" && s.Counts[driver.StateAvailable] != 1 {
			t.Fatalf("queue bad holds %v, want the one job of the insert that succeeded", s.Counts)
		}
	}
	var status byte
	for range 8 {
		c, err := d.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		status = c.Conn().PgConn().TxStatus()
		c.Release()
		if status != 'I' {
			t.Fatalf("a pool connection is in transaction status %q after refused inserts", status)
		}
	}
}

// dueQueues names each queue once, in first-seen order, with the earliest
// run-at of its jobs (zero when one is due at once), and leaves out
// delayed and skipped jobs, however many queues a batch names.
func TestDueQueues(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	job := func(q string, at time.Time, delay time.Duration) driver.InsertParams {
		return driver.InsertParams{Queue: q, RunAt: at, Delay: delay}
	}
	jobs := []driver.InsertParams{
		job("a", t0.Add(time.Minute), 0), job("b", time.Time{}, 0), job("a", t0, 0),
		job("c", time.Time{}, time.Hour), job("d", time.Time{}, 0), job("b", t0, 0),
		job("e", time.Time{}, 0), job("a", time.Time{}, 0), job("e", time.Time{}, 0),
	}
	skip := []bool{false, false, false, false, true}
	w := dueQueues(jobs, skip)
	got := fmt.Sprint(w.queues)
	if got != "[a b e]" {
		t.Fatalf("queues %s, want [a b e]", got)
	}
	for i, want := range []time.Time{{}, {}, {}} {
		if !w.at[i].Equal(want) {
			t.Fatalf("queue %s: run-at %v, want %v", w.queues[i], w.at[i], want)
		}
	}
	w = dueQueues(jobs[:3], nil)
	if fmt.Sprint(w.queues) != "[a b]" || !w.at[0].Equal(t0) || !w.at[1].IsZero() {
		t.Fatalf("queues %v at %v, want [a b] at [%v zero]", w.queues, w.at, t0)
	}
	var many []driver.InsertParams
	for i := range 300 {
		many = append(many, job(fmt.Sprint("q", i%150), time.Time{}, 0))
	}
	if w := dueQueues(many, nil); len(w.queues) != 150 || w.queues[149] != "q149" {
		t.Fatalf("%d queues (last %q), want 150 ending with q149", len(w.queues), w.queues[len(w.queues)-1])
	}
}
