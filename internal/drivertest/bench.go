package drivertest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// BenchClaimKeyed runs every backend's BenchmarkClaimKeyed: for each of
// three limits per key (2 running jobs per key; the same with a rate
// per key that never binds, 100 starts per key per millisecond, for the
// cost of the rate slots; and that rate alone) it drains b.N jobs spread
// over 1000 keys (one deep key holding a tenth of them) with claims of
// 100 and a Complete of what each claimed, and reports jobs/s. setup
// opens the backend's driver for a sub-benchmark and returns it with b.N
// jobs of one queue, without keys.
func BenchClaimKeyed(b *testing.B, setup func(b *testing.B) (driver.Driver, []driver.InsertParams)) {
	for _, tc := range []struct {
		name string
		l    driver.QueueLimits
	}{
		{"keymax2", driver.QueueLimits{KeyMaxRunning: 2}},
		{"keymax2-keyrate", driver.QueueLimits{KeyMaxRunning: 2, KeyRate: 100, KeyRatePeriod: time.Millisecond}},
		{"keyrate", driver.QueueLimits{KeyRate: 100, KeyRatePeriod: time.Millisecond}},
	} {
		b.Run(tc.name, func(b *testing.B) { benchClaimKeyed(b, tc.l, setup) })
	}
}

func benchClaimKeyed(b *testing.B, l driver.QueueLimits, setup func(b *testing.B) (driver.Driver, []driver.InsertParams)) {
	ctx := context.Background()
	d, jobs := setup(b)
	for i := range jobs {
		jobs[i].Key = "tenant-" + strconv.Itoa(i%1000)
		if i%10 == 0 {
			jobs[i].Key = "deep"
		}
	}
	if got, err := d.BulkInsert(ctx, jobs); err != nil || got != int64(b.N) {
		b.Fatalf("bulk insert: %d, %v", got, err)
	}
	queue := jobs[0].Queue
	if err := d.SetQueueLimits(ctx, queue, l); err != nil {
		b.Fatal(err)
	}
	cp := driver.ClaimParams{Queue: queue, Limit: 100, Lease: time.Minute, Worker: "bench"}
	done := 0
	b.ResetTimer()
	for {
		r, err := d.ClaimLimited(ctx, cp)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Rows) == 0 {
			break
		}
		out := make([]driver.Outcome, len(r.Rows))
		for i, row := range r.Rows {
			out[i] = driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
		}
		applied, err := d.Complete(ctx, out)
		if err != nil || len(applied) != len(out) {
			b.Fatalf("complete: %d of %d applied, %v", len(applied), len(out), err)
		}
		done += len(applied)
	}
	b.StopTimer()
	if done != b.N {
		b.Fatalf("drained %d jobs, want %d", done, b.N)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "jobs/s")
}
