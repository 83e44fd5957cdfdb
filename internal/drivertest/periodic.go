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
}
