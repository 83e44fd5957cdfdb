package conveyor_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// RemoteWorkers, on every backend: a claimed job carries its metadata and
// fence; a failure is decided as a local worker's error (the kind's
// backoff, discarded after the last attempt, cancelled on request); a
// snooze gives the attempt back; a release makes the job available at
// once; a stale fence is refused with ErrLeaseLost and writes nothing;
// bad requests are refused with ErrInvalidClaim naming the field;
// CompleteRecorded, FailRecorded and SnoozeRecorded tell the outcome
// that ended an attempt from any other.
func TestRemoteWorkers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.Logger = slog.New(slog.DiscardHandler) // its failed attempts are logged
		c := openDropped(t, dsn, cfg)
		// The serving client knows the kind: its backoff applies to remote
		// failures too.
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[tagged]) error { return nil }),
			conveyor.WorkerOpts{Backoff: func(int) time.Duration { return time.Hour }}); err != nil {
			t.Fatal(err)
		}
		rw := c.RemoteWorkers()
		claimOne := func(queue string) *conveyor.ClaimedJob {
			t.Helper()
			jobs, err := rw.Claim(ctx, conveyor.RemoteClaim{Queue: queue, Worker: "w1", Addr: "127.0.0.1:5000", Lease: time.Minute})
			if err != nil || len(jobs) != 1 {
				t.Fatalf("claim from %s: %v %v", queue, jobs, err)
			}
			return jobs[0]
		}

		id, err := c.Enqueue(ctx, tagged{Tag: "a"}, &conveyor.EnqueueOpts{Queue: "r1", MaxAttempts: 2, Metadata: map[string]string{"tenant": "acme"}})
		if err != nil {
			t.Fatal(err)
		}
		j := claimOne("r1")
		if j.ID != id || j.Fence == 0 || j.Attempt != 1 || j.Metadata["tenant"] != "acme" || j.AttemptedBy != "http:w1" || j.State != conveyor.JobStateRunning {
			t.Fatalf("claimed %+v (fence %d)", j.JobInfo, j.Fence)
		}
		if err := rw.Renew(ctx, j.ID, j.Fence, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		st, err := rw.Fail(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "boom\x00"})
		if err != nil || st != conveyor.JobStateRetryable {
			t.Fatalf("first failure: %s %v", st, err)
		}
		info := jobState(t, c, id)
		if wait := time.Until(info.ScheduledAt); wait < 50*time.Minute {
			t.Fatalf("retry scheduled in %v: the kind's backoff (1h) was not applied", wait)
		}
		if len(info.Errors) != 1 || info.Errors[0].Error != "boom\uFFFD" || info.Errors[0].Attempt != 1 {
			t.Fatalf("errors %+v", info.Errors)
		}
		// The same fence again: the attempt is over.
		if _, err := rw.Fail(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "again"}); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("a second failure under the same fence: %v, want ErrLeaseLost", err)
		}
		// Whether an outcome was recorded: this very failure (its error
		// stored cleaned, compared cleaned) was; another one was not, nor
		// a completion or a snooze.
		if st, ok, err := rw.FailRecorded(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "boom\x00"}); err != nil || !ok || st != conveyor.JobStateRetryable {
			t.Fatalf("FailRecorded of the failure written: %s %v %v", st, ok, err)
		}
		if _, ok, err := rw.FailRecorded(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "again"}); err != nil || ok {
			t.Fatalf("FailRecorded of another failure: %v %v", ok, err)
		}
		if ok, err := rw.CompleteRecorded(ctx, j.ID, j.Fence); err != nil || ok {
			t.Fatalf("CompleteRecorded after a failure: %v %v", ok, err)
		}
		if ok, err := rw.SnoozeRecorded(ctx, j.ID, j.Fence); err != nil || ok {
			t.Fatalf("SnoozeRecorded after a failure: %v %v", ok, err)
		}
		if _, err := c.Retry(ctx, id); err != nil {
			t.Fatal(err)
		}
		j = claimOne("r1")
		st, err = rw.Fail(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "last", RetryIn: time.Second})
		if err != nil || st != conveyor.JobStateDiscarded {
			t.Fatalf("failure of the last attempt: %s %v", st, err)
		}

		id2, _ := c.Enqueue(ctx, tagged{Tag: "b"}, &conveyor.EnqueueOpts{Queue: "r2"})
		j = claimOne("r2")
		if err := rw.Snooze(ctx, j.ID, j.Fence, time.Hour); err != nil {
			t.Fatal(err)
		}
		if info := jobState(t, c, id2); info.State != conveyor.JobStateScheduled || info.Attempt != 0 {
			t.Fatalf("snoozed job: %s attempt %d, want scheduled with its attempt given back", info.State, info.Attempt)
		}
		if err := rw.Complete(ctx, j.ID, j.Fence, nil); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("completing a snoozed attempt: %v, want ErrLeaseLost", err)
		}
		if ok, err := rw.SnoozeRecorded(ctx, j.ID, j.Fence); err != nil || !ok {
			t.Fatalf("SnoozeRecorded of the snooze written: %v %v", ok, err)
		}
		if ok, err := rw.CompleteRecorded(ctx, j.ID, j.Fence); err != nil || ok {
			t.Fatalf("CompleteRecorded after a snooze: %v %v", ok, err)
		}

		id3, _ := c.Enqueue(ctx, tagged{Tag: "c"}, &conveyor.EnqueueOpts{Queue: "r3"})
		j = claimOne("r3")
		if err := rw.Release(ctx, j.ID, j.Fence); err != nil {
			t.Fatal(err)
		}
		if err := rw.Release(ctx, j.ID, j.Fence); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("a second release: %v", err)
		}
		j = claimOne("r3")
		if j.ID != id3 || j.Attempt != 1 {
			t.Fatalf("after a release: job %d attempt %d, want %d at attempt 1", j.ID, j.Attempt, id3)
		}
		st, err = rw.Fail(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "stop", Cancel: true})
		if err != nil || st != conveyor.JobStateCancelled {
			t.Fatalf("cancelling failure: %s %v", st, err)
		}
		if st, ok, err := rw.FailRecorded(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "stop", Cancel: true}); err != nil || !ok || st != conveyor.JobStateCancelled {
			t.Fatalf("FailRecorded of the cancelling failure: %s %v %v", st, ok, err)
		}
		if _, ok, err := rw.FailRecorded(ctx, j.ID, j.Fence, conveyor.RemoteFailure{Error: "stop"}); err != nil || ok {
			t.Fatalf("FailRecorded of the same failure without cancel: %v %v", ok, err)
		}

		_, _ = c.Enqueue(ctx, tagged{Tag: "d"}, &conveyor.EnqueueOpts{Queue: "r4"})
		j = claimOne("r4")
		if ok, err := rw.CompleteRecorded(ctx, j.ID, j.Fence); err != nil || ok {
			t.Fatalf("CompleteRecorded of a running attempt: %v %v", ok, err)
		}
		if err := rw.Complete(ctx, j.ID, j.Fence, nil); err != nil {
			t.Fatal(err)
		}
		if ok, err := rw.CompleteRecorded(ctx, j.ID, j.Fence); err != nil || !ok {
			t.Fatalf("CompleteRecorded of the completion written: %v %v", ok, err)
		}
		if ok, err := rw.CompleteRecorded(ctx, j.ID, j.Fence+1); err != nil || ok {
			t.Fatalf("CompleteRecorded under another fence: %v %v", ok, err)
		}
		if _, ok, err := rw.FailRecorded(ctx, j.ID, j.Fence, conveyor.RemoteFailure{}); err != nil || ok {
			t.Fatalf("FailRecorded after a completion: %v %v", ok, err)
		}
		if ok, err := rw.CompleteRecorded(ctx, 1<<40, 1); err != nil || ok {
			t.Fatalf("CompleteRecorded of a job that does not exist: %v %v", ok, err)
		}

		for _, bad := range []struct {
			p    conveyor.RemoteClaim
			want string
		}{
			{conveyor.RemoteClaim{Limit: 1001}, "limit 1001"},
			{conveyor.RemoteClaim{Lease: time.Millisecond}, "lease 1ms"},
			{conveyor.RemoteClaim{Wait: -time.Second}, "wait -1s"},
			{conveyor.RemoteClaim{Worker: "a\nb"}, "worker name"},
			{conveyor.RemoteClaim{Queue: "no spaces"}, `queue name "no spaces"`},
			{conveyor.RemoteClaim{Addr: strings.Repeat("a", 201)}, "address"},
		} {
			_, err := rw.Claim(ctx, bad.p)
			if err == nil || !strings.Contains(err.Error(), bad.want) || !errors.Is(err, conveyor.ErrInvalidClaim) {
				t.Errorf("claim %+v: %v, want an error naming %q", bad.p, err, bad.want)
			}
		}
		if err := rw.Snooze(ctx, 1, 1, -time.Second); !errors.Is(err, conveyor.ErrInvalidClaim) {
			t.Errorf("negative snooze: %v", err)
		}
	})
}
