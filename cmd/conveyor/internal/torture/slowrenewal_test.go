package torture

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
)

// TestSlowRenewalRecorded: a lease renewal of a worker's engine held up
// by another writer on SQLite (longer than the heartbeat interval) is
// reported by the engine (lab.OnSlowRenewal), recorded by the worker's
// hook (recordSlowRenewals) as a slowbeat line, and read back by
// readRecords as the renewal's send and return times.
func TestSlowRenewalRecorded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbDir, recDir := t.TempDir(), t.TempDir()
	dsn := filepath.Join(dbDir, "slow.db")
	recPath := filepath.Join(recDir, "w1.0.jsonl")
	rec, err := newRecorder(recPath, "w1.0")
	if err != nil {
		t.Fatal(err)
	}
	const lease = 500 * time.Millisecond // renewals every 100ms
	c, err := openMigrated(ctx, dsn, &conveyor.Config{
		Queues:  map[string]conveyor.QueueConfig{Queue: {MaxWorkers: 1}},
		Lease:   lease,
		PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, connect.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recordSlowRenewals(c, rec)
	running := make(chan struct{}, 1)
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[workJob]) error {
		select {
		case running <- struct{}{}:
		default:
		}
		<-ctx.Done() // holds its lease until cut off or stopped
		return context.Cause(ctx)
	}))
	if _, err := c.Enqueue(ctx, workJob{payload{Tok: "slow"}}, &conveyor.EnqueueOpts{Queue: Queue, MaxAttempts: 100}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := openSQL(dsn, true) // BEGIN IMMEDIATE: takes the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	recorded := func() bool {
		b, err := os.ReadFile(recPath)
		return err == nil && bytes.Contains(b, []byte(`"t":"`+lineSlowBeat+`"`))
	}
	// Hold the write lock for two leases while the job runs: a renewal
	// sent meanwhile waits for it, or gives up, well past the interval.
	// (Tried again, bounded, should the machine be too slow for the
	// job to be running while the lock is held.)
	for try := 0; try < 5 && !recorded(); try++ {
		select {
		case <-running:
		case <-ctx.Done():
			t.Fatal("the job did not start")
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * lease)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !recorded(); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rec.close(); err != nil {
		t.Fatal(err)
	}
	rs, err := readRecords(recDir)
	if err != nil {
		t.Fatal(err)
	}
	got := rs.slowBeats[os.Getpid()]
	if len(got) == 0 {
		t.Fatalf("no slow renewal recorded while another writer held the lock for %v (slow renewals: %v)", 2*lease, rs.slowBeats)
	}
	for _, r := range got {
		if r.Done.Sub(r.Sent) <= c.Config().HeartbeatInterval {
			t.Errorf("renewal sent %v, back %v: not slower than the heartbeat interval %v", r.Sent, r.Done, c.Config().HeartbeatInterval)
		}
	}
}

// TestLateClaimRecorded: a late claim reported by the engine
// (lab.OnLateClaim) is written by the worker's hook as a late line
// and read back by readRecords with its times and attempts, under the
// writing process's pid.
func TestLateClaimRecorded(t *testing.T) {
	recDir := t.TempDir()
	rec, err := newRecorder(filepath.Join(recDir, "w1.0.jsonl"), "w1.0")
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Unix(1700000000, 123456789)
	want := LateClaim{Sent: sent, Back: sent.Add(1500 * time.Millisecond), Deadline: sent.Add(1600 * time.Millisecond),
		Jobs: []JobAttempt{{ID: 7, Attempt: 1}, {ID: 9, Attempt: 3}}}
	rec.write(lateClaimLine(lab.LateClaim{Sent: want.Sent, Back: want.Back, Deadline: want.Deadline,
		Jobs: []lab.JobAttempt{{ID: 7, Attempt: 1}, {ID: 9, Attempt: 3}}}))
	if err := rec.close(); err != nil {
		t.Fatal(err)
	}
	rs, err := readRecords(recDir)
	if err != nil {
		t.Fatal(err)
	}
	got := rs.lateClaims[os.Getpid()]
	if len(got) != 1 || !got[0].Sent.Equal(want.Sent) || !got[0].Back.Equal(want.Back) ||
		!got[0].Deadline.Equal(want.Deadline) || !slices.Equal(got[0].Jobs, want.Jobs) {
		t.Fatalf("late claims read back %+v, want [%+v]", rs.lateClaims, want)
	}
}
