package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// A fetcher whose handlers run longer than aheadMaxRun never claims more
// jobs than its queue has free worker slots: at every claim, the jobs
// claimed and not yet finished plus the limit asked for fit in the slots,
// so no more handlers run at once than slots; and the slots are all used
// while there is work.
func TestFetchRespectsWorkerSlots(t *testing.T) {
	const slots, n = 3, 20
	d := &fakeDriver{}
	d.add(jobs(n)...)
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": slots}
	cfg.ClaimBatch = 2 // smaller than the slots, so that limits vary
	var returned atomic.Int64
	var mu sync.Mutex
	var bad []string
	d.onClaim = func(p driver.ClaimParams) {
		claimed := 0
		for _, c := range d.claimsOf("q") {
			claimed += len(c.ids)
		}
		busy := int64(claimed) - returned.Load()
		if p.Limit < 1 || p.Limit > cfg.ClaimBatch || int64(p.Limit)+busy > slots {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("limit %d with %d jobs unfinished", p.Limit, busy))
			mu.Unlock()
		}
	}
	var cur, peak atomic.Int64
	var runsMu sync.Mutex
	runs := map[int64]int{}
	tokens := make(chan struct{})
	startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		runsMu.Lock()
		runs[row.ID]++
		runsMu.Unlock()
		now := cur.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
			// raise peak to now unless another handler raised it higher
		}
		<-tokens
		time.Sleep(aheadMaxRun + time.Millisecond) // not a short job: no claim ahead
		cur.Add(-1)
		returned.Add(1)
		return nil
	}})
	waitFor(t, "every slot busy", func() bool { return cur.Load() == slots })
	// Let the handlers finish one at a time: each freed slot is claimed
	// again while the others stay busy.
	for i := range n {
		select {
		case tokens <- struct{}{}:
		case <-time.After(guard):
			t.Fatalf("handler %d of %d never ran", i+1, n)
		}
	}
	waitFor(t, "every outcome written", func() bool { return len(completedIDs(d)) == n })
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("claims beyond the %d free slots: %v", slots, bad)
	}
	if p := peak.Load(); p != slots {
		t.Fatalf("at most %d handlers ran at once, want %d (the slots)", p, slots)
	}
	runsMu.Lock()
	defer runsMu.Unlock()
	for id := int64(1); id <= n; id++ {
		if runs[id] != 1 {
			t.Fatalf("job %d ran %d times", id, runs[id])
		}
	}
}

// Every claimed job is run exactly once and its outcome written exactly
// once, fenced by its own claim, however the claims are cut into batches.
func TestFetchRunsEachClaimedJobOnce(t *testing.T) {
	const n = 200
	d := &fakeDriver{}
	d.add(jobs(n)...)
	cfg := testConfig(10 * time.Second)
	cfg.ClaimBatch = 3
	var mu sync.Mutex
	runs := map[int64]int{}
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		mu.Lock()
		runs[row.ID]++
		mu.Unlock()
		return nil
	}})
	waitFor(t, "every job completed", func() bool { return e.Metrics().Completed.Load() == n })
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	written := map[int64]int{}
	for _, c := range d.callsOf("complete") {
		for _, o := range c.out {
			written[o.ID]++
			if o.Fence != 100+o.ID || o.State != driver.StateCompleted {
				t.Fatalf("outcome %+v, want completed and fenced by %d", o, 100+o.ID)
			}
		}
	}
	for id := int64(1); id <= n; id++ {
		if runs[id] != 1 || written[id] != 1 {
			t.Fatalf("job %d ran %d times and was written %d times, want once each", id, runs[id], written[id])
		}
	}
	if len(runs) != n || len(written) != n {
		t.Fatalf("%d jobs ran and %d were written, want %d", len(runs), len(written), n)
	}
	if got := e.Metrics().Claimed.Load(); got != n {
		t.Fatalf("claimed %d, want %d", got, n)
	}
	if r := d.released.Load(); r != 0 {
		t.Fatalf("%d jobs released, want none: all finished", r)
	}
}

