package conveyor_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type tick struct{}

func (tick) Kind() string { return "tick" }

// slotsOf lists the scheduled times of every job of kind tick, paging.
func slotsOf(t *testing.T, c *conveyor.Client[any]) []time.Time {
	t.Helper()
	var out []time.Time
	var after int64
	for {
		js, err := c.Jobs(context.Background(), conveyor.JobFilter{Kind: "tick", AfterID: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(js) == 0 {
			break
		}
		for _, j := range js {
			out = append(out, j.ScheduledAt)
			after = j.ID
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Before(out[b]) })
	return out
}

// ownSchedule is a Schedule of the test's own: AddPeriodic refuses
// Every under a second but does not check an application's schedule, so
// the tests run 100ms slots through it to be quick.
type ownSchedule struct{ conveyor.Schedule }

// TestPeriodicExactlyOncePerSlot: three clients run one schedule of 100ms
// slots; midway the first is closed and a new one started. Every slot from
// the first to the last has exactly one job.
func TestPeriodicExactlyOncePerSlot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		const step = 100 * time.Millisecond
		newClient := func(first bool) *conveyor.Client[any] {
			cfg := fast(prefix)
			cfg.AllowUnregisteredKinds = true
			var c *conveyor.Client[any]
			if first {
				c = openDropped(t, dsn, cfg)
			} else {
				c = open(t, dsn, cfg)
			}
			if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "ticker", Schedule: ownSchedule{conveyor.Every(step)}, Args: tick{},
				Opts: &conveyor.EnqueueOpts{Queue: "ticks"}}); err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			return c
		}
		clients := []*conveyor.Client[any]{newClient(true), newClient(false), newClient(false)}
		// run is how many slots follow the first one step apart each, and
		// whether a slot was enqueued twice among them.
		run := func(slots []time.Time) (n int, twice bool) {
			for n = 1; n < len(slots); n++ {
				if d := slots[n].Sub(slots[n-1]); d == 0 {
					return n, true
				} else if d != step {
					break
				}
			}
			return min(n, len(slots)), false
		}
		// Slots are counted, not waited for by the clock: a loaded
		// machine may start the clients late, never skip a slot. A
		// process stalled on a loaded machine catches up later, so the
		// wait is for n slots in a row from the first, not n slots.
		waitSlots := func(n int) int {
			t.Helper()
			deadline := time.Now().Add(60 * time.Second)
			for {
				slots := slotsOf(t, clients[1])
				got, twice := run(slots)
				if twice {
					t.Fatalf("slot %v enqueued twice", slots[got])
				}
				if got >= n {
					return got
				}
				if time.Now().After(deadline) {
					t.Fatalf("fewer than %d slots in a row within 60s: %d, then %v", n, got, slots[got:min(got+3, len(slots))])
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		waitSlots(15)
		// The first client goes away (its tables stay: openDropped drops
		// them at the end of the test) and a new process takes its place.
		if err := clients[0].Stop(ctx); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, newClient(false))
		checked := waitSlots(len(slotsOf(t, clients[1])) + 15)
		for _, c := range clients[1:] {
			if err := c.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The slots after those checked in a row may have been left to a
		// process that was still catching up when it stopped; none is
		// enqueued twice.
		slots := slotsOf(t, clients[1])
		if got, twice := run(slots); twice {
			t.Fatalf("slot %v enqueued twice", slots[got])
		} else if got < checked {
			t.Fatalf("%d slots in a row after the stop, %d before it", got, checked)
		}
		seen := map[int64]bool{}
		for _, s := range slots {
			if seen[s.UnixNano()] {
				t.Fatalf("slot %v enqueued twice", s)
			}
			seen[s.UnixNano()] = true
		}
		ss, err := clients[1].Schedules(ctx)
		if err != nil || len(ss) != 1 || ss[0].Name != "ticker" || !ss[0].Registered || ss[0].Spec != "every 100ms" ||
			!ss[0].Last.Equal(slots[len(slots)-1]) || ss[0].LastJobID == 0 || !ss[0].Next.After(ss[0].Last) {
			t.Fatalf("schedules %+v, %v; last slot %v", ss, err, slots[len(slots)-1])
		}
	})
}

