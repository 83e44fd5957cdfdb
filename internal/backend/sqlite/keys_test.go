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
		{driver.QueueLimits{KeyRate: -1, KeyRatePeriod: time.Hour}, "KeyRate"},
		{driver.QueueLimits{KeyRate: maxKeyMaxRunning + 1, KeyRatePeriod: time.Hour}, "KeyRate"},
		{driver.QueueLimits{KeyRate: 1, KeyRatePeriod: time.Nanosecond}, "KeyRatePeriod"},
		{driver.QueueLimits{KeyRatePeriod: time.Second}, "KeyRatePeriod"},
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
	// A claim makes only the slots it takes.
	if free, held := slots(); free != 0 || held != 2 {
		t.Fatalf("after the claim: %d free, %d held key slots; want 0 and 2", free, held)
	}
	// Free slots a later attempt's end would leave, recently used.
	if _, err := d.DB().Exec(`INSERT INTO conveyor_key_slots (queue, lkey, n, used_at)
		SELECT 's', k.value, n.value, CAST(unixepoch('subsec') * 1000000 AS INTEGER)
		  FROM json_each('["a","b"]') AS k, json_each('[1,2]') AS n`); err != nil {
		t.Fatal(err)
	}
	if free, held := slots(); free != 4 || held != 2 {
		t.Fatalf("with free slots: %d free, %d held key slots; want 4 and 2", free, held)
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

// TestKeyRateSlotsSwept checks the rate slots of keys: made by the claims
// that use them, stamped, untouched by the ends of attempts and by the
// sweep of idle concurrency slots, and deleted by Rescue's sweep once
// stamped more than max(KeyRatePeriod, a minute) ago (or never), beyond
// a lowered KeyRate, or of a queue without one.
func TestKeyRateSlotsSwept(t *testing.T) {
	d := migrated(t)
	ctx := context.Background()
	rateSlots := func(queue string) (n int) {
		t.Helper()
		if err := d.DB().QueryRow(`SELECT count(*) FROM conveyor_key_slots WHERE queue = ? AND n < 0 AND job_id IS NULL AND fence IS NULL`, queue).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	age := func(queue string, by time.Duration) {
		t.Helper()
		if _, err := d.DB().Exec(`UPDATE conveyor_key_slots SET used_at = used_at - ? WHERE queue = ? AND n < 0`, by.Microseconds(), queue); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func() {
		t.Helper()
		if _, err := d.Rescue(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	var jobs []driver.InsertParams
	for i := 0; i < 3; i++ {
		jobs = append(jobs, driver.InsertParams{Queue: "r", Kind: "k", Key: "a"}, driver.InsertParams{Queue: "r", Kind: "k", Key: "b"})
	}
	jobs = append(jobs, driver.InsertParams{Queue: "g", Kind: "k", Key: "c"}, driver.InsertParams{Queue: "g", Kind: "k", Key: "c"})
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "r", driver.QueueLimits{KeyMaxRunning: 5, KeyRate: 3, KeyRatePeriod: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "g", driver.QueueLimits{KeyRate: 2, KeyRatePeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var claimed []*driver.JobRow
	for _, q := range []string{"r", "g"} {
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: q, Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, r.Rows...)
	}
	if len(claimed) != 8 || rateSlots("r") != 6 || rateSlots("g") != 2 {
		t.Fatalf("claimed %d; rate slots r %d, g %d; want 8 claimed, 6 and 2 slots", len(claimed), rateSlots("r"), rateSlots("g"))
	}
	// Each stamped with the database time of the start it admitted.
	var stamped int
	if err := d.DB().QueryRow(`SELECT count(*) FROM conveyor_key_slots AS s
	                            WHERE s.n < 0 AND EXISTS (SELECT 1 FROM conveyor_jobs AS j
	                                                       WHERE j.queue = s.queue AND j.lkey = s.lkey AND j.attempted_at = s.used_at)`).Scan(&stamped); err != nil || stamped != 8 {
		t.Fatalf("%d rate slots stamped with their start's attempted_at (%v), want 8", stamped, err)
	}
	// The ends of the attempts free the concurrency slots only.
	for _, row := range claimed {
		if _, err := d.Complete(ctx, []driver.Outcome{{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}}); err != nil {
			t.Fatal(err)
		}
	}
	// Stamped 90s ago: older than the minute after which idle
	// concurrency slots go, within r's period of 2 minutes.
	age("r", 90*time.Second)
	if _, err := d.DB().Exec(`INSERT INTO conveyor_key_slots (queue, lkey, n, used_at) VALUES ('r', 'z', -1, 0)`); err != nil {
		t.Fatal(err)
	}
	sweep()
	if got := rateSlots("r"); got != 6 {
		t.Fatalf("after the attempts ended and a sweep: %d rate slots of r, want its 6 stamped within its period (the never-stamped one gone)", got)
	}
	if got := rateSlots("g"); got != 2 {
		t.Fatalf("%d rate slots of g, want 2", got)
	}
	// Lowered: the slots beyond the rate stay while stamped within the
	// period (claims ignore them; the rate raised again counts them);
	// removed: all of them go.
	if err := d.SetQueueLimits(ctx, "r", driver.QueueLimits{KeyMaxRunning: 5, KeyRate: 2, KeyRatePeriod: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "g", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	sweep()
	if got := rateSlots("r"); got != 6 {
		t.Fatalf("after lowering r's rate to 2: %d rate slots, want the 6 stamped within the period", got)
	}
	if got := rateSlots("g"); got != 0 {
		t.Fatalf("after removing g's rate: %d rate slots, want none", got)
	}
	// Out of the period: gone.
	age("r", 31*time.Second)
	sweep()
	if got := rateSlots("r"); got != 0 {
		t.Fatalf("rate slots stamped more than a period ago: %d left, want none", got)
	}
}
