package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// A job's timeout is its own (TimeoutMS, set at enqueue), else its
// kind's, else the engine's; negative at any level means none, and a
// level that is zero defers to the next.
func TestTimeoutPrecedence(t *testing.T) {
	cfg := testConfig(10 * time.Second)
	cfg.JobTimeout = time.Minute
	cfg.Kinds = map[string]KindConfig{
		"short":   {Timeout: 50 * time.Millisecond},
		"endless": {Timeout: -1},
		"backoff": {Backoff: func(int) time.Duration { return time.Hour }},
	}
	e := New(&fakeDriver{}, cfg, nil)
	for _, c := range []struct {
		kind    string
		ownMS   int64
		global  time.Duration
		want    time.Duration
		because string
	}{
		{"k", 0, time.Minute, time.Minute, "a kind without settings takes JobTimeout"},
		{"backoff", 0, time.Minute, time.Minute, "a kind that sets only Backoff takes JobTimeout"},
		{"short", 0, time.Minute, 50 * time.Millisecond, "the kind's timeout replaces JobTimeout"},
		{"short", 0, -1, 50 * time.Millisecond, "the kind's timeout applies when JobTimeout is none"},
		{"short", 20, time.Minute, 20 * time.Millisecond, "the job's own timeout beats its kind's"},
		{"short", -1, time.Minute, 0, "a job without timeout has none, whatever its kind"},
		{"endless", 0, time.Minute, 0, "a kind without timeout has none, whatever JobTimeout"},
		{"endless", 30, time.Minute, 30 * time.Millisecond, "the job's own timeout beats a kind without one"},
		{"k", 0, -1, 0, "JobTimeout none"},
	} {
		e.cfg.JobTimeout = c.global
		r := job(1)
		r.Kind, r.TimeoutMS = c.kind, c.ownMS
		if got := e.timeout(r); got != c.want {
			t.Errorf("kind %q, own %dms, JobTimeout %v: timeout %v, want %v (%s)", c.kind, c.ownMS, c.global, got, c.want, c.because)
		}
	}
}

// A failed attempt of a kind with its own Backoff is retried after that
// backoff, given the attempt number; other kinds keep the engine's.
func TestKindBackoffInOutcome(t *testing.T) {
	cfg := testConfig(10 * time.Second)
	cfg.Backoff = func(a int) time.Duration { return time.Duration(a) * time.Second }
	var asked []int
	cfg.Kinds = map[string]KindConfig{"slow": {Backoff: func(a int) time.Duration {
		asked = append(asked, a)
		return time.Duration(a) * time.Hour
	}}}
	e := New(&fakeDriver{}, cfg, nil)
	fail := errors.New("failed")
	r := job(1)
	r.Kind, r.Attempt = "slow", 3
	if o := e.outcome(r, fail, "", nil); o.State != driver.StateRetryable || o.RetryIn != 3*time.Hour {
		t.Fatalf("kind with its own backoff: %s in %v, want retryable in 3h", o.State, o.RetryIn)
	}
	if len(asked) != 1 || asked[0] != 3 {
		t.Fatalf("the kind's backoff was asked for attempts %v, want [3]", asked)
	}
	r.Kind = "k"
	if o := e.outcome(r, fail, "", nil); o.RetryIn != 3*time.Second {
		t.Fatalf("kind without settings retried in %v, want the engine's 3s", o.RetryIn)
	}
	r.Kind, r.Attempt = "slow", r.MaxAttempts
	if o := e.outcome(r, fail, "", nil); o.State != driver.StateDiscarded || len(asked) != 1 {
		t.Fatalf("last attempt: %s (backoff asked %d times), want discarded without asking", o.State, len(asked))
	}
}

// Through the workers: a kind with its own timeout has its handler's
// context cancelled at that timeout while the engine's is an hour, and
// its failed attempt is written retryable after the kind's own backoff.
func TestKindSettingsThroughWorkers(t *testing.T) {
	d := &fakeDriver{}
	short := job(1)
	short.Kind = "short"
	plain := job(2)
	d.add(short, plain)
	cfg := testConfig(10 * time.Second)
	cfg.JobTimeout = time.Hour
	cfg.Kinds = map[string]KindConfig{"short": {
		Timeout: 30 * time.Millisecond,
		Backoff: func(a int) time.Duration { return 7 * time.Minute },
	}}
	type seen struct {
		left  time.Duration // deadline minus the handler's start
		cause error
	}
	got := make(chan seen, 2)
	wait := func(ctx context.Context, _ *driver.JobRow) error {
		dl, _ := ctx.Deadline()
		left := time.Until(dl)
		<-ctx.Done()
		got <- seen{left, context.Cause(ctx)}
		return ctx.Err()
	}
	quick := func(ctx context.Context, _ *driver.JobRow) error {
		dl, _ := ctx.Deadline()
		got <- seen{time.Until(dl), nil}
		return nil
	}
	e := startEngine(t, d, cfg, map[string]Handler{"short": wait, "k": quick})
	var s1, s2 seen
	for range 2 {
		s := recv(t, "a handler", got)
		if s.cause != nil {
			s1 = s
		} else {
			s2 = s
		}
	}
	if s1.left <= 0 || s1.left > 30*time.Millisecond || !strings.Contains(s1.cause.Error(), "timed out after 30ms") {
		t.Fatalf("kind with a 30ms timeout: deadline %v after start, cause %v", s1.left, s1.cause)
	}
	if s2.left < 59*time.Minute {
		t.Fatalf("kind without settings: deadline %v after start, want the engine's hour", s2.left)
	}
	waitFor(t, "both outcomes written", func() bool {
		return e.Metrics().Completed.Load() == 1 && e.Metrics().Failed.Load() == 1 && len(d.heldIDs()) == 0
	})
	for _, c := range d.callsOf("complete") {
		for _, o := range c.out {
			if o.ID == 1 && (o.State != driver.StateRetryable || o.RetryIn != 7*time.Minute || !strings.Contains(o.Err.Error, "timed out after 30ms")) {
				t.Fatalf("outcome of the timed-out job: %+v (error %+v), want retryable in the kind's 7m", o, o.Err)
			}
		}
	}
}
