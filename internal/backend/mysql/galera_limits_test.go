package mysql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// galeraNodes opens a driver on each node of the package's Galera
// cluster, all on one fresh prefix migrated through node 1, whose tables
// are dropped and drivers closed when t ends.
func galeraNodes(t *testing.T) []*Driver {
	t.Helper()
	g := galera(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var ds []*Driver
	for i := 1; i <= 3; i++ {
		d, err := Open(ctx, g.DSN(i), driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		ds = append(ds, d)
	}
	if _, err := ds[0].Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ds[0].DropAll(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return ds
}

// setLimitsEverywhere sets queue's limits through node 1 and returns once
// every node has them (QueueLimits reads causally): an earlier claim
// through a node that has not would rightly claim without them.
func setLimitsEverywhere(t *testing.T, ds []*Driver, queue string, l driver.QueueLimits) {
	t.Helper()
	ctx := context.Background()
	if err := ds[0].SetQueueLimits(ctx, queue, l); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if _, err := d.QueueLimits(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGaleraLimitedClaimsAcrossNodes: workers on the three nodes claim
// jobs of a queue with MaxRunning 3, hold each briefly and complete it,
// while the rescue runs on node 1 and now and then an attempt is left to
// its lease (a killed worker). The nodes' appliers keep aborting claims
// whose locks they need. No claim may hand out a job beyond the limit
// (counted from the claim's return to the outcome's call, a span within
// the slot's hold) or an attempt whose marking did not commit (its fence
// would come again).
func TestGaleraLimitedClaimsAcrossNodes(t *testing.T) {
	ctx := context.Background()
	ds := galeraNodes(t)
	const maxRunning, jobs = 3, 600
	const lease = time.Second
	if _, err := ds[0].Insert(ctx, limitJobs("gq", jobs)); err != nil {
		t.Fatal(err)
	}
	setLimitsEverywhere(t, ds, "gq", driver.QueueLimits{MaxRunning: maxRunning})

	var (
		mu       sync.Mutex
		running  int
		peak     int
		fences   = map[int64]int64{}
		repeated []int64
		settled  atomic.Int64
		// claimErrs counts the claims that failed (the first is reported).
		claimErrs atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, d := range ds {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					claimed := time.Now()
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "gq", Limit: 1 + rand.IntN(2), Lease: lease, Worker: "w"})
					if err != nil {
						if claimErrs.Add(1) == 1 {
							t.Errorf("claim: %v", err)
						}
						time.Sleep(time.Millisecond)
						continue
					}
					if len(r.Rows) == 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					mu.Lock()
					running += len(r.Rows)
					peak = max(peak, running)
					for _, j := range r.Rows {
						if f, ok := fences[j.ID]; ok && j.Fence <= f {
							repeated = append(repeated, j.ID)
						}
						fences[j.ID] = j.Fence
					}
					mu.Unlock()
					time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
					mu.Lock()
					running -= len(r.Rows)
					mu.Unlock()
					var outs []driver.Outcome
					for _, j := range r.Rows {
						if rand.IntN(50) == 0 {
							continue // left to the rescue
						}
						outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateCompleted})
					}
					done, err := d.Complete(ctx, outs)
					if err != nil {
						t.Errorf("complete: %v", err)
						return
					}
					// An attempt may be rescued once its lease passed (a
					// loaded machine can hold a worker that long), and its
					// completion is then rightly refused; within the
					// lease, counted from before the claim, it may not.
					if len(done) != len(outs) && time.Since(claimed) < lease {
						t.Errorf("complete of %d live attempts applied %d", len(outs), len(done))
					}
					settled.Add(int64(len(done)))
				}
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := ds[0].Rescue(ctx, 100); err != nil {
				t.Errorf("rescue: %v", err)
				return
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for settled.Load() < jobs && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := claimErrs.Load(); n > 0 {
		t.Errorf("%d claims failed", n)
	}
	if settled.Load() < jobs {
		t.Errorf("%d of %d jobs completed", settled.Load(), jobs)
	}
	if peak > maxRunning {
		t.Errorf("%d attempts held at once, MaxRunning %d", peak, maxRunning)
	}
	if len(repeated) > 0 {
		t.Errorf("claims handed out a fence already handed out for jobs %v: their marking never committed", repeated)
	}
}

// TestGaleraKeyedClaimsAcrossNodes: workers on the three nodes claim
// keyed jobs of a queue with KeyMaxRunning 1 and MaxRunning 4, hold each
// briefly and complete it, while the rescue (and its sweep of key slots)
// runs on node 1 and now and then an attempt is left to its lease. The
// nodes' appliers keep aborting claims whose locks they need. No claim
// may hand out a second job of a key while one runs (counted from the
// claim's return to the outcome's call), or a fence already handed out.
func TestGaleraKeyedClaimsAcrossNodes(t *testing.T) {
	ctx := context.Background()
	ds := galeraNodes(t)
	const maxRunning, nKeys, jobs = 4, 6, 300
	const lease = time.Second
	all := limitJobs("gk", jobs)
	for i := range all {
		all[i].Key = fmt.Sprintf("key-%d", i%nKeys)
	}
	if _, err := ds[0].Insert(ctx, all); err != nil {
		t.Fatal(err)
	}
	setLimitsEverywhere(t, ds, "gk", driver.QueueLimits{MaxRunning: maxRunning, KeyMaxRunning: 1})
	var (
		mu       sync.Mutex
		running  = map[string]int{}
		total    int
		errs     []string
		fences   = map[int64]int64{}
		repeated []int64
		settled  atomic.Int64
		// claimErrs counts the claims that failed (the first is reported).
		claimErrs atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, d := range ds {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					claimed := time.Now()
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "gk", Limit: 1 + rand.IntN(3), Lease: lease, Worker: "w"})
					if err != nil {
						if claimErrs.Add(1) == 1 {
							t.Errorf("claim: %v", err)
						}
						time.Sleep(time.Millisecond)
						continue
					}
					if len(r.Rows) == 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					mu.Lock()
					total += len(r.Rows)
					if total > maxRunning {
						errs = append(errs, fmt.Sprintf("%d attempts held at once, MaxRunning %d", total, maxRunning))
					}
					for _, j := range r.Rows {
						if running[j.Key]++; running[j.Key] > 1 {
							errs = append(errs, fmt.Sprintf("job %d of key %s claimed while another of the key runs", j.ID, j.Key))
						}
						if f, ok := fences[j.ID]; ok && j.Fence <= f {
							repeated = append(repeated, j.ID)
						}
						fences[j.ID] = j.Fence
					}
					mu.Unlock()
					time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
					mu.Lock()
					total -= len(r.Rows)
					for _, j := range r.Rows {
						running[j.Key]--
					}
					mu.Unlock()
					var outs []driver.Outcome
					for _, j := range r.Rows {
						if rand.IntN(50) == 0 {
							continue // left to the rescue
						}
						outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateCompleted})
					}
					done, err := d.Complete(ctx, outs)
					if err != nil {
						t.Errorf("complete: %v", err)
						return
					}
					if len(done) != len(outs) && time.Since(claimed) < lease {
						t.Errorf("complete of %d live attempts applied %d", len(outs), len(done))
					}
					settled.Add(int64(len(done)))
				}
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := ds[0].Rescue(ctx, 100); err != nil {
				t.Errorf("rescue: %v", err)
				return
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for settled.Load() < jobs && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := claimErrs.Load(); n > 0 {
		t.Errorf("%d claims failed", n)
	}
	if settled.Load() < jobs {
		t.Errorf("%d of %d jobs completed", settled.Load(), jobs)
	}
	if len(errs) > 0 {
		t.Errorf("%d limit breaches, the first: %s", len(errs), errs[0])
	}
	if len(repeated) > 0 {
		t.Errorf("claims handed out a fence already handed out for jobs %v: their marking never committed", repeated)
	}
}

// TestGaleraKeyRatesAcrossNodes: claimers on the three nodes race over
// keys with a rate per key (and a slot per key): the rate slots two
// nodes stamp at once conflict at certification and one claim runs
// again, so each key starts exactly its rate's jobs, none twice, while
// the rescue's sweep runs on node 1.
func TestGaleraKeyRatesAcrossNodes(t *testing.T) {
	ctx := context.Background()
	ds := galeraNodes(t)
	const nKeys, perKey, rate = 6, 20, 4
	var all []driver.InsertParams
	for k := 0; k < nKeys; k++ {
		all = append(all, keyedJobs("gr", fmt.Sprintf("key-%d", k), perKey)...)
	}
	if _, err := ds[0].Insert(ctx, all); err != nil {
		t.Fatal(err)
	}
	setLimitsEverywhere(t, ds, "gr", driver.QueueLimits{KeyMaxRunning: 2, KeyRate: rate, KeyRatePeriod: time.Hour})
	var (
		mu    sync.Mutex
		seen  = map[int64]bool{}
		byKey = map[string]int{}
		errs  []string
	)
	var wg sync.WaitGroup
	for _, d := range ds {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for round := 0; round < 15; round++ {
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "gr", Limit: 1 + rand.IntN(4), Lease: time.Hour, Worker: "w"})
					if err != nil {
						mu.Lock()
						errs = append(errs, "claim: "+err.Error())
						mu.Unlock()
						return
					}
					mu.Lock()
					for _, j := range r.Rows {
						if seen[j.ID] {
							errs = append(errs, fmt.Sprintf("job %d claimed twice", j.ID))
						}
						seen[j.ID] = true
						byKey[j.Key]++
					}
					mu.Unlock()
					var outs []driver.Outcome
					for _, j := range r.Rows {
						outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateCompleted})
					}
					if len(outs) > 0 {
						if _, err := d.Complete(ctx, outs); err != nil {
							mu.Lock()
							errs = append(errs, "complete: "+err.Error())
							mu.Unlock()
							return
						}
					}
				}
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 5 {
			if _, err := ds[0].Rescue(ctx, 100); err != nil {
				mu.Lock()
				errs = append(errs, "rescue: "+err.Error())
				mu.Unlock()
				return
			}
		}
	}()
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	// What the racing claims left (lost races, their rounds spent) is
	// taken now, and no more.
	rows, _ := claimAll(t, ds[1], "gr", 50)
	for _, j := range rows {
		if seen[j.ID] {
			t.Errorf("job %d claimed twice", j.ID)
		}
		byKey[j.Key]++
	}
	for k := 0; k < nKeys; k++ {
		if n := byKey[fmt.Sprintf("key-%d", k)]; n != rate {
			t.Errorf("key-%d: %d started, want %d", k, n, rate)
		}
	}
}

