package conveyor_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// Through PgBouncer in transaction pooling with a direct listen
// connection, a job another process enqueues wakes the worker by
// notification: both polls are set far beyond the test's bound, so only
// the notification can make the worker claim it in time.
func TestPgBouncerListenDSNWakesWorker(t *testing.T) {
	ctx := context.Background()
	dsn := pgbouncerDSN(t)
	prefix := testdb.Prefix()
	cfg := fast(prefix)
	cfg.ListenPoll, cfg.PollMin, cfg.PollMax = 10*time.Minute, 10*time.Minute, 10*time.Minute
	worker := openDropped(t, dsn, cfg)
	if info, err := worker.ServerInfo(ctx); err != nil || info["pooler"] != "transaction pooling" || info["listen"] != "true" {
		t.Fatalf("server info %v (%v): want transaction pooling with a listener", info, err)
	}
	var ran atomic.Int64
	conveyor.AddWorker(worker, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
		ran.Add(1)
		return nil
	}))
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The worker claimed at start and found nothing; from now on it
	// waits for a notification (or 10 minutes). Its listener connects
	// meanwhile, and a notification sent before it listens is missed:
	// another client enqueues one job every second until one runs.
	waitFor(t, "the worker's first claim", 30*time.Second, func() bool { return worker.Counters().ClaimRounds >= 1 })
	other := open(t, dsn, fast(prefix))
	deadline := time.Now().Add(time.Minute)
	for ran.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no job enqueued by another client ran within a minute: the listener was not woken")
		}
		if _, err := other.Enqueue(ctx, noop{}, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
}

// Through PgBouncer in transaction pooling without a listen connection,
// the client polls, and says so in one warning when it starts (not at
// every poll); a job another process enqueues is still picked up.
func TestPgBouncerWithoutListenerPollsAndWarnsOnce(t *testing.T) {
	ctx := context.Background()
	dsn := appDSN(pgbouncerDSN(t))
	prefix := testdb.Prefix()
	var buf syncBuffer
	cfg := fast(prefix)
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	worker := openDropped(t, dsn, cfg)
	if info, err := worker.ServerInfo(ctx); err != nil || info["listen"] != "false" {
		t.Fatalf("server info %v (%v): want no listener", info, err)
	}
	var ran atomic.Int64
	conveyor.AddWorker(worker, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
		ran.Add(1)
		return nil
	}))
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	other := open(t, dsn, fast(prefix))
	for i := range 3 {
		if _, err := other.Enqueue(ctx, noop{N: i}, nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the job enqueued by another client to run", time.Minute, func() bool { return ran.Load() == int64(i+1) })
	}
	var warnings []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "notifications unavailable") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "level=WARN") || !strings.Contains(warnings[0], "conveyor_direct_dsn") {
		t.Fatalf("warnings %q, want one WARN line naming conveyor_direct_dsn", warnings)
	}
}
