package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// claimingFake is the fake driver with inserts that claim
// (driver.InsertClaimer): a flagged job becomes a held attempt of the
// inserting process at once, the others pending as Insert makes them.
// insertClaim, when set, answers in its place.
type claimingFake struct {
	*fakeDriver
	insertClaim func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error)
	// flags records the claim flags of every call.
	mu    sync.Mutex
	flags [][]bool
}

func (d *claimingFake) InsertClaiming(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	d.record(call{op: "insertclaim", params: slices.Clone(jobs), who: c.Worker, dur: c.Lease})
	d.mu.Lock()
	d.flags = append(d.flags, slices.Clone(c.Claim))
	d.mu.Unlock()
	if d.insertClaim != nil {
		return d.insertClaim(ctx, jobs, c)
	}
	return d.claimNow(jobs, c)
}

// claimNow is InsertClaiming without its hook: a flagged job becomes a
// held attempt, the others pending.
func (d *claimingFake) claimNow(jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	d.fakeDriver.mu.Lock()
	defer d.fakeDriver.mu.Unlock()
	ids := make([]int64, len(jobs))
	rows := make([]*driver.JobRow, len(jobs))
	for i, j := range jobs {
		d.nextID++
		ids[i] = d.nextID
		r := &driver.JobRow{ID: d.nextID, Queue: j.Queue, Kind: j.Kind, Args: j.Args,
			State: driver.StateRunning, Attempt: 1, Fence: 1, MaxAttempts: j.MaxAttempts, TimeoutMS: j.TimeoutMS}
		if !c.Claim[i] {
			d.pending = append(d.pending, r)
			continue
		}
		if d.held == nil {
			d.held = map[int64]int64{}
		}
		d.held[r.ID] = r.Fence
		rows[i] = r
	}
	return ids, rows, nil
}

// allFlags returns the claim flags of every InsertClaiming call.
func (d *claimingFake) allFlags() [][]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.flags)
}

// newClaiming returns a claiming fake with a listener, and a config whose
// fallback poll is a minute away: an idle fetcher claims only when woken,
// so that no poll of its own races the inserts a test makes.
func newClaiming(queues map[string]int) (*claimingFake, Config) {
	d := &claimingFake{fakeDriver: &fakeDriver{listen: true, wakeups: make(chan string, 4)}}
	cfg := testConfig(time.Minute)
	cfg.Queues = queues
	cfg.ListenPoll = time.Minute
	return d, cfg
}

// plainJob is a job an insert may claim: due at once, two attempts.
func plainJob(queue string) driver.InsertParams {
	return driver.InsertParams{Queue: queue, Kind: "k", Args: []byte(`{}`), MaxAttempts: 2}
}

// A process whose workers of a queue wait for work claims the jobs it
// enqueues there in the insert: they run without a claim of the fetcher,
// and only as many as there are free workers are claimed; the others are
// left for the fetcher, which the insert wakes.
func TestInsertClaimsForIdleWorkers(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 2})
	release := make(chan struct{})
	var ran atomic.Int64
	e := New(d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		ran.Add(1)
		<-release
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	claimsBefore := len(d.claimsOf("q"))

	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job claimed at insert to run", func() bool { return ran.Load() == 1 })
	if n := len(d.claimsOf("q")); n != claimsBefore {
		t.Fatalf("%d claims after the insert, want none: the insert claimed the job", n-claimsBefore)
	}
	if got := e.Metrics().ClaimedAtInsert.Load(); got != 1 {
		t.Fatalf("ClaimedAtInsert %d, want 1", got)
	}

	// One worker is busy: of three jobs, the insert claims one, and the
	// fetcher takes the other two as workers free.
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("q"), plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	flags := d.allFlags()
	if got := flags[len(flags)-1]; !slices.Equal(got, []bool{true, false, false}) {
		t.Fatalf("claim flags %v, want [true false false]: one worker was free", got)
	}
	close(release)
	waitFor(t, "every job to run and complete", func() bool { return ran.Load() == 4 && len(d.heldIDs()) == 0 })
	if p := d.stillPending(); len(p) != 0 {
		t.Fatalf("jobs %v never claimed", p)
	}
	if got := e.Metrics().ClaimedAtInsert.Load(); got != 2 {
		t.Fatalf("ClaimedAtInsert %d, want 2", got)
	}
}

