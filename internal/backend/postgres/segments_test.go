package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// openSeg returns a migrated driver on a fresh prefix, dropped at the
// end, and its segments.
func openSeg(t *testing.T) (*Driver, *segStore) {
	t.Helper()
	d := open(t, driver.Options{})
	return d, d.seg
}

// openOther opens a second driver on d's prefix, as another process
// would, closed when the test ends.
func openOther(t *testing.T, d *Driver) *Driver {
	t.Helper()
	other, err := Open(context.Background(), testdb.Postgres(t), driver.Options{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	return other
}

// status returns a segment's status in the registry.
func status(t *testing.T, d *Driver, tbl string) string {
	t.Helper()
	var st string
	if err := d.pool.QueryRow(context.Background(), "SELECT status FROM "+d.prefix+"segments WHERE tbl = $1", tbl).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func rowsIn(t *testing.T, d *Driver, tbl string) int64 {
	t.Helper()
	var n int64
	if err := d.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSegmentsRotationUnderLoad rotates and reclaims small segments as
// fast as it can while producers insert (some jobs delayed), workers
// claim, heartbeat, fail some attempts and complete: every job completes
// exactly once and no claim is handed out twice.
func TestSegmentsRotationUnderLoad(t *testing.T) {
	d, s := openSeg(t)
	s.tune.sealBytes, s.tune.finishedBytes, s.tune.grace = 24<<10, 48<<10, 0
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const producers, perProducer, batch = 3, 600, 10
	const total = producers * perProducer

	var mu sync.Mutex
	inserted := map[int64]bool{}
	completed := map[int64]int{}
	claimed := map[[2]int64]bool{}
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < perProducer; i += batch {
				jobs := make([]driver.InsertParams, batch)
				for k := range jobs {
					jobs[k] = pj("load")
					if k%5 == 0 {
						jobs[k].Delay = 20 * time.Millisecond
					}
				}
				ids, err := d.Insert(ctx, jobs)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				for _, id := range ids {
					inserted[id] = true
				}
				mu.Unlock()
			}
		}(p)
	}
	done := make(chan struct{})
	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if err := s.round(ctx); err != nil && ctx.Err() == nil {
				fail(fmt.Errorf("round: %w", err))
			}
			if _, err := d.Promote(ctx, 1000); err != nil && ctx.Err() == nil {
				fail(fmt.Errorf("promote: %w", err))
			}
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(completed)
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for count() < total && ctx.Err() == nil {
				jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "load", Limit: 20, Lease: time.Minute, Worker: fmt.Sprint("w", w)})
				if err != nil {
					fail(err)
					return
				}
				if len(jobs) == 0 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				leases := make([]driver.Lease, len(jobs))
				outs := make([]driver.Outcome, len(jobs))
				mu.Lock()
				for i, j := range jobs {
					k := [2]int64{j.ID, j.Fence}
					if claimed[k] {
						errs = append(errs, fmt.Errorf("job %d fence %d claimed twice", j.ID, j.Fence))
					}
					claimed[k] = true
					leases[i] = driver.Lease{ID: j.ID, Fence: j.Fence}
					outs[i] = driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: driver.StateCompleted}
					if j.ID%7 == 0 && j.Attempt == 1 {
						outs[i].State = driver.StateRetryable
						outs[i].Err = &driver.AttemptError{Attempt: 1, Error: "again"}
					}
				}
				mu.Unlock()
				owned, err := d.Heartbeat(ctx, leases, time.Minute)
				if err != nil || len(owned) != len(leases) {
					fail(fmt.Errorf("heartbeat: %d of %d owned, %v", len(owned), len(leases), err))
				}
				applied, err := d.Complete(ctx, outs)
				if err != nil || len(applied) != len(outs) {
					fail(fmt.Errorf("complete: %d of %d applied, %v", len(applied), len(outs), err))
				}
				mu.Lock()
				for _, o := range outs {
					if o.State == driver.StateCompleted {
						completed[o.ID]++
					}
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(done)
	<-maintDone
	for _, err := range errs {
		t.Error(err)
	}
	if len(inserted) != total || len(completed) != total {
		t.Fatalf("inserted %d, completed %d, want %d each", len(inserted), len(completed), total)
	}
	for id, n := range completed {
		if !inserted[id] || n != 1 {
			t.Errorf("job %d completed %d times (inserted %v)", id, n, inserted[id])
		}
	}
	stats, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Counts[driver.StateCompleted] != total {
		t.Fatalf("stats %+v, want %d completed and nothing else", stats, total)
	}
	for st, n := range stats[0].Counts {
		if st != driver.StateCompleted && n != 0 {
			t.Errorf("%d jobs %s", n, st)
		}
	}
	if s.reclaims.Load() == 0 {
		t.Errorf("no segment was reclaimed")
	}
	t.Logf("reclaims %d, drained %d, refused %d, created %d, dropped %d, stale views %d",
		s.reclaims.Load(), s.drained.Load(), s.refusals.Load(), s.created.Load(), s.dropped.Load(), s.stale.Load())
}

// TestSegmentsReclaimWhileHeld holds a REPEATABLE READ transaction that
// read a segment: its truncation is refused (NOWAIT) and the segment is
// drained instead, claims and inserts go on meanwhile, the held snapshot
// still sees its rows, and once the transaction ends the segment is
// truncated and free.
func TestSegmentsReclaimWhileHeld(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := v.cur[phReady].tbl
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("h"), pj("h"), pj("h")}); err != nil {
		t.Fatal(err)
	}
	hold, err := pgx.Connect(ctx, testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	if _, err := hold.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	var seen int64
	if err := hold.QueryRow(ctx, "SELECT count(*) FROM "+a).Scan(&seen); err != nil || seen != 3 {
		t.Fatalf("held snapshot sees %d rows, %v", seen, err)
	}
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	s.invalidate()
	jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "h", Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 3 {
		t.Fatalf("claimed %d, %v", len(jobs), err)
	}
	refusedBefore := s.refusals.Load()
	// Reclaim rounds while claimers work: no claim waits on the held
	// lock (each has a generous deadline only so that a hang fails).
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				if _, err := d.Insert(cctx, []driver.InsertParams{pj("h2")}); err != nil {
					t.Error(err)
				}
				js, err := d.Claim(cctx, driver.ClaimParams{Queue: "h2", Limit: 5, Lease: time.Minute, Worker: "w"})
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				_ = js
			}
		}()
	}
	// Five rounds at least, and more while the segment is not drained
	// yet: its SHARE lock is taken without waiting, and the claimers'
	// statements, which hold ROW EXCLUSIVE on every live segment they
	// touch until they commit, may make a loaded machine's rounds miss
	// it several times in a row.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < 5 || status(t, d, a) != "drained" && time.Now().Before(deadline); i++ {
		if err := s.round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if s.refusals.Load() == refusedBefore {
		t.Error("the truncation of a segment a held snapshot read was not refused")
	}
	if st := status(t, d, a); st != "drained" {
		t.Fatalf("segment %s is %s while held, want drained", a, st)
	}
	if err := hold.QueryRow(ctx, "SELECT count(*) FROM "+a).Scan(&seen); err != nil || seen != 3 {
		t.Fatalf("held snapshot now sees %d rows, %v: the table was truncated under it", seen, err)
	}
	if _, err := hold.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" {
		t.Fatalf("segment %s is %s after the hold ended, want free", a, st)
	}
}

