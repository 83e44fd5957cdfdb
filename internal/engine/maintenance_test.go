package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// leadTTL is the leadership's time to live (docs/design.md: 15s, renewed
// every 5s).
const leadTTL = 15 * time.Second

// maintenanceConfig ticks the maintenance loop every 2ms, with the given
// rescue and prune intervals.
func maintenanceConfig(rescue, prune time.Duration) Config {
	cfg := testConfig(10 * time.Second)
	cfg.PromoteInterval, cfg.RescueInterval, cfg.PruneInterval = 2*time.Millisecond, rescue, prune
	cfg.CompletedRetention, cfg.DiscardedRetention = time.Hour, 2*time.Hour
	return cfg
}

// A process that does not win the leadership keeps asking for it, under
// its own id, and never maintains, promotes, rescues or prunes.
func TestMaintenanceNonLeaderNeverRunsTasks(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return false, nil }
	e := startEngine(t, d, maintenanceConfig(time.Millisecond, time.Millisecond), nil)
	waitFor(t, "twenty leadership attempts", func() bool { return d.count("trylead") >= 20 })
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"maintain", "promote", "rescue", "prune"} {
		if n := d.count(op); n != 0 {
			t.Fatalf("a process that is not the leader called %s %d times", op, n)
		}
	}
	for _, c := range d.callsOf("trylead") {
		if c.who != e.ID() || c.dur != leadTTL {
			t.Fatalf("TryLead(%q, %v), want (%q, %v)", c.who, c.dur, e.ID(), leadTTL)
		}
	}
}

// The leader runs the backend's Maintain and then promotes at every tick,
// rescues every RescueInterval and prunes every PruneInterval (with the
// configured retentions), and renews its leadership every third of its
// TTL, not at every tick.
func TestMaintenanceLeaderRunsTasksAtTheirIntervals(t *testing.T) {
	const rescueEvery = 25 * time.Millisecond
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	cfg := maintenanceConfig(rescueEvery, time.Hour)
	began := time.Now()
	e := startEngine(t, d, cfg, nil)
	waitFor(t, "four rescues", func() bool { return d.count("rescue") >= 4 })
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	for _, c := range d.allCalls() {
		if c.op == "trylead" {
			break
		}
		if c.op == "maintain" || c.op == "promote" || c.op == "rescue" || c.op == "prune" {
			t.Fatalf("%s before the first leadership attempt", c.op)
		}
	}
	// Each tick: Maintain, then the promotions.
	var last string
	maintains := 0
	for _, c := range d.allCalls() {
		switch c.op {
		case "maintain":
			if last == "maintain" {
				t.Fatal("Maintain twice in a row, without the promotion of its tick")
			}
			maintains++
		case "promote":
			if last != "maintain" && last != "promote" {
				t.Fatalf("a promotion after %s: each tick's promotions follow its Maintain", last)
			}
		default:
			continue
		}
		last = c.op
	}
	rescues, promotes := d.callsOf("rescue"), d.callsOf("promote")
	// Rescues run at ticks at least RescueInterval apart.
	if max := 1 + int(took/rescueEvery); len(rescues) > max {
		t.Fatalf("%d rescues in %v, want at most %d at one per %v", len(rescues), took, max, rescueEvery)
	}
	// (Close may end the last tick between its Maintain and promotion.)
	if maintains != len(promotes) && maintains != len(promotes)+1 {
		t.Fatalf("%d Maintain calls for %d promotions: one each per tick", maintains, len(promotes))
	}
	if len(promotes) < len(rescues) {
		t.Fatalf("%d promotions for %d rescues: the leader promotes at every tick", len(promotes), len(rescues))
	}
	for i := 1; i < len(promotes); i++ {
		if gap := promotes[i].at.Sub(promotes[i-1].at); gap < cfg.PromoteInterval {
			t.Fatalf("promotions %v apart, want at least PromoteInterval %v", gap, cfg.PromoteInterval)
		}
	}
	prunes := d.callsOf("prune")
	if len(prunes) != 1 {
		t.Fatalf("%d prunes, want one: PruneInterval is an hour", len(prunes))
	}
	if p := prunes[0]; p.dur != cfg.CompletedRetention || p.dur2 != cfg.DiscardedRetention {
		t.Fatalf("pruned with retentions %v, %v; want %v, %v", p.dur, p.dur2, cfg.CompletedRetention, cfg.DiscardedRetention)
	}
	renewals := 0 // the resignation at Stop (a negative ttl) is not one
	for _, c := range d.callsOf("trylead") {
		if c.dur > 0 {
			renewals++
		}
	}
	if max := 1 + int(took/(leadTTL/3)); renewals > max {
		t.Fatalf("%d leadership renewals in %v, want at most %d (one per %v)", renewals, took, max, leadTTL/3)
	}
}

