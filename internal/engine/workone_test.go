package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// newEngine creates an engine that is not started and closes it when the
// test ends.
func newEngine(t *testing.T, d *fakeDriver, cfg Config, handlers map[string]Handler) *Engine {
	t.Helper()
	e := New(d, cfg, handlers)
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

type ctxKey struct{}

// WorkOne on an engine that was never started claims the job by id,
// runs its handler with the caller's context values, and writes the
// outcome, fenced by the claim, before it returns; nothing stays held.
func TestWorkOneCompletes(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobIn("elsewhere", 1, 7))
	var seen atomic.Value
	e := newEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(ctx context.Context, row *driver.JobRow) error {
		seen.Store(ctx.Value(ctxKey{}))
		return nil
	}})
	ctx := context.WithValue(context.Background(), ctxKey{}, "trace-42")
	w, err := e.WorkOne(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Applied || w.Err != nil || w.Outcome.State != driver.StateCompleted || w.Row.ID != 1 {
		t.Fatalf("worked %+v, want job 1 completed and applied", w)
	}
	if seen.Load() != "trace-42" {
		t.Fatalf("the handler's context carried %v, want the caller's value", seen.Load())
	}
	cj := d.callsOf("claimjob")
	if len(cj) != 1 || cj[0].ids[0] != 1 || cj[0].dur != 10*time.Second || cj[0].who != e.ID() {
		t.Fatalf("claims by id %+v, want job 1 for the lease, by this engine", cj)
	}
	cs := d.callsOf("complete")
	if len(cs) != 1 || len(cs[0].out) != 1 || cs[0].out[0].ID != 1 || cs[0].out[0].Fence != 7 || cs[0].out[0].State != driver.StateCompleted {
		t.Fatalf("outcomes written %+v, want job 1 completed under fence 7", cs)
	}
	if held := d.heldIDs(); len(held) != 0 {
		t.Fatalf("jobs still held: %v", held)
	}
	if m := e.Metrics(); m.Claimed.Load() != 1 || m.Completed.Load() != 1 || m.Failed.Load() != 0 {
		t.Fatalf("metrics claimed %d completed %d failed %d", m.Claimed.Load(), m.Completed.Load(), m.Failed.Load())
	}
	if d.count("claim") != 0 {
		t.Fatal("an engine that was not started claimed from a queue")
	}
}

// Every way a handler ends is written as a worker writes it: an error
// retries after the kind's backoff, JobCancel cancels, a panic fails with
// its stack, the kind's timeout cancels the context, the last attempt is
// discarded, an unknown kind fails.
func TestWorkOneOutcomes(t *testing.T) {
	errFail := errors.New("smtp down")
	cfg := testConfig(10 * time.Second)
	cfg.JobTimeout = time.Hour
	cfg.Kinds = map[string]KindConfig{
		"fail":  {Backoff: func(a int) time.Duration { return time.Duration(a) * time.Minute }},
		"sleep": {Timeout: 20 * time.Millisecond},
	}
	handlers := map[string]Handler{
		"fail":   func(context.Context, *driver.JobRow) error { return errFail },
		"cancel": func(context.Context, *driver.JobRow) error { return fmt.Errorf("%w: no", ErrCancelJob) },
		"panic":  func(context.Context, *driver.JobRow) error { panic("kaboom") },
		"sleep": func(ctx context.Context, _ *driver.JobRow) error {
			<-ctx.Done()
			return ctx.Err()
		},
	}
	for _, c := range []struct {
		kind    string
		attempt int
		state   string
		retryIn time.Duration
		err     string
		trace   bool
	}{
		{"fail", 2, driver.StateRetryable, 2 * time.Minute, "smtp down", false},
		{"fail", 5, driver.StateDiscarded, 0, "smtp down", false},
		{"cancel", 1, driver.StateCancelled, 0, "no", false},
		{"panic", 1, driver.StateRetryable, time.Millisecond, "job panicked: kaboom", true},
		{"sleep", 1, driver.StateRetryable, time.Millisecond, "timed out after 20ms", false},
		{"nobody", 1, driver.StateRetryable, time.Millisecond, `unknown job kind "nobody"`, false},
	} {
		d := &fakeDriver{}
		r := job(1)
		r.Kind, r.Attempt = c.kind, c.attempt
		d.add(r)
		e := newEngine(t, d, cfg, handlers)
		w, err := e.WorkOne(context.Background(), 1)
		if err != nil {
			t.Fatalf("%s: %v", c.kind, err)
		}
		o := w.Outcome
		if w.Err == nil || !strings.Contains(w.Err.Error(), c.err) || o.State != c.state || o.RetryIn != c.retryIn ||
			o.Err == nil || !strings.Contains(o.Err.Error, c.err) || (o.Err.Trace != "") != c.trace || !w.Applied {
			t.Errorf("%s attempt %d: %+v (error %v, recorded %+v), want %s in %v with %q", c.kind, c.attempt, o, w.Err, o.Err, c.state, c.retryIn, c.err)
		}
		if c.kind == "fail" && !errors.Is(w.Err, errFail) {
			t.Errorf("the handler's error %v is not the one it returned", w.Err)
		}
	}
}

