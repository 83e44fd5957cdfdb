package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// A claim that comes back more than a heartbeat interval after it was
// sent is reported to OnLateClaim before its jobs' handlers start: when it
// was sent, when it came back, the deadline its jobs' handlers are cut off
// at unless a renewal gets through (sent + Lease - Lease/5), and its
// attempts. Only claims slower than the interval are reported.
func TestLateClaimReported(t *testing.T) {
	const interval = 50 * time.Millisecond
	d := &fakeDriver{}
	var stall sync.Mutex
	var stalledAt time.Time // when the stalled claim reached the driver
	d.claim = func(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
		rows := d.takePending(p)
		if len(rows) > 0 && rows[0].ID == 2 {
			stall.Lock()
			stalledAt = time.Now()
			stall.Unlock()
			time.Sleep(3 * interval)
		}
		return rows, nil
	}
	cfg := testConfig(10 * time.Second)
	cfg.HeartbeatInterval = interval
	cfg.ShutdownTimeout = time.Millisecond // the handlers wait to be cancelled
	var mu sync.Mutex
	var got []LateClaim
	var early []int64 // jobs whose handler started before their claim was reported
	started := map[int64]time.Time{}
	handler := func(ctx context.Context, r *driver.JobRow) error {
		mu.Lock()
		started[r.ID] = time.Now()
		mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	e := New(d, cfg, map[string]Handler{"k": handler})
	e.OnLateClaim(func(c LateClaim) {
		mu.Lock()
		got = append(got, c)
		for _, j := range c.Jobs {
			if !started[j.ID].IsZero() {
				early = append(early, j.ID)
			}
		}
		mu.Unlock()
	})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })

	d.add(job(1))
	e.Wake("q")
	waitFor(t, "job 1 to start", func() bool { mu.Lock(); defer mu.Unlock(); return !started[1].IsZero() })
	r := job(2)
	r.Attempt = 3
	d.add(r)
	e.Wake("q")
	waitFor(t, "job 2 to start", func() bool { mu.Lock(); defer mu.Unlock(); return !started[2].IsZero() })

	mu.Lock()
	defer mu.Unlock()
	stall.Lock()
	defer stall.Unlock()
	if len(early) > 0 {
		t.Errorf("the handlers of jobs %v started before their late claim was reported", early)
	}
	var c LateClaim
	n := 0
	for _, g := range got {
		// A claim of job 1 slowed past the interval on a loaded machine
		// is reported too, rightly; none may be reported in time.
		if g.Back.Sub(g.Sent) <= interval {
			t.Errorf("claim back %v after it was sent reported late (interval %v)", g.Back.Sub(g.Sent), interval)
		}
		for _, j := range g.Jobs {
			if j.ID == 2 {
				c, n = g, n+1
			}
		}
	}
	if n != 1 {
		t.Fatalf("job 2's stalled claim reported %d times, want once: %+v", n, got)
	}
	if len(c.Jobs) != 1 || c.Jobs[0] != (JobAttempt{ID: 2, Attempt: 3}) {
		t.Fatalf("late claim of %+v, want job 2's attempt 3", c.Jobs)
	}
	if c.Sent.After(stalledAt) {
		t.Errorf("claim reported sent at %v, after it reached the driver at %v", c.Sent, stalledAt)
	}
	if c.Back.Sub(c.Sent) < 3*interval {
		t.Errorf("claim reported back %v after it was sent, less than its %v stall", c.Back.Sub(c.Sent), 3*interval)
	}
	if c.Back.After(started[2]) {
		t.Errorf("claim reported back at %v, after its job's handler started at %v", c.Back, started[2])
	}
	if want := c.Sent.Add(cfg.Lease - cfg.Lease/5); !c.Deadline.Equal(want) {
		t.Errorf("deadline %v, want sent + Lease - Lease/5 = %v", c.Deadline, want)
	}
}