// A maintenance task that comes back with a full batch runs again at once
// until the backlog is drained, and the fetchers of the queues it made
// work available in are woken.
func TestMaintenanceDrainsFullBatchesAndWakesFetchers(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	var rescues, prunes atomic.Int64
	d.rescue = func() (map[string]int, error) {
		if rescues.Add(1) == 1 {
			return map[string]int{"elsewhere": 1000}, nil // a full batch
		}
		return nil, nil
	}
	d.prune = func() (int64, error) {
		if prunes.Add(1) == 1 {
			return 1000, nil
		}
		return 5, nil
	}
	var armed, promoted atomic.Bool
	d.promote = func() (map[string]int, error) {
		if armed.Load() && promoted.CompareAndSwap(false, true) {
			d.add(jobIn("q", 1, 1)) // a retryable job became due
			return map[string]int{"q": 1}, nil
		}
		return nil, nil
	}
	cfg := maintenanceConfig(time.Hour, time.Hour)
	cfg.PollMin, cfg.PollMax = time.Hour, time.Hour // only a wake-up can start a claim
	ran := make(chan int64, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	waitFor(t, "the first round and an idle fetcher", func() bool { return d.count("prune") >= 2 && d.idle("q") })
	armed.Store(true)
	if id := recv(t, "the promoted job to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := d.count("rescue"); n != 2 {
		t.Fatalf("%d rescues, want 2: the full batch and the one that drained it (RescueInterval is an hour)", n)
	}
	if n := d.count("prune"); n != 2 {
		t.Fatalf("%d prunes, want 2: the full batch and the one that drained it", n)
	}
	if got, want := e.Metrics().Rescued.Load(), int64(1000); got != want {
		t.Fatalf("rescued %d, want %d", got, want)
	}
	if got, want := e.Metrics().Pruned.Load(), int64(1005); got != want {
		t.Fatalf("pruned %d, want %d", got, want)
	}
	if got := e.Metrics().Promoted.Load(); got != 1 {
		t.Fatalf("promoted %d, want 1", got)
	}
}

// A Maintain that keeps failing (no privilege to rotate a segment, a
// full disk) does not stop the rest of the round: scheduled and
// retryable jobs are still promoted, expired leases still rescued and
// old jobs still pruned, round after round.
func TestMaintenanceFailingMaintainStillPromotesRescuesPrunes(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	d.maintain = func() (map[string]int, error) {
		return nil, errors.New("permission denied for schema public")
	}
	var promoted, rescued atomic.Bool
	d.promote = func() (map[string]int, error) {
		if promoted.CompareAndSwap(false, true) {
			d.add(jobIn("q", 1, 1)) // a scheduled job became due
			return map[string]int{"q": 1}, nil
		}
		return nil, nil
	}
	d.rescue = func() (map[string]int, error) {
		if rescued.CompareAndSwap(false, true) {
			return map[string]int{"q": 1}, nil // an expired lease
		}
		return nil, nil
	}
	cfg := maintenanceConfig(2*time.Millisecond, 2*time.Millisecond)
	ran := make(chan int64, 1)
	e := startEngine(t, d, cfg, map[string]Handler{"k": func(_ context.Context, row *driver.JobRow) error {
		ran <- row.ID
		return nil
	}})
	if id := recv(t, "the promoted job to run", ran); id != 1 {
		t.Fatalf("ran job %d, want 1", id)
	}
	waitFor(t, "a rescue, a second promotion and a prune after failed Maintains", func() bool {
		return e.Metrics().Rescued.Load() == 1 && d.count("promote") >= 2 && d.count("prune") >= 2
	})
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.Metrics().Promoted.Load(); got != 1 {
		t.Fatalf("promoted %d, want 1", got)
	}
	if n := d.count("maintain"); n < 2 {
		t.Fatalf("%d Maintain calls, want one per round", n)
	}
	if got := e.Metrics().DBErrors.Load(); got < 2 {
		t.Fatalf("%d database errors counted, want one per failed Maintain", got)
	}
}

// The leader logs each batch whose callback FireBatches could not
// enqueue on a line of its own, with the batch's id and the reason.
func TestMaintenanceLogsEachFailedBatch(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	d.fireBatches = func(func(int64) bool) (map[int64]int64, error) {
		return map[int64]int64{3: 30}, &driver.BatchFireError{Failed: []driver.BatchFailure{
			{BatchID: 1, Err: errors.New("bad one")}, {BatchID: 2, Err: errors.New("bad two")}}}
	}
	var log lockedBuffer
	cfg := maintenanceConfig(time.Hour, time.Hour)
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	e := startEngine(t, d, cfg, nil)
	waitFor(t, "a line for each failed batch", func() bool {
		s := log.String()
		return strings.Contains(s, `batch=1 error="bad one"`) && strings.Contains(s, `batch=2 error="bad two"`)
	})
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A batch whose callback fails is not tried again at every round: the
// leader skips it for the backoff (an hour here, so that no round of the
// test comes after it), while the other batches fire at once, and a
// batch that fired is no longer asked about.
func TestMaintenanceBacksOffFailingBatch(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	var mu sync.Mutex
	tries := map[int64]int{}
	firedGood := false
	d.fireBatches = func(skip func(int64) bool) (map[int64]int64, error) {
		mu.Lock()
		defer mu.Unlock()
		fired := map[int64]int64{}
		var fe driver.BatchFireError
		for _, id := range []int64{1, 2} {
			if (id == 2 && firedGood) || (skip != nil && skip(id)) {
				continue
			}
			tries[id]++
			if id == 1 {
				fe.Failed = append(fe.Failed, driver.BatchFailure{BatchID: 1, Err: errors.New("bad callback")})
				continue
			}
			fired[id], firedGood = 20, true
		}
		if len(fe.Failed) > 0 {
			return fired, &fe
		}
		return fired, nil
	}
	var log lockedBuffer
	cfg := maintenanceConfig(time.Hour, time.Hour)
	cfg.BatchFireBackoff, cfg.BatchFireBackoffMax = time.Hour, 4*time.Hour
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	e := startEngine(t, d, cfg, nil)
	waitFor(t, "twenty firing rounds", func() bool { return d.count("fire") >= 20 })
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if tries[1] != 1 || tries[2] != 1 {
		t.Fatalf("tries by batch %v over %d rounds; want the failing batch 1 tried once (then backed off) and batch 2 fired once", tries, d.count("fire"))
	}
	if s := log.String(); !strings.Contains(s, `batch=1 error="bad callback" retry_in=1h0m0s`) {
		t.Fatalf("log lacks the failure with its backoff:\n%s", s)
	}
}

// fireBackoff doubles a failing batch's wait at each failure in a row up
// to its cap, forgets a batch that fired, one not tried again long after
// its wait, and every batch when the leadership is lost.
func TestFireBackoff(t *testing.T) {
	b := fireBackoff{base: time.Second, max: 5 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	if b.skip(t0) != nil {
		t.Fatal("a skip with no failing batch")
	}
	var waits []time.Duration
	now := t0
	for range 5 {
		w := b.failed(7, now)
		waits = append(waits, w)
		if skip := b.skip(now.Add(w - time.Millisecond)); !skip(7) || skip(8) {
			t.Fatalf("just before its wait of %v ends: skip(7) %v, skip(8) %v; want true, false", w, skip(7), skip(8))
		}
		if b.skip(now.Add(w))(7) {
			t.Fatalf("skipped once its wait of %v ended", w)
		}
		now = now.Add(w)
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	b.fired(7)
	if b.failed(7, now) != time.Second {
		t.Fatal("a batch that fired kept its failures")
	}
	b.failed(9, now)
	b.forget(now.Add(time.Second + 5*time.Second))
	if _, ok := b.m[9]; !ok {
		t.Fatal("forgot a batch within the cap of its wait")
	}
	b.forget(now.Add(time.Second + 5*time.Second + time.Millisecond))
	if len(b.m) != 0 {
		t.Fatalf("entries %v kept long after their wait", b.m)
	}
	b.failed(3, now)
	b.reset()
	if b.skip(now) != nil {
		t.Fatal("entries kept after reset")
	}
	if w := (&fireBackoff{}).failed(1, now); w != 0 {
		t.Fatalf("wait %v with no base, want 0 (no backoff)", w)
	}
}

// The leader deletes the rows of periodic schedules that no process
// recorded or touched for SchedulePruneAge, at the prune interval, with
// that age; with no age it deletes none.
func TestMaintenancePrunesRemovedSchedules(t *testing.T) {
	for _, age := range []time.Duration{30 * 24 * time.Hour, 0} {
		d := &fakeDriver{}
		d.tryLead = func() (bool, error) { return true, nil }
		cfg := maintenanceConfig(time.Hour, time.Hour)
		cfg.SchedulePruneAge = age
		e := startEngine(t, d, cfg, nil)
		waitFor(t, "a prune and ten rounds", func() bool { return d.count("prune") >= 1 && d.count("promote") >= 10 })
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		calls := d.callsOf("pruneschedules")
		switch {
		case age == 0 && len(calls) != 0:
			t.Fatalf("pruned schedules %d times with no age", len(calls))
		case age > 0 && (len(calls) != 1 || calls[0].dur != age):
			t.Fatalf("schedule prunes %+v; want one (PruneInterval is an hour) with age %v", calls, age)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A leader that stops gives its leadership up (TryLead with a negative
// ttl, which expires its row at once), so that another process takes over
// promotion at its next tick rather than after the rest of the 15s TTL,
// during which no scheduled or retryable job would become due. A process
// that did not lead does not touch the row.
func TestMaintenanceLeaderResignsAtStop(t *testing.T) {
	for _, lead := range []bool{true, false} {
		d := &fakeDriver{}
		d.tryLead = func() (bool, error) { return lead, nil }
		e := startEngine(t, d, maintenanceConfig(time.Hour, time.Hour), nil)
		waitFor(t, "a leadership attempt", func() bool { return d.count("trylead") >= 1 })
		if lead {
			waitFor(t, "a promotion", func() bool { return d.count("promote") >= 1 })
		}
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		calls := d.callsOf("trylead")
		last := calls[len(calls)-1]
		switch {
		case lead && (last.who != e.ID() || last.dur >= 0):
			t.Fatalf("leader stopped; last TryLead(%q, %v), want (%q, a negative ttl)", last.who, last.dur, e.ID())
		case !lead && last.dur != leadTTL:
			t.Fatalf("a process that did not lead called TryLead(%q, %v) at Stop", last.who, last.dur)
		}
	}
}
