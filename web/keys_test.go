package web

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// TestEnqueueKeyRefused: a bad limit key in any enqueue (one job, many,
// a batch with its callback, a workflow) is refused with 400 naming the
// key, and nothing is enqueued.
func TestEnqueueKeyRefused(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	long := strings.Repeat("k", conveyor.MaxKeyBytes+1)
	good := map[string]any{"kind": "k", "queue": "q", "key": "acme"}
	for _, bad := range []string{long, "a\x00b"} {
		badJob := map[string]any{"kind": "k", "queue": "q", "key": bad}
		for _, c := range []struct {
			path string
			body any
		}{
			{"/api/v1/jobs", badJob},
			{"/api/v1/jobs/batch", map[string]any{"jobs": []any{good, badJob}}},
			{"/api/v1/batches", map[string]any{"jobs": []any{good, badJob}, "callback": good}},
			{"/api/v1/batches", map[string]any{"jobs": []any{good}, "callback": badJob}},
			{"/api/v1/workflows", map[string]any{"jobs": []any{
				map[string]any{"name": "a", "kind": "k", "key": "acme"},
				map[string]any{"name": "b", "kind": "k", "key": bad, "depends_on": []string{"a"}},
			}}},
		} {
			res := e.do(req{method: "POST", path: c.path, auth: adminToken, body: c.body})
			var msg struct{ Error string }
			if err := json.Unmarshal(res.body, &msg); err != nil || res.status != 400 || !strings.Contains(msg.Error, "key") {
				t.Errorf("POST %s with key %.20q: %d %s, want 400 naming the key", c.path, bad, res.status, res.body)
			}
		}
	}
	if n := e.count(); n != 0 {
		t.Fatalf("refused enqueues left %d jobs", n)
	}
	// The longest key is taken.
	e.enqueue(map[string]any{"kind": "k", "queue": "q", "key": long[1:]})
}

// TestEnqueueJSONKey: an enqueued job's key reaches the client's options;
// none is "".
func TestEnqueueJSONKey(t *testing.T) {
	var in enqueueJSON
	if err := json.Unmarshal([]byte(`{"kind":"k","key":"tenant-7"}`), &in); err != nil {
		t.Fatal(err)
	}
	if err := in.validate(); err != nil {
		t.Fatal(err)
	}
	if it := in.item(); it.Opts.Key != "tenant-7" {
		t.Fatalf("options key %q", it.Opts.Key)
	}
	if it := (enqueueJSON{Kind: "k"}).item(); it.Opts.Key != "" {
		t.Fatalf("options key %q without one", it.Opts.Key)
	}
}

// refusedPUT is a body of PUT /api/v1/queues/q/limits and what its 400
// says.
type refusedPUT struct{ body, want string }

// refusedPUTs checks that each PUT is refused with 400 saying its want,
// and that none set limits.
func refusedPUTs(t *testing.T, e *env, cases []refusedPUT) {
	t.Helper()
	for _, c := range cases {
		res := e.do(req{method: "PUT", path: "/api/v1/queues/q/limits", auth: adminToken, body: c.body})
		var msg struct{ Error string }
		if err := json.Unmarshal(res.body, &msg); err != nil || res.status != 400 || !strings.Contains(msg.Error, c.want) {
			t.Errorf("PUT %s: %d %s, want 400 saying %q", c.body, res.status, res.body, c.want)
		}
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("refused requests set limits: %v, %v", l, err)
	}
}

// refusedForm is a form posted to /queues/limits and what its 400 says.
type refusedForm struct {
	v    url.Values
	want string
}

// refusedForms checks that each form is refused with 400 saying its
// want, and that none set limits.
func refusedForms(t *testing.T, e *env, cases []refusedForm) {
	t.Helper()
	for _, c := range cases {
		res := e.do(req{method: "POST", path: "/queues/limits", auth: adminToken,
			header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: c.v.Encode()})
		if res.status != 400 || !strings.Contains(string(res.body), c.want) {
			t.Errorf("form %v: %d, want 400 saying %s:\n%.300s", c.v, res.status, c.want, res.body)
		}
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("refused forms set limits: %v, %v", l, err)
	}
}

