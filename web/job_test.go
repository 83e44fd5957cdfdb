package web

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// TestNewJobJSON: the one encoding of a job, which the API and the
// command both write, byte for byte: snake_case keys in a fixed order,
// UTC times with microseconds, null for what is absent, {} for absent
// arguments, -1 for no timeout, [] for no errors, null for empty
// metadata, and no fence.
func TestNewJobJSON(t *testing.T) {
	paris := time.FixedZone("CEST", 2*3600)
	at := time.Date(2025, 6, 1, 12, 0, 0, 123456789, paris)
	cases := []struct {
		name string
		j    conveyor.JobInfo
		want string
	}{
		{"full", conveyor.JobInfo{
			ID: 7, Queue: "mail", Kind: "send_email", EncodedArgs: json.RawMessage(`{"to":"a@example.com"}`),
			State: conveyor.JobStateRunning, Priority: -2, Attempt: 2, MaxAttempts: 5, Timeout: 1500 * time.Millisecond,
			CreatedAt: at, ScheduledAt: at.Add(time.Second), AttemptedAt: at.Add(2 * time.Second), AttemptedBy: "host/42/ab",
			LeaseExpiresAt: at.Add(30 * time.Second),
			Errors: []conveyor.AttemptError{
				{Attempt: 1, At: at.Add(time.Millisecond), Error: "boom", Trace: "main.go:3"},
				{Attempt: 2, At: at.Add(2 * time.Millisecond), Error: "again"},
			},
			Metadata: map[string]string{"tenant": "acme", "traceparent": "00-abc-01"}, Key: "acme",
		}, `{"id":7,"queue":"mail","kind":"send_email","state":"running","args":{"to":"a@example.com"},` +
			`"priority":-2,"attempt":2,"max_attempts":5,"timeout_ms":1500,` +
			`"created_at":"2025-06-01T10:00:00.123456Z","scheduled_at":"2025-06-01T10:00:01.123456Z",` +
			`"attempted_at":"2025-06-01T10:00:02.123456Z","attempted_by":"host/42/ab",` +
			`"lease_expires_at":"2025-06-01T10:00:30.123456Z","finalized_at":null,` +
			`"errors":[{"attempt":1,"at":"2025-06-01T10:00:00.124456Z","error":"boom","trace":"main.go:3"},` +
			`{"attempt":2,"at":"2025-06-01T10:00:00.125456Z","error":"again","trace":null}],` +
			`"metadata":{"tenant":"acme","traceparent":"00-abc-01"},"key":"acme","result":null}`},
		{"empty", conveyor.JobInfo{
			ID: 1, Queue: "default", Kind: "k", State: conveyor.JobStateCompleted, MaxAttempts: 25, Timeout: -1,
			CreatedAt: at, ScheduledAt: at, FinalizedAt: at, Metadata: map[string]string{},
		}, `{"id":1,"queue":"default","kind":"k","state":"completed","args":{},` +
			`"priority":0,"attempt":0,"max_attempts":25,"timeout_ms":-1,` +
			`"created_at":"2025-06-01T10:00:00.123456Z","scheduled_at":"2025-06-01T10:00:00.123456Z",` +
			`"attempted_at":null,"attempted_by":null,"lease_expires_at":null,` +
			`"finalized_at":"2025-06-01T10:00:00.123456Z","errors":[],"metadata":null,"key":null,"result":null}`},
		{"result", conveyor.JobInfo{
			ID: 2, Queue: "default", Kind: "k", State: conveyor.JobStateCompleted, MaxAttempts: 25,
			CreatedAt: at, ScheduledAt: at, FinalizedAt: at, Result: json.RawMessage(`{"sum":3}`),
		}, `{"id":2,"queue":"default","kind":"k","state":"completed","args":{},` +
			`"priority":0,"attempt":0,"max_attempts":25,"timeout_ms":null,` +
			`"created_at":"2025-06-01T10:00:00.123456Z","scheduled_at":"2025-06-01T10:00:00.123456Z",` +
			`"attempted_at":null,"attempted_by":null,"lease_expires_at":null,` +
			`"finalized_at":"2025-06-01T10:00:00.123456Z","errors":[],"metadata":null,"key":null,"result":{"sum":3}}`},
	}
	for _, c := range cases {
		b, err := json.Marshal(NewJobJSON(&c.j))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, b, c.want)
		}
		var back JobJSON
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: decoding %s: %v", c.name, b, err)
		}
		if again, _ := json.Marshal(back); string(again) != c.want {
			t.Errorf("%s: decoded and encoded again:\n got %s\nwant %s", c.name, again, c.want)
		}
	}
}

// jobKeys are the keys of every job the API answers, in order; a claimed
// job adds fence.
var jobKeys = []string{"id", "queue", "kind", "state", "args", "priority", "attempt", "max_attempts", "timeout_ms",
	"created_at", "scheduled_at", "attempted_at", "attempted_by", "lease_expires_at", "finalized_at", "errors", "metadata", "key", "result"}

