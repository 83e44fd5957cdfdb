package drivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keys runs the suite's tests of key limits (QueueLimits.KeyMaxRunning,
// Ordered): a limit per key never exceeded, every way an attempt ends
// freeing its key slot, strict order per key with a failing job holding
// only its own key, keys served in rotation whatever their depth.
func keys(t *testing.T, s suite) {
	ctx := context.Background()
	t.Run("KeyStored", func(t *testing.T) {
		d := s.setup(t)
		ids := insertJobs(t, d, keyedJob("ks", "tenant-1", 0), job("ks", 0))
		tx, rollback := beginTx(t, d)
		txIDs, err := d.InsertTx(ctx, tx, []driver.InsertParams{keyedJob("ks", "tenant-2", 0)})
		if err != nil {
			t.Fatal(err)
		}
		commit(t, tx)
		rollback()
		u := keyedJob("ks", "tenant-3", 0)
		u.UniqueKey = []byte("0123456789abcdef0123456789abcdef")
		uIDs, _, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := d.BulkInsert(ctx, []driver.InsertParams{keyedJob("ks-bulk", "tenant-4", 0)}); err != nil || n != 1 {
			t.Fatalf("bulk insert: %d, %v", n, err)
		}
		for id, want := range map[int64]string{ids[0]: "tenant-1", ids[1]: "", txIDs[0]: "tenant-2", uIDs[0]: "tenant-3"} {
			j, err := d.GetJob(ctx, id)
			if err != nil || j.Key != want {
				t.Fatalf("job %d: key %q (%v), want %q", id, j.Key, err, want)
			}
		}
		list, err := d.ListJobs(ctx, driver.JobFilter{Queue: "ks-bulk"})
		if err != nil || len(list) != 1 || list[0].Key != "tenant-4" {
			t.Fatalf("bulk-inserted job listed as %v, %v", list, err)
		}
		// An unlimited queue claims keyed jobs as any other, and returns
		// their key.
		r := claimLimited(t, d, "ks", 10, time.Minute)
		if len(r.Rows) != 4 || r.Held || countByKey(r.Rows)["tenant-1"] != 1 || countByKey(r.Rows)[""] != 1 {
			t.Fatalf("claimed %d (held %v) keys %v from an unlimited queue, want 4 with their keys", len(r.Rows), r.Held, countByKey(r.Rows))
		}
	})

	t.Run("LimitsStored", func(t *testing.T) {
		d := s.setup(t)
		want := driver.QueueLimits{MaxRunning: 7, KeyMaxRunning: 2}
		setLimits(t, d, "q", want)
		setLimits(t, d, "o", driver.QueueLimits{Ordered: true, OrderedMoveOn: true})
		got, err := d.QueueLimits(ctx)
		if err != nil || got["q"] != want || !got["o"].Ordered || !got["o"].OrderedMoveOn || got["o"].KeyMaxRunning > 1 || got["o"].MaxRunning != 0 {
			t.Fatalf("limits %+v, %v", got, err)
		}
		setLimits(t, d, "q", driver.QueueLimits{})
		setLimits(t, d, "o", driver.QueueLimits{})
		if got, err := d.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("limits after removal: %+v, %v", got, err)
		}
	})

	t.Run("PerKeyLimit", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 5; i++ {
			jobs = append(jobs, keyedJob("pk", "a", 0), keyedJob("pk", "b", 0))
		}
		jobs = append(jobs, job("pk", 0), job("pk", 0), job("pk", 0))
		insertJobs(t, d, jobs...)
		setLimits(t, d, "pk", driver.QueueLimits{KeyMaxRunning: 2})
		r := claimLimited(t, d, "pk", 20, time.Minute)
		if got := countByKey(r.Rows); got["a"] != 2 || got["b"] != 2 || got[""] != 3 || !r.Held {
			t.Fatalf("claimed %v (held %v) with 2 per key, want a:2 b:2 and the 3 without a key, held", got, r.Held)
		}
		if again := claimLimited(t, d, "pk", 20, time.Minute); len(again.Rows) != 0 || !again.Held {
			t.Fatalf("claimed %d (held %v) with every key's slots taken", len(again.Rows), again.Held)
		}
		u, err := d.LimitUsage(ctx)
		if err != nil || u["pk"].KeysRunning != 2 || u["pk"].KeyHeld != 6 || u["pk"].Limits.KeyMaxRunning != 2 {
			t.Fatalf("usage %+v, %v; want 2 keys running, 6 jobs held by their key", u["pk"], err)
		}
		var a *driver.JobRow
		for _, row := range r.Rows {
			if row.Key == "a" {
				a = row
			}
		}
		completeJob(t, d, a, driver.StateCompleted, 0)
		got := claimLimited(t, d, "pk", 20, time.Minute)
		if len(got.Rows) != 1 || got.Rows[0].Key != "a" {
			t.Fatalf("after one of key a completed: claimed %v, want one job of key a", countByKey(got.Rows))
		}
		// Raised: at once; removed: every keyed job may run.
		setLimits(t, d, "pk", driver.QueueLimits{KeyMaxRunning: 3})
		if got := countByKey(claimLimited(t, d, "pk", 20, time.Minute).Rows); got["a"] != 1 || got["b"] != 1 {
			t.Fatalf("after raising to 3: claimed %v, want one more of each key", got)
		}
		setLimits(t, d, "pk", driver.QueueLimits{})
		if got := countByKey(claimLimited(t, d, "pk", 20, time.Minute).Rows); got["a"] != 1 || got["b"] != 2 {
			t.Fatalf("after removing the limit: claimed %v, want the rest (a:1 b:2)", got)
		}
	})

	// A KeyMaxRunning lowered while jobs of a key run in slots at or
	// above the new limit: they still count against it, and no job of
	// the key starts until fewer than the new limit of its jobs run.
	t.Run("LoweredKeyLimitCountsSlotsAbove", func(t *testing.T) {
		for i, l := range []driver.QueueLimits{
			{KeyMaxRunning: 1},
			{Ordered: true, KeyMaxRunning: 1},
			{KeyMaxRunning: 1, KeyRate: 100, KeyRatePeriod: time.Second},
			{KeyMaxRunning: 2},
		} {
			d := s.setup(t)
			q := fmt.Sprintf("low%d", i)
			setLimits(t, d, q, driver.QueueLimits{KeyMaxRunning: 3})
			for range 6 {
				insertJobs(t, d, keyedJob(q, "a", 0))
			}
			rows := claimLimited(t, d, q, 3, time.Minute).Rows
			if len(rows) != 3 {
				t.Fatalf("%+v: claimed %d under a limit of 3, want 3", l, len(rows))
			}
			completeJob(t, d, rows[0], driver.StateCompleted, 0)
			setLimits(t, d, q, l)
			if got := claimLimited(t, d, q, 3, time.Minute).Rows; len(got) != 0 {
				t.Fatalf("%+v: claimed %d jobs of key a while 2 run under a limit of %d", l, len(got), l.KeyMaxRunning)
			}
			completeJob(t, d, rows[1], driver.StateCompleted, 0)
			want := 0
			if l.KeyMaxRunning == 2 {
				want = 1
			}
			if got := claimLimited(t, d, q, 3, time.Minute).Rows; len(got) != want {
				t.Fatalf("%+v: 1 running: claimed %d, want %d", l, len(got), want)
			}
			completeJob(t, d, rows[2], driver.StateCompleted, 0)
			if got := claimLimited(t, d, q, 3, time.Minute).Rows; len(got) != 1 {
				t.Fatalf("%+v: none left running but what this claim's predecessor took: claimed %d, want 1", l, len(got))
			}
		}
	})

	// Switched to Ordered while 2 jobs of a key run: the one that fails
	// keeps its slot (1, above the new limit) for its retry, no later
	// job of the key starts before it runs, and then it runs alone.
	t.Run("OrderedKeptAboveLoweredLimit", func(t *testing.T) {
		d := s.setup(t)
		setLimits(t, d, "oka", driver.QueueLimits{KeyMaxRunning: 2})
		for range 3 {
			insertJobs(t, d, keyedJob("oka", "a", 0))
		}
		rows := claimLimited(t, d, "oka", 2, time.Minute).Rows
		if len(rows) != 2 {
			t.Fatalf("claimed %d, want 2", len(rows))
		}
		setLimits(t, d, "oka", driver.QueueLimits{Ordered: true, KeyMaxRunning: 1})
		completeJob(t, d, rows[0], driver.StateCompleted, 0)
		completeJob(t, d, rows[1], driver.StateRetryable, time.Hour)
		if got := claimLimited(t, d, "oka", 3, time.Minute).Rows; len(got) != 0 {
			t.Fatalf("claimed job %d while job %d waits for its retry holding the key", got[0].ID, rows[1].ID)
		}
		if _, err := d.Retry(ctx, rows[1].ID); err != nil {
			t.Fatal(err)
		}
		got := claimLimited(t, d, "oka", 3, time.Minute).Rows
		if len(got) != 1 || got[0].ID != rows[1].ID {
			t.Fatalf("retry made due: claimed %d jobs (%v), want only job %d", len(got), countByKey(got), rows[1].ID)
		}
		if next := claimLimited(t, d, "oka", 3, time.Minute).Rows; len(next) != 0 {
			t.Fatalf("claimed job %d while job %d of the ordered key runs", next[0].ID, got[0].ID)
		}
		completeJob(t, d, got[0], driver.StateCompleted, 0)
		if next := claimLimited(t, d, "oka", 3, time.Minute).Rows; len(next) != 1 {
			t.Fatalf("after the retried job completed: claimed %d, want the key's last job", len(next))
		}
	})

	// One batch of outcomes in an ordered queue that holds its keys: the
	// retryable and snoozed outcomes keep their keys' slots, the others
	// in the same batch free theirs, a completion with a result (which a
	// driver may write apart) too.
	t.Run("OrderedMixedBatchKeepsOnlyFailedKeys", func(t *testing.T) {
		d := s.setup(t)
		setLimits(t, d, "omb", driver.QueueLimits{Ordered: true, KeyMaxRunning: 1})
		keys := []string{"done", "failed", "snoozed", "discarded", "result"}
		for range 2 {
			for _, k := range keys {
				insertJobs(t, d, keyedJob("omb", k, 0))
			}
		}
		heads := claimLimited(t, d, "omb", 10, time.Minute).Rows
		if len(heads) != len(keys) {
			t.Fatalf("claimed %d, want one job of each of %d keys", len(heads), len(keys))
		}
		state := map[string]string{"done": driver.StateCompleted, "failed": driver.StateRetryable, "snoozed": driver.StateScheduled, "discarded": driver.StateDiscarded, "result": driver.StateCompleted}
		var outs []driver.Outcome
		for _, r := range heads {
			o := driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: state[r.Key], RetryIn: time.Hour}
			if r.Key == "result" {
				o.Result = json.RawMessage(`{"n":1}`)
			}
			outs = append(outs, o)
		}
		if applied, err := d.Complete(ctx, outs); err != nil || len(applied) != len(outs) {
			t.Fatalf("complete: applied %v of %d, %v", applied, len(outs), err)
		}
		next := claimLimited(t, d, "omb", 10, time.Minute).Rows
		got := countByKey(next)
		if len(next) != 3 || got["done"] != 1 || got["discarded"] != 1 || got["result"] != 1 {
			t.Fatalf("after the batch: claimed %v, want the next job of keys done, discarded and result only (failed and snoozed keep their keys)", got)
		}
	})

	t.Run("EveryEndFreesTheKeySlot", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 12; i++ {
			jobs = append(jobs, keyedJob("e", "k", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "e", driver.QueueLimits{KeyMaxRunning: 1})
		r := claimLimited(t, d, "e", 10, time.Minute)
		if len(r.Rows) != 1 || !r.Held {
			t.Fatalf("claimed %d (held %v) of one key limited to 1", len(r.Rows), r.Held)
		}
		if owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: r.Rows[0].ID, Fence: r.Rows[0].Fence}}, time.Minute); err != nil || len(owned) != 1 {
			t.Fatalf("heartbeat: %v, %v", owned, err)
		}
		if again := claimLimited(t, d, "e", 10, time.Minute); len(again.Rows) != 0 {
			t.Fatalf("a heartbeat freed the key's slot: claimed %d", len(again.Rows))
		}
		cur := r.Rows[0]
		ends := []struct {
			name string
			end  func(r *driver.JobRow)
		}{
			{"completed", func(r *driver.JobRow) { completeJob(t, d, r, driver.StateCompleted, 0) }},
			{"retryable", func(r *driver.JobRow) { completeJob(t, d, r, driver.StateRetryable, time.Hour) }},
			{"discarded", func(r *driver.JobRow) { completeJob(t, d, r, driver.StateDiscarded, 0) }},
			{"cancelled outcome", func(r *driver.JobRow) { completeJob(t, d, r, driver.StateCancelled, 0) }},
			{"snoozed", func(r *driver.JobRow) { completeJob(t, d, r, driver.StateScheduled, time.Hour) }},
			{"released", func(r *driver.JobRow) {
				if n, err := d.Release(ctx, []driver.Lease{{ID: r.ID, Fence: r.Fence}}); err != nil || n != 1 {
					t.Fatalf("release: %d, %v", n, err)
				}
			}},
			{"cancelled by hand", func(r *driver.JobRow) {
				if _, err := d.Cancel(ctx, r.ID); err != nil {
					t.Fatal(err)
				}
			}},
			{"discarded by hand", func(r *driver.JobRow) {
				if _, err := d.Discard(ctx, r.ID); err != nil {
					t.Fatal(err)
				}
			}},
		}
		for _, e := range ends {
			e.end(cur)
			got := claimLimited(t, d, "e", 10, time.Minute)
			if len(got.Rows) != 1 {
				t.Fatalf("after an attempt %s: claimed %d, want the 1 key slot it freed", e.name, len(got.Rows))
			}
			cur = got.Rows[0]
		}
		// A stale outcome frees nothing: rescue the attempt after its
		// lease, claim the job again, then complete the rescued attempt.
		completeJob(t, d, cur, driver.StateCompleted, 0)
		got := claimLimited(t, d, "e", 1, 150*time.Millisecond)
		if len(got.Rows) != 1 {
			t.Fatalf("claimed %d", len(got.Rows))
		}
		first := got.Rows[0]
		time.Sleep(300 * time.Millisecond)
		if n, err := d.Rescue(ctx, 100); err != nil || n["e"] != 1 {
			t.Fatalf("rescue: %v, %v", n, err)
		}
		var again *driver.JobRow
		for again == nil || again.ID != first.ID {
			got := claimLimited(t, d, "e", 1, time.Minute)
			if len(got.Rows) != 1 {
				t.Fatalf("claimed %d looking for the rescued job", len(got.Rows))
			}
			again = got.Rows[0]
			if again.ID != first.ID {
				completeJob(t, d, again, driver.StateCompleted, 0)
			}
		}
		if applied, err := d.Complete(ctx, []driver.Outcome{{ID: first.ID, Fence: first.Fence, Attempt: first.Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 0 {
			t.Fatalf("stale outcome: applied %v, %v", applied, err)
		}
		if got := claimLimited(t, d, "e", 10, time.Minute); len(got.Rows) != 0 {
			t.Fatalf("a stale outcome freed the key's slot: claimed %d", len(got.Rows))
		}
	})

	t.Run("BesideQueueLimits", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 5; i++ {
			jobs = append(jobs, keyedJob("bq", "a", 0), keyedJob("bq", "b", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "bq", driver.QueueLimits{MaxRunning: 3, KeyMaxRunning: 2})
		r := claimLimited(t, d, "bq", 10, time.Minute)
		if got := countByKey(r.Rows); len(r.Rows) != 3 || got["a"] > 2 || got["b"] > 2 || !r.Held {
			t.Fatalf("claimed %v (held %v) under MaxRunning 3 and 2 per key", got, r.Held)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["bq"].Running != 3 {
			t.Fatalf("usage %+v, %v", u["bq"], err)
		}
	})

	t.Run("Ordered", func(t *testing.T) {
		d := s.setup(t)
		// Key a: 5 jobs, the later ones of a better priority (priority
		// does not reorder a key). Key b: 3 jobs. Two jobs without a key.
		var jobs []driver.InsertParams
		for i := 0; i < 5; i++ {
			jobs = append(jobs, keyedJob("o", "a", 5-i))
		}
		jobs = append(jobs, keyedJob("o", "b", 0), keyedJob("o", "b", 0), keyedJob("o", "b", 0), job("o", 0), job("o", 0))
		ids := insertJobs(t, d, jobs...)
		setLimits(t, d, "o", driver.QueueLimits{Ordered: true})
		r := claimLimited(t, d, "o", 10, time.Minute)
		heads := map[string]int64{}
		for _, row := range r.Rows {
			heads[row.Key] = row.ID
		}
		if len(r.Rows) != 4 || heads["a"] != ids[0] || heads["b"] != ids[5] || !r.Held {
			t.Fatalf("claimed %v (held %v), want a's and b's first jobs and the 2 without a key", countByKey(r.Rows), r.Held)
		}
		var a1, b1 *driver.JobRow
		for _, row := range r.Rows {
			switch row.Key {
			case "a":
				a1 = row
			case "b":
				b1 = row
			}
		}
		// a's first job fails: key a is held until it succeeds, key b goes on.
		completeJob(t, d, a1, driver.StateRetryable, time.Hour)
		completeJob(t, d, b1, driver.StateCompleted, 0)
		got := claimLimited(t, d, "o", 10, time.Minute)
		if len(got.Rows) != 1 || got.Rows[0].ID != ids[6] || !got.Held {
			t.Fatalf("with a's first job waiting for its retry: claimed %v (held %v), want b's second job only", countByKey(got.Rows), got.Held)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["o"].KeyHeld != 5 {
			t.Fatalf("usage %+v, %v; want 4 of a's and 1 of b's jobs held by their key", u["o"], err)
		}
		completeJob(t, d, got.Rows[0], driver.StateCompleted, 0)
		// The retry made due by hand runs first, then a's second job.
		if _, err := d.Retry(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		order := []int64{}
		for i := 0; i < 20; i++ {
			got := claimLimited(t, d, "o", 10, time.Minute)
			for _, row := range got.Rows {
				if row.Key == "a" {
					order = append(order, row.ID)
				}
				if got := len(got.Rows); got > 2 {
					t.Fatalf("claimed %d at once, want at most one per key", got)
				}
			}
			for _, row := range got.Rows {
				completeJob(t, d, row, driver.StateCompleted, 0)
			}
			if len(got.Rows) == 0 {
				break
			}
		}
		if !slices.Equal(order, ids[:5]) {
			t.Fatalf("key a ran %v, want %v (its enqueue order)", order, ids[:5])
		}
	})

	t.Run("OrderedCancelledWhileWaiting", func(t *testing.T) {
		d := s.setup(t)
		ids := insertJobs(t, d, keyedJob("oc", "a", 0), keyedJob("oc", "a", 0))
		setLimits(t, d, "oc", driver.QueueLimits{Ordered: true})
		r := claimLimited(t, d, "oc", 10, time.Minute)
		if len(r.Rows) != 1 || r.Rows[0].ID != ids[0] {
			t.Fatalf("claimed %d", len(r.Rows))
		}
		completeJob(t, d, r.Rows[0], driver.StateRetryable, time.Hour)
		if _, err := d.Cancel(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		// The sweep (or the cancel itself) gives the kept slot back.
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		if got := claimLimited(t, d, "oc", 10, time.Minute); len(got.Rows) != 1 || got.Rows[0].ID != ids[1] {
			t.Fatalf("after the waiting head was cancelled: claimed %d, want the key's next job", len(got.Rows))
		}
	})

	t.Run("OrderedMoveOn", func(t *testing.T) {
		d := s.setup(t)
		ids := insertJobs(t, d, keyedJob("om", "a", 0), keyedJob("om", "a", 0), keyedJob("om", "a", 0))
		setLimits(t, d, "om", driver.QueueLimits{Ordered: true, OrderedMoveOn: true})
		r := claimLimited(t, d, "om", 10, time.Minute)
		if len(r.Rows) != 1 || r.Rows[0].ID != ids[0] {
			t.Fatalf("claimed %d", len(r.Rows))
		}
		completeJob(t, d, r.Rows[0], driver.StateRetryable, time.Hour)
		got := claimLimited(t, d, "om", 10, time.Minute)
		if len(got.Rows) != 1 || got.Rows[0].ID != ids[1] {
			t.Fatalf("with move-on, after the head failed: claimed %d, want the key's second job", len(got.Rows))
		}
		completeJob(t, d, got.Rows[0], driver.StateCompleted, 0)
		if _, err := d.Retry(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		if got := claimLimited(t, d, "om", 10, time.Minute); len(got.Rows) != 1 || got.Rows[0].ID != ids[0] {
			t.Fatalf("the failed job due again: claimed %v, want it before the key's third job", got.Rows)
		}
	})

	t.Run("Rotation", func(t *testing.T) {
		d := s.setup(t)
		// Key "a" is deep (300 jobs), keys b..k hold one job each; with 1
		// per key, claims of one job at a time serve every key in turn,
		// and one claim of 8 takes 8 keys, whatever a's depth.
		var jobs []driver.InsertParams
		for i := 0; i < 300; i++ {
			jobs = append(jobs, keyedJob("rot", "a", 0))
		}
		for k := 'b'; k <= 'k'; k++ {
			jobs = append(jobs, keyedJob("rot", string(k), 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "rot", driver.QueueLimits{KeyMaxRunning: 1})
		r := claimLimited(t, d, "rot", 8, time.Minute)
		if len(countByKey(r.Rows)) != 8 || len(r.Rows) != 8 {
			t.Fatalf("one claim of 8 took %v, want 8 keys", countByKey(r.Rows))
		}
		for _, row := range r.Rows {
			completeJob(t, d, row, driver.StateCompleted, 0)
		}
		seen := map[string]int{}
		for i := 0; i < 11; i++ {
			got := claimLimited(t, d, "rot", 1, time.Minute)
			if len(got.Rows) != 1 {
				t.Fatalf("claim %d took %d", i, len(got.Rows))
			}
			seen[got.Rows[0].Key]++
			completeJob(t, d, got.Rows[0], driver.StateCompleted, 0)
		}
		// 3 keys of b..k are left, and a: 11 claims of one serve each
		// of them before any takes a twice in a row more than 11/4 times.
		if seen["a"] > 8 || len(seen) < 4 {
			t.Fatalf("11 claims of one served %v: the deep key was not served in rotation", seen)
		}
	})

	// The rotation goes on from the key the previous claim stopped at,
	// not from the last key its walk looked at: a claim of 5 whose first
	// key has room for all 5 takes them there, and the next claim starts
	// at the key after it. A walk that looked at 5 keys and left the
	// cursor at the fifth skipped the other four, and with 10 deep keys
	// served two of them, turn about, while the other eight waited; so
	// with the queue's own limits leaving a claim room for fewer jobs
	// than it looked for.
	t.Run("RotationFromWhereTheClaimStopped", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 20; i++ {
			for k := 0; k < 10; k++ {
				jobs = append(jobs, keyedJob("rs", fmt.Sprintf("k%02d", k), 0))
			}
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "rs", driver.QueueLimits{KeyMaxRunning: 100})
		var served []string
		for i := 0; i < 4; i++ {
			r := claimLimited(t, d, "rs", 5, time.Minute)
			by := countByKey(r.Rows)
			if len(r.Rows) != 5 || len(by) != 1 {
				t.Fatalf("claim %d of 5 took %v, want 5 of one key (room for 100 each)", i+1, by)
			}
			for k := range by {
				served = append(served, k)
			}
			for _, row := range r.Rows {
				completeJob(t, d, row, driver.StateCompleted, 0)
			}
		}
		if want := []string{"k00", "k01", "k02", "k03"}; !slices.Equal(served, want) {
			t.Fatalf("4 claims of 5 served keys %v in turn, want %v", served, want)
		}
		// The queue's concurrency limit leaves each claim room for one.
		setLimits(t, d, "rs", driver.QueueLimits{KeyMaxRunning: 100, MaxRunning: 1})
		served = served[:0]
		for i := 0; i < 4; i++ {
			r := claimLimited(t, d, "rs", 5, time.Minute)
			if len(r.Rows) != 1 {
				t.Fatalf("claim %d took %d at a MaxRunning of 1, want 1", i+1, len(r.Rows))
			}
			served = append(served, r.Rows[0].Key)
			completeJob(t, d, r.Rows[0], driver.StateCompleted, 0)
		}
		if want := []string{"k04", "k05", "k06", "k07"}; !slices.Equal(served, want) {
			t.Fatalf("4 claims of one served keys %v in turn, want %v", served, want)
		}
	})

	// A claim whose walk found no key with room within its budget of
	// keys still moves the rotation past them: the next claim looks at
	// the keys beyond. Left where it was, every claim looked at the same
	// busy keys, and a key with room beyond them was never served for as
	// long as those kept their slots.
	t.Run("RotationPastBusyKeys", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for k := 0; k < 150; k++ {
			key := fmt.Sprintf("k%03d", k)
			jobs = append(jobs, keyedJob("rb", key, 0), keyedJob("rb", key, 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "rb", driver.QueueLimits{KeyMaxRunning: 1})
		// Every key's slot held, each key with a job left waiting.
		var held int
		for i := 0; i < 10 && held < 150; i++ {
			held += len(claimLimited(t, d, "rb", 150-held, time.Minute).Rows)
		}
		if held != 150 {
			t.Fatalf("claimed %d, want one job of each of the 150 keys", held)
		}
		// A key with room, far from the cursor in key order.
		insertJobs(t, d, keyedJob("rb", "k1000", 0))
		for i := 0; i < 10; i++ {
			r := claimLimited(t, d, "rb", 1, time.Minute)
			if len(r.Rows) == 1 {
				if r.Rows[0].Key != "k1000" {
					t.Fatalf("claimed a job of key %s, whose slot is held", r.Rows[0].Key)
				}
				return
			}
		}
		t.Fatal("10 claims of one never reached the one key with room beyond 150 busy keys")
	})

	t.Run("ConcurrentClaimers", func(t *testing.T) {
		d := s.setup(t)
		const nKeys, perKey = 8, 15
		var jobs []driver.InsertParams
		for i := 0; i < perKey; i++ {
			for k := 0; k < nKeys; k++ {
				jobs = append(jobs, keyedJob("cc", fmt.Sprintf("key-%d", k), i%3))
			}
		}
		ids := insertJobs(t, d, jobs...)
		want := map[int64]string{}
		for i, id := range ids {
			want[id] = jobs[i].Key
		}
		setLimits(t, d, "cc", driver.QueueLimits{Ordered: true})
		var mu sync.Mutex
		running := map[string]int64{} // key -> job running, by the records
		ran := map[string][]int64{}
		done := map[int64]int{}
		var wg sync.WaitGroup
		var firstErr error
		fail := func(err error) { // under mu
			if firstErr == nil {
				firstErr = err
			}
		}
		deadline := time.Now().Add(60 * time.Second)
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "cc", Limit: 3, Lease: time.Minute, Worker: "w"})
					mu.Lock()
					if err != nil {
						fail(err)
					}
					finished := len(done) == len(ids) || firstErr != nil
					for _, row := range r.Rows {
						if other, busy := running[row.Key]; busy {
							fail(fmt.Errorf("job %d of key %s claimed while job %d of the key runs", row.ID, row.Key, other))
						}
						running[row.Key] = row.ID
						ran[row.Key] = append(ran[row.Key], row.ID)
					}
					mu.Unlock()
					if finished {
						return
					}
					for _, row := range r.Rows {
						mu.Lock()
						delete(running, row.Key)
						done[row.ID]++
						mu.Unlock()
						o := driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
						if applied, err := d.Complete(ctx, []driver.Outcome{o}); err != nil || len(applied) != 1 {
							mu.Lock()
							fail(fmt.Errorf("complete %d: %v, %v", row.ID, applied, err))
							mu.Unlock()
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		if len(done) != len(ids) {
			t.Fatalf("completed %d of %d jobs before the deadline", len(done), len(ids))
		}
		for id, n := range done {
			if n != 1 {
				t.Fatalf("job %d ran %d times", id, n)
			}
		}
		for k := 0; k < nKeys; k++ {
			key := fmt.Sprintf("key-%d", k)
			if !slices.IsSorted(ran[key]) || len(ran[key]) != perKey {
				t.Fatalf("key %s ran %v, want its %d jobs in id order", key, ran[key], perKey)
			}
		}
	})

	// A claim of a key-limited queue that finds no job without a key may
	// skip them for a while (up to a second); a job without a key the
	// driver then inserts, by any of its insert calls, is claimed by the
	// next claim.
	t.Run("KeylessInsertEndsSkip", func(t *testing.T) {
		d := s.setup(t)
		uk := func(p driver.InsertParams, k string) driver.InsertParams {
			p.UniqueKey = []byte(fmt.Sprintf("%-32s", k))
			return p
		}
		inTx := func(t *testing.T, f func(tx any) error) {
			tx, rollback := beginTx(t, d)
			defer rollback()
			if err := f(tx); err != nil {
				t.Fatal(err)
			}
			commit(t, tx)
		}
		for _, c := range []struct {
			name   string
			insert func(t *testing.T, j driver.InsertParams)
		}{
			{"Insert", func(t *testing.T, j driver.InsertParams) { insertJobs(t, d, j) }},
			{"InsertTx", func(t *testing.T, j driver.InsertParams) {
				inTx(t, func(tx any) error { _, err := d.InsertTx(ctx, tx, []driver.InsertParams{j}); return err })
			}},
			{"InsertUnique", func(t *testing.T, j driver.InsertParams) {
				if _, _, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uk(j, "u1")}); err != nil {
					t.Fatal(err)
				}
			}},
			{"InsertUniquePlain", func(t *testing.T, j driver.InsertParams) {
				if _, _, err := d.InsertUnique(ctx, nil, []driver.InsertParams{j, uk(keyedJob(j.Queue, "b", 0), "u2")}); err != nil {
					t.Fatal(err)
				}
			}},
			{"InsertUniqueTx", func(t *testing.T, j driver.InsertParams) {
				inTx(t, func(tx any) error {
					_, _, err := d.InsertUnique(ctx, tx, []driver.InsertParams{uk(j, "u3")})
					return err
				})
			}},
			{"BulkInsert", func(t *testing.T, j driver.InsertParams) {
				if _, err := d.BulkInsert(ctx, []driver.InsertParams{j}); err != nil {
					t.Fatal(err)
				}
			}},
			{"InsertBatches", func(t *testing.T, j driver.InsertParams) {
				if _, _, err := d.InsertBatches(ctx, nil, []driver.InsertParams{j}, []driver.BatchParams{{Callback: job("cb", 0), Jobs: []int{0}}}); err != nil {
					t.Fatal(err)
				}
			}},
			{"InsertBatchesTx", func(t *testing.T, j driver.InsertParams) {
				inTx(t, func(tx any) error {
					_, _, err := d.InsertBatches(ctx, tx, []driver.InsertParams{j}, []driver.BatchParams{{Callback: job("cb", 0), Jobs: []int{0}}})
					return err
				})
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := "kl-" + c.name
				setLimits(t, d, q, driver.QueueLimits{KeyMaxRunning: 1})
				insertJobs(t, d, keyedJob(q, "a", 0))
				// Takes the job of key a and finds none without a key.
				if r := claimLimited(t, d, q, 5, time.Minute); len(r.Rows) != 1 || r.Rows[0].Key != "a" {
					t.Fatalf("claimed %v, want the job of key a", countByKey(r.Rows))
				}
				c.insert(t, job(q, 0))
				r := claimLimited(t, d, q, 5, time.Minute)
				if got := countByKey(r.Rows); got[""] != 1 {
					t.Fatalf("claimed %v at once after the insert of a job without a key, want it", got)
				}
			})
		}
	})
}

// commit commits a transaction begun by beginTx.
func commit(t *testing.T, tx any) {
	t.Helper()
	c, ok := tx.(interface{ Commit() error })
	if !ok {
		if c2, ok := tx.(interface {
			Commit(context.Context) error
		}); ok {
			if err := c2.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("transaction %T cannot commit", tx)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
}
