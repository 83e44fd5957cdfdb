package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

func limitJobs(queue string, n int) []driver.InsertParams {
	jobs := make([]driver.InsertParams, n)
	for i := range jobs {
		jobs[i] = driver.InsertParams{Queue: queue, Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5}
	}
	return jobs
}

func claimLimited(t *testing.T, d *Driver, queue string, limit int, lease time.Duration) []*driver.JobRow {
	t.Helper()
	r, err := d.ClaimLimited(context.Background(), driver.ClaimParams{Queue: queue, Limit: limit, Lease: lease, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	return r.Rows
}

// A freed slot adds to the matched count of release (complete counts its
// jobs by a statement of their own, and frees the slots by another): a
// batch whose stale outcome would be made up for by a freed slot must
// still report only the outcomes applied, and Release only the jobs
// released.
func TestFreedSlotsDoNotCountAsJobs(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			if _, err := d.Insert(ctx, limitJobs("fq", 6)); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "fq", driver.QueueLimits{MaxRunning: 4}); err != nil {
				t.Fatal(err)
			}
			rows := claimLimited(t, d, "fq", 4, time.Minute)
			if len(rows) != 4 {
				t.Fatalf("claimed %d, want 4", len(rows))
			}
			a, b := rows[0], rows[1]
			if _, err := d.Cancel(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
			applied, err := d.Complete(ctx, []driver.Outcome{
				{ID: a.ID, Fence: a.Fence, Attempt: a.Attempt, State: driver.StateCompleted},
				{ID: b.ID, Fence: b.Fence, Attempt: b.Attempt, State: driver.StateCompleted},
			})
			if err != nil || len(applied) != 1 || applied[0] != a.ID {
				t.Fatalf("complete of one live and one cancelled attempt: applied %v, %v; want [%d]", applied, err, a.ID)
			}
			n, err := d.Release(ctx, []driver.Lease{{ID: rows[2].ID, Fence: rows[2].Fence}, {ID: rows[3].ID, Fence: rows[3].Fence}, {ID: a.ID, Fence: a.Fence}})
			if err != nil || n != 2 {
				t.Fatalf("release of two live attempts and a finished one: %d, %v; want 2", n, err)
			}
			u, err := d.LimitUsage(ctx)
			if err != nil || u["fq"].Running != 0 {
				t.Fatalf("usage %+v, %v; want no slot held", u, err)
			}
		})
	}
}

// Rescue's sweep frees a slot whose holder ended by a path that did not
// free it, and deletes free slots beyond the limit.
func TestRescueSweepsSlots(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.Insert(ctx, limitJobs("sq", 3)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "sq", driver.QueueLimits{MaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	rows := claimLimited(t, d, "sq", 2, time.Minute)
	if len(rows) != 2 {
		t.Fatalf("claimed %d, want 2", len(rows))
	}
	// End one attempt behind the driver's back, and add a surplus slot.
	if _, err := d.db.ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET state = 'completed', lease_expires_at = NULL WHERE id = ?", rows[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(ctx, "INSERT INTO `"+d.prefix+"limit_slots` (queue, type, lkey, n) VALUES ('sq', 'c', '', 7)"); err != nil {
		t.Fatal(err)
	}
	if u, _ := d.LimitUsage(ctx); u["sq"].Running != 2 {
		t.Fatalf("usage %+v before the sweep, want 2 running", u)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if u, _ := d.LimitUsage(ctx); u["sq"].Running != 1 {
		t.Fatalf("usage %+v after the sweep, want the live attempt's 1", u)
	}
	var slots int
	if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"limit_slots` WHERE queue = 'sq'").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 2 {
		t.Fatalf("%d slots after the sweep, want the limit's 2", slots)
	}
	if got := claimLimited(t, d, "sq", 5, time.Minute); len(got) != 1 {
		t.Fatalf("claimed %d after the sweep, want 1", len(got))
	}
}

// Claimers, outcomes and limit changes race on one queue: lock order
// (slots then jobs in claims, jobs then slots in outcomes, the queue's
// row first in SetQueueLimits) leaves nothing that surfaces as an error,
// and every job is completed once.
func TestLimitsUnderChanges(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			const jobs = 300
			if _, err := d.Insert(ctx, limitJobs("lc", jobs)); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "lc", driver.QueueLimits{MaxRunning: 4, Rate: 1000, RatePeriod: time.Second}); err != nil {
				t.Fatal(err)
			}
			var done atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			deadline := time.Now().Add(60 * time.Second)
			stop, stopped := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(stopped)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					l := driver.QueueLimits{MaxRunning: 1 + i%6, Rate: 500 + i%3*500, RatePeriod: time.Second}
					if err := d.SetQueueLimits(ctx, "lc", l); err != nil {
						errs <- err
						return
					}
				}
			}()
			for range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Load() < jobs && time.Now().Before(deadline) {
						r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "lc", Limit: 3, Lease: time.Minute, Worker: "w"})
						if err != nil {
							errs <- err
							return
						}
						if len(r.Rows) == 0 {
							time.Sleep(time.Millisecond)
							continue
						}
						outs := make([]driver.Outcome, len(r.Rows))
						for i, row := range r.Rows {
							outs[i] = driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
						}
						applied, err := d.Complete(ctx, outs)
						if err != nil {
							errs <- err
							return
						}
						done.Add(int64(len(applied)))
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-stopped
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			if done.Load() != jobs {
				t.Fatalf("completed %d of %d", done.Load(), jobs)
			}
			if u, err := d.LimitUsage(ctx); err != nil || u["lc"].Running != 0 {
				t.Fatalf("usage %+v, %v; want no slot held", u, err)
			}
		})
	}
}

