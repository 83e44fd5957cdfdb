package sqlite

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
)

// benchDriver opens a migrated driver on a fresh file holding n available
// no-op jobs in queue "bench".
func benchDriver(b *testing.B, n int) *Driver {
	b.Helper()
	// CONVEYOR_SQLITE_SYNC=FULL measures the power-loss-durable mode.
	d, err := Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"),
		driver.Options{Prefix: "conveyor_", Synchronous: os.Getenv("CONVEYOR_SQLITE_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	ctx := context.Background()
	if _, err := d.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	jobs := make([]driver.InsertParams, n)
	for i := range jobs {
		jobs[i] = driver.InsertParams{Queue: "bench", Kind: "noop", Args: json.RawMessage(`{}`), MaxAttempts: 25}
	}
	if got, err := d.BulkInsert(ctx, jobs); err != nil || got != int64(n) {
		b.Fatalf("bulk insert: %d, %v", got, err)
	}
	return d
}

// BenchmarkClaimComplete drains b.N no-op jobs: claim batches of 100 and
// complete them, one Complete per completeEvery claimed jobs. Run with
// -benchtime=100000x for the 100,000-job drain; the jobs/s metric is the
// drain rate.
func BenchmarkClaimComplete(b *testing.B) {
	for _, tc := range []struct {
		name          string
		completeEvery int
	}{{"complete100", 100}, {"complete1000", 1000}} {
		b.Run(tc.name, func(b *testing.B) {
			d := benchDriver(b, b.N)
			cp := driver.ClaimParams{Queue: "bench", Limit: 100, Lease: time.Minute, Worker: "bench"}
			drain(b, d, tc.completeEvery, func() ([]*driver.JobRow, error) { return d.Claim(context.Background(), cp) })
		})
	}
}

// BenchmarkClaimBlocked drains b.N no-op jobs as BenchmarkClaimComplete
// does (complete1000), from a queue with a MaxRunning that never binds:
// by the plain claim (for reference), by claims under a block
// (ClaimParams.Blocked: the queue's row read, nothing counted), and by
// claims without one (which count the queue's running jobs, up to 1,000
// here, and its blocks).
func BenchmarkClaimBlocked(b *testing.B) {
	for _, tc := range []struct {
		name    string
		limited bool
		blocked bool
	}{{"claim", false, false}, {"blocked", true, true}, {"limited", true, false}} {
		b.Run(tc.name, func(b *testing.B) {
			d := benchDriver(b, b.N)
			ctx := context.Background()
			if err := d.SetQueueLimits(ctx, "bench", driver.QueueLimits{MaxRunning: b.N + 1}); err != nil {
				b.Fatal(err)
			}
			cp := driver.ClaimParams{Queue: "bench", Limit: 100, Lease: time.Minute, Worker: "bench", Blocked: tc.blocked}
			drain(b, d, 1000, func() ([]*driver.JobRow, error) {
				if !tc.limited {
					return d.Claim(ctx, cp)
				}
				r, err := d.ClaimLimited(ctx, cp)
				return r.Rows, err
			})
		})
	}
}

// drain claims every job of d with claim, completing them completeEvery
// at a time, checks that b.N were, and reports the drain rate (jobs/s).
func drain(b *testing.B, d *Driver, completeEvery int, claim func() ([]*driver.JobRow, error)) {
	ctx := context.Background()
	out := make([]driver.Outcome, 0, completeEvery+100)
	done := 0
	flush := func() {
		applied, err := d.Complete(ctx, out)
		if err != nil || len(applied) != len(out) {
			b.Fatalf("complete: %d of %d applied, %v", len(applied), len(out), err)
		}
		done += len(out)
		out = out[:0]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for {
		rows, err := claim()
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			out = append(out, driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted})
		}
		if len(out) >= completeEvery {
			flush()
		}
	}
	if len(out) > 0 {
		flush()
	}
	b.StopTimer()
	if done != b.N {
		b.Fatalf("drained %d jobs, want %d", done, b.N)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkPipeline drains b.N jobs the way the engine does: a fetcher
// claims batches of 100 while a separate completer writes outcomes in
// batches of up to 2000, concurrently.
func BenchmarkPipeline(b *testing.B) {
	d := benchDriver(b, b.N)
	ctx := context.Background()
	ch := make(chan driver.Outcome, 8192)
	errc := make(chan error, 2)
	doneC := make(chan int)
	b.ResetTimer()
	go func() {
		defer close(ch)
		cp := driver.ClaimParams{Queue: "bench", Limit: 100, Lease: time.Minute, Worker: "bench"}
		for {
			rows, err := d.Claim(ctx, cp)
			if err != nil {
				errc <- err
				return
			}
			if len(rows) == 0 {
				return
			}
			for _, r := range rows {
				ch <- driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
			}
		}
	}()
	go func() {
		done := 0
		batch := make([]driver.Outcome, 0, 2000)
		for o := range ch {
			batch = append(batch[:0], o)
		fill:
			for len(batch) < cap(batch) {
				select {
				case o, ok := <-ch:
					if !ok {
						break fill
					}
					batch = append(batch, o)
				default:
					break fill
				}
			}
			applied, err := d.Complete(ctx, batch)
			if err != nil {
				errc <- err
				break
			}
			done += len(applied)
		}
		doneC <- done
	}()
	done := <-doneC
	b.StopTimer()
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	if done != b.N {
		b.Fatalf("drained %d jobs, want %d", done, b.N)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkInsert inserts b.N jobs in batches of 100 (Insert, ids
// returned).
func BenchmarkInsert(b *testing.B) {
	d := benchDriver(b, 0)
	ctx := context.Background()
	batch := make([]driver.InsertParams, 100)
	for i := range batch {
		batch[i] = driver.InsertParams{Queue: "bench", Kind: "noop", Args: json.RawMessage(`{"n":1}`), MaxAttempts: 25}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(batch) {
		if _, err := d.Insert(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkClaimKeyed drains b.N jobs from a queue limited per key (see
// drivertest.BenchClaimKeyed), as BenchmarkClaimComplete does from a
// queue without limits.
func BenchmarkClaimKeyed(b *testing.B) {
	drivertest.BenchClaimKeyed(b, func(b *testing.B) (driver.Driver, []driver.InsertParams) {
		d := benchDriver(b, 0)
		jobs := make([]driver.InsertParams, b.N)
		for i := range jobs {
			jobs[i] = driver.InsertParams{Queue: "bench", Kind: "noop", Args: json.RawMessage(`{}`), MaxAttempts: 25}
		}
		b.ReportAllocs()
		return d, jobs
	})
}
