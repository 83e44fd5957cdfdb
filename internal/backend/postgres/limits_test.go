package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestLimitsFreeingWakes: a statement that frees a queue's limit slot
// notifies the queue, so that other processes' fetchers claim at once;
// one that frees none (an unlimited queue's outcome) notifies nothing.
func TestLimitsFreeingWakes(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("lim"), pj("lim"), pj("lim"), pj("free")}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "lim", driver.QueueLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	l, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	collect(t, l, 200*time.Millisecond) // the inserts' and the limits' own

	free, err := d.Claim(ctx, driver.ClaimParams{Queue: "free", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(free) != 1 {
		t.Fatalf("claim: %v, %v", free, err)
	}
	if _, err := d.Complete(ctx, []driver.Outcome{{ID: free[0].ID, Fence: free[0].Fence, Attempt: 1, State: driver.StateCompleted}}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 200*time.Millisecond); len(got) != 0 {
		t.Fatalf("an unlimited queue's outcome notified %v", got)
	}

	ends := []struct {
		name string
		end  func(r *driver.JobRow) error
	}{
		{"completed", func(r *driver.JobRow) error {
			_, err := d.Complete(ctx, []driver.Outcome{{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}})
			return err
		}},
		{"retryable", func(r *driver.JobRow) error {
			_, err := d.Complete(ctx, []driver.Outcome{{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateRetryable, RetryIn: time.Hour}})
			return err
		}},
		{"discarded by hand", func(r *driver.JobRow) error {
			_, err := d.Discard(ctx, r.ID)
			return err
		}},
	}
	for _, e := range ends {
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "lim", Limit: 3, Lease: time.Minute, Worker: "w"})
		if err != nil || len(r.Rows) != 1 {
			t.Fatalf("%s: claimed %d, %v; want 1", e.name, len(r.Rows), err)
		}
		if err := e.end(r.Rows[0]); err != nil {
			t.Fatal(err)
		}
		if got := collect(t, l, 200*time.Millisecond); !slices.Contains(got, "lim") {
			t.Fatalf("an attempt %s freed its slot and notified %v, want lim", e.name, got)
		}
	}
}

