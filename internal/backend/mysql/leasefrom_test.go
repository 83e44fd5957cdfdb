package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestLeaseFromAfterPoolWait holds the only connection of the driver's
// pool while a claim waits for it: the lease the claim starts runs from
// when its transaction had the connection, and LeaseFrom says so without
// overstating it, for the locking claim and the limited one. (Counted
// from the call instead, the engine would cut the attempts off as they
// start when the wait took most of the lease.)
func TestLeaseFromAfterPoolWait(t *testing.T) {
	d := migrated(t, driver.Options{PoolSize: 1}, nil)
	if d.claimMethod == ClaimOptimistic {
		t.Skip("the optimistic claim runs autocommit statements: it sets no LeaseFrom")
	}
	ctx := context.Background()
	for _, q := range []string{"plain", "limited"} {
		if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: q, Kind: "k", MaxAttempts: 3}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetQueueLimits(ctx, "limited", driver.QueueLimits{MaxRunning: 5}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"plain", "limited"} {
		conn, err := d.DB().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan time.Time, 1)
		time.AfterFunc(300*time.Millisecond, func() {
			released <- time.Now()
			conn.Close()
		})
		p := driver.ClaimParams{Queue: q, Limit: 1, Lease: time.Minute, Worker: "w"}
		var rows []*driver.JobRow
		if q == "plain" {
			rows, err = d.Claim(ctx, p)
		} else {
			var res driver.ClaimResult
			res, err = d.ClaimLimited(ctx, p)
			rows = res.Rows
		}
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s claim after waiting for the pool: %v, %v", q, rows, err)
		}
		from, rel := rows[0].LeaseFrom, <-released
		if from.Before(rel.Add(-time.Millisecond)) {
			t.Fatalf("%s claim: LeaseFrom %v is before the connection was let go (%v)", q, from, rel)
		}
		if dbStart := rows[0].LeaseExpiresAt.Add(-time.Minute); dbStart.Before(from) {
			t.Fatalf("%s claim: LeaseFrom %v is after the server started the lease (%v)", q, from, dbStart)
		}
	}
}

// TestFrontReadTimeLeavesOutPoolWait: the time a read of the queue's
// front took, which spaces the next one (frontAfter), counts from when
// its transaction had a connection. Counted from the call, a claim that
// waited for a busy pool made the next read of the front wait twice that
// wait, and a job that became available behind the cursor with it.
func TestFrontReadTimeLeavesOutPoolWait(t *testing.T) {
	d := migrated(t, driver.Options{PoolSize: 1, ClaimStrategy: "skip-locked"}, nil)
	ctx := context.Background()
	if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "front", Kind: "k", MaxAttempts: 3}}); err != nil {
		t.Fatal(err)
	}
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan time.Time, 1)
	time.AfterFunc(300*time.Millisecond, func() {
		released <- time.Now()
		conn.Close()
	})
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "front", Limit: 10, Lease: time.Minute, Worker: "w"})
	done := time.Now()
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim after waiting for the pool: %v, %v", rows, err)
	}
	cur := d.claimCursor("front")
	cur.mu.Lock()
	took := cur.took
	cur.mu.Unlock()
	if since := done.Sub(<-released); took > since {
		t.Fatalf("the front read took %v by the cursor, more than the %v since the pool's connection was let go", took, since)
	}
}
