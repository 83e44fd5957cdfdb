package mysql

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
)

func benchDriver(b *testing.B, opts driver.Options, tweak func(*Driver)) *Driver {
	b.Helper()
	opts.Prefix = testdb.Prefix()
	d, err := Open(context.Background(), testdb.MySQL(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	if tweak != nil {
		tweak(d)
	}
	if _, err := d.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		d.DropAll(context.Background())
		d.Close()
	})
	return d
}

func benchJobs(n int) []driver.InsertParams {
	in := make([]driver.InsertParams, n)
	for i := range in {
		in[i] = driver.InsertParams{Queue: "b", Kind: "k", Args: json.RawMessage(`{"n":1}`), MaxAttempts: 3}
	}
	return in
}

// BenchmarkClaimComplete measures the hot path: 4 workers claiming batches
// of 100 and completing them, one op per job.
func BenchmarkClaimComplete(b *testing.B) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			d := benchDriver(b, v.opts, v.tweak)
			if _, err := d.BulkInsert(ctx, benchJobs(b.N)); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "b", Limit: 100, Lease: time.Minute, Worker: "w"})
						if err != nil {
							b.Error(err)
							return
						}
						if len(rows) == 0 {
							return
						}
						out := make([]driver.Outcome, len(rows))
						for i, r := range rows {
							out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
						}
						if _, err := d.Complete(ctx, out); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
			b.Logf("counters %v", d.Counters())
		})
	}
}

// BenchmarkInsert measures Insert batches of 100, one op per job.
func BenchmarkInsert(b *testing.B) {
	ctx := context.Background()
	d := benchDriver(b, driver.Options{}, nil)
	in := benchJobs(100)
	b.ResetTimer()
	for i := 0; i < b.N; i += 100 {
		if _, err := d.Insert(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkComplete2000 measures one Complete of 2,000 outcomes with each
// batch source.
func BenchmarkComplete2000(b *testing.B) {
	for _, v := range []struct {
		name  string
		tweak func(*Driver)
	}{{"json_table", nil}, {"union", func(d *Driver) { d.jsonTable = false }}} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			d := benchDriver(b, driver.Options{}, v.tweak)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if _, err := d.BulkInsert(ctx, benchJobs(2000)); err != nil {
					b.Fatal(err)
				}
				rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "b", Limit: 2000, Lease: time.Minute, Worker: "w"})
				if err != nil {
					b.Fatal(err)
				}
				out := make([]driver.Outcome, len(rows))
				for i, r := range rows {
					out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
				}
				b.StartTimer()
				applied, err := d.Complete(ctx, out)
				if err != nil || len(applied) != len(out) {
					b.Fatal(len(applied), err)
				}
			}
		})
	}
}

// BenchmarkClaimKeyed drains b.N jobs from a queue limited per key (see
// drivertest.BenchClaimKeyed).
func BenchmarkClaimKeyed(b *testing.B) {
	drivertest.BenchClaimKeyed(b, func(b *testing.B) (driver.Driver, []driver.InsertParams) {
		return benchDriver(b, driver.Options{}, nil), benchJobs(b.N)
	})
}
