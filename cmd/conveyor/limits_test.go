package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// TestLimits: set, list and clear a queue's limits from the command on
// every backend; stats shows them in both shapes.
func TestLimits(t *testing.T) {
	inEmptyDir(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p}
			run := func(args ...string) string { t.Helper(); return mustCLI(t, append(args, db...)...) }
			run("migrate")
			if out := run("limits"); !strings.Contains(out, "no queue has limits") {
				t.Errorf("limits with none printed %q", out)
			}
			run("enqueue", "--kind", "k", "--queue", "mail", "--allow-unknown-kinds")
			out := run("limits", "set", "mail", "--max-running", "5")
			if out != "queue mail is limited in every process: at most 5 running (conveyor limits clear mail removes the limits)\n" {
				t.Errorf("limits set printed %q", out)
			}
			// Only the limits given change.
			out = run("limits", "set", "--rate", "100", "--per", "1m", "mail")
			if !strings.Contains(out, "at most 5 running, at most 100 started per 1m") {
				t.Errorf("limits set --rate printed %q", out)
			}
			var s struct {
				Queues []queueStatsJSON `json:"queues"`
			}
			if err := json.Unmarshal([]byte(run("limits", "--json")), &s); err != nil {
				t.Fatal(err)
			}
			want := limitsJSON{MaxRunning: 5, Rate: 100, RatePeriod: "1m", RatePeriodMS: 60000}
			if len(s.Queues) != 1 || s.Queues[0].Queue != "mail" || s.Queues[0].Limits == nil || *s.Queues[0].Limits != want ||
				s.Queues[0].LimitUse == nil || *s.Queues[0].LimitUse != (limitUseJSON{}) || s.Queues[0].Held != nil {
				t.Fatalf("limits --json: %+v", s.Queues)
			}
			if out := run("limits"); !regexp.MustCompile(`(?m)^mail +0/5 +0/100 per 1m +- +1 +-$`).MatchString(out) {
				t.Errorf("limits printed:\n%s", out)
			}
			// A paused limited queue with a job waiting is held by the
			// pause; stats shows limits and held in both shapes.
			run("pause", "mail")
			if out := run("limits"); !regexp.MustCompile(`(?m)^mail +0/5 +0/100 per 1m +- +1 +paused$`).MatchString(out) {
				t.Errorf("limits of a paused queue printed:\n%s", out)
			}
			if out := run("stats"); !strings.Contains(out, "LIMITS") || !regexp.MustCompile(`mail .* running 0/5, rate 0/100 per 1m +paused`).MatchString(out) {
				t.Errorf("stats printed:\n%s", out)
			}
			s.Queues = nil
			if err := json.Unmarshal([]byte(run("stats", "--json")), &s); err != nil {
				t.Fatal(err)
			}
			if len(s.Queues) != 1 || s.Queues[0].Limits == nil || *s.Queues[0].Limits != want || s.Queues[0].Held == nil || *s.Queues[0].Held != "paused" {
				t.Fatalf("stats --json: %+v", s.Queues)
			}
			run("resume", "mail")
			// 0 removes one limit.
			if out := run("limits", "set", "mail", "--rate", "0"); !strings.Contains(out, ": at most 5 running (") {
				t.Errorf("limits set --rate 0 printed %q", out)
			}
			if out := run("limits", "clear", "mail"); out != "queue mail has no limits now\n" {
				t.Errorf("limits clear printed %q", out)
			}
			if out := run("limits", "clear", "mail"); out != "queue mail has no limits: nothing changed\n" {
				t.Errorf("limits clear again printed %q", out)
			}
			if out := run("stats"); !regexp.MustCompile(`mail .* - +-\n`).MatchString(out) {
				t.Errorf("stats without limits printed:\n%s", out)
			}
			// An unknown queue is refused, unless asked for.
			_, _, err := cli(t, "", append([]string{"limits", "set", "mial", "--max-running", "1"}, db...)...)
			oneLineErr(t, []string{"limits", "set", "mial"}, err, `limits set: queue "mial" is unknown: it has no job, no live process works it and it is neither paused nor limited`)
			if out := run("limits", "set", "later", "--max-running", "1", "--allow-unknown-queue"); !strings.Contains(out, "queue later is limited") {
				t.Errorf("limits set --allow-unknown-queue printed %q", out)
			}
			_, _, err = cli(t, "", append([]string{"limits", "clear", "mial"}, db...)...)
			oneLineErr(t, []string{"limits", "clear", "mial"}, err, `limits clear: queue "mial" is unknown and has no limits: nothing to clear (limited queues: later)`)
		})
	}
}

