package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// An insert that claims, in one statement or split into several of one
// transaction: the ids come back in input order; each claimed row is the
// stored row, as a claim leaves it (attempt 1, fence 1, claimed when
// created, leased for the lease given); the jobs not claimed (not
// flagged, not due, or of a paused queue) are stored as Insert stores
// the same jobs.
func TestInsertClaimRows(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			if split {
				old := insertChunkBytes
				insertChunkBytes = 2000
				t.Cleanup(func() { insertChunkBytes = old })
			}
			d := migrated(t)
			ctx := context.Background()
			if err := d.PauseQueue(ctx, "paused", true); err != nil {
				t.Fatal(err)
			}
			past := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
			args := []string{`{"a": 1,  "b":[1, 2]}`, `{"s":"quote \" tab \t ctl \u0001 é"}`, ``, `123`}
			in := make([]driver.InsertParams, 121)
			flags := make([]bool, len(in))
			for i := range in {
				in[i] = driver.InsertParams{Queue: "q" + strconv.Itoa(i%3), Kind: "kind" + strconv.Itoa(i),
					Args: json.RawMessage(args[i%len(args)]), Priority: i % 7, MaxAttempts: i%5 + 2, TimeoutMS: int64(i)}
				if i%6 == 0 {
					in[i].Meta = json.RawMessage(`{"m":` + strconv.Itoa(i) + `}`)
				}
				if i%4 == 0 {
					in[i].Key = "k" + strconv.Itoa(i%3)
				}
				switch i % 5 {
				case 1:
					in[i].RunAt = past
				case 2:
					in[i].Delay = time.Hour
				case 3:
					in[i].Queue = "paused"
				}
				flags[i] = i%7 != 6
			}
			lease := 90 * time.Second
			before := time.Now()
			ids, rows, err := d.InsertClaiming(ctx, in, driver.InsertClaim{Claim: flags, Lease: lease, Worker: "w1"})
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != len(in) || len(rows) != len(in) {
				t.Fatalf("%d ids and %d rows for %d jobs", len(ids), len(rows), len(in))
			}
			// The same jobs, inserted plainly: what an unclaimed job is
			// stored as.
			plain, err := d.Insert(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			claimed := 0
			for i, id := range ids {
				if i > 0 && id <= ids[i-1] {
					t.Fatalf("ids out of input order: %v", ids)
				}
				got, err := d.GetJob(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				want := flags[i] && in[i].Delay == 0 && in[i].Queue != "paused"
				r := rows[i]
				if (r != nil) != want {
					t.Fatalf("input %d (%+v, flagged %v): claimed %v, want %v", i, in[i], flags[i], r != nil, want)
				}
				if r == nil {
					p, err := d.GetJob(ctx, plain[i])
					if err != nil {
						t.Fatal(err)
					}
					p.ID, p.CreatedAt, p.ScheduledAt = got.ID, got.CreatedAt, got.ScheduledAt
					if in[i].RunAt.IsZero() {
						// Its delay counts from its own insert's clock.
					} else if !got.ScheduledAt.Equal(in[i].RunAt) {
						t.Fatalf("input %d: scheduled at %v, want %v", i, got.ScheduledAt, in[i].RunAt)
					}
					if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", p) {
						t.Fatalf("input %d not claimed, stored as\n%+v\nwhere Insert stores\n%+v", i, got, p)
					}
					continue
				}
				claimed++
				if r.LeaseFrom.IsZero() || r.LeaseFrom.Before(before.Add(-time.Millisecond)) || r.LeaseFrom.After(r.AttemptedAt) {
					t.Fatalf("input %d: lease from %v, before %v, attempted %v", i, r.LeaseFrom, before, r.AttemptedAt)
				}
				r.LeaseFrom = time.Time{}
				if fmt.Sprintf("%+v", r) != fmt.Sprintf("%+v", got) {
					t.Fatalf("input %d: returned\n%+v\nstored\n%+v", i, r, got)
				}
				if r.State != driver.StateRunning || r.Attempt != 1 || r.Fence != 1 || r.AttemptedBy != "w1" ||
					!r.AttemptedAt.Equal(r.CreatedAt) || r.LeaseExpiresAt.Sub(r.AttemptedAt) != lease {
					t.Fatalf("input %d: claimed row %+v", i, r)
				}
				if in[i].RunAt.IsZero() && !r.ScheduledAt.Equal(r.CreatedAt) || !in[i].RunAt.IsZero() && !r.ScheduledAt.Equal(in[i].RunAt) {
					t.Fatalf("input %d: scheduled at %v, created %v", i, r.ScheduledAt, r.CreatedAt)
				}
			}
			if claimed == 0 {
				t.Fatal("nothing claimed")
			}
		})
	}
}

