package conveyor

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Schedule says when a periodic job's slots are: Next returns the first
// slot strictly after t (the zero time when there is none).
type Schedule interface {
	// Next returns the first slot strictly after t.
	Next(t time.Time) time.Time
	// String describes the schedule, as it is listed (Client.Schedules,
	// conveyor schedules).
	String() string
}

// Every returns a schedule whose slots are the multiples of d since the
// Unix epoch (every 5 minutes: 10:00, 10:05, ... whatever the start time),
// so that every process computes the same slots. AddPeriodic refuses d
// under a second or not a whole number of microseconds: each
// slot is a job whose unique key is kept for the retention
// (Config.CompletedRetention) after it ran, so a schedule keeps that
// retention divided by d jobs in the table (86,400 at a second with the
// default day), and every process running it writes the slot's job and
// its record once per slot; a slot whose enqueue fails is tried again a
// second later. Slots are stored to the microsecond, the precision every
// backend keeps times at. A Schedule of the application's own is not
// checked: space its slots as far apart.
func Every(d time.Duration) Schedule { return every(d) }

// minEvery is the shortest interval AddPeriodic takes for Every.
const minEvery = time.Second

// checkEvery refuses an interval Every cannot run well.
func checkEvery(d time.Duration) error {
	switch {
	case d < minEvery:
		return fmt.Errorf("Every(%v): the interval must be at least %v (each slot's job and unique key are kept for the retention, and every process writes each slot)", d, minEvery)
	case d%time.Microsecond != 0:
		return fmt.Errorf("Every(%v): the interval must be a whole number of microseconds, the precision slots are stored at", d)
	}
	return nil
}

type every time.Duration

// Next returns the first multiple of the interval after t.
func (e every) Next(t time.Time) time.Time {
	d := int64(e)
	if d <= 0 {
		return time.Time{}
	}
	n := t.UnixNano()
	next := (n/d + 1) * d
	if n < 0 && n%d != 0 {
		next = (n / d) * d
	}
	return time.Unix(0, next).UTC()
}

// String is "every D".
func (e every) String() string { return "every " + time.Duration(e).String() }

// Cron parses a cron expression evaluated in loc (nil: UTC): five fields
// (minute hour day-of-month month day-of-week) or six with seconds first.
// A field is "*", a number, a range "a-b", a list "a,b", each with an
// optional step "/n"; months and days of the week may be given by their
// English three-letter names (JAN, MON), and 7 is Sunday as 0 is. As in
// cron, when both day fields are restricted a day matching either runs.
// Local times that do not exist (a daylight-saving gap) are skipped and
// those that happen twice run once, at their first occurrence. A spec
// that matches no time (the 30th of February) is an error.
func Cron(spec string, loc *time.Location) (Schedule, error) {
	if loc == nil {
		loc = time.UTC
	}
	f := strings.Fields(spec)
	switch len(f) {
	case 5:
		f = append([]string{"0"}, f...)
	case 6:
	default:
		return nil, fmt.Errorf("cron %q: %d fields, want 5 (minute hour day month weekday) or 6 (with seconds first)", spec, len(f))
	}
	c := &cron{spec: spec, loc: loc}
	var err error
	parts := []struct {
		dst      *uint64
		min, max int
		names    []string
		what     string
	}{
		{&c.sec, 0, 59, nil, "second"},
		{&c.min, 0, 59, nil, "minute"},
		{&c.hour, 0, 23, nil, "hour"},
		{&c.dom, 1, 31, nil, "day of month"},
		{&c.month, 1, 12, monthNames, "month"},
		{&c.dow, 0, 7, dayNames, "day of week"},
	}
	for i, p := range parts {
		if *p.dst, err = cronField(f[i], p.min, p.max, p.names); err != nil {
			return nil, fmt.Errorf("cron %q: %s field %q: %v", spec, p.what, f[i], err)
		}
	}
	if c.dow&(1<<7) != 0 { // 7 is Sunday
		c.dow |= 1
	}
	c.domAny, c.dowAny = f[3] == "*" || f[3] == "?", f[5] == "*" || f[5] == "?"
	if !c.domAny && c.dowAny && !c.someDay() {
		// Otherwise AddPeriodic would take a schedule that never runs.
		return nil, fmt.Errorf("cron %q: matches no time: no month allowed has a day of month allowed", spec)
	}
	return c, nil
}

