package mysql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// owned returns, per queue, the concurrency slots owner holds in d's
// tables, in slot order.
func owned(t *testing.T, d *Driver, owner string) map[string][]int {
	t.Helper()
	rows, err := d.db.QueryContext(context.Background(), "SELECT queue, n FROM `"+d.prefix+"limit_slots` WHERE type = 'c' AND owner = ? ORDER BY queue, n", owner)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer rows.Close()
	out := map[string][]int{}
	for rows.Next() {
		var q string
		var n int
		if err := rows.Scan(&q, &n); err != nil {
			t.Error(err)
			return nil
		}
		out[q] = append(out[q], n)
	}
	if err := rows.Err(); err != nil {
		t.Error(err)
	}
	return out
}

// checkBlocks fails t unless what owner holds in d's tables is what
// LeaseSlots returned for each queue of want, given the slots it held
// before the call (before, from owned; only the owner's calls change its
// slots while no rescue runs): Held slots, at most want; of those it held
// before, its lowest (those below the limit first), up to want (none
// without a limit); a slot taken only below the MaxRunning read and only
// up to min(want, MaxRunning); and Usable between 0 and Held and within
// the limit. It returns what owner holds now.
func checkBlocks(t *testing.T, d *Driver, owner string, want map[string]int, got map[string]driver.SlotBlock, before map[string][]int) (map[string][]int, bool) {
	t.Helper()
	have := owned(t, d, owner)
	for q, w := range want {
		b, h, was := got[q], have[q], before[q]
		var kept, took []int
		for _, n := range h {
			if slices.Contains(was, n) {
				kept = append(kept, n)
			} else {
				took = append(took, n)
			}
		}
		keep := 0
		if b.MaxRunning > 0 {
			keep = min(w, len(was))
		}
		switch {
		case b.Held > w || (b.MaxRunning == 0 && b.Held > 0):
			t.Errorf("%s: holds %d of %s (limit %d), wanted %d", owner, b.Held, q, b.MaxRunning, w)
		case len(h) != b.Held:
			t.Errorf("%s: LeaseSlots said %d of %s, the table holds %v", owner, b.Held, q, h)
		case !slices.Equal(kept, was[:keep]):
			t.Errorf("%s: kept %v of %s out of %v, want its lowest %d", owner, kept, q, was, keep)
		case len(took) > 0 && (took[len(took)-1] >= b.MaxRunning || b.Held > min(w, b.MaxRunning)):
			t.Errorf("%s: took %v of %s to hold %d, wanting %d under a limit of %d", owner, took, q, b.Held, w, b.MaxRunning)
		case b.Usable < 0 || b.Usable > b.Held || b.Usable > b.MaxRunning:
			t.Errorf("%s: may use %d of %s, holding %d of a limit of %d", owner, b.Usable, q, b.Held, b.MaxRunning)
		default:
			continue
		}
		return have, false
	}
	return have, true
}