// TestLimitsBadInput: every bad argument is one line naming the flag or
// argument at fault, before the database is opened.
func TestLimitsBadInput(t *testing.T) {
	inEmptyDir(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set"}, "limits set: queue name required"},
		{[]string{"limits", "set", "q"}, "limits set: give --max-running N, or --rate N with --per DURATION"},
		{[]string{"limits", "set", "q", "r", "--max-running", "1"}, `limits set: unexpected argument "r" after the queue name`},
		{[]string{"limits", "set", "bad q", "--max-running", "1"}, `limits set: queue "bad q": invalid queue name`},
		{[]string{"limits", "set", "q", "--max-running", "-1"}, "limits set: --max-running -1: must be 0 (no limit) to 100000"},
		{[]string{"limits", "set", "q", "--max-running", "100001"}, "--max-running 100001: must be 0 (no limit) to 100000"},
		{[]string{"limits", "set", "q", "--max-running", "x"}, `invalid value "x" for flag --max-running`},
		{[]string{"limits", "set", "q", "--rate", "-2", "--per", "1s"}, "--rate -2: must be 0 (no limit) to 100000"},
		{[]string{"limits", "set", "q", "--rate", "10"}, "--rate 10 needs --per DURATION"},
		{[]string{"limits", "set", "q", "--per", "1m"}, "--per is the window of --rate"},
		{[]string{"limits", "set", "q", "--rate", "0", "--per", "1m"}, "--per is for --rate N above 0"},
		{[]string{"limits", "set", "q", "--rate", "10", "--per", "0s"}, "--per 0s: must be 1ms to 720h"},
		{[]string{"limits", "set", "q", "--rate", "10", "--per", "721h"}, "--per 721h0m0s: must be 1ms to 720h"},
		{[]string{"limits", "set", "q", "--rate", "10", "--per", "soon"}, `invalid value "soon" for flag --per`},
		{[]string{"limits", "set", "q", "--json", "--max-running", "1"}, "--json does not apply to limits set"},
		{[]string{"limits", "--max-running", "1"}, "--max-running does not apply to limits"},
		{[]string{"limits", "clear"}, "limits clear: queue name required"},
		{[]string{"limits", "clear", "q", "--rate", "1"}, "--rate does not apply to limits clear"},
		{[]string{"limits", "bogus"}, `limits: unknown subcommand "bogus": set, weights or clear`},
		{[]string{"limits", "set", "q", "--key-max-running", "-1"}, "limits set: --key-max-running -1: must be 0 (no limit) to 100000"},
		{[]string{"limits", "set", "q", "--key-max-running", "100001"}, "--key-max-running 100001: must be 0 (no limit) to 100000"},
		{[]string{"limits", "set", "q", "--key-max-running", "two"}, `invalid value "two" for flag --key-max-running`},
		{[]string{"limits", "set", "q", "--key-max-running", "2", "--ordered"}, "--key-max-running 2 with --ordered: an ordered key runs one job at a time"},
		{[]string{"limits", "set", "q", "--key-max-running", "3", "--ordered-move-on"}, "--key-max-running 3 with --ordered"},
		{[]string{"limits", "set", "q", "--ordered=false", "--ordered-move-on"}, "--ordered-move-on needs --ordered"},
		{[]string{"limits", "set", "q", "--ordered=maybe"}, `invalid boolean value "maybe" for --ordered`},
		{[]string{"limits", "--ordered"}, "--ordered does not apply to limits"},
		{[]string{"limits", "clear", "q", "--key-max-running", "1"}, "--key-max-running does not apply to limits clear"},
		{[]string{"limits", "set", "q", "--key-rate", "-1", "--key-rate-period", "1h"}, "limits set: --key-rate -1: must be 0 (no rate per key) to 100000"},
		{[]string{"limits", "set", "q", "--key-rate", "100001", "--key-rate-period", "1h"}, "--key-rate 100001: must be 0 (no rate per key) to 100000"},
		{[]string{"limits", "set", "q", "--key-rate", "3"}, "--key-rate 3 needs --key-rate-period DURATION"},
		{[]string{"limits", "set", "q", "--key-rate-period", "1h"}, "--key-rate-period is the window of --key-rate"},
		{[]string{"limits", "set", "q", "--key-rate", "0", "--key-rate-period", "1h"}, "--key-rate-period is for --key-rate N above 0"},
		{[]string{"limits", "set", "q", "--key-rate", "3", "--key-rate-period", "0s"}, "--key-rate-period 0s: must be 1ms to 720h"},
		{[]string{"limits", "set", "q", "--key-rate", "3", "--key-rate-period", "721h"}, "--key-rate-period 721h0m0s: must be 1ms to 720h"},
		{[]string{"limits", "set", "q", "--key-rate", "3", "--key-rate-period", "hourly"}, `invalid value "hourly" for flag --key-rate-period`},
		{[]string{"limits", "--key-rate", "3"}, "--key-rate does not apply to limits"},
		{[]string{"limits", "clear", "q", "--key-rate-period", "1h"}, "--key-rate-period does not apply to limits clear"},
		{[]string{"limits", "set", "q", "--fair=often"}, `invalid boolean value "often" for --fair`},
		{[]string{"limits", "--fair"}, "--fair does not apply to limits"},
		{[]string{"limits", "clear", "q", "--fair"}, "--fair does not apply to limits clear"},
		{[]string{"limits", "set", "q", "--clear"}, "--clear does not apply to limits set"},
		{[]string{"limits", "weights"}, "limits weights: queue name required"},
		{[]string{"limits", "weights", "bad q", "a=1"}, `limits weights: queue "bad q": invalid queue name`},
		{[]string{"limits", "weights", "q", "acme=0"}, `limits weights: "acme=0": weight 0 is out of range (1 to 1000`},
		{[]string{"limits", "weights", "q", "acme=1001"}, `limits weights: "acme=1001": weight 1001 is out of range (1 to 1000`},
		{[]string{"limits", "weights", "q", "acme=-2"}, `"acme=-2": weight -2 is out of range`},
		{[]string{"limits", "weights", "q", "a=2", "acme=x"}, `limits weights: "acme=x": weight "x" is not a whole number`},
		{[]string{"limits", "weights", "q", "acme"}, `limits weights: "acme": give KEY=WEIGHT`},
		{[]string{"limits", "weights", "q", "=3"}, `limits weights: "=3": the key is empty`},
		{[]string{"limits", "weights", "q", "a=1", "a=2"}, `limits weights: "a=2": key "a" is given twice`},
		{[]string{"limits", "weights", "q", "a=1", "--clear"}, `limits weights: --clear removes every weight: drop "a=1"`},
		{[]string{"limits", "weights", "q", "a=1", "--max-running", "2"}, "--max-running does not apply to limits weights"},
		{[]string{"limits", "weights", "q", "--json"}, "--json does not apply to limits weights"},
	} {
		_, _, err := cli(t, "", tc.args...)
		oneLineErr(t, tc.args, err, tc.want)
	}
}

