package drivertest

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// limits runs the suite's tests of queue limits: a concurrency limit
// never exceeded across concurrent claimers, every way an attempt ends
// freeing its slot, a rate limit's window, limits changed while jobs run.
func limits(t *testing.T, s suite) {
	ctx := context.Background()
	insert := func(t *testing.T, d driver.Driver, queue string, n int) []int64 {
		t.Helper()
		jobs := make([]driver.InsertParams, n)
		for i := range jobs {
			jobs[i] = job(queue, 0)
		}
		ids, err := d.Insert(ctx, jobs)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	complete := func(t *testing.T, d driver.Driver, r *driver.JobRow, state string) {
		t.Helper()
		o := driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: state}
		if state == driver.StateRetryable || state == driver.StateScheduled {
			o.RetryIn = time.Hour
		}
		applied, err := d.Complete(ctx, []driver.Outcome{o})
		if err != nil || len(applied) != 1 {
			t.Fatalf("complete %d as %s: applied %v, %v", r.ID, state, applied, err)
		}
	}

	t.Run("StoredBesidePause", func(t *testing.T) {
		d := s.setup(t)
		if got, err := d.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("limits of a fresh database: %v, %v", got, err)
		}
		want := driver.QueueLimits{MaxRunning: 5, Rate: 100, RatePeriod: time.Minute}
		setLimits(t, d, "q", want)
		if err := d.PauseQueue(ctx, "q", true); err != nil {
			t.Fatal(err)
		}
		if got, err := d.QueueLimits(ctx); err != nil || got["q"] != want || len(got) != 1 {
			t.Fatalf("limits after a pause: %v, %v; want q: %+v", got, err, want)
		}
		setLimits(t, d, "q", driver.QueueLimits{MaxRunning: 2})
		if paused, err := d.PausedQueues(ctx); err != nil || paused["q"].IsZero() {
			t.Fatalf("setting limits resumed the queue: %v, %v", paused, err)
		}
		if err := d.PauseQueue(ctx, "q", false); err != nil {
			t.Fatal(err)
		}
		if got, _ := d.QueueLimits(ctx); got["q"] != (driver.QueueLimits{MaxRunning: 2}) {
			t.Fatalf("limits after a resume: %v", got)
		}
		setLimits(t, d, "q", driver.QueueLimits{})
		setLimits(t, d, "never-limited", driver.QueueLimits{})
		if got, err := d.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("limits after removing them: %v, %v", got, err)
		}
	})

	t.Run("UnlimitedQueueClaimsAsClaim", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "u", 5)
		r := claimLimited(t, d, "u", 3, time.Minute)
		if len(r.Rows) != 3 || r.Held {
			t.Fatalf("claimed %d (held %v) of an unlimited queue, want 3 not held", len(r.Rows), r.Held)
		}
		r = claimLimited(t, d, "u", 3, time.Minute)
		if len(r.Rows) != 2 || r.Held {
			t.Fatalf("claimed %d (held %v), want the last 2 not held", len(r.Rows), r.Held)
		}
	})

	t.Run("EveryEndFreesTheSlot", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "c", 20)
		setLimits(t, d, "c", driver.QueueLimits{MaxRunning: 3})
		r := claimLimited(t, d, "c", 10, time.Minute)
		if len(r.Rows) != 3 || !r.Held || r.RetryIn != 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) with a limit of 3, want 3 held by the concurrency limit", len(r.Rows), r.Held, r.RetryIn)
		}
		if again := claimLimited(t, d, "c", 10, time.Minute); len(again.Rows) != 0 || !again.Held {
			t.Fatalf("claimed %d (held %v) with every slot taken", len(again.Rows), again.Held)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["c"].Running != 3 || u["c"].Limits.MaxRunning != 3 {
			t.Fatalf("usage %+v, %v; want 3 running of 3", u, err)
		}
		// A heartbeat keeps the slot.
		if _, err := d.Heartbeat(ctx, []driver.Lease{{ID: r.Rows[0].ID, Fence: r.Rows[0].Fence}}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if again := claimLimited(t, d, "c", 10, time.Minute); len(again.Rows) != 0 {
			t.Fatalf("a heartbeat freed a slot: claimed %d", len(again.Rows))
		}
		held := r.Rows
		// Each way an attempt ends frees exactly its slot.
		ends := []struct {
			name string
			end  func(r *driver.JobRow)
		}{
			{"completed", func(r *driver.JobRow) { complete(t, d, r, driver.StateCompleted) }},
			{"retryable", func(r *driver.JobRow) { complete(t, d, r, driver.StateRetryable) }},
			{"discarded", func(r *driver.JobRow) { complete(t, d, r, driver.StateDiscarded) }},
			{"cancelled outcome", func(r *driver.JobRow) { complete(t, d, r, driver.StateCancelled) }},
			{"snoozed", func(r *driver.JobRow) { complete(t, d, r, driver.StateScheduled) }},
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
			e.end(held[0])
			got := claimLimited(t, d, "c", 10, time.Minute)
			if len(got.Rows) != 1 {
				t.Fatalf("after an attempt %s: claimed %d, want the 1 slot it freed", e.name, len(got.Rows))
			}
			held = append(held[1:], got.Rows[0])
		}
		// A stale outcome frees nothing: release the first attempt, claim
		// the job again, then complete it under the released fence.
		first := held[0]
		if n, err := d.Release(ctx, []driver.Lease{{ID: first.ID, Fence: first.Fence}}); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		var again *driver.JobRow
		for again == nil || again.ID != first.ID {
			// The released job is due again; other jobs of the queue may
			// come first, each taking the one free slot: give them back.
			got := claimLimited(t, d, "c", 1, time.Minute)
			if len(got.Rows) != 1 {
				t.Fatalf("claimed %d looking for the released job", len(got.Rows))
			}
			again = got.Rows[0]
			if again.ID != first.ID {
				complete(t, d, again, driver.StateCompleted)
			}
		}
		if applied, err := d.Complete(ctx, []driver.Outcome{{ID: first.ID, Fence: first.Fence, Attempt: first.Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 0 {
			t.Fatalf("stale outcome: applied %v, %v", applied, err)
		}
		if got := claimLimited(t, d, "c", 10, time.Minute); len(got.Rows) != 0 {
			t.Fatalf("a stale outcome freed a slot: claimed %d", len(got.Rows))
		}
	})

	t.Run("RescueFreesTheSlot", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "r", 4)
		setLimits(t, d, "r", driver.QueueLimits{MaxRunning: 1})
		r := claimLimited(t, d, "r", 4, 200*time.Millisecond)
		if len(r.Rows) != 1 {
			t.Fatalf("claimed %d with a limit of 1", len(r.Rows))
		}
		time.Sleep(350 * time.Millisecond)
		if n, err := d.Rescue(ctx, 100); err != nil || n["r"] != 1 {
			t.Fatalf("rescue: %v, %v", n, err)
		}
		if got := claimLimited(t, d, "r", 4, time.Minute); len(got.Rows) != 1 {
			t.Fatalf("after a rescue: claimed %d, want the freed slot's 1", len(got.Rows))
		}
	})

	// A job run on demand takes no slot, so it leaves none held when it
	// ends. Where the limit is held by counting the queue's running jobs
	// (SQLite) it counts while it runs, and LimitUsage says so: the claim
	// beside it takes the limit less what LimitUsage counts running, and
	// the limit's 1 once it ended.
	t.Run("ClaimJobTakesNoSlot", func(t *testing.T) {
		d := s.setup(t)
		ids := insert(t, d, "j", 3)
		setLimits(t, d, "j", driver.QueueLimits{MaxRunning: 1})
		onDemand, err := d.ClaimJob(ctx, ids[2], time.Minute, "w")
		if err != nil {
			t.Fatal(err)
		}
		u, err := d.LimitUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		running := u["j"].Running
		if running != 0 && running != 1 {
			t.Fatalf("LimitUsage counts %d running beside one job run on demand, want 0 (slots) or 1 (a count)", running)
		}
		got := claimLimited(t, d, "j", 3, time.Minute)
		if len(got.Rows) != 1-running {
			t.Fatalf("claimed %d beside a job run on demand counted %d running, want %d", len(got.Rows), running, 1-running)
		}
		complete(t, d, onDemand, driver.StateCompleted)
		if len(got.Rows) == 0 {
			if got = claimLimited(t, d, "j", 3, time.Minute); len(got.Rows) != 1 {
				t.Fatalf("claimed %d once the job run on demand ended, want the limit's 1", len(got.Rows))
			}
		}
		if again := claimLimited(t, d, "j", 3, time.Minute); len(again.Rows) != 0 || !again.Held {
			t.Fatalf("claimed %d (held %v) with the limit's 1 running", len(again.Rows), again.Held)
		}
	})

	t.Run("LoweredAndRaised", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "l", 20)
		setLimits(t, d, "l", driver.QueueLimits{MaxRunning: 4})
		held := claimLimited(t, d, "l", 10, time.Minute).Rows
		if len(held) != 4 {
			t.Fatalf("claimed %d with a limit of 4", len(held))
		}
		setLimits(t, d, "l", driver.QueueLimits{MaxRunning: 2})
		for i := range 2 {
			if got := claimLimited(t, d, "l", 10, time.Minute); len(got.Rows) != 0 || !got.Held {
				t.Fatalf("%d running above a lowered limit of 2: claimed %d (held %v)", 4-i, len(got.Rows), got.Held)
			}
			complete(t, d, held[i], driver.StateCompleted)
		}
		// Two run, the new limit: still nothing.
		if got := claimLimited(t, d, "l", 10, time.Minute); len(got.Rows) != 0 {
			t.Fatalf("claimed %d with 2 running at a limit of 2", len(got.Rows))
		}
		complete(t, d, held[2], driver.StateCompleted)
		if got := claimLimited(t, d, "l", 10, time.Minute); len(got.Rows) != 1 {
			t.Fatalf("claimed %d with 1 running at a limit of 2, want 1", len(got.Rows))
		}
		setLimits(t, d, "l", driver.QueueLimits{MaxRunning: 5})
		if got := claimLimited(t, d, "l", 10, time.Minute); len(got.Rows) != 3 {
			t.Fatalf("claimed %d after raising the limit to 5 with 2 running, want 3", len(got.Rows))
		}
		setLimits(t, d, "l", driver.QueueLimits{})
		if got := claimLimited(t, d, "l", 10, time.Minute); len(got.Rows) != 10 || got.Held {
			t.Fatalf("claimed %d (held %v) after removing the limit, want 10", len(got.Rows), got.Held)
		}
	})

	t.Run("RateWindow", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "rate", 10)
		// An hour while the window must stay full (a loaded machine can
		// take a short period between two claims), then a short period
		// over the same starts, which lets them leave it.
		const period = time.Hour
		setLimits(t, d, "rate", driver.QueueLimits{Rate: 3, RatePeriod: period})
		r := claimLimited(t, d, "rate", 10, time.Minute)
		if len(r.Rows) != 3 || !r.Held || r.RetryIn <= 0 || r.RetryIn > period {
			t.Fatalf("claimed %d (held %v, retry in %v) at a rate of 3 per %v", len(r.Rows), r.Held, r.RetryIn, period)
		}
		for _, row := range r.Rows {
			complete(t, d, row, driver.StateCompleted) // ending attempts does not refill the window
		}
		again := claimLimited(t, d, "rate", 10, time.Minute)
		if len(again.Rows) != 0 || !again.Held || again.RetryIn <= 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) with the window full", len(again.Rows), again.Held, again.RetryIn)
		}
		u, err := d.LimitUsage(ctx)
		if err != nil || u["rate"].Started != 3 || u["rate"].NextStart <= 0 {
			t.Fatalf("usage %+v, %v; want 3 started and a next start", u, err)
		}
		const short = 200 * time.Millisecond
		setLimits(t, d, "rate", driver.QueueLimits{Rate: 3, RatePeriod: short})
		time.Sleep(short + 50*time.Millisecond)
		if got := claimLimited(t, d, "rate", 10, time.Minute); len(got.Rows) != 3 {
			t.Fatalf("claimed %d once the window had room, want 3", len(got.Rows))
		}
	})

	// A rate lowered and raised again within one window: the starts the
	// higher rate admitted before the change still count when it comes
	// back, so that no window holds more starts than the highest rate in
	// force during it. The lowering deleted the slots beyond the lower
	// rate with their starts, and the raise made them anew, open: a rate
	// of 4 admitted 6 starts within the hour.
	t.Run("RateLoweredAndRaisedInOneWindow", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "lr", 10)
		setLimits(t, d, "lr", driver.QueueLimits{Rate: 4, RatePeriod: time.Hour})
		if r := claimLimited(t, d, "lr", 10, time.Minute); len(r.Rows) != 4 {
			t.Fatalf("claimed %d at a rate of 4 per hour, want 4", len(r.Rows))
		}
		setLimits(t, d, "lr", driver.QueueLimits{Rate: 2, RatePeriod: time.Hour})
		if r := claimLimited(t, d, "lr", 10, time.Minute); len(r.Rows) != 0 || !r.Held {
			t.Fatalf("claimed %d (held %v) with 4 starts in the window of a rate lowered to 2, want none, held", len(r.Rows), r.Held)
		}
		setLimits(t, d, "lr", driver.QueueLimits{Rate: 4, RatePeriod: time.Hour})
		if r := claimLimited(t, d, "lr", 10, time.Minute); len(r.Rows) != 0 || !r.Held || r.RetryIn <= time.Minute {
			t.Fatalf("claimed %d (held %v, retry in %v) with 4 starts in the window of a rate raised back to 4, want none, held for most of the hour", len(r.Rows), r.Held, r.RetryIn)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["lr"].Started != 4 {
			t.Fatalf("usage %+v, %v; want 4 started", u["lr"], err)
		}
		// Raised above what ran: the rest of the window's room.
		setLimits(t, d, "lr", driver.QueueLimits{Rate: 5, RatePeriod: time.Hour})
		if r := claimLimited(t, d, "lr", 10, time.Minute); len(r.Rows) != 1 {
			t.Fatalf("claimed %d at a rate raised to 5 with 4 starts in the window, want 1", len(r.Rows))
		}
	})

	// A queue served by key (Fair, or a limit per key) whose own Rate
	// cut the claim says so (RateFull), with RetryIn until that window
	// has room: no job of any key starts before, so a claimer need not
	// claim again sooner (a process waited at most PollMin in a queue
	// served by key, whatever held it: a claim every 10ms for as long as
	// the queue's window stayed full). A claim cut by a key's limit while
	// the queue's window has room is not RateFull.
	t.Run("RateFullInAQueueServedByKey", func(t *testing.T) {
		d := s.setup(t)
		var jobs []driver.InsertParams
		for i := 0; i < 4; i++ {
			jobs = append(jobs, keyedJob("rf", "a", 0), keyedJob("rf", "b", 0), keyedJob("rk", "a", 0))
		}
		insertJobs(t, d, jobs...)
		setLimits(t, d, "rf", driver.QueueLimits{Rate: 3, RatePeriod: time.Hour, Fair: true, KeyMaxRunning: 4})
		r := claimLimited(t, d, "rf", 10, time.Minute)
		if len(r.Rows) != 3 || !r.Held || !r.RateFull || r.RetryIn < 50*time.Minute {
			t.Fatalf("claimed %d (held %v, rate full %v, retry in %v) at a rate of 3 per hour, want 3, held by the full window for about the hour", len(r.Rows), r.Held, r.RateFull, r.RetryIn)
		}
		r = claimLimited(t, d, "rf", 10, time.Minute)
		if len(r.Rows) != 0 || !r.Held || !r.RateFull || r.RetryIn < 50*time.Minute {
			t.Fatalf("claimed %d (held %v, rate full %v, retry in %v) with the window full, want none, held by it for about the hour", len(r.Rows), r.Held, r.RateFull, r.RetryIn)
		}
		// Cut by the key's limit, the window with room.
		setLimits(t, d, "rk", driver.QueueLimits{Rate: 10, RatePeriod: time.Hour, KeyMaxRunning: 2})
		r = claimLimited(t, d, "rk", 10, time.Minute)
		if len(r.Rows) != 2 || !r.Held || r.RateFull {
			t.Fatalf("claimed %d (held %v, rate full %v) of a key limited to 2 with room in the window, want 2, held, the rate not full", len(r.Rows), r.Held, r.RateFull)
		}
	})

	// Every claim is a start of the queue's rate, whatever becomes of its
	// attempt: released (given back unstarted), snoozed, or rescued and
	// claimed again, the job's next claim is another start, and none
	// gives its start back to the window.
	t.Run("RateCountsEveryClaim", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "ec", 2)
		setLimits(t, d, "ec", driver.QueueLimits{Rate: 4, RatePeriod: time.Hour})
		var starts []time.Time
		claim := func(want int) []*driver.JobRow {
			t.Helper()
			r := claimLimited(t, d, "ec", 1, 10*time.Millisecond)
			if len(r.Rows) != want {
				t.Fatalf("claim %d: %d rows (held %v), want %d", len(starts)+1, len(r.Rows), r.Held, want)
			}
			for _, row := range r.Rows {
				starts = append(starts, row.AttemptedAt)
			}
			return r.Rows
		}
		r := claim(1)[0]
		if n, err := d.Release(ctx, []driver.Lease{{ID: r.ID, Fence: r.Fence}}); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		r = claim(1)[0]
		o := driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateScheduled}
		if applied, err := d.Complete(ctx, []driver.Outcome{o}); err != nil || len(applied) != 1 {
			t.Fatalf("snooze: %v, %v", applied, err)
		}
		if _, err := d.Promote(ctx, 100); err != nil {
			t.Fatal(err)
		}
		claim(1)                          // the snoozed job, or the other
		time.Sleep(50 * time.Millisecond) // its lease expires
		if _, err := d.Rescue(ctx, 100); err != nil {
			t.Fatal(err)
		}
		claim(1)
		if got := claimLimited(t, d, "ec", 10, time.Minute); len(got.Rows) != 0 || !got.Held {
			t.Fatalf("claimed %d (held %v) after 4 starts at a rate of 4 per hour, want none, held", len(got.Rows), got.Held)
		}
		if u, err := d.LimitUsage(ctx); err != nil || u["ec"].Started != 4 {
			t.Fatalf("usage %+v, %v; want 4 started", u["ec"], err)
		}
	})

	// A queue with both limits whose claims the concurrency limit cuts
	// while its rate window has room: RetryIn stays 0 (a slot frees when
	// an attempt ends), never the age of the window's oldest start, which
	// is up to a period away (a claimer would sleep that long), or a
	// millisecond once that start left the window (a claimer would spin).
	t.Run("ConcurrencyCutWithRoomInTheRate", func(t *testing.T) {
		d := s.setup(t)
		insert(t, d, "cr2", 10)
		const period = 300 * time.Millisecond
		setLimits(t, d, "cr2", driver.QueueLimits{MaxRunning: 2, Rate: 100, RatePeriod: period})
		r := claimLimited(t, d, "cr2", 5, time.Minute)
		if len(r.Rows) != 2 || !r.Held || r.RetryIn != 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) at 2 running and a rate of 100, want 2 held by the concurrency limit, retry in 0", len(r.Rows), r.Held, r.RetryIn)
		}
		if again := claimLimited(t, d, "cr2", 5, time.Minute); len(again.Rows) != 0 || !again.Held || again.RetryIn != 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) with every concurrency slot taken, want none held, retry in 0", len(again.Rows), again.Held, again.RetryIn)
		}
		time.Sleep(period + 50*time.Millisecond)
		if again := claimLimited(t, d, "cr2", 5, time.Minute); len(again.Rows) != 0 || !again.Held || again.RetryIn != 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) with every concurrency slot taken and the starts out of the window, want none held, retry in 0", len(again.Rows), again.Held, again.RetryIn)
		}
		complete(t, d, r.Rows[0], driver.StateCompleted)
		if got := claimLimited(t, d, "cr2", 5, time.Minute); len(got.Rows) != 1 || !got.Held || got.RetryIn != 0 {
			t.Fatalf("claimed %d (held %v, retry in %v) with one slot free, want 1 held by the concurrency limit, retry in 0", len(got.Rows), got.Held, got.RetryIn)
		}
	})

	// Claimers race for a limit of 5 while each holds its jobs a little
	// before completing them: the jobs held at once, counted between a
	// claim's return and the outcome's call (so never more than the
	// database held), never exceed the limit. Starts against a rate are
	// checked from the claims' attempted_at (the database's clock): no
	// window of the period holds more than the rate.
	t.Run("ConcurrentClaimersHeldToLimits", func(t *testing.T) {
		d := s.setup(t)
		const jobs, limit, claimers = 150, 5, 6
		insert(t, d, "cc", jobs)
		setLimits(t, d, "cc", driver.QueueLimits{MaxRunning: limit})
		var held, peak, done atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, claimers)
		deadline := time.Now().Add(60 * time.Second)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < jobs && time.Now().Before(deadline) {
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "cc", Limit: 1 + rand.IntN(4), Lease: time.Minute, Worker: "w"})
					if err != nil {
						errs <- err
						return
					}
					if len(r.Rows) == 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					n := held.Add(int64(len(r.Rows)))
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
					held.Add(-int64(len(r.Rows)))
					outs := make([]driver.Outcome, len(r.Rows))
					for i, row := range r.Rows {
						outs[i] = driver.Outcome{ID: row.ID, Fence: row.Fence, Attempt: row.Attempt, State: driver.StateCompleted}
					}
					applied, err := d.Complete(ctx, outs)
					if err != nil || len(applied) != len(outs) {
						errs <- err
						return
					}
					done.Add(int64(len(applied)))
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if done.Load() != jobs {
			t.Fatalf("completed %d of %d jobs", done.Load(), jobs)
		}
		if p := peak.Load(); p > limit || p < 2 {
			t.Fatalf("peak of %d jobs held at once, want between 2 and the limit %d", p, limit)
		}

		const rate, period = 4, 300 * time.Millisecond
		insert(t, d, "cr", 16)
		setLimits(t, d, "cr", driver.QueueLimits{Rate: rate, RatePeriod: period})
		var mu sync.Mutex
		var starts []time.Time
		var wg2 sync.WaitGroup
		deadline = time.Now().Add(30 * time.Second)
		for range claimers {
			wg2.Add(1)
			go func() {
				defer wg2.Done()
				for time.Now().Before(deadline) {
					mu.Lock()
					n := len(starts)
					mu.Unlock()
					if n >= 16 {
						return
					}
					r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "cr", Limit: 3, Lease: time.Minute, Worker: "w"})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, row := range r.Rows {
						starts = append(starts, row.AttemptedAt)
					}
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
		wg2.Wait()
		if len(starts) != 16 {
			t.Fatalf("started %d of 16 rate-limited jobs", len(starts))
		}
		slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
		for i := rate; i < len(starts); i++ {
			if gap := starts[i].Sub(starts[i-rate]); gap < period {
				t.Fatalf("starts %d and %d are %v apart: %d starts within %v at a rate of %d", i-rate, i, gap, rate+1, period, rate)
			}
		}
	})
}