// TestLeaseSlotsHeldIsOwned: owners lease blocks of two queues at random
// beside claims that take and free slots of their own, while another
// process moves one queue's MaxRunning up and down. After every call, what
// the owner holds in the table is what the call returned (only the
// owner's calls change its slots while no rescue runs), as checkBlocks
// checks it; no slot is ever held by an attempt and an owner at once; and
// no error surfaces (deadlocks and lock waits are the driver's). Each
// owner runs handlers under its blocks as a process does: some end before
// a call, which asks for at least the slots the others run under (the
// call keeps those), and it starts more only up to Usable. The handlers
// and attempts running at once never exceed the limit of "bb", which
// stays 5 (where Usable is always Held), nor the highest limit "ba" ever
// had, 6: giving back a lowered limit's slots under running handlers
// would let others take them once it was raised again.
func TestLeaseSlotsHeldIsOwned(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			queues := []string{"ba", "bb"}
			most := map[string]int{"ba": 6, "bb": 5}
			for _, q := range queues {
				if _, err := d.Insert(ctx, limitJobs(q, 30)); err != nil {
					t.Fatal(err)
				}
				if err := d.SetQueueLimits(ctx, q, driver.QueueLimits{MaxRunning: 5}); err != nil {
					t.Fatal(err)
				}
			}
			var stop atomic.Bool
			var calls, took, cut atomic.Int64
			var mu sync.Mutex
			inUse, peak := map[string]int{}, map[string]int{}
			use := func(q string, n int) {
				mu.Lock()
				inUse[q] += n
				peak[q] = max(peak[q], inUse[q])
				mu.Unlock()
			}
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := fmt.Sprintf("host/%d/owner", i)
					held := map[string][]int{}
					running := map[string]int{} // its handlers, by queue
					for !stop.Load() {
						want := map[string]int{}
						for _, q := range queues {
							if rand.IntN(4) > 0 {
								w := rand.IntN(7)
								if w < running[q] { // handlers that ended
									use(q, w-running[q])
									running[q] = w
								}
								want[q] = w
							}
						}
						got, err := d.LeaseSlots(ctx, owner, want, time.Minute)
						if err != nil {
							t.Error(err)
							return
						}
						calls.Add(1)
						var ok bool
						if held, ok = checkBlocks(t, d, owner, want, got, held); !ok {
							return
						}
						for q, b := range got {
							took.Add(int64(b.Held))
							switch {
							case b.Held < running[q]:
								t.Errorf("%s: holds %d of %s with %d handlers running under its block", owner, b.Held, q, running[q])
								return
							case q == "bb" && b.Usable != b.Held:
								t.Errorf("%s: may use %d of the %d slots of %s it holds, a limit never lowered", owner, b.Usable, b.Held, q)
								return
							case b.Usable < b.Held:
								cut.Add(1)
							}
							if b.Usable > running[q] { // it starts handlers up to Usable
								use(q, b.Usable-running[q])
								running[q] = b.Usable
							}
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // attempts taking and freeing slots of their own
				defer wg.Done()
				for !stop.Load() {
					for _, q := range queues {
						r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: q, Limit: 2, Lease: time.Minute, Worker: "w"})
						if err != nil {
							t.Error(err)
							return
						}
						use(q, len(r.Rows))
						for _, row := range r.Rows {
							use(q, -1)
							o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateScheduled}
							if _, err := d.Complete(ctx, []driver.Outcome{o}); err != nil {
								t.Error(err)
								return
							}
						}
					}
					if _, err := d.Promote(ctx, 100); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			wg.Add(1)
			go func() { // the limit of "ba" lowered and raised
				defer wg.Done()
				for !stop.Load() {
					if err := d.SetQueueLimits(ctx, "ba", driver.QueueLimits{MaxRunning: 2 + rand.IntN(5)}); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
			wg.Add(1)
			go func() { // no slot is two things at once
				defer wg.Done()
				for !stop.Load() {
					var both int
					if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"limit_slots` WHERE owner IS NOT NULL AND job_id IS NOT NULL").Scan(&both); err != nil {
						t.Error(err)
						return
					}
					if both > 0 {
						t.Errorf("%d slots held by an attempt and leased to an owner at once", both)
						return
					}
				}
			}()
			time.Sleep(1500 * time.Millisecond)
			stop.Store(true)
			wg.Wait()
			if took.Load() == 0 {
				t.Fatalf("no owner held a slot in %d calls: the test proved nothing", calls.Load())
			}
			for _, q := range queues {
				if peak[q] > most[q] {
					t.Errorf("%d handlers and attempts of %s running at once, under limits of at most %d", peak[q], q, most[q])
				}
			}
			t.Logf("%d leases, %d slots held in all, %d blocks cut by a lowered limit, peaks %v; %v", calls.Load(), took.Load(), cut.Load(), peak, d.Counters())
		})
	}
}

