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

// A process whose renewals never get through cancels its handlers before
// the lease can expire: the handler's context ends with the deadline
// cause after at least Lease minus the margin (not early) and before the
// lease runs out, and the attempt's outcome is still written, fenced.
func TestHandlerStoppedBeforeUnrenewedLeaseExpires(t *testing.T) {
	const lease = 2 * time.Second
	var outcomes []driver.Outcome
	var mu sync.Mutex
	d := &fakeDriver{pending: []*driver.JobRow{job(1)}}
	d.heartbeat = func(ctx context.Context, _ []driver.Lease) ([]int64, error) {
		<-ctx.Done() // the database never answers
		return nil, ctx.Err()
	}
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		mu.Lock()
		outcomes = append(outcomes, outs...)
		mu.Unlock()
		return applied(outs), nil
	}
	type stop struct {
		at    time.Time
		cause error
	}
	stopped := make(chan stop, 1)
	e := New(d, testConfig(lease), map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		<-ctx.Done()
		stopped <- stop{time.Now(), context.Cause(ctx)}
		return ctx.Err()
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	var s stop
	select {
	case s = <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was never stopped")
	}
	d.mu.Lock()
	claimed := d.claimAt
	d.mu.Unlock()
	if !errors.Is(s.cause, errLeaseDeadline) {
		t.Fatalf("handler stopped by %v, want the lease deadline", s.cause)
	}
	if early := claimed.Add(lease - e.leaseMargin()); s.at.Before(early) {
		t.Fatalf("handler stopped %v after the claim, before the deadline at %v", s.at.Sub(claimed), lease-e.leaseMargin())
	}
	if s.at.After(claimed.Add(lease)) {
		t.Fatalf("handler stopped %v after the claim: the lease (%v) could already have been rescued", s.at.Sub(claimed), lease)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(outcomes)
		mu.Unlock()
		if n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 1 || outcomes[0].Fence != 7 || outcomes[0].State != driver.StateRetryable || outcomes[0].Err == nil {
		t.Fatalf("outcomes %+v, want one retryable outcome fenced by 7", outcomes)
	}
	if got := e.Metrics().LeaseDeadlines.Load(); got != 1 {
		t.Fatalf("lease_deadlines %d, want 1", got)
	}
}

// A finished job's lease is renewed until its outcome is written, and
// only until then. Job 2 runs all along, so that heartbeats keep being
// sent after job 1's outcome is written: the renewals that leave job 1
// out are counted, not waited for.
func TestFinishedJobKeepsLeaseUntilWritten(t *testing.T) {
	const lease = 300 * time.Millisecond
	d := &fakeDriver{pending: []*driver.JobRow{job(1), job(2)}}
	var renewedWhileWriting atomic.Bool
	writing, release := make(chan struct{}), make(chan struct{})
	var writeDone atomic.Bool
	var mu sync.Mutex
	var afterWrite []bool // per renewal sent after job 1's write: was job 1 in it?
	d.heartbeat = func(_ context.Context, leases []driver.Lease) ([]int64, error) {
		has1 := false
		for _, l := range leases {
			if l.ID == 1 && l.Fence == 7 {
				has1 = true
				select {
				case <-writing:
					if !writeDone.Load() {
						renewedWhileWriting.Store(true)
					}
				default:
				}
			}
		}
		if writeDone.Load() {
			mu.Lock()
			afterWrite = append(afterWrite, has1)
			mu.Unlock()
		}
		return owned(leases), nil
	}
	var once sync.Once
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		once.Do(func() { close(writing) })
		<-release
		writeDone.Store(true)
		return applied(outs), nil
	}
	running := make(chan struct{})
	e := New(d, testConfig(lease), map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		if row.ID == 2 {
			select {
			case <-running:
			case <-ctx.Done():
			}
		}
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	defer close(running)
	<-writing
	deadline := time.Now().Add(10 * time.Second)
	for !renewedWhileWriting.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the finished job's lease was not renewed while its outcome waited to be written")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	// Three renewals (of job 2) sent after the write returned. The first
	// may have listed job 1 before the engine took the answer in; the
	// later ones must not.
	var sent []bool
	deadline = time.Now().Add(10 * time.Second)
	for len(sent) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 10s after job 1's outcome was written, want 3 (job 2 still runs)", len(sent))
		}
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		sent = append([]bool(nil), afterWrite...)
		mu.Unlock()
	}
	for i, has1 := range sent[1:] {
		if has1 {
			t.Fatalf("renewal %d after job 1's outcome was written renewed it too (renewals %v)", i+2, sent)
		}
	}
	if got := e.Metrics().LeaseDeadlines.Load(); got != 0 {
		t.Fatalf("lease_deadlines %d, want 0", got)
	}
}

