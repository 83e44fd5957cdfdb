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

// TestLimitsJSONFair: fair converts both ways.
func TestLimitsJSONFair(t *testing.T) {
	var in limitsRequest
	if err := json.Unmarshal([]byte(`{"fair": true, "max_running": 4}`), &in); err != nil {
		t.Fatal(err)
	}
	if l, err := in.limits(); err != nil || l != (conveyor.QueueLimits{MaxRunning: 4, Fair: true}) {
		t.Errorf("limits %+v, %v", l, err)
	}
	b, err := json.Marshal(toLimitsJSON(&conveyor.QueueLimits{Fair: true}))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"max_running":0,"rate":0,"rate_period":"","rate_period_ms":0,"key_max_running":0,"ordered":false,"ordered_move_on":false,` +
		`"key_rate":0,"key_rate_period":"","key_rate_period_ms":0,"fair":true}`
	if string(b) != want {
		t.Fatalf("limits JSON %s, want %s", b, want)
	}
	// The queues list counts a fair queue's weighted keys, and only a
	// fair queue's.
	rd := &reading{Stats: &conveyor.Stats{Queues: []conveyor.QueueStats{
		{Queue: "a", Limits: &conveyor.QueueLimits{Fair: true}, LimitUse: &conveyor.LimitUse{}},
		{Queue: "b", Limits: &conveyor.QueueLimits{MaxRunning: 1}, LimitUse: &conveyor.LimitUse{}},
	}}, Weights: map[string]map[string]int{"a": {"x": 2, "y": 3}, "b": {"x": 2}}}
	qs := toQueuesJSON("sqlite", rd)
	if len(qs.Queues) != 2 || qs.Queues[0].WeightedKeys != 2 || qs.Queues[1].WeightedKeys != 0 {
		t.Fatalf("queues %+v", qs.Queues)
	}
	if b, err = json.Marshal(qs.Queues[0]); err != nil || !strings.Contains(string(b), `"awaiting_dependencies":0,"weighted_keys":2}`) {
		t.Fatalf("queue JSON %s, %v", b, err)
	}
}

// TestLimitLinesFair: the queues page says a fair queue, with its
// weighted keys.
func TestLimitLinesFair(t *testing.T) {
	for _, c := range []struct {
		l    limitsJSON
		u    limitUseJSON
		w    int
		want []string
	}{
		{limitsJSON{Fair: true}, limitUseJSON{}, 0, []string{"fair"}},
		{limitsJSON{Fair: true}, limitUseJSON{}, 1, []string{"fair: 1 weighted key"}},
		{limitsJSON{MaxRunning: 5, KeyMaxRunning: 2, Fair: true}, limitUseJSON{Running: 3, KeysRunning: 2, KeyHeld: 4}, 7,
			[]string{"3/5 running", "2 per key: 2 keys running", "fair: 7 weighted keys", "4 waiting for their key"}},
	} {
		if got := limitLines(queueJSON{Limits: &c.l, LimitUse: &c.u, WeightedKeys: c.w}); !slices.Equal(got, c.want) {
			t.Errorf("limitLines(%+v, %+v, %d) = %q, want %q", c.l, c.u, c.w, got, c.want)
		}
	}
}

// TestLimitsFormFair: the form's Fair checkbox is read, and a bad value
// is refused naming it.
func TestLimitsFormFair(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	refusedForms(t, e, []refusedForm{
		{url.Values{"queue": {"q"}, "op": {"set"}, "fair": {"maybe"}}, `fair &#34;maybe&#34;: on or empty`},
		{url.Values{"queue": {"q"}, "op": {"set"}, "fair": {""}}, "or a limit or rate per key, or fair"},
	})
	l, err := formLimitValues(url.Values{"fair": {"on"}, "max_running": {"3"}})
	if err != nil || l != (conveyor.QueueLimits{MaxRunning: 3, Fair: true}) {
		t.Fatalf("form fair on: %+v, %v", l, err)
	}
	page := e.must(200, req{method: "GET", path: "/", auth: adminToken})
	if !strings.Contains(string(page.body), `name="fair" id="l-fair"`) {
		t.Errorf("the limits form lacks the Fair checkbox")
	}
}

// TestKeyWeightsAPIRefused: bad key weights are refused with 400 naming
// the key or weight, a read-only credential may not set them, and
// nothing is set.
func TestKeyWeightsAPIRefused(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	for _, c := range []refusedPUT{
		{`{"key_weights": {"acme": 0}}`, `weight 0 of key "acme" is out of range`},
		{`{"key_weights": {"acme": 2, "globex": 1001}}`, `weight 1001 of key "globex" is out of range`},
		{`{"key_weights": {"": 2}}`, "an empty key is weighed"},
		{`{"key_weights": {"` + strings.Repeat("k", 256) + `": 2}}`, "is 256 bytes: at most 255"},
		{`{"key_weights": {"acme": "3"}}`, "key_weights"},
		{`{"key_weights": {"acme": 1.5}}`, "key_weights"},
		{`{"key_weights": [3]}`, "key_weights"},
		{`{}`, "key_weights: give the keys' weights"},
		{`{"weights": {"acme": 3}}`, `unknown field "weights"`},
		{`{"queue": "other", "key_weights": {"acme": 3}}`, `queue "other" in the body is not the queue of the path`},
	} {
		res := e.do(req{method: "PUT", path: "/api/v1/queues/q/weights", auth: adminToken, body: c.body})
		var msg struct{ Error string }
		if err := json.Unmarshal(res.body, &msg); err != nil || res.status != 400 || !strings.Contains(msg.Error, c.want) {
			t.Errorf("PUT %.80s: %d %s, want 400 saying %q", c.body, res.status, res.body, c.want)
		}
	}
	if res := e.do(req{method: "PUT", path: "/api/v1/queues/q/weights", auth: roToken, body: `{"key_weights": {"acme": 3}}`}); res.status != 403 {
		t.Errorf("read-only PUT: %d %s", res.status, res.body)
	}
	if res := e.do(req{method: "GET", path: "/api/v1/queues/bad%20q/weights", auth: roToken}); res.status != 400 {
		t.Errorf("GET of a bad queue name: %d %s", res.status, res.body)
	}
	if w, err := e.client.KeyWeights(t.Context()); err != nil || len(w) != 0 {
		t.Fatalf("refused requests set weights: %v, %v", w, err)
	}
}

