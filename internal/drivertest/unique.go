package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// unique runs the suite's tests of unique jobs: one live job per key, under
// concurrency and mixed with plain jobs.
func unique(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("UniqueKeys", func(t *testing.T) {
		d := s.setup(t)
		uj := func(key string, keep int) driver.InsertParams {
			j := job("u", 0)
			j.UniqueKey, j.UniqueKeep = []byte(key), keep
			return j
		}
		ids, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uj("k2", 0), uj("k1", 0), uj("kept", driver.KeepCompleted)})
		if err != nil || len(ids) != 3 || dup[0] || dup[1] || dup[2] {
			t.Fatalf("first insert: ids %v dup %v err %v", ids, dup, err)
		}
		again, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uj("k1", 0), uj("new", 0), uj("k2", 0)})
		if err != nil || !dup[0] || dup[1] || !dup[2] || again[0] != ids[1] || again[2] != ids[0] {
			t.Fatalf("second insert: ids %v dup %v err %v; want k1 -> %d and k2 -> %d as duplicates", again, dup, err, ids[1], ids[0])
		}
		// Finishing frees a key, unless the job keeps it in that state.
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "u", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 4 {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		var out []driver.Outcome
		for _, r := range rows {
			out = append(out, driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted})
		}
		if _, err := d.Complete(ctx, out); err != nil {
			t.Fatal(err)
		}
		after, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uj("k1", 0), uj("kept", driver.KeepCompleted)})
		if err != nil || dup[0] || after[0] == ids[1] || !dup[1] || after[1] != ids[2] {
			t.Fatalf("after completion: ids %v dup %v err %v; want k1 new and kept -> %d", after, dup, err, ids[2])
		}
		// A job cancelled by hand frees its key.
		if _, err := d.Cancel(ctx, after[0]); err != nil {
			t.Fatal(err)
		}
		if _, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uj("k1", 0)}); err != nil || dup[0] {
			t.Fatalf("after cancel: dup %v err %v, want a new job", dup, err)
		}
	})

	t.Run("UniqueStates", func(t *testing.T) {
		// Every way a job changes state keeps or frees its key as
		// documented: unfinished states hold it, a finished state holds
		// it only when kept, and retention frees it.
		d := s.setup(t)
		n := 0
		type keyed struct {
			key  []byte
			keep int
			q    string
		}
		newKey := func(keep int) keyed {
			n++
			return keyed{[]byte(fmt.Sprintf("key-%d", n)), keep, fmt.Sprintf("us%d", n)}
		}
		insert := func(k keyed, attempts int) (int64, bool) {
			t.Helper()
			j := job(k.q, 0)
			j.MaxAttempts = attempts
			j.UniqueKey, j.UniqueKeep = k.key, k.keep
			ids, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{j})
			if err != nil {
				t.Fatal(err)
			}
			return ids[0], dup[0]
		}
		held := func(what string, k keyed, holder int64, want bool) {
			t.Helper()
			id, dup := insert(k, 3)
			switch {
			case want && (!dup || id != holder):
				t.Errorf("%s: enqueue of the key: id %d dup %v; want a duplicate of %d", what, id, dup, holder)
			case !want && dup:
				t.Errorf("%s: enqueue of the key: a duplicate of %d; want the key free", what, id)
			}
		}
		claim := func(k keyed, lease time.Duration) *driver.JobRow {
			t.Helper()
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: k.q, Limit: 1, Lease: lease, Worker: "w"})
			if err != nil || len(rows) != 1 {
				t.Fatalf("claim %s: %d rows, %v", k.q, len(rows), err)
			}
			return rows[0]
		}
		for _, c := range []struct {
			state string
			keep  int
			held  bool
		}{
			{driver.StateRetryable, 0, true},
			{driver.StateScheduled, 0, true},
			{driver.StateCompleted, 0, false},
			{driver.StateCompleted, driver.KeepCompleted, true},
			{driver.StateDiscarded, driver.KeepCompleted, false},
			{driver.StateDiscarded, driver.KeepDiscarded, true},
			{driver.StateCancelled, driver.KeepDiscarded, false},
			{driver.StateCancelled, driver.KeepCancelled, true},
		} {
			k := newKey(c.keep)
			id, _ := insert(k, 3)
			completeJob(t, d, claim(k, time.Minute), c.state, time.Hour)
			held(fmt.Sprintf("outcome %s, keep %d", c.state, c.keep), k, id, c.held)
		}
		for _, c := range []struct {
			op   string
			keep int
			held bool
		}{
			{"cancel", 0, false}, {"cancel", driver.KeepCancelled, true}, {"cancel", driver.KeepDiscarded, false},
			{"discard", 0, false}, {"discard", driver.KeepDiscarded, true}, {"discard", driver.KeepCancelled, false},
		} {
			k := newKey(c.keep)
			id, _ := insert(k, 3)
			f := d.Cancel
			if c.op == "discard" {
				f = d.Discard
			}
			if _, err := f(ctx, id); err != nil {
				t.Fatal(err)
			}
			held(fmt.Sprintf("%s, keep %d", c.op, c.keep), k, id, c.held)
		}
		// Released: held. Rescued with attempts left: held; out of
		// attempts (discarded): held only when kept.
		k := newKey(0)
		id, _ := insert(k, 3)
		r := claim(k, time.Minute)
		if _, err := d.Release(ctx, []driver.Lease{{ID: r.ID, Fence: r.Fence}}); err != nil {
			t.Fatal(err)
		}
		held("released", k, id, true)
		var rescued []keyed
		var rescuedIDs []int64
		for _, keep := range []int{0, driver.KeepDiscarded} {
			k := newKey(keep)
			id, _ := insert(k, 1)
			claim(k, 10*time.Millisecond)
			rescued, rescuedIDs = append(rescued, k), append(rescuedIDs, id)
		}
		time.Sleep(50 * time.Millisecond)
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		held("rescued out of attempts", rescued[0], rescuedIDs[0], false)
		held("rescued out of attempts, keep discarded", rescued[1], rescuedIDs[1], true)
		// Retention frees the keys of the finished jobs it removes.
		kc, kd := newKey(driver.KeepCompleted), newKey(driver.KeepDiscarded|driver.KeepCancelled)
		idc, _ := insert(kc, 3)
		completeJob(t, d, claim(kc, time.Minute), driver.StateCompleted, 0)
		idd, _ := insert(kd, 3)
		if _, err := d.Cancel(ctx, idd); err != nil {
			t.Fatal(err)
		}
		held("completed, kept", kc, idc, true)
		held("cancelled, kept", kd, idd, true)
		time.Sleep(50 * time.Millisecond)
		if _, err := d.Prune(ctx, time.Millisecond, time.Millisecond, 1000); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int64{idc, idd} {
			if _, err := d.GetJob(ctx, id); !errors.Is(err, driver.ErrNotFound) {
				t.Fatalf("job %d not pruned: %v", id, err)
			}
		}
		held("completed, kept, pruned", kc, 0, false)
		held("cancelled, kept, pruned", kd, 0, false)
	})

	t.Run("UniqueWithPlainJobs", func(t *testing.T) {
		// InsertUnique inserts jobs without a key as plain jobs, in the
		// same transaction, each id in its place.
		d := s.setup(t)
		uj := func(key string, prio int) driver.InsertParams {
			j := job("m", prio)
			j.UniqueKey = []byte(key)
			return j
		}
		held, _, err := d.InsertUnique(ctx, nil, []driver.InsertParams{uj("held", 0)})
		if err != nil {
			t.Fatal(err)
		}
		in := []driver.InsertParams{job("m", 1), uj("b", 2), job("m", 3), uj("held", 4), uj("a", 5), job("m", 6)}
		ids, dup, err := d.InsertUnique(ctx, nil, in)
		if err != nil || len(ids) != len(in) {
			t.Fatalf("ids %v dup %v err %v", ids, dup, err)
		}
		for i, p := range in {
			if wantDup := string(p.UniqueKey) == "held"; dup[i] != wantDup {
				t.Fatalf("job %d: dup %v, want %v", i, dup[i], wantDup)
			}
			if dup[i] {
				if ids[i] != held[0] {
					t.Fatalf("job %d: id %d, want the holder %d", i, ids[i], held[0])
				}
				continue
			}
			j, err := d.GetJob(ctx, ids[i])
			if err != nil || j.Priority != p.Priority {
				t.Fatalf("job %d (id %d): %+v, %v; want priority %d", i, ids[i], j, err, p.Priority)
			}
		}
	})

	t.Run("UniqueConcurrent", func(t *testing.T) {
		d := s.setup(t)
		const n = 12
		var wg sync.WaitGroup
		ids := make([]int64, n)
		dups := make([]bool, n)
		errs := make([]error, n)
		for g := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Overlapping keys in different orders: no deadlock, one
				// job per key.
				a, b := job("c", 0), job("c", 0)
				a.UniqueKey, b.UniqueKey = []byte("x"), []byte("y")
				if g%2 == 1 {
					a, b = b, a
				}
				got, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{a, b})
				if err == nil && string(a.UniqueKey) == "y" {
					got[0], got[1], dup[0], dup[1] = got[1], got[0], dup[1], dup[0]
				}
				if err == nil {
					ids[g], dups[g] = got[0], dup[0]
				}
				errs[g] = err
			}()
		}
		wg.Wait()
		inserted := 0
		for g := range n {
			if errs[g] != nil {
				t.Fatalf("goroutine %d: %v", g, errs[g])
			}
			if !dups[g] {
				inserted++
			}
			if ids[g] != ids[0] {
				t.Fatalf("goroutine %d was told job %d, goroutine 0 job %d", g, ids[g], ids[0])
			}
		}
		if inserted != 1 {
			t.Fatalf("%d goroutines inserted key x, want 1", inserted)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 100, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 2 {
			t.Fatalf("claimed %d jobs, %v; want one per key", len(rows), err)
		}
	})
}