// While the handler runs its lease is renewed, without Start.
func TestWorkOneRenewsItsLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	d := &fakeDriver{}
	d.add(job(1))
	e := newEngine(t, d, testConfig(lease), map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		waitFor(t, "two renewals of the running job", func() bool { return d.count("heartbeat") >= 2 })
		return ctx.Err()
	}})
	w, err := e.WorkOne(context.Background(), 1)
	if err != nil || !w.Applied || w.Outcome.State != driver.StateCompleted {
		t.Fatalf("worked %+v, %v", w, err)
	}
	for _, h := range d.callsOf("heartbeat") {
		if len(h.leases) != 1 || h.leases[0] != (driver.Lease{ID: 1, Fence: 7}) || h.dur != lease {
			t.Fatalf("renewal %+v, want job 1 under fence 7 for the lease", h)
		}
	}
}

// A lease lost while the handler runs cancels the handler; the outcome
// is not written (the job is another attempt's) and WorkOne says so.
func TestWorkOneLeaseLost(t *testing.T) {
	d := &fakeDriver{}
	d.add(job(1))
	d.heartbeat = func(context.Context, []driver.Lease) ([]int64, error) { return nil, nil }
	cause := make(chan error, 1)
	e := newEngine(t, d, testConfig(300*time.Millisecond), map[string]Handler{"k": func(ctx context.Context, _ *driver.JobRow) error {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}})
	w, err := e.WorkOne(context.Background(), 1)
	if !errors.Is(err, errLeaseLost) || w == nil || w.Applied {
		t.Fatalf("WorkOne: %+v, %v; want errLeaseLost and nothing applied", w, err)
	}
	if c := recv(t, "the handler's cancellation", cause); !errors.Is(c, errLeaseLost) {
		t.Fatalf("handler cancelled by %v, want the lost lease", c)
	}
	if d.count("complete") != 0 || e.Metrics().LeasesLost.Load() != 1 {
		t.Fatalf("%d outcomes written, %d leases lost; want none and 1", d.count("complete"), e.Metrics().LeasesLost.Load())
	}
}

// A caller that gives up interrupts the handler; the attempt is released
// (available again, not counted), as at shutdown, not failed.
func TestWorkOneCallerGivesUp(t *testing.T) {
	d := &fakeDriver{}
	d.add(job(1))
	ctx, cancel := context.WithCancel(context.Background())
	e := newEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(hctx context.Context, _ *driver.JobRow) error {
		cancel()
		<-hctx.Done()
		return hctx.Err()
	}})
	w, err := e.WorkOne(ctx, 1)
	if err == nil || w != nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "released") {
		t.Fatalf("WorkOne: %+v, %v; want an error saying the attempt was released", w, err)
	}
	rs := d.callsOf("release")
	if len(rs) != 1 || rs[0].leases[0] != (driver.Lease{ID: 1, Fence: 7}) || d.count("complete") != 0 || e.Metrics().Failed.Load() != 0 {
		t.Fatalf("releases %+v, %d outcomes, %d failures; want job 1 released under fence 7 and nothing else", rs, d.count("complete"), e.Metrics().Failed.Load())
	}
}

// The database's fence may refuse the outcome (the job was cancelled
// while it ran): WorkOne reports it, not as an error.
func TestWorkOneOutcomeRefused(t *testing.T) {
	d := &fakeDriver{}
	d.add(job(1))
	d.complete = func(context.Context, []driver.Outcome) ([]int64, error) { return nil, nil }
	e := newEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	w, err := e.WorkOne(context.Background(), 1)
	if err != nil || w.Applied || e.Metrics().StaleAcksRefused.Load() != 1 {
		t.Fatalf("WorkOne: %+v, %v, %d refused; want not applied, no error, one refusal counted", w, err, e.Metrics().StaleAcksRefused.Load())
	}
}

// A failed write of the outcome is retried, as the completer retries.
func TestWorkOneRetriesTheWrite(t *testing.T) {
	d := &fakeDriver{}
	d.add(job(1))
	var tries atomic.Int64
	d.complete = func(_ context.Context, o []driver.Outcome) ([]int64, error) {
		if tries.Add(1) < 3 {
			return nil, errBoom
		}
		return applied(o), nil
	}
	e := newEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	w, err := e.WorkOne(context.Background(), 1)
	if err != nil || !w.Applied || tries.Load() != 3 {
		t.Fatalf("WorkOne: %+v, %v after %d writes; want applied at the third", w, err, tries.Load())
	}
}

// A job that cannot be claimed is reported with the driver's error, and a
// closed engine claims nothing.
func TestWorkOneRefusals(t *testing.T) {
	d := &fakeDriver{}
	e := newEngine(t, d, testConfig(10*time.Second), nil)
	if _, err := e.WorkOne(context.Background(), 9); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("missing job: %v, want ErrNotFound", err)
	}
	e.Close(context.Background())
	d.add(job(1))
	if _, err := e.WorkOne(context.Background(), 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("closed engine: %v, want ErrStopped", err)
	}
	if d.count("claimjob") != 1 {
		t.Fatalf("%d claims by id, want only the first", d.count("claimjob"))
	}
}

// A started engine runs WorkOne beside its workers: the job is claimed by
// id although no fetcher serves its queue.
func TestWorkOneBesideWorkers(t *testing.T) {
	d := &fakeDriver{}
	d.add(jobIn("unserved", 1, 3))
	e := startEngine(t, d, testConfig(10*time.Second), map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	w, err := e.WorkOne(context.Background(), 1)
	if err != nil || !w.Applied || w.Row.Queue != "unserved" {
		t.Fatalf("WorkOne on a started engine: %+v, %v", w, err)
	}
}