// A queue with a job now and then is claimed while another queue has an
// endless backlog that keeps its fetcher claiming without pause.
func TestFetchQuietQueueNotStarvedByBusyOne(t *testing.T) {
	d := &fakeDriver{}
	var next atomic.Int64
	d.claim = func(_ context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
		if p.Queue != "busy" {
			return d.takePending(p), nil
		}
		rows := make([]*driver.JobRow, p.Limit) // an endless backlog
		for i := range rows {
			rows[i] = jobIn("busy", 1000+next.Add(1), 1)
		}
		return rows, nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"busy": 2, "quiet": 1}
	cfg.PollMin, cfg.PollMax = time.Millisecond, 5*time.Millisecond
	quiet := make(chan int64, 1)
	startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		if row.Queue == "quiet" {
			quiet <- row.ID
		}
		return nil
	}})
	waitFor(t, "the busy queue in full swing", func() bool { return len(d.claimsOf("busy")) >= 50 })
	d.add(jobIn("quiet", 1, 1))
	if id := recv(t, "the quiet queue's job to run", quiet); id != 1 {
		t.Fatalf("quiet queue ran job %d, want 1", id)
	}
	for _, c := range d.claimsOf("busy") {
		if c.done && len(c.ids) != c.limit {
			t.Fatalf("a busy claim came back with %d of %d jobs: the backlog ran out, the test proves nothing", len(c.ids), c.limit)
		}
	}
}

// A fetcher whose claims come back empty polls less and less often, its
// interval doubling from PollMin up to PollMax, where it stays.
func TestFetchPollBacksOffWhenIdle(t *testing.T) {
	d := &fakeDriver{}
	cfg := testConfig(10 * time.Second)
	cfg.PollMin, cfg.PollMax = 2*time.Millisecond, 16*time.Millisecond
	startEngine(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	// Without the cap the 14th poll would come about 2^14 PollMin (33s)
	// after the start, past the guard.
	const polls = 14
	waitFor(t, fmt.Sprintf("%d polls", polls), func() bool { return len(d.claimsOf("q")) >= polls })
	cs := d.claimsOf("q")
	for i := 1; i < len(cs); i++ {
		want := min(cfg.PollMin<<i, cfg.PollMax)
		if gap := cs[i].at.Sub(cs[i-1].at); gap < want {
			t.Fatalf("empty poll %d came %v after the previous one, want at least %v", i+1, gap, want)
		}
	}
}

// A fetcher waiting out a long poll claims at once when a job due now is
// enqueued in this process, and is not woken by a job scheduled later.
func TestFetchWakesOnEnqueue(t *testing.T) {
	d := &fakeDriver{}
	var delayed atomic.Int64
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(10 + i)
			if p.Delay > 0 {
				delayed.Add(1) // scheduled: not claimable, not added
				continue
			}
			d.add(&driver.JobRow{ID: ids[i], Queue: p.Queue, Kind: p.Kind, Attempt: 1, Fence: 1, MaxAttempts: 1})
		}
		return ids, nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.PollMin, cfg.PollMax = time.Hour, time.Hour
	ran := make(chan int64, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	waitFor(t, "the first, empty claim", func() bool { return d.idle("q") })
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	// Room for a wrongly woken fetcher to claim (it would find nothing).
	time.Sleep(20 * time.Millisecond)
	if n := len(d.claimsOf("q")); n != 1 {
		t.Fatalf("%d claims after enqueueing a job due in an hour, want 1 (no wake-up)", n)
	}
	ids, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, "the enqueued job to run", ran); got != ids[0] {
		t.Fatalf("ran job %d, want %d", got, ids[0])
	}
}

