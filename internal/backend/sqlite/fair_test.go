package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestFairStored checks the columns of migration 14: Fair is stored with
// the queue's limits and cleared with them, key weights are stored as
// their encoding beside them and survive SetQueueLimits, and a queue row
// made by SetKeyWeights alone is neither limited nor paused.
func TestFairStored(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	column := func(col, queue string) sql.NullString {
		t.Helper()
		var v sql.NullString
		if err := d.DB().QueryRow(`SELECT CAST(`+col+` AS TEXT) FROM conveyor_queues WHERE name = ?`, queue).Scan(&v); err != nil {
			t.Fatalf("read %s of %s: %v", col, queue, err)
		}
		return v
	}
	if err := d.SetQueueLimits(ctx, "f", driver.QueueLimits{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if v := column("key_fair", "f"); v.String != "1" {
		t.Fatalf("key_fair %+v, want 1", v)
	}
	all, err := d.QueueLimits(ctx)
	if err != nil || all["f"] != (driver.QueueLimits{Fair: true}) {
		t.Fatalf("limits %+v, %v: want f Fair", all, err)
	}
	use, err := d.LimitUsage(ctx)
	if u, ok := use["f"]; err != nil || !ok || u.Limits != (driver.QueueLimits{Fair: true}) || u.KeyHeld != 0 || u.KeysRunning != 0 {
		t.Fatalf("usage %+v, %v: want f Fair and nothing held", use, err)
	}
	w := map[string]int{"a": 3, "b": 1}
	if err := d.SetKeyWeights(ctx, "f", w); err != nil {
		t.Fatal(err)
	}
	if v := column("key_weights", "f"); v.String != string(driver.EncodeKeyWeights(w)) {
		t.Fatalf("key_weights %+v", v)
	}
	if err := d.SetQueueLimits(ctx, "f", driver.QueueLimits{Fair: true, KeyMaxRunning: 2}); err != nil {
		t.Fatal(err)
	}
	got, err := d.KeyWeights(ctx)
	if err != nil || len(got) != 1 || !maps.Equal(got["f"], w) {
		t.Fatalf("weights %+v, %v: want f %v", got, err, w)
	}
	if err := d.SetQueueLimits(ctx, "f", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if v := column("key_fair", "f"); v.Valid {
		t.Fatalf("key_fair %+v after the limits were removed, want NULL", v)
	}
	if all, err := d.QueueLimits(ctx); err != nil || len(all) != 0 {
		t.Fatalf("limits %+v, %v: want none", all, err)
	}
	if got, err := d.KeyWeights(ctx); err != nil || !maps.Equal(got["f"], w) {
		t.Fatalf("weights %+v, %v after the limits were removed: want f %v", got, err, w)
	}
	// Weights of a queue with no row: a row with weights only.
	if err := d.SetKeyWeights(ctx, "new", map[string]int{"x": 7}); err != nil {
		t.Fatal(err)
	}
	if all, err := d.QueueLimits(ctx); err != nil || len(all) != 0 {
		t.Fatalf("limits %+v, %v: want none", all, err)
	}
	if p, err := d.PausedQueues(ctx); err != nil || len(p) != 0 {
		t.Fatalf("paused %+v, %v: want none", p, err)
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "new", Kind: "k", Key: "x"}, {Queue: "new", Kind: "k"}}); err != nil {
		t.Fatal(err)
	}
	if r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "new", Limit: 5, Lease: time.Minute, Worker: "w"}); err != nil || len(r.Rows) != 2 || r.Held {
		t.Fatalf("claimed %d (held %v), %v: want both", len(r.Rows), r.Held, err)
	}
	// Removing: nil and empty store NULL.
	for _, none := range []map[string]int{nil, {}} {
		if err := d.SetKeyWeights(ctx, "new", map[string]int{"x": 2}); err != nil {
			t.Fatal(err)
		}
		if err := d.SetKeyWeights(ctx, "new", none); err != nil {
			t.Fatal(err)
		}
		if v := column("key_weights", "new"); v.Valid {
			t.Fatalf("key_weights %+v after removing, want NULL", v)
		}
	}
	if err := d.SetKeyWeights(ctx, "f", map[string]int{"a": 0}); err == nil {
		t.Fatal("weight 0 stored")
	}
}