// objectKeys returns the keys of the JSON object b in their order.
func objectKeys(t *testing.T, b []byte) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", b)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// withoutFence returns the claimed job b without its fence, and the fence.
func withoutFence(t *testing.T, b []byte) ([]byte, int64) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var fence int64
	if err := json.Unmarshal(m["fence"], &fence); err != nil || fence <= 0 {
		t.Fatalf("claimed job without a fence: %s", b)
	}
	delete(m, "fence")
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out, fence
}

// sorted returns the JSON object b with its keys sorted.
func sorted(t *testing.T, b []byte) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestJobMetadata: metadata enqueued through the API, alone or in a
// batch, comes back from a job's GET, a page of jobs, a claim and an
// admin action; a job without metadata, or with an empty object, has
// "metadata": null; and a claimed job is the job GET answers plus its
// fence, errors, timeout and metadata included.
func TestJobMetadata(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		meta := map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "émoji": "✓ <&>"}
		one := e.enqueue(map[string]any{"kind": "k", "queue": "meta", "args": map[string]int{"n": 1}, "metadata": meta, "timeout_ms": 2500})
		// The batch's jobs are due later, so that the claims below take the
		// first job.
		const later = 3_600_000
		var batch struct{ IDs []int64 }
		e.must(201, req{method: "POST", path: "/api/v1/jobs/batch", auth: adminToken, body: map[string]any{"jobs": []map[string]any{
			{"kind": "k", "queue": "meta", "delay_ms": later, "metadata": map[string]string{"request": "r-2"}},
			{"kind": "k", "queue": "meta", "delay_ms": later},
			{"kind": "k", "queue": "meta", "delay_ms": later, "metadata": map[string]string{}},
			{"kind": "k", "queue": "meta", "delay_ms": later, "metadata": nil},
		}}}).json(t, &batch)
		if len(batch.IDs) != 4 {
			t.Fatalf("batch ids %v", batch.IDs)
		}
		want := map[int64]map[string]string{one: meta, batch.IDs[0]: {"request": "r-2"}}

		raw := func(id int64) []byte {
			return e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs/%d", id), auth: roToken}).body
		}
		check := func(what string, id int64, b []byte) {
			t.Helper()
			var j JobJSON
			if err := json.Unmarshal(b, &j); err != nil {
				t.Fatalf("%s: %v: %s", what, err, b)
			}
			if j.ID != id {
				t.Fatalf("%s: job %d, want %d", what, j.ID, id)
			}
			if w := want[id]; !reflect.DeepEqual(j.Metadata, w) {
				t.Errorf("%s: job %d metadata %v, want %v", what, id, j.Metadata, w)
			}
			if want[id] == nil && !strings.Contains(string(b), `"metadata":null`) {
				t.Errorf("%s: job %d without metadata: %s, want \"metadata\":null", what, id, b)
			}
		}
		ids := append([]int64{one}, batch.IDs...)
		for _, id := range ids {
			b := raw(id)
			check("GET", id, b)
			if keys := objectKeys(t, b); !slices.Equal(keys, jobKeys) {
				t.Errorf("GET job %d: keys %v, want %v", id, keys, jobKeys)
			}
		}
		var page struct{ Jobs []json.RawMessage }
		e.must(200, req{method: "GET", path: "/api/v1/jobs?queue=meta", auth: roToken}).json(t, &page)
		if len(page.Jobs) != len(ids) {
			t.Fatalf("list: %d jobs, want %d", len(page.Jobs), len(ids))
		}
		for i, b := range page.Jobs {
			check("list", ids[i], b)
			if got, get := string(b), strings.TrimSpace(string(raw(ids[i]))); got != get {
				t.Errorf("list job %d:\n%s\nGET:\n%s", ids[i], got, get)
			}
		}

		// The first job, claimed, failed with a trace, retried and claimed
		// again: the claim is the job as GET answers it plus the fence.
		claim := func() []byte {
			var out struct{ Jobs []json.RawMessage }
			e.must(200, req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"queue": "meta", "worker": "w1"}}).json(t, &out)
			if len(out.Jobs) != 1 {
				t.Fatalf("claimed %d jobs, want 1", len(out.Jobs))
			}
			if keys := objectKeys(t, out.Jobs[0]); !slices.Equal(keys, append(slices.Clone(jobKeys), "fence")) {
				t.Errorf("claimed job: keys %v, want %v and fence", keys, jobKeys)
			}
			return out.Jobs[0]
		}
		first := claim()
		check("claim", one, first)
		plain, fence := withoutFence(t, first)
		if got, get := string(plain), sorted(t, raw(one)); got != get {
			t.Errorf("claimed job without its fence:\n%s\nGET:\n%s", got, get)
		}
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", one), auth: adminToken,
			body: map[string]any{"fence": fence, "error": "boom", "trace": "at line 3", "retry_in_ms": 60000}})
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/retry", one), auth: adminToken})
		second := claim()
		check("second claim", one, second)
		plain, fence = withoutFence(t, second)
		var j JobJSON
		if err := json.Unmarshal(plain, &j); err != nil || len(j.Errors) != 1 || j.Errors[0].Trace == nil || j.TimeoutMS == nil || *j.TimeoutMS != 2500 || j.Attempt != 2 {
			t.Errorf("second claim: %v %s", err, plain)
		}
		if got, get := string(plain), sorted(t, raw(one)); got != get {
			t.Errorf("claimed job without its fence:\n%s\nGET:\n%s", got, get)
		}
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", one), auth: adminToken, body: map[string]any{"fence": fence}})

		// An admin action answers the job, metadata included.
		b := e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", batch.IDs[0]), auth: adminToken}).body
		check("cancel", batch.IDs[0], b)
	})
}

