// Package drivertest is the shared suite every backend runs against a real
// database: the driver contract of internal/driver, checked statement by
// statement. The client-level conformance suite (package conveyor) runs on
// top of it.
package drivertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Opener opens a driver on a fresh prefix; the suite migrates it and drops
// it at the end.
type Opener func(t *testing.T, prefix string) driver.Driver

// suite is what every area of the suite is given: the backend's way to a
// fresh prefix and to a driver on it.
type suite struct {
	prefixFor func() string
	open      Opener
}

// setup opens a driver on a fresh prefix and migrates it; the prefix's
// tables are dropped and the driver closed when t ends.
func (s suite) setup(t *testing.T) driver.Driver {
	t.Helper()
	d, _ := s.setupPrefix(t)
	return d
}

// setupPrefix is setup, which also returns the driver's prefix.
func (s suite) setupPrefix(t *testing.T) (driver.Driver, string) {
	t.Helper()
	prefix := s.prefixFor()
	d := s.open(t, prefix)
	ctx := context.Background()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := d.DropAll(context.Background()); err != nil {
			t.Errorf("drop: %v", err)
		}
		d.Close()
	})
	return d, prefix
}

// beginTx begins a transaction of the type the driver's InsertTx takes on
// the driver's own handle (the accessors of the backends), and returns
// it with its rollback.
func beginTx(t *testing.T, d driver.Driver) (tx any, rollback func()) {
	t.Helper()
	ctx := context.Background()
	switch h := d.(type) {
	case interface{ Pool() *pgxpool.Pool }:
		ptx, err := h.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ptx, func() { ptx.Rollback(ctx) }
	case interface{ DB() *sql.DB }:
		stx, err := h.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return stx, func() { stx.Rollback() }
	}
	t.Fatalf("driver %T has no handle to begin a transaction on", d)
	return nil, nil
}

func job(queue string, prio int) driver.InsertParams {
	return driver.InsertParams{Queue: queue, Kind: "k", Args: json.RawMessage(`{"a":1}`), Priority: prio, MaxAttempts: 3}
}

// keyedJob is job with key key.
func keyedJob(queue, key string, prio int) driver.InsertParams {
	p := job(queue, prio)
	p.Key = key
	return p
}

// insertJobs inserts jobs and returns their ids; an error fails t.
func insertJobs(t *testing.T, d driver.Driver, jobs ...driver.InsertParams) []int64 {
	t.Helper()
	ids, err := d.Insert(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// claimLimited claims up to limit of queue's jobs through ClaimLimited
// with lease; an error fails t.
func claimLimited(t *testing.T, d driver.Driver, queue string, limit int, lease time.Duration) driver.ClaimResult {
	t.Helper()
	r, err := d.ClaimLimited(context.Background(), driver.ClaimParams{Queue: queue, Limit: limit, Lease: lease, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// completeJob ends r's attempt as state, due again in in where state
// retries or snoozes it; t fails unless the outcome applied.
func completeJob(t *testing.T, d driver.Driver, r *driver.JobRow, state string, in time.Duration) {
	t.Helper()
	o := driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: state, RetryIn: in}
	applied, err := d.Complete(context.Background(), []driver.Outcome{o})
	if err != nil || len(applied) != 1 {
		t.Fatalf("complete %d as %s: applied %v, %v", r.ID, state, applied, err)
	}
}

// setLimits sets queue's limits to l; an error fails t.
func setLimits(t *testing.T, d driver.Driver, queue string, l driver.QueueLimits) {
	t.Helper()
	if err := d.SetQueueLimits(context.Background(), queue, l); err != nil {
		t.Fatal(err)
	}
}

// countByKey counts rows by key ("" for the jobs without one).
func countByKey(rows []*driver.JobRow) map[string]int {
	m := map[string]int{}
	for _, r := range rows {
		m[r.Key]++
	}
	return m
}

// Run runs the suite, one sub-test per area of the driver contract (one
// file each), each holding that area's tests. prefixFor returns a fresh
// prefix for each test.
func Run(t *testing.T, prefixFor func() string, open Opener) {
	s := suite{prefixFor: prefixFor, open: open}
	for _, a := range []struct {
		name string
		run  func(*testing.T, suite)
	}{
		{"Claims", claims},
		{"Fences", fences},
		{"Leases", leases},
		{"Unique", unique},
		{"Inserts", inserts},
		{"InsertClaim", insertClaim},
		{"Periodic", periodic},
		{"Pause", pause},
		{"Limits", limits},
		{"SlotBlocks", slotBlocks},
		{"Keys", keys},
		{"KeyRates", keyRates},
		{"Fair", fair},
		{"Processes", processes},
		{"Admin", admin},
		{"Stats", stats},
		{"Batches", batches},
		{"Maintenance", maintenance},
		{"ListNewestFirst", func(t *testing.T, s suite) { listNewestFirst(t, s.setup(t)) }},
	} {
		t.Run(a.name, func(t *testing.T) { a.run(t, s) })
	}
}

// Fences maps the claimed rows' ids to their fence tokens. A fence is the
// backend's: it only grows, by one or to the database clock (PostgreSQL),
// so tests take it from the claim rather than assume a value.
func Fences(rows []*driver.JobRow) map[int64]int64 {
	m := make(map[int64]int64, len(rows))
	for _, r := range rows {
		m[r.ID] = r.Fence
	}
	return m
}