// Jobs an insert must not claim are not flagged: delayed or scheduled
// ones, those with a single attempt, unique ones, and those of a queue
// with limits or of a queue this process does not work.
func TestInsertClaimSkips(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 4, "limited": 4})
	d.setLimits("limited", driver.QueueLimits{MaxRunning: 5})
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetchers to find their queues empty", func() bool { return d.idle("q") && d.idle("limited") })

	delayed := plainJob("q")
	delayed.Delay = time.Hour
	at := plainJob("q")
	at.RunAt = time.Now().Add(-time.Second)
	once := plainJob("q")
	once.MaxAttempts = 1
	jobs := []driver.InsertParams{delayed, at, once, plainJob("limited"), plainJob("elsewhere")}
	if _, _, err := e.Insert(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	if n := d.count("insertclaim"); n != 0 {
		t.Fatalf("%d inserts that claim, want none: %v", n, d.allFlags())
	}
	uniq := plainJob("q")
	uniq.UniqueKey = []byte("u")
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{uniq, plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	if n := d.count("insertclaim"); n != 0 {
		t.Fatalf("a call with a unique job went through an insert that claims")
	}
	// A plain due job of the worked queue alone is claimed, once the
	// fetcher has claimed the jobs above and waits again.
	waitFor(t, "the fetcher to find the queue empty again", func() bool { return d.idle("q") && len(d.stillPending()) <= 1 })
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	if n := d.count("insertclaim"); n != 1 {
		t.Fatalf("%d inserts that claim, want 1", n)
	}
}

// An insert that fails gives its reserved workers back: the fetcher then
// claims full batches for every worker again.
func TestInsertClaimFailureGivesWorkersBack(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 3})
	d.insertClaim = func(context.Context, []driver.InsertParams, driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		return nil, nil, driver.NotCommitted(errors.New("refused"))
	}
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("q")}); err == nil {
		t.Fatal("the failed insert reported success")
	}
	e.mu.Lock()
	f := e.fetchers["q"]
	e.mu.Unlock()
	if n := f.running.Load(); n != 0 {
		t.Fatalf("%d workers still counted running after the failed insert, want 0", n)
	}
	rows := make([]*driver.JobRow, 3)
	for i := range rows {
		rows[i] = jobIn("q", int64(100+i), 1)
	}
	d.add(rows...)
	e.Wake("q")
	waitFor(t, "a claim of the three jobs", func() bool {
		for _, c := range d.claimsOf("q") {
			if c.done && len(c.ids) == 3 && c.limit == 3 {
				return true
			}
		}
		return false
	})
}

// Inserts that claim, racing Stop, lose no job: every job they claimed
// either ran and was completed or was released, and Stop returns.
func TestInsertClaimRacingStop(t *testing.T) {
	claimed := 0
	for round := range 20 {
		d, cfg := newClaiming(map[string]int{"q": 4})
		cfg.ShutdownTimeout = 50 * time.Millisecond
		e := New(d, cfg, map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
			<-ctx.Done() // until Stop cancels it: released, not completed
			return ctx.Err()
		}})
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, _ = e.Insert(context.Background(), []driver.InsertParams{plainJob("q")})
			}()
		}
		if round%2 == 1 {
			time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		}
		if err := e.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		// Close waits for the inserter, which hands over or releases
		// what its last insert claimed after its callers returned.
		e.Close(context.Background())
		if held := d.heldIDs(); len(held) != 0 {
			t.Fatalf("round %d: jobs %v held after Stop: claimed at insert and neither completed nor released", round, held)
		}
		for _, f := range d.allFlags() {
			if slices.Contains(f, true) {
				claimed++
			}
		}
	}
	if claimed == 0 {
		t.Fatal("no insert claimed a job in any round: the race was never run")
	}
}

// An insert that claims and commits after Stop closed the workers
// releases its jobs at once, fenced, instead of handing them to workers
// that are gone.
func TestInsertClaimCommittedAfterStop(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 4})
	entered, proceed := make(chan struct{}), make(chan struct{})
	d.insertClaim = func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		close(entered)
		<-proceed
		return d.claimNow(jobs, c)
	}
	cfg.ShutdownTimeout = 10 * time.Millisecond
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	done := make(chan error, 1)
	go func() {
		_, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("q")})
		done <- err
	}()
	recv(t, "the insert that claims", entered)
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := recv(t, "the insert's answer", done); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the jobs claimed after Stop released", func() bool { return d.released.Load() == 2 })
	if held := d.heldIDs(); len(held) != 0 {
		t.Fatalf("jobs %v still held", held)
	}
}