// The notification of this process's own insert, which woke the queue's
// fetcher in process already, costs no second claim; a notification
// another process sends afterwards still wakes it, and so does one that
// follows an insert that failed.
func TestFetchPassesOverOwnInsertNotification(t *testing.T) {
	d := &fakeDriver{listen: true, wakeups: make(chan string)}
	var fail atomic.Bool
	d.insert = func(_ context.Context, ps []driver.InsertParams) ([]int64, error) {
		if fail.Load() {
			return nil, errors.New("insert refused")
		}
		ids := make([]int64, len(ps))
		for i, p := range ps {
			ids[i] = int64(10 + i)
			d.add(&driver.JobRow{ID: ids[i], Queue: p.Queue, Kind: p.Kind, Attempt: 1, Fence: 1, MaxAttempts: 1})
		}
		return ids, nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.PollMin, cfg.PollMax, cfg.ListenPoll = time.Hour, time.Hour, time.Hour
	ran := make(chan int64, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	notify := func(q string) {
		select {
		case d.wakeups <- q:
		case <-time.After(guard):
			t.Fatalf("the listener never waited for notification %q", q)
		}
	}
	settled := func() bool {
		cs := d.claimsOf("q")
		return len(cs) > 0 && cs[len(cs)-1].done
	}
	waitFor(t, "the first, empty claim", func() bool { return d.idle("q") })
	ids, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, "the enqueued job to run", ran); got != ids[0] {
		t.Fatalf("ran job %d, want %d", got, ids[0])
	}
	waitFor(t, "the fetcher's claim returned", settled)
	before := len(d.claimsOf("q"))
	notify("q") // the insert's own notification
	// Room for a wrongly woken fetcher to claim (it would find nothing).
	time.Sleep(20 * time.Millisecond)
	if n := len(d.claimsOf("q")) - before; n != 0 {
		t.Fatalf("%d claims after the process's own insert notification, want 0", n)
	}
	if n := e.Metrics().SelfNotices.Load(); n != 1 {
		t.Fatalf("SelfNotices = %d, want 1", n)
	}

	// Another process's job, same payload: it wakes the fetcher.
	d.add(jobIn("q", 99, 1))
	notify("q")
	if got := recv(t, "the other process's job to run", ran); got != 99 {
		t.Fatalf("ran job %d, want 99", got)
	}
	waitFor(t, "the fetcher's claim returned again", settled)

	// A failed insert sends nothing: the next notification wakes.
	fail.Store(true)
	if _, _, err := e.Insert(context.Background(), []driver.InsertParams{{Queue: "q", Kind: "k"}}); err == nil {
		t.Fatal("the insert succeeded, want its error")
	}
	fail.Store(false)
	waitFor(t, "the fetcher's claim after the failed insert returned", settled)
	d.add(jobIn("q", 100, 1))
	notify("q")
	if got := recv(t, "the job after a failed insert to run", ran); got != 100 {
		t.Fatalf("ran job %d, want 100", got)
	}
}

// With a push channel, a notification for a queue wakes that queue's
// fetcher only; a reconnect report (queue "") and a failure of the
// listener wake every fetcher.
func TestFetchWakesOnNotification(t *testing.T) {
	d := &fakeDriver{listen: true, wakeups: make(chan string)}
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 1, "other": 1}
	cfg.ListenPoll = time.Hour
	ran := make(chan int64, 2)
	startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	notify := func(q string) {
		select {
		case d.wakeups <- q:
		case <-time.After(guard):
			t.Fatalf("the listener never waited for notification %q", q)
		}
	}
	waitFor(t, "both fetchers idle", func() bool { return d.idle("q") && d.idle("other") })
	d.add(jobIn("q", 1, 1))
	notify("q")
	if id := recv(t, "the notified queue's job to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	if n := len(d.claimsOf("other")); n != 1 {
		t.Fatalf("queue other claimed %d times, want 1: only q was notified", n)
	}
	waitFor(t, "both fetchers idle again", func() bool { return d.idle("q") && d.idle("other") })
	d.add(jobIn("q", 2, 1), jobIn("other", 3, 1))
	notify("")
	got := []int64{recv(t, "a job after the reconnect", ran), recv(t, "a job after the reconnect", ran)}
	slices.Sort(got)
	if !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("ran %v after a reconnect, want [2 3]: every queue is woken", got)
	}
	// A listener that fails may have missed notifications: every queue is
	// woken too.
	waitFor(t, "both fetchers idle again", func() bool { return d.idle("q") && d.idle("other") })
	d.add(jobIn("q", 4, 1), jobIn("other", 5, 1))
	notify(listenFailure)
	got = []int64{recv(t, "a job after a listener failure", ran), recv(t, "a job after a listener failure", ran)}
	slices.Sort(got)
	if !slices.Equal(got, []int64{4, 5}) {
		t.Fatalf("ran %v after a listener failure, want [4 5]: every queue is woken", got)
	}
}

