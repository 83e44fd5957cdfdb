package conveyor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

func TestEvery(t *testing.T) {
	s := conveyor.Every(5 * time.Minute)
	at := time.Date(2026, 3, 1, 10, 2, 30, 0, time.UTC)
	want := []time.Time{
		time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC),
		time.Date(2026, 3, 1, 10, 10, 0, 0, time.UTC),
	}
	for _, w := range want {
		at = s.Next(at)
		if !at.Equal(w) {
			t.Fatalf("next %v, want %v", at, w)
		}
	}
	// A slot's own time is not after itself.
	if got := s.Next(want[1]); !got.Equal(want[1].Add(5 * time.Minute)) {
		t.Fatalf("next after a slot: %v", got)
	}
}

// cronCase is a cron expression in a location and the times it fires
// next, one after the other, from a start.
type cronCase struct {
	spec string
	loc  *time.Location
	from time.Time
	want []string // RFC 3339 in UTC
}

func checkCron(t *testing.T, cases []cronCase) {
	t.Helper()
	for _, tc := range cases {
		s, err := conveyor.Cron(tc.spec, tc.loc)
		if err != nil {
			t.Fatalf("%q: %v", tc.spec, err)
		}
		at := tc.from
		for _, w := range tc.want {
			at = s.Next(at)
			if got := at.UTC().Format(time.RFC3339); got != w {
				t.Errorf("%q from %v: next %s, want %s", tc.spec, tc.from, got, w)
				break
			}
		}
	}
}

// TestCron: schedules in UTC (a nil location), which need no time zone
// data, and the expressions refused.
func TestCron(t *testing.T) {
	checkCron(t, []cronCase{
		{"*/15 * * * * *", nil, time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC),
			[]string{"2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z", "2026-01-01T00:00:45Z", "2026-01-01T00:01:00Z"}},
		{"0 0 1,15 * *", nil, time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC),
			[]string{"2026-02-15T00:00:00Z", "2026-03-01T00:00:00Z"}},
		// Both day fields restricted: either matches (the 13th, or a Friday).
		{"0 12 13 * 5", nil, time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC),
			[]string{"2026-02-13T12:00:00Z", "2026-02-20T12:00:00Z", "2026-02-27T12:00:00Z", "2026-03-06T12:00:00Z", "2026-03-13T12:00:00Z"}},
		{"0 0 29 2 *", nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			[]string{"2028-02-29T00:00:00Z"}},
		{"0 0 * * 7", nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), // 7 is Sunday
			[]string{"2026-01-04T00:00:00Z"}},
	})
	for spec, want := range map[string]string{
		"* * * *":       "4 fields",
		"61 * * * *":    "minute field",
		"* * * * MOX":   "day of week field",
		"*/0 * * * *":   "step",
		"5-1 * * * *":   "backwards",
		"* * 0 * *":     "out of range",
		"* * * * * * *": "7 fields",
		// Valid fields, but no such day: the schedule would never run.
		"0 0 30 2 *":        "matches no time",
		"0 0 31 4,6,9,11 *": "matches no time",
	} {
		if _, err := conveyor.Cron(spec, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Cron(%q) = %v, want an error about %q", spec, err, want)
		}
	}
}

