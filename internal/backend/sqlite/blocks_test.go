package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// blockRows counts the 'b' rows of queue (the slots leased in blocks).
func blockRows(t *testing.T, d *Driver, queue string) int {
	t.Helper()
	var n int
	if err := d.r.QueryRow(`SELECT count(*) FROM `+d.prefix+`limit_slots WHERE queue = ? AND type = 'b'`, queue).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLeaseSlotsBesideHeldHandle leases a block while every connection
// of the handle conveyor's claims run on is held (by the application's
// handlers, on its own handle given to New, or on DB()): the lease runs
// on the lease path's connection and does not wait for them.
func TestLeaseSlotsBesideHeldHandle(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "own.db")
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	borrowed, err := New(ctx, db, driver.Options{Prefix: "c_"})
	if err != nil {
		t.Fatal(err)
	}
	defer borrowed.Close()
	own := migrated(t)
	for _, d := range []*Driver{borrowed, own} {
		if _, err := d.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.SetQueueLimits(ctx, "q", driver.QueueLimits{MaxRunning: 3}); err != nil {
			t.Fatal(err)
		}
		conn, err := d.DB().Conn(ctx) // the handle's one connection, held
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := d.LeaseSlots(wctx, "a", map[string]int{"q": 2}, time.Minute)
		cancel()
		conn.Close()
		if err != nil || got["q"] != (driver.SlotBlock{Held: 2, Usable: 2, MaxRunning: 3}) {
			t.Fatalf("borrowed %v: lease beside a held connection: %+v, %v", d.borrowed, got, err)
		}
	}
}

// TestBlocksOutliveLimitChanges: setting a queue's limits (lowered,
// removed, a rate added) leaves its blocks to their owners, and Rescue
// leaves a block whose lease has not expired; a queue whose MaxRunning
// was removed counts none of it, and the owner's next lease gives it all
// back.
func TestBlocksOutliveLimitChanges(t *testing.T) {
	ctx := context.Background()
	d := migrated(t)
	if err := d.SetQueueLimits(ctx, "q", driver.QueueLimits{MaxRunning: 4}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"q": 3}, time.Minute); err != nil || got["q"].Held != 3 {
		t.Fatalf("lease: %+v, %v", got, err)
	}
	for _, l := range []driver.QueueLimits{
		{MaxRunning: 2},
		{MaxRunning: 2, Rate: 5, RatePeriod: time.Second},
		{Rate: 5, RatePeriod: time.Second},
	} {
		if err := d.SetQueueLimits(ctx, "q", l); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		if n := blockRows(t, d, "q"); n != 3 {
			t.Fatalf("limits set to %+v: %d slots leased, want the block's 3", l, n)
		}
	}
	u, err := d.LimitUsage(ctx)
	if err != nil || u["q"].Running != 0 {
		t.Fatalf("usage of a queue with a rate only: %+v, %v", u["q"], err)
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"q": 3}, time.Minute); err != nil || got["q"] != (driver.SlotBlock{}) {
		t.Fatalf("renewed without a MaxRunning: %+v, %v", got, err)
	}
	if n := blockRows(t, d, "q"); n != 0 {
		t.Fatalf("%d slots left once the owner gave its block back", n)
	}
}

// TestBlockKeptAboveLoweredLimit: under a lowered limit an owner keeps
// the lowest of its slots it asks for, those above the limit too, and
// uses only what the limit leaves; the slots it kept count in use, so an
// attempt's claim and another owner take none of them, even once the
// limit is raised again, until the owner gives them back.
func TestBlockKeptAboveLoweredLimit(t *testing.T) {
	ctx := context.Background()
	d := migrated(t)
	for range 4 {
		if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Args: []byte("{}"), MaxAttempts: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	lease := func(owner string, want int, w driver.SlotBlock) {
		t.Helper()
		got, err := d.LeaseSlots(ctx, owner, map[string]int{"q": want}, time.Minute)
		if err != nil || got["q"] != w {
			t.Fatalf("%s leases %d: %+v, %v; want %+v", owner, want, got["q"], err, w)
		}
	}
	slots := func(owner string) string {
		t.Helper()
		var s sql.NullString
		if err := d.r.QueryRow(`SELECT group_concat(n, ',') FROM (SELECT n FROM `+d.prefix+`limit_slots
			WHERE queue = 'q' AND type = 'b' AND owner = ? ORDER BY n)`, owner).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s.String
	}
	setMax := func(n int) {
		t.Helper()
		if err := d.SetQueueLimits(ctx, "q", driver.QueueLimits{MaxRunning: n}); err != nil {
			t.Fatal(err)
		}
	}
	setMax(4)
	lease("a", 4, driver.SlotBlock{Held: 4, Usable: 4, MaxRunning: 4})
	setMax(2)
	lease("a", 3, driver.SlotBlock{Held: 3, Usable: 2, MaxRunning: 2})
	if got := slots("a"); got != "0,1,2" {
		t.Fatalf("a's slots after asking for 3 under a lowered limit of 2: %s, want 0,1,2", got)
	}
	if u, err := d.LimitUsage(ctx); err != nil || u["q"].Running != 3 {
		t.Fatalf("usage with a block of 3 above a lowered limit of 2: %+v, %v; want 3 running", u["q"], err)
	}
	setMax(4)
	lease("b", 4, driver.SlotBlock{Held: 1, Usable: 1, MaxRunning: 4})
	if got := slots("b"); got != "3" {
		t.Fatalf("b's slots beside a's 0,1,2 under a raised limit of 4: %s, want 3", got)
	}
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "q", Limit: 4, Lease: time.Minute, Worker: "w"}); err != nil || len(r.Rows) != 0 || !r.Held {
		t.Fatalf("an attempt's claim with every slot leased: claimed %d (held %v), %v", len(r.Rows), r.Held, err)
	}
	lease("a", 1, driver.SlotBlock{Held: 1, Usable: 1, MaxRunning: 4})
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "q", Limit: 4, Lease: time.Minute, Worker: "w"}); err != nil || len(r.Rows) != 2 {
		t.Fatalf("an attempt's claim once a gave 2 back: claimed %d, %v; want 2", len(r.Rows), err)
	}
}

