package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestFairColumns: Fair is the key_fair column beside the other limits,
// and the key weights the key_weights column of the same row, each
// written without touching the other, a pause, or the limits.
func TestFairColumns(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	cols := func(q string) (fair sql.NullInt64, weights, paused sql.NullString, maxRunning sql.NullInt64) {
		t.Helper()
		err := d.db.QueryRowContext(ctx, "SELECT key_fair, key_weights, paused_at, max_running FROM `"+d.prefix+"queues` WHERE name = ?", q).Scan(&fair, &weights, &paused, &maxRunning)
		if err != nil {
			t.Fatal(err)
		}
		return
	}

	// Weights first: a row with neither limits nor a pause.
	w := map[string]int{"a": 3, "b": 1}
	if err := d.SetKeyWeights(ctx, "fc", w); err != nil {
		t.Fatal(err)
	}
	if fair, weights, paused, mr := cols("fc"); fair.Valid || paused.Valid || mr.Valid || weights.String != `{"a":3,"b":1}` {
		t.Fatalf("after SetKeyWeights: fair %v weights %v paused %v max %v", fair, weights, paused, mr)
	}
	if l, err := d.QueueLimits(ctx); err != nil || len(l) != 0 {
		t.Fatalf("a row with weights only is listed as limited: %v, %v", l, err)
	}
	if _, err := d.Insert(ctx, limitJobs("fc", 1)); err != nil {
		t.Fatal(err)
	}
	if got := claimLimited(t, d, "fc", 5, time.Minute); len(got) != 1 {
		t.Fatalf("claimed %d of a queue with weights only, want 1", len(got))
	}

	if err := d.SetQueueLimits(ctx, "fc", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if fair, weights, _, mr := cols("fc"); fair.Int64 != 1 || mr.Valid || weights.String != `{"a":3,"b":1}` {
		t.Fatalf("after SetQueueLimits: fair %v weights %v max %v", fair, weights, mr)
	}
	if l, err := d.QueueLimits(ctx); err != nil || l["fc"] != (driver.QueueLimits{Fair: true}) {
		t.Fatalf("QueueLimits = %v, %v; want fc Fair", l, err)
	}
	u, err := d.LimitUsage(ctx)
	if err != nil || u["fc"] != (driver.LimitUsage{Limits: driver.QueueLimits{Fair: true}}) {
		t.Fatalf("LimitUsage = %+v, %v; want fc Fair with nothing used", u, err)
	}
	if got, err := d.KeyWeights(ctx); err != nil || len(got) != 1 || !maps.Equal(got["fc"], w) {
		t.Fatalf("KeyWeights = %v, %v", got, err)
	}
	if err := d.PauseQueue(ctx, "fc", true); err != nil {
		t.Fatal(err)
	}
	if err := d.SetKeyWeights(ctx, "fc", map[string]int{"c": 2}); err != nil {
		t.Fatal(err)
	}
	if fair, weights, paused, _ := cols("fc"); fair.Int64 != 1 || !paused.Valid || weights.String != `{"c":2}` {
		t.Fatalf("after replacing the weights: fair %v weights %v paused %v", fair, weights, paused)
	}
	if err := d.SetKeyWeights(ctx, "fc", nil); err != nil {
		t.Fatal(err)
	}
	if fair, weights, paused, _ := cols("fc"); fair.Int64 != 1 || !paused.Valid || weights.Valid {
		t.Fatalf("after removing the weights: fair %v weights %v paused %v", fair, weights, paused)
	}
	if got, err := d.KeyWeights(ctx); err != nil || len(got) != 0 {
		t.Fatalf("KeyWeights = %v, %v after removal", got, err)
	}
	if err := d.SetQueueLimits(ctx, "fc", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if fair, _, _, _ := cols("fc"); fair.Valid {
		t.Fatalf("zero limits left key_fair %v", fair)
	}
	if err := d.SetKeyWeights(ctx, "fc", map[string]int{"": 1}); err == nil {
		t.Fatal("an empty key was weighed")
	}
}

// TestFairClaim: a Fair claim gives each key its weight per turn, then
// further rounds to the keys that have more, with no slot rows and
// nothing held; jobs without a key come last.
func TestFairClaim(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			jobs := limitJobs("fw", 43)
			for i := range jobs[:40] {
				jobs[i].Key = []string{"a", "b"}[i%2]
			}
			jobs[40].Key, jobs[41].Key = "c", "c"
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "fw", driver.QueueLimits{Fair: true}); err != nil {
				t.Fatal(err)
			}
			if err := d.SetKeyWeights(ctx, "fw", map[string]int{"a": 3}); err != nil {
				t.Fatal(err)
			}
			count := func(rows []*driver.JobRow) map[string]int {
				m := map[string]int{}
				for _, r := range rows {
					m[r.Key]++
				}
				return m
			}
			// a 3, b 1, c 1 in the turns; then a 3, b 1, c 1 again.
			r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fw", Limit: 10, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if got := count(r.Rows); r.Held || got["a"] != 6 || got["b"] != 2 || got["c"] != 2 {
				t.Fatalf("claim of 10 took %v (held %v), want a 6, b 2, c 2", got, r.Held)
			}
			// c is done: a and b split the claim 3 to 1.
			r, err = d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fw", Limit: 8, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if got := count(r.Rows); r.Held || got["a"] != 6 || got["b"] != 2 {
				t.Fatalf("claim of 8 took %v (held %v), want a 6, b 2", got, r.Held)
			}
			// a has 8 left, b 16: the rest of a and b, then the job
			// without a key.
			r, err = d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fw", Limit: 30, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			if got := count(r.Rows); r.Held || got["a"] != 8 || got["b"] != 16 || got[""] != 1 || r.Rows[len(r.Rows)-1].Key != "" {
				t.Fatalf("claim of 30 took %v (held %v), want a 8, b 16 and the keyless job last", got, r.Held)
			}
			var slots int
			if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"limit_slots` WHERE queue = 'fw'").Scan(&slots); err != nil {
				t.Fatal(err)
			}
			if slots != 0 {
				t.Fatalf("a Fair queue without other limits made %d slots", slots)
			}
		})
	}
}