// someDay reports whether a month of the schedule has one of its days of
// the month (February counted with 29 days).
func (c *cron) someDay() bool {
	days := [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for m := 1; m <= 12; m++ {
		if c.month&(1<<m) != 0 && c.dom&(1<<(days[m]+1)-1) != 0 {
			return true
		}
	}
	return false
}

var (
	monthNames = []string{"", "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}
	dayNames   = []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}
)

// cronField parses one field into a bit set of the values it allows.
func cronField(s string, min, max int, names []string) (uint64, error) {
	var bits uint64
	for _, part := range strings.Split(s, ",") {
		rng, step := part, 1
		if i := strings.IndexByte(part, '/'); i >= 0 {
			n, err := strconv.Atoi(part[i+1:])
			if err != nil || n < 1 {
				return 0, fmt.Errorf("step %q is not a positive number", part[i+1:])
			}
			rng, step = part[:i], n
		}
		lo, hi := min, max
		switch {
		case rng == "*" || rng == "?":
		case strings.Contains(rng, "-"):
			a, b, _ := strings.Cut(rng, "-")
			var err error
			if lo, err = cronValue(a, min, max, names); err != nil {
				return 0, err
			}
			if hi, err = cronValue(b, min, max, names); err != nil {
				return 0, err
			}
			if lo > hi {
				return 0, fmt.Errorf("range %q runs backwards", rng)
			}
		default:
			v, err := cronValue(rng, min, max, names)
			if err != nil {
				return 0, err
			}
			lo = v
			if !strings.Contains(part, "/") {
				hi = v
			}
		}
		for v := lo; v <= hi; v += step {
			bits |= 1 << v
		}
	}
	return bits, nil
}

func cronValue(s string, min, max int, names []string) (int, error) {
	for i, n := range names {
		if n != "" && strings.EqualFold(s, n) {
			return i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if v < min || v > max {
		return 0, fmt.Errorf("%d is out of range %d-%d", v, min, max)
	}
	return v, nil
}

type cron struct {
	spec                            string
	loc                             *time.Location
	sec, min, hour, dom, month, dow uint64
	domAny, dowAny                  bool
}

// String is the expression and its time zone.
func (c *cron) String() string { return "cron " + c.spec + " (" + c.loc.String() + ")" }

// dayOK applies cron's rule for the two day fields.
func (c *cron) dayOK(t time.Time) bool {
	d, w := c.dom&(1<<t.Day()) != 0, c.dow&(1<<t.Weekday()) != 0
	switch {
	case c.domAny && c.dowAny:
		return true
	case c.domAny:
		return w
	case c.dowAny:
		return d
	}
	return d || w
}

// Next returns the first matching second after t, searching at most five
// years ahead.
func (c *cron) Next(t time.Time) time.Time {
	t = t.In(c.loc).Truncate(time.Second).Add(time.Second)
	limit := t.AddDate(5, 0, 0)
	for t.Before(limit) {
		if c.month&(1<<t.Month()) == 0 {
			t = c.date(t.Year(), t.Month()+1, 1, 0)
			continue
		}
		if !c.dayOK(t) {
			t = c.date(t.Year(), t.Month(), t.Day()+1, 0)
			continue
		}
		if c.hour&(1<<t.Hour()) == 0 {
			next := c.date(t.Year(), t.Month(), t.Day(), t.Hour()+1)
			if !next.After(t) { // in the hour repeated when daylight saving ends
				next = t.Add(time.Duration(60-t.Minute())*time.Minute - time.Duration(t.Second())*time.Second)
			}
			t = next
			continue
		}
		if c.min&(1<<t.Minute()) == 0 {
			t = t.Truncate(time.Minute).Add(time.Minute)
			continue
		}
		if c.sec&(1<<t.Second()) == 0 {
			t = t.Add(time.Second)
			continue
		}
		if !firstOccurrence(t).Equal(t) {
			// The second occurrence of a local time repeated when daylight
			// saving ends: it ran at the first.
			t = t.Add(time.Second)
			continue
		}
		return t
	}
	return time.Time{}
}

// date is the first instant of hour h of the day in c's location (its
// first occurrence when the clocks go back over it; time.Date picks the
// second one east of UTC).
func (c *cron) date(y int, m time.Month, d, h int) time.Time {
	t := time.Date(y, m, d, h, 0, 0, 0, c.loc)
	// A local time the clocks skip (summer time beginning at midnight in
	// Santiago) comes back, west of UTC, as the instant the same length
	// before it, on the previous day: from there Next would jump to this
	// same day again and again. Take the instant the clocks jump instead.
	want := time.Date(y, m, d, h, 0, 0, 0, time.UTC)
	if wall := time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC); wall.Before(want) {
		_, off := t.Zone()
		if _, after := t.Add(3 * time.Hour).Zone(); after > off {
			t = t.Add(time.Duration(after-off) * time.Second)
		}
	}
	return firstOccurrence(t)
}

// firstOccurrence returns the earliest instant whose local time (in t's
// location) is t's: t itself unless the clocks went back over it, in the
// three hours before it, by any amount.
func firstOccurrence(t time.Time) time.Time {
	_, off := t.Zone()
	_, before := t.Add(-3 * time.Hour).Zone()
	if before <= off {
		return t
	}
	e := t.Add(-time.Duration(before-off) * time.Second)
	if e.YearDay() == t.YearDay() && e.Year() == t.Year() && e.Hour() == t.Hour() && e.Minute() == t.Minute() && e.Second() == t.Second() {
		return e
	}
	return t
}
