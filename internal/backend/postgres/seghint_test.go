package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// The hint rules without a database: a wake that arrives while a claim
// runs keeps that claim from setting a hint, a wake of another queue
// does not, wakeAll starts every hint over, and a hint expires.
func TestClaimHintsRules(t *testing.T) {
	var h claimHints
	now := time.Now()
	if _, ok, _, _ := h.begin("q", now); ok {
		t.Fatal("a hint before any claim")
	}
	_, _, gen, all := h.begin("q", now)
	h.wake("q") // arrives while the claim runs
	h.set("q", 0, 10, noHint, gen, all, now)
	if _, ok, _, _ := h.begin("q", now); ok {
		t.Error("a claim during which its queue was woken set a hint")
	}
	_, _, gen, all = h.begin("q", now)
	h.wake("other")
	h.set("q", 0, 10, noHint, gen, all, now)
	c, ok, _, _ := h.begin("q", now)
	if !ok || c.prio != 0 || c.pos != 10 {
		t.Errorf("hint after a wake of another queue: %+v %v", c, ok)
	}
	if _, ok, _, _ := h.begin("q", now.Add(hintTTL+time.Millisecond)); ok {
		t.Error("a hint outlived hintTTL")
	}
	// A claim that started past the hint moves it, and keeps its expiry:
	// a backlog drained in full batches is still read from its start
	// once per hintTTL.
	from, _, gen, all := h.begin("q", now)
	h.set("q", 0, 15, from, gen, all, now.Add(hintTTL/2))
	if c, ok, _, _ := h.begin("q", now.Add(hintTTL/2)); !ok || c.pos != 15 {
		t.Errorf("hint after a hinted claim: %+v %v", c, ok)
	}
	if _, ok, _, _ := h.begin("q", now.Add(hintTTL+time.Millisecond)); ok {
		t.Error("a hinted claim extended the hint past hintTTL from the claim that read the queue from its start")
	}
	h.wake("q")
	if _, ok, _, _ := h.begin("q", now); ok {
		t.Error("a hint survived a wake of its queue")
	}
	h.wake("never-claimed")
	if _, kept := h.gens["never-claimed"]; kept {
		t.Error("a wake of a queue this process never claimed was kept")
	}
	_, _, gen, all = h.begin("q", now)
	h.set("q", 0, 20, noHint, gen, all, now)
	h.wakeAll()
	if _, ok, _, _ := h.begin("q", now); ok {
		t.Error("a hint survived wakeAll")
	}
	_, _, gen, all = h.begin("q", now)
	h.wakeAll()
	h.set("q", 0, 30, noHint, gen, all, now)
	if _, ok, _, _ := h.begin("q", now); ok {
		t.Error("a claim during which every queue was woken set a hint")
	}
}

