package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
)

// batches runs the suite's tests of what a job's read tells of its batch.
func batches(t *testing.T, s suite) {
	ctx := context.Background()

	// GetJob reports the batch a job is a member of (BatchID) and, once
	// the batch fired, the batch its callback closes (CallbackOf); a job
	// of no batch reports 0 for both. A callback is a member of the batch
	// that waits for its batch (GetBatch lists it among its members).
	t.Run("JobBatch", func(t *testing.T) {
		d := s.setup(t)
		plain := insertJobs(t, d, job("m", 0))[0]
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("m", 0), job("m", 0), job("other", 0)}, []driver.BatchParams{
			{Callback: job("cb", 0), Jobs: []int{0, 1}},
			{Callback: job("later", 0), Jobs: []int{2}, After: []int{0}},
		})
		if err != nil || len(ids) != 3 || len(bids) != 2 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		check := func(id, batch, callbackOf int64) {
			t.Helper()
			j, err := d.GetJob(ctx, id)
			if err != nil {
				t.Fatalf("get job %d: %v", id, err)
			}
			if j.BatchID != batch || j.CallbackOf != callbackOf {
				t.Errorf("job %d: batch %d, callback of %d; want %d, %d", id, j.BatchID, j.CallbackOf, batch, callbackOf)
			}
		}
		check(plain, 0, 0)
		check(ids[0], bids[0], 0)
		check(ids[1], bids[0], 0)
		check(ids[2], bids[1], 0)
		// The later batch names the batch it waits for until that one
		// fires; its callback is then a member.
		waiting := func(members int, want ...int64) {
			t.Helper()
			b, err := d.GetBatch(ctx, bids[1])
			if err != nil || len(b.Members) != members || !slices.Equal(b.Waiting, want) {
				t.Fatalf("later batch: %+v %v; want %d members, waiting for %v", b, err, members, want)
			}
		}
		waiting(1, bids[0])

		// The first batch's members finish and its callback is enqueued.
		claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "m", Limit: 3, Lease: time.Minute, Worker: "w"})
		if err != nil || len(claimed) != 3 {
			t.Fatalf("claim: %d %v", len(claimed), err)
		}
		var outs []driver.Outcome
		for _, c := range claimed {
			outs = append(outs, driver.Outcome{ID: c.ID, Fence: c.Fence, Attempt: 1, State: driver.StateCompleted})
		}
		if _, err := d.Complete(ctx, outs); err != nil {
			t.Fatal(err)
		}
		fired, err := d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		cb := fired[bids[0]]
		check(cb, bids[1], bids[0])
		waiting(2)
		// Finished members keep their batch, the waiting batch's member
		// its own.
		check(ids[0], bids[0], 0)
		check(ids[1], bids[0], 0)
		check(ids[2], bids[1], 0)
		check(plain, 0, 0)
	})
	// A member retried by hand after FireBatches read its batch as
	// finished, and before the batch's firing began, keeps the batch from
	// firing: the firing reads the batch again in its own transaction.
	// The batch fires once the member finished again. The batch whose
	// callback another batch waits for counts as its member: a retry of
	// that callback keeps the later batch from firing too.
	t.Run("FireRechecksMembers", func(t *testing.T) {
		d := s.setup(t)
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("ra", 0), job("ra", 0)}, []driver.BatchParams{
			{Callback: job("rb", 0), Jobs: []int{0, 1}},
			{Callback: job("rc", 0), After: []int{0}},
		})
		if err != nil || len(ids) != 2 || len(bids) != 2 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "ra")
		runOne(t, d, "ra")
		retryBefore := func(batch, job int64) context.Context {
			return driver.WithBeforeFire(ctx, func(id int64) {
				if id != batch {
					return
				}
				if _, err := d.Retry(ctx, job); err != nil {
					t.Errorf("retry %d before the firing of batch %d: %v", job, batch, err)
				}
			})
		}
		fired, err := d.FireBatches(retryBefore(bids[0], ids[1]), 10, nil)
		if err != nil || len(fired) != 0 {
			t.Fatalf("fired %v, %v; want none: job %d was retried before the firing", fired, err, ids[1])
		}
		if b, err := d.GetBatch(ctx, bids[0]); err != nil || b.CallbackID != 0 {
			t.Fatalf("batch %d with job %d available: %+v %v; want no callback", bids[0], ids[1], b, err)
		}
		if got := runOne(t, d, "ra"); got != ids[1] {
			t.Fatalf("completed job %d, want the retried %d", got, ids[1])
		}
		fired, err = d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		step := fired[bids[0]]
		if got := runOne(t, d, "rb"); got != step {
			t.Fatalf("completed job %d, want the callback %d", got, step)
		}
		// The later batch's own member is the earlier batch's callback.
		fired, err = d.FireBatches(retryBefore(bids[1], step), 10, nil)
		if err != nil || len(fired) != 0 {
			t.Fatalf("fired %v, %v; want none: callback %d, which batch %d waits for, was retried before the firing", fired, err, step, bids[1])
		}
		if got := runOne(t, d, "rb"); got != step {
			t.Fatalf("completed job %d, want the retried callback %d", got, step)
		}
		fired, err = d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[1]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[1])
		}
	})
	// A member retried by hand while the batch's firing, which read it
	// finished, is open waits for the firing's commit (the firing's lock
	// on the member's row): it is then a retry after the batch fired,
	// which leaves the batch fired. The retry runs beside the firing
	// until the database shows it waiting for a lock; a retry that
	// returns first came between the firing's read and its commit. Not
	// on SQLite, whose write transaction (the firing's) is exclusive.
	t.Run("FireHoldsRetryBack", func(t *testing.T) {
		d, prefix := s.setupPrefix(t)
		waiting := lockWaiter(t, d, prefix)
		if waiting == nil {
			t.Skipf("%T: no lock waits to look at", d)
		}
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("ha", 0)}, []driver.BatchParams{
			{Callback: job("hb", 0), Jobs: []int{0}},
		})
		if err != nil || len(ids) != 1 || len(bids) != 1 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "ha")
		done := make(chan error, 1)
		started := false
		hold := driver.WithInFire(ctx, func(id int64) {
			if id != bids[0] || started {
				return
			}
			started = true
			go func() {
				_, err := d.Retry(ctx, ids[0])
				done <- err
			}()
			bound := time.Now().Add(time.Minute)
			for !waiting() {
				select {
				case err := <-done:
					done <- err
					t.Errorf("retry of job %d returned (%v) while the firing of batch %d, which read it finished, was open", ids[0], err, bids[0])
					return
				default:
					if time.Now().After(bound) {
						// A failure bound, not a timing check: the retry
						// neither returned nor showed as waiting for a lock.
						t.Errorf("retry of job %d neither returned nor waited for a lock in a minute", ids[0])
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
		fired, err := d.FireBatches(hold, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		if err := <-done; err != nil {
			t.Fatalf("retry of job %d: %v", ids[0], err)
		}
		if j, err := d.GetJob(ctx, ids[0]); err != nil || j.State != driver.StateAvailable {
			t.Fatalf("job %d after its retry: %+v %v; want available", ids[0], j, err)
		}
		if b, err := d.GetBatch(ctx, bids[0]); err != nil || b.CallbackID != fired[bids[0]] {
			t.Fatalf("batch %d: %+v %v; want fired with callback %d", bids[0], b, err, fired[bids[0]])
		}
	})
	// A batch whose callback cannot be enqueued (here its stored
	// metadata is no JSON object, so every try fails the same way) keeps
	// neither the batches after it in the same call nor, however many
	// such batches there are, the batches past limit from firing: the
	// call fires the others and returns a *BatchFireError naming each
	// failed batch.
	t.Run("FireContinuesPastFailure", func(t *testing.T) {
		d := s.setup(t)
		bad := job("fcb", 0)
		bad.Meta = []byte(`"not an object"`)
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("fa", 0)}, []driver.BatchParams{
			{Callback: bad, Jobs: []int{0}},
			{Callback: bad, Jobs: []int{0}},
			{Callback: job("fcg", 0), Jobs: []int{0}},
			{Callback: bad, Jobs: []int{0}},
		})
		if err != nil || len(ids) != 1 || len(bids) != 4 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "fa")
		// Two of the four per call: the first two fail.
		for round := range 2 {
			fired, err := d.FireBatches(ctx, 2, nil)
			want := 1
			if round > 0 {
				want = 0
			}
			if len(fired) != want || (want == 1 && fired[bids[2]] == 0) {
				t.Fatalf("round %d: fired %v (%v); want batch %d alone the first time, none after", round, fired, err, bids[2])
			}
			var fe *driver.BatchFireError
			if !errors.As(err, &fe) {
				t.Fatalf("round %d: fired %v, error %v; want a *BatchFireError", round, fired, err)
			}
			var failed []int64
			for _, f := range fe.Failed {
				failed = append(failed, f.BatchID)
			}
			if len(failed) != 3 || failed[0] != bids[0] || failed[1] != bids[1] || failed[2] != bids[3] {
				t.Errorf("round %d: failed batches %v (%v); want %d, %d, %d", round, failed, err, bids[0], bids[1], bids[3])
			}
		}
		if got := runOne(t, d, "fcg"); got == 0 {
			t.Fatal("no callback of the good batch")
		}
	})
	// A batch the caller skips (the leader's backoff of a batch whose
	// callback failed) is neither fired nor counted against limit, so
	// the batches after it fire in the same call; once no longer skipped
	// it fires, and every callback is enqueued exactly once.
	t.Run("FireSkips", func(t *testing.T) {
		d := s.setup(t)
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("sa", 0)}, []driver.BatchParams{
			{Callback: job("scb", 0), Jobs: []int{0}},
			{Callback: job("scb", 0), Jobs: []int{0}},
			{Callback: job("scb", 0), Jobs: []int{0}},
		})
		if err != nil || len(ids) != 1 || len(bids) != 3 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "sa")
		asked := map[int64]int{}
		skip := func(id int64) bool {
			asked[id]++
			return id != bids[2]
		}
		fired, err := d.FireBatches(ctx, 1, skip)
		if err != nil || len(fired) != 1 || fired[bids[2]] == 0 {
			t.Fatalf("fire skipping %d and %d with limit 1: %v %v; want %d fired", bids[0], bids[1], fired, err, bids[2])
		}
		if asked[bids[0]] != 1 || asked[bids[1]] != 1 {
			t.Fatalf("skip asked %v; want once for each of %d and %d", asked, bids[0], bids[1])
		}
		for _, id := range bids[:2] {
			if b, err := d.GetBatch(ctx, id); err != nil || b.CallbackID != 0 {
				t.Fatalf("skipped batch %d: %+v %v; want no callback", id, b, err)
			}
		}
		fired, err = d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 2 || fired[bids[0]] == 0 || fired[bids[1]] == 0 {
			t.Fatalf("fire without skipping: %v %v; want %d and %d", fired, err, bids[0], bids[1])
		}
		if fired, err = d.FireBatches(ctx, 10, nil); err != nil || len(fired) != 0 {
			t.Fatalf("fire again: %v %v; want none", fired, err)
		}
		for range 3 {
			runOne(t, d, "scb")
		}
		if rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "scb", Limit: 10, Lease: time.Minute, Worker: "w"}); err != nil || len(rows) != 0 {
			t.Fatalf("callbacks beyond one per batch: %d %v", len(rows), err)
		}
	})
	// A fired batch that a still open batch waits for (a workflow's step
	// whose own step has not finished) is kept by Prune however long ago
	// it fired: without it the open batch would no longer see the step it
	// waits for, and would fire before that step finished. Once the
	// batches waiting for it are pruned, it is pruned in turn.
	t.Run("PruneKeepsAwaitedBatch", func(t *testing.T) {
		d := s.setup(t)
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("wa", 0)}, []driver.BatchParams{
			{Callback: job("wb", 0), Jobs: []int{0}},
			{Callback: job("wc", 0), After: []int{0}},
		})
		if err != nil || len(ids) != 1 || len(bids) != 2 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "wa")
		fired, err := d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		step := fired[bids[0]]
		// The step (the first batch's callback) waits, available, longer
		// than the retention of completed jobs and fired batches.
		time.Sleep(20 * time.Millisecond)
		if _, err := d.Prune(ctx, time.Millisecond, time.Hour, 100); err != nil {
			t.Fatal(err)
		}
		if b, err := d.GetBatch(ctx, bids[0]); err != nil || b.CallbackID != step {
			t.Fatalf("batch %d, awaited by open batch %d, after prune: %+v %v", bids[0], bids[1], b, err)
		}
		fired, err = d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 0 {
			t.Fatalf("fired %v, %v while job %d, which batch %d waits for, is available", fired, err, step, bids[1])
		}
		if got := runOne(t, d, "wb"); got != step {
			t.Fatalf("completed job %d, want the step %d", got, step)
		}
		fired, err = d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[1]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[1])
		}
		b, err := d.GetBatch(ctx, bids[1])
		if err != nil || len(b.Members) != 1 || b.Members[0].ID != step || b.Members[0].State != driver.StateCompleted {
			t.Fatalf("batch %d: %+v %v; want its one dependency %d, completed", bids[1], b, err, step)
		}
		// Once its callback finished, the waiting batch is pruned, then
		// the batch it waited for.
		if got := runOne(t, d, "wc"); got != fired[bids[1]] {
			t.Fatalf("completed job %d, want the callback %d", got, fired[bids[1]])
		}
		time.Sleep(20 * time.Millisecond)
		for range 2 {
			if _, err := d.Prune(ctx, time.Millisecond, time.Hour, 100); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range bids {
			if _, err := d.GetBatch(ctx, id); !errors.Is(err, driver.ErrBatchNotFound) {
				t.Errorf("batch %d after the prunes: %v, want ErrBatchNotFound", id, err)
			}
		}
	})
	// A fired batch whose callback has not finished (it runs later,
	// retries, or waits in a paused queue) is kept by Prune however long
	// ago it fired: the callback reads it (a workflow's step, to know
	// whether a dependency failed). Once the callback finished, the batch
	// is pruned.
	t.Run("PruneKeepsBatchOfUnfinishedCallback", func(t *testing.T) {
		d := s.setup(t)
		ids, bids, err := d.InsertBatches(ctx, nil, []driver.InsertParams{job("pa", 0)}, []driver.BatchParams{
			{Callback: job("pb", 0), Jobs: []int{0}},
		})
		if err != nil || len(ids) != 1 || len(bids) != 1 {
			t.Fatalf("insert batches: %v %v %v", ids, bids, err)
		}
		runOne(t, d, "pa")
		fired, err := d.FireBatches(ctx, 10, nil)
		if err != nil || len(fired) != 1 || fired[bids[0]] == 0 {
			t.Fatalf("fired %v, %v; want batch %d alone", fired, err, bids[0])
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := d.Prune(ctx, time.Millisecond, time.Hour, 100); err != nil {
			t.Fatal(err)
		}
		if b, err := d.GetBatch(ctx, bids[0]); err != nil || b.CallbackID != fired[bids[0]] {
			t.Fatalf("batch %d, whose callback %d is available, after prune: %+v %v", bids[0], fired[bids[0]], b, err)
		}
		if got := runOne(t, d, "pb"); got != fired[bids[0]] {
			t.Fatalf("completed job %d, want the callback %d", got, fired[bids[0]])
		}
		if _, err := d.Prune(ctx, time.Millisecond, time.Hour, 100); err != nil {
			t.Fatal(err)
		}
		if _, err := d.GetBatch(ctx, bids[0]); !errors.Is(err, driver.ErrBatchNotFound) {
			t.Errorf("batch %d after its callback completed and the prune: %v, want ErrBatchNotFound", bids[0], err)
		}
	})
}