// TestCronTimeZone: schedules in a location with daylight saving time,
// which needs the system's time zone data (apt-get install tzdata): the
// test is skipped without it, and fails under CI (testdb.Strict).
func TestCronTimeZone(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		testdb.Missing(t, "time zone data (apt-get install tzdata): %v", err)
	}
	checkCron(t, []cronCase{
		{"30 9 * * MON-FRI", ny, time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC), // Friday 10:00 in New York
			[]string{"2026-01-05T14:30:00Z", "2026-01-06T14:30:00Z"}},
		// 02:30 does not exist in New York on 2026-03-08: skipped.
		{"30 2 * * *", ny, time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC),
			[]string{"2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"}},
		// 01:30 happens twice on 2026-11-01: it runs once.
		{"30 1 * * *", ny, time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC),
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
	})
	// East of UTC, time.Date gives the second occurrence of a repeated
	// local time: the first must still run (README's nightly report at
	// 02:30 in Paris, on the night summer time ends), the second not.
	zones := map[string]*time.Location{}
	for _, z := range []string{"Europe/Paris", "Australia/Lord_Howe", "Antarctica/Troll", "America/Santiago"} {
		if zones[z], err = time.LoadLocation(z); err != nil {
			testdb.Missing(t, "time zone data (apt-get install tzdata): %v", err)
		}
	}
	checkCron(t, []cronCase{
		{"30 2 * * *", zones["Europe/Paris"], time.Date(2026, 10, 24, 12, 0, 0, 0, time.UTC),
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"*/30 2 * * *", zones["Europe/Paris"], time.Date(2026, 10, 24, 12, 0, 0, 0, time.UTC),
			[]string{"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:00:00Z"}},
		// Lord Howe moves its clocks by half an hour: 01:30-01:59 repeats.
		{"*/20 1 * * *", zones["Australia/Lord_Howe"], time.Date(2026, 4, 4, 0, 0, 0, 0, time.UTC),
			[]string{"2026-04-04T14:00:00Z", "2026-04-04T14:20:00Z", "2026-04-04T14:40:00Z", "2026-04-05T14:30:00Z"}},
		// Troll moves them by two hours: 01:00-02:59 repeats.
		{"30 1 * * *", zones["Antarctica/Troll"], time.Date(2026, 10, 24, 12, 0, 0, 0, time.UTC),
			[]string{"2026-10-24T23:30:00Z", "2026-10-26T01:30:00Z"}},
	})
	// Santiago's summer time begins at midnight (00:00 is 01:00 on
	// 2026-09-06): time.Date answers 23:00 the day before, and Next
	// jumped to that same instant forever, without a slot or an error.
	done := make(chan struct{})
	go func() {
		defer close(done)
		checkCron(t, []cronCase{
			{"0 9 * * 1-5", zones["America/Santiago"], time.Date(2026, 9, 4, 14, 0, 0, 0, time.UTC), // Friday, after 09:00
				[]string{"2026-09-07T12:00:00Z", "2026-09-08T12:00:00Z"}},
			{"0 * * * 0", zones["America/Santiago"], time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC), // Saturday
				[]string{"2026-09-06T04:00:00Z", "2026-09-06T05:00:00Z"}},
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // a guard against the hang, not a timing check
		t.Fatal("Cron.Next loops without end across Santiago's change to summer time")
	}
}

// TestLatestMissedSlot: RunMissed runs the latest slot missed since the
// recorded one, however many slots passed meanwhile (a month of
// one-second slots is 2.6 million), and none when none passed.
func TestLatestMissedSlot(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 500_000_000, time.UTC)
	daily, err := conveyor.Cron("30 2 * * *", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sched       conveyor.Schedule
		after, want time.Time
	}{
		{conveyor.Every(time.Second), now.AddDate(0, -1, 0), now.Truncate(time.Second)},
		{conveyor.Every(time.Second), now.Add(-2 * time.Second), now.Truncate(time.Second)},
		{conveyor.Every(time.Second), now.Truncate(time.Second), time.Time{}},
		{conveyor.Every(time.Hour), now.Truncate(time.Hour), time.Time{}},
		{conveyor.Every(time.Hour), now.Add(-30 * time.Minute), now.Truncate(time.Hour)},
		{daily, now.AddDate(-1, 0, 0), time.Date(2026, 3, 1, 2, 30, 0, 0, time.UTC)},
		{daily, time.Date(2026, 3, 1, 2, 30, 0, 0, time.UTC), time.Time{}},
	} {
		if got := conveyor.LatestSlotForTest(c.sched, c.after, now); !got.Equal(c.want) {
			t.Errorf("%s after %v: latest slot %v, want %v", c.sched, c.after, got, c.want)
		}
	}
}
