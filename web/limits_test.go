package web

import (
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// TestLimitsAPI: PUT sets a queue's limits, GET reads them, the queues
// list carries them with their use, DELETE clears them.
func TestLimitsAPI(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	var got queueLimitsJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues/mail/limits", auth: roToken}).json(t, &got)
	if got.Queue != "mail" || got.Limits != nil {
		t.Fatalf("limits before any: %+v", got)
	}

	e.must(200, req{method: "PUT", path: "/api/v1/queues/mail/limits", auth: adminToken,
		body: `{"max_running": 5, "rate": 100, "rate_period": "1m"}`}).json(t, &got)
	want := limitsJSON{MaxRunning: 5, Rate: 100, RatePeriod: "1m", RatePeriodMS: 60000}
	if got.Queue != "mail" || got.Limits == nil || *got.Limits != want {
		t.Fatalf("PUT answered %+v, want %+v", got, want)
	}
	l, err := e.client.QueueLimits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if l["mail"] != (conveyor.QueueLimits{MaxRunning: 5, Rate: 100, RatePeriod: time.Minute}) {
		t.Fatalf("the client reads %+v", l)
	}
	got = queueLimitsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/mail/limits", auth: roToken}).json(t, &got)
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("GET answered %+v, want %+v", got.Limits, want)
	}

	// The queues list shows a limited queue without jobs, with its
	// limits, their use, and nothing holding it.
	var qs queuesJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken}).json(t, &qs)
	if len(qs.Queues) != 1 || qs.Queues[0].Queue != "mail" {
		t.Fatalf("queues %+v", qs.Queues)
	}
	q := qs.Queues[0]
	if q.Limits == nil || *q.Limits != want || q.LimitUse == nil || *q.LimitUse != (limitUseJSON{}) || q.Held != nil {
		t.Fatalf("queue %+v (limits %v, use %v, held %v)", q, q.Limits, q.LimitUse, q.Held)
	}

	// A queue with available jobs that is paused is held by the pause;
	// setting limits keeps the pause.
	e.enqueue(map[string]any{"kind": "k", "queue": "mail"})
	e.must(200, req{method: "POST", path: "/api/v1/queues/mail/pause", auth: adminToken})
	e.must(200, req{method: "PUT", path: "/api/v1/queues/mail/limits", auth: adminToken, body: `{"max_running": 2}`}).json(t, &got)
	if got.Limits == nil || *got.Limits != (limitsJSON{MaxRunning: 2}) {
		t.Fatalf("PUT replaced the limits with %+v, want max_running 2 alone", got.Limits)
	}
	raw := e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken})
	raw.json(t, &qs)
	if q := qs.Queues[0]; !q.Paused || q.Held == nil || *q.Held != conveyor.HeldByPause || q.Limits == nil || q.Limits.MaxRunning != 2 {
		t.Fatalf("paused limited queue: %s", raw.body)
	}

	// DELETE clears, and the queue stays listed while paused.
	e.must(200, req{method: "DELETE", path: "/api/v1/queues/mail/limits", auth: adminToken}).json(t, &got)
	if got.Queue != "mail" || got.Limits != nil {
		t.Fatalf("DELETE answered %+v", got)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("after DELETE the client reads %v, %v", l, err)
	}
	raw = e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken})
	if !strings.Contains(string(raw.body), `"limits":null,"limit_use":null,"held":"paused"`) {
		t.Fatalf("queues after DELETE: %s", raw.body)
	}

	// Only admins change limits; read-only tokens read them.
	e.must(403, req{method: "PUT", path: "/api/v1/queues/mail/limits", auth: roToken, body: `{"max_running": 1}`})
	e.must(403, req{method: "DELETE", path: "/api/v1/queues/mail/limits", auth: roToken})
	e.must(401, req{method: "GET", path: "/api/v1/queues/mail/limits"})
}