// A heartbeat that reports a lease no longer owned cancels the handler
// with the lost-lease cause, and the attempt's outcome is dropped by the
// process (the database's fence would refuse it).
func TestLostLeaseCancelsHandlerAndDropsOutcome(t *testing.T) {
	const lease = 300 * time.Millisecond
	d := &fakeDriver{pending: []*driver.JobRow{job(1)}}
	d.heartbeat = func(context.Context, []driver.Lease) ([]int64, error) { return nil, nil }
	var completes atomic.Int64
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) {
		completes.Add(int64(len(outs)))
		return applied(outs), nil
	}
	cause := make(chan error, 1)
	e := New(d, testConfig(lease), map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-cause:
		if !errors.Is(c, errLeaseLost) {
			t.Fatalf("handler stopped by %v, want the lost lease", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was never stopped")
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := completes.Load(); n != 0 {
		t.Fatalf("%d outcomes written for a lost lease", n)
	}
	if n := d.released.Load(); n != 0 {
		t.Fatalf("%d lost leases released at shutdown", n)
	}
	if got := e.Metrics().LeasesLost.Load(); got != 1 {
		t.Fatalf("leases_lost %d, want 1", got)
	}
}

// An attempt whose lease ran out before a worker could start it (the
// claim came back late, the process was paused or starved) is not
// started: its handler never runs and the claim is given back, fenced.
// Given back, the job is pending again and its next claim comes back as
// late; the fake returns it twice, then nothing, so that every release
// the test counts is a give-back and none is Stop's release of a claim
// still in flight when Close began.
func TestAttemptNotStartedPastItsLease(t *testing.T) {
	const lease = 500 * time.Millisecond
	const attempts = 2
	d := &slowClaimDriver{fakeDriver: fakeDriver{pending: []*driver.JobRow{job(1)}}, delay: lease - lease/10, returns: attempts}
	d.heartbeat = func(ctx context.Context, _ []driver.Lease) ([]int64, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	d.complete = func(_ context.Context, outs []driver.Outcome) ([]int64, error) { return applied(outs), nil }
	var ran atomic.Int64
	e := New(d, testConfig(lease), map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		ran.Add(1)
		return nil
	}})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.released.Load() < attempts && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := d.released.Load(); n != attempts {
		t.Fatalf("%d leases given back, want one per late attempt (%d)", n, attempts)
	}
	got := releasedLeases(&d.fakeDriver)
	if !slices.Contains(got, driver.Lease{ID: 1, Fence: 7}) {
		t.Fatalf("released %v, want job 1's first attempt (fence 7) among them", got)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the handler ran %d times past its lease", n)
	}
	if got := e.Metrics().LeaseDeadlines.Load(); got != attempts {
		t.Fatalf("lease_deadlines %d, want one per attempt given back (%d)", got, attempts)
	}
}

// slowClaimDriver's claims come back delay after they were sent. With
// returns set, only the first returns claims that find a job return it;
// later claims find nothing.
type slowClaimDriver struct {
	fakeDriver
	delay    time.Duration
	returns  int64
	returned atomic.Int64
}

func (d *slowClaimDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if d.returns > 0 && d.returned.Load() >= d.returns {
		return nil, nil
	}
	rows, err := d.fakeDriver.Claim(ctx, p)
	if len(rows) > 0 {
		d.returned.Add(1)
		time.Sleep(d.delay)
	}
	return rows, err
}

// An attempt that waited for a worker past its lease is counted once in
// lease_deadlines, even when the deadline loop cut it off before a worker
// found it not startable and gave it back. (Under load that interleaving
// made TestAttemptNotStartedPastItsLease count 2.) The engine's pieces are
// driven in that order: the claim is dispatched with its lease already
// run out and no worker yet, the deadline loop runs, then the workers.
func TestAttemptCutOffBeforeStartCountedOnce(t *testing.T) {
	const lease = time.Second
	d := &fakeDriver{}
	cfg := testConfig(lease)
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error {
		t.Error("the handler ran past its lease")
		return nil
	}})
	defer e.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	f := newFetcher(e, "q", 1, ctx)
	e.fetchers = map[string]*fetcher{"q": f}
	f.dispatch([]*driver.JobRow{job(1)}, time.Now().Add(-lease), false) // a claim sent a lease ago
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); e.deadlineLoop(ctx) }()
	waitFor(t, "the deadline loop to cut the attempt off", func() bool { return e.Metrics().LeaseDeadlines.Load() >= 1 })
	cancel()
	<-loopDone
	f.startWorkers()
	waitFor(t, "the attempt to be given back", func() bool { return d.released.Load() == 1 })
	f.closeWorkers()
	f.workerWG.Wait()
	if got := e.Metrics().LeaseDeadlines.Load(); got != 1 {
		t.Fatalf("lease_deadlines %d for one attempt, want 1", got)
	}
}
