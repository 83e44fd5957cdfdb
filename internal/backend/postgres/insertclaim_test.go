package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// An insert that claims, built for a running segment since sealed and
// reclaimed, is refused by the guard and written again into the current
// one; its claimed job is found there by Heartbeat and Complete after a
// further rotation, and a later claim's fence is above the insert's.
func TestInsertClaimGuard(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	stale, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := stale.cur[phRunning].tbl
	if err := s.rotate(ctx, phRunning); err != nil {
		t.Fatal(err)
	}
	sealedView, err := s.refresh(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b := sealedView.cur[phRunning].tbl
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" {
		t.Fatalf("segment %s is %s, want free", a, st)
	}
	cp := *stale
	cp.at = time.Now()
	s.view.Store(&cp)
	before := s.stale.Load()
	ids, rows, err := d.InsertClaiming(ctx, []driver.InsertParams{pj("ig"), pj("ig")},
		driver.InsertClaim{Claim: []bool{true, false}, Lease: time.Minute, Worker: "w"})
	if err != nil || len(ids) != 2 || rows[0] == nil || rows[1] != nil {
		t.Fatalf("insert claim: %v %v %v", ids, rows, err)
	}
	if s.stale.Load() == before {
		t.Errorf("the stale insert was not refused")
	}
	if n := rowsIn(t, d, a); n != 0 {
		t.Fatalf("%d rows went into the reclaimed segment %s", n, a)
	}
	if n := rowsIn(t, d, b); n != 1 {
		t.Fatalf("current running segment %s holds %d rows, want 1", b, n)
	}
	// Seal b: the claimed job, now in a sealed but live segment, is
	// still found by Heartbeat and Complete.
	if err := s.rotate(ctx, phRunning); err != nil {
		t.Fatal(err)
	}
	owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: rows[0].ID, Fence: rows[0].Fence}}, time.Minute)
	if err != nil || len(owned) != 1 {
		t.Fatalf("heartbeat after the rotation: %v %v", owned, err)
	}
	applied, err := d.Complete(ctx, []driver.Outcome{{ID: rows[0].ID, Fence: rows[0].Fence, Attempt: 1, State: driver.StateCompleted}})
	if err != nil || len(applied) != 1 {
		t.Fatalf("complete: %v %v", applied, err)
	}
	// A job claimed from ready afterwards gets a fence past the insert's.
	jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "ig", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 1 || jobs[0].ID != ids[1] {
		t.Fatalf("claim: %v %v", jobs, err)
	}
	if jobs[0].Fence < rows[0].Fence {
		t.Fatalf("fence %d of a later claim below the insert's %d", jobs[0].Fence, rows[0].Fence)
	}
}