// A job claimed at insert is a running job of its queue as one a claim
// took: the queue's concurrency limit counts it, and a claim of the same
// queue's jobs gives the next one the fence a claim gives.
func TestInsertClaimCountsRunning(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	j := driver.InsertParams{Queue: "lim", Kind: "k", MaxAttempts: 3}
	_, rows, err := d.InsertClaiming(ctx, []driver.InsertParams{j, j}, driver.InsertClaim{Claim: []bool{true, false}, Lease: time.Minute, Worker: "w"})
	if err != nil || rows[0] == nil || rows[1] != nil {
		t.Fatalf("insert claim: %v %v", rows, err)
	}
	if err := d.SetQueueLimits(ctx, "lim", driver.QueueLimits{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	res, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "lim", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(res.Rows) != 0 || !res.Held {
		t.Fatalf("limited claim beside a job claimed at insert: %+v %v", res, err)
	}
	u, err := d.LimitUsage(ctx)
	if err != nil || u["lim"].Running != 1 {
		t.Fatalf("usage %+v %v, want 1 running", u["lim"], err)
	}
	if err := d.SetQueueLimits(ctx, "lim", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	got, err := d.Claim(ctx, driver.ClaimParams{Queue: "lim", Limit: 5, Lease: time.Minute, Worker: "w"})
	if err != nil || len(got) != 1 || got[0].Fence != rows[0].Fence || got[0].Attempt != rows[0].Attempt {
		t.Fatalf("claim: %+v %v; want the other job with fence %d, attempt %d", got, err, rows[0].Fence, rows[0].Attempt)
	}
}

// A job refused before the statement fails the insert as Insert fails it:
// marked NotCommitted, nothing written. An insert with nothing flagged is
// Insert.
func TestInsertClaimErrors(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	c := driver.InsertClaim{Claim: []bool{true, true}, Lease: time.Minute, Worker: "w"}
	_, _, err := d.InsertClaiming(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", MaxAttempts: 2}, {Queue: "", Kind: "k"}}, c)
	if err == nil || !driver.IsNotCommitted(err) {
		t.Fatalf("bad job: %v, want an error marked NotCommitted", err)
	}
	if n, err := d.Stats(ctx); err != nil || len(n) != 0 {
		t.Fatalf("after a refused insert: %v %v", n, err)
	}
	ids, rows, err := d.InsertClaiming(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", MaxAttempts: 2}}, driver.InsertClaim{})
	if err != nil || len(ids) != 1 || len(rows) != 1 || rows[0] != nil {
		t.Fatalf("nothing flagged: %v %v %v", ids, rows, err)
	}
	if j, err := d.GetJob(ctx, ids[0]); err != nil || j.State != driver.StateAvailable {
		t.Fatalf("nothing flagged: stored %+v %v", j, err)
	}
}

// The skip of jobs without a key ends for the queues of the jobs an
// insert left to a claim, not for those of the jobs it claimed.
func TestInsertClaimForgetsUnclaimed(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	for _, q := range []string{"a", "b", "c"} {
		_, mark := d.noKeyless.Look(q)
		d.noKeyless.Skip(q, mark)
	}
	in := []driver.InsertParams{{Queue: "a", Kind: "k", MaxAttempts: 2}, {Queue: "b", Kind: "k", MaxAttempts: 2}, {Queue: "c", Kind: "k", MaxAttempts: 2, Delay: time.Hour}}
	if _, _, err := d.InsertClaiming(ctx, in, driver.InsertClaim{Claim: []bool{true, false, true}, Lease: time.Minute, Worker: "w"}); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]bool{"a": false, "b": true, "c": true} {
		if look, _ := d.noKeyless.Look(q); look != want {
			t.Errorf("queue %s: claims look for jobs without a key: %v, want %v", q, look, want)
		}
	}
}

// An insert that claims jobs of a queue limited only per key claims a
// job with a key only where a claim would have taken it at once: no due
// job of its key waits (in the table or ahead of it in the insert) and
// the key has a free slot, which the claimed attempt then holds, and
// frees when it ends. A queue with another limit has nothing claimed.
func TestInsertClaimKeyed(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	for q, l := range map[string]driver.QueueLimits{
		"two": {KeyMaxRunning: 2}, "ord": {Ordered: true, OrderedMoveOn: true}, "hold": {Ordered: true},
		"max": {MaxRunning: 10, KeyMaxRunning: 2}, "paused": {KeyMaxRunning: 2},
	} {
		if err := d.SetQueueLimits(ctx, q, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PauseQueue(ctx, "paused", true); err != nil {
		t.Fatal(err)
	}
	// Already waiting: a due job of key "w" in "two", and of "w" in "ord".
	if _, err := d.Insert(ctx, []driver.InsertParams{
		{Queue: "two", Kind: "k", Key: "w", MaxAttempts: 3},
		{Queue: "ord", Kind: "k", Key: "w", MaxAttempts: 3},
	}); err != nil {
		t.Fatal(err)
	}
	type want struct {
		job     driver.InsertParams
		flag    bool
		claimed bool
	}
	j := func(q, key string) driver.InsertParams {
		return driver.InsertParams{Queue: q, Kind: "k", Key: key, MaxAttempts: 3}
	}
	later := j("ord", "d")
	later.Delay = time.Hour
	cases := []want{
		{j("two", "a"), true, true},
		{j("two", "a"), true, true},
		{j("two", "a"), true, false}, // the key's two slots are taken
		{j("two", "w"), true, false}, // a job of the key waits
		{j("two", ""), true, true},   // no key: as an unlimited job
		{j("two", "b"), false, false},
		{j("two", "b"), true, false}, // behind the key's job left to a claim
		{j("ord", "c"), true, true},
		{j("ord", "c"), true, false}, // one at a time
		{later, true, false},         // not due
		{j("ord", "d"), true, false}, // behind the key's earlier job: not due, but left to a claim
		{j("ord", "w"), true, false},
		{j("max", "a"), true, false}, // MaxRunning: the insert claims none of the queue's jobs
		{j("max", ""), true, false},
		{j("paused", "a"), true, false},
		{j("hold", "h"), true, true},
		{j("free", "a"), true, true}, // no limits
	}
	in := make([]driver.InsertParams, len(cases))
	flags := make([]bool, len(cases))
	for i, c := range cases {
		in[i], flags[i] = c.job, c.flag
	}
	ids, rows, err := d.InsertClaiming(ctx, in, driver.InsertClaim{Claim: flags, Lease: time.Minute, Worker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	held := map[int64]bool{}
	for i, c := range cases {
		got, err := d.GetJob(ctx, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if (rows[i] != nil) != c.claimed || (got.State == driver.StateRunning) != c.claimed {
			t.Errorf("job %d (%s, key %q): claimed %v, state %s; want claimed %v", i, c.job.Queue, c.job.Key, rows[i] != nil, got.State, c.claimed)
		}
		if c.claimed && c.job.Key != "" && c.job.Queue != "free" {
			held[ids[i]] = true
		}
	}
	slots := func() map[int64]int64 {
		t.Helper()
		rs, err := d.DB().Query(`SELECT job_id, fence FROM conveyor_key_slots WHERE job_id IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		m := map[int64]int64{}
		for rs.Next() {
			var id, fence int64
			if err := rs.Scan(&id, &fence); err != nil {
				t.Fatal(err)
			}
			m[id] = fence
		}
		return m
	}
	got := slots()
	if len(got) != len(held) {
		t.Fatalf("key slots held by jobs %v; want those of %v", got, held)
	}
	for id := range held {
		if got[id] != 1 {
			t.Fatalf("key slots %v: job %d holds none under fence 1", got, id)
		}
	}
	// A claim of the queue sees the key full: it takes "w" and "b" but
	// no third "a".
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "two", Limit: 10, Lease: time.Minute, Worker: "w2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range r.Rows {
		if row.Key == "a" {
			t.Fatalf("a claim took a third job of key a (limit 2): %+v", row)
		}
	}
	// The claimed attempts' ends free their slots: the next insert of
	// key "c" in "ord" is claimed once its first job is done, and the
	// key's waiting job is taken first.
	var outs []driver.Outcome
	for i, row := range rows {
		if row != nil && in[i].Queue == "ord" {
			outs = append(outs, driver.Outcome{ID: row.ID, Fence: row.Fence, State: driver.StateCompleted})
		}
	}
	if applied, err := d.Complete(ctx, outs); err != nil || len(applied) != len(outs) {
		t.Fatalf("complete: %v, %v", applied, err)
	}
	_, rows2, err := d.InsertClaiming(ctx, []driver.InsertParams{j("ord", "c"), j("ord", "e")}, driver.InsertClaim{Claim: []bool{true, true}, Lease: time.Minute, Worker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if rows2[0] != nil || rows2[1] == nil {
		t.Fatalf("after the end of c's attempt, with c's next job waiting: claimed %v, %v; want only e", rows2[0] != nil, rows2[1] != nil)
	}
	// An ordered key that holds its failed job's slot until the retry:
	// no job of the key is claimed meanwhile.
	h := rows[len(rows)-2]
	if applied, err := d.Complete(ctx, []driver.Outcome{{ID: h.ID, Fence: h.Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour,
		Err: &driver.AttemptError{Attempt: 1, Error: "boom"}}}); err != nil || len(applied) != 1 {
		t.Fatalf("fail h: %v, %v", applied, err)
	}
	_, rows3, err := d.InsertClaiming(ctx, []driver.InsertParams{j("hold", "h"), j("hold", "i")}, driver.InsertClaim{Claim: []bool{true, true}, Lease: time.Minute, Worker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if rows3[0] != nil || rows3[1] == nil {
		t.Fatalf("with h's slot kept for its retry: claimed %v, %v; want only i", rows3[0] != nil, rows3[1] != nil)
	}
}
