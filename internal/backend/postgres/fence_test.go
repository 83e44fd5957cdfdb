package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestFenceLayout: a claim's fence (Claim and ClaimJob) carries the
// server's WAL timeline in its high bits, (timeline + 128) * 2^44 +
// milliseconds, and stays below 2^53; a job whose fence is of the former
// layout (the clock in microseconds) gets a larger fence at its next
// claim. The failover itself runs against real servers in
// internal/topology (TestPostgresFenceAcrossFailover).
func TestFenceLayout(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("f"), pj("f")})
	if err != nil {
		t.Fatal(err)
	}
	var timeline int64
	if err := d.pool.QueryRow(ctx, "SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint").Scan(&timeline); err != nil {
		t.Fatal(err)
	}
	check := func(what string, fence int64) {
		t.Helper()
		if fence>>44 != timeline+128 || fence >= 1<<53 {
			t.Fatalf("%s: fence %d: high bits %d, want timeline %d + 128, and below 2^53", what, fence, fence>>44, timeline)
		}
		ms := fence - (timeline+128)<<44
		if at := time.UnixMilli(ms); time.Since(at).Abs() > time.Hour {
			t.Fatalf("%s: fence %d: low bits %d are not the database clock in milliseconds (%v)", what, fence, ms, at)
		}
	}
	// A job of the former layout: its fence the clock in microseconds.
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	former := time.Now().UnixMicro()
	if _, err := d.pool.Exec(ctx, fmt.Sprintf("UPDATE %s SET fence = $1 WHERE id = $2", v.cur[phReady].tbl), former, ids[0]); err != nil {
		t.Fatal(err)
	}
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rows) != 1 || rows[0].ID != ids[0] {
		t.Fatalf("claim: %+v %v", rows, err)
	}
	check("claim", rows[0].Fence)
	if rows[0].Fence <= former {
		t.Fatalf("fence %d after a former-layout fence %d", rows[0].Fence, former)
	}
	j, err := d.ClaimJob(ctx, ids[1], time.Minute, "w")
	if err != nil {
		t.Fatal(err)
	}
	check("claim by id", j.Fence)
}
