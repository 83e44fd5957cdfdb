package web

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/conveyorq/conveyor"
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
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}, "callback": map[string]any{"kind": "<bad>"}}, `batch callback: conveyor: unknown job kind: kind name "<bad>"`},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}, map[string]any{"kind": "k", "max_attempts": -1}}, "callback": map[string]any{"kind": "cb"}}, "batch job 1 of 2: conveyor: invalid enqueue options: max attempts -1"},
			{map[string]any{"jobs": []any{map[string]any{"kind": "k"}}, "callback": map[string]any{"kind": "cb", "max_attempts": 5000}}, "batch callback: conveyor: invalid enqueue options: max attempts 5000"},
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
			// x is second in dependency order, third in the request: named.
			{map[string]any{"jobs": []any{job("d", "a"), job("a"), map[string]any{"name": "x", "kind": "<bad>"}}}, `workflow job "x": conveyor: unknown job kind: kind name "<bad>"`},
			{map[string]any{"jobs": []any{job("d", "a"), job("a"), map[string]any{"name": "x", "kind": "k", "max_attempts": -1}}}, `workflow job "x": conveyor: invalid enqueue options: max attempts -1`},
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
		// d's batch waits for b's and c's, whose jobs do not exist yet:
		// not finished, and its page links them.
		var d BatchJSON
		e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/batches/%d", wf.BatchIDs["d"]), auth: roToken}).json(t, &d)
		waits := []int64{wf.BatchIDs["b"], wf.BatchIDs["c"]}
		slices.Sort(waits)
		if d.Finished || len(d.Jobs) != 0 || !slices.Equal(d.WaitingFor, waits) {
			t.Errorf("batch of d: %+v, want not finished, no jobs, waiting for %v", d, waits)
		}
		page := string(e.must(200, req{method: "GET", path: fmt.Sprintf("/batches/%d", wf.BatchIDs["d"]), auth: roToken}).body)
		if !strings.Contains(page, `id="batch-waiting"`) || !strings.Contains(page, fmt.Sprintf(`/batches/%d"`, waits[0])) || !strings.Contains(page, ">waiting</span>") {
			t.Errorf("batch page of d does not show it waiting for batches %v", waits)
		}
	})
}

// TestBatchAndResultPages: a job's page shows its result as text, and a
// batch's page lists its jobs with their states and results as text,
// its callback still waiting; a bad or unknown batch id answers 400 or
// 404.
func TestBatchAndResultPages(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	payload := strings.Join(xss, " ")
	var got batchEnqueuedJSON
	e.must(201, req{method: "POST", path: "/api/v1/batches", auth: adminToken, body: map[string]any{
		"jobs":     []any{map[string]any{"kind": "part", "queue": "b"}, map[string]any{"kind": "part", "queue": "b"}},
		"callback": map[string]any{"kind": "total", "queue": "b"},
	}}).json(t, &got)
	c := e.claim(map[string]any{"queue": "b"})
	if len(c) != 1 || c[0].ID != got.IDs[0] {
		t.Fatalf("claimed %+v, want job %d", c, got.IDs[0])
	}
	e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", c[0].ID), auth: adminToken,
		body: map[string]any{"fence": *c[0].Fence, "result": map[string]any{"note": payload, "n": 7}}})

	escaped := "&lt;script&gt;alert(1)&lt;/script&gt;"
	checkPage := func(path string, want ...string) string {
		t.Helper()
		res := e.must(200, req{method: "GET", path: path, auth: roToken})
		body := string(res.body)
		for _, bad := range []string{"<script>alert", "<img src=x", "<svg onload", "onerror=alert(1)>"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s: raw %q in the page", path, bad)
			}
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s: page lacks %q", path, w)
			}
		}
		if csp := res.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
		return body
	}
	checkPage(fmt.Sprintf("/jobs/%d", got.IDs[0]), `id="job-result">`, escaped, `&#34;n&#34;: 7`)
	body := checkPage(fmt.Sprintf("/jobs/%d", got.IDs[1]), `id="job-result-none">none yet`)
	if strings.Contains(body, `id="job-batch"`) {
		t.Errorf("job %d, a batch's job and no callback, links a batch as its callback's", got.IDs[1])
	}
	body = checkPage(fmt.Sprintf("/batches/%d", got.BatchID), `id="batch-jobs"`, escaped, "1 of 2 finished",
		"total, enqueued once every job has finished", `<span class="badge st-completed">completed</span>`,
		`<span class="badge st-available">available</span>`, fmt.Sprintf(`/jobs/%d"`, got.IDs[1]))
	if strings.Count(body, `<tr data-id=`) != 2 {
		t.Errorf("batch page lists %d jobs, want 2", strings.Count(body, `<tr data-id=`))
	}
	e.must(400, req{method: "GET", path: "/batches/x", auth: roToken})
	e.must(404, req{method: "GET", path: "/batches/999999", auth: roToken})
	// Unauthenticated, the batch page is the login.
	if res := e.do(req{method: "GET", path: fmt.Sprintf("/batches/%d", got.BatchID)}); res.status != 401 || strings.Contains(string(res.body), "batch-jobs") {
		t.Errorf("batch page without credentials: %d", res.status)
	}
}