// runOne claims the one job of queue and completes it, and returns its
// id; t fails unless exactly one job was claimed and its outcome applied.
func runOne(t *testing.T, d driver.Driver, queue string) int64 {
	t.Helper()
	rows, err := d.Claim(context.Background(), driver.ClaimParams{Queue: queue, Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %s: %d %v", queue, len(rows), err)
	}
	completeJob(t, d, rows[0], driver.StateCompleted, 0)
	return rows[0].ID
}

// lockWaiter returns a function that reports whether a statement naming
// prefix's tables waits for a row lock on d's database, or nil on a
// backend whose lock waits it cannot see (SQLite's writers wait in the
// process, for its one write transaction).
func lockWaiter(t *testing.T, d driver.Driver, prefix string) func() bool {
	ctx := context.Background()
	switch h := d.(type) {
	case interface{ Pool() *pgxpool.Pool }:
		return func() bool {
			var n int
			if err := h.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				 WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND position($1 in query) > 0`, prefix).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
	case interface{ DB() *sql.DB }:
		if !strings.HasPrefix(fmt.Sprintf("%T", d), "*mysql.") {
			return nil
		}
		// InnoDB's own report of its transactions: information_schema's
		// innodb_trx was seen on MariaDB 10.11 to leave out a
		// transaction waiting in a prepared statement.
		return func() bool {
			var typ, name, status string
			if err := h.DB().QueryRowContext(ctx, `SHOW ENGINE INNODB STATUS`).Scan(&typ, &name, &status); err != nil {
				t.Fatal(err)
			}
			for _, trx := range strings.Split(status, "---TRANSACTION ")[1:] {
				if strings.Contains(trx, "LOCK WAIT") && strings.Contains(trx, prefix) {
					return true
				}
			}
			return false
		}
	}
	return nil
}
