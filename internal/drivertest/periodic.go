package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// periodic runs the suite's tests of the periodic jobs' schedule rows.
func periodic(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("Schedules", func(t *testing.T) {
		d := s.setup(t)
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

	// A schedule's row that no process recorded or touched for the age
	// is deleted; one touched within it (a process still has the
	// schedule, however far off its next slot) is kept. A touch makes no
	// row for a schedule that has none.
	t.Run("PruneSchedules", func(t *testing.T) {
		d := s.setup(t)
		rec := func(name string) {
			t.Helper()
			slot := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
			if err := d.RecordSchedule(ctx, driver.ScheduleRow{Name: name, Spec: "every 1m0s", LastSlot: slot, LastJob: 1, NextSlot: slot.Add(time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
		rows := func() map[string]driver.ScheduleRow {
			t.Helper()
			ss, err := d.Schedules(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]driver.ScheduleRow{}
			for _, s := range ss {
				out[s.Name] = s
			}
			return out
		}
		rec("used")
		rec("removed")
		if err := d.TouchSchedules(ctx, []string{"never-recorded"}); err != nil {
			t.Fatal(err)
		}
		if n, err := d.PruneSchedules(ctx, time.Hour); err != nil || n != 0 {
			t.Fatalf("prune with a 1h age deleted %d (%v), want none", n, err)
		}
		if got := rows(); len(got) != 2 {
			t.Fatalf("rows %v, want used and removed only (a touch makes no row)", got)
		}
		const age = time.Second
		for try := 1; ; try++ {
			rec("used")
			rec("removed")
			time.Sleep(age + 100*time.Millisecond) // both rows are older than age
			before := rows()["used"].UpdatedAt
			touched := time.Now()
			if err := d.TouchSchedules(ctx, []string{"used", "never-recorded"}); err != nil {
				t.Fatal(err)
			}
			n, err := d.PruneSchedules(ctx, age)
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(touched) >= age {
				// The machine stalled for the age between the touch and
				// the prune: the touched row may have aged too. Again.
				if try == 5 {
					t.Fatalf("%d tries stalled for %v between a touch and a prune", try, age)
				}
				continue
			}
			got := rows()
			if n != 1 || len(got) != 1 || !got["used"].UpdatedAt.After(before) {
				t.Fatalf("prune of rows untouched for %v deleted %d, left %+v; want removed deleted and used, touched after %v, kept", age, n, got, before)
			}
			break
		}
	})
}