// TestSegmentsGuard inserts through a view of the registry taken before
// the current ready segment was sealed and reclaimed: the guard refuses
// the stale incarnation, and the job lands in the current segment.
func TestSegmentsGuard(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	stale, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := stale.cur[phReady].tbl
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" {
		t.Fatalf("segment %s is %s, want free", a, st)
	}
	useStale := func() {
		cp := *stale
		cp.at = time.Now()
		s.view.Store(&cp)
	}
	useStale()
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("g")})
	if err != nil || len(ids) != 1 {
		t.Fatalf("insert: %v %v", ids, err)
	}
	useStale()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids2, err := d.InsertTx(ctx, tx, []driver.InsertParams{pj("g")})
	if err != nil || len(ids2) != 1 {
		t.Fatalf("insert tx: %v %v", ids2, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if s.stale.Load() < 2 {
		t.Errorf("guard refusals %d, want 2", s.stale.Load())
	}
	if n := rowsIn(t, d, a); n != 0 {
		t.Fatalf("%d rows went into the reclaimed segment %s", n, a)
	}
	cur := s.view.Load().cur[phReady].tbl
	if cur == a || rowsIn(t, d, cur) != 2 {
		t.Fatalf("current segment %s (stale was %s) holds %d rows, want 2", cur, a, rowsIn(t, d, cur))
	}
	jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "g", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 2 {
		t.Fatalf("claimed %d, %v", len(jobs), err)
	}
}

// A claim built for a running segment that has since been reclaimed
// moves nothing and says so in its own result (a row the driver drops):
// the driver reads the registry again and claims into the current one,
// also when the queue is empty.
func TestSegmentsClaimGuardInResult(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("cg"), pj("cg")}); err != nil {
		t.Fatal(err)
	}
	stale, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := stale.cur[phRunning].tbl
	if err := s.rotate(ctx, phRunning); err != nil {
		t.Fatal(err)
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" {
		t.Fatalf("segment %s is %s, want free", a, st)
	}
	useStale := func() {
		cp := *stale
		cp.at = time.Now()
		s.view.Store(&cp)
	}
	for _, q := range []struct {
		queue string
		want  int
	}{{"cg", 2}, {"cg-empty", 0}} {
		useStale()
		before := s.stale.Load()
		jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: q.queue, Limit: 5, Lease: time.Minute, Worker: "w"})
		if err != nil || len(jobs) != q.want {
			t.Fatalf("%s: claimed %d, %v; want %d", q.queue, len(jobs), err, q.want)
		}
		for _, j := range jobs {
			if j.ID <= 0 || j.Kind != "k" {
				t.Fatalf("%s: claimed %+v", q.queue, j)
			}
		}
		if s.stale.Load() == before {
			t.Errorf("%s: the stale claim was not refused", q.queue)
		}
		if n := rowsIn(t, d, a); n != 0 {
			t.Fatalf("%s: %d rows went into the reclaimed segment %s", q.queue, n, a)
		}
	}
	if cur := s.view.Load().cur[phRunning].tbl; cur == a || rowsIn(t, d, cur) != 2 {
		t.Fatalf("current running segment %s (stale was %s) holds %d rows, want 2", cur, a, rowsIn(t, d, cur))
	}
}

// TestSegmentsSequenceResumedPastIncarnation reproduces what crash
// recovery does to a sequence advanced by nextval (it resumes up to 32
// past its last value: nextval logs ahead) on the current segments, and
// on a free one that becomes current: the guards refuse every insert
// and claim until maintenance sets the sequences back to the registry's
// incarnations, and a rotation onto a free table does so at once. Found
// by the torture suite's database restart on the segments storage: after
// an immediate restart no job was picked up again.
func TestSegmentsSequenceResumedPastIncarnation(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	jump := func(tbl string) {
		t.Helper()
		if _, err := d.pool.Exec(ctx, "SELECT setval('"+tbl+"_inc', last_value + 32) FROM "+tbl+"_inc"); err != nil {
			t.Fatal(err)
		}
	}
	inSync := func(tbl string) {
		t.Helper()
		var seq, inc int64
		if err := d.pool.QueryRow(ctx, "SELECT (SELECT last_value FROM "+tbl+"_inc), inc FROM "+d.prefix+"segments WHERE tbl = $1", tbl).Scan(&seq, &inc); err != nil {
			t.Fatal(err)
		}
		if seq != inc {
			t.Fatalf("%s: sequence at %d, registry incarnation %d", tbl, seq, inc)
		}
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []string{phReady, phRunning, phWaiting, phDone, phDead} {
		jump(v.cur[ph].tbl)
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("q")}); err == nil {
		t.Fatal("insert through a guard whose sequence is past the incarnation succeeded: the test no longer shows the hazard")
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.synced.Load(); n != 5 {
		t.Fatalf("maintenance synced %d current segments, want 5", n)
	}
	for _, ph := range []string{phReady, phRunning, phWaiting, phDone, phDead} {
		inSync(v.cur[ph].tbl)
	}
	if ids, err := d.Insert(ctx, []driver.InsertParams{pj("q")}); err != nil || len(ids) != 1 {
		t.Fatalf("insert after the sync: %v %v", ids, err)
	}
	jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claimed %d, %v; want the one job", len(jobs), err)
	}

	// A free table whose sequence resumed past its incarnation, made
	// current by a rotation: in sync at once, and its next reclaim draws
	// an incarnation above both.
	a := v.cur[phReady].tbl
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	s.lastMaint = time.Time{}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" {
		t.Fatalf("segment %s is %s, want free", a, st)
	}
	var freeInc int64
	if err := d.pool.QueryRow(ctx, "SELECT inc FROM "+d.prefix+"segments WHERE tbl = $1", a).Scan(&freeInc); err != nil {
		t.Fatal(err)
	}
	jump(a)
	for range 4 { // rotate until a is current again (the ring holds few free tables)
		if s.view.Load() != nil {
			s.invalidate()
		}
		if err := s.rotate(ctx, phReady); err != nil {
			t.Fatal(err)
		}
		if status(t, d, a) == "current" {
			break
		}
	}
	if st := status(t, d, a); st != "current" {
		t.Fatalf("segment %s is %s after rotations, want current", a, st)
	}
	inSync(a)
	s.invalidate()
	if ids, err := d.Insert(ctx, []driver.InsertParams{pj("q")}); err != nil || len(ids) != 1 {
		t.Fatalf("insert into the re-used segment: %v %v", ids, err)
	}
	if n := rowsIn(t, d, a); n != 1 {
		t.Fatalf("re-used segment %s holds %d rows, want 1", a, n)
	}
	jump(a) // the sequence past the registry again, then sealed and reclaimed
	var seq int64
	if err := d.pool.QueryRow(ctx, "SELECT last_value FROM "+a+"_inc").Scan(&seq); err != nil {
		t.Fatal(err)
	}
	s.invalidate()
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	reclaimSealed(t, s, a)
	var inc int64
	if err := d.pool.QueryRow(ctx, "SELECT inc FROM "+d.prefix+"segments WHERE tbl = $1", a).Scan(&inc); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "free" || inc != seq+1 || inc <= freeInc {
		t.Fatalf("segment %s reclaimed: %s at incarnation %d; want free at %d (the sequence's %d + 1)", a, st, inc, seq+1, seq)
	}
	inSync(a)
}