// The fetcher never claims past its free workers: workers reserved by an
// insert while the fetcher waited for a wake-up (its free slots counted
// before it began to wait) are not claimed for again when the insert's
// jobs left available wake it.
func TestInsertClaimFetcherCountsReservations(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 2})
	release := make(chan struct{})
	var ran atomic.Int64
	e := New(d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		ran.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	t.Cleanup(func() { close(release) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	e.mu.Lock()
	f := e.fetchers["q"]
	e.mu.Unlock()

	// Both workers taken by jobs claimed at insert, one insert each.
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first job to run", func() bool { return ran.Load() == 1 })
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("q"), plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second job to run", func() bool { return ran.Load() == 2 })

	// Both workers are busy: the two jobs left available must wait in
	// the database for a worker to free, not be claimed now.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := f.running.Load(); n > int64(f.max) {
			cs := d.claimsOf("q")
			last := cs[len(cs)-1]
			t.Fatalf("%d attempts held by a fetcher of %d workers, both busy: its last claim asked for %d and took %v",
				n, f.max, last.limit, last.ids)
		}
		time.Sleep(time.Millisecond)
	}
}

// An insert counts no notification of its own (selfNotes) for the jobs
// it is to claim, which send none: another process's notification of the
// queue that arrives while the insert is under way is not passed over,
// and its job is claimed at once, not at the fetcher's fallback poll.
func TestInsertClaimKeepsForeignNotification(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 2})
	entered, proceed := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	d.insertClaim = func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-proceed
		}
		return d.claimNow(jobs, c)
	}
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	// The listener is up (it wakes the fetcher): a notification now is
	// one it receives, not one its connect forgets.
	before := len(d.claimsOf("q"))
	d.wakeups <- "q"
	waitFor(t, "the listener to wake the fetcher", func() bool { return len(d.claimsOf("q")) > before && d.idle("q") })

	done := make(chan error, 1)
	go func() {
		_, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")})
		done <- err
	}()
	recv(t, "the insert that claims", entered)
	// Another process commits a job of q; its notification arrives while
	// this process's insert is under way.
	before = len(d.claimsOf("q"))
	d.add(jobIn("q", 1000, 1))
	d.wakeups <- "q"
	waitFor(t, "the listener to take the notification", func() bool {
		return e.Metrics().SelfNotices.Load() > 0 || len(d.claimsOf("q")) > before
	})
	passedOver := e.Metrics().SelfNotices.Load()
	close(proceed)
	if err := recv(t, "the insert's answer", done); err != nil {
		t.Fatal(err)
	}
	// One worker is free: the other process's job must be claimed now,
	// not at the next fallback poll a minute away.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if len(d.stillPending()) == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("job 1000 of another process still not claimed after 2s (%d notification(s) passed over as this process's own; "+
		"the insert claimed its own job, so it neither notified nor woke the queue)", passedOver)
}

// With fewer free workers than claimable jobs of a queue in one insert,
// the jobs of the highest priority (smallest value) are claimed, so that
// smaller priorities still run first.
func TestInsertClaimByPriority(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 1})
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	low, high := plainJob("q"), plainJob("q")
	low.Priority, high.Priority = 10, -10
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{low, high}); err != nil {
		t.Fatal(err)
	}
	flags := d.allFlags()
	if len(flags) != 1 {
		t.Fatalf("%d inserts that claim, want 1", len(flags))
	}
	if got := flags[0]; !got[1] {
		t.Fatalf("claim flags %v for priorities [10 -10] and one free worker: the lower priority (10) was claimed to run first", got)
	}
}

// A job claimed at insert whose row says when its lease began
// (LeaseFrom: the insert waited for a lock first) is held valid for a
// lease from then, as a claim's row is, not from when the insert was
// sent.
func TestInsertClaimLeaseFrom(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"q": 1})
	var from time.Time
	d.insertClaim = func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		time.Sleep(100 * time.Millisecond) // the wait for the lock
		from = time.Now()
		ids, rows, err := d.claimNow(jobs, c)
		for _, r := range rows {
			if r != nil {
				r.LeaseFrom = from
			}
		}
		return ids, rows, err
	}
	release := make(chan struct{})
	defer close(release)
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		<-release
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "the fetcher to find the queue empty", func() bool { return d.idle("q") })
	ids, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	f := e.fetchers["q"]
	e.mu.Unlock()
	var valid time.Time
	waitFor(t, "the job claimed at insert to be held", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if it := f.leases[ids[0]]; it != nil {
			valid = it.validUntil
		}
		return !valid.IsZero()
	})
	if want := from.Add(cfg.Lease); valid.Before(want) {
		t.Fatalf("held valid until %v, want %v: a lease from its row's LeaseFrom", valid, want)
	}
}

