package web

import (
	"encoding/json"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// TestLimitsJSONKeyRate: key_rate with its period converts both ways,
// the period given as a duration, in milliseconds or both alike.
func TestLimitsJSONKeyRate(t *testing.T) {
	for _, body := range []string{
		`{"key_rate": 3, "key_rate_period": "1h"}`,
		`{"key_rate": 3, "key_rate_period_ms": 3600000}`,
		`{"key_rate": 3, "key_rate_period": "60m", "key_rate_period_ms": 3600000}`,
	} {
		var in limitsRequest
		if err := json.Unmarshal([]byte(body), &in); err != nil {
			t.Fatal(err)
		}
		l, err := in.limits()
		if err != nil || l != (conveyor.QueueLimits{KeyRate: 3, KeyRatePeriod: time.Hour}) {
			t.Errorf("%s: limits %+v, %v", body, l, err)
		}
	}
	l := conveyor.QueueLimits{KeyMaxRunning: 2, KeyRate: 5, KeyRatePeriod: 90 * time.Second}
	b, err := json.Marshal(toLimitsJSON(&l))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":2,"ordered":false,"ordered_move_on":false,` +
		`"key_rate":5,"key_rate_period":"1m30s","key_rate_period_ms":90000,"fair":false}`
	if string(b) != want {
		t.Fatalf("limits JSON %s, want %s", b, want)
	}
	b, err = json.Marshal(toLimitUseJSON(&conveyor.LimitUse{KeyHeld: 7, KeysRated: 2}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"key_held":7,"keys_rated":2}`) {
		t.Fatalf("limit use JSON %s lacks keys_rated", b)
	}
}

// TestLimitsAPIKeyRateRefused: bad rates per key are refused with 400
// naming the field, and nothing is set.
func TestLimitsAPIKeyRateRefused(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	refusedPUTs(t, e, []refusedPUT{
		{`{"key_rate": -1, "key_rate_period": "1s"}`, "KeyRate -1 is out of range"},
		{`{"key_rate": 100001, "key_rate_period": "1s"}`, "KeyRate 100001 is out of range"},
		{`{"key_rate": 10}`, "KeyRatePeriod 0s is out of range"},
		{`{"key_rate": 10, "key_rate_period": "0.5ms"}`, "KeyRatePeriod 500µs is out of range"},
		{`{"key_rate": 10, "key_rate_period": "800h"}`, "KeyRatePeriod 800h0m0s is out of range"},
		{`{"key_rate_period": "1m"}`, "KeyRatePeriod 1m0s is set without a KeyRate"},
		{`{"key_rate": 10, "key_rate_period": "hourly"}`, `key_rate_period "hourly" is not a duration`},
		{`{"key_rate": 10, "key_rate_period": 60}`, "key_rate_period"},
		{`{"key_rate": 10, "key_rate_period_ms": -1}`, "key_rate_period_ms -1"},
		{`{"key_rate": 10, "key_rate_period_ms": 9999999999999}`, "key_rate_period_ms 9999999999999"},
		{`{"key_rate": 10, "key_rate_period": "1s", "key_rate_period_ms": 2000}`, `key_rate_period "1s" and key_rate_period_ms 2000 differ`},
		{`{"key_rate": "3", "key_rate_period": "1s"}`, "key_rate"},
		{`{"keyRate": 3}`, `unknown field "keyRate"`},
	})
}

// TestLimitsFormKeyRate: the form's key rate fields are read naming
// them, and bad values are refused.
func TestLimitsFormKeyRate(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	refusedForms(t, e, []refusedForm{
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_rate": {"ten"}, "key_rate_period": {"1h"}}, `key rate &#34;ten&#34; is not a whole number`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_rate": {"10"}, "key_rate_period": {"later"}}, `key rate period &#34;later&#34; is not a duration`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_rate": {"10"}}, "KeyRatePeriod 0s is out of range"},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_rate_period": {"1h"}}, "or a limit or rate per key"},
	})
	l, err := formLimitValues(url.Values{"key_rate": {"4"}, "key_rate_period": {"1h"}, "key_max_running": {"1"}})
	if err != nil || l != (conveyor.QueueLimits{KeyMaxRunning: 1, KeyRate: 4, KeyRatePeriod: time.Hour}) {
		t.Fatalf("form key_rate 4 per 1h: %+v, %v", l, err)
	}
}

