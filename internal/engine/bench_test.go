package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// benchDriver is a database of b.N jobs that costs nothing: Claim hands
// out the next jobs (rows made beforehand, so that the benchmark counts
// the engine's allocations, not the fake's), Complete applies every
// outcome. It measures what the engine itself spends per job: the
// fetcher, the workers, the completer and their bookkeeping.
type benchDriver struct {
	driver.Driver
	rows      []driver.JobRow
	next      atomic.Int64
	completed atomic.Int64
	done      chan struct{}
	once      sync.Once
}

func (d *benchDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{}
}

func (d *benchDriver) Claim(_ context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	end := d.next.Add(int64(p.Limit))
	start := end - int64(p.Limit)
	end = min(end, int64(len(d.rows)))
	if start >= end {
		return nil, nil
	}
	out := make([]*driver.JobRow, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, &d.rows[i])
	}
	return out, nil
}

func (d *benchDriver) Complete(_ context.Context, outcomes []driver.Outcome) ([]int64, error) {
	ids := make([]int64, len(outcomes))
	for i, o := range outcomes {
		ids[i] = o.ID
	}
	if d.completed.Add(int64(len(outcomes))) >= int64(len(d.rows)) {
		d.once.Do(func() { close(d.done) })
	}
	return ids, nil
}

func (d *benchDriver) Heartbeat(_ context.Context, leases []driver.Lease, _ time.Duration) ([]int64, error) {
	ids := make([]int64, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	return ids, nil
}

func (d *benchDriver) Release(_ context.Context, leases []driver.Lease) (int64, error) {
	return int64(len(leases)), nil
}

func (d *benchDriver) RegisterProcess(context.Context, driver.ProcessRow, time.Duration) error {
	return nil
}
func (d *benchDriver) RemoveProcess(context.Context, string) error { return nil }

// QueueLimits: no queue is limited.
func (d *benchDriver) QueueLimits(context.Context) (map[string]driver.QueueLimits, error) {
	return nil, nil
}
func (d *benchDriver) TryLead(context.Context, string, time.Duration) (bool, error) {
	return false, nil
}

// BenchmarkEngineJobs runs b.N no-op jobs through a started engine with
// 100 workers and the default batch sizes: the engine's CPU and
// allocations per job, without a database (the drain workload of the
// bench command measures them with one).
func BenchmarkEngineJobs(b *testing.B) {
	d := &benchDriver{rows: make([]driver.JobRow, b.N), done: make(chan struct{})}
	args := []byte(`{"seq":1}`)
	for i := range d.rows {
		d.rows[i] = driver.JobRow{ID: int64(i + 1), Queue: "q", Kind: "k", Args: args, State: driver.StateRunning,
			Attempt: 1, MaxAttempts: 25, Fence: 1}
	}
	cfg := testConfig(30 * time.Second)
	cfg.Queues = map[string]int{"q": 100}
	cfg.ClaimBatch, cfg.CompleteBatch = 100, 2000
	cfg.JobTimeout = time.Minute
	e := New(d, cfg, map[string]Handler{"k": func(context.Context, *driver.JobRow) error { return nil }})
	b.ReportAllocs()
	b.ResetTimer()
	if err := e.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d jobs completed in a minute", d.completed.Load(), b.N)
	}
	b.StopTimer()
	e.Close(context.Background())
}
