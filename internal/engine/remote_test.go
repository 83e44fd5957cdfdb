package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Remote outcomes go through the completer: outcomes that arrive while a
// batch is being written go together in the next one, each still decided
// on its own; two outcomes for one job never share a batch, and only the
// first is applied (the second is refused as a stale fence would be).
func TestRemoteOutcomesBatched(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int64
	done := map[int64]bool{}
	d := &fakeDriver{complete: func(ctx context.Context, os []driver.Outcome) ([]int64, error) {
		mu.Lock()
		first := len(batches) == 0
		ids := make([]int64, len(os))
		for i, o := range os {
			ids[i] = o.ID
		}
		batches = append(batches, ids)
		mu.Unlock()
		if first {
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		var applied []int64
		for _, o := range os {
			if !done[o.ID] {
				done[o.ID] = true
				applied = append(applied, o.ID)
			}
		}
		return applied, nil
	}}
	e := New(d, testConfig(10*time.Second), nil)
	defer e.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		id  int64
		err error
	}
	results := make(chan result, 20)
	send := func(id int64) {
		go func() { results <- result{id, e.CompleteRemote(ctx, id, 1, nil)} }()
	}
	send(1) // written alone; its write blocks until release
	waitFor(t, "the first batch", func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 })
	for id := int64(2); id <= 11; id++ {
		send(id)
	}
	send(5) // a second outcome for job 5
	waitFor(t, "eleven outcomes queued", func() bool { return len(e.completer().in) == 11 })
	close(release)
	applied, refused := map[int64]int{}, map[int64]int{}
	for range 12 {
		r := <-results
		switch {
		case r.err == nil:
			applied[r.id]++
		case errors.Is(r.err, ErrLeaseLost):
			refused[r.id]++
		default:
			t.Fatal(r.err)
		}
	}
	for id := int64(1); id <= 11; id++ {
		if applied[id] != 1 {
			t.Errorf("job %d applied %d times, want once", id, applied[id])
		}
	}
	if len(refused) != 1 || refused[5] != 1 {
		t.Errorf("refused %v, want job 5's second outcome only", refused)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 3 || len(batches[0]) != 1 || len(batches[1]) != 10 || len(batches[2]) != 1 || batches[2][0] != 5 {
		t.Errorf("batches %v, want [1], the ten others together, then [5]", batches)
	}
	if m := e.Metrics(); m.Completed.Load() != 11 || m.StaleAcksRefused.Load() != 1 {
		t.Errorf("metrics: %d completed, %d stale refused; want 11 and 1", m.Completed.Load(), m.StaleAcksRefused.Load())
	}
}

