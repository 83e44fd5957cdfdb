package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// claimFair claims up to limit jobs of queue with ClaimLimited.
func claimFair(t *testing.T, d *Driver, queue string, limit int) driver.ClaimResult {
	t.Helper()
	r, err := d.ClaimLimited(context.Background(), driver.ClaimParams{Queue: queue, Limit: limit, Lease: time.Hour, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestFairColumns: Fair and the key weights are the key_fair and
// key_weights columns of the queue's row, each written apart from the
// other; weights make a row with no limits and no pause.
func TestFairColumns(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	if err := d.SetKeyWeights(ctx, "fc", map[string]int{"b": 2, "a": 3}); err != nil {
		t.Fatal(err)
	}
	var fair *bool
	var raw *string
	var paused bool
	col := func() {
		t.Helper()
		if err := d.pool.QueryRow(ctx, "SELECT key_fair, key_weights, paused_at IS NOT NULL FROM "+d.prefix+"queues WHERE name = 'fc'").
			Scan(&fair, &raw, &paused); err != nil {
			t.Fatal(err)
		}
	}
	col()
	if fair != nil || raw == nil || *raw != `{"a":3,"b":2}` || paused {
		t.Fatalf("after SetKeyWeights: key_fair %v, key_weights %v, paused %v", fair, raw, paused)
	}
	if l, err := d.QueueLimits(ctx); err != nil || len(l) != 0 {
		t.Fatalf("limits of a queue with weights alone: %v, %v", l, err)
	}
	if err := d.SetQueueLimits(ctx, "fc", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	col()
	if fair == nil || !*fair || raw == nil || *raw != `{"a":3,"b":2}` {
		t.Fatalf("after SetQueueLimits: key_fair %v, key_weights %v", fair, raw)
	}
	if l, err := d.QueueLimits(ctx); err != nil || l["fc"] != (driver.QueueLimits{Fair: true}) {
		t.Fatalf("limits %v, %v; want Fair alone", l, err)
	}
	if u, err := d.LimitUsage(ctx); err != nil || !u["fc"].Limits.Fair {
		t.Fatalf("usage %v, %v", u, err)
	}
	if w, err := d.KeyWeights(ctx); err != nil || len(w) != 1 || w["fc"]["a"] != 3 || w["fc"]["b"] != 2 {
		t.Fatalf("weights %v, %v", w, err)
	}
	if err := d.SetKeyWeights(ctx, "fc", nil); err != nil {
		t.Fatal(err)
	}
	col()
	if fair == nil || !*fair || raw != nil {
		t.Fatalf("after removing the weights: key_fair %v, key_weights %v", fair, raw)
	}
	if err := d.SetQueueLimits(ctx, "fc", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	col()
	if fair != nil {
		t.Fatalf("after clearing the limits: key_fair %v", *fair)
	}
	if l, err := d.QueueLimits(ctx); err != nil || len(l) != 0 {
		t.Fatalf("limits after clearing: %v, %v", l, err)
	}
}

// TestFairWeightedClaim: two deep keys of weights 3 and 1 split claims of
// 8 as 6 and 2, with no slot row and nothing held; a lone key fills a
// claim; the unkeyed jobs come after the keyed ones.
func TestFairWeightedClaim(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	insertJobs(t, d, keyedJobs("fw", "heavy", 40), keyedJobs("fw", "light", 40))
	if err := d.SetQueueLimits(ctx, "fw", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetKeyWeights(ctx, "fw", map[string]int{"heavy": 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r := claimFair(t, d, "fw", 8)
		if got := perKey(r.Rows); got["heavy"] != 6 || got["light"] != 2 || r.Held {
			t.Fatalf("claim %d: %v (held %v), want heavy 6, light 2", i, got, r.Held)
		}
	}
	if n := countSlots(t, d, "fw", "true"); n != 0 {
		t.Fatalf("%d key slot rows for a fair queue without key limits", n)
	}
	// The weights change: the next claim uses them.
	if err := d.SetKeyWeights(ctx, "fw", map[string]int{"light": 3}); err != nil {
		t.Fatal(err)
	}
	if got := perKey(claimFair(t, d, "fw", 8).Rows); got["heavy"] != 2 || got["light"] != 6 {
		t.Fatalf("after the weights changed: %v, want heavy 2, light 6", got)
	}
	insertJobs(t, d, keyedJobs("lone", "", 5), keyedJobs("lone", "only", 30))
	if err := d.SetQueueLimits(ctx, "lone", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if got := perKey(claimFair(t, d, "lone", 20).Rows); got["only"] != 20 {
		t.Fatalf("a lone key: %v, want 20", got)
	}
	if got := perKey(claimFair(t, d, "lone", 20).Rows); got["only"] != 10 || got[""] != 5 {
		t.Fatalf("the rest: %v, want the key's 10 then 5 without a key", got)
	}
}

// TestFairFloodKey: a key of 200 jobs inserted first beside 10 keys of 3
// jobs: each of the first three claims of 10 takes 10 distinct keys, and
// four claims take every small job.
func TestFairFloodKey(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	groups := [][]driver.InsertParams{keyedJobs("ff", "flood", 200)}
	for i := range 10 {
		groups = append(groups, keyedJobs("ff", "k"+itoa(int64(i)), 3))
	}
	insertJobs(t, d, groups...)
	if err := d.SetQueueLimits(ctx, "ff", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	small := 0
	for i := range 4 {
		r := claimFair(t, d, "ff", 10)
		got := perKey(r.Rows)
		if i < 3 && len(got) != 10 || len(r.Rows) != 10 || r.Held {
			t.Fatalf("claim %d: %v (held %v)", i, got, r.Held)
		}
		small += len(r.Rows) - got["flood"]
	}
	if small != 30 {
		t.Fatalf("%d small jobs after four claims, want 30", small)
	}
}

// TestFairKeyMaxRunning: with KeyMaxRunning 2 a key of weight 5 takes 2
// and is held; the weights cut what slots admit, in rounds.
func TestFairKeyMaxRunning(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	insertJobs(t, d, keyedJobs("fk", "a", 10), keyedJobs("fk", "b", 10))
	if err := d.SetQueueLimits(ctx, "fk", driver.QueueLimits{Fair: true, KeyMaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetKeyWeights(ctx, "fk", map[string]int{"a": 5}); err != nil {
		t.Fatal(err)
	}
	r := claimFair(t, d, "fk", 10)
	if got := perKey(r.Rows); got["a"] != 2 || got["b"] != 2 || !r.Held {
		t.Fatalf("claimed %v (held %v), want 2 of each, held", got, r.Held)
	}
	insertJobs(t, d, keyedJobs("fk4", "a", 10), keyedJobs("fk4", "b", 10))
	if err := d.SetQueueLimits(ctx, "fk4", driver.QueueLimits{Fair: true, KeyMaxRunning: 4}); err != nil {
		t.Fatal(err)
	}
	r = claimFair(t, d, "fk4", 6)
	if got := perKey(r.Rows); got["a"] != 3 || got["b"] != 3 {
		t.Fatalf("claimed %v, want 3 of each", got)
	}
	r = claimFair(t, d, "fk4", 10)
	if got := perKey(r.Rows); got["a"] != 1 || got["b"] != 1 || !r.Held {
		t.Fatalf("claimed %v (held %v), want the last slot of each, held", got, r.Held)
	}
}

// TestFairConcurrentClaimers: four claimers of a fair queue claim every
// job exactly once.
func TestFairConcurrentClaimers(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	var groups [][]driver.InsertParams
	for i := range 8 {
		groups = append(groups, keyedJobs("fcc", "k"+itoa(int64(i)), 1+5*i))
	}
	groups = append(groups, keyedJobs("fcc", "", 10))
	insertJobs(t, d, groups...)
	total := 10
	for i := range 8 {
		total += 1 + 5*i
	}
	if err := d.SetQueueLimits(ctx, "fcc", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetKeyWeights(ctx, "fcc", map[string]int{"k7": 4, "k3": 2}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for empty := 0; empty < 3; {
				r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "fcc", Limit: 7, Lease: time.Hour, Worker: "w"})
				if err != nil {
					t.Error(err)
					return
				}
				if len(r.Rows) == 0 {
					empty++
					continue
				}
				mu.Lock()
				for _, row := range r.Rows {
					seen[row.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("job %d claimed %d times", id, n)
		}
	}
	if len(seen) != total {
		t.Fatalf("claimed %d jobs, want %d", len(seen), total)
	}
}