// TestPeriodicMissedSlots: slots that pass while no client runs the
// schedule are skipped, or the latest of them run once with RunMissed.
func TestPeriodicMissedSlots(t *testing.T) {
	for _, runMissed := range []bool{false, true} {
		t.Run(map[bool]string{false: "skipped", true: "run-once"}[runMissed], func(t *testing.T) {
			ctx := context.Background()
			dsn := backends[0].dsn(t)
			const step = time.Second
			// run runs the schedule in a new client until done says so.
			run := func(done func(c *conveyor.Client[any]) bool) *conveyor.Client[any] {
				cfg := fast(testdb.Prefix())
				cfg.TablePrefix = "conveyor_"
				cfg.AllowUnregisteredKinds = true
				c := open(t, dsn, cfg)
				if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "p", Schedule: conveyor.Every(step), Args: tick{}, RunMissed: runMissed,
					Opts: &conveyor.EnqueueOpts{Queue: "ticks"}}); err != nil {
					t.Fatal(err)
				}
				if err := c.Start(ctx); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for !done(c) {
					if time.Now().After(deadline) {
						t.Fatal("the periodic loop made no progress within 30s")
					}
					time.Sleep(20 * time.Millisecond)
				}
				if err := c.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				return c
			}
			started := time.Now()
			c := run(func(c *conveyor.Client[any]) bool { return time.Since(started) > time.Second && len(slotsOf(t, c)) > 0 })
			before := slotsOf(t, c)
			if len(before) == 0 {
				t.Fatal("no slot enqueued in a second of 200ms slots")
			}
			stoppedAt := time.Now()
			// Slots pass with nothing running; then restart just after a
			// slot, so that the restarted loop, however slow a loaded
			// machine makes its start, reads the clock before the next
			// slot: the latest missed slot is then the one just passed,
			// before restartedAt.
			time.Sleep(2 * step)
			time.Sleep(time.Until(time.Now().Truncate(step).Add(step + 20*time.Millisecond)))
			restartedAt := time.Now()
			// Until a slot after the restart exists: the missed ones were
			// handled before the first new slot.
			c = run(func(c *conveyor.Client[any]) bool {
				ss := slotsOf(t, c)
				return len(ss) > 0 && ss[len(ss)-1].After(restartedAt)
			})
			after := slotsOf(t, c)[len(before):]
			var missed []time.Time
			for _, s := range after {
				if s.After(before[len(before)-1]) && s.Before(restartedAt) && !s.Before(stoppedAt.Add(-step)) {
					missed = append(missed, s)
				}
			}
			want := 0
			if runMissed {
				want = 1
			}
			if len(missed) != want {
				t.Fatalf("slots enqueued for the time nothing ran: %v, want %d", missed, want)
			}
			if runMissed && restartedAt.Sub(missed[0]) > step {
				t.Fatalf("run-once slot %v is not the latest missed before %v", missed[0], restartedAt)
			}
		})
	}
}

// noSlot is a schedule whose slots are all past.
type noSlot struct{}

func (noSlot) Next(time.Time) time.Time { return time.Time{} }
func (noSlot) String() string           { return "never" }