// TestSegmentsHeartbeatAfterMoveAndNotification renews the lease of a
// job that a reclaim moved into a running segment the heartbeat's view
// does not know, while the leader's notification replaces the view with
// an invalidated copy of the same stale content: the retry must read the
// registry again, not reuse that copy, or the live worker loses its lease
// (seen once in CI's skew+5m torture phase on segments).
func TestSegmentsHeartbeatAfterMoveAndNotification(t *testing.T) {
	d, s := openSeg(t)
	s.tune.grace = 0
	ctx := context.Background()
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("h")}); err != nil {
		t.Fatal(err)
	}
	jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: "h", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claimed %d, %v", len(jobs), err)
	}
	stale, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := stale.cur[phRunning].tbl
	if err := s.rotate(ctx, phRunning); err != nil {
		t.Fatal(err)
	}
	reclaimSealed(t, s, r)
	if st := status(t, d, r); st != "free" {
		t.Fatalf("running segment %s is %s after its reclaim, want free (the job moved out)", r, st)
	}
	fresh := *stale
	fresh.at = time.Now() // the heartbeat's view, as if just read
	s.view.Store(&fresh)
	ids, fences := leaseArgs([]driver.Lease{{ID: jobs[0].ID, Fence: jobs[0].Fence}})
	builds := 0
	owned, err := s.leaseOp(ctx, []int64{jobs[0].ID}, []any{ids, fences, micros(time.Minute)}, func(v *segView, srcs []string) string {
		builds++
		if builds == 1 {
			s.invalidate() // the notification arrives while the statement runs
		}
		return s.stmt(&d.q.SegHeartbeat, v, srcs)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) == 0 || owned[0] != jobs[0].ID {
		t.Fatalf("heartbeat renewed %v after %d statements; want job %d: the live worker lost its lease", owned, builds, jobs[0].ID)
	}
}