// TestFairClaim checks claims of a fair queue: keys share a claim by
// weight, a lone key fills it, a flood key does not delay the others, a
// key limit bounds a heavy key, jobs without a key come last, and no
// slot row is made nor job held for fairness alone.
func TestFairClaim(t *testing.T) {
	ctx := context.Background()
	insert := func(t *testing.T, d *Driver, queue, key string, n int) {
		t.Helper()
		in := make([]driver.InsertParams, n)
		for i := range in {
			in[i] = driver.InsertParams{Queue: queue, Kind: "k", Key: key}
		}
		if _, err := d.Insert(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(t *testing.T, d *Driver, queue string, n int) map[string]int {
		t.Helper()
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: queue, Limit: n, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Held {
			t.Fatalf("claim of %d held", n)
		}
		byKey := map[string]int{}
		for _, j := range r.Rows {
			byKey[j.Key]++
		}
		return byKey
	}
	fair := func(t *testing.T, d *Driver, queue string, l driver.QueueLimits) {
		t.Helper()
		l.Fair = true
		if err := d.SetQueueLimits(ctx, queue, l); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("Weighted", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{})
		if err := d.SetKeyWeights(ctx, "q", map[string]int{"a": 3}); err != nil {
			t.Fatal(err)
		}
		insert(t, d, "q", "a", 20)
		insert(t, d, "q", "b", 20)
		if got := claim(t, d, "q", 8); got["a"] != 6 || got["b"] != 2 {
			t.Fatalf("claimed %v, want a 6 and b 2", got)
		}
		var slots int
		if err := d.DB().QueryRow(`SELECT count(*) FROM conveyor_key_slots`).Scan(&slots); err != nil || slots != 0 {
			t.Fatalf("%d key slots (%v), want none", slots, err)
		}
	})
	t.Run("TurnSpansClaims", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{})
		if err := d.SetKeyWeights(ctx, "q", map[string]int{"a": 3}); err != nil {
			t.Fatal(err)
		}
		insert(t, d, "q", "a", 10)
		insert(t, d, "q", "b", 10)
		var seq string
		for range 8 {
			for k, n := range claim(t, d, "q", 1) {
				if n != 1 {
					t.Fatalf("claim of 1 took %d of %s", n, k)
				}
				seq += k
			}
		}
		if seq != "aaabaaab" {
			t.Fatalf("claims of 1 took %s, want aaabaaab", seq)
		}
	})
	t.Run("Lone", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{})
		insert(t, d, "q", "a", 30)
		if got := claim(t, d, "q", 20); got["a"] != 20 {
			t.Fatalf("claimed %v, want a 20", got)
		}
	})
	t.Run("Flood", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{})
		insert(t, d, "q", "flood", 200)
		for i := range 10 {
			insert(t, d, "q", fmt.Sprintf("k%02d", i), 3)
		}
		small := 0
		for c := range 4 {
			got := claim(t, d, "q", 10)
			if c < 3 && len(got) != 10 {
				t.Fatalf("claim %d: %v, want 10 keys", c, got)
			}
			for k, n := range got {
				if k != "flood" {
					small += n
				}
			}
		}
		if small != 30 {
			t.Fatalf("%d small jobs claimed in 4 claims, want 30", small)
		}
	})
	t.Run("KeyMaxRunning", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{KeyMaxRunning: 2})
		if err := d.SetKeyWeights(ctx, "q", map[string]int{"a": 5}); err != nil {
			t.Fatal(err)
		}
		insert(t, d, "q", "a", 10)
		insert(t, d, "q", "b", 10)
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "q", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, j := range r.Rows {
			got[j.Key]++
		}
		if got["a"] != 2 || got["b"] != 2 || !r.Held {
			t.Fatalf("claimed %v (held %v), want a 2 and b 2, held", got, r.Held)
		}
	})
	t.Run("Unkeyed", func(t *testing.T) {
		d := migrated(t)
		fair(t, d, "q", driver.QueueLimits{})
		insert(t, d, "q", "", 5)
		insert(t, d, "q", "a", 3)
		insert(t, d, "q", "b", 3)
		if got := claim(t, d, "q", 6); got["a"] != 3 || got["b"] != 3 {
			t.Fatalf("claimed %v, want the keyed jobs first", got)
		}
		if got := claim(t, d, "q", 10); got[""] != 5 {
			t.Fatalf("claimed %v, want the 5 without a key", got)
		}
	})
}