// TestAddPeriodicRefusesBadJobs: bad names, schedules and options.
func TestAddPeriodicRefusesBadJobs(t *testing.T) {
	c := open(t, backends[0].dsn(t), fast(testdb.Prefix()))
	for _, p := range []conveyor.PeriodicJob{
		{Name: "bad name", Schedule: conveyor.Every(time.Second), Args: tick{}},
		{Name: "nosched", Args: tick{}},
		{Name: "tiny", Schedule: conveyor.Every(time.Microsecond), Args: tick{}},
		{Name: "millisecond", Schedule: conveyor.Every(time.Millisecond), Args: tick{}},
		{Name: "under-a-second", Schedule: conveyor.Every(999 * time.Millisecond), Args: tick{}},
		{Name: "nanoseconds", Schedule: conveyor.Every(time.Second + time.Nanosecond), Args: tick{}},
		{Name: "negative", Schedule: conveyor.Every(-time.Hour), Args: tick{}},
		{Name: "noargs", Schedule: conveyor.Every(time.Second)},
		{Name: "runat", Schedule: conveyor.Every(time.Second), Args: tick{}, Opts: &conveyor.EnqueueOpts{Delay: time.Second}},
	} {
		err := c.AddPeriodic(p)
		switch {
		case err == nil:
			t.Errorf("AddPeriodic(%+v) succeeded", p)
		case p.Name == "millisecond" && !strings.Contains(err.Error(), "Every(1ms): the interval must be at least 1s"):
			t.Errorf("AddPeriodic of Every(1ms): %v, want the interval and the minimum named", err)
		case p.Name == "nanoseconds" && !strings.Contains(err.Error(), "whole number of microseconds"):
			t.Errorf("AddPeriodic of Every(1s+1ns): %v, want the precision named", err)
		}
	}
	ok := conveyor.PeriodicJob{Name: "ok", Schedule: conveyor.Every(time.Second), Args: tick{}}
	if err := c.AddPeriodic(ok); err != nil {
		t.Fatal(err)
	}
	if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "odd", Schedule: conveyor.Every(1500 * time.Millisecond), Args: tick{}}); err != nil {
		t.Fatalf("Every(1.5s): %v", err)
	}
	if err := c.AddPeriodic(ok); err == nil {
		t.Error("a second periodic job with the same name was added")
	}
}

// TestAddPeriodicEndedSchedule: a schedule of the application's own
// that has no slot to come (it ended) is accepted, so that a process
// restarted after its end still starts, and the start says so once.
func TestAddPeriodicEndedSchedule(t *testing.T) {
	var buf syncBuffer
	cfg := fast(testdb.Prefix())
	cfg.AllowUnregisteredKinds = true
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	c := openDropped(t, filepath.Join(t.TempDir(), "ended.db"), cfg)
	if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "ended", Schedule: noSlot{}, Args: tick{}}); err != nil {
		t.Fatalf("AddPeriodic of an ended schedule: %v", err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ended schedule's warning", 15*time.Second, func() bool {
		return strings.Contains(buf.String(), "no slot to come") && strings.Contains(buf.String(), "name=ended")
	})
}

// TestPeriodicStallPastRetention: a process whose periodic loop stalled
// catches up slots that another process enqueued and retention has since
// pruned (their unique keys freed). It must not enqueue them again: each
// slot has at most one job, ever.
func TestPeriodicStallPastRetention(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		newClient := func(first bool) *conveyor.Client[any] {
			cfg := fast(prefix)
			cfg.AllowUnregisteredKinds = true
			cfg.CompletedRetention, cfg.DiscardedRetention = time.Millisecond, time.Millisecond
			var c *conveyor.Client[any]
			if first {
				c = openDropped(t, dsn, cfg)
			} else {
				c = open(t, dsn, cfg)
			}
			if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "stalled", Schedule: conveyor.Every(time.Second), Args: tick{}}); err != nil {
				t.Fatal(err)
			}
			return c
		}
		a, b := newClient(true), newClient(false)
		now := time.Now().Truncate(time.Second)
		from := now.Add(-2 * time.Second)
		// a runs the three slots; their jobs finish and are pruned.
		if err := conveyor.PeriodicCatchUpForTest(a, "stalled", from, now); err != nil {
			t.Fatal(err)
		}
		jobs, err := a.Jobs(ctx, conveyor.JobFilter{Kind: "tick"})
		if err != nil || len(jobs) != 3 {
			t.Fatalf("a enqueued %d jobs, %v; want one per slot (3)", len(jobs), err)
		}
		for _, j := range jobs {
			if _, err := a.Cancel(ctx, j.ID); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := seam.DriverOf(a).Prune(ctx, time.Millisecond, time.Millisecond, 100); err != nil {
			t.Fatal(err)
		}
		if got := slotsOf(t, a); len(got) != 0 {
			t.Fatalf("after the prune: jobs of slots %v", got)
		}
		// b stalled since the first of those slots and now catches up.
		if err := conveyor.PeriodicCatchUpForTest(b, "stalled", from, now); err != nil {
			t.Fatal(err)
		}
		if got := slotsOf(t, a); len(got) != 0 {
			t.Fatalf("the stalled process enqueued again slots %v, which another process ran", got)
		}
	})
}