// TestFairEndToEnd: a fair queue is set, read and listed through the API
// and its key weights set, read, listed and removed; a claim takes one
// job of each key before a flooded key's second; the queues list and
// page say the queue is fair with its weighted keys; the form sets it.
func TestFairEndToEnd(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.StatsMaxAge = time.Nanosecond })
	const q = "tenants"
	var got queueLimitsJSON
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/limits", auth: adminToken, body: `{"fair": true}`}).json(t, &got)
	if got.Limits == nil || *got.Limits != (limitsJSON{Fair: true}) {
		t.Fatalf("PUT answered %+v", got.Limits)
	}
	got = queueLimitsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/limits", auth: roToken}).json(t, &got)
	if got.Limits == nil || *got.Limits != (limitsJSON{Fair: true}) {
		t.Fatalf("GET answered %+v", got.Limits)
	}

	var w keyWeightsJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/weights", auth: roToken}).json(t, &w)
	if w.Queue != q || w.KeyWeights == nil || len(w.KeyWeights) != 0 {
		t.Fatalf("GET weights with none answered %+v", w)
	}
	w = keyWeightsJSON{}
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/weights", auth: adminToken,
		body: `{"key_weights": {"acme": 3, "globex": 2}}`}).json(t, &w)
	if w.Queue != q || len(w.KeyWeights) != 2 || w.KeyWeights["acme"] != 3 || w.KeyWeights["globex"] != 2 {
		t.Fatalf("PUT weights answered %+v", w)
	}
	w = keyWeightsJSON{}
	e.must(200, req{method: "GET", path: "/api/v1/queues/" + q + "/weights", auth: roToken}).json(t, &w)
	if len(w.KeyWeights) != 2 || w.KeyWeights["acme"] != 3 {
		t.Fatalf("GET weights answered %+v", w)
	}
	if all, err := e.client.KeyWeights(t.Context()); err != nil || len(all[q]) != 2 {
		t.Fatalf("the client reads weights %v, %v", all, err)
	}

	// A flood of one key, enqueued first, then one job each of two
	// others: a claim of 3 takes one of each key.
	for range 10 {
		e.enqueue(map[string]any{"kind": "k", "queue": q, "key": "flood"})
	}
	e.enqueue(map[string]any{"kind": "k", "queue": q, "key": "acme"})
	e.enqueue(map[string]any{"kind": "k", "queue": q, "key": "initech"})
	byKey := map[string]int{}
	for _, j := range e.claim(map[string]any{"queue": q, "limit": 3}) {
		byKey[deref(j.Key)]++
	}
	if byKey["flood"] != 1 || byKey["acme"] != 1 || byKey["initech"] != 1 {
		t.Fatalf("a fair claim of 3 took by key %v, want one of each", byKey)
	}
	qj := e.queueOf(q)
	if qj.Limits == nil || !qj.Limits.Fair || qj.WeightedKeys != 2 || qj.Held != nil {
		t.Fatalf("queue %+v: want fair with 2 weighted keys, nothing held", qj)
	}
	if page := e.must(200, req{method: "GET", path: "/", auth: roToken}); !strings.Contains(string(page.body), "<div>fair: 2 weighted keys</div>") {
		t.Errorf("queues page lacks the fair queue's line")
	}

	// Setting the limits leaves the weights; DELETE removes them.
	e.must(200, req{method: "PUT", path: "/api/v1/queues/" + q + "/limits", auth: adminToken, body: `{"fair": true, "max_running": 5}`})
	if all, err := e.client.KeyWeights(t.Context()); err != nil || len(all[q]) != 2 {
		t.Fatalf("after PUT limits the client reads weights %v, %v", all, err)
	}
	w = keyWeightsJSON{}
	e.must(200, req{method: "DELETE", path: "/api/v1/queues/" + q + "/weights", auth: adminToken}).json(t, &w)
	if w.Queue != q || w.KeyWeights == nil || len(w.KeyWeights) != 0 {
		t.Fatalf("DELETE weights answered %+v", w)
	}
	if all, err := e.client.KeyWeights(t.Context()); err != nil || len(all) != 0 {
		t.Fatalf("after DELETE the client reads weights %v, %v", all, err)
	}
	if qj := e.queueOf(q); qj.WeightedKeys != 0 {
		t.Fatalf("queue %+v still has weighted keys", qj)
	}

	res := e.do(req{method: "POST", path: "/queues/limits", auth: adminToken,
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		body:   url.Values{"queue": {"other"}, "op": {"set"}, "fair": {"on"}, "max_running": {"2"}}.Encode()})
	if res.status != 303 {
		t.Fatalf("form set: %d %s", res.status, res.body)
	}
	if l, err := e.client.QueueLimits(t.Context()); err != nil || l["other"] != (conveyor.QueueLimits{MaxRunning: 2, Fair: true}) {
		t.Fatalf("after the form the client reads %+v, %v", l["other"], err)
	}
}
