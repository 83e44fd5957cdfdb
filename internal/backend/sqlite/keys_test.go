package sqlite

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestKeyLimitsValidation checks that limits and keys the schema cannot
// hold are refused with a message naming the field.
func TestKeyLimitsValidation(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	for _, tc := range []struct {
		l    driver.QueueLimits
		want string
	}{
		{driver.QueueLimits{KeyMaxRunning: -1}, "KeyMaxRunning"},
		{driver.QueueLimits{KeyMaxRunning: maxKeyMaxRunning + 1}, "KeyMaxRunning"},
		{driver.QueueLimits{Ordered: true, KeyMaxRunning: 2}, "Ordered"},
		{driver.QueueLimits{OrderedMoveOn: true}, "OrderedMoveOn"},
	} {
		if err := d.SetQueueLimits(ctx, "q", tc.l); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("limits %+v: %v, want an error naming %s", tc.l, err, tc.want)
		}
	}
	if err := d.SetQueueLimits(ctx, "q", driver.QueueLimits{Ordered: true, KeyMaxRunning: 1}); err != nil {
		t.Fatalf("Ordered with KeyMaxRunning 1: %v", err)
	}
	for _, key := range []string{strings.Repeat("k", driver.MaxKeyBytes+1), "a\x00b", "\xff"} {
		if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Key: key}}); err == nil || !strings.Contains(err.Error(), "limit key") {
			t.Errorf("key %q: %v, want it refused", key, err)
		}
	}
	if ids, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Key: strings.Repeat("é", driver.MaxKeyBytes/2)}}); err != nil || len(ids) != 1 {
		t.Fatalf("key of %d bytes: %v, %v", driver.MaxKeyBytes/2*2, ids, err)
	}
}

// TestKeySlotsSwept checks Rescue's sweep of the key slots: the free ones
// of a queue whose key limits were removed or lowered go, the held ones
// stay until their attempts end, and the keys of batch members and of
// jobs with metadata are stored.
func TestKeySlotsSwept(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	slots := func() (free, held int) {
		t.Helper()
		if err := d.DB().QueryRow(`SELECT count(*) FILTER (WHERE job_id IS NULL), count(*) FILTER (WHERE job_id IS NOT NULL) FROM conveyor_key_slots`).Scan(&free, &held); err != nil {
			t.Fatal(err)
		}
		return free, held
	}
	jobs := []driver.InsertParams{
		{Queue: "s", Kind: "k", Key: "a"},
		{Queue: "s", Kind: "k", Key: "b", Meta: []byte(`{"m":"1"}`)},
	}
	ids, _, err := d.InsertBatches(ctx, nil, jobs, []driver.BatchParams{{Callback: driver.InsertParams{Queue: "cb", Kind: "k"}, Jobs: []int{0, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		j, err := d.GetJob(ctx, id)
		if err != nil || j.Key != jobs[i].Key || (i == 1 && string(j.Meta) != `{"m":"1"}`) {
			t.Fatalf("job %d: %+v, %v", id, j, err)
		}
	}
	if err := d.SetQueueLimits(ctx, "s", driver.QueueLimits{KeyMaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "s", Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil || len(r.Rows) != 2 {
		t.Fatalf("claimed %d, %v", len(r.Rows), err)
	}
	if free, held := slots(); free != 4 || held != 2 {
		t.Fatalf("after the claim: %d free, %d held key slots; want 4 and 2", free, held)
	}
	// Lowered to 1: the free slots above it go at the sweep.
	if err := d.SetQueueLimits(ctx, "s", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if free, held := slots(); free != 0 || held != 2 {
		t.Fatalf("after lowering to 1: %d free, %d held key slots; want 0 and 2", free, held)
	}
	// Removed: the held slots stay until their attempts end, then go.
	if err := d.SetQueueLimits(ctx, "s", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if free, held := slots(); free != 0 || held != 2 {
		t.Fatalf("after removing the limits: %d free, %d held key slots; want 0 and 2", free, held)
	}
	if _, err := d.Release(ctx, []driver.Lease{{ID: r.Rows[0].ID, Fence: r.Rows[0].Fence}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Cancel(ctx, r.Rows[1].ID); err != nil {
		t.Fatal(err)
	}
	if free, held := slots(); free != 2 || held != 0 {
		t.Fatalf("after the attempts ended: %d free, %d held key slots; want 2 and 0", free, held)
	}
	if _, err := d.Rescue(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if free, held := slots(); free != 0 || held != 0 {
		t.Fatalf("after the sweep: %d free, %d held key slots; want none", free, held)
	}
}

// TestLargeKeyLimitMakesFewSlots checks that a key's slot rows are made
// as claims use them, not all of a large KeyMaxRunning at once.
func TestLargeKeyLimitMakesFewSlots(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	var jobs []driver.InsertParams
	for i := 0; i < 5; i++ {
		jobs = append(jobs, driver.InsertParams{Queue: "big", Kind: "k", Key: "a"})
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "big", driver.QueueLimits{KeyMaxRunning: maxKeyMaxRunning}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{2, 3} {
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "big", Limit: want, Lease: time.Minute, Worker: "w"})
		if err != nil || len(r.Rows) != want || r.Held {
			t.Fatalf("claimed %d (held %v), %v; want %d", len(r.Rows), r.Held, err, want)
		}
	}
	var n int
	if err := d.DB().QueryRow(`SELECT count(*) FROM conveyor_key_slots`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d key slot rows (%v) for 5 jobs running, want 5", n, err)
	}
}