// A started engine's workers and remote workers share one completer: a
// remote outcome submitted while local jobs complete lands in the same
// batches, and Stop leaves remote outcomes working (a new completer).
func TestRemoteOutcomesShareTheStartedCompleter(t *testing.T) {
	d := &fakeDriver{}
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"default": 2}
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	local := e.completer()
	if e.fetchers["default"].comp != local {
		t.Fatal("the fetcher and remote outcomes use different completers")
	}
	if err := e.CompleteRemote(context.Background(), 7, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !local.closed() {
		t.Fatal("Stop left the started engine's completer open")
	}
	if err := e.CompleteRemote(context.Background(), 8, 1, nil); err != nil {
		t.Fatalf("a remote outcome after Stop: %v", err)
	}
	if got := completedIDs(d); !slices.Equal(got, []int64{7, 8}) {
		t.Fatalf("completed %v, want [7 8]", got)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.CompleteRemote(context.Background(), 9, 1, nil); !errors.Is(err, ErrStopped) {
		t.Fatalf("a remote outcome after Close: %v, want ErrStopped", err)
	}
}

// A remote worker is registered in the processes table (kind http, the
// queues it claims from) from its claims and, while it only renews the
// leases of long jobs, from its renewals, at most once per interval; its
// jobs are forgotten once settled.
func TestRemoteWorkersRegistered(t *testing.T) {
	d := &fakeDriver{}
	e := New(d, testConfig(10*time.Second), nil)
	defer e.Close(context.Background())
	ctx := context.Background()
	d.add(jobIn("mail", 1, 11), jobIn("mail", 2, 12))
	rows, err := e.ClaimRemote(ctx, RemoteClaim{Queue: "mail", Limit: 1, Lease: time.Minute, Worker: "http:w1:5", Process: "http:w1", Host: "h1"})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	regs := d.callsOf("register")
	if len(regs) != 1 {
		t.Fatalf("%d registrations after the first claim, want 1", len(regs))
	}
	if p := regs[0].procs[0]; p.ID != "http:w1" || p.Kind != driver.ProcessHTTP || p.Host != "h1" || len(p.Queues) != 1 || p.Queues["mail"] != 0 || regs[0].dur != remoteProcTTL {
		t.Fatalf("registered %+v for %v", p, regs[0].dur)
	}
	if c := d.claimsOf("mail"); len(c) != 1 {
		t.Fatalf("%d claims", len(c))
	}
	// Within the interval a renewal writes nothing.
	if err := e.RenewRemote(ctx, rows[0].ID, rows[0].Fence, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := d.count("register"); n != 1 {
		t.Fatalf("a renewal within the interval registered again (%d)", n)
	}
	// Once the interval passed (made to pass here), a renewal refreshes
	// the row.
	e.remote.mu.Lock()
	e.remote.workers["http:w1"].written = time.Time{}
	e.remote.mu.Unlock()
	if err := e.RenewRemote(ctx, rows[0].ID, rows[0].Fence, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := d.count("register"); n != 2 {
		t.Fatalf("a renewal after the interval: %d registrations, want 2", n)
	}
	if err := e.CompleteRemote(ctx, rows[0].ID, rows[0].Fence, nil); err != nil {
		t.Fatal(err)
	}
	e.remote.mu.Lock()
	held := len(e.remote.jobs)
	e.remote.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d jobs still remembered after the completion", held)
	}
	// A lease the database no longer holds: ErrLeaseLost.
	d.heartbeat = func(context.Context, []driver.Lease) ([]int64, error) { return nil, nil }
	if err := e.RenewRemote(ctx, 2, 99, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewing a lost lease: %v", err)
	}
}

// A waiting remote claim is woken by this engine's enqueue into its
// queue and, on a backend with notifications, by the listener it starts
// when the engine is not started; the listener stops with Close.
func TestRemoteClaimWoken(t *testing.T) {
	d := &fakeDriver{listen: true, wakeups: make(chan string)}
	e := New(d, testConfig(10*time.Second), nil)
	ctx := context.Background()

	ch, done := e.waiters.wait("q")
	defer done()
	if _, _, err := e.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k"}}); err != nil {
		t.Fatal(err)
	}
	recv(t, "the enqueue's wake", ch)

	got := make(chan []*driver.JobRow, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		rows, _ := e.ClaimRemote(cctx, RemoteClaim{Queue: "r", Limit: 1, Lease: time.Minute, Wait: time.Minute})
		got <- rows
	}()
	waitFor(t, "the listener started by the waiting claim", func() bool {
		e.listen.mu.Lock()
		defer e.listen.mu.Unlock()
		return e.listen.cancel != nil
	})
	ch, doneR := e.waiters.wait("r")
	defer doneR()
	d.wakeups <- "r"
	recv(t, "the notification's wake", ch)
	cancel()
	if rows := recv(t, "the cancelled claim", got); len(rows) != 0 {
		t.Fatalf("cancelled claim returned %v", rows)
	}
	// The listener lingers after the last waiting claim, until Close.
	e.listen.mu.Lock()
	running := e.listen.cancel != nil
	e.listen.mu.Unlock()
	if !running {
		t.Fatal("the listener stopped at once after the last waiting claim")
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.listen.mu.Lock()
	defer e.listen.mu.Unlock()
	if e.listen.cancel != nil || !e.listen.closed {
		t.Fatal("Close left the listener running")
	}
}