// TestLimitsAPIKeyRefused: bad key limits are refused with 400 naming
// the field, and nothing is set.
func TestLimitsAPIKeyRefused(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	refusedPUTs(t, e, []refusedPUT{
		{`{"key_max_running": -1}`, "KeyMaxRunning -1 is out of range"},
		{`{"key_max_running": 100001}`, "KeyMaxRunning 100001 is out of range"},
		{`{"key_max_running": 2, "ordered": true}`, "KeyMaxRunning 2 with Ordered"},
		{`{"ordered_move_on": true}`, "OrderedMoveOn is set without Ordered"},
		{`{"ordered": "yes"}`, "ordered"},
		{`{"key_max_running": 1.5}`, "key_max_running"},
		{`{"keyMaxRunning": 1}`, `unknown field "keyMaxRunning"`},
	})
}

// TestLimitsJSONKeys: the key limits convert both ways; Ordered shows a
// key_max_running of 1, what it implies.
func TestLimitsJSONKeys(t *testing.T) {
	var in limitsRequest
	if err := json.Unmarshal([]byte(`{"max_running": 3, "key_max_running": 2}`), &in); err != nil {
		t.Fatal(err)
	}
	l, err := in.limits()
	if err != nil || l != (conveyor.QueueLimits{MaxRunning: 3, KeyMaxRunning: 2}) {
		t.Fatalf("limits %+v, %v", l, err)
	}
	in = limitsRequest{}
	if err := json.Unmarshal([]byte(`{"ordered": true, "ordered_move_on": true}`), &in); err != nil {
		t.Fatal(err)
	}
	if l, err = in.limits(); err != nil || l != (conveyor.QueueLimits{Ordered: true, OrderedMoveOn: true}) {
		t.Fatalf("limits %+v, %v", l, err)
	}
	b, err := json.Marshal(toLimitsJSON(&l))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":1,"ordered":true,"ordered_move_on":true,"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":false}`
	if string(b) != want {
		t.Fatalf("limits JSON %s, want %s", b, want)
	}
	if got := toLimitsJSON(&conveyor.QueueLimits{KeyMaxRunning: 4}); got == nil || *got != (limitsJSON{KeyMaxRunning: 4}) {
		t.Fatalf("key limits alone: %+v", got)
	}
}

// TestLimitLinesKeys: the queues page says a queue's key limits with
// their use, and the jobs waiting for their key.
func TestLimitLinesKeys(t *testing.T) {
	for _, c := range []struct {
		l    limitsJSON
		u    limitUseJSON
		want []string
	}{
		{limitsJSON{KeyMaxRunning: 2}, limitUseJSON{KeysRunning: 3, KeyHeld: 4}, []string{"2 per key: 3 keys running", "4 waiting for their key"}},
		{limitsJSON{MaxRunning: 5, KeyMaxRunning: 1, Ordered: true}, limitUseJSON{Running: 1, KeysRunning: 1}, []string{"1/5 running", "ordered by key: 1 key running"}},
		{limitsJSON{KeyMaxRunning: 1, Ordered: true, OrderedMoveOn: true}, limitUseJSON{KeyHeld: 1}, []string{"ordered by key, moving on: 0 keys running", "1 waiting for their key"}},
	} {
		if got := limitLines(queueJSON{Limits: &c.l, LimitUse: &c.u}); !slices.Equal(got, c.want) {
			t.Errorf("limitLines(%+v, %+v) = %q, want %q", c.l, c.u, got, c.want)
		}
	}
}

