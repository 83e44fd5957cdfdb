package mysql

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestKeyLimitLoweredDuringClaim: a KeyMaxRunning lowered (or the queue
// made Ordered) after a claim read the queue's limits and walked its
// keys, but before its transaction locked the key slots: the transaction
// must not admit a key's jobs under the old limit. It fails with
// errLimitsChanged (ClaimLimited runs it again under the new limits) or
// admits no more than the new limit. The steps are claimLimitedOnce's,
// with the change made between them.
func TestKeyLimitLoweredDuringClaim(t *testing.T) {
	for _, v := range variants[:2] {
		for _, c := range []struct {
			name string
			from driver.QueueLimits
			to   driver.QueueLimits
		}{
			{"KeyMaxRunning", driver.QueueLimits{KeyMaxRunning: 2}, driver.QueueLimits{KeyMaxRunning: 1}},
			{"Ordered", driver.QueueLimits{KeyMaxRunning: 2}, driver.QueueLimits{Ordered: true}},
			{"BesideMaxRunning", driver.QueueLimits{MaxRunning: 10, KeyMaxRunning: 2}, driver.QueueLimits{MaxRunning: 10, KeyMaxRunning: 1}},
		} {
			t.Run(v.name+"/"+c.name, func(t *testing.T) {
				ctx := context.Background()
				d := migrated(t, v.opts, v.tweak)
				jobs := limitJobs("kl", 3)
				for i := range jobs {
					jobs[i].Key = "a"
				}
				ids, err := d.Insert(ctx, jobs)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.SetQueueLimits(ctx, "kl", c.from); err != nil {
					t.Fatal(err)
				}
				var lc limitCols
				var above int
				var weights sql.NullString
				if err := d.db.QueryRowContext(ctx, d.q.LimitsRead, "kl").Scan(append(lc.dest(), &above, &weights)...); err != nil {
					t.Fatal(err)
				}
				l := lc.limits()
				kw, err := d.walkKeys(ctx, "kl", l, 5, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.SetQueueLimits(ctx, "kl", c.to); err != nil {
					t.Fatal(err)
				}
				p := driver.ClaimParams{Queue: "kl", Limit: 5, Lease: time.Minute, Worker: "w"}
				var res driver.ClaimResult
				err = d.inTx(ctx, "claim limited", func(tx *sql.Tx) error {
					var err error
					res, err = d.claimLimitedTx(ctx, tx, p, l, above, kw)
					return err
				})
				if errors.Is(err, errLimitsChanged) {
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Rows) > 1 || len(res.Rows) == 1 && res.Rows[0].ID != ids[0] {
					got := []int64{}
					for _, row := range res.Rows {
						got = append(got, row.ID)
					}
					t.Fatalf("limits changed to %+v before the claim's transaction: claimed jobs %v of key a, want at most job %d", c.to, got, ids[0])
				}
			})
		}
	}
}