// TestFairKeyLimit: under KeyMaxRunning a key's turn is the fewer of its
// weight and its free slots, and its slots, not its weight, hold it.
func TestFairKeyLimit(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	jobs := limitJobs("fk", 10)
	for i := range jobs {
		jobs[i].Key = "a"
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "fk", driver.QueueLimits{Fair: true, KeyMaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetKeyWeights(ctx, "fk", map[string]int{"a": 5}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fk", Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil || len(r.Rows) != 2 || !r.Held {
		t.Fatalf("claimed %d (held %v, %v), want 2 held by the key's slots", len(r.Rows), r.Held, err)
	}
}

// TestFairFlood: a key flooded with jobs takes one job per claim's turn
// beside ten shallow keys, so each claim serves ten keys and four claims
// take every job of the shallow keys.
func TestFairFlood(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	flood := limitJobs("ff", 200)
	for i := range flood {
		flood[i].Key = "m"
	}
	small := limitJobs("ff", 30)
	for i := range small {
		small[i].Key = fmt.Sprintf("k%d", i%10)
	}
	for _, js := range [][]driver.InsertParams{flood, small} {
		if _, err := d.Insert(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetQueueLimits(ctx, "ff", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	smallDone := 0
	for c := range 4 {
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "ff", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || r.Held || len(r.Rows) != 10 {
			t.Fatalf("claim %d: %d rows (held %v), %v", c, len(r.Rows), r.Held, err)
		}
		keys := map[string]int{}
		for _, j := range r.Rows {
			keys[j.Key]++
			if j.Key != "m" {
				smallDone++
			}
		}
		if c < 3 && len(keys) != 10 {
			t.Fatalf("claim %d served %d keys: %v", c, len(keys), keys)
		}
	}
	if smallDone != 30 {
		t.Fatalf("4 claims took %d of the shallow keys' 30 jobs", smallDone)
	}
}

// TestFairConcurrentClaimers: claimers of a Fair queue never claim a job
// twice and claim every job.
func TestFairConcurrentClaimers(t *testing.T) {
	for _, v := range variants[:2] {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			jobs := limitJobs("fcc", 300)
			for i := range jobs {
				if i%10 != 0 {
					jobs[i].Key = fmt.Sprintf("k%d", i%7)
				}
			}
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if err := d.SetQueueLimits(ctx, "fcc", driver.QueueLimits{Fair: true}); err != nil {
				t.Fatal(err)
			}
			if err := d.SetKeyWeights(ctx, "fcc", map[string]int{"k1": 4, "k2": 2}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			seen := map[int64]int{}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for empty := 0; empty < 3; {
						r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fcc", Limit: 7, Lease: time.Minute, Worker: "w"})
						if err != nil {
							errs <- err
							return
						}
						if len(r.Rows) == 0 {
							empty++
							continue
						}
						empty = 0
						mu.Lock()
						for _, j := range r.Rows {
							seen[j.ID]++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if len(seen) != len(jobs) {
				t.Fatalf("claimed %d distinct jobs of %d", len(seen), len(jobs))
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("job %d claimed %d times", id, n)
				}
			}
		})
	}
}