// TestLimitsFormKeyRefused: the form's key fields are read naming them,
// and bad values are refused.
func TestLimitsFormKeyRefused(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	refusedForms(t, e, []refusedForm{
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_max_running": {"two"}}, `per key &#34;two&#34; is not a whole number`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_order": {"sorted"}}, `key order &#34;sorted&#34;`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_max_running": {"-3"}}, "KeyMaxRunning -3 is out of range"},
		{url.Values{"queue": {"q"}, "op": {"set"}, "key_max_running": {"3"}, "key_order": {"ordered"}}, "KeyMaxRunning 3 with Ordered"},
	})
	l, err := formLimitValues(url.Values{"key_max_running": {"4"}})
	if err != nil || l != (conveyor.QueueLimits{KeyMaxRunning: 4}) {
		t.Fatalf("form key_max_running 4: %+v, %v", l, err)
	}
	l, err = formLimitValues(url.Values{"key_order": {"move_on"}})
	if err != nil || l != (conveyor.QueueLimits{Ordered: true, OrderedMoveOn: true}) {
		t.Fatalf("form key_order move_on: %+v, %v", l, err)
	}
}

// TestJobKeysAndKeyLimits: a job's key enqueued through any endpoint
// comes back from a job's GET, a page of jobs (full and summary) and a
// claim; a queue's key limits are set, read and listed with their use;
// a claim holds each key to its limit and the queues list says the rest
// wait for their key.
func TestJobKeysAndKeyLimits(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.StatsMaxAge = time.Nanosecond })
	const q = "tenants"
	var got queueLimitsJSON
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/limits", auth: adminToken,
		body: `{"key_max_running": 1}`}).json(t, &got)
	want := limitsJSON{KeyMaxRunning: 1}
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("PUT answered %+v, want %+v", got.Limits, want)
	}
	got = queueLimitsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/limits", auth: roToken}).json(t, &got)
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("GET answered %+v, want %+v", got.Limits, want)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l[q] != (conveyor.QueueLimits{KeyMaxRunning: 1}) {
		t.Fatalf("the client reads %+v, %v", l, err)
	}

	// Keys through every way to enqueue.
	keys := map[int64]string{}
	keys[e.enqueue(map[string]any{"kind": "k", "queue": q, "key": "acme"})] = "acme"
	var many struct{ IDs []int64 }
	e.must(201, req{method: "POST", path: "/api/v1/jobs/batch", auth: adminToken, body: map[string]any{"jobs": []any{
		map[string]any{"kind": "k", "queue": q, "key": "acme"},
		map[string]any{"kind": "k", "queue": q, "key": "globex"},
		map[string]any{"kind": "k", "queue": q},
		map[string]any{"kind": "k", "queue": q, "key": "acme"},
	}}}).json(t, &many)
	for i, k := range []string{"acme", "globex", "", "acme"} {
		keys[many.IDs[i]] = k
	}
	var b batchEnqueuedJSON
	e.must(201, req{method: "POST", path: "/api/v1/batches", auth: adminToken, body: map[string]any{
		"jobs":     []any{map[string]any{"kind": "k", "queue": "other", "key": "initech", "delay_ms": 3_600_000}},
		"callback": map[string]any{"kind": "cb", "queue": "other", "key": "cb-key"},
	}}).json(t, &b)
	keys[b.IDs[0]] = "initech"
	var wf workflowEnqueuedJSON
	e.must(201, req{method: "POST", path: "/api/v1/workflows", auth: adminToken, body: map[string]any{"jobs": []any{
		map[string]any{"name": "a", "kind": "k", "queue": "other", "key": "wf-a", "delay_ms": 3_600_000},
		map[string]any{"name": "b", "kind": "k", "queue": "other", "key": "wf-b", "depends_on": []string{"a"}},
	}}}).json(t, &wf)
	keys[wf.JobIDs["a"]] = "wf-a"
	for id, k := range keys {
		j := e.job(id)
		if k == "" && j.Key != nil || k != "" && (j.Key == nil || *j.Key != k) {
			t.Errorf("job %d: key %v, want %q", id, j.Key, k)
		}
	}
	var page jobPage
	e.must(200, req{method: "GET", path: "/api/v1/jobs?queue=" + q, auth: roToken}).json(t, &page)
	var summary struct{ Jobs []jobSummaryJSON }
	e.must(200, req{method: "GET", path: "/api/v1/jobs?view=summary&queue=" + q, auth: roToken}).json(t, &summary)
	if len(page.Jobs) != 5 || len(summary.Jobs) != 5 {
		t.Fatalf("listed %d jobs and %d summaries, want 5", len(page.Jobs), len(summary.Jobs))
	}
	for i, j := range page.Jobs {
		if k := keys[j.ID]; deref(j.Key) != k || deref(summary.Jobs[i].Key) != k {
			t.Errorf("listed job %d: key %v, summary %v, want %q", j.ID, j.Key, summary.Jobs[i].Key, k)
		}
	}

	// One job per key runs at once, and the job without a key is not
	// held; each claimed job carries its key.
	claimed := e.claim(map[string]any{"queue": q, "limit": 10})
	byKey := map[string]int{}
	for _, j := range claimed {
		if k := keys[j.ID]; deref(j.Key) != k {
			t.Errorf("claimed job %d: key %v, want %q", j.ID, j.Key, k)
		}
		byKey[deref(j.Key)]++
	}
	if len(claimed) != 3 || byKey["acme"] != 1 || byKey["globex"] != 1 || byKey[""] != 1 {
		t.Fatalf("claimed %d jobs by key %v, want one of acme, of globex and without a key", len(claimed), byKey)
	}
	qj := e.queueOf(q)
	if qj.LimitUse == nil || qj.LimitUse.KeysRunning != 2 || qj.LimitUse.KeyHeld != 2 || qj.Held == nil || *qj.Held != conveyor.HeldByKey {
		t.Fatalf("queue %+v: use %+v, held %v; want 2 keys running, 2 jobs held by key", qj, qj.LimitUse, qj.Held)
	}
	page2 := e.must(200, req{method: "GET", path: "/", auth: roToken})
	for _, want := range []string{"1 per key: 2 keys running", "2 waiting for their key", "held: key"} {
		if !strings.Contains(string(page2.body), want) {
			t.Errorf("queues page lacks %q", want)
		}
	}
	for id, k := range map[int64]string{many.IDs[1]: "globex", many.IDs[2]: ""} {
		jp := string(e.must(200, req{method: "GET", path: fmt.Sprintf("/jobs/%d", id), auth: roToken}).body)
		if k != "" && !strings.Contains(jp, `<dd data-field="key" id="job-key"><code>`+k+`</code></dd>`) ||
			k == "" && !strings.Contains(jp, `<dd data-field="key" id="job-key"><span class="muted"`) {
			t.Errorf("job page of %d does not show its key %q", id, k)
		}
	}

	// Ordered: set and read, with key_max_running 1 as it implies.
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/limits", auth: adminToken,
		body: `{"max_running": 4, "ordered": true, "ordered_move_on": true}`}).json(t, &got)
	want = limitsJSON{MaxRunning: 4, KeyMaxRunning: 1, Ordered: true, OrderedMoveOn: true}
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("PUT ordered answered %+v, want %+v", got.Limits, want)
	}
	got = queueLimitsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/limits", auth: roToken}).json(t, &got)
	if got.Limits == nil || *got.Limits != want {
		t.Fatalf("GET ordered answered %+v, want %+v", got.Limits, want)
	}
	if qj := e.queueOf(q); qj.Limits == nil || *qj.Limits != want {
		t.Fatalf("queues list ordered limits %+v, want %+v", qj.Limits, want)
	}

	// The dashboard's form sets key limits too.
	res := e.do(req{method: "POST", path: "/queues/limits", auth: adminToken,
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		body:   url.Values{"queue": {q}, "op": {"set"}, "key_max_running": {"3"}}.Encode()})
	if res.status != 303 {
		t.Fatalf("form set key_max_running: %d %s", res.status, res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l[q] != (conveyor.QueueLimits{KeyMaxRunning: 3}) {
		t.Fatalf("after the form: %+v, %v", l[q], err)
	}
	res = e.do(req{method: "POST", path: "/queues/limits", auth: adminToken,
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		body:   url.Values{"queue": {q}, "op": {"set"}, "key_order": {"ordered"}}.Encode()})
	if l, err := e.client.QueueLimits(t.Context()); res.status != 303 || err != nil || !l[q].Ordered || l[q].OrderedMoveOn || l[q].KeyMaxRunning > 1 {
		t.Fatalf("after the ordered form (%d): %+v, %v", res.status, l[q], err)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
