package mysql

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestFenceEpochs checks the fence layout on every claim path (SKIP
// LOCKED, optimistic, ClaimJob): a claim's fence is what the table holds,
// at or above this server's epoch floor, and a largest epoch row of
// another server (what a promoted replica sees: its former primary's row)
// makes the next claim take a new epoch whose floor is above every fence
// of the former one. The failover itself runs against real servers in
// internal/topology (TestMySQLFenceAcrossFailover).
func TestFenceEpochs(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			ids, err := d.Insert(ctx, []driver.InsertParams{
				{Queue: "f", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 9},
				{Queue: "other", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 9},
			})
			if err != nil {
				t.Fatal(err)
			}
			epochs := func() (n, maxEpoch, server int64) {
				t.Helper()
				if err := d.DB().QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(epoch), 0), COALESCE(MAX(server), -1) FROM `"+d.prefix+"fence_epochs`").Scan(&n, &maxEpoch, &server); err != nil {
					t.Fatal(err)
				}
				return
			}
			stored := func(r *driver.JobRow) {
				t.Helper()
				j, err := d.GetJob(ctx, r.ID)
				if err != nil || j.Fence != r.Fence {
					t.Fatalf("claimed fence %d, table holds %+v (%v)", r.Fence, j, err)
				}
			}
			claim := func() *driver.JobRow {
				t.Helper()
				rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w"})
				if err != nil || len(rows) != 1 {
					t.Fatalf("claim: %d %v", len(rows), err)
				}
				stored(rows[0])
				return rows[0]
			}
			if n, _, _ := epochs(); n != 0 {
				t.Fatalf("%d fence epochs before the first claim", n)
			}
			first := claim()
			n, e, server := epochs()
			if n != 1 || e != 1 {
				t.Fatalf("after the first claim: %d epochs, largest %d", n, e)
			}
			floor := e<<fenceEpochShift + (server&65535)<<20
			if first.Fence != floor {
				t.Fatalf("first fence %d, want the floor %d (epoch %d, server %d)", first.Fence, floor, e, server)
			}
			if n, err := d.Release(ctx, []driver.Lease{{ID: first.ID, Fence: first.Fence}}); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
			second := claim()
			if second.Fence != first.Fence+1 {
				t.Fatalf("second fence %d, want %d", second.Fence, first.Fence+1)
			}
			if n, _, _ := epochs(); n != 1 {
				t.Fatalf("%d epochs after a second claim on the same server", n)
			}

			// Another server's epoch is now the largest (a failover, seen from
			// the promoted server; a failback, seen from the former primary).
			if _, err := d.DB().ExecContext(ctx, "INSERT INTO `"+d.prefix+"fence_epochs` (epoch, server, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))", e+1, server+1); err != nil {
				t.Fatal(err)
			}
			if n, err := d.Release(ctx, []driver.Lease{{ID: second.ID, Fence: second.Fence}}); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
			third := claim()
			n, e3, server3 := epochs()
			if n != 3 || e3 != e+2 || server3 != server+1 {
				t.Fatalf("after another server's epoch: %d epochs, largest %d (server column max %d)", n, e3, server3)
			}
			if want := e3<<fenceEpochShift + (server&65535)<<20; third.Fence != want {
				t.Fatalf("fence after the new epoch %d, want %d", third.Fence, want)
			}
			// The stale attempts' acknowledgements are refused.
			if applied, err := d.Complete(ctx, []driver.Outcome{{ID: first.ID, Fence: second.Fence, Attempt: 1, State: driver.StateCompleted}}); err != nil || len(applied) != 0 {
				t.Fatalf("stale complete applied %v (%v)", applied, err)
			}

			// ClaimJob takes the same floor.
			if _, err := d.DB().ExecContext(ctx, "INSERT INTO `"+d.prefix+"fence_epochs` (epoch, server, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))", e3+1, server+1); err != nil {
				t.Fatal(err)
			}
			j, err := d.ClaimJob(ctx, ids[1], time.Minute, "w")
			if err != nil {
				t.Fatal(err)
			}
			stored(j)
			if want := (e3+2)<<fenceEpochShift + (server&65535)<<20; j.Fence != want {
				t.Fatalf("ClaimJob fence %d, want %d", j.Fence, want)
			}
		})
	}
}
