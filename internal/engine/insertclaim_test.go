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

// plainJob is a job an insert may claim: due at once, two attempts.
func plainJob(queue string) driver.InsertParams {
	return driver.InsertParams{Queue: queue, Kind: "k", Args: []byte(`{}`), MaxAttempts: 2}
}

// A process whose workers of a queue wait for work claims the jobs it
// enqueues there in the insert: they run without a claim of the fetcher,
// and only as many as there are free workers are claimed; the others are
// left for the fetcher, which the insert wakes.
func TestInsertClaimsForIdleWorkers(t *testing.T) {
	d := &claimingFake{fakeDriver: &fakeDriver{}}
	release := make(chan struct{})
	var ran atomic.Int64
	cfg := testConfig(time.Minute)
	cfg.Queues = map[string]int{"q": 2}
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
	d := &claimingFake{fakeDriver: &fakeDriver{}}
	d.setLimits("limited", driver.QueueLimits{MaxRunning: 5})
	cfg := testConfig(time.Minute)
	cfg.Queues = map[string]int{"q": 4, "limited": 4}
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
	// A plain due job of the worked queue alone is claimed.
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
	d := &claimingFake{fakeDriver: &fakeDriver{}}
	d.insertClaim = func(context.Context, []driver.InsertParams, driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		return nil, nil, driver.NotCommitted(errors.New("refused"))
	}
	cfg := testConfig(time.Minute)
	cfg.Queues = map[string]int{"q": 3}
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
	for round := range 20 {
		d := &claimingFake{fakeDriver: &fakeDriver{}}
		cfg := testConfig(time.Minute)
		cfg.Queues = map[string]int{"q": 4}
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
		if held := d.heldIDs(); len(held) != 0 {
			t.Fatalf("round %d: jobs %v held after Stop: claimed at insert and neither completed nor released", round, held)
		}
		e.Close(context.Background())
	}
}

// An insert that claims and commits after Stop closed the workers
// releases its jobs at once, fenced, instead of handing them to workers
// that are gone.
func TestInsertClaimCommittedAfterStop(t *testing.T) {
	d := &claimingFake{fakeDriver: &fakeDriver{}}
	entered, proceed := make(chan struct{}), make(chan struct{})
	d.insertClaim = func(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
		close(entered)
		<-proceed
		d.insertClaim = nil
		return d.InsertClaiming(ctx, jobs, c)
	}
	cfg := testConfig(time.Minute)
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