// An insert that claims is a claim of its queues: a change of a queue's
// limits made in this process (LimitsChanged, as SetQueueLimits makes)
// returns only once an insert that chose to claim under the old limits
// has returned. Without it, an insert sent just before the change could
// start jobs after SetQueueLimits returned, with none of the slots the new
// limits ask for.
func TestLimitsChangedWaitsForInsertClaims(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"a": 2, "q": 2})
	entered := make(chan struct{}, 1)
	stall := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(stall) }) }
	d.insertClaim = func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		entered <- struct{}{}
		<-stall
		return d.claimNow(jobs, c)
	}
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	t.Cleanup(release) // before the engine closes: a stalled insert holds it up
	waitFor(t, "both fetchers to find their queues empty", func() bool { return d.idle("a") && d.idle("q") })

	// One insert claims a job of each queue; it stalls in the database.
	inserted := make(chan error, 1)
	go func() {
		_, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("a")})
		inserted <- err
	}()
	recv(t, "the claiming insert under way", entered)
	if f := d.allFlags(); len(f) != 1 || !f[0][0] || !f[0][1] {
		t.Fatalf("claim flags %v, want one insert claiming both jobs", f)
	}

	// The limits are stored, then the cache told, as SetQueueLimits does.
	d.setLimits("q", driver.QueueLimits{MaxRunning: 1})
	changed := make(chan error, 1)
	go func() { changed <- e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 1}) }()
	select {
	case err := <-changed:
		t.Fatalf("LimitsChanged returned (%v) while an insert that claims under the old limits was still running", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if err := recv(t, "LimitsChanged after the insert returned", changed); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, "the insert", inserted); err != nil {
		t.Fatal(err)
	}
	// The queue is limited now: a later insert does not claim its job.
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q")}); err != nil {
		t.Fatal(err)
	}
	for _, f := range d.allFlags()[1:] {
		if slices.Contains(f, true) {
			t.Fatalf("an insert after the queue was limited claimed its job (flags %v)", f)
		}
	}
}

// An insert never waits for a change of limits: while one waits for a
// queue's claims gate (a claim of the queue begun before it still
// running), an insert claims none of that queue's jobs, which wait for a
// claim, and claims those of the other queues as before. (That it claims
// none of the queue's jobs the limits cache, changed before the wait,
// ensures too; TestLimitsChangedWaitsForInsertClaims checks the gate
// itself. This test fails when an insert waits for the gate.)
func TestInsertClaimsPassOverALimitsChange(t *testing.T) {
	d, cfg := newClaiming(map[string]int{"a": 2, "q": 2})
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "both fetchers to find their queues empty", func() bool { return d.idle("a") && d.idle("q") })

	unlock := e.lockClaims("q") // a claim of q under way
	var once sync.Once
	t.Cleanup(func() { once.Do(unlock) })
	d.setLimits("q", driver.QueueLimits{MaxRunning: 1})
	changed := make(chan error, 1)
	go func() { changed <- e.LimitsChanged(context.Background(), "q", driver.QueueLimits{MaxRunning: 1}) }()
	waitFor(t, "the change to wait for the gate", func() bool {
		u, ok := e.tryLockClaims("q")
		if ok {
			u()
		}
		return !ok
	})

	inserted := make(chan error, 1)
	go func() {
		_, _, err := e.Insert(context.Background(), []driver.InsertParams{plainJob("q"), plainJob("a")})
		inserted <- err
	}()
	if err := recv(t, "the insert while the change waits", inserted); err != nil {
		t.Fatal(err)
	}
	f := d.allFlags()
	if len(f) != 1 || f[0][0] || !f[0][1] {
		t.Fatalf("claim flags %v, want one insert claiming the job of a and not the job of q", f)
	}
	once.Do(unlock)
	if err := recv(t, "LimitsChanged after the claim returned", changed); err != nil {
		t.Fatal(err)
	}
}