// TestGaleraSlotBlocksAcrossNodes: owners on the three nodes lease blocks
// of a queue with MaxRunning 4 at random and run jobs under them (blocked
// claims, as many at once as they may use), beside workers taking slots
// one attempt at a time on every node, while the rescue runs on node 1.
// Two nodes' writes of one slot conflict at certification instead of
// waiting for each other's locks, and the appliers abort local
// transactions. The slots every process believes it may use (an owner's
// Usable from the lease that returned it until it means to give it back,
// an attempt's slot from the claim's return to the outcome's call: spans
// within the real holds) never exceed the limit; an owner holds in the
// table what its lease returned (checkBlocks), and, the limit never
// lowered, may use all of it.
func TestGaleraSlotBlocksAcrossNodes(t *testing.T) {
	ctx := context.Background()
	ds := galeraNodes(t)
	const maxRunning = 4
	if _, err := ds[0].Insert(ctx, limitJobs("gb", 200)); err != nil {
		t.Fatal(err)
	}
	setLimitsEverywhere(t, ds, "gb", driver.QueueLimits{MaxRunning: maxRunning})
	var (
		mu         sync.Mutex
		believed   int
		peak       int
		leases     atomic.Int64
		blockedRan atomic.Int64
	)
	hold := func(n int) {
		mu.Lock()
		believed += n
		peak = max(peak, believed)
		mu.Unlock()
	}
	// run runs rows for a moment and retries them at once (the queue never
	// runs dry), through d.
	run := func(d *Driver, rows []*driver.JobRow) error {
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
		var outs []driver.Outcome
		for _, j := range rows {
			outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateScheduled})
		}
		_, err := d.Complete(ctx, outs)
		return err
	}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	for i, d := range ds {
		for k := range 2 {
			wg.Add(1)
			go func() { // an owner
				defer wg.Done()
				owner := fmt.Sprintf("node%d/owner%d", i+1, k)
				usable := 0
				var slots map[string][]int
				for !stopped() {
					want := rand.IntN(maxRunning + 2)
					if want < usable {
						hold(want - usable) // it stops using what it gives back
						usable = want
					}
					got, err := d.LeaseSlots(ctx, owner, map[string]int{"gb": want}, time.Minute)
					if err != nil {
						t.Errorf("lease: %v", err)
						return
					}
					leases.Add(1)
					b := got["gb"]
					hold(b.Usable - usable)
					usable = b.Usable
					var ok bool
					if slots, ok = checkBlocks(t, d, owner, map[string]int{"gb": want}, got, slots); !ok {
						return
					}
					if b.Usable != b.Held {
						t.Errorf("%s: may use %d of the %d slots it holds, a limit never lowered", owner, b.Usable, b.Held)
						return
					}
					if usable > 0 {
						r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "gb", Limit: usable, Lease: time.Minute, Worker: owner, Blocked: true})
						if err != nil {
							t.Errorf("blocked claim: %v", err)
							return
						}
						blockedRan.Add(int64(len(r.Rows)))
						if err := run(d, r.Rows); err != nil {
							t.Errorf("complete: %v", err)
							return
						}
					}
				}
				hold(-usable)
				if _, err := d.LeaseSlots(ctx, owner, map[string]int{"gb": 0}, time.Minute); err != nil {
					t.Errorf("give back: %v", err)
				}
			}()
		}
		wg.Add(1)
		go func() { // attempts taking slots of their own
			defer wg.Done()
			for !stopped() {
				r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "gb", Limit: 1, Lease: time.Minute, Worker: "w"})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				hold(len(r.Rows))
				time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
				hold(-len(r.Rows))
				if err := run(d, r.Rows); err != nil {
					t.Errorf("complete: %v", err)
					return
				}
				if len(r.Rows) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the leader's rescue and promotion
		defer wg.Done()
		for !stopped() {
			time.Sleep(20 * time.Millisecond)
			if _, err := ds[0].Rescue(ctx, 100); err != nil {
				t.Errorf("rescue: %v", err)
				return
			}
			if _, err := ds[0].Promote(ctx, 500); err != nil {
				t.Errorf("promote: %v", err)
				return
			}
		}
	}()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if peak > maxRunning {
		t.Errorf("%d slots believed held at once, MaxRunning %d", peak, maxRunning)
	}
	if blockedRan.Load() == 0 {
		t.Errorf("no job ran under a block in %d leases: the test proved nothing", leases.Load())
	}
	if u, err := ds[0].LimitUsage(ctx); err != nil || u["gb"].Running != 0 {
		t.Errorf("usage once every owner gave its block back and every attempt ended: %+v, %v", u["gb"], err)
	}
	var counters []map[string]int64
	for _, d := range ds {
		counters = append(counters, d.Counters())
	}
	t.Logf("%d leases, %d jobs run under blocks, peak %d; counters by node %v", leases.Load(), blockedRan.Load(), peak, counters)
}