// TestQueuesAwaitingDependencies: the jobs of a workflow waiting for
// their dependencies are counted by their queue in the queues list and
// shown on the queues page; a queue with only such jobs is listed.
func TestQueuesAwaitingDependencies(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e.must(201, req{method: "POST", path: "/api/v1/workflows", auth: adminToken, body: map[string]any{"jobs": []any{
		map[string]any{"name": "a", "kind": "step", "queue": "first"},
		map[string]any{"name": "b", "kind": "step", "queue": "second", "depends_on": []string{"a"}},
		map[string]any{"name": "c", "kind": "step", "queue": "second", "depends_on": []string{"b"}},
	}}})
	first, second := e.queueOf("first"), e.queueOf("second")
	if first.AwaitingDependencies != 0 || first.Counts["available"] != 1 {
		t.Errorf("queue first: %+v, want a available and nothing awaiting", first)
	}
	if second.AwaitingDependencies != 2 || second.Counts["available"] != 0 {
		t.Errorf("queue second: %+v, want b and c awaiting their dependencies", second)
	}
	page := e.must(200, req{method: "GET", path: "/", auth: roToken})
	if !strings.Contains(string(page.body), ">2 awaiting dependencies</span>") {
		t.Errorf("queues page lacks the jobs awaiting dependencies")
	}
}