// TestSegmentsOutcomesNameTheirSegment completes and heartbeats a job
// while another session holds an ACCESS EXCLUSIVE lock on a sealed
// running segment that holds another job: the lease path names only the
// segment its job was claimed into, so it does not wait for that lock
// (before, every statement named every live running segment, and the
// leader's NOWAIT reclaim of a sealed one was refused for as long as
// workers were busy). The job in the locked segment completes once the
// lock is gone, and a job whose segment this process never recorded (a
// fresh driver) is still found by looking in every segment.
func TestSegmentsOutcomesNameTheirSegment(t *testing.T) {
	d, s := openSeg(t)
	ctx := context.Background()
	claimOne := func(queue string) *driver.JobRow {
		t.Helper()
		if _, err := d.Insert(ctx, []driver.InsertParams{pj(queue)}); err != nil {
			t.Fatal(err)
		}
		jobs, err := d.Claim(ctx, driver.ClaimParams{Queue: queue, Limit: 1, Lease: time.Minute, Worker: "w"})
		if err != nil || len(jobs) != 1 {
			t.Fatalf("claimed %d, %v", len(jobs), err)
		}
		return jobs[0]
	}
	a := claimOne("a")
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sealed := v.cur[phRunning].tbl
	if err := s.rotate(ctx, phRunning); err != nil {
		t.Fatal(err)
	}
	if _, err := s.refresh(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	b := claimOne("b")

	lockTx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockTx.Rollback(ctx)
	if _, err := lockTx.Exec(ctx, "LOCK TABLE "+sealed+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// Bounded: without the fix these statements wait for the lock.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	owned, err := d.Heartbeat(bctx, []driver.Lease{{ID: b.ID, Fence: b.Fence}}, time.Minute)
	if err != nil || len(owned) != 1 {
		t.Fatalf("heartbeat of job %d in the current segment while %s is locked: %v, %v", b.ID, sealed, owned, err)
	}
	done, err := d.Complete(bctx, []driver.Outcome{{ID: b.ID, Fence: b.Fence, State: driver.StateCompleted}})
	if err != nil || len(done) != 1 {
		t.Fatalf("completion of job %d in the current segment while %s is locked: %v, %v", b.ID, sealed, done, err)
	}
	if err := lockTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A driver that did not claim job a looks for it everywhere.
	other := openOther(t, d)
	done, err = other.Complete(ctx, []driver.Outcome{{ID: a.ID, Fence: a.Fence, State: driver.StateCompleted}})
	if err != nil || len(done) != 1 || done[0] != a.ID {
		t.Fatalf("completion of job %d by a driver that did not claim it: %v, %v", a.ID, done, err)
	}
	for _, j := range []*driver.JobRow{a, b} {
		got, err := d.GetJob(ctx, j.ID)
		if err != nil || got.State != driver.StateCompleted {
			t.Fatalf("job %d after its completion: %+v, %v", j.ID, got, err)
		}
	}
}

// TestSegmentsOverviewSkipsOldFinished: Overview reads only the done
// segments that may hold a job finished since the time asked (current
// ones and those sealed after it); with finished jobs spread over several
// sealed segments, its count of completed jobs for any since is exactly
// what a full count of every done segment gives.
func TestSegmentsOverviewSkipsOldFinished(t *testing.T) {
	d, s := openSeg(t)
	// Views refreshed after every round below: no row can enter a sealed
	// segment late, so the overview may skip one sealed before since.
	s.tune.finishedBytes, s.tune.grace, s.tune.lateWrites = 4<<10, 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var marks []time.Time // the database's clock between rounds
	for round := 0; round < 6; round++ {
		jobs := make([]driver.InsertParams, 20)
		for i := range jobs {
			jobs[i] = pj("ov")
		}
		if _, err := d.Insert(ctx, jobs); err != nil {
			t.Fatal(err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "ov", Limit: 20, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 20 {
			t.Fatalf("claimed %d: %v", len(rows), err)
		}
		out := make([]driver.Outcome, len(rows))
		for i, r := range rows {
			out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
		}
		if applied, err := d.Complete(ctx, out); err != nil || len(applied) != 20 {
			t.Fatalf("completed %d: %v", len(applied), err)
		}
		if err := s.round(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.refresh(ctx, time.Time{}); err != nil {
			t.Fatal(err)
		}
		var now time.Time
		if err := d.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		marks = append(marks, now)
	}
	var sealed int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.prefix+"segments WHERE phase = 'done' AND status = 'sealed'").Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if sealed < 2 {
		rows, _ := d.pool.Query(ctx, "SELECT tbl || ' ' || status || ' ' || coalesce(sealed_at::text, '-') FROM "+d.prefix+"segments WHERE phase = 'done'")
		all, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Fatalf("%d sealed done segments, want finished jobs spread over several: %v", sealed, all)
	}
	full := func(since time.Time) int64 { // every done segment, current or sealed
		rows, err := d.pool.Query(ctx, "SELECT tbl FROM "+d.prefix+"segments WHERE phase = 'done' AND status IN ('current', 'sealed')")
		if err != nil {
			t.Fatal(err)
		}
		tbls, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, tbl := range tbls {
			var k int64
			if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl+" WHERE state = 'completed' AND finalized_at >= $1", since).Scan(&k); err != nil {
				t.Fatal(err)
			}
			n += k
		}
		return n
	}
	for _, since := range append([]time.Time{marks[0].Add(-time.Hour)}, marks...) {
		st, err := d.Overview(ctx, since)
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		for _, q := range st {
			got += q.Counts[driver.StateCompleted]
		}
		if want := full(since); got != want {
			t.Errorf("since %v: overview counts %d completed, the done segments hold %d", since, got, want)
		}
	}
}

// TestSegmentsFinishedListIndexes: a current done or dead segment carries
// no (queue, id) or (kind, id) index (two entries per finished job kept
// off the completion path); a sealed one gets them with its counts, after
// which a list of completed jobs filtered by a rare queue reads the queue
// index instead of walking every finished job in id order; a free done
// table made current again drops them. The done segment is analyzed so
// that the plan is the one a large segment gets; EXPLAIN without ANALYZE
// runs nothing.
func TestSegmentsFinishedListIndexes(t *testing.T) {
	sortNode := regexp.MustCompile(`(?m)^\s*(->\s*)?Sort\s+\(`)
	d, s := openSeg(t)
	ctx := context.Background()
	hasIndexes := func(tbl string) int {
		t.Helper()
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname IN ($2, $3)",
			tbl, tbl+"_queue_idx", tbl+"_kind_idx").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []string{phDone, phDead} {
		if tbl := v.cur[ph].tbl; hasIndexes(tbl) != 0 {
			t.Errorf("current %s segment %s has list indexes", ph, tbl)
		}
	}

	// 3,000 completed jobs of queue "busy", 5 of "rare".
	var params []driver.InsertParams
	for i := 0; i < 3005; i++ {
		q := "busy"
		if i%601 == 0 {
			q = "rare"
		}
		params = append(params, pj(q))
	}
	if _, err := d.BulkInsert(ctx, params); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"busy", "rare"} {
		for {
			js, err := d.Claim(ctx, driver.ClaimParams{Queue: q, Limit: 500, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if len(js) == 0 {
				break
			}
			var outs []driver.Outcome
			for _, j := range js {
				outs = append(outs, driver.Outcome{ID: j.ID, Fence: j.Fence, State: driver.StateCompleted})
			}
			if _, err := d.Complete(ctx, outs); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := v.cur[phDone].tbl
	listRare := func(when string) {
		t.Helper()
		rare, err := d.ListJobs(ctx, driver.JobFilter{States: []string{driver.StateCompleted}, Queue: "rare"})
		if err != nil || len(rare) != 5 {
			t.Fatalf("%s: listed %d completed jobs of queue rare, %v; want 5", when, len(rare), err)
		}
	}
	listRare("current segment, no list index")

	// Sealed, then counted: the indexes come with the counts.
	if err := s.rotate(ctx, phDone); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, done); st != "sealed" {
		t.Fatalf("done segment %s is %s after the rotation, want sealed", done, st)
	}
	if hasIndexes(done) != 0 {
		t.Errorf("sealed done segment %s has list indexes before it is counted", done)
	}
	if ok, err := s.recordCounts(ctx, done); err != nil || !ok {
		t.Fatalf("counting sealed segment %s: %v, %v", done, ok, err)
	}
	if n := hasIndexes(done); n != 2 {
		t.Fatalf("counted done segment %s has %d of its 2 list indexes", done, n)
	}
	listRare("sealed segment, indexed")
	if _, err := d.pool.Exec(ctx, "ANALYZE "+done); err != nil {
		t.Fatal(err)
	}
	v, err = s.refresh(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	q := s.listQuery(v, []string{driver.StateCompleted}, true, false, false, false)
	if all := explain(t, d.pool.Query, q, int64(0), []string{driver.StateCompleted}, "rare", "", 100, int64(0)); !strings.Contains(all, done+"_queue_idx") {
		t.Errorf("a list of queue rare's completed jobs does not read %s_queue_idx:\n%s", done, all)
	}
	q = s.listQuery(v, []string{driver.StateCompleted}, true, false, true, true)
	if all := explain(t, d.pool.Query, q, int64(0), []string{driver.StateCompleted}, "rare", "", 100, int64(1<<40)); !strings.Contains(all, "Index Scan Backward using "+done+"_queue_idx") || sortNode.MatchString(all) {
		t.Errorf("a list of queue rare's completed jobs, newest first, does not read %s_queue_idx backwards:\n%s", done, all)
	}

	// Freed (as retention does) and made current again: the indexes go.
	if _, err := d.pool.Exec(ctx, "UPDATE "+d.prefix+"segments SET status = 'free' WHERE tbl = $1", done); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, "TRUNCATE "+done); err != nil {
		t.Fatal(err)
	}
	if err := s.rotate(ctx, phDone); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, done); st != "current" {
		t.Fatalf("free done table %s is %s after the rotation, want current", done, st)
	}
	if n := hasIndexes(done); n != 0 {
		t.Errorf("free done table %s made current with %d list indexes", done, n)
	}
}

// TestClaimLostInCrash: a claim commits without waiting for its WAL flush
// (synchronous_commit off for that transaction alone), so a server crash
// may lose a claim whose worker already runs the job. The job is then
// claimed again with the same attempt number; its new fence must differ
// from the lost one, or the first worker's acknowledgements would be taken
// for the new attempt's. The test undoes a claim as the crash would (the
// row back as it was before, in its ready segment) and checks that the next claim's fence is new and that the
// lost claim's heartbeat and completion are refused.
func TestClaimLostInCrash(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("c"), pj("c"), pj("probe")})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claimSQL := s.stmt(&d.q.SegClaim, v, v.live[phReady], phRunning)
	hint := []any{noHint.prio, noHint.pos} // the claim starts past a hint (none here)
	// The claim statement turns synchronous_commit off for its own
	// transaction: seen inside an explicit one (rolled back), and
	// back to the session's setting on the same connection after
	// a claim in its own implicit transaction.
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	show := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var sc string
		if err := q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
			t.Fatal(err)
		}
		return sc
	}
	claimed := func(rows pgx.Rows, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		rows.Close()
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return n
	}
	// The session's own setting is on, whatever the server's
	// (a test server may run with synchronous_commit off), so
	// that the claim's "off" can be told apart from it.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET synchronous_commit") // before Release
	session := show(conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // before the cleanup drops the tables
	if n := claimed(tx.Query(ctx, claimSQL, append([]any{"c", 1, micros(time.Minute), "probe"}, hint...)...)); n != 1 {
		t.Fatalf("claim in a transaction: %d rows, want 1", n)
	}
	if sc := show(tx); sc != "off" {
		t.Fatalf("synchronous_commit %q after a claim in its transaction, want off", sc)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := claimed(conn.Query(ctx, claimSQL, append([]any{"probe", 1, micros(time.Minute), "probe"}, hint...)...)); n != 1 {
		t.Fatalf("claim of the probe job: %d rows, want 1", n)
	}
	if sc := show(conn); sc != session {
		t.Fatalf("synchronous_commit %q on the connection after a claim, want the session's %q", sc, session)
	}

	first, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 1, Lease: time.Minute, Worker: "w1"})
	if err != nil || len(first) != 1 || first[0].ID != ids[0] {
		t.Fatalf("claim: %d rows, %v", len(first), err)
	}
	lost := first[0]
	// Undo the claim as a crash before its flush would.
	undo := fmt.Sprintf(`WITH m AS (DELETE FROM %s WHERE id = $1 RETURNING *)
				INSERT INTO %s SELECT * FROM m`, v.cur[phRunning].tbl, v.cur[phReady].tbl)
	if tag, err := d.pool.Exec(ctx, undo, lost.ID); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("undo the claim: %v, %v", tag, err)
	}
	if _, err := d.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET state = 'available', attempt = attempt - 1,
				fence = 0, attempted_at = NULL, lease_expires_at = NULL, attempted_by = NULL WHERE id = $1`,
		v.cur[phReady].tbl), lost.ID); err != nil {
		t.Fatal(err)
	}
	// The server's restart broke the listener's connection, and
	// its reconnection starts the claim hints over (the claim
	// above left one past the lost job).
	s.hints.wakeAll()
	again, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 1, Lease: time.Minute, Worker: "w2"})
	if err != nil || len(again) != 1 || again[0].ID != lost.ID {
		t.Fatalf("claim after the lost one: %d rows, %v", len(again), err)
	}
	if again[0].Attempt != lost.Attempt || again[0].Fence <= lost.Fence {
		t.Fatalf("after a lost claim: attempt %d fence %d; the lost one had attempt %d fence %d (want the same attempt, a larger fence)",
			again[0].Attempt, again[0].Fence, lost.Attempt, lost.Fence)
	}
	if owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: lost.ID, Fence: lost.Fence}}, time.Minute); err != nil || len(owned) != 0 {
		t.Fatalf("heartbeat of the lost claim owned %v (%v)", owned, err)
	}
	stale := driver.Outcome{ID: lost.ID, Fence: lost.Fence, Attempt: lost.Attempt, State: driver.StateCompleted}
	if applied, err := d.Complete(ctx, []driver.Outcome{stale}); err != nil || len(applied) != 0 {
		t.Fatalf("completion of the lost claim applied %v (%v)", applied, err)
	}
	cur := driver.Outcome{ID: lost.ID, Fence: again[0].Fence, Attempt: again[0].Attempt, State: driver.StateCompleted}
	if applied, err := d.Complete(ctx, []driver.Outcome{cur}); err != nil || len(applied) != 1 {
		t.Fatalf("completion of the new claim applied %v (%v)", applied, err)
	}
}

// finishJobs inserts n jobs into queue, claims them in one claim and
// finishes them in state; it returns their ids.
func finishJobs(t *testing.T, d *Driver, queue string, n int, state string) []int64 {
	t.Helper()
	ctx := context.Background()
	jobs := make([]driver.InsertParams, n)
	for i := range jobs {
		jobs[i] = pj(queue)
	}
	ids, err := d.Insert(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: queue, Limit: n, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rows) != n {
		t.Fatalf("claimed %d of %d: %v", len(rows), n, err)
	}
	out := make([]driver.Outcome, n)
	for i, r := range rows {
		out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: state}
	}
	if applied, err := d.Complete(ctx, out); err != nil || len(applied) != n {
		t.Fatalf("completed %d of %d: %v", len(applied), n, err)
	}
	return ids
}

// TestSegmentsStatsCounts: once a sealed done or dead segment is past its
// late writes, the leader records its counts and Stats reads them instead
// of scanning it (a row slipped into the segment behind the registry's
// back is not counted, and the plan never executes the segment's scan); a
// by-hand retry of one of its jobs clears them, so Stats counts the
// segment again until the next round records them anew; a status change
// (retention) clears them too. Counting advances the segment's
// incarnation, so a late completion through a view from before the seal
// is refused by its guard and lands in the current segment; counts under
// another incarnation are ignored and recorded again.
func TestSegmentsStatsCounts(t *testing.T) {
	d, s := openSeg(t)
	s.tune.lateWrites, s.tune.grace = 0, 0
	ctx := context.Background()
	done := finishJobs(t, d, "a", 20, driver.StateCompleted)
	finishJobs(t, d, "b", 10, driver.StateDiscarded)
	// A job still running, completed later through a view of the registry
	// from before the seal: a late write.
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("a")}); err != nil {
		t.Fatal(err)
	}
	late, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(late) != 1 {
		t.Fatalf("claim: %v %v", late, err)
	}
	stale, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	current := func(phase string) string {
		t.Helper()
		var tbl string
		if err := d.pool.QueryRow(ctx, "SELECT tbl FROM "+d.prefix+"segments WHERE phase = $1 AND status = 'current'", phase).Scan(&tbl); err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	doneTbl, deadTbl := current(phDone), current(phDead)
	for _, ph := range []string{phDone, phDead} {
		if err := s.rotate(ctx, ph); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.refresh(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	recorded := func(tbl string) bool {
		t.Helper()
		var ok bool
		if err := d.pool.QueryRow(ctx, "SELECT counts IS NOT NULL FROM "+d.prefix+"segments WHERE tbl = $1", tbl).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	counts := func(queue, state string) int64 {
		t.Helper()
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range st {
			if q.Queue == queue {
				return q.Counts[state]
			}
		}
		return 0
	}
	scanned := func(tbl string) bool {
		t.Helper()
		v, err := s.refresh(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		plan := explain(t, d.pool.Query, "(ANALYZE, COSTS OFF, TIMING OFF) "+s.statsQuery(v))
		for _, line := range strings.Split(plan, "\n") {
			if strings.Contains(line, "Scan on "+tbl) {
				return !strings.Contains(line, "never executed")
			}
		}
		t.Fatalf("no scan of %s in the stats plan:\n%s", tbl, plan)
		return false
	}
	if recorded(doneTbl) || recorded(deadTbl) || !scanned(doneTbl) {
		t.Fatal("counts recorded before a maintenance round")
	}
	// One segment per round.
	for range 2 {
		if err := s.round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !recorded(doneTbl) || !recorded(deadTbl) {
		t.Fatalf("counts recorded: done %v, dead %v after two rounds", recorded(doneTbl), recorded(deadTbl))
	}
	if a, b := counts("a", driver.StateCompleted), counts("b", driver.StateDiscarded); a != 20 || b != 10 {
		t.Fatalf("stats from the recorded counts: a completed %d, b discarded %d; want 20, 10", a, b)
	}
	// Counting advanced the segment's incarnation: the late completion,
	// through the view that still takes it for current, fails its guard
	// and lands in the new current segment instead.
	cp := *stale
	cp.at = time.Now()
	s.view.Store(&cp)
	if applied, err := d.Complete(ctx, []driver.Outcome{{ID: late[0].ID, Fence: late[0].Fence, Attempt: late[0].Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 1 {
		t.Fatalf("late completion: %v %v", applied, err)
	}
	if n := rowsIn(t, d, doneTbl); n != 20 {
		t.Fatalf("the counted segment %s holds %d jobs after a late completion, want its 20", doneTbl, n)
	}
	if a := counts("a", driver.StateCompleted); a != 21 {
		t.Fatalf("after the late completion: a completed %d, want 21", a)
	}
	// Two rows slipped in behind the registry's back are not seen: the
	// counts are read, the segment is not scanned.
	if _, err := d.pool.Exec(ctx, "INSERT INTO "+doneTbl+" ("+segCols+") SELECT "+
		strings.Replace(segCols, "id,", "id + 1000000,", 1)+" FROM "+doneTbl+" ORDER BY id LIMIT 2"); err != nil {
		t.Fatal(err)
	}
	if a := counts("a", driver.StateCompleted); a != 21 || scanned(doneTbl) || scanned(deadTbl) {
		t.Fatalf("with counts recorded: a completed %d (want 21), done scanned %v, dead scanned %v", a, scanned(doneTbl), scanned(deadTbl))
	}
	// A retry out of the sealed segment clears its counts.
	if _, err := d.Retry(ctx, done[5]); err != nil {
		t.Fatal(err)
	}
	if recorded(doneTbl) || !recorded(deadTbl) {
		t.Fatalf("after a retry out of %s: counts recorded done %v, dead %v", doneTbl, recorded(doneTbl), recorded(deadTbl))
	}
	if a, av := counts("a", driver.StateCompleted), counts("a", driver.StateAvailable); a != 22 || av != 1 || !scanned(doneTbl) {
		t.Fatalf("after the retry: a completed %d available %d (want 22, 1), scanned %v", a, av, scanned(doneTbl))
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if !recorded(doneTbl) || counts("a", driver.StateCompleted) != 22 || scanned(doneTbl) {
		t.Fatalf("recounted: recorded %v, a completed %d (want 22)", recorded(doneTbl), counts("a", driver.StateCompleted))
	}
	// Counts under another incarnation (a process of an earlier version
	// reclaimed the segment without clearing them) are not used, and the
	// next round records them again.
	if _, err := d.pool.Exec(ctx, "UPDATE "+d.prefix+"segments SET inc = inc + 1 WHERE tbl = $1", doneTbl); err != nil {
		t.Fatal(err)
	}
	if !scanned(doneTbl) || counts("a", driver.StateCompleted) != 22 {
		t.Fatalf("counts of another incarnation: scanned %v, a completed %d (want 22)", scanned(doneTbl), counts("a", driver.StateCompleted))
	}
	if err := s.round(ctx); err != nil {
		t.Fatal(err)
	}
	if scanned(doneTbl) || counts("a", driver.StateCompleted) != 22 {
		t.Fatalf("recounted under the new incarnation: scanned %v, a completed %d (want 22)", scanned(doneTbl), counts("a", driver.StateCompleted))
	}
	// Retention reclaims the sealed segments; a status change clears the
	// counts, and Stats no longer counts their jobs.
	if _, err := d.Prune(ctx, 0, 0, 1000); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, doneTbl); st == "sealed" || recorded(doneTbl) {
		t.Fatalf("after retention: %s is %s, counts recorded %v", doneTbl, st, recorded(doneTbl))
	}
	if _, err := s.refresh(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if a, b := counts("a", driver.StateCompleted), counts("b", driver.StateDiscarded); a != 0 || b != 0 {
		t.Fatalf("after retention: a completed %d, b discarded %d; want 0", a, b)
	}
}

// TestSegmentsStatsCountsRacingRetries: a by-hand retry takes a job out
// of a sealed done segment while the leader records the segment's counts,
// started together, 150 times. After each pair the recorded counts are
// either cleared or exactly the segment's rows, never a count that missed
// the retry; at the end Stats matches the jobs' real states.
func TestSegmentsStatsCountsRacingRetries(t *testing.T) {
	d, s := openSeg(t)
	s.tune.lateWrites, s.tune.grace = 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, retried = 300, 150
	ids := finishJobs(t, d, "r", n, driver.StateCompleted)
	var tbl string
	if err := d.pool.QueryRow(ctx, "SELECT tbl FROM "+d.prefix+"segments WHERE phase = 'done' AND status = 'current'").Scan(&tbl); err != nil {
		t.Fatal(err)
	}
	if err := s.rotate(ctx, phDone); err != nil {
		t.Fatal(err)
	}
	if _, err := s.refresh(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	var stale, cleared, recorded int
	for i, id := range ids[:retried] {
		if _, err := d.pool.Exec(ctx, "UPDATE "+d.prefix+"segments SET counts = NULL WHERE tbl = $1", tbl); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var cerr, rerr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, cerr = s.recordCounts(ctx, tbl)
		}()
		go func() {
			defer wg.Done()
			<-start
			_, rerr = d.Retry(ctx, id)
		}()
		close(start)
		wg.Wait()
		if cerr != nil || rerr != nil {
			t.Fatalf("pair %d: record counts: %v; retry: %v", i, cerr, rerr)
		}
		var sum, actual int64
		if err := d.pool.QueryRow(ctx, "SELECT coalesce((SELECT sum((c->>'n')::bigint) FROM jsonb_array_elements(counts) c), -1) FROM "+
			d.prefix+"segments WHERE tbl = $1", tbl).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&actual); err != nil {
			t.Fatal(err)
		}
		switch {
		case sum == -1:
			cleared++
		case sum == actual:
			recorded++
		default:
			stale++
			t.Errorf("pair %d: %s holds %d jobs, its recorded counts say %d", i, tbl, actual, sum)
		}
	}
	if _, err := s.recordCounts(ctx, tbl); err != nil {
		t.Fatal(err)
	}
	st, err := d.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, q := range st {
		if q.Queue == "r" {
			found = true
			if q.Counts[driver.StateCompleted] != n-retried || q.Counts[driver.StateAvailable] != retried {
				t.Fatalf("stats %v, want %d completed and %d available", q.Counts, n-retried, retried)
			}
		}
	}
	if !found {
		t.Fatalf("stats %+v: no queue r", st)
	}
	t.Logf("%d pairs: counts cleared by the retry after them %d times, recorded after the retry %d times, stale %d", retried, cleared, recorded, stale)
}

// planModesOf acquires every connection of pool at once and returns the
// plan_cache_mode each reports.
func planModesOf(t *testing.T, pool interface {
	Acquire(context.Context) (*pgxpool.Conn, error)
}, n int) []string {
	t.Helper()
	ctx := context.Background()
	var modes []string
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		var m string
		if err := c.QueryRow(ctx, "SELECT current_setting('plan_cache_mode')").Scan(&m); err != nil {
			t.Fatal(err)
		}
		modes = append(modes, m)
	}
	return modes
}

// An application pool (New) whose configuration has the deprecated
// BeforeAcquire hook: the lease pool made from it still runs the hook.
func TestLeasePoolKeepsBeforeAcquire(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	cfg.BeforeAcquire = func(context.Context, *pgx.Conn) bool { calls.Add(1); return true }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(ctx, pool, nil, driver.Options{Prefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	before := calls.Load()
	c, err := d.lease.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	if calls.Load() == before {
		t.Fatal("the lease pool did not run the application's BeforeAcquire hook")
	}
}

// A process whose view of the registry is older than a segment's
// rotation, reclaim and drop (the leader drops free tables beyond the
// ring) runs its next statement on the current segments: the statement
// that named the dropped table fails with undefined_table before anything
// runs, and is run again on a fresh view (under load, a claim, a
// promotion or Stats once failed so).
func TestStaleViewNamingDroppedSegment(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	other := openOther(t, d)
	if _, err := other.Insert(ctx, []driver.InsertParams{pj("q")}); err != nil { // other's view: read now
		t.Fatal(err)
	}
	ov := other.seg.view.Load()
	old := ov.cur[phReady].tbl
	if got := claimN(t, d, "q", 5); len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	regs, err := s.registry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		if r.tbl != old {
			continue
		}
		if ok, _, err := s.reclaim(ctx, r, false, false); err != nil || !ok {
			t.Fatalf("reclaim %s: %v %v", old, ok, err)
		}
	}
	regs, err = s.registry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		if r.tbl == old {
			if ok, err := s.dropSegment(ctx, r); err != nil || !ok {
				t.Fatalf("drop %s: %v %v", old, ok, err)
			}
		}
	}
	if other.seg.view.Load() != ov {
		t.Fatal("the other driver's view changed: the test does not exercise a stale one")
	}
	ids, err := other.Insert(ctx, []driver.InsertParams{pj("q")})
	if err != nil {
		t.Fatalf("insert through a view naming the dropped %s: %v", old, err)
	}
	if _, err := other.Stats(ctx); err != nil {
		t.Fatalf("stats after the drop: %v", err)
	}
	if got := claimN(t, other, "q", 5); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("claimed %v, want [%d]", got, ids[0])
	}
}

// TestReadsSeeSegmentsCreatedSince: a long-lived process (other) whose
// view of the registry predates rotations and a reclaim by another
// process (d, the leader) still sees every job in every read: GetJob,
// ListJobs, ListJobsTx (pgx and database/sql transactions, read
// committed and repeatable read), Stats, Overview and an admin move.
// The view is pinned as fresh, as it is for up to segRefreshEvery after
// it was read, so that the test does not depend on timing.
func TestReadsSeeSegmentsCreatedSince(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	s.tune.grace = 0
	other := openOther(t, d)
	if _, err := other.Stats(ctx); err != nil { // other's view: read now
		t.Fatal(err)
	}
	os := other.seg
	ov := os.view.Load()

	// A job left in the ready segment other knows, which a reclaim then
	// moves into a ready segment other does not know.
	moved, err := d.Insert(ctx, []driver.InsertParams{pj("m")})
	if err != nil {
		t.Fatal(err)
	}
	oldReady := ov.cur[phReady].tbl
	for i := 0; i < 2; i++ {
		if err := s.rotate(ctx, phReady); err != nil {
			t.Fatal(err)
		}
	}
	reclaimSealed(t, s, oldReady)
	if n := rowsIn(t, d, oldReady); n != 0 {
		t.Fatalf("%d rows left in the reclaimed %s", n, oldReady)
	}
	// Completed jobs in a done segment created after other's view.
	if err := s.rotate(ctx, phDone); err != nil {
		t.Fatal(err)
	}
	s.invalidate()
	done := finishJobs(t, d, "q", 3, driver.StateCompleted)
	if err := s.rotate(ctx, phDone); err != nil { // and sealed
		t.Fatal(err)
	}
	s.invalidate()
	waiting, err := d.Insert(ctx, []driver.InsertParams{{Queue: "w", Kind: "k", Args: []byte(`{}`), MaxAttempts: 3, Delay: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}

	// pin puts other's first view back before each read, as fresh.
	pin := func() {
		cp := *ov
		cp.at = time.Now()
		os.view.Store(&cp)
	}
	pin()
	if j, err := other.GetJob(ctx, done[0]); err != nil || j.State != driver.StateCompleted {
		t.Errorf("GetJob of a job in a done segment created since the view: %+v, %v", j, err)
	}
	pin()
	if j, err := other.GetJob(ctx, moved[0]); err != nil || j.State != driver.StateAvailable {
		t.Errorf("GetJob of a job a reclaim moved into a ready segment created since the view: %+v, %v", j, err)
	}
	wantList := func(what string, jobs []*driver.JobRow, err error, want []int64) {
		t.Helper()
		var got []int64
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", what, got, err, want)
		}
	}
	pin()
	jobs, err := other.ListJobs(ctx, driver.JobFilter{States: []string{driver.StateCompleted}})
	wantList("ListJobs completed", jobs, err, done)
	pin()
	jobs, err = other.ListJobs(ctx, driver.JobFilter{Queue: "m"})
	wantList("ListJobs of queue m", jobs, err, moved)

	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		pin()
		tx, err := other.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		jobs, err = other.ListJobsTx(ctx, tx, driver.JobFilter{States: []string{driver.StateCompleted, driver.StateAvailable}})
		_ = tx.Rollback(ctx)
		wantList("ListJobsTx (pgx, "+string(iso)+")", jobs, err, append(slices.Clone(moved), done...))
	}
	pin()
	db, err := sql.Open("pgx", testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err = other.ListJobsTx(ctx, stx, driver.JobFilter{Queue: "q"})
	_ = stx.Rollback()
	wantList("ListJobsTx (database/sql)", jobs, err, done)

	counts := func(stats []driver.QueueStats) map[string]int64 {
		out := map[string]int64{}
		for _, q := range stats {
			for st, n := range q.Counts {
				if n > 0 {
					out[q.Queue+" "+st] = n
				}
			}
		}
		return out
	}
	want := map[string]int64{"m available": 1, "q completed": 3, "w scheduled": 1}
	pin()
	stats, err := other.Stats(ctx)
	if got := counts(stats); err != nil || !maps.Equal(got, want) {
		t.Errorf("Stats: %v, %v; want %v", got, err, want)
	}
	pin()
	stats, err = other.Overview(ctx, time.Now().Add(-time.Hour))
	if got := counts(stats); err != nil || !maps.Equal(got, want) {
		t.Errorf("Overview: %v, %v; want %v", got, err, want)
	}
	pin()
	if j, err := other.Retry(ctx, done[1]); err != nil || j.State != driver.StateAvailable {
		t.Errorf("Retry of a job in a done segment created since the view: %+v, %v", j, err)
	}
	pin()
	if j, err := other.Cancel(ctx, waiting[0]); err != nil || j.State != driver.StateCancelled {
		t.Errorf("Cancel of a waiting job: %+v, %v", j, err)
	}
}

// TestReadInSnapshotOlderThanReclaim: a REPEATABLE READ transaction
// whose snapshot predates a reclaim (TRUNCATE is not MVCC-safe: the
// reclaimed segment looks empty to it, and the moved jobs are not in
// its snapshot) is told so by ListJobsTx instead of getting a list
// without the moved jobs.
func TestReadInSnapshotOlderThanReclaim(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	s.tune.grace = 0
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("q")})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the snapshot
		t.Fatal(err)
	}
	jobs, err := d.ListJobsTx(ctx, tx, driver.JobFilter{})
	if err != nil || len(jobs) != 1 || jobs[0].ID != ids[0] {
		t.Fatalf("before the reclaim: %v, %v", jobs, err)
	}
	if err := tx.Rollback(ctx); err != nil { // its locks held the reclaim off
		t.Fatal(err)
	}
	tx, err = d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	v, err := s.refresh(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	old := v.cur[phReady].tbl
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	reclaimSealed(t, s, old)
	jobs, err = d.ListJobsTx(ctx, tx, driver.JobFilter{})
	if !errors.Is(err, errSnapshotReclaimed) {
		t.Fatalf("after the reclaim: %v, %v; want errSnapshotReclaimed", jobs, err)
	}
	if j, err := d.GetJob(ctx, ids[0]); err != nil || j.State != driver.StateAvailable {
		t.Fatalf("the moved job: %+v, %v", j, err)
	}
}

// reclaimSealed reclaims the sealed segment tbl now (its leftovers move
// into the current segment of its phase), failing the test if it cannot.
func reclaimSealed(t *testing.T, s *segStore, tbl string) {
	t.Helper()
	regs, err := s.registry(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		if r.tbl == tbl {
			if ok, _, err := s.reclaim(context.Background(), r, false, false); err != nil || !ok {
				t.Fatalf("reclaim %s: %v %v", tbl, ok, err)
			}
			return
		}
	}
	t.Fatalf("%s is not in the registry", tbl)
}

// explain returns the plan of query with args (EXPLAIN, nothing runs),
// one line per node, read through query (a pool's, a transaction's).
func explain(t *testing.T, query func(context.Context, string, ...any) (pgx.Rows, error), q string, args ...any) string {
	t.Helper()
	rows, err := query(context.Background(), "EXPLAIN "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