// TestPeriodicLateSlotNotRunTwice: a process that reaches slots late (it
// was suspended, or its clock is behind the database's) after another
// process made their jobs, which have finished and been pruned since,
// does not enqueue them again: the pruned job no longer holds the slot's
// unique key, so the slot would run twice. Slots no process went past are
// still caught up.
func TestPeriodicLateSlotNotRunTwice(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		cfg.CompletedRetention = time.Hour
		c := openDropped(t, dsn, cfg)
		for _, name := range []string{"covered", "alone"} {
			if err := c.AddPeriodic(conveyor.PeriodicJob{Name: name, Schedule: conveyor.Every(time.Hour), Args: tick{},
				Opts: &conveyor.EnqueueOpts{Queue: "ticks-" + name}}); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		first := now.Truncate(time.Hour).Add(-3 * time.Hour).UTC()
		slotJobs := func(queue string) map[time.Time][]int64 {
			out := map[time.Time][]int64{}
			js, err := c.Jobs(ctx, conveyor.JobFilter{Kind: "tick", Queue: queue, Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range js {
				out[j.ScheduledAt.UTC()] = append(out[j.ScheduledAt.UTC()], j.ID)
			}
			return out
		}
		// Another process ran "covered" on time: one job per slot, the
		// latest slot recorded. The first slot's job finished and the
		// prune deleted it.
		conveyor.CatchUpForTest(c, "covered", first, now)
		made := slotJobs("ticks-covered")
		if len(made) != 4 || len(made[first]) != 1 {
			t.Fatalf("slots made %v, want 4 from %v", made, first)
		}
		id := made[first][0]
		_, fence, err := conveyor.ClaimForTest(c, id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := conveyor.AckForTest(c, id, fence); err != nil || n != 1 {
			t.Fatalf("complete: %d %v", n, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := c.Job(ctx, id); errors.Is(err, conveyor.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the completed job was not pruned within 30s")
			}
			if _, err := conveyor.PruneForTest(c, time.Microsecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// A process stalled since before the first slot catches up, by its
		// own clock (hours late) and with its clock an hour behind (on
		// time by its clock, hours late by the database's).
		for _, late := range []time.Time{now, first.Add(time.Second)} {
			conveyor.CatchUpForTest(c, "covered", first, late)
			got := slotJobs("ticks-covered")
			if ids := got[first]; len(ids) != 0 {
				t.Fatalf("slot %v, whose job ran and was pruned, enqueued again (job %v) by a process reaching it late", first, ids)
			}
			for s, ids := range got {
				if len(ids) != 1 || ids[0] != made[s][0] {
					t.Fatalf("slot %v: jobs %v, want only %v", s, ids, made[s])
				}
			}
		}
		// No process went past the slots of "alone": a stalled process
		// enqueues them all.
		conveyor.CatchUpForTest(c, "alone", first, now)
		if got := slotJobs("ticks-alone"); len(got) != 4 {
			t.Fatalf("stalled process alone made slots %v, want 4", got)
		}
	})
}

// TestPeriodicMarksSchedulesInUse: a started client marks the rows of
// the schedules it has as in use at start, even one whose next slot is
// far off (its row would otherwise look abandoned to the leader's prune
// of removed schedules), and leaves the rows of schedules it does not
// have as they are, for the prune.
func TestPeriodicMarksSchedulesInUse(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		// An earlier process had both schedules and recorded a slot of each.
		old := openDropped(t, dsn, cfg)
		for _, name := range []string{"kept", "removed"} {
			if err := old.AddPeriodic(conveyor.PeriodicJob{Name: name, Schedule: ownSchedule{conveyor.Every(100 * time.Millisecond)}, Args: tick{},
				Opts: &conveyor.EnqueueOpts{Queue: "ticks"}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := old.Start(ctx); err != nil {
			t.Fatal(err)
		}
		var before map[string]time.Time
		waitFor(t, "a recorded slot of each schedule", 30*time.Second, func() bool {
			var err error
			before, err = conveyor.ScheduleTouchesForTest(old)
			return err == nil && len(before) == 2
		})
		if err := old.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		before, err := conveyor.ScheduleTouchesForTest(old)
		if err != nil || len(before) != 2 {
			t.Fatalf("rows %v, %v", before, err)
		}
		// The new process has only "kept", now once a year.
		c := open(t, dsn, cfg)
		if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "kept", Schedule: conveyor.Every(365 * 24 * time.Hour), Args: tick{},
			Opts: &conveyor.EnqueueOpts{Queue: "ticks"}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		var after map[string]time.Time
		waitFor(t, "the kept schedule's row marked in use", 30*time.Second, func() bool {
			var err error
			after, err = conveyor.ScheduleTouchesForTest(c)
			return err == nil && after["kept"].After(before["kept"])
		})
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if after, err = conveyor.ScheduleTouchesForTest(c); err != nil || !after["removed"].Equal(before["removed"]) {
			t.Fatalf("the removed schedule's row: %v then %v (%v); want it left as it was", before["removed"], after["removed"], err)
		}
	})
}

// TestPeriodicCatchUpInBatches: a process that reaches many slots late
// enqueues them in inserts of many slots each (across the bound of one
// insert), one job per slot, run in slot order, and records the last.
func TestPeriodicCatchUpInBatches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		c := openDropped(t, dsn, cfg)
		if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "behind", Schedule: conveyor.Every(time.Second), Args: tick{},
			Opts: &conveyor.EnqueueOpts{Queue: "behind"}}); err != nil {
			t.Fatal(err)
		}
		const n = 250
		now := time.Now().Truncate(time.Second)
		first := now.Add(-(n - 1) * time.Second)
		// The first slots another process made already: found, not made
		// again.
		conveyor.CatchUpForTest(c, "behind", first, first.Add(2*time.Second))
		if next := conveyor.CatchUpForTest(c, "behind", first, now); !next.Equal(now.Add(time.Second)) {
			t.Fatalf("next slot %v after catching up to %v", next, now)
		}
		js := oneJobPerSlot(t, c, "behind", first, now, n, "")
		// They run oldest first, those of one insert too (its keys are
		// written in key order, not slot order).
		bySlot := map[int64]int64{}
		for _, j := range js {
			bySlot[j.ScheduledAt.UnixNano()] = j.ID
		}
		for s := first; s.Before(first.Add(40 * time.Second)); s = s.Add(time.Second) {
			if _, _, err := conveyor.ClaimForTest(c, bySlot[s.UnixNano()], time.Minute); err != nil {
				t.Fatalf("slot %v is not the next to run: %v", s, err)
			}
		}
		infos, err := c.Schedules(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Name == "behind" && !in.Last.Equal(now) {
				t.Fatalf("schedule recorded slot %v, want the last caught up %v", in.Last, now)
			}
		}
	})
}

// oneJobPerSlot checks that queue holds exactly one tick job per slot
// every second from first to now (n slots) and returns them; more is
// added to a failure's message.
func oneJobPerSlot(t *testing.T, c *conveyor.Client[any], queue string, first, now time.Time, n int, more string) []*conveyor.JobInfo {
	t.Helper()
	js, err := c.Jobs(context.Background(), conveyor.JobFilter{Kind: "tick", Queue: queue, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	per := map[int64]int{}
	for _, j := range js {
		per[j.ScheduledAt.UnixNano()]++
	}
	for s := first; !s.After(now); s = s.Add(time.Second) {
		if per[s.UnixNano()] != 1 {
			t.Fatalf("slot %v has %d jobs, want 1 (%d jobs for %d slots)%s", s, per[s.UnixNano()], len(js), n, more)
		}
	}
	if len(js) != n {
		t.Fatalf("%d jobs for %d slots%s", len(js), n, more)
	}
	return js
}