// TestLimitsText: the use of a queue's limits as limits and stats print
// it, and its JSON.
func TestLimitsText(t *testing.T) {
	q := conveyor.QueueStats{Queue: "a", Counts: map[conveyor.JobState]int64{conveyor.JobStateAvailable: 4},
		Limits:   &conveyor.QueueLimits{MaxRunning: 5, Rate: 10, RatePeriod: 90 * time.Second},
		LimitUse: &conveyor.LimitUse{Running: 3, Started: 10, NextStart: 1500 * time.Millisecond}, Held: conveyor.HeldByRate}
	run, rate := limitUseText(q)
	if run != "3/5" || rate != "10/10 per 1m30s (room in 1.5s)" {
		t.Errorf("limitUseText: %q, %q", run, rate)
	}
	b, err := json.Marshal(toQueueStatsJSON(q))
	if err != nil {
		t.Fatal(err)
	}
	want := `"limits":{"max_running":5,"rate":10,"rate_period":"1m30s","rate_period_ms":90000,"key_max_running":0,"ordered":false,"ordered_move_on":false,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
		`"limit_use":{"running":3,"started":10,"next_start_ms":1500,"keys_running":0,"key_held":0,"keys_rated":0},"held":"rate"`
	if !strings.Contains(string(b), want) {
		t.Errorf("JSON %s lacks %s", b, want)
	}
	if run, rate := limitUseText(conveyor.QueueStats{}); run != "" || rate != "" {
		t.Errorf("no limits: %q, %q", run, rate)
	}
}

// TestKeyLimitsText: the key limits as limits set, limits and stats say
// them, and their JSON.
func TestKeyLimitsText(t *testing.T) {
	for _, c := range []struct {
		l    conveyor.QueueLimits
		u    conveyor.LimitUse
		text string
		use  string
	}{
		{conveyor.QueueLimits{KeyMaxRunning: 2}, conveyor.LimitUse{KeysRunning: 3, KeyHeld: 4},
			"at most 2 running per key", "2 per key: 3 keys running, 4 waiting for their key"},
		{conveyor.QueueLimits{MaxRunning: 5, Ordered: true}, conveyor.LimitUse{KeysRunning: 1},
			"at most 5 running, each key's jobs one at a time in enqueue order", "ordered by key: 1 key running"},
		{conveyor.QueueLimits{KeyMaxRunning: 1, Ordered: true, OrderedMoveOn: true}, conveyor.LimitUse{},
			"each key's jobs one at a time in enqueue order, moving on past a failed job waiting for its retry", "ordered by key, moving on: 0 keys running"},
		{conveyor.QueueLimits{MaxRunning: 5}, conveyor.LimitUse{}, "at most 5 running", ""},
		{conveyor.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}, conveyor.LimitUse{KeysRated: 2, KeyHeld: 14},
			"at most 3 started per key per 1h", "3 per key per 1h: 2 keys at their rate, 14 waiting for their key"},
		{conveyor.QueueLimits{KeyMaxRunning: 1, KeyRate: 5, KeyRatePeriod: 90 * time.Second}, conveyor.LimitUse{KeysRunning: 1, KeysRated: 1},
			"at most 1 running per key, at most 5 started per key per 1m30s", "1 per key: 1 key running, 5 per key per 1m30s: 1 key at its rate"},
		{conveyor.QueueLimits{Fair: true}, conveyor.LimitUse{},
			"keys served in turns by weight (fair)", "fair"},
		{conveyor.QueueLimits{MaxRunning: 4, KeyMaxRunning: 2, Fair: true}, conveyor.LimitUse{KeysRunning: 2, KeyHeld: 3},
			"at most 4 running, at most 2 running per key, keys served in turns by weight (fair)", "2 per key: 2 keys running, fair, 3 waiting for their key"},
	} {
		if got := limitsText(c.l); got != c.text {
			t.Errorf("limitsText(%+v) = %q, want %q", c.l, got, c.text)
		}
		q := conveyor.QueueStats{Limits: &c.l, LimitUse: &c.u}
		if got := keyUseText(q); got != c.use {
			t.Errorf("keyUseText(%+v, %+v) = %q, want %q", c.l, c.u, got, c.use)
		}
	}
	if got := keyUseText(conveyor.QueueStats{}); got != "" {
		t.Errorf("no limits: %q", got)
	}
	q := conveyor.QueueStats{Queue: "a", Counts: map[conveyor.JobState]int64{conveyor.JobStateAvailable: 4},
		Limits:   &conveyor.QueueLimits{Ordered: true},
		LimitUse: &conveyor.LimitUse{KeysRunning: 2, KeyHeld: 4}, Held: conveyor.HeldByKey}
	b, err := json.Marshal(toQueueStatsJSON(q))
	if err != nil {
		t.Fatal(err)
	}
	want := `"limits":{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":1,"ordered":true,"ordered_move_on":false,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
		`"limit_use":{"running":0,"started":0,"next_start_ms":0,"keys_running":2,"key_held":4,"keys_rated":0},"held":"key"`
	if !strings.Contains(string(b), want) {
		t.Errorf("JSON %s lacks %s", b, want)
	}
	q.Limits = &conveyor.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}
	q.LimitUse = &conveyor.LimitUse{KeyHeld: 14, KeysRated: 2}
	if b, err = json.Marshal(toQueueStatsJSON(q)); err != nil {
		t.Fatal(err)
	}
	want = `"limits":{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":0,"ordered":false,"ordered_move_on":false,"key_rate":3,"key_rate_period":"1h","key_rate_period_ms":3600000,"fair":false},` +
		`"limit_use":{"running":0,"started":0,"next_start_ms":0,"keys_running":0,"key_held":14,"keys_rated":2},"held":"key"`
	if !strings.Contains(string(b), want) {
		t.Errorf("JSON %s lacks %s", b, want)
	}
}

