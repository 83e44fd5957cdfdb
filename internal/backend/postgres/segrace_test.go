package postgres

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
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

// afterQuery is a pgx tracer that runs a function when a query whose
// text contains a string ends, on the goroutine that ran it.
type afterQuery struct {
	match string
	do    func(sql string)
}

type sqlKey struct{}

func (a *afterQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (a *afterQuery) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(sqlKey{}).(string); strings.Contains(sql, a.match) {
		a.do(sql)
	}
}

// TestSegmentsPruneLateWrite: retention decides that a finished segment
// is expired (its newest row older than the age), then truncates it. A
// completion through a view that still takes the segment for current
// (retention's own seal notifies nobody; views are up to a second old)
// lands in it between the two: the truncation must not take that job,
// completed a moment ago, with it.
func TestSegmentsPruneLateWrite(t *testing.T) {
	d0, _ := openSeg(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &afterQuery{match: "max(finalized_at)"}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d, err := New(ctx, pool, nil, driver.Options{Prefix: d0.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	other := openOther(t, d0)

	v, err := d.seg.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	x := v.cur[phDone].tbl
	finishJobs(t, d0, "late", 1, driver.StateCompleted)
	if _, err := d0.pool.Exec(ctx, "UPDATE "+x+" SET finalized_at = now() - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	// other's worker holds a job; its view takes x for the current done
	// segment.
	ids, err := other.Insert(ctx, []driver.InsertParams{pj("late")})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := other.Claim(ctx, driver.ClaimParams{Queue: "late", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claimed %d, %v", len(jobs), err)
	}
	stale, err := other.seg.viewNow(ctx)
	if err != nil || stale.cur[phDone].tbl != x {
		t.Fatalf("other's view: %v", err)
	}
	fired := false
	tracer.do = func(sql string) {
		if fired || !strings.Contains(sql, x) {
			return
		}
		fired = true
		cp := *stale
		cp.at = time.Now()
		other.seg.view.Store(&cp)
		applied, err := other.Complete(ctx, []driver.Outcome{{ID: jobs[0].ID, Fence: jobs[0].Fence, Attempt: jobs[0].Attempt, State: driver.StateCompleted}})
		if err != nil || len(applied) != 1 {
			t.Errorf("late completion: %v %v", applied, err)
		}
		if n := rowsIn(t, d0, x); n != 2 {
			t.Errorf("%s holds %d rows after the late completion, want 2", x, n)
		}
	}
	if _, err := d.Prune(ctx, time.Hour, -1, 100); err != nil {
		t.Fatal(err)
	}
	if !fired {
		t.Fatal("retention never checked the expiry of " + x)
	}
	j, err := d0.GetJob(ctx, ids[0])
	if err != nil || j.State != driver.StateCompleted {
		t.Fatalf("job %d, completed a moment ago: %+v, %v", ids[0], j, err)
	}
}

// tracedDriver opens a driver on d's prefix whose pool (and the
// registry's, made from it) runs tracer.
func tracedDriver(t *testing.T, d *Driver, tracer *afterQuery) *Driver {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	td, err := New(ctx, pool, nil, driver.Options{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = td.Close() })
	return td
}

// TestSweepKeptSeesSegmentsCreatedSince: Rescue's sweep of the key slots
// kept for ordered keys' retries frees a slot whose job it finds in no
// live ready or waiting segment. Its view is read just before its
// statement, but another process (a second maintainer) may rotate and
// reclaim in between: the job then waits in a segment the view does not
// name, and its kept slot must stay kept.
func TestSweepKeptSeesSegmentsCreatedSince(t *testing.T) {
	d0, _ := openSeg(t)
	ctx := context.Background()
	tracer := &afterQuery{match: "inc, sealed_at FROM", do: func(string) {}}
	d := tracedDriver(t, d0, tracer)
	other := openOther(t, d0)
	other.seg.tune.grace = 0
	if err := d0.SetQueueLimits(ctx, "o", driver.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	job := pj("o")
	job.Key = "k"
	ids, err := d0.Insert(ctx, []driver.InsertParams{job})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d0.ClaimLimited(ctx, driver.ClaimParams{Queue: "o", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(res.Rows) != 1 {
		t.Fatalf("claimed %v, %v", res.Rows, err)
	}
	j := res.Rows[0]
	if applied, err := d0.Complete(ctx, []driver.Outcome{{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateRetryable, RetryIn: time.Hour}}); err != nil || len(applied) != 1 {
		t.Fatalf("fail: %v %v", applied, err)
	}
	kept := func() int {
		var n int
		if err := d0.pool.QueryRow(ctx, "SELECT count(*) FROM "+d0.prefix+"key_slots WHERE job_id = $1 AND fence IS NULL", ids[0]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if kept() != 1 {
		t.Fatal("no slot kept for the retry of the ordered key's job")
	}
	v, err := other.seg.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := v.cur[phWaiting].tbl
	fired := false
	tracer.do = func(string) {
		if fired {
			return
		}
		fired = true
		// Right after the sweep's registry read: another process seals
		// the waiting segment and reclaims it, moving the job into a
		// segment created now.
		if err := other.seg.rotate(ctx, phWaiting); err != nil {
			t.Error(err)
		}
		reclaimSealed(t, other.seg, w)
	}
	if _, err := d.seg.sweepKept(ctx); err != nil {
		t.Fatal(err)
	}
	if !fired {
		t.Fatal("the sweep read no registry")
	}
	if got, err := d0.GetJob(ctx, ids[0]); err != nil || got.State != driver.StateRetryable {
		t.Fatalf("the job: %+v, %v", got, err)
	}
	if kept() != 1 {
		t.Fatal("the sweep freed the slot kept for a job waiting for its retry in a segment created after its view")
	}
}

// TestOrderedPickSeesSegmentsCreatedSince: an ordered key's oldest job,
// moved by a reclaim into a ready segment made after a process read its
// view, while a later job of the key went into a sealed segment that
// view knows (an insert through the same stale view), is still the one
// that process's claim starts first: the keyed pick finds its registry
// changed and the claim runs again on a fresh view.
func TestOrderedPickSeesSegmentsCreatedSince(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	s.tune.grace = 0
	other := openOther(t, d)
	if err := d.SetQueueLimits(ctx, "o", driver.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	job := pj("o")
	job.Key = "k"
	first, err := d.Insert(ctx, []driver.InsertParams{job})
	if err != nil {
		t.Fatal(err)
	}
	oldReady := s.view.Load().cur[phReady].tbl
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	s.invalidate()
	ov, err := other.seg.viewNow(ctx) // live ready: the first job's segment, and a current one
	if err != nil {
		t.Fatal(err)
	}
	stale := ov.cur[phReady].tbl
	pin := func() {
		cp := *ov
		cp.at = time.Now()
		other.seg.view.Store(&cp)
	}
	// Another process seals the segment other takes for current and
	// reclaims the first job's, moving that job into a segment made now.
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	reclaimSealed(t, s, oldReady)
	s.invalidate()
	if n := rowsIn(t, d, oldReady); n != 0 {
		t.Fatalf("%d rows left in the reclaimed %s", n, oldReady)
	}
	// The key's next job, through other's stale view: into the sealed
	// segment it still takes for current.
	pin()
	second, err := other.Insert(ctx, []driver.InsertParams{job})
	if err != nil {
		t.Fatal(err)
	}
	if n := rowsIn(t, d, stale); n != 1 {
		t.Fatalf("%d rows in %s, want the second job there (an insert through the stale view)", n, stale)
	}
	pin()
	res, err := other.ClaimLimited(ctx, driver.ClaimParams{Queue: "o", Limit: 2, Lease: time.Minute, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, r := range res.Rows {
		got = append(got, r.ID)
	}
	if !slices.Equal(got, first) {
		t.Fatalf("claimed %v; want only the key's oldest job %v (the next one is %v)", got, first, second)
	}
}
