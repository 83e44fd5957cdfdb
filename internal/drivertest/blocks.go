package drivertest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// slotBlocks runs the suite's tests of the blocks of concurrency slots a
// process leases (driver.SlotLeaser): taking, keeping and giving back
// slots, sharing the limit with per-attempt slots, a lowered limit, the
// leases' expiry and Rescue, and the limit held by many owners at once.
func slotBlocks(t *testing.T, s suite) {
	ctx := context.Background()
	leaser := func(t *testing.T, d driver.Driver) driver.SlotLeaser {
		t.Helper()
		l, ok := d.(driver.SlotLeaser)
		if !ok {
			t.Fatalf("%s does not lease slots in blocks (driver.SlotLeaser)", d.Name())
		}
		return l
	}
	lease := func(t *testing.T, l driver.SlotLeaser, owner, queue string, want int, ttl time.Duration) driver.SlotBlock {
		t.Helper()
		got, err := l.LeaseSlots(ctx, owner, map[string]int{queue: want}, ttl)
		if err != nil {
			t.Fatalf("lease %d slots of %s for %s: %v", want, queue, owner, err)
		}
		b, ok := got[queue]
		if !ok {
			t.Fatalf("lease %d slots of %s for %s: no block returned for the queue (%v)", want, queue, owner, got)
		}
		return b
	}
	// expectU checks a block: held slots, usable ones, the limit read.
	expectU := func(t *testing.T, b driver.SlotBlock, held, usable, maxRunning int, what string) {
		t.Helper()
		if b.Held != held || b.Usable != usable || b.MaxRunning != maxRunning {
			t.Fatalf("%s: held %d (usable %d) of a limit of %d, want %d (usable %d) of %d",
				what, b.Held, b.Usable, b.MaxRunning, held, usable, maxRunning)
		}
	}
	// expect checks a block whose slots are all usable (no lowered limit
	// exceeded).
	expect := func(t *testing.T, b driver.SlotBlock, held, maxRunning int, what string) {
		t.Helper()
		expectU(t, b, held, held, maxRunning, what)
	}
	running := func(t *testing.T, d driver.Driver, queue string) int {
		t.Helper()
		u, err := d.LimitUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u[queue].Running
	}
	blocked := func(t *testing.T, d driver.Driver, queue, owner string, limit int, lease time.Duration) driver.ClaimResult {
		t.Helper()
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: queue, Limit: limit, Lease: lease, Worker: owner, Blocked: true})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("TakeKeepGiveBack", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		setLimits(t, d, "q", driver.QueueLimits{MaxRunning: 5})
		expect(t, lease(t, l, "a", "q", 3, time.Minute), 3, 5, "a takes 3 of 5")
		expect(t, lease(t, l, "b", "q", 5, time.Minute), 2, 5, "b asks for 5 beside a's 3")
		expect(t, lease(t, l, "a", "q", 3, time.Minute), 3, 5, "a renews its 3")
		expect(t, lease(t, l, "c", "q", 1, time.Minute), 0, 5, "c asks with every slot leased")
		if n := running(t, d, "q"); n != 5 {
			t.Fatalf("LimitUsage counts %d running with 5 slots leased, want 5", n)
		}
		expect(t, lease(t, l, "a", "q", 1, time.Minute), 1, 5, "a gives 2 back")
		expect(t, lease(t, l, "b", "q", 5, time.Minute), 4, 5, "b takes what a gave back")
		expect(t, lease(t, l, "a", "q", 0, time.Minute), 0, 5, "a gives every slot back")
		expect(t, lease(t, l, "b", "q", 5, time.Minute), 5, 5, "b takes the last")
		// A queue without a concurrency limit has no slots to lease.
		expect(t, lease(t, l, "a", "free", 3, time.Minute), 0, 0, "a queue without MaxRunning")
		setLimits(t, d, "r", driver.QueueLimits{Rate: 10, RatePeriod: time.Minute})
		expect(t, lease(t, l, "a", "r", 3, time.Minute), 0, 0, "a queue with a rate only")
		// Several queues in one call.
		setLimits(t, d, "q2", driver.QueueLimits{MaxRunning: 2})
		got, err := l.LeaseSlots(ctx, "a", map[string]int{"q": 2, "q2": 3}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if got["q"] != (driver.SlotBlock{Held: 0, Usable: 0, MaxRunning: 5}) || got["q2"] != (driver.SlotBlock{Held: 2, Usable: 2, MaxRunning: 2}) {
			t.Fatalf("two queues in one call: %+v, want q 0 of 5 (b holds all), q2 2 of 2", got)
		}
		// Removing the limit leaves nothing to hold.
		setLimits(t, d, "q", driver.QueueLimits{})
		expect(t, lease(t, l, "b", "q", 5, time.Minute), 0, 0, "b renews after the limit was removed")
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["q"].Running != 0 {
			t.Fatalf("usage of a queue whose limit was removed: %+v, %v", u["q"], err)
		}
	})

	// Slots leased in blocks and slots taken by attempts come out of the
	// same limit; a blocked claim takes no slot and is held by the
	// queue's other limits only.
	t.Run("SharedWithAttemptSlots", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		for range 12 {
			insertJobs(t, d, job("s", 0))
		}
		setLimits(t, d, "s", driver.QueueLimits{MaxRunning: 5})
		single := claimLimited(t, d, "s", 2, time.Minute)
		if len(single.Rows) != 2 {
			t.Fatalf("claimed %d, want 2", len(single.Rows))
		}
		expect(t, lease(t, l, "a", "s", 5, time.Minute), 3, 5, "a block beside 2 attempts holding slots")
		if r := claimLimited(t, d, "s", 5, time.Minute); len(r.Rows) != 0 || !r.Held {
			t.Fatalf("an attempt's claim with every slot held or leased: claimed %d (held %v)", len(r.Rows), r.Held)
		}
		r := blocked(t, d, "s", "a", 4, time.Minute)
		if len(r.Rows) != 4 || r.Held || r.MaxRunning != 5 {
			t.Fatalf("a blocked claim of 4: claimed %d (held %v, max running %d), want 4 not held of a limit of 5", len(r.Rows), r.Held, r.MaxRunning)
		}
		if n := running(t, d, "s"); n != 5 {
			t.Fatalf("LimitUsage counts %d running (2 attempts' slots, a block of 3, 4 jobs claimed under it), want 5", n)
		}
		completeJob(t, d, single.Rows[0], driver.StateCompleted, 0)
		expect(t, lease(t, l, "a", "s", 5, time.Minute), 4, 5, "a grows once an attempt's slot freed")
		// The jobs claimed under the block free no slot when they end.
		for _, row := range r.Rows {
			completeJob(t, d, row, driver.StateCompleted, 0)
		}
		if r := claimLimited(t, d, "s", 5, time.Minute); len(r.Rows) != 0 || !r.Held {
			t.Fatalf("blocked jobs' ends freed a slot: an attempt claimed %d (held %v)", len(r.Rows), r.Held)
		}
		expect(t, lease(t, l, "a", "s", 0, time.Minute), 0, 5, "a gives its block back")
		if r := claimLimited(t, d, "s", 10, time.Minute); len(r.Rows) != 4 {
			t.Fatalf("claimed %d once the block was given back beside 1 attempt, want 4", len(r.Rows))
		}
	})

	t.Run("BlockedClaimKeepsOtherLimits", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		for range 10 {
			insertJobs(t, d, job("o", 0))
		}
		setLimits(t, d, "o", driver.QueueLimits{MaxRunning: 2, Rate: 3, RatePeriod: time.Hour})
		expect(t, lease(t, l, "a", "o", 2, time.Minute), 2, 2, "a block of the limit")
		r := blocked(t, d, "o", "a", 10, time.Minute)
		if len(r.Rows) != 3 || !r.Held || r.RetryIn <= 0 {
			t.Fatalf("blocked claim under a rate of 3: claimed %d (held %v, retry in %v), want 3 held by the rate", len(r.Rows), r.Held, r.RetryIn)
		}
		setLimits(t, d, "o", driver.QueueLimits{MaxRunning: 2})
		if err := d.PauseQueue(ctx, "o", true); err != nil {
			t.Fatal(err)
		}
		if r := blocked(t, d, "o", "a", 10, time.Minute); len(r.Rows) != 0 {
			t.Fatalf("a blocked claim of a paused queue claimed %d", len(r.Rows))
		}
		if err := d.PauseQueue(ctx, "o", false); err != nil {
			t.Fatal(err)
		}
		if r := blocked(t, d, "o", "a", 10, time.Minute); len(r.Rows) != 7 {
			t.Fatalf("a blocked claim of the resumed queue claimed %d, want the 7 left", len(r.Rows))
		}
	})

	// A lowered limit: an owner keeps the slots it asks for, those below
	// the limit first, but may use no more than the limit leaves, and
	// nobody takes a slot while attempts or owners still hold more than
	// it.
	t.Run("Lowered", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		setLimits(t, d, "lw", driver.QueueLimits{MaxRunning: 5})
		expect(t, lease(t, l, "a", "lw", 5, time.Minute), 5, 5, "a takes the limit")
		setLimits(t, d, "lw", driver.QueueLimits{MaxRunning: 2})
		expectU(t, lease(t, l, "a", "lw", 5, time.Minute), 5, 2, 2, "a renews under a lowered limit, its handlers still running")
		expect(t, lease(t, l, "b", "lw", 1, time.Minute), 0, 2, "b beside a holding slots above the lowered limit")
		expect(t, lease(t, l, "a", "lw", 2, time.Minute), 2, 2, "a once its handlers above the limit ended")
		expect(t, lease(t, l, "b", "lw", 1, time.Minute), 0, 2, "b beside a holding the lowered limit")
		setLimits(t, d, "lw", driver.QueueLimits{MaxRunning: 3})
		expect(t, lease(t, l, "b", "lw", 2, time.Minute), 1, 3, "b after the limit was raised to 3")

		// Lowered, then raised again while an owner's handlers above
		// the lowered limit still ran: the slots they run under stayed
		// the owner's, and nobody else takes them.
		setLimits(t, d, "lr", driver.QueueLimits{MaxRunning: 4})
		expect(t, lease(t, l, "a", "lr", 4, time.Minute), 4, 4, "a takes the limit")
		setLimits(t, d, "lr", driver.QueueLimits{MaxRunning: 2})
		expectU(t, lease(t, l, "a", "lr", 4, time.Minute), 4, 2, 2, "a renews under the lowered limit, 4 handlers running")
		setLimits(t, d, "lr", driver.QueueLimits{MaxRunning: 4})
		expect(t, lease(t, l, "b", "lr", 4, time.Minute), 0, 4, "b once the limit was raised again, a's 4 handlers running")
		expect(t, lease(t, l, "a", "lr", 4, time.Minute), 4, 4, "a under the raised limit")

		// Two owners beside a lowered limit: the one above it keeps its
		// slots while its handlers run, and neither starts a job until
		// fewer than the limit are in use.
		setLimits(t, d, "lt", driver.QueueLimits{MaxRunning: 4})
		expect(t, lease(t, l, "a", "lt", 2, time.Minute), 2, 4, "a takes 2")
		expect(t, lease(t, l, "b", "lt", 2, time.Minute), 2, 4, "b takes the other 2")
		setLimits(t, d, "lt", driver.QueueLimits{MaxRunning: 2})
		expectU(t, lease(t, l, "b", "lt", 2, time.Minute), 2, 0, 2, "b above the lowered limit, beside a's 2 below it")
		expectU(t, lease(t, l, "a", "lt", 2, time.Minute), 2, 0, 2, "a below the lowered limit, beside b's 2 above it")
		expect(t, lease(t, l, "b", "lt", 0, time.Minute), 0, 2, "b once its handlers ended")
		expect(t, lease(t, l, "a", "lt", 2, time.Minute), 2, 2, "a once b gave its slots back")

		// Attempts holding more slots than a lowered limit: blocks get
		// nothing until fewer attempts than the limit hold slots.
		for range 6 {
			insertJobs(t, d, job("la", 0))
		}
		setLimits(t, d, "la", driver.QueueLimits{MaxRunning: 4})
		held := claimLimited(t, d, "la", 3, time.Minute).Rows
		if len(held) != 3 {
			t.Fatalf("claimed %d of a limit of 4", len(held))
		}
		setLimits(t, d, "la", driver.QueueLimits{MaxRunning: 2})
		for i := range held {
			b := lease(t, l, "a", "la", 2, time.Minute)
			if left := len(held) - i; b.Held > max(0, 2-left) || b.Usable > b.Held {
				t.Fatalf("a block of %d (usable %d) beside %d attempts holding slots under a lowered limit of 2", b.Held, b.Usable, left)
			}
			completeJob(t, d, held[i], driver.StateCompleted, 0)
		}
		expect(t, lease(t, l, "a", "la", 2, time.Minute), 2, 2, "a once every attempt ended")
	})

	// An expired block stays with its owner while a job it claimed runs,
	// and is given back by Rescue once none does.
	t.Run("ExpiryAndRescue", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		for range 6 {
			insertJobs(t, d, job("x", 0))
		}
		setLimits(t, d, "x", driver.QueueLimits{MaxRunning: 3})
		const ttl = 300 * time.Millisecond
		expect(t, lease(t, l, "a", "x", 3, ttl), 3, 3, "a takes the limit")
		r := blocked(t, d, "x", "a", 1, time.Minute)
		if len(r.Rows) != 1 {
			t.Fatalf("blocked claim: %d rows", len(r.Rows))
		}
		time.Sleep(2 * ttl)
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		expect(t, lease(t, l, "b", "x", 3, time.Minute), 0, 3, "b beside a's expired block with a job running")
		expect(t, lease(t, l, "a", "x", 3, ttl), 3, 3, "a renews its expired block")
		completeJob(t, d, r.Rows[0], driver.StateCompleted, 0)
		time.Sleep(2 * ttl)
		expect(t, lease(t, l, "b", "x", 3, time.Minute), 0, 3, "b beside a's expired block before a rescue")
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		expect(t, lease(t, l, "b", "x", 3, ttl), 3, 3, "b once the rescue gave a's expired block back")
		expect(t, lease(t, l, "a", "x", 3, ttl), 0, 3, "a renews a block given back")

		// A dead owner: its job's lease expires with its block; the
		// rescue ends the job and frees the block (in that round or the
		// next).
		r = blocked(t, d, "x", "b", 1, ttl)
		if len(r.Rows) != 1 {
			t.Fatalf("blocked claim: %d rows", len(r.Rows))
		}
		time.Sleep(2 * ttl)
		rescued := 0
		for range 2 {
			n, err := d.Rescue(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			rescued += n["x"]
		}
		if rescued != 1 {
			t.Fatalf("rescued %d of a dead owner's jobs, want 1", rescued)
		}
		expect(t, lease(t, l, "c", "x", 3, time.Minute), 3, 3, "c once a dead owner's job and block were rescued")
	})

	// Owners leasing and giving back at random, beside attempts taking
	// slots one claim at a time: the slots in use never exceed the limit.
	t.Run("ManyOwnersHeldToTheLimit", func(t *testing.T) {
		d := s.setup(t)
		l := leaser(t, d)
		const limit, owners = 5, 4
		for range 40 {
			insertJobs(t, d, job("m", 0))
		}
		setLimits(t, d, "m", driver.QueueLimits{MaxRunning: limit})
		var stop atomic.Bool
		var wg sync.WaitGroup
		errs := make(chan error, owners+2)
		var peak, took atomic.Int64
		for i := range owners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := string(rune('a' + i))
				for !stop.Load() {
					b, err := l.LeaseSlots(ctx, owner, map[string]int{"m": rand.IntN(limit + 2)}, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					took.Add(int64(b["m"].Held))
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				}
				if _, err := l.LeaseSlots(ctx, owner, map[string]int{"m": 0}, time.Minute); err != nil {
					errs <- err
				}
			}()
		}
		wg.Add(1)
		go func() { // attempts taking and freeing slots of their own
			defer wg.Done()
			for !stop.Load() {
				r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "m", Limit: 2, Lease: time.Minute, Worker: "w"})
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Millisecond)
				for _, row := range r.Rows {
					// Retried at once, so the queue never runs dry.
					o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateScheduled}
					if _, err := d.Complete(ctx, []driver.Outcome{o}); err != nil {
						errs <- err
						return
					}
				}
				if _, err := d.Promote(ctx, 100); err != nil {
					errs <- err
					return
				}
			}
		}()
		wg.Add(1)
		go func() { // the watcher: slots in use, in one statement's snapshot
			defer wg.Done()
			for !stop.Load() {
				u, err := d.LimitUsage(ctx)
				if err != nil {
					errs <- err
					return
				}
				n := int64(u["m"].Running)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
			}
		}()
		time.Sleep(1500 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if p := peak.Load(); p > limit {
			t.Fatalf("%d slots in use at once under a limit of %d", p, limit)
		}
		if took.Load() == 0 {
			t.Fatal("no owner ever held a slot: the test proved nothing")
		}
		if n := running(t, d, "m"); n > limit {
			t.Fatalf("%d slots in use once every owner gave its block back", n)
		}
	})
}