// TestEnqueueMetadataRefused: metadata the library refuses (a NUL
// character, over MaxMetadataBytes) or that is not an object of strings
// answers 400 naming what is wrong, and writes nothing, alone or in a
// batch.
func TestEnqueueMetadataRefused(t *testing.T) {
	e := newEnv(t, backends[0].dsn(t), nil)
	big := map[string]string{"pad": strings.Repeat("x", conveyor.MaxMetadataBytes)}
	cases := []struct {
		name string
		meta any
		want []string
	}{
		{"NUL in a value", map[string]string{"k": "a\x00b"}, []string{`metadata key "k"`, "NUL"}},
		{"NUL in a key", map[string]string{"a\x00b": "v"}, []string{"metadata key", "NUL"}},
		{"too large", big, []string{"metadata is", fmt.Sprintf("over the %d-byte limit", conveyor.MaxMetadataBytes)}},
		{"not strings", map[string]any{"n": 1}, []string{"metadata", "string"}},
		{"not an object", []string{"a"}, []string{"metadata"}},
	}
	for _, c := range cases {
		var out struct{ Error string }
		e.must(400, req{method: "POST", path: "/api/v1/jobs", auth: adminToken, body: map[string]any{"kind": "k", "metadata": c.meta}}).json(t, &out)
		for _, w := range c.want {
			if !strings.Contains(out.Error, w) {
				t.Errorf("%s: error %q lacks %q", c.name, out.Error, w)
			}
		}
		e.must(400, req{method: "POST", path: "/api/v1/jobs/batch", auth: adminToken, body: map[string]any{"jobs": []map[string]any{
			{"kind": "k"}, {"kind": "k", "metadata": c.meta},
		}}}).json(t, &out)
		for _, w := range c.want {
			if !strings.Contains(out.Error, w) {
				t.Errorf("%s in a batch: error %q lacks %q", c.name, out.Error, w)
			}
		}
		if c.name == "NUL in a value" && !strings.Contains(out.Error, "job 1 of 2") {
			t.Errorf("%s in a batch: error %q does not name job 1 of 2", c.name, out.Error)
		}
	}
	if n := e.count(); n != 0 {
		t.Errorf("%d jobs written by refused enqueues", n)
	}
	// Just under the limit is taken.
	ok := map[string]string{"pad": strings.Repeat("x", conveyor.MaxMetadataBytes-len(`{"pad":""}`))}
	id := e.enqueue(map[string]any{"kind": "k", "metadata": ok})
	if j := e.job(id); !reflect.DeepEqual(j.Metadata, ok) {
		t.Errorf("metadata of %d bytes did not come back", conveyor.MaxMetadataBytes)
	}
}

// TestOpenAPIJobSchemas: openapi.json's Job has JobJSON's keys and
// requires all but fence, and its EnqueueRequest has enqueueJSON's keys.
func TestOpenAPIJobSchemas(t *testing.T) {
	b, err := assets.ReadFile("assets/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	type schema struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	var doc struct {
		Components struct{ Schemas map[string]schema } `json:"components"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	tags := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			out = append(out, name)
		}
		return out
	}
	props := func(s schema) []string {
		var out []string
		for k := range s.Properties {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	job := doc.Components.Schemas["Job"]
	if got, want := props(job), slices.Sorted(slices.Values(tags(JobJSON{}))); !slices.Equal(got, want) {
		t.Errorf("openapi Job: properties %v, want %v", got, want)
	}
	if got, want := slices.Sorted(slices.Values(job.Required)), slices.Sorted(slices.Values(jobKeys)); !slices.Equal(got, want) {
		t.Errorf("openapi Job: required %v, want %v", got, want)
	}
	if got, want := props(doc.Components.Schemas["EnqueueRequest"]), slices.Sorted(slices.Values(tags(enqueueJSON{}))); !slices.Equal(got, want) {
		t.Errorf("openapi EnqueueRequest: properties %v, want %v", got, want)
	}
}