// TestLimitsSweep: Rescue frees a slot whose holder is not running under
// its fence and keeps one whose holder is; it deletes a free slot left
// above a lowered limit; and its statement frees nothing when the
// registry does not name exactly the running segments it was built for.
func TestLimitsSweep(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("s"), pj("s"), pj("s")}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "s", driver.QueueLimits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "s", Limit: 3, Lease: time.Minute, Worker: "w"})
	if err != nil || len(r.Rows) != 2 {
		t.Fatalf("claimed %d, %v; want 2", len(r.Rows), err)
	}
	running := func() int {
		t.Helper()
		u, err := d.LimitUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u["s"].Running
	}
	slots := func() int {
		t.Helper()
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.prefix+"limit_slots WHERE queue = 's' AND type = 'c'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Slot 0's attempt ends without freeing it (as a process of an
	// earlier version would): its holder is no longer running.
	orphan := func() {
		t.Helper()
		if _, err := d.pool.Exec(ctx, "UPDATE "+d.prefix+"limit_slots SET fence = fence + 1 WHERE queue = 's' AND type = 'c' AND n = 0"); err != nil {
			t.Fatal(err)
		}
	}
	orphan()

	// Built for a registry other than the one stored: nothing freed.
	v, err := d.seg.refresh(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var same bool
	var freed, woke int64
	if err := d.pool.QueryRow(ctx, d.seg.stmt(&d.q.SegSweepSlots, v, v.live[phRunning]), "elsewhere:1").Scan(&same, &freed, &woke); err != nil || same || freed != 0 {
		t.Fatalf("sweep on a registry it was not built for: same %v, freed %d, %v", same, freed, err)
	}
	if n := running(); n != 2 {
		t.Fatalf("%d slots held after a refused sweep, want 2", n)
	}

	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := running(); n != 1 {
		t.Fatalf("%d slots held after the sweep, want the running holder's 1", n)
	}

	// Lowered to 1 while slot 1 is held: it stays until its attempt
	// ends, then the sweep deletes it.
	if err := d.SetQueueLimits(ctx, "s", driver.QueueLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if n := slots(); n != 2 {
		t.Fatalf("%d concurrency slots after lowering the limit with slot 1 held, want 2", n)
	}
	holder := r.Rows[1]
	if _, err := d.Complete(ctx, []driver.Outcome{{ID: holder.ID, Fence: holder.Fence, Attempt: holder.Attempt, State: driver.StateCompleted}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := slots(); n != 1 {
		t.Fatalf("%d concurrency slots after the sweep, want the limit's 1", n)
	}
	if got, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "s", Limit: 3, Lease: time.Minute, Worker: "w"}); err != nil || len(got.Rows) != 1 {
		t.Fatalf("claimed %d, %v; want 1", len(got.Rows), err)
	}
}

// TestLimitsLoweredDuringAClaim: a claim that read the queue's limits
// before a lowered MaxRunning committed must not lock a concurrency
// slot at or above the new limit that an attempt freed after the change:
// a claim reading the new limit meanwhile counts that slot as free of
// the old limit's holders, and the two would run more than the limit.
// The claim is held between its read of the limits and its lock of the
// slots by an ACCESS EXCLUSIVE lock on the slots' table, in whose
// transaction the limit is lowered from 3 to 2 (as SetQueueLimits writes
// it: no free slot above it to delete) and the attempt on slot 2 ends
// (as Complete frees its slot), slots 0 and 1 still held.
func TestLimitsLoweredDuringAClaim(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("low"), pj("low"), pj("low"), pj("low"), pj("low")}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "low", driver.QueueLimits{MaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "low", Limit: 3, Lease: time.Minute, Worker: "w"})
	if err != nil || len(r.Rows) != 3 {
		t.Fatalf("claim: %d rows, %v", len(r.Rows), err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+d.prefix+"limit_slots IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res driver.ClaimResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "low", Limit: 1, Lease: time.Minute, Worker: "c"})
		done <- result{res, err}
	}()
	// Until the claim waits for the slots' table.
	for waiting := false; !waiting; {
		err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = $1::regclass)`,
			d.prefix+"limit_slots").Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			t.Fatalf("the claim did not wait for the slots' table: %d rows, %v", len(res.res.Rows), res.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := tx.Exec(ctx, "UPDATE "+d.prefix+"queues SET max_running = 2 WHERE name = 'low'"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE "+d.prefix+"limit_slots SET job_id = NULL, fence = NULL WHERE queue = 'low' AND type = 'c' AND n = 2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	u, err := d.LimitUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := u["low"]; got.Running > got.Limits.MaxRunning || len(res.res.Rows) != 0 {
		t.Fatalf("the claim took %d jobs: %d running at a limit of %d", len(res.res.Rows), got.Running, got.Limits.MaxRunning)
	}
}

// TestLimitedClaimOnAPoolOfOne: a limited claim that finds nothing checks
// its view of the segments in its own transaction; it took a second
// connection of the pool while holding the first, and a pool of one
// (connect.Options.PoolSize 1) waited for ever.
func TestLimitedClaimOnAPoolOfOne(t *testing.T) {
	d := open(t, driver.Options{PoolSize: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.SetQueueLimits(ctx, "one", driver.QueueLimits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "one", Limit: 5, Lease: time.Minute, Worker: "w"})
		if err != nil || len(res.Rows) != 0 || res.Held {
			t.Fatalf("claim %d of an empty limited queue on a pool of one: %d rows, held %v, %v", i, len(res.Rows), res.Held, err)
		}
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("one"), pj("one"), pj("one")}); err != nil {
		t.Fatal(err)
	}
	res, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "one", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(res.Rows) != 2 || !res.Held {
		t.Fatalf("claim on a pool of one: %d rows, held %v, %v; want the limit's 2, held", len(res.Rows), res.Held, err)
	}
}

// TestLimitTakeRefusesChangedLimits: the statement that stamps a limited
// claim's slots, sent with its COMMIT, fails when the queue's limits are
// no longer those the claim locked its slots under (so that the COMMIT
// does not run and the claim runs again), and ClaimLimited recognises
// that failure; under the same limits it succeeds.
func TestLimitTakeRefusesChangedLimits(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if err := d.SetQueueLimits(ctx, "chg", driver.QueueLimits{MaxRunning: 3, KeyRate: 2, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	take := func(maxRunning, keyRate int) error {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var one int
		return tx.QueryRow(ctx, d.q.LimitTake, "chg", "{}", "{}", "{}", "{}", maxRunning, 0, int64(0),
			keyRate, int64(time.Hour/time.Microsecond), 0, 0).Scan(&one)
	}
	if err := take(3, 2); err != nil {
		t.Fatalf("under the same limits: %v", err)
	}
	err := take(4, 2)
	if err == nil || !limitsChanged(err) {
		t.Fatalf("under changed limits: %v, want the limits-changed failure", err)
	}
	if err := take(3, 3); err == nil || !limitsChanged(err) {
		t.Fatalf("under a changed rate per key: %v, want the limits-changed failure", err)
	}
	if limitsChanged(context.Canceled) {
		t.Fatal("another error taken for the limits-changed failure")
	}
}

// TestLimitRetryInWithUnstampedSlotsLocked: a claim that finds the
// queue's open rate slots locked by another claim is held, and told to
// claim again soon, not when the oldest start within the window leaves
// it: a slot that never admitted a start (a rate just set or raised) and
// that the other claim locks but does not use is open again as soon as
// that claim ends. It was left out of the wait's reckoning, so the
// claimer slept up to a whole period (an hour here) while the window had
// room.
func TestLimitRetryInWithUnstampedSlotsLocked(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("nul"), pj("nul"), pj("nul")}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "nul", driver.QueueLimits{Rate: 3, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "nul", Limit: 1, Lease: time.Minute, Worker: "w"}); err != nil || len(r.Rows) != 1 {
		t.Fatalf("claim: %d rows, %v", len(r.Rows), err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Another claim's lock of the two slots that never admitted a start.
	tag, err := tx.Exec(ctx, "SELECT n FROM "+d.prefix+"limit_slots WHERE queue = 'nul' AND type = 'r' AND used_at IS NULL FOR UPDATE")
	if err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("lock the unstamped slots: %v, %v", tag, err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "nul", Limit: 2, Lease: time.Minute, Worker: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 0 || !r.Held || r.RetryIn <= 0 || r.RetryIn > time.Second {
		t.Fatalf("claimed %d (held %v, retry in %v) with the window's open slots locked by another claim, want none, held, retry within a second", len(r.Rows), r.Held, r.RetryIn)
	}
}