// TestLimitsAPIRefusesBadInput: a bad value, field or queue name gets
// 400 naming it, and nothing is set.
func TestLimitsAPIRefusesBadInput(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	for _, c := range []struct {
		path, body, want string
	}{
		{"/api/v1/queues/q/limits", `{"max_running": -1}`, "MaxRunning -1 is out of range"},
		{"/api/v1/queues/q/limits", `{"max_running": 100001}`, "MaxRunning 100001 is out of range"},
		{"/api/v1/queues/q/limits", `{"rate": -5, "rate_period": "1s"}`, "Rate -5 is out of range"},
		{"/api/v1/queues/q/limits", `{"rate": 10}`, "RatePeriod 0s is out of range"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period": "0.5ms"}`, "RatePeriod 500µs is out of range"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period": "800h"}`, "RatePeriod 800h0m0s is out of range"},
		{"/api/v1/queues/q/limits", `{"rate_period": "1m"}`, "RatePeriod 1m0s is set without a Rate"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period": "a minute"}`, `rate_period "a minute" is not a duration`},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period": 60}`, "rate_period"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period_ms": -1}`, "rate_period_ms -1"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period_ms": 9999999999999}`, "rate_period_ms 9999999999999"},
		{"/api/v1/queues/q/limits", `{"rate": 10, "rate_period": "1s", "rate_period_ms": 2000}`, "differ"},
		{"/api/v1/queues/q/limits", `{"max_running": "5"}`, "max_running"},
		{"/api/v1/queues/q/limits", `{"max_running": 2.5}`, "max_running"},
		{"/api/v1/queues/q/limits", `{"maxRunning": 5}`, `unknown field "maxRunning"`},
		{"/api/v1/queues/q/limits", `{"max_running": 5`, "malformed JSON"},
		{"/api/v1/queues/q/limits", ``, "empty body"},
		{"/api/v1/queues/bad%20name/limits", `{"max_running": 5}`, "invalid queue name"},
	} {
		res := e.do(req{method: "PUT", path: c.path, auth: adminToken, body: c.body})
		var msg struct{ Error string }
		if err := json.Unmarshal(res.body, &msg); err != nil || res.status != 400 || !strings.Contains(msg.Error, c.want) {
			t.Errorf("PUT %s %s: %d %s, want 400 saying %q", c.path, c.body, res.status, res.body, c.want)
		}
	}
	e.must(400, req{method: "GET", path: "/api/v1/queues/bad%20name/limits", auth: roToken})
	e.must(400, req{method: "DELETE", path: "/api/v1/queues/bad%20name/limits", auth: adminToken})
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("refused requests set limits: %v, %v", l, err)
	}
}

// TestQueuesJSONLimits: the queues list carries each queue's limits,
// their use and what holds it, as the client's stats say.
func TestQueuesJSONLimits(t *testing.T) {
	counts := map[conveyor.JobState]int64{conveyor.JobStateAvailable: 3, conveyor.JobStateRunning: 5}
	rd := &reading{At: time.Now(), Stats: &conveyor.Stats{Queues: []conveyor.QueueStats{
		{Queue: "a", Counts: counts, Limits: &conveyor.QueueLimits{MaxRunning: 5},
			LimitUse: &conveyor.LimitUse{Running: 5}, Held: conveyor.HeldByConcurrency},
		{Queue: "b", Counts: counts, Limits: &conveyor.QueueLimits{Rate: 10, RatePeriod: 90 * time.Second},
			LimitUse: &conveyor.LimitUse{Running: 0, Started: 10, NextStart: 1500 * time.Millisecond}, Held: conveyor.HeldByRate},
		{Queue: "c", Counts: counts},
		{Queue: "d", Counts: counts, Limits: &conveyor.QueueLimits{KeyMaxRunning: 2},
			LimitUse: &conveyor.LimitUse{Running: 4, KeysRunning: 2, KeyHeld: 3}, Held: conveyor.HeldByKey},
		{Queue: "e", Counts: counts, Limits: &conveyor.QueueLimits{Ordered: true, OrderedMoveOn: true},
			LimitUse: &conveyor.LimitUse{Running: 1, KeysRunning: 1}},
	}}}
	b, err := json.Marshal(toQueuesJSON("sqlite", rd))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"limits":{"max_running":5,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":0,"ordered":false,"ordered_move_on":false,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
			`"limit_use":{"running":5,"started":0,"next_start_ms":0,"keys_running":0,"key_held":0,"keys_rated":0},"held":"concurrency"`,
		`"limits":{"max_running":0,"rate":10,"rate_period":"1m30s","rate_period_ms":90000,"key_max_running":0,"ordered":false,"ordered_move_on":false,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
			`"limit_use":{"running":0,"started":10,"next_start_ms":1500,"keys_running":0,"key_held":0,"keys_rated":0},"held":"rate"`,
		`"limits":{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":2,"ordered":false,"ordered_move_on":false,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
			`"limit_use":{"running":4,"started":0,"next_start_ms":0,"keys_running":2,"key_held":3,"keys_rated":0},"held":"key"`,
		`"limits":{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":1,"ordered":true,"ordered_move_on":true,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false},` +
			`"limit_use":{"running":1,"started":0,"next_start_ms":0,"keys_running":1,"key_held":0,"keys_rated":0},"held":null`,
		`"limits":null,"limit_use":null,"held":null`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("queues JSON lacks %s:\n%s", want, b)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m", 250 * time.Millisecond: "250ms",
		90 * time.Second: "1m30s", 30 * 24 * time.Hour: "720h", time.Hour + time.Second: "1h0m1s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(shortDuration(d)); err != nil || back != d {
			t.Errorf("%q reads back as %v, %v", shortDuration(d), back, err)
		}
	}
}

