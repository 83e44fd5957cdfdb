// Package drivertest is the shared suite every backend runs against a real
// database: the driver contract of internal/driver, checked statement by
// statement. The client-level conformance suite (package conveyor) runs on
// top of it.
package drivertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Opener opens a driver on a fresh prefix; the suite migrates it and drops
// it at the end.
type Opener func(t *testing.T, prefix string) driver.Driver

func setup(t *testing.T, open Opener, prefix string) driver.Driver {
	t.Helper()
	d := open(t, prefix)
	ctx := context.Background()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := d.DropAll(context.Background()); err != nil {
			t.Errorf("drop: %v", err)
		}
		d.Close()
	})
	return d
}

// beginTx begins a transaction of the type the driver's InsertTx takes on
// the driver's own handle (the accessors of the backends), and returns
// it with its rollback.
func beginTx(t *testing.T, d driver.Driver) (tx any, rollback func()) {
	t.Helper()
	ctx := context.Background()
	switch h := d.(type) {
	case interface{ Pool() *pgxpool.Pool }:
		ptx, err := h.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ptx, func() { ptx.Rollback(ctx) }
	case interface{ DB() *sql.DB }:
		stx, err := h.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return stx, func() { stx.Rollback() }
	}
	t.Fatalf("driver %T has no handle to begin a transaction on", d)
	return nil, nil
}

func job(queue string, prio int) driver.InsertParams {
	return driver.InsertParams{Queue: queue, Kind: "k", Args: json.RawMessage(`{"a":1}`), Priority: prio, MaxAttempts: 3}
}