// claimN claims up to n jobs of queue and returns their ids.
func claimN(t *testing.T, d *Driver, queue string, n int) []int64 {
	t.Helper()
	js, err := d.Claim(context.Background(), driver.ClaimParams{Queue: queue, Limit: n, Lease: time.Minute, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	return ids
}

// insertN inserts n jobs of queue at priority prio through d.
func insertN(t *testing.T, d *Driver, queue string, n, prio int) []int64 {
	t.Helper()
	jobs := make([]driver.InsertParams, n)
	for i := range jobs {
		jobs[i] = pj(queue)
		jobs[i].Priority = prio
	}
	ids, err := d.Insert(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// hinted reports whether queue's next claim on s starts past a hint.
func hinted(s *segStore, queue string) bool {
	_, ok, _, _ := s.hints.begin(queue, time.Now())
	return ok
}

// waitFor reads notifications from l until one names queue.
func waitFor(t *testing.T, l driver.Listener, queue string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		q, err := l.Wait(ctx)
		if err != nil {
			t.Fatalf("waiting for a notification of %s: %v", queue, err)
		}
		if q == queue {
			return
		}
	}
}

// A job whose inserting transaction drew its position before jobs a
// hinted claim has gone past, and committed after: claimed by the first
// claim after its notification reached the claiming process's listener;
// and, for a process that does not listen, never lost: a hinted claim
// that comes back short claims the rest from the queue's start.
func TestClaimHintLateCommit(t *testing.T) {
	ctx := context.Background()
	for _, listen := range []bool{true, false} {
		d, s := openSeg(t)
		other := openOther(t, d)
		var l driver.Listener
		if listen {
			var err error
			if l, err = d.Listen(ctx); err != nil {
				t.Fatal(err)
			}
			defer l.Close()
		}
		early := insertN(t, other, "q", 10, 0)
		tx, err := other.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lateIDs, err := other.InsertTx(ctx, tx, []driver.InsertParams{pj("q")})
		if err != nil {
			t.Fatal(err)
		}
		late := lateIDs[0]
		after := insertN(t, other, "q", 20, 0)
		var claimed []int64
		for range 3 {
			claimed = append(claimed, claimN(t, d, "q", 5)...)
		}
		if !hinted(s, "q") {
			t.Fatal("three full claims left no hint: the test does not exercise one")
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if listen {
			waitFor(t, l, "q")
			got := claimN(t, d, "q", 5)
			if len(got) == 0 || got[0] != late {
				t.Errorf("listening: the claim after the late job's notification took %v, want %d first", got, late)
			}
			claimed = append(claimed, got...)
		}
		for {
			got := claimN(t, d, "q", 5)
			if len(got) == 0 {
				break
			}
			claimed = append(claimed, got...)
		}
		want := append(append(append([]int64{}, early...), late), after...)
		seen := map[int64]int{}
		for _, id := range claimed {
			seen[id]++
		}
		for _, id := range want {
			if seen[id] != 1 {
				t.Errorf("listen=%v: job %d claimed %d times", listen, id, seen[id])
			}
		}
		if len(claimed) != len(want) {
			t.Errorf("listen=%v: %d claims, want %d", listen, len(claimed), len(want))
		}
	}
}

// A job of a higher priority than the hint's, enqueued by this process or
// by another (whose notification reaches this one), is the next claimed.
func TestClaimHintPriority(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	other := openOther(t, d)
	l, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	insertN(t, d, "q", 20, 5)
	waitFor(t, l, "q")
	claimN(t, d, "q", 5)
	if !hinted(s, "q") {
		t.Fatal("a full claim left no hint")
	}
	local := insertN(t, d, "q", 1, 1)[0]
	if got := claimN(t, d, "q", 1); len(got) != 1 || got[0] != local {
		t.Errorf("after this process enqueued job %d at a higher priority: claimed %v", local, got)
	}
	claimN(t, d, "q", 5)
	if !hinted(s, "q") {
		t.Fatal("a full claim left no hint")
	}
	remote := insertN(t, other, "q", 1, 1)[0]
	waitFor(t, l, "q")
	if got := claimN(t, d, "q", 1); len(got) != 1 || got[0] != remote {
		t.Errorf("after another process enqueued job %d at a higher priority: claimed %v", remote, got)
	}
}

// Jobs another claimer had locked when hinted claims went past them, and
// gave back by rolling back, are claimed once the queue looks drained.
func TestClaimHintSkippedLocked(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	ids := insertN(t, d, "q", 20, 0)
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "SELECT id FROM "+v.cur[phReady].tbl+" ORDER BY pos LIMIT 5 FOR UPDATE")
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var claimed []int64
	for range 3 {
		claimed = append(claimed, claimN(t, d, "q", 5)...)
	}
	if !hinted(s, "q") {
		t.Fatal("full claims left no hint")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		got := claimN(t, d, "q", 5)
		if len(got) == 0 {
			break
		}
		claimed = append(claimed, got...)
	}
	seen := map[int64]int{}
	for _, id := range claimed {
		seen[id]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %d claimed %d times", id, seen[id])
		}
	}
}

// Jobs given back by a claimer that rolled back (no notification) are
// claimed within about hintTTL while the queue is drained in full
// batches: hinted claims do not extend the hint (found by review: each
// full claim used to renew it, so such jobs waited for the backlog's end).
func TestClaimHintExpiresUnderFullClaims(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	insertN(t, d, "q", 3000, 0)
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, "SELECT id FROM "+v.cur[phReady].tbl+" ORDER BY pos LIMIT 5 FOR UPDATE")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	rows.Close()
	claimN(t, d, "q", 5)
	if !hinted(s, "q") {
		t.Fatal("a full claim left no hint")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 3*hintTTL {
		for _, id := range claimN(t, d, "q", 5) {
			delete(want, id)
		}
		if len(want) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("jobs %v given back by a rolled-back claim still unclaimed after %v (hintTTL %v)", want, time.Since(start), hintTTL)
}

// Without a notification reaching this process (no listener), a job of a
// higher priority enqueued by another process is claimed within about
// hintTTL while the backlog is drained in full batches.
func TestClaimHintPriorityWithoutNotification(t *testing.T) {
	d, _ := openSeg(t)
	other := openOther(t, d)
	insertN(t, d, "q", 3000, 5)
	claimN(t, d, "q", 5)
	urgent := insertN(t, other, "q", 1, 1)[0]
	start := time.Now()
	for time.Since(start) < 3*hintTTL {
		for _, id := range claimN(t, d, "q", 5) {
			if id == urgent {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("higher-priority job %d unclaimed after %v (hintTTL %v)", urgent, time.Since(start), hintTTL)
}
