package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// A cancel of a job that another statement is moving between segments
// at that moment (a claim from ready to running, a promotion from
// waiting to ready, an outcome from running to waiting) waits for the
// move's row lock and then finds the row gone from the segment it read
// it in, and the moved row is newer than its snapshot: it moved nothing.
// It then reported the job in the wrong state, naming a state it cancels
// ("job is running"), and the job was left running. It runs again.
func TestCancelRacingAClaimCancelsTheClaimedJob(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("c")})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The claim, in a transaction held open: the job's row in ready is
	// deleted and locked until it commits.
	claimSQL := s.stmt(&d.q.SegClaim, v, v.live[phReady], phRunning)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, claimSQL, "c", 1, micros(time.Minute), "w", noHint.prio, noHint.pos)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if rows.Err() != nil || n != 1 {
		t.Fatalf("claim: %d rows, %v", n, rows.Err())
	}
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		j   *driver.JobRow
		err error
	}
	done := make(chan result, 1)
	go func() {
		j, err := d.Cancel(ctx, ids[0])
		done <- result{j, err}
	}()
	// Wait until the cancel waits for the claim's lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := d.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))", pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the cancel returned before the claim committed: %+v, %v", r.j, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancel did not wait for the claim's lock within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("cancel of a job claimed meanwhile: %v", r.err)
	}
	if r.j.State != driver.StateCancelled {
		t.Fatalf("cancel returned the job %s", r.j.State)
	}
	if j, err := d.GetJob(ctx, ids[0]); err != nil || j.State != driver.StateCancelled {
		t.Fatalf("job after the cancel: %+v, %v", j, err)
	}
}
