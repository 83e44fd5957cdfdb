package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// regRowOf returns tbl's row in regs, as a round read it.
func regRowOf(t *testing.T, regs []regRow, tbl string) regRow {
	t.Helper()
	for _, r := range regs {
		if r.tbl == tbl {
			return r
		}
	}
	t.Fatalf("%s is not in the registry", tbl)
	return regRow{}
}

// TestSegmentsMaintainerActsOnStaleRegistry: two processes maintain the
// same prefix for a while (a leader whose round outlasted its lease, and
// the one that took the lead). Each step takes the maintenance lock on
// its own, so a step of one process can act on a registry row it read
// before the other process reclaimed the table and made it current
// again. The reclaim (or drop) it then runs must leave the current
// segment and its jobs alone.
func TestSegmentsMaintainerActsOnStaleRegistry(t *testing.T) {
	for _, step := range []string{"reclaim", "drop", "prune"} {
		t.Run(step, func(t *testing.T) {
			d, a := openSeg(t)
			b := openOther(t, d).seg
			a.tune.grace, b.tune.grace = 0, 0
			ctx := context.Background()
			phase, queue := phReady, "stale-"+step
			if step == "prune" {
				phase = phDone
			}
			v, err := a.viewNow(ctx)
			if err != nil {
				t.Fatal(err)
			}
			x := v.cur[phase].tbl
			if step == "prune" {
				// A completed job in x, finalized long ago.
				finishJobs(t, d, queue, 1, "completed")
				if _, err := d.pool.Exec(ctx, "UPDATE "+x+" SET finalized_at = now() - interval '1 hour'"); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.rotate(ctx, phase); err != nil {
				t.Fatal(err)
			}
			var stale []regRow
			if step != "drop" {
				// a reads x sealed, and due.
				if stale, err = a.registry(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// b reclaims x and makes it current again.
			reclaimSealed(t, b, x)
			if step == "drop" {
				// a reads x free, beyond a ring of none.
				a.tune.ring = 0
				if stale, err = a.registry(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.rotate(ctx, phase); err != nil {
				t.Fatal(err)
			}
			if st := status(t, d, x); st != "current" {
				t.Fatalf("%s is %s, want current again", x, st)
			}
			d.seg.invalidate()
			var ids []int64
			if step == "prune" {
				ids = finishJobs(t, d, queue, 3, "completed")
			} else if ids, err = d.Insert(ctx, []driver.InsertParams{pj(queue), pj(queue), pj(queue)}); err != nil {
				t.Fatal(err)
			}
			if n := rowsIn(t, d, x); n != 3 {
				t.Fatalf("%s holds %d rows, want the 3 new jobs", x, n)
			}
			// a's step, on the row it read before b's.
			r := regRowOf(t, stale, x)
			switch step {
			case "reclaim":
				_, _, err = a.reclaim(ctx, r, true, false)
			case "drop":
				_, err = a.dropSegment(ctx, r)
			case "prune":
				_, _, err = a.reclaim(ctx, r, true, true)
			}
			if err != nil {
				t.Fatal(err)
			}
			var cur int
			if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.prefix+"segments WHERE phase = $1 AND status = 'current'", phase).Scan(&cur); err != nil {
				t.Fatal(err)
			}
			if cur != 1 {
				t.Fatalf("the registry has %d current %s segments, want 1", cur, phase)
			}
			d.seg.invalidate()
			for _, id := range ids {
				if _, err := d.GetJob(ctx, id); err != nil {
					t.Errorf("job %d, in the current segment %s: %v", id, x, err)
				}
			}
			if step != "prune" {
				jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: queue, Limit: 10, Lease: time.Minute, Worker: "w"})
				if err != nil || len(jobs) != 3 {
					t.Fatalf("claimed %d, %v; want 3", len(jobs), err)
				}
			}
		})
	}
}