// A slot row missing below the limit (none of this driver's statements
// leaves one on a single server) costs a block only that slot: the owner
// takes the others.
func TestLeaseSlotsAroundAMissingSlot(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if err := d.SetQueueLimits(ctx, "gq", driver.QueueLimits{MaxRunning: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(ctx, "DELETE FROM `"+d.prefix+"limit_slots` WHERE queue = 'gq' AND type = 'c' AND n = 1"); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"gq": 4}
	got, err := d.LeaseSlots(ctx, "a", want, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got["gq"] != (driver.SlotBlock{Held: 3, Usable: 3, MaxRunning: 4}) {
		t.Fatalf("lease of 4 with slot 1 missing: %+v, want 3 of 4", got["gq"])
	}
	checkBlocks(t, d, "a", want, got, nil)
	if err := d.SetQueueLimits(ctx, "gq", driver.QueueLimits{MaxRunning: 4}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.LeaseSlots(ctx, "a", want, time.Minute); err != nil || got["gq"].Held != 4 {
		t.Fatalf("lease of 4 once SetQueueLimits made the slot again: %+v, %v", got, err)
	}
}

// SetQueueLimits and the rescue's trim delete the slots beyond a lowered
// limit only once their owner gave them back: it keeps them while it asks
// for them (its handlers still run under them), using no more than the
// limit.
func TestLoweredLimitKeepsLeasedSlots(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	slots := func() int {
		t.Helper()
		var n int
		if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"limit_slots` WHERE queue = 'lq' AND type = 'c'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := d.SetQueueLimits(ctx, "lq", driver.QueueLimits{MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"lq": 4}, time.Minute); err != nil || got["lq"].Held != 4 {
		t.Fatalf("lease of 4 of 5: %+v, %v", got, err)
	}
	if err := d.SetQueueLimits(ctx, "lq", driver.QueueLimits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := slots(); n != 4 {
		t.Fatalf("%d slots once the limit was lowered to 2 beside a block of 4, want the block's 4 (slot 4, free, deleted)", n)
	}
	if u, err := d.LimitUsage(ctx); err != nil || u["lq"].Running != 4 {
		t.Fatalf("usage %+v, %v: want the block's 4 running", u["lq"], err)
	}
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "lq", Limit: 1, Lease: time.Minute, Worker: "w"}); err != nil || len(r.Rows) != 0 {
		t.Fatalf("claim beside a block above the lowered limit: %+v, %v", r, err)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"lq": 4}, time.Minute); err != nil || got["lq"] != (driver.SlotBlock{Held: 4, Usable: 2, MaxRunning: 2}) {
		t.Fatalf("renewal under the lowered limit, 4 handlers running: %+v, %v; want 4 (2 usable) of 2", got, err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := slots(); n != 4 {
		t.Fatalf("%d slots once the block was renewed above the lowered limit, want the block's 4", n)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"lq": 2}, time.Minute); err != nil || got["lq"] != (driver.SlotBlock{Held: 2, Usable: 2, MaxRunning: 2}) {
		t.Fatalf("renewal of 2 under the lowered limit: %+v, %v; want 2 of 2", got, err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := slots(); n != 2 {
		t.Fatalf("%d slots once the block was given back down to the limit, want 2", n)
	}
}

// The rescue gives back an expired block only on the row's latest
// version: a renewal under way when it comes (its transaction holds the
// slots) is waited for, and the renewed block stays with its owner.
func TestRescueKeepsABlockRenewedMeanwhile(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if err := d.SetQueueLimits(ctx, "rq", driver.QueueLimits{MaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"rq": 3}, 100*time.Millisecond); err != nil || got["rq"].Held != 3 {
		t.Fatalf("lease of 3: %+v, %v", got, err)
	}
	time.Sleep(300 * time.Millisecond)
	// The renewal's statement, in a transaction left open.
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, d.q.LeaseRenew, micros(time.Minute), "rq", "a"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Rescue(ctx, 100)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the rescue returned (%v) while the renewal held the expired block", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := owned(t, d, "a")["rq"]; len(h) != 3 {
		t.Fatalf("a holds %v after a rescue that met its renewal, want 3 slots", h)
	}
	// Expired and not renewed, with no job running: given back.
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"rq": 3}, time.Millisecond); err != nil || got["rq"].Held != 3 {
		t.Fatalf("renewal: %+v, %v", got, err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if h := owned(t, d, "a")["rq"]; len(h) != 0 {
		t.Fatalf("a holds %v of an expired block with no job running after a rescue, want none", h)
	}
}