// TestLimitLinesKeyRate: the queues page says a queue's rate per key
// with the keys that used it, and the jobs waiting for their key.
func TestLimitLinesKeyRate(t *testing.T) {
	for _, c := range []struct {
		l    limitsJSON
		u    limitUseJSON
		want []string
	}{
		{limitsJSON{KeyRate: 3, KeyRatePeriod: "1h"}, limitUseJSON{KeysRated: 2, KeyHeld: 14},
			[]string{"3 per key per 1h: 2 keys at their rate", "14 waiting for their key"}},
		{limitsJSON{KeyMaxRunning: 1, KeyRate: 5, KeyRatePeriod: "1m"}, limitUseJSON{KeysRunning: 1, KeysRated: 1},
			[]string{"1 per key: 1 key running", "5 per key per 1m: 1 key at its rate"}},
		{limitsJSON{KeyRate: 2, KeyRatePeriod: "300ms"}, limitUseJSON{},
			[]string{"2 per key per 300ms: 0 keys at their rate"}},
	} {
		if got := limitLines(queueJSON{Limits: &c.l, LimitUse: &c.u}); !slices.Equal(got, c.want) {
			t.Errorf("limitLines(%+v, %+v) = %q, want %q", c.l, c.u, got, c.want)
		}
	}
}

// TestKeyRateEndToEnd: a queue's rate per key is set, read and listed
// through the API; a claim starts at most key_rate jobs of a key in the
// window (jobs without a key go on), and the queues list and page say
// the key at its rate and the job waiting for it; the form sets it.
func TestKeyRateEndToEnd(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.StatsMaxAge = time.Nanosecond })
	const q = "partners"
	var got queueLimitsJSON
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/limits", auth: adminToken,
		body: `{"key_rate": 2, "key_rate_period": "1h"}`}).json(t, &got)
	want := limitsJSON{KeyRate: 2, KeyRatePeriod: "1h", KeyRatePeriodMS: 3_600_000}
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("PUT answered %+v, want %+v", got.Limits, want)
	}
	got = queueLimitsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/limits", auth: roToken}).json(t, &got)
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("GET answered %+v, want %+v", got.Limits, want)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l[q] != (conveyor.QueueLimits{KeyRate: 2, KeyRatePeriod: time.Hour}) {
		t.Fatalf("the client reads %+v, %v", l, err)
	}

	for _, k := range []string{"acme", "acme", "acme", ""} {
		job := map[string]any{"kind": "k", "queue": q}
		if k != "" {
			job["key"] = k
		}
		e.enqueue(job)
	}
	byKey := map[string]int{}
	for range 3 { // claims after the window is full take none of acme
		for _, j := range e.claim(map[string]any{"queue": q, "limit": 10}) {
			byKey[deref(j.Key)]++
		}
	}
	if byKey["acme"] != 2 || byKey[""] != 1 || len(byKey) != 2 {
		t.Fatalf("claimed by key %v, want 2 of acme and the one without a key", byKey)
	}
	qj := e.queueOf(q)
	if qj.LimitUse == nil || qj.LimitUse.KeysRated != 1 || qj.LimitUse.KeyHeld != 1 || qj.Held == nil || *qj.Held != conveyor.HeldByKey {
		t.Fatalf("queue %+v: use %+v, held %v; want 1 key at its rate, 1 job held by key", qj, qj.LimitUse, qj.Held)
	}
	page := e.must(200, req{method: "GET", path: "/", auth: roToken})
	for _, want := range []string{"2 per key per 1h: 1 key at its rate", "1 waiting for their key", "held: key"} {
		if !strings.Contains(string(page.body), want) {
			t.Errorf("queues page lacks %q", want)
		}
	}

	res := e.do(req{method: "POST", path: "/queues/limits", auth: adminToken,
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		body:   url.Values{"queue": {q}, "op": {"set"}, "key_max_running": {"1"}, "key_rate": {"5"}, "key_rate_period": {"90s"}}.Encode()})
	if res.status != 303 {
		t.Fatalf("form set: %d %s", res.status, res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l[q] != (conveyor.QueueLimits{KeyMaxRunning: 1, KeyRate: 5, KeyRatePeriod: 90 * time.Second}) {
		t.Fatalf("after the form the client reads %+v, %v", l, err)
	}
}