// TestKeyLimitsCommand: enqueue --key stores the job's key, job prints
// it, limits set takes the key limits (only those given change), and
// limits and stats show the keys running and the jobs held by their key.
// On SQLite, whose driver stores keys.
func TestKeyLimitsCommand(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "q.db")
	db := []string{"--db", dsn}
	run := func(args ...string) string { t.Helper(); return mustCLI(t, append(args, db...)...) }
	run("migrate")
	var ids []string
	for _, k := range []string{"acme", "acme", "globex", "acme"} {
		ids = append(ids, strings.TrimSpace(run("enqueue", "--kind", "k", "--queue", "tenants", "--key", k, "--allow-unknown-kinds")))
	}
	plain := strings.TrimSpace(run("enqueue", "--kind", "k", "--queue", "tenants", "--allow-unknown-kinds"))
	if out := run("job", ids[0]); !regexp.MustCompile(`(?m)^key: +acme$`).MatchString(out) {
		t.Errorf("job printed:\n%s", out)
	}
	if out := run("job", plain); !regexp.MustCompile(`(?m)^key: +-$`).MatchString(out) {
		t.Errorf("job without a key printed:\n%s", out)
	}
	var j struct{ Key *string }
	if err := json.Unmarshal([]byte(run("job", "--json", ids[2])), &j); err != nil || j.Key == nil || *j.Key != "globex" {
		t.Errorf("job --json key %v, %v", j.Key, err)
	}

	out := run("limits", "set", "tenants", "--key-max-running", "2")
	if out != "queue tenants is limited in every process: at most 2 running per key (conveyor limits clear tenants removes the limits)\n" {
		t.Errorf("limits set --key-max-running printed %q", out)
	}
	if out := run("limits", "set", "tenants", "--max-running", "10"); !strings.Contains(out, ": at most 10 running, at most 2 running per key (") {
		t.Errorf("limits set --max-running kept the key limit? %q", out)
	}
	// --ordered with a key limit over 1 is refused naming it; with
	// --key-max-running 1 it is taken.
	_, _, err := cli(t, "", append([]string{"limits", "set", "tenants", "--ordered"}, db...)...)
	oneLineErr(t, []string{"limits", "set", "tenants", "--ordered"}, err, "limits set: queue tenants has --key-max-running 2, and an ordered key runs one job at a time")
	if out := run("limits", "set", "tenants", "--ordered-move-on", "--key-max-running", "1"); !strings.Contains(out, "each key's jobs one at a time in enqueue order, moving on past a failed job") {
		t.Errorf("limits set --ordered-move-on printed %q", out)
	}
	c, err := connect.Open(t.Context(), dsn, &conveyor.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if l, err := c.QueueLimits(t.Context()); err != nil || l["tenants"].MaxRunning != 10 || l["tenants"].KeyMaxRunning > 1 || !l["tenants"].Ordered || !l["tenants"].OrderedMoveOn {
		t.Fatalf("the client reads %+v, %v", l["tenants"], err)
	}
	// --ordered=false removes the ordering and the one job per key it
	// implies; --key-max-running gives a limit per key of its own.
	if out := run("limits", "set", "tenants", "--ordered=false"); !strings.HasSuffix(out, ": at most 10 running (conveyor limits clear tenants removes the limits)\n") {
		t.Errorf("limits set --ordered=false printed %q", out)
	}
	if out := run("limits", "set", "tenants", "--key-max-running", "1"); !strings.HasSuffix(out, ": at most 10 running, at most 1 running per key (conveyor limits clear tenants removes the limits)\n") {
		t.Errorf("limits set --key-max-running 1 printed %q", out)
	}
	if l, err := c.QueueLimits(t.Context()); err != nil || l["tenants"] != (conveyor.QueueLimits{MaxRunning: 10, KeyMaxRunning: 1}) {
		t.Fatalf("after --key-max-running 1 the client reads %+v, %v", l["tenants"], err)
	}

	// One job per key runs: acme's other two wait for their key.
	claimed, err := c.RemoteWorkers().Claim(t.Context(), conveyor.RemoteClaim{Queue: "tenants", Limit: 10, Lease: time.Minute})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claimed %d jobs, %v; want acme's first, globex's and the one without a key", len(claimed), err)
	}
	if out := run("limits"); !regexp.MustCompile(`(?m)^QUEUE +RUNNING +STARTED +KEYS +AVAILABLE +HELD$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^tenants +3/10 +- +1 per key: 2 keys running, 2 waiting for their key +2 +key$`).MatchString(out) {
		t.Errorf("limits printed:\n%s", out)
	}
	if out := run("stats"); !regexp.MustCompile(`(?m)^tenants .* running 3/10, 1 per key: 2 keys running, 2 waiting for their key +key$`).MatchString(out) {
		t.Errorf("stats printed:\n%s", out)
	}
	var s struct {
		Queues []queueStatsJSON `json:"queues"`
	}
	if err := json.Unmarshal([]byte(run("stats", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Queues) != 1 || s.Queues[0].Limits == nil || *s.Queues[0].Limits != (limitsJSON{MaxRunning: 10, KeyMaxRunning: 1}) ||
		s.Queues[0].LimitUse == nil || s.Queues[0].LimitUse.KeysRunning != 2 || s.Queues[0].LimitUse.KeyHeld != 2 ||
		s.Queues[0].Held == nil || *s.Queues[0].Held != conveyor.HeldByKey {
		t.Fatalf("stats --json: %+v", s.Queues)
	}
}

// TestKeyRateCommand: limits set takes a rate per key (only the flags
// given change; --key-rate 0 removes it), and limits and stats show the
// keys at their rate and the jobs waiting for their key. On SQLite,
// whose driver stores rates per key.
func TestKeyRateCommand(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "q.db")
	db := []string{"--db", dsn}
	run := func(args ...string) string { t.Helper(); return mustCLI(t, append(args, db...)...) }
	run("migrate")
	for _, k := range []string{"acme", "acme", "acme", "globex"} {
		run("enqueue", "--kind", "k", "--queue", "partners", "--key", k, "--allow-unknown-kinds")
	}
	out := run("limits", "set", "partners", "--key-rate", "2", "--key-rate-period", "1h")
	if out != "queue partners is limited in every process: at most 2 started per key per 1h (conveyor limits clear partners removes the limits)\n" {
		t.Errorf("limits set --key-rate printed %q", out)
	}
	if out := run("limits", "set", "partners", "--max-running", "10"); !strings.Contains(out, ": at most 10 running, at most 2 started per key per 1h (") {
		t.Errorf("limits set --max-running kept the rate per key? %q", out)
	}
	c, err := connect.Open(t.Context(), dsn, &conveyor.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if l, err := c.QueueLimits(t.Context()); err != nil || l["partners"] != (conveyor.QueueLimits{MaxRunning: 10, KeyRate: 2, KeyRatePeriod: time.Hour}) {
		t.Fatalf("the client reads %+v, %v", l["partners"], err)
	}

	// Two of acme's jobs start in the window, globex's one: acme's third
	// waits for its key.
	n := 0
	for range 2 {
		claimed, err := c.RemoteWorkers().Claim(t.Context(), conveyor.RemoteClaim{Queue: "partners", Limit: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		n += len(claimed)
	}
	if n != 3 {
		t.Fatalf("claimed %d jobs, want acme's first two and globex's", n)
	}
	if out := run("limits"); !regexp.MustCompile(`(?m)^partners +3/10 +- +2 per key per 1h: 1 key at its rate, 1 waiting for their key +1 +key$`).MatchString(out) {
		t.Errorf("limits printed:\n%s", out)
	}
	if out := run("stats"); !regexp.MustCompile(`(?m)^partners .* running 3/10, 2 per key per 1h: 1 key at its rate, 1 waiting for their key +key$`).MatchString(out) {
		t.Errorf("stats printed:\n%s", out)
	}
	var s struct {
		Queues []queueStatsJSON `json:"queues"`
	}
	if err := json.Unmarshal([]byte(run("stats", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	want := limitsJSON{MaxRunning: 10, KeyRate: 2, KeyRatePeriod: "1h", KeyRatePeriodMS: 3_600_000}
	if len(s.Queues) != 1 || s.Queues[0].Limits == nil || *s.Queues[0].Limits != want || s.Queues[0].LimitUse == nil ||
		s.Queues[0].LimitUse.KeysRated != 1 || s.Queues[0].LimitUse.KeyHeld != 1 {
		t.Fatalf("stats --json: %+v", s.Queues)
	}

	if out := run("limits", "set", "partners", "--key-rate", "0"); !strings.HasSuffix(out, ": at most 10 running (conveyor limits clear partners removes the limits)\n") {
		t.Errorf("limits set --key-rate 0 printed %q", out)
	}
	if l, err := c.QueueLimits(t.Context()); err != nil || l["partners"] != (conveyor.QueueLimits{MaxRunning: 10}) {
		t.Fatalf("after --key-rate 0 the client reads %+v, %v", l["partners"], err)
	}
}

// TestStatsAwaitingDependencies: stats counts, per queue, the jobs of a
// workflow waiting for their dependencies, in both shapes; a queue with
// only such jobs is listed. On SQLite.
func TestStatsAwaitingDependencies(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "q.db")
	db := []string{"--db", dsn}
	mustCLI(t, append([]string{"migrate"}, db...)...)
	c, err := connect.Open(t.Context(), dsn, &conveyor.Config{AllowUnregisteredKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	step := func(q string) *conveyor.EnqueueOpts { return &conveyor.EnqueueOpts{Queue: q} }
	args := conveyor.RawArgs{KindName: "step", JSON: json.RawMessage(`{}`)}
	if _, err := c.EnqueueWorkflow(t.Context(), []conveyor.WorkflowJob{
		{Name: "a", Args: args, Opts: step("first")},
		{Name: "b", Args: args, Opts: step("second"), DependsOn: []string{"a"}},
		{Name: "c", Args: args, Opts: step("second"), DependsOn: []string{"b"}},
	}, nil); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, append([]string{"stats"}, db...)...)
	if !strings.Contains(out, "AWAITING DEPENDENCIES") ||
		!regexp.MustCompile(`(?m)^first +1( +0){6} +0 `).MatchString(out) || !regexp.MustCompile(`(?m)^second( +0){7} +2 `).MatchString(out) {
		t.Errorf("stats printed:\n%s", out)
	}
	var s struct {
		Queues []queueStatsJSON `json:"queues"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"stats", "--json"}, db...)...)), &s); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, q := range s.Queues {
		got[q.Queue] = q.AwaitingDependencies
	}
	if len(got) != 2 || got["first"] != 0 || got["second"] != 2 {
		t.Errorf("stats --json: awaiting dependencies %v, want first 0, second 2", got)
	}
}

// TestFairText: a fair queue as limits and stats say it, with its
// weighted keys, and the key weights as the listing prints them.
func TestFairText(t *testing.T) {
	q := conveyor.QueueStats{Queue: "a", Limits: &conveyor.QueueLimits{Fair: true}, LimitUse: &conveyor.LimitUse{}}
	for n, want := range map[int]string{0: "fair", 1: "fair (1 weighted key)", 3: "fair (3 weighted keys)"} {
		if got := keyUseWeightedText(q, n); got != want {
			t.Errorf("keyUseWeightedText(fair, %d) = %q, want %q", n, got, want)
		}
	}
	if got := keyUseWeightedText(conveyor.QueueStats{Limits: &conveyor.QueueLimits{MaxRunning: 1}}, 2); got != "" {
		t.Errorf("weights of a queue that is not fair: %q", got)
	}
	w := map[string]int{"b": 2, "a": 2, "c": 5, "d": 1}
	if got := weightsText(w, 0); got != "c=5 a=2 b=2 d=1" {
		t.Errorf("weightsText = %q", got)
	}
	if got := weightsText(w, 2); got != "c=5 a=2 and 2 more" {
		t.Errorf("weightsText at most 2 = %q", got)
	}
	got, err := parseKeyWeights("limits weights", []string{"acme=3", "globex=1", "a=b=2"})
	if err == nil || !strings.Contains(err.Error(), `"a=b=2": weight "b=2" is not a whole number`) {
		t.Errorf("a=b=2: %v, %v", got, err)
	}
	if got, err = parseKeyWeights("limits weights", []string{"acme=3", "globex=1"}); err != nil || len(got) != 2 || got["acme"] != 3 || got["globex"] != 1 {
		t.Errorf("acme=3 globex=1: %v, %v", got, err)
	}
	b, err := json.Marshal(toQueueStatsJSON(q))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"key_rate_period_ms":0,"fair":true}`; !strings.Contains(string(b), want) || strings.Contains(string(b), "key_weights") {
		t.Errorf("JSON %s lacks %s, or has key_weights", b, want)
	}
}

// TestFairCommand: limits set --fair makes a queue fair (only the flags
// given change; --fair=false removes it), limits weights replaces,
// prints and clears its key weights, and limits shows both. On SQLite.
func TestFairCommand(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "q.db")
	db := []string{"--db", dsn}
	run := func(args ...string) string { t.Helper(); return mustCLI(t, append(args, db...)...) }
	run("migrate")
	run("enqueue", "--kind", "k", "--queue", "tenants", "--key", "acme", "--allow-unknown-kinds")
	out := run("limits", "set", "tenants", "--fair")
	if out != "queue tenants is limited in every process: keys served in turns by weight (fair) (conveyor limits clear tenants removes the limits)\n" {
		t.Errorf("limits set --fair printed %q", out)
	}
	if out := run("limits", "set", "tenants", "--max-running", "10"); !strings.Contains(out, ": at most 10 running, keys served in turns by weight (fair) (") {
		t.Errorf("limits set --max-running kept fair? %q", out)
	}
	if out := run("limits", "weights", "tenants"); out != "queue tenants has no key weights (each key weighs 1)\n" {
		t.Errorf("limits weights with none printed %q", out)
	}
	if out := run("limits", "weights", "tenants", "acme=3", "globex=2"); out != "key weights of tenants: acme=3 globex=2\n" {
		t.Errorf("limits weights set printed %q", out)
	}
	c, err := connect.Open(t.Context(), dsn, &conveyor.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if w, err := c.KeyWeights(t.Context()); err != nil || len(w) != 1 || len(w["tenants"]) != 2 || w["tenants"]["acme"] != 3 || w["tenants"]["globex"] != 2 {
		t.Fatalf("the client reads weights %v, %v", w, err)
	}
	if l, err := c.QueueLimits(t.Context()); err != nil || l["tenants"] != (conveyor.QueueLimits{MaxRunning: 10, Fair: true}) {
		t.Fatalf("the client reads %+v, %v", l["tenants"], err)
	}
	out = run("limits")
	if !regexp.MustCompile(`(?m)^tenants +0/10 +- +fair \(2 weighted keys\) +1 +-$`).MatchString(out) ||
		!strings.Contains(out, "\nkey weights of tenants: acme=3 globex=2\n") {
		t.Errorf("limits printed:\n%s", out)
	}
	if out := run("stats"); !regexp.MustCompile(`(?m)^tenants .* running 0/10, fair +-$`).MatchString(out) {
		t.Errorf("stats printed:\n%s", out)
	}
	var s struct {
		Queues []queueStatsJSON `json:"queues"`
	}
	if err := json.Unmarshal([]byte(run("limits", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Queues) != 1 || s.Queues[0].Limits == nil || *s.Queues[0].Limits != (limitsJSON{MaxRunning: 10, Fair: true}) ||
		len(s.Queues[0].KeyWeights) != 2 || s.Queues[0].KeyWeights["acme"] != 3 {
		t.Fatalf("limits --json: %+v", s.Queues)
	}
	// Replacing drops the keys left out; the weights survive a change of
	// the limits.
	if out := run("limits", "weights", "tenants", "initech=4"); out != "key weights of tenants: initech=4\n" {
		t.Errorf("limits weights replace printed %q", out)
	}
	if out := run("limits", "set", "tenants", "--fair=false"); !strings.HasSuffix(out, ": at most 10 running (conveyor limits clear tenants removes the limits)\n") {
		t.Errorf("limits set --fair=false printed %q", out)
	}
	if out := run("limits", "weights", "tenants"); out != "key weights of tenants: initech=4\n" {
		t.Errorf("limits weights after --fair=false printed %q", out)
	}
	if out := run("limits", "weights", "tenants", "acme=2"); out != "key weights of tenants: acme=2 (they apply once the queue is fair: conveyor limits set tenants --fair)\n" {
		t.Errorf("limits weights on a queue not fair printed %q", out)
	}
	if out := run("limits", "weights", "tenants", "--clear"); out != "queue tenants has no key weights now (each key weighs 1)\n" {
		t.Errorf("limits weights --clear printed %q", out)
	}
	if out := run("limits", "weights", "tenants", "--clear"); out != "queue tenants has no key weights: nothing changed\n" {
		t.Errorf("limits weights --clear again printed %q", out)
	}
	if w, err := c.KeyWeights(t.Context()); err != nil || len(w) != 0 {
		t.Fatalf("after --clear the client reads weights %v, %v", w, err)
	}
	// An unknown queue is refused, unless asked for; a bad key is
	// refused by the client, naming it.
	_, _, err = cli(t, "", append([]string{"limits", "weights", "mial", "a=1"}, db...)...)
	oneLineErr(t, []string{"limits", "weights", "mial"}, err, `limits weights: queue "mial" is unknown`)
	if out := run("limits", "weights", "later", "a=1", "--allow-unknown-queue"); !strings.HasPrefix(out, "key weights of later: a=1 (") {
		t.Errorf("limits weights --allow-unknown-queue printed %q", out)
	}
	long := strings.Repeat("k", 300)
	_, _, err = cli(t, "", append([]string{"limits", "weights", "tenants", long + "=2"}, db...)...)
	if err == nil || !strings.Contains(err.Error(), "limits weights: ") || !strings.Contains(err.Error(), "key weights of queue \"tenants\"") {
		t.Errorf("a key too long: %v", err)
	}
}