// TestLargeBatchPaged: a batch's answer (and its page) lists at most
// maxListLimit of its jobs, says how many it has and where the next page
// starts, and paging with after= lists every job once; counts and
// finished stay over every job.
func TestLargeBatchPaged(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	ctx := context.Background()
	const n = 2*maxListLimit + 1
	items := make([]conveyor.EnqueueItem, n)
	for i := range items {
		items[i] = conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: "part"}, Opts: &conveyor.EnqueueOpts{Queue: "big"}}
	}
	bid, ids, err := e.client.EnqueueBatch(ctx, items, conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: "done"}})
	if err != nil {
		t.Fatal(err)
	}
	type page struct {
		Jobs         []BatchJobJSON `json:"jobs"`
		Counts       map[string]int `json:"counts"`
		Finished     bool           `json:"finished"`
		TotalJobs    int            `json:"total_jobs"`
		NextAfter    *int64         `json:"next_after"`
		Truncated    bool           `json:"truncated"`
		MaxPageBytes int            `json:"max_page_bytes"`
	}
	var got []int64
	path := fmt.Sprintf("/api/v1/batches/%d", bid)
	for url, pages := path, 0; ; pages++ {
		if pages > 3 {
			t.Fatalf("paging does not end: %d jobs after %d pages", len(got), pages)
		}
		var p page
		e.must(200, req{method: "GET", path: url, auth: roToken}).json(t, &p)
		if len(p.Jobs) > maxListLimit || p.TotalJobs != n || p.Counts["available"] != n || p.Finished || p.Truncated || p.MaxPageBytes != listPageBytes {
			t.Fatalf("GET %s: %d jobs, total %d, counts %v, finished %v, truncated %v, max_page_bytes %d; want at most %d jobs of %d",
				url, len(p.Jobs), p.TotalJobs, p.Counts, p.Finished, p.Truncated, p.MaxPageBytes, maxListLimit, n)
		}
		for _, j := range p.Jobs {
			got = append(got, j.ID)
		}
		if p.NextAfter == nil {
			break
		}
		if *p.NextAfter != got[len(got)-1] {
			t.Fatalf("next_after %d, last job listed %d", *p.NextAfter, got[len(got)-1])
		}
		url = fmt.Sprintf("%s?after=%d", path, *p.NextAfter)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("paged %d jobs, want the batch's %d in id order", len(got), len(ids))
	}
	var p page
	e.must(200, req{method: "GET", path: path + "?limit=2&after=" + fmt.Sprint(ids[0]), auth: roToken}).json(t, &p)
	if len(p.Jobs) != 2 || p.Jobs[0].ID != ids[1] || p.NextAfter == nil || *p.NextAfter != ids[2] {
		t.Fatalf("limit=2 after the first job: %+v", p)
	}
	for _, q := range []string{"limit=0", fmt.Sprintf("limit=%d", maxListLimit+1), "limit=x", "after=-1", "after=x"} {
		e.must(400, req{method: "GET", path: path + "?" + q, auth: roToken})
	}

	body := string(e.must(200, req{method: "GET", path: fmt.Sprintf("/batches/%d", bid), auth: roToken}).body)
	if rows := strings.Count(body, "<tr data-id="); rows != batchPageJobs ||
		!strings.Contains(body, fmt.Sprintf("0 of %d finished", n)) ||
		!strings.Contains(body, fmt.Sprintf(`/batches/%d?after=%d"`, bid, ids[batchPageJobs-1])) {
		t.Fatalf("batch page: %d rows, want %d, the progress over %d jobs and a link to the next page", rows, batchPageJobs, n)
	}
	body = string(e.must(200, req{method: "GET", path: fmt.Sprintf("/batches/%d?after=%d", bid, ids[2*batchPageJobs-1]), auth: roToken}).body)
	if rows := strings.Count(body, "<tr data-id="); rows != n-2*batchPageJobs || strings.Contains(body, `id="batch-next"`) {
		t.Fatalf("last batch page: %d rows, want %d and no next link", rows, n-2*batchPageJobs)
	}
	e.must(400, req{method: "GET", path: fmt.Sprintf("/batches/%d?after=x", bid), auth: roToken})
}

// batchPage ends a page at its byte bound, keeping at least one job.
func TestBatchPageBytes(t *testing.T) {
	b := BatchJSON{}
	for id := int64(1); id <= 5; id++ {
		b.Jobs = append(b.Jobs, BatchJobJSON{ID: id, State: "completed", Result: json.RawMessage(`"` + strings.Repeat("r", 100) + `"`)})
	}
	if page, more, truncated := batchPage(b, 0, 5, 300); len(page) != 2 || !more || !truncated {
		t.Errorf("300 bytes: %d jobs, more %v, truncated %v; want 2, true, true", len(page), more, truncated)
	}
	if page, more, truncated := batchPage(b, 1, 5, 10); len(page) != 1 || page[0].ID != 2 || !more || !truncated {
		t.Errorf("10 bytes after job 1: %+v, more %v, truncated %v; want job 2 alone", page, more, truncated)
	}
	if page, more, truncated := batchPage(b, 3, 5, 1<<20); len(page) != 2 || more || truncated {
		t.Errorf("after job 3: %d jobs, more %v, truncated %v; want the last 2", len(page), more, truncated)
	}
	if page, more, _ := batchPage(b, 5, 5, 1<<20); len(page) != 0 || more {
		t.Errorf("after the last job: %d jobs, more %v", len(page), more)
	}
}