// TestClaimUnderLimitsReadBeforeALoweredLimit: a claim reads the queue's
// limits before its transaction. One that read MaxRunning 3, while the
// limit was lowered to 2 and the attempt on slot 2 then ended, must not
// lock slot 2 under the limit it read (claims under the new one fill
// slots 0 and 1): the attempts on slots 0 and 1 still run, so it must
// claim nothing.
func TestClaimUnderLimitsReadBeforeALoweredLimit(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			if _, err := d.Insert(ctx, limitJobs("lo", 6)); err != nil {
				t.Fatal(err)
			}
			old := driver.QueueLimits{MaxRunning: 3}
			if err := d.SetQueueLimits(ctx, "lo", old); err != nil {
				t.Fatal(err)
			}
			rows := claimLimited(t, d, "lo", 3, time.Minute)
			if len(rows) != 3 {
				t.Fatalf("claimed %d, want 3", len(rows))
			}
			if err := d.SetQueueLimits(ctx, "lo", driver.QueueLimits{MaxRunning: 2}); err != nil {
				t.Fatal(err)
			}
			last := rows[2]
			if _, err := d.Complete(ctx, []driver.Outcome{{ID: last.ID, Fence: last.Fence, Attempt: last.Attempt, State: driver.StateCompleted}}); err != nil {
				t.Fatal(err)
			}
			// The claim's transaction, under the limits it read before
			// the change.
			var res driver.ClaimResult
			err := d.inTx(ctx, "claim limited", func(tx *sql.Tx) error {
				var err error
				res, err = d.claimLimitedTx(ctx, tx, driver.ClaimParams{Queue: "lo", Limit: 1, Lease: time.Minute, Worker: "c"}, old, 0, nil)
				return err
			})
			if err != nil && !errors.Is(err, errLimitsChanged) {
				t.Fatal(err)
			}
			u, err := d.LimitUsage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := u["lo"]; got.Running > got.Limits.MaxRunning || len(res.Rows) != 0 {
				t.Fatalf("the claim took %d jobs: %d running at a limit of %d", len(res.Rows), got.Running, got.Limits.MaxRunning)
			}
		})
	}
}

// TestRateRetryInWithUnstampedSlotsLocked: a claim that finds the
// queue's open rate slots locked by another claim is held, and told to
// claim again soon, not when the oldest start within the window leaves
// it: a slot that never admitted a start (a rate just set or raised) and
// that the other claim locks but does not use is open again as soon as
// that claim ends. It was left out of the wait's reckoning, so the
// claimer slept up to a whole period (an hour here) while the window had
// room. (The skip-locked strategy: the optimistic one waits for the
// other claim instead of skipping its slots.)
func TestRateRetryInWithUnstampedSlotsLocked(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if d.claimMethod == ClaimOptimistic {
		t.Skip("the server has no SKIP LOCKED")
	}
	if _, err := d.Insert(ctx, limitJobs("nul", 3)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "nul", driver.QueueLimits{Rate: 3, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rows := claimLimited(t, d, "nul", 1, time.Minute); len(rows) != 1 {
		t.Fatalf("claimed %d, want 1", len(rows))
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// Another claim's lock of the two slots that never admitted a start.
	rows, err := tx.QueryContext(ctx, "SELECT n FROM `"+d.prefix+"limit_slots` WHERE queue = 'nul' AND type = 'r' AND lkey = '' AND used_at IS NULL FOR UPDATE")
	if err != nil {
		t.Fatal(err)
	}
	locked := 0
	for rows.Next() {
		locked++
	}
	rows.Close()
	if locked != 2 {
		t.Fatalf("locked %d unstamped slots, want 2", locked)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "nul", Limit: 2, Lease: time.Minute, Worker: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 0 || !r.Held || r.RetryIn <= 0 || r.RetryIn > time.Second {
		t.Fatalf("claimed %d (held %v, retry in %v) with the window's open slots locked by another claim, want none, held, retry within a second", len(r.Rows), r.Held, r.RetryIn)
	}
}