// A fetcher whose handlers are short claims one batch ahead of its free
// slots while the queue has a backlog, never more: at every claim the jobs
// claimed and not yet finished plus the limit fit in slots + ClaimBatch;
// still no more handlers run at once than slots, and every job runs once.
func TestFetchClaimsAheadForShortJobs(t *testing.T) {
	const slots, batch, quick, n = 3, 2, 6, 30
	d := &fakeDriver{}
	d.add(jobs(n)...)
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": slots}
	cfg.ClaimBatch = batch
	var returned atomic.Int64
	var mu sync.Mutex
	var beyond, bad []string
	d.onClaim = func(p driver.ClaimParams) {
		claimed := 0
		for _, c := range d.claimsOf("q") {
			claimed += len(c.ids)
		}
		busy := int64(claimed) - returned.Load()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case p.Limit < 1 || p.Limit > batch || int64(p.Limit)+busy > slots+batch:
			bad = append(bad, fmt.Sprintf("limit %d with %d jobs unfinished", p.Limit, busy))
		case int64(p.Limit)+busy > slots:
			beyond = append(beyond, fmt.Sprintf("limit %d with %d jobs unfinished", p.Limit, busy))
		}
	}
	var cur, peak atomic.Int64
	var runsMu sync.Mutex
	runs := map[int64]int{}
	tokens := make(chan struct{})
	startEngine(t, d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		runsMu.Lock()
		runs[row.ID]++
		runsMu.Unlock()
		now := cur.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		if row.ID > quick {
			// The first jobs were short: while these wait for their
			// tokens, the fetcher takes its handlers for short ones.
			<-tokens
			time.Sleep(aheadMaxRun) // long from here on
		}
		cur.Add(-1)
		returned.Add(1)
		return nil
	}})
	waitFor(t, "a batch claimed ahead of the busy slots", func() bool {
		claimed := 0
		for _, c := range d.claimsOf("q") {
			claimed += len(c.ids)
		}
		return cur.Load() == slots && int64(claimed)-returned.Load() == slots+batch
	})
	for i := range n - quick {
		select {
		case tokens <- struct{}{}:
		case <-time.After(guard):
			t.Fatalf("handler %d of %d never ran", quick+i+1, n)
		}
	}
	waitFor(t, "every outcome written", func() bool { return len(completedIDs(d)) == n })
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("claims beyond one batch ahead of the %d slots: %v", slots, bad)
	}
	if len(beyond) == 0 {
		t.Fatal("no claim ran ahead of the free slots")
	}
	if p := peak.Load(); p != slots {
		t.Fatalf("at most %d handlers ran at once, want %d (the slots)", p, slots)
	}
	runsMu.Lock()
	defer runsMu.Unlock()
	for id := int64(1); id <= n; id++ {
		if runs[id] != 1 {
			t.Fatalf("job %d ran %d times", id, runs[id])
		}
	}
}

// Attempts claimed ahead and still waiting for a worker when Stop begins
// are not started: Stop releases them with the other unstarted ones,
// while the running handlers finish.
func TestStopReleasesAttemptsClaimedAhead(t *testing.T) {
	const slots, batch, quick = 2, 2, 4
	d := &fakeDriver{}
	d.add(jobs(quick + slots + batch)...)
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": slots}
	cfg.ClaimBatch = batch
	cfg.ShutdownTimeout = 10 * time.Second
	var runsMu sync.Mutex
	runs := map[int64]int{}
	var cur atomic.Int64
	release := make(chan struct{})
	e := New(d, cfg, map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		runsMu.Lock()
		runs[row.ID]++
		runsMu.Unlock()
		if row.ID > quick {
			cur.Add(1)
			<-release
		}
		return nil
	}})
	// The quick jobs must read as short however loaded the machine is
	// (a handler preempted for a few milliseconds reads as long).
	e.aheadRun = time.Minute
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	waitFor(t, "every slot busy and a batch claimed ahead", func() bool {
		claimed := 0
		for _, c := range d.claimsOf("q") {
			claimed += len(c.ids)
		}
		return cur.Load() == slots && claimed == quick+slots+batch
	})
	stop := stopAsync(e)
	waitFor(t, "Stop to begin", e.stopping.Load)
	close(release)
	if err := recv(t, "Stop to return", stop); err != nil {
		t.Fatal(err)
	}
	runsMu.Lock()
	defer runsMu.Unlock()
	var waited []int64
	for id := int64(quick + slots + 1); id <= quick+slots+batch; id++ {
		waited = append(waited, id)
	}
	started := 0
	for id := int64(1); id <= quick+slots+batch; id++ {
		started += runs[id]
	}
	if started != quick+slots {
		t.Fatalf("%d handlers started, want %d: the %d claimed ahead must not start once Stop began (runs %v)", started, quick+slots, batch, runs)
	}
	var released []int64
	for _, c := range d.callsOf("release") {
		released = append(released, c.ids...)
	}
	slices.Sort(released)
	if !slices.Equal(released, waited) {
		t.Fatalf("released %v at Stop, want the attempts claimed ahead %v", released, waited)
	}
	if got := len(completedIDs(d)); got != quick+slots {
		t.Fatalf("%d outcomes written, want %d", got, quick+slots)
	}
}

