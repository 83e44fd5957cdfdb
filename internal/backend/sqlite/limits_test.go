package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestUpgradeCountsRunningJobs upgrades a database of version 15, whose
// concurrency limit was held by slot rows, while a job claimed under it
// runs and its slots are held (one by that job, one by an attempt that no
// longer runs): migration 16 deletes the slots, and the limit is then held
// by the running jobs, the one claimed before the upgrade included.
func TestUpgradeCountsRunningJobs(t *testing.T) {
	ctx := context.Background()
	d := atVersion(t, 15, "u", 6)
	if _, err := d.DB().ExecContext(ctx, `INSERT INTO conveyor_queues (name, max_running, updated_at) VALUES ('u', 2, 0)`); err != nil {
		t.Fatal(err)
	}
	old, err := d.Claim(ctx, driver.ClaimParams{Queue: "u", Limit: 1, Lease: time.Minute, Worker: "old"})
	if err != nil || len(old) != 1 {
		t.Fatalf("claim under version 15: %v, %v", old, err)
	}
	// The slots as version 15 left them: slot 0 held by the running job,
	// slot 1 by an attempt that no longer runs.
	if _, err := d.DB().ExecContext(ctx, `INSERT INTO conveyor_limit_slots (queue, type, lkey, n, job_id, fence)
		VALUES ('u', 'c', '', 0, ?, ?), ('u', 'c', '', 1, 999999, 1)`, old[0].ID, old[0].Fence); err != nil {
		t.Fatal(err)
	}
	if applied, err := d.Migrate(ctx); err != nil || len(applied) != len(d.migrations)-15 {
		t.Fatalf("upgrade: applied %v, %v", applied, err)
	}
	var slots int
	if err := d.DB().QueryRowContext(ctx, `SELECT count(*) FROM conveyor_limit_slots WHERE type = 'c'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d concurrency slots left by the upgrade, %v", slots, err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "u", Limit: 5, Lease: time.Minute, Worker: "new"})
	if err != nil || len(r.Rows) != 1 || !r.Held || r.MaxRunning != 2 {
		t.Fatalf("claimed %d (held %v, max %d), %v beside the job claimed before the upgrade; want 1 held by MaxRunning 2", len(r.Rows), r.Held, r.MaxRunning, err)
	}
	if u, err := d.LimitUsage(ctx); err != nil || u["u"].Running != 2 {
		t.Fatalf("usage %+v, %v; want 2 running", u["u"], err)
	}
	if again, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "u", Limit: 5, Lease: time.Minute, Worker: "new"}); err != nil || len(again.Rows) != 0 || !again.Held {
		t.Fatalf("claimed %d (held %v), %v with 2 running at MaxRunning 2", len(again.Rows), again.Held, err)
	}
	// The job claimed before the upgrade ends: its place is free, with
	// no slot to free.
	if applied, err := d.Complete(ctx, []driver.Outcome{{ID: old[0].ID, Fence: old[0].Fence, Attempt: old[0].Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 1 {
		t.Fatalf("complete: %v, %v", applied, err)
	}
	if got, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "u", Limit: 5, Lease: time.Minute, Worker: "new"}); err != nil || len(got.Rows) != 1 {
		t.Fatalf("claimed %d, %v once the job claimed before the upgrade ended; want 1", len(got.Rows), err)
	}
}

// atVersion opens a driver on a fresh file migrated to version v (and no
// further: its Migrate then upgrades it to the latest), holding n
// available jobs in queue.
func atVersion(t *testing.T, v int, queue string, n int) *Driver {
	t.Helper()
	ctx := context.Background()
	d := openT(t, filepath.Join(t.TempDir(), "t.db"), "conveyor_")
	all := d.migrations
	d.migrations = all[:v]
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	d.migrations = all
	jobs := make([]driver.InsertParams, n)
	for i := range jobs {
		jobs[i] = driver.InsertParams{Queue: queue, Kind: "k", Args: []byte(`{}`), MaxAttempts: 3}
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	return d
}