// Run runs the suite. prefixFor returns a fresh prefix for each sub-test.
func Run(t *testing.T, prefixFor func() string, open Opener) {
	ctx := context.Background()

	t.Run("MigrateIdempotent", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		applied, err := d.Migrate(ctx)
		if err != nil || len(applied) != 0 {
			t.Fatalf("second migrate applied %v, err %v; want nothing", applied, err)
		}
		cur, latest, err := d.SchemaVersion(ctx)
		if err != nil || cur != latest || cur < 1 {
			t.Fatalf("schema version %d/%d err %v", cur, latest, err)
		}
	})

	t.Run("InsertClaimComplete", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, err := d.Insert(ctx, []driver.InsertParams{job("q", 0), job("q", 0), job("q", 0)})
		if err != nil || len(ids) != 3 || !(ids[0] < ids[1] && ids[1] < ids[2]) {
			t.Fatalf("insert: ids %v err %v; want 3 ascending ids", ids, err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(rows) != 3 {
			t.Fatalf("claim: %d rows err %v; want 3", len(rows), err)
		}
		for _, r := range rows {
			if r.State != driver.StateRunning || r.Attempt != 1 || r.AttemptedBy != "w1" || r.LeaseExpiresAt.IsZero() || string(r.Args) == "" {
				t.Fatalf("claimed row not running/attempt 1/leased: %+v", r)
			}
			var v map[string]int
			if err := json.Unmarshal(r.Args, &v); err != nil || v["a"] != 1 {
				t.Fatalf("args round trip: %s", r.Args)
			}
		}
		more, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(more) != 0 {
			t.Fatalf("second claim got %d rows, want 0 (err %v)", len(more), err)
		}
		fence := Fences(rows)
		out := []driver.Outcome{
			{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateCompleted},
			{ID: ids[1], Fence: fence[ids[1]], Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: "boom", Trace: "stack"}},
			{ID: ids[2], Fence: fence[ids[2]] + 1, Attempt: 2, State: driver.StateCompleted}, // stale fence
		}
		applied, err := d.Complete(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(applied, func(i, j int) bool { return applied[i] < applied[j] })
		if len(applied) != 2 || applied[0] != ids[0] || applied[1] != ids[1] {
			t.Fatalf("applied %v, want %v", applied, ids[:2])
		}
		j0, _ := d.GetJob(ctx, ids[0])
		j1, _ := d.GetJob(ctx, ids[1])
		j2, _ := d.GetJob(ctx, ids[2])
		if j0.State != driver.StateCompleted || j0.FinalizedAt.IsZero() || !j0.LeaseExpiresAt.IsZero() {
			t.Fatalf("completed job: %+v", j0)
		}
		if j1.State != driver.StateRetryable || len(j1.Errors) != 1 || j1.Errors[0].Error != "boom" || j1.Errors[0].Trace != "stack" || j1.Errors[0].Attempt != 1 {
			t.Fatalf("retryable job: %+v", j1)
		}
		if time.Until(j1.ScheduledAt) < 50*time.Minute {
			t.Fatalf("retry scheduled at %v, want about an hour from now", j1.ScheduledAt)
		}
		if j2.State != driver.StateRunning {
			t.Fatalf("stale outcome was applied: %+v", j2)
		}
		// Applying the same outcome twice changes nothing the second time.
		again, err := d.Complete(ctx, out[:1])
		if err != nil || len(again) != 0 {
			t.Fatalf("repeated completion applied %v err %v", again, err)
		}
	})

	// Metadata (the meta column) goes in through every insert path and
	// comes back from every statement that returns jobs; a job without
	// any has none.
	t.Run("Metadata", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		metaOf := func(r *driver.JobRow) map[string]string {
			t.Helper()
			if r.Meta == nil {
				return nil
			}
			var m map[string]string
			if err := json.Unmarshal(r.Meta, &m); err != nil {
				t.Fatalf("job %d: meta %q does not decode: %v", r.ID, r.Meta, err)
			}
			return m
		}
		withMeta := func(queue, v string) driver.InsertParams {
			j := job(queue, 0)
			j.Meta = json.RawMessage(`{"traceparent":"` + v + `","q\"uote":"\\ é"}`)
			return j
		}
		check := func(what string, r *driver.JobRow, v string) {
			t.Helper()
			m := metaOf(r)
			if v == "" {
				if r.Meta != nil {
					t.Fatalf("%s: job %d has meta %s, want none", what, r.ID, r.Meta)
				}
				return
			}
			if len(m) != 2 || m["traceparent"] != v || m[`q"uote`] != `\ é` {
				t.Fatalf("%s: job %d meta %v (%s), want traceparent %q and the quoted key", what, r.ID, m, r.Meta, v)
			}
		}
		// Insert: a batch mixing jobs with and without metadata, and one
		// without any.
		ids, err := d.Insert(ctx, []driver.InsertParams{withMeta("m", "a"), job("m", 0), withMeta("m", "c")})
		if err != nil {
			t.Fatal(err)
		}
		plain, err := d.Insert(ctx, []driver.InsertParams{job("m", 0)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[int64]string{ids[0]: "a", ids[1]: "", ids[2]: "c", plain[0]: ""}
		for id, v := range want {
			j, err := d.GetJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			check("get", j, v)
		}
		list, err := d.ListJobs(ctx, driver.JobFilter{Queue: "m"})
		if err != nil || len(list) != 4 {
			t.Fatalf("list: %d jobs, %v", len(list), err)
		}
		for _, j := range list {
			check("list", j, want[j.ID])
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "m", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 4 {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		for _, r := range rows {
			check("claim", r, want[r.ID])
		}
		c, err := d.Cancel(ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		check("cancel", c, "a")
		r, err := d.Retry(ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		check("retry", r, "a")
		cj, err := d.ClaimJob(ctx, ids[0], time.Minute, "w")
		if err != nil {
			t.Fatal(err)
		}
		check("claim job", cj, "a")

		// In the caller's transaction.
		tx, rollback := beginTx(t, d)
		txIDs, err := d.InsertTx(ctx, tx, []driver.InsertParams{job("tx", 0), withMeta("tx", "t")})
		if err != nil {
			rollback()
			t.Fatal(err)
		}
		inTx, err := d.ListJobsTx(ctx, tx, driver.JobFilter{Queue: "tx"})
		if err != nil || len(inTx) != 2 {
			rollback()
			t.Fatalf("list in tx: %d jobs, %v", len(inTx), err)
		}
		check("list in tx", inTx[0], "")
		check("list in tx", inTx[1], "t")
		rollback()
		_ = txIDs

		// Unique jobs: the inserted one keeps its metadata; a duplicate's
		// is not stored (the holder's stays).
		u := withMeta("u", "u1")
		u.UniqueKey = []byte("meta-key")
		u2 := job("u", 0)
		u2.UniqueKey = []byte("meta-key2")
		uids, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u, u2})
		if err != nil || dup[0] || dup[1] {
			t.Fatalf("insert unique: %v %v", dup, err)
		}
		again := withMeta("u", "u2")
		again.UniqueKey = []byte("meta-key")
		if got, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{again}); err != nil || !dup[0] || got[0] != uids[0] {
			t.Fatalf("duplicate: %v %v %v", got, dup, err)
		}
		urows, err := d.Claim(ctx, driver.ClaimParams{Queue: "u", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || len(urows) != 2 {
			t.Fatalf("claim unique: %d, %v", len(urows), err)
		}
		for _, r := range urows {
			if r.ID == uids[0] {
				check("claim unique", r, "u1")
			} else {
				check("claim unique", r, "")
			}
		}

		// Bulk insert (COPY on PostgreSQL).
		bulk := make([]driver.InsertParams, 50)
		for i := range bulk {
			if i%2 == 0 {
				bulk[i] = withMeta("bulk", fmt.Sprint(i))
			} else {
				bulk[i] = job("bulk", 0)
			}
		}
		if n, err := d.BulkInsert(ctx, bulk); err != nil || n != 50 {
			t.Fatalf("bulk insert: %d, %v", n, err)
		}
		brows, err := d.Claim(ctx, driver.ClaimParams{Queue: "bulk", Limit: 100, Lease: time.Minute, Worker: "w"})
		if err != nil || len(brows) != 50 {
			t.Fatalf("claim bulk: %d, %v", len(brows), err)
		}
		sort.Slice(brows, func(i, j int) bool { return brows[i].ID < brows[j].ID })
		for i, r := range brows {
			if i%2 == 0 {
				check("claim bulk", r, fmt.Sprint(i))
			} else {
				check("claim bulk", r, "")
			}
		}
	})

	t.Run("PriorityOrderAndQueues", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		in := []driver.InsertParams{job("a", 5), job("a", 1), job("b", 0), job("a", 3), job("a", 1)}
		ids, err := d.Insert(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for {
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 {
				break
			}
			if rows[0].Queue != "a" {
				t.Fatalf("claimed from queue %q", rows[0].Queue)
			}
			got = append(got, rows[0].ID)
		}
		want := []int64{ids[1], ids[4], ids[3], ids[0]}
		if len(got) != len(want) {
			t.Fatalf("claimed %v want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("claim order %v, want %v (priority, then id)", got, want)
			}
		}
	})

	t.Run("UniqueKeys", func(t *testing.T) {
		d := setup(t, open, prefixFor())
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

	t.Run("UniqueWithPlainJobs", func(t *testing.T) {
		// InsertUnique inserts jobs without a key as plain jobs, in the
		// same transaction, each id in its place.
		d := setup(t, open, prefixFor())
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
		d := setup(t, open, prefixFor())
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

	t.Run("SnoozeGivesTheAttemptBackNotTheFence", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, err := d.Insert(ctx, []driver.InsertParams{job("s", 0)})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 1, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		first := rows[0]
		applied, err := d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: first.Fence, Attempt: 1, State: driver.StateScheduled, RetryIn: time.Hour}})
		if err != nil || len(applied) != 1 {
			t.Fatalf("snooze: applied %v, %v", applied, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateScheduled || j.Attempt != 0 || len(j.Errors) != 0 || !j.FinalizedAt.IsZero() || time.Until(j.ScheduledAt) < 50*time.Minute {
			t.Fatalf("snoozed job: %+v; want scheduled an hour ahead, attempt given back, no error", j)
		}
		// Due now: promoted and claimed again, under a new fence.
		if _, err := d.Retry(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		rows, err = d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 1, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 1 || rows[0].Attempt != 1 || rows[0].Fence <= first.Fence {
			t.Fatalf("claim after snooze: %+v, %v", rows, err)
		}
		// The snoozed attempt's late acknowledgement is refused.
		applied, err = d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: first.Fence, Attempt: 1, State: driver.StateCompleted}})
		if err != nil || len(applied) != 0 {
			t.Fatalf("late ack of the snoozed attempt: applied %v, %v", applied, err)
		}
	})

	t.Run("Schedules", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		t0 := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
		rec := func(slot time.Time, job int64) {
			t.Helper()
			err := d.RecordSchedule(ctx, driver.ScheduleRow{Name: "s", Spec: "every 1m0s", LastSlot: slot, LastJob: job, NextSlot: slot.Add(time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
		}
		check := func(slot time.Time, job int64) {
			t.Helper()
			ss, err := d.Schedules(ctx)
			if err != nil || len(ss) != 1 {
				t.Fatalf("schedules %+v, %v", ss, err)
			}
			s := ss[0]
			if s.Name != "s" || s.Spec != "every 1m0s" || !s.LastSlot.Equal(slot) || s.LastJob != job || !s.NextSlot.Equal(slot.Add(time.Minute)) || s.UpdatedAt.IsZero() {
				t.Fatalf("schedule %+v, want last slot %v job %d", s, slot, job)
			}
		}
		rec(t0, 7)
		check(t0, 7)
		rec(t0.Add(time.Minute), 8)
		check(t0.Add(time.Minute), 8)
		// An older slot recorded late does not move the schedule back.
		rec(t0, 7)
		check(t0.Add(time.Minute), 8)
	})

	t.Run("Processes", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		list := func() map[string]driver.ProcessRow {
			t.Helper()
			ps, err := d.Processes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]driver.ProcessRow{}
			seenGone := false
			for _, p := range ps {
				if p.Alive && seenGone {
					t.Fatalf("alive process %q listed after a gone one: %+v", p.ID, ps)
				}
				seenGone = seenGone || !p.Alive
				out[p.ID] = p
			}
			return out
		}
		reg := func(p driver.ProcessRow, ttl time.Duration) {
			t.Helper()
			if err := d.RegisterProcess(ctx, p, ttl); err != nil {
				t.Fatal(err)
			}
		}
		if ps := list(); len(ps) != 0 {
			t.Fatalf("fresh table lists %+v", ps)
		}
		a := driver.ProcessRow{ID: "host-a/41/ab", Kind: driver.ProcessClient, Host: "host-a", PID: 41, Version: "v1.2.3", Queues: map[string]int{"q1": 5, "q2": 1}}
		b := driver.ProcessRow{ID: "http:mailer-1", Kind: driver.ProcessHTTP, Host: "127.0.0.1:5000"}
		reg(a, time.Minute)
		reg(b, time.Minute)
		ps := list()
		ga, gb := ps[a.ID], ps[b.ID]
		if len(ps) != 2 || !ga.Alive || ga.Kind != a.Kind || ga.Host != a.Host || ga.PID != 41 || ga.Version != a.Version ||
			len(ga.Queues) != 2 || ga.Queues["q1"] != 5 || ga.Queues["q2"] != 1 {
			t.Fatalf("process a listed as %+v", ga)
		}
		if ga.StartedAt.IsZero() || ga.HeartbeatAt.Before(ga.StartedAt) || !ga.ExpiresAt.After(ga.HeartbeatAt) || ga.ExpiresAt.Sub(ga.HeartbeatAt) > time.Minute+time.Millisecond {
			t.Fatalf("process a times: started %v heartbeat %v expires %v (ttl 1m)", ga.StartedAt, ga.HeartbeatAt, ga.ExpiresAt)
		}
		if !gb.Alive || gb.Kind != driver.ProcessHTTP || gb.PID != 0 || gb.Version != "" || gb.Queues == nil || len(gb.Queues) != 0 {
			t.Fatalf("process b listed as %+v", gb)
		}
		// A refresh moves the heartbeat and replaces the queues, keeping
		// the start.
		time.Sleep(20 * time.Millisecond)
		a.Queues = map[string]int{"q3": 7}
		reg(a, time.Minute)
		ga2 := list()[a.ID]
		if !ga2.StartedAt.Equal(ga.StartedAt) || !ga2.HeartbeatAt.After(ga.HeartbeatAt) || len(ga2.Queues) != 1 || ga2.Queues["q3"] != 7 {
			t.Fatalf("refreshed a: %+v, before %+v", ga2, ga)
		}
		// A process whose ttl passed is listed as gone, after the alive
		// ones; registering again starts it anew.
		c := driver.ProcessRow{ID: "host-c/7/cd", Kind: driver.ProcessClient, Host: "host-c", PID: 7, Queues: map[string]int{"q1": 1}}
		reg(c, 100*time.Millisecond)
		first := list()[c.ID]
		if !first.Alive {
			t.Fatalf("process c not alive just after registering with a 100ms ttl: %+v", first)
		}
		deadline := time.Now().Add(10 * time.Second)
		for list()[c.ID].Alive {
			if time.Now().After(deadline) {
				t.Fatal("process c still alive 10s after its 100ms ttl")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if ps := list(); !ps[a.ID].Alive || !ps[b.ID].Alive {
			t.Fatalf("a or b gone with c: %+v", ps)
		}
		reg(c, time.Minute)
		again := list()[c.ID]
		if !again.Alive || !again.StartedAt.After(first.HeartbeatAt) {
			t.Fatalf("c registered again after expiring: %+v, first %+v; want alive and started anew", again, first)
		}
		// Pruning removes only rows expired longer ago than the age.
		reg(c, time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		if n, err := d.PruneProcesses(ctx, time.Hour); err != nil || n != 0 {
			t.Fatalf("prune with 1h age deleted %d (%v), want 0", n, err)
		}
		if n, err := d.PruneProcesses(ctx, 0); err != nil || n != 1 {
			t.Fatalf("prune with age 0 deleted %d (%v), want 1 (c)", n, err)
		}
		if ps := list(); len(ps) != 2 || !ps[a.ID].Alive || !ps[b.ID].Alive {
			t.Fatalf("after prune: %+v", ps)
		}
		// A graceful stop removes the row; removing twice is no error.
		for range 2 {
			if err := d.RemoveProcess(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
		}
		if ps := list(); len(ps) != 1 || ps[b.ID].ID != b.ID {
			t.Fatalf("after removing a: %+v", ps)
		}
	})

	t.Run("PausedQueueNotClaimed", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		if _, err := d.Insert(ctx, []driver.InsertParams{job("p", 0), job("p", 0), job("other", 0)}); err != nil {
			t.Fatal(err)
		}
		claim := func(q string) int {
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: q, Limit: 1, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			return len(rows)
		}
		if err := d.PauseQueue(ctx, "p", true); err != nil {
			t.Fatal(err)
		}
		paused, err := d.PausedQueues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, ok := paused["p"]
		if len(paused) != 1 || !ok || first.IsZero() {
			t.Fatalf("paused queues %v, want p alone with its time", paused)
		}
		if n := claim("p"); n != 0 {
			t.Fatalf("claimed %d jobs of a paused queue", n)
		}
		if n := claim("other"); n != 1 {
			t.Fatalf("claimed %d jobs of another queue, want 1", n)
		}
		// Pausing again keeps the first pause's time.
		if err := d.PauseQueue(ctx, "p", true); err != nil {
			t.Fatal(err)
		}
		if again, _ := d.PausedQueues(ctx); !again["p"].Equal(first) {
			t.Fatalf("paused again: since %v, want the first pause's %v", again["p"], first)
		}
		if err := d.PauseQueue(ctx, "p", false); err != nil {
			t.Fatal(err)
		}
		if paused, err := d.PausedQueues(ctx); err != nil || len(paused) != 0 {
			t.Fatalf("after resume: paused %v, %v", paused, err)
		}
		if n := claim("p"); n != 1 {
			t.Fatalf("claimed %d jobs of a resumed queue, want 1", n)
		}
		// Resuming a queue that was never paused is not an error.
		if err := d.PauseQueue(ctx, "never", false); err != nil {
			t.Fatal(err)
		}
	})

	// A claim already running when a pause commits must not take a job
	// inserted after the pause: on InnoDB a locking read sees rows newer
	// than the statement's snapshot, so a pause check read from that
	// snapshot could miss a pause that the job's insert came after.
	// Claimers spin on the queue while each round pauses it, inserts one
	// job, resumes it and waits for the job. A claim that returned the
	// job before the resume began took it while the queue was paused.
	t.Run("PauseBeatsClaimInFlight", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		const rounds, claimers = 60, 4
		var (
			phase   sync.Mutex // held by a claimer while it reads paused
			paused  bool
			claimed = make(chan int64, rounds)
			bad     = make(chan string, rounds)
			stop    = make(chan struct{})
			wg      sync.WaitGroup
		)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Minute, Worker: "w"})
					if err != nil {
						bad <- fmt.Sprintf("claim: %v", err)
						return
					}
					if len(rows) == 0 {
						continue
					}
					phase.Lock()
					if paused {
						bad <- fmt.Sprintf("job %d claimed while its queue was paused", rows[0].ID)
					}
					phase.Unlock()
					claimed <- rows[0].ID
				}
			}()
		}
		defer func() { close(stop); wg.Wait() }()
		for round := range rounds {
			if err := d.PauseQueue(ctx, "r", true); err != nil {
				t.Fatal(err)
			}
			phase.Lock()
			paused = true
			phase.Unlock()
			ids, err := d.Insert(ctx, []driver.InsertParams{job("r", 0)})
			if err != nil {
				t.Fatal(err)
			}
			// Let the claimers run a few claims against the paused queue.
			time.Sleep(2 * time.Millisecond)
			phase.Lock()
			paused = false
			phase.Unlock()
			if err := d.PauseQueue(ctx, "r", false); err != nil {
				t.Fatal(err)
			}
			select {
			case id := <-claimed:
				if id != ids[0] {
					t.Fatalf("round %d: claimed job %d, want %d", round, id, ids[0])
				}
			case msg := <-bad:
				t.Fatalf("round %d: %s", round, msg)
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: job %d not claimed within 30s of the resume", round, ids[0])
			}
		}
		select {
		case msg := <-bad:
			t.Fatal(msg)
		default:
		}
	})

	t.Run("ScheduledNotClaimedUntilPromoted", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		p := job("s", 0)
		p.Delay = 300 * time.Millisecond
		ids, err := d.Insert(ctx, []driver.InsertParams{p})
		if err != nil {
			t.Fatal(err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateScheduled {
			t.Fatalf("delayed job state %q, want scheduled", j.State)
		}
		if n, _ := d.Promote(ctx, 100); n["s"] != 0 {
			t.Fatalf("promoted a job before its time")
		}
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 5, Lease: time.Minute, Worker: "w"})
		if len(rows) != 0 {
			t.Fatalf("claimed a scheduled job early")
		}
		time.Sleep(400 * time.Millisecond)
		n, err := d.Promote(ctx, 100)
		if err != nil || n["s"] != 1 {
			t.Fatalf("promote: %v err %v", n, err)
		}
		rows, _ = d.Claim(ctx, driver.ClaimParams{Queue: "s", Limit: 5, Lease: time.Minute, Worker: "w"})
		if len(rows) != 1 || time.Since(rows[0].ScheduledAt) < 0 {
			t.Fatalf("claim after promote: %d rows", len(rows))
		}
	})

	t.Run("LeaseHeartbeatRescue", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		p := job("l", 0)
		p.MaxAttempts = 2
		ids, _ := d.Insert(ctx, []driver.InsertParams{p, job("l", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "l", Limit: 2, Lease: 200 * time.Millisecond, Worker: "w1"})
		if len(rows) != 2 {
			t.Fatalf("claimed %d", len(rows))
		}
		// Keep the second alive, let the first expire.
		fence := Fences(rows)
		owned, err := d.Heartbeat(ctx, []driver.Lease{{ID: ids[1], Fence: fence[ids[1]]}, {ID: ids[0], Fence: fence[ids[0]] + 6}}, time.Minute)
		if err != nil || len(owned) != 1 || owned[0] != ids[1] {
			t.Fatalf("heartbeat owned %v err %v; want only %d (other fenced)", owned, err, ids[1])
		}
		time.Sleep(350 * time.Millisecond)
		n, err := d.Rescue(ctx, 100)
		if err != nil || n["l"] != 1 {
			t.Fatalf("rescue %v err %v; want 1", n, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateAvailable || len(j.Errors) != 1 || j.Errors[0].Attempt != 1 {
			t.Fatalf("rescued job: %+v", j)
		}
		// The stale attempt's acknowledgement is refused.
		applied, _ := d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateCompleted}})
		if len(applied) != 0 {
			t.Fatalf("stale completion applied after rescue")
		}
		// Second attempt expires too: attempts exhausted, discarded.
		rows, _ = d.Claim(ctx, driver.ClaimParams{Queue: "l", Limit: 1, Lease: 100 * time.Millisecond, Worker: "w2"})
		if len(rows) != 1 || rows[0].Attempt != 2 {
			t.Fatalf("reclaim: %+v", rows)
		}
		time.Sleep(250 * time.Millisecond)
		if n, _ := d.Rescue(ctx, 100); n["l"] != 1 {
			t.Fatalf("second rescue %v", n)
		}
		j, _ = d.GetJob(ctx, ids[0])
		if j.State != driver.StateDiscarded || j.FinalizedAt.IsZero() || len(j.Errors) != 2 {
			t.Fatalf("exhausted job not discarded: %+v", j)
		}
		j, _ = d.GetJob(ctx, ids[1])
		if j.State != driver.StateRunning {
			t.Fatalf("heartbeated job was rescued: %+v", j)
		}
	})

	t.Run("Release", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("r", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Minute, Worker: "w"})
		if len(rows) != 1 {
			t.Fatalf("claimed %d", len(rows))
		}
		n, err := d.Release(ctx, []driver.Lease{{ID: ids[0], Fence: rows[0].Fence}})
		if err != nil || n != 1 {
			t.Fatalf("release %d err %v", n, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateAvailable || j.Attempt != 0 {
			t.Fatalf("released job: %+v", j)
		}
	})

	// The fence is the database's alone: after a graceful release gives
	// the attempt back, the next claim carries the same attempt number but
	// a larger fence, and every acknowledgement of the released attempt is
	// refused by the database itself, with no process's bookkeeping
	// involved (this test has none).
	t.Run("FenceOutlivesRelease", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("f", 0)})
		first, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w1"})
		if err != nil || len(first) != 1 {
			t.Fatalf("claim: %d rows, err %v", len(first), err)
		}
		old := driver.Lease{ID: ids[0], Fence: first[0].Fence}
		if n, err := d.Release(ctx, []driver.Lease{old}); err != nil || n != 1 {
			t.Fatalf("release %d err %v", n, err)
		}
		second, err := d.Claim(ctx, driver.ClaimParams{Queue: "f", Limit: 1, Lease: time.Minute, Worker: "w2"})
		if err != nil || len(second) != 1 {
			t.Fatalf("second claim: %d rows, err %v", len(second), err)
		}
		if second[0].Attempt != first[0].Attempt {
			t.Fatalf("attempt after release: %d, want the released attempt's %d given back", second[0].Attempt, first[0].Attempt)
		}
		if second[0].Fence <= first[0].Fence {
			t.Fatalf("fence after release: %d, want more than %d", second[0].Fence, first[0].Fence)
		}
		if owned, err := d.Heartbeat(ctx, []driver.Lease{old}, time.Minute); err != nil || len(owned) != 0 {
			t.Fatalf("heartbeat of the released attempt owned %v err %v", owned, err)
		}
		if n, err := d.Release(ctx, []driver.Lease{old}); err != nil || n != 0 {
			t.Fatalf("release of the released attempt: %d err %v", n, err)
		}
		stale := driver.Outcome{ID: ids[0], Fence: first[0].Fence, Attempt: first[0].Attempt, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{stale}); err != nil || len(applied) != 0 {
			t.Fatalf("stale acknowledgement after release applied %v err %v", applied, err)
		}
		j, _ := d.GetJob(ctx, ids[0])
		if j.State != driver.StateRunning || j.AttemptedBy != "w2" {
			t.Fatalf("job after the stale acknowledgement: %+v", j)
		}
		cur := driver.Outcome{ID: ids[0], Fence: second[0].Fence, Attempt: second[0].Attempt, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{cur}); err != nil || len(applied) != 1 {
			t.Fatalf("current acknowledgement applied %v err %v", applied, err)
		}
		if j, _ := d.GetJob(ctx, ids[0]); j.State != driver.StateCompleted {
			t.Fatalf("job after its acknowledgement: %s", j.State)
		}
	})

	// ClaimJob takes one job by id whatever its queue or schedule, as a
	// claim would (attempt, fence, lease, attempted_by), and only a job
	// that is neither running nor finished.
	t.Run("ClaimJob", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		later := job("a", 5)
		later.Delay = time.Hour
		ids, err := d.Insert(ctx, []driver.InsertParams{job("a", 0), later, job("b", 0)})
		if err != nil {
			t.Fatal(err)
		}
		j, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1")
		if err != nil {
			t.Fatalf("claim of the scheduled job: %v", err)
		}
		if j.ID != ids[1] || j.State != driver.StateRunning || j.Attempt != 1 || j.Fence < 1 || j.AttemptedBy != "w1" ||
			j.Queue != "a" || j.Kind != "k" || j.Priority != 5 || j.MaxAttempts != 3 || string(j.Args) == "" {
			t.Fatalf("claimed row: %+v", j)
		}
		if l := j.LeaseExpiresAt.Sub(j.AttemptedAt); l < 59*time.Second || l > 61*time.Second {
			t.Fatalf("lease %v from the attempt, want the minute asked (%+v)", l, j)
		}
		stored, _ := d.GetJob(ctx, ids[1])
		if stored.State != driver.StateRunning || stored.Fence != j.Fence || stored.Attempt != 1 || !stored.LeaseExpiresAt.Equal(j.LeaseExpiresAt) {
			t.Fatalf("stored row %+v differs from the claimed one %+v", stored, j)
		}
		if _, err := d.ClaimJob(ctx, ids[1], time.Minute, "w2"); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("claim of a running job: %v, want ErrWrongState", err)
		}
		if _, err := d.ClaimJob(ctx, 1<<40, time.Minute, "w2"); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("claim of a missing job: %v, want ErrNotFound", err)
		}
		// The queue's claims do not hand it out again; the other job of
		// the queue is still theirs.
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 10, Lease: time.Minute, Worker: "w3"})
		if err != nil || len(rows) != 1 || rows[0].ID != ids[0] {
			t.Fatalf("claim of queue a after ClaimJob: %d rows %v, want only job %d", len(rows), err, ids[0])
		}
		// Its outcome is fenced like a claimed attempt's.
		fail := driver.Outcome{ID: ids[1], Fence: j.Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: "boom"}}
		if applied, err := d.Complete(ctx, []driver.Outcome{fail}); err != nil || len(applied) != 1 {
			t.Fatalf("outcome of the ClaimJob attempt: applied %v err %v", applied, err)
		}
		// A retryable job is claimed again before its retry is due.
		j2, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1")
		if err != nil || j2.Attempt != 2 || j2.Fence <= j.Fence || len(j2.Errors) != 1 {
			t.Fatalf("claim of the retryable job: %+v %v", j2, err)
		}
		done := driver.Outcome{ID: ids[1], Fence: j2.Fence, Attempt: 2, State: driver.StateCompleted}
		if applied, err := d.Complete(ctx, []driver.Outcome{done}); err != nil || len(applied) != 1 {
			t.Fatalf("completion: applied %v err %v", applied, err)
		}
		if _, err := d.ClaimJob(ctx, ids[1], time.Minute, "w1"); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("claim of a completed job: %v, want ErrWrongState", err)
		}
		// A released ClaimJob attempt gives the attempt back, not the fence.
		j3, err := d.ClaimJob(ctx, ids[2], time.Minute, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if n, err := d.Release(ctx, []driver.Lease{{ID: ids[2], Fence: j3.Fence}}); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		j4, err := d.ClaimJob(ctx, ids[2], time.Minute, "w1")
		if err != nil || j4.Attempt != j3.Attempt || j4.Fence <= j3.Fence {
			t.Fatalf("claim after release: attempt %d fence %d (err %v), want attempt %d and a fence above %d", j4.Attempt, j4.Fence, err, j3.Attempt, j3.Fence)
		}
	})

	// A ClaimJob racing a queue's Claim for the same job: exactly one of
	// them gets it.
	t.Run("ClaimJobRacesClaim", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		const n = 20
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = job("race", 0)
		}
		ids, err := d.Insert(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		got := map[int64]int{}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "race", Limit: 1, Lease: time.Minute, Worker: "claim"})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if len(rows) == 0 {
					return
				}
				mu.Lock()
				got[rows[0].ID]++
				mu.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			for i := n - 1; i >= 0; i-- {
				_, err := d.ClaimJob(ctx, ids[i], time.Minute, "claim-job")
				switch {
				case err == nil:
					mu.Lock()
					got[ids[i]]++
					mu.Unlock()
				case !errors.Is(err, driver.ErrWrongState):
					t.Errorf("claim job %d: %v", ids[i], err)
				}
			}
		}()
		wg.Wait()
		for _, id := range ids {
			if got[id] != 1 {
				t.Fatalf("job %d handed out %d times, want once (all: %v)", id, got[id], got)
			}
		}
	})

	t.Run("ListNewestFirst", func(t *testing.T) { listNewestFirst(t, setup(t, open, prefixFor())) })

	// ListJobsTx reads inside the application's transaction: it sees the
	// jobs that transaction inserted before it commits, which nothing
	// outside sees.
	t.Run("ListJobsTx", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		if _, err := d.ListJobsTx(ctx, "not a transaction", driver.JobFilter{}); !errors.Is(err, driver.ErrTxType) {
			t.Fatalf("list in a string: %v, want ErrTxType", err)
		}
		before, err := d.Insert(ctx, []driver.InsertParams{job("t", 0)})
		if err != nil {
			t.Fatal(err)
		}
		tx, rollback := beginTx(t, d)
		a, b := job("t", 0), job("u", 1)
		b.Kind = "other"
		b.Delay = time.Hour
		ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{a, b})
		if err != nil {
			t.Fatal(err)
		}
		all, err := d.ListJobsTx(ctx, tx, driver.JobFilter{})
		if err != nil || len(all) != 3 || all[0].ID != before[0] || all[1].ID != ids[0] || all[2].ID != ids[1] {
			t.Fatalf("list in the transaction: %d jobs %v, want the committed one and the two inserted", len(all), err)
		}
		if j := all[2]; j.Kind != "other" || j.Queue != "u" || j.State != driver.StateScheduled || j.Priority != 1 || j.Attempt != 0 ||
			time.Until(j.ScheduledAt) < 50*time.Minute || j.CreatedAt.IsZero() || !j.AttemptedAt.IsZero() || j.Errors != nil || string(j.Args) != `{"a":1}` && string(j.Args) != `{"a": 1}` {
			t.Fatalf("job read in the transaction: %+v (args %s)", j, j.Args)
		}
		for _, c := range []struct {
			f    driver.JobFilter
			want []int64
		}{
			{driver.JobFilter{Kind: "other"}, ids[1:]},
			{driver.JobFilter{Queue: "t"}, []int64{before[0], ids[0]}},
			{driver.JobFilter{States: []string{driver.StateScheduled}}, ids[1:]},
			{driver.JobFilter{AfterID: before[0], Limit: 1}, ids[:1]},
		} {
			got, err := d.ListJobsTx(ctx, tx, c.f)
			if err != nil {
				t.Fatal(err)
			}
			var gotIDs []int64
			for _, j := range got {
				gotIDs = append(gotIDs, j.ID)
			}
			if fmt.Sprint(gotIDs) != fmt.Sprint(c.want) {
				t.Fatalf("list %+v in the transaction: %v, want %v", c.f, gotIDs, c.want)
			}
		}
		rollback()
		outside, err := d.ListJobs(ctx, driver.JobFilter{})
		if err != nil || len(outside) != 1 {
			t.Fatalf("after the rollback: %d jobs %v, want only the committed one", len(outside), err)
		}
	})

	t.Run("ConcurrentClaimsNeverShare", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		const n = 600
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = job("c", i%3)
		}
		if _, err := d.Insert(ctx, in); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 7, Lease: time.Minute, Worker: "w"})
					if err != nil {
						errs <- err
						return
					}
					if len(rows) == 0 {
						return
					}
					out := make([]driver.Outcome, len(rows))
					mu.Lock()
					for i, r := range rows {
						seen[r.ID]++
						out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
					}
					mu.Unlock()
					if _, err := d.Complete(ctx, out); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent claim/complete error: %v", err)
		}
		if len(seen) != n {
			t.Fatalf("claimed %d distinct jobs, want %d", len(seen), n)
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("job %d handed out %d times", id, c)
			}
		}
	})

	t.Run("AdminAndStats", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("x", 0), job("x", 0), job("y", 0)})
		if _, err := d.Retry(ctx, ids[0]); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("retry of available job: %v, want ErrWrongState", err)
		}
		j, err := d.Cancel(ctx, ids[0])
		if err != nil || j.State != driver.StateCancelled {
			t.Fatalf("cancel: %+v %v", j, err)
		}
		if _, err := d.Cancel(ctx, ids[0]); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("second cancel: %v", err)
		}
		j, err = d.Discard(ctx, ids[1])
		if err != nil || j.State != driver.StateDiscarded {
			t.Fatalf("discard: %+v %v", j, err)
		}
		j, err = d.Retry(ctx, ids[1])
		if err != nil || j.State != driver.StateAvailable || j.MaxAttempts < j.Attempt+1 {
			t.Fatalf("retry: %+v %v", j, err)
		}
		if _, err := d.GetJob(ctx, 1<<40); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		list, err := d.ListJobs(ctx, driver.JobFilter{Queue: "x"})
		if err != nil || len(list) != 2 {
			t.Fatalf("list queue x: %d %v", len(list), err)
		}
		list, _ = d.ListJobs(ctx, driver.JobFilter{States: []string{driver.StateCancelled}})
		if len(list) != 1 || list[0].ID != ids[0] {
			t.Fatalf("list cancelled: %v", list)
		}
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byQ := map[string]driver.QueueStats{}
		for _, s := range st {
			byQ[s.Queue] = s
		}
		if byQ["x"].Counts[driver.StateAvailable] != 1 || byQ["x"].Counts[driver.StateCancelled] != 1 || byQ["y"].Counts[driver.StateAvailable] != 1 {
			t.Fatalf("stats: %+v", st)
		}
		if _, ok := byQ["x"].Counts[driver.StateDiscarded]; !ok {
			t.Fatalf("stats omit zero states: %+v", byQ["x"].Counts)
		}
	})

	// Overview counts the unfinished states as Stats does and the finished
	// ones only from finishedSince on, by the database's clock: the
	// finished jobs' own finalized_at (read back) is the boundary.
	t.Run("Overview", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		later := job("o", 0)
		later.Delay = time.Hour
		ids, err := d.Insert(ctx, []driver.InsertParams{job("o", 0), job("o", 0), job("o", 0), job("o", 0), job("o", 0), later, job("p", 0), job("idle", 0)})
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "o", Limit: 4, Lease: time.Minute, Worker: "w"})
		if err != nil || len(claimed) != 4 {
			t.Fatalf("claim: %d %v", len(claimed), err)
		}
		// Of the four running: completed, discarded, retryable; one runs.
		if _, err := d.Complete(ctx, []driver.Outcome{
			{ID: claimed[0].ID, Fence: claimed[0].Fence, Attempt: 1, State: driver.StateCompleted},
			{ID: claimed[1].ID, Fence: claimed[1].Fence, Attempt: 1, State: driver.StateDiscarded},
			{ID: claimed[2].ID, Fence: claimed[2].Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour},
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Cancel(ctx, ids[7]); err != nil { // idle: only a finished job
			t.Fatal(err)
		}
		var first, last time.Time
		for _, id := range []int64{claimed[0].ID, claimed[1].ID, ids[7]} {
			j, err := d.GetJob(ctx, id)
			if err != nil || j.FinalizedAt.IsZero() {
				t.Fatalf("job %d: %+v %v", id, j, err)
			}
			if first.IsZero() || j.FinalizedAt.Before(first) {
				first = j.FinalizedAt
			}
			if j.FinalizedAt.After(last) {
				last = j.FinalizedAt
			}
		}
		stats, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		full := map[string]driver.QueueStats{}
		for _, s := range stats {
			full[s.Queue] = s
		}
		overview := func(since time.Time) map[string]driver.QueueStats {
			t.Helper()
			st, err := d.Overview(ctx, since)
			if err != nil {
				t.Fatal(err)
			}
			by := map[string]driver.QueueStats{}
			for _, s := range st {
				if len(s.Counts) != len(driver.AllStates) {
					t.Fatalf("overview %s: counts %v lack states", s.Queue, s.Counts)
				}
				by[s.Queue] = s
			}
			return by
		}
		unfinished := []string{driver.StateAvailable, driver.StateScheduled, driver.StateRetryable, driver.StateRunning}
		finished := []string{driver.StateCompleted, driver.StateDiscarded, driver.StateCancelled}
		before := overview(first.Add(-time.Millisecond))
		for _, q := range []string{"o", "p", "idle"} {
			for _, st := range unfinished {
				if before[q].Counts[st] != full[q].Counts[st] {
					t.Errorf("queue %s %s: overview %d, stats %d", q, st, before[q].Counts[st], full[q].Counts[st])
				}
			}
			for _, st := range finished { // all finished within the window
				if before[q].Counts[st] != full[q].Counts[st] {
					t.Errorf("queue %s %s since before: overview %d, stats %d", q, st, before[q].Counts[st], full[q].Counts[st])
				}
			}
		}
		o := full["o"].Counts
		if o[driver.StateAvailable] != 1 || o[driver.StateScheduled] != 1 || o[driver.StateRetryable] != 1 || o[driver.StateRunning] != 1 || o[driver.StateCompleted] != 1 || o[driver.StateDiscarded] != 1 {
			t.Fatalf("stats of o: %v", o)
		}
		if full["o"].OldestAvailable > 0 && before["o"].OldestAvailable <= 0 {
			t.Errorf("oldest available: overview %v, stats %v", before["o"].OldestAvailable, full["o"].OldestAvailable)
		}
		after := overview(last.Add(time.Millisecond))
		for _, st := range finished {
			if n := after["o"].Counts[st]; n != 0 {
				t.Errorf("o %s since after the last finish: %d, want 0", st, n)
			}
		}
		for _, st := range unfinished {
			if after["o"].Counts[st] != full["o"].Counts[st] {
				t.Errorf("o %s since after: overview %d, stats %d", st, after["o"].Counts[st], full["o"].Counts[st])
			}
		}
		if _, ok := after["idle"]; ok {
			t.Errorf("queue idle, with only a job finished before since, listed: %+v", after["idle"])
		}
		if after["p"].Counts[driver.StateAvailable] != 1 {
			t.Errorf("queue p: %+v", after["p"])
		}
	})

	t.Run("BulkInsert", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		in := make([]driver.InsertParams, 2500)
		for i := range in {
			in[i] = job("bulk", 0)
		}
		in[0].Delay = time.Hour
		n, err := d.BulkInsert(ctx, in)
		if err != nil || n != int64(len(in)) {
			t.Fatalf("bulk insert %d err %v", n, err)
		}
		st, _ := d.Stats(ctx)
		for _, s := range st {
			if s.Queue == "bulk" && (s.Counts[driver.StateAvailable] != 2499 || s.Counts[driver.StateScheduled] != 1) {
				t.Fatalf("bulk counts %v", s.Counts)
			}
		}
	})

	t.Run("Prune", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("p", 0), job("p", 0)})
		rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "p", Limit: 2, Lease: time.Minute, Worker: "w"})
		d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: Fences(rows)[ids[0]], Attempt: 1, State: driver.StateCompleted}})
		time.Sleep(50 * time.Millisecond)
		n, err := d.Prune(ctx, time.Millisecond, time.Hour, 100)
		if err != nil || n != 1 {
			t.Fatalf("prune %d err %v; want 1", n, err)
		}
		if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("pruned job still there: %v", err)
		}
		if j, err := d.GetJob(ctx, ids[1]); err != nil || j.State != driver.StateRunning {
			t.Fatalf("running job pruned: %v", err)
		}
	})

	t.Run("Leader", func(t *testing.T) {
		d := setup(t, open, prefixFor())
		ok, err := d.TryLead(ctx, "a", 300*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("first leader: %v %v", ok, err)
		}
		if ok, _ := d.TryLead(ctx, "b", 300*time.Millisecond); ok {
			t.Fatal("second process took a live leadership")
		}
		if ok, _ := d.TryLead(ctx, "a", 300*time.Millisecond); !ok {
			t.Fatal("leader could not renew")
		}
		time.Sleep(400 * time.Millisecond)
		if ok, _ := d.TryLead(ctx, "b", 300*time.Millisecond); !ok {
			t.Fatal("leadership not taken over after expiry")
		}
	})
}

// Fences maps the claimed rows' ids to their fence tokens. A fence is the
// backend's: it only grows, by one or to the database clock (PostgreSQL),
// so tests take it from the claim rather than assume a value.
func Fences(rows []*driver.JobRow) map[int64]int64 {
	m := make(map[int64]int64, len(rows))
	for _, r := range rows {
		m[r.ID] = r.Fence
	}
	return m
}