// The jobs claimed ahead of free workers are as many as the workers run
// in aheadMaxRun at the handlers' average, at least one batch of the
// workers and at most ClaimBatch; a queue with limits claims one batch
// ahead whatever its handlers take, unless its only limits are per key.
func TestAheadN(t *testing.T) {
	d := &fakeDriver{}
	d.setLimits("lim", driver.QueueLimits{MaxRunning: 50})
	d.setLimits("keys", driver.QueueLimits{KeyMaxRunning: 1})
	d.setLimits("ordered", driver.QueueLimits{Ordered: true})
	d.setLimits("keysrate", driver.QueueLimits{KeyMaxRunning: 1, KeyRate: 5, KeyRatePeriod: time.Second})
	d.setLimits("fair", driver.QueueLimits{KeyMaxRunning: 1, Fair: true})
	cfg := testConfig(10 * time.Second)
	cfg.ClaimBatch = 1000
	e := New(d, cfg, nil)
	t.Cleanup(func() { e.Close(context.Background()) })
	m, err := d.QueueLimits(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.setLimited(m, time.Now())
	f := newFetcher(e, "q", 100, context.Background())
	for _, c := range []struct {
		avg  time.Duration
		want int
	}{
		{10 * time.Microsecond, 1000}, // 5ms x 100 / 10us = 50,000: ClaimBatch
		{time.Millisecond, 500},       // 5ms x 100 / 1ms
		{4 * time.Millisecond, 125},
		{20 * time.Millisecond, 100}, // fewer than one batch of workers: want
	} {
		f.runAvg.Store(int64(c.avg))
		if got := f.aheadN(100); got != c.want {
			t.Errorf("handlers averaging %v: %d claimed ahead, want %d", c.avg, got, c.want)
		}
	}
	f.runAvg.Store(-1)
	if got := f.aheadN(100); got != 1000 {
		t.Errorf("no average yet: %d claimed ahead, want ClaimBatch (ahead is not asked before one ran)", got)
	}
	lim := newFetcher(e, "lim", 100, context.Background())
	lim.runAvg.Store(int64(10 * time.Microsecond))
	if got := lim.aheadN(100); got != 100 {
		t.Errorf("limited queue: %d claimed ahead, want one batch (100)", got)
	}
	// Limits per key alone: the claim holds only the slots of the keys
	// it took, and claims ahead as an unlimited queue does.
	for q, want := range map[string]int{"keys": 1000, "ordered": 1000, "keysrate": 100, "fair": 100} {
		kf := newFetcher(e, q, 100, context.Background())
		kf.runAvg.Store(int64(10 * time.Microsecond))
		if got := kf.aheadN(100); got != want {
			t.Errorf("queue %s: %d claimed ahead, want %d", q, got, want)
		}
	}
	// A backend whose writes all wait for one lock: one batch ahead.
	one := New(&fakeDriver{one: true}, cfg, nil)
	t.Cleanup(func() { one.Close(context.Background()) })
	one.setLimited(map[string]driver.QueueLimits{}, time.Now())
	of := newFetcher(one, "q", 100, context.Background())
	of.runAvg.Store(int64(10 * time.Microsecond))
	if got := of.aheadN(100); got != 100 {
		t.Errorf("one writer: %d claimed ahead, want one batch (100)", got)
	}
}
