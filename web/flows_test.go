package web

import (
	"fmt"
	"strings"
	"testing"
)

// TestEnqueueBatchWithCallback: POST /api/v1/batches enqueues the jobs
// and keeps the callback with the batch, which GET /api/v1/batches/{id}
// then shows; bad input answers 400 naming the field at fault and
// writes nothing; a read-only token is refused.
func TestEnqueueBatchWithCallback(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		bad := []struct {
			body any
			want string
		}{
			{map[string]any{"jobs": []any{}, "callback": map[string]any{"kind": "cb"}}, `"jobs" is empty`},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}}, `"callback" is missing`},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}, "callback": map[string]any{"kind": "cb", "delay_ms": -5}}, "callback: delay_ms -5"},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}, map[string]any{"kind": "k", "timeout_ms": 1 << 62}}, "callback": map[string]any{"kind": "cb"}}, "job 1: timeout_ms"},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k", "unique": map[string]any{"by_args": true}}}, "callback": map[string]any{"kind": "cb"}}, "job 0 is unique"},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}, "callback": map[string]any{"kind": "<bad>"}}, "kind name"},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}, "callback": map[string]any{"kind": "cb"}, "extra": 1}, `unknown field "extra"`},
		}
		for _, c := range bad {
			var out struct{ Error string }
			e.must(400, req{method: "POST", path: "/api/v1/batches", auth: adminToken, body: c.body}).json(t, &out)
			if !strings.Contains(out.Error, c.want) {
				t.Errorf("%v: error %q lacks %q", c.body, out.Error, c.want)
			}
		}
		ok := map[string]any{"jobs": []any{map[string]any{"kind": "k", "args": map[string]int{"n": 1}}, map[string]any{"kind": "k"}},
			"callback": map[string]any{"kind": "cb", "queue": "after"}}
		e.must(403, req{method: "POST", path: "/api/v1/batches", auth: roToken, body: ok})
		if n := e.count(); n != 0 {
			t.Fatalf("%d jobs written by refused batches", n)
		}
		var got batchEnqueuedJSON
		e.must(201, req{method: "POST", path: "/api/v1/batches", auth: adminToken, body: ok}).json(t, &got)
		if got.BatchID <= 0 || len(got.IDs) != 2 {
			t.Fatalf("answer %+v", got)
		}
		var b BatchJSON
		e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/batches/%d", got.BatchID), auth: roToken}).json(t, &b)
		if b.ID != got.BatchID || b.CallbackKind != "cb" || b.CallbackID != nil || b.Finished || len(b.Jobs) != 2 ||
			b.Jobs[0].ID != got.IDs[0] || b.Jobs[1].ID != got.IDs[1] || b.Counts["available"] != 2 {
			t.Errorf("batch %+v, enqueued %+v", b, got)
		}
		if n := e.count(); n != 2 {
			t.Errorf("%d jobs exist, want the batch's 2 (the callback waits with the batch)", n)
		}
	})
}

// TestEnqueueWorkflow: POST /api/v1/workflows enqueues a diamond
// A -> B, C -> D: A at once, B, C and D as callbacks of batches whose
// jobs are their dependencies; bad names, dependencies, cycles and
// policies answer 400 naming them and write nothing.
func TestEnqueueWorkflow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		job := func(name string, deps ...string) map[string]any {
			return map[string]any{"name": name, "kind": "step", "args": map[string]string{"step": name}, "depends_on": deps}
		}
		bad := []struct {
			body any
			want string
		}{
			{map[string]any{"jobs": []any{}}, `"jobs" is empty`},
			{map[string]any{"jobs": []any{job("a")}, "on_dependency_failure": "ignore"}, `on_dependency_failure "ignore"`},
			{map[string]any{"jobs": []any{job("a"), job("a")}}, `name "a" is used twice`},
			{map[string]any{"jobs": []any{job("")}}, "job 0 has no name"},
			{map[string]any{"jobs": []any{job("a"), job("b", "x")}}, `"b" depends on "x"`},
			{map[string]any{"jobs": []any{job("a"), job("b", "c"), job("c", "b")}}, "cycle"},
			{map[string]any{"jobs": []any{job("a"), map[string]any{"name": "b", "kind": "k", "depends_on": []string{"a"}, "delay_ms": -1}}}, `job 1 ("b"): delay_ms -1`},
			{map[string]any{"jobs": []any{map[string]any{"name": "a", "kind": "k", "unique": map[string]any{"by_args": true}}}}, `job "a" is unique`},
		}
		for _, c := range bad {
			var out struct{ Error string }
			e.must(400, req{method: "POST", path: "/api/v1/workflows", auth: adminToken, body: c.body}).json(t, &out)
			if !strings.Contains(out.Error, c.want) {
				t.Errorf("%v: error %q lacks %q", c.body, out.Error, c.want)
			}
		}
		diamond := map[string]any{"jobs": []any{job("d", "b", "c"), job("b", "a"), job("c", "a"), job("a")}, "on_dependency_failure": "run"}
		e.must(403, req{method: "POST", path: "/api/v1/workflows", auth: roToken, body: diamond})
		if n := e.count(); n != 0 {
			t.Fatalf("%d jobs written by refused workflows", n)
		}
		var wf workflowEnqueuedJSON
		e.must(201, req{method: "POST", path: "/api/v1/workflows", auth: adminToken, body: diamond}).json(t, &wf)
		if len(wf.JobIDs) != 1 || wf.JobIDs["a"] <= 0 || len(wf.BatchIDs) != 3 || wf.BatchIDs["b"] <= 0 || wf.BatchIDs["c"] <= 0 || wf.BatchIDs["d"] <= 0 {
			t.Fatalf("answer %+v", wf)
		}
		for _, name := range []string{"b", "c"} {
			var b BatchJSON
			e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/batches/%d", wf.BatchIDs[name]), auth: roToken}).json(t, &b)
			if len(b.Jobs) != 1 || b.Jobs[0].ID != wf.JobIDs["a"] || b.CallbackKind != "step" {
				t.Errorf("batch of %s: %+v, want a's job %d as its only job", name, b, wf.JobIDs["a"])
			}
		}
		if n := e.count(); n != 1 {
			t.Errorf("%d jobs exist, want only a (the others wait for their dependencies)", n)
		}
	})
}