// TestUpgradeToBlocks upgrades a database of version 17 while jobs run
// and rate slots record starts (and a concurrency slot of a version up to
// 15 is left): migration 18 makes limit_slots anew and jobs_running with
// the worker, keeping every slot row and the jobs in flight, which still
// count against the queue's MaxRunning and complete under the fence they
// were claimed with.
func TestUpgradeToBlocks(t *testing.T) {
	ctx := context.Background()
	d := atVersion(t, 17, "u", 6)
	if err := d.SetQueueLimits(ctx, "u", driver.QueueLimits{MaxRunning: 3, Rate: 10, RatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Two jobs claimed under version 17, their starts in the first two
	// rate slots as its limited claim stamps them, and a concurrency
	// slot a version up to 15 made.
	v17, err := d.Claim(ctx, driver.ClaimParams{Queue: "u", Limit: 2, Lease: time.Minute, Worker: "old"})
	if err != nil || len(v17) != 2 {
		t.Fatalf("claim under version 17: %v, %v", v17, err)
	}
	for i, r := range v17 {
		if _, err := d.DB().ExecContext(ctx, `UPDATE conveyor_limit_slots SET used_at = ? WHERE queue = 'u' AND type = 'r' AND n = ?`, r.AttemptedAt.UnixMicro(), i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.DB().ExecContext(ctx, `INSERT INTO conveyor_limit_slots (queue, type, lkey, n, job_id, fence)
		VALUES ('u', 'c', '', 0, ?, ?)`, v17[0].ID, v17[0].Fence); err != nil {
		t.Fatal(err)
	}
	slots := func() string {
		var s string
		if err := d.DB().QueryRowContext(ctx, `SELECT group_concat(type || n || ':' || coalesce(used_at, '-'), ',')
			FROM (SELECT * FROM conveyor_limit_slots ORDER BY type, n)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := slots()
	if applied, err := d.Migrate(ctx); err != nil || len(applied) != len(d.migrations)-17 {
		t.Fatalf("upgrade: applied %v, %v", applied, err)
	}
	if after := slots(); after != before {
		t.Fatalf("slot rows after the upgrade:\n%s\nwant those before it:\n%s", after, before)
	}
	if _, err := d.DB().ExecContext(ctx, `INSERT INTO conveyor_limit_slots (queue, type, n) VALUES ('u', 'x', 0)`); err == nil {
		t.Fatal("the rebuilt table took a slot of type 'x'")
	}
	if got, err := d.LeaseSlots(ctx, "a", map[string]int{"u": 3}, time.Minute); err != nil || got["u"] != (driver.SlotBlock{Held: 1, Usable: 1, MaxRunning: 3}) {
		t.Fatalf("a block beside the 2 jobs claimed before the upgrade: %+v, %v; want 1 of 3", got, err)
	}
	if u, err := d.LimitUsage(ctx); err != nil || u["u"].Running != 3 || u["u"].Started != 2 {
		t.Fatalf("usage after the upgrade: %+v, %v; want 3 running (2 jobs, a block of 1), 2 started", u["u"], err)
	}
	var outcomes []driver.Outcome
	for _, r := range v17 {
		outcomes = append(outcomes, driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted})
	}
	if applied, err := d.Complete(ctx, outcomes); err != nil || len(applied) != 2 {
		t.Fatalf("complete the jobs claimed before the upgrade: %v, %v", applied, err)
	}
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "u", Limit: 5, Lease: time.Minute, Worker: "new"}); err != nil || len(r.Rows) != 2 || !r.Held {
		t.Fatalf("claimed %d (held %v), %v beside a block of 1 under MaxRunning 3; want 2, held", len(r.Rows), r.Held, err)
	}
}