// TestLimitsForm: the queues page's form sets and clears a queue's
// limits, shown in the queues table; bad values are refused naming the
// field; it is guarded as the pause buttons are.
func TestLimitsForm(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	form := func(auth string, h map[string]string, v url.Values) resp {
		t.Helper()
		hd := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
		for k, x := range h {
			hd[k] = x
		}
		return e.do(req{method: "POST", path: "/queues/limits", auth: auth, header: hd, body: v.Encode()})
	}
	for _, c := range []struct {
		v    url.Values
		want string
	}{
		{url.Values{"queue": {"q"}, "op": {"set"}, "max_running": {"x"}}, `max running &#34;x&#34; is not a whole number`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "rate": {"1.5"}, "rate_period": {"1m"}}, `rate &#34;1.5&#34; is not a whole number`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "rate": {"10"}, "rate_period": {"soon"}}, `rate period &#34;soon&#34; is not a duration`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "max_running": {"-1"}}, "MaxRunning -1 is out of range"},
		{url.Values{"queue": {"q"}, "op": {"set"}, "rate": {"10"}}, "RatePeriod 0s is out of range"},
		{url.Values{"queue": {"q"}, "op": {"set"}}, "give max running, or a rate with its period"},
		{url.Values{"queue": {""}, "op": {"set"}, "max_running": {"1"}}, "queue: give the queue"},
		{url.Values{"queue": {"bad name"}, "op": {"set"}, "max_running": {"1"}}, "invalid queue name"},
		{url.Values{"queue": {"q"}, "op": {"drop"}}, `op &#34;drop&#34;: set or clear`},
	} {
		res := form(adminToken, nil, c.v)
		if res.status != 400 || !strings.Contains(string(res.body), c.want) {
			t.Errorf("form %v: %d, want 400 saying %s:\n%.300s", c.v, res.status, c.want, res.body)
		}
	}
	set := url.Values{"queue": {"mail"}, "op": {"set"}, "max_running": {"5"}, "rate": {"10"}, "rate_period": {"1m"}}
	if res := form(roToken, nil, set); res.status != 403 {
		t.Errorf("read-only form: %d", res.status)
	}
	if res := form(adminToken, map[string]string{"Sec-Fetch-Site": "cross-site"}, set); res.status != 403 || !strings.Contains(string(res.body), "cross-origin request refused") {
		t.Errorf("cross-origin form: %d %s", res.status, res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("refused forms set limits: %v, %v", l, err)
	}

	res := form(adminToken, nil, set)
	if res.status != 303 || res.header.Get("Location") != "/?ok=limits" {
		t.Fatalf("form set: %d %s %s", res.status, res.header.Get("Location"), res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l["mail"] != (conveyor.QueueLimits{MaxRunning: 5, Rate: 10, RatePeriod: time.Minute}) {
		t.Fatalf("after the form: %v, %v", l, err)
	}
	page := e.must(200, req{method: "GET", path: "/?ok=limits", auth: adminToken})
	for _, want := range []string{"<div>0/5 running</div><div>rate 0/10 per 1m</div>", "limits are set in every process", `id="limits-form"`} {
		if !strings.Contains(string(page.body), want) {
			t.Errorf("queues page lacks %s", want)
		}
	}
	if page := e.must(200, req{method: "GET", path: "/", auth: roToken}); strings.Contains(string(page.body), `id="limits-form"`) {
		t.Error("the limits form is shown to a read-only user")
	}
	res = form(adminToken, nil, url.Values{"queue": {"mail"}, "op": {"clear"}})
	if res.status != 303 || res.header.Get("Location") != "/?ok=nolimit" {
		t.Fatalf("form clear: %d %s %s", res.status, res.header.Get("Location"), res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("after clearing: %v, %v", l, err)
	}
}
