package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// enqueueRaw enqueues jobs of kind with the given arguments through the
// client (not the API, whose body cap is below the largest arguments)
// and returns their ids.
func (e *env) enqueueRaw(kind string, args ...[]byte) []int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []int64
	for _, a := range args {
		rs, err := e.client.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: conveyor.RawArgs{KindName: kind, JSON: a}}})
		if err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, rs[0].ID)
	}
	return ids
}

// nestedArrays is {"a":[[...]]} with n arrays.
func nestedArrays(n int) []byte {
	return []byte(`{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`)
}

// TestFormatJSONIsIndent: within its depth and size, formatJSON writes
// what json.Indent writes (keys in the stored order, strings as
// stored), except for the escapes of '<', '>' and '&'.
func TestFormatJSONIsIndent(t *testing.T) {
	for _, in := range []string{
		`{}`, `[]`, `1`, `"x"`, `null`,
		`{"b":1,"a":[1,2,{"c":null,"d":[]}],"e":{},"f":"x\"y\\\\z\u00e9"}`,
		`{"b": 1, "a" : [ 1 , 2 ] , "s":"a b"}`,
		`[[[[[[{"deep":[true,false]}]]]]]]`,
		`{"k":"caf\u00e9 ☕","n":-1.5e10}`,
	} {
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(in), "", "  "); err != nil {
			t.Fatal(err)
		}
		got, truncated, flattened := formatJSON([]byte(in), 1<<20, argsIndentDepth)
		if got != want.String() || truncated || flattened {
			t.Errorf("formatJSON(%s) = %q (%v, %v), want %q", in, got, truncated, flattened, want.String())
		}
	}
	got, _, _ := formatJSON([]byte(`{"h":"\u003cb\u003e \u0026 \u003c/b\u003e"}`), 1<<20, 0)
	if got != `{"h":"<b> & </b>"}` {
		t.Errorf("escapes: %q", got)
	}
}

// TestFormatJSONBounded: deep nesting is written on one line past the
// indentation depth, and the output stops at its byte limit at a
// character's boundary.
func TestFormatJSONBounded(t *testing.T) {
	deep := nestedArrays(9000)
	got, truncated, flattened := formatJSON(deep, argsPageBytes, argsIndentDepth)
	if truncated || !flattened {
		t.Errorf("9000 nested arrays: truncated %v, flattened %v", truncated, flattened)
	}
	// Indentation up to argsIndentDepth levels, both ways, then the rest
	// as stored.
	if max := len(deep) + 2*argsIndentDepth*(argsIndentDepth+2); len(got) > max {
		t.Errorf("9000 nested arrays: %d bytes of text for %d of JSON, want at most %d", len(got), len(deep), max)
	}
	var v any
	if err := json.Unmarshal([]byte(got), &v); err != nil {
		t.Errorf("the flattened text is not the same JSON: %v", err)
	}

	big := []byte(`{"s":"` + strings.Repeat("é", 300<<10) + `"}`)
	got, truncated, _ = formatJSON(big, 1000, argsIndentDepth)
	if !truncated || len(got) > 1000+2*argsIndentDepth+1 || !strings.HasPrefix(got, "{\n  \"s\": \"éé") || !utf8Valid(got) {
		t.Errorf("large arguments: truncated %v, %d bytes, valid UTF-8 %v", truncated, len(got), utf8Valid(got))
	}
	if _, truncated, _ := formatJSON([]byte("[1,2]   \n"), 12, 8); truncated {
		t.Errorf("trailing white space counted as cut text")
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\x00") == s }

// TestJobPageDeepArgsBounded: the job page of arguments nested 2,000
// deep is about their size, with a note and a link to the raw JSON (it
// was 8 MB: two spaces of indentation per level on every line).
func TestJobPageDeepArgsBounded(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueueRaw("deep", nestedArrays(2000))[0]
	body := e.must(200, req{method: "GET", path: fmt.Sprintf("/jobs/%d", id), auth: roToken}).body
	if len(body) > 64<<10 {
		t.Errorf("job page of 4 KB of arguments nested 2,000 deep: %d bytes", len(body))
	}
	for _, want := range []string{`id="args-note"`, "nested deeper than 32 levels", fmt.Sprintf(`href="/api/v1/jobs/%d"`, id)} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("job page lacks %q", want)
		}
	}
}

// TestJobPageLargeArgsTruncated: a job page shows the first
// argsPageBytes of its arguments and links the rest.
func TestJobPageLargeArgsTruncated(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	args := []byte(`{"payload":"` + strings.Repeat("x", 1000_000) + `"}`)
	id := e.enqueueRaw("big", args)[0]
	body := e.must(200, req{method: "GET", path: fmt.Sprintf("/jobs/%d", id), auth: roToken}).body
	if len(body) > argsPageBytes+32<<10 {
		t.Errorf("job page of 1 MB of arguments: %d bytes", len(body))
	}
	for _, want := range []string{`id="args-note"`, fmt.Sprintf("Only the first %d of %d bytes", argsPageBytes, len(args)), fmt.Sprintf(`href="/api/v1/jobs/%d"`, id)} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("job page lacks %q", want)
		}
	}
	// The raw endpoint has all of it.
	if j := e.job(id); len(j.Args) != len(args) {
		t.Errorf("raw JSON: %d bytes of arguments, want %d", len(j.Args), len(args))
	}
	// Ordinary arguments have no note.
	small := e.enqueueRaw("small", []byte(`{"to":"a@example.com"}`))[0]
	body = e.must(200, req{method: "GET", path: fmt.Sprintf("/jobs/%d", small), auth: roToken}).body
	if bytes.Contains(body, []byte(`id="args-note"`)) || !bytes.Contains(body, []byte("{\n  &#34;to&#34;: &#34;a@example.com&#34;\n}")) {
		t.Errorf("small arguments:\n%s", body)
	}
}

// readRecorder records the most bytes of jobs one query of the handler
// returned.
type readRecorder struct {
	client
	mu      sync.Mutex
	most    int
	queries int
}

func (r *readRecorder) Jobs(ctx context.Context, f conveyor.JobFilter) ([]*conveyor.JobInfo, error) {
	list, err := r.client.Jobs(ctx, f)
	n := 0
	for _, j := range list {
		n += len(j.EncodedArgs)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.most = max(r.most, n)
	r.queries++
	return list, err
}

// recordReads makes e's handler read jobs through a readRecorder.
func (e *env) recordReads() *readRecorder {
	rec := &readRecorder{client: e.h.c}
	e.h.c = rec
	return rec
}

// bigJobs enqueues n jobs of about size bytes of arguments, each holding
// the word "payload", and returns their ids.
func (e *env) bigJobs(n, size int) []int64 {
	e.t.Helper()
	var args [][]byte
	for i := range n {
		args = append(args, []byte(fmt.Sprintf(`{"payload":"%s","i":%d}`, strings.Repeat("x", size), i)))
	}
	return e.enqueueRaw("big", args...)
}

// pages follows a job list from path (which has a query string) to its
// end and returns its pages and the bodies' sizes.
func (e *env) pages(path string) ([]jobPage, []int) {
	e.t.Helper()
	var out []jobPage
	var sizes []int
	next := path
	for range 100 {
		res := e.must(200, req{method: "GET", path: next, auth: roToken})
		var p jobPage
		res.json(e.t, &p)
		out, sizes = append(out, p), append(sizes, len(res.body))
		if p.NextAfter == nil {
			return out, sizes
		}
		next = fmt.Sprintf("%s&after=%d", path, *p.NextAfter)
	}
	e.t.Fatalf("%s: no end after 100 pages", path)
	return nil, nil
}

// TestListPageBytesBounded: a list page of large jobs ends at
// listPageBytes (truncated, next_after going on) and the handler reads
// them a few at a time: 12 jobs of 700 KB asked for with limit=500 were
// one 8.4 MB answer, read in one query.
func TestListPageBytesBounded(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.dsn(t), nil)
			ids := append(e.bigJobs(12, 700_000), e.enqueueRaw("small", []byte(`{"a":1}`), []byte(`{"a":2}`))...)
			rec := e.recordReads()
			pages, sizes := e.pages("/api/v1/jobs?limit=500")
			var got []int64
			for i, p := range pages {
				if sizes[i] > listPageBytes+1024 {
					t.Errorf("page %d: %d bytes, over %d", i, sizes[i], listPageBytes)
				}
				if last := i == len(pages)-1; p.Truncated == last || p.MaxPageBytes != listPageBytes {
					t.Errorf("page %d of %d: truncated %v, max_page_bytes %d", i, len(pages), p.Truncated, p.MaxPageBytes)
				}
				for _, j := range p.Jobs {
					got = append(got, j.ID)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(ids) {
				t.Errorf("jobs listed %v, want %v", got, ids)
			}
			if len(pages) < 3 {
				t.Errorf("%d pages for 8.4 MB of jobs", len(pages))
			}
			if rec.most > listReadBytes {
				t.Errorf("one query read %d bytes of arguments, over %d", rec.most, listReadBytes)
			}
		})
	}
}

// TestSearchBytesBounded: a q= search reads large jobs a few at a time
// and its pages end at listPageBytes; one that matches nothing answers
// a few bytes.
func TestSearchBytesBounded(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	ids := e.bigJobs(12, 700_000)
	e.enqueueRaw("small", []byte(`{"a":"no"}`))
	rec := e.recordReads()
	pages, sizes := e.pages("/api/v1/jobs?q=PAYLOAD&limit=500")
	var got []int64
	scanned := 0
	for i, p := range pages {
		if sizes[i] > listPageBytes+1024 {
			t.Errorf("page %d: %d bytes", i, sizes[i])
		}
		for _, j := range p.Jobs {
			got = append(got, j.ID)
		}
		scanned += p.Scanned
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) || scanned != 13 {
		t.Errorf("found %v after %d scanned, want %v after 13", got, scanned, ids)
	}
	var p jobPage
	res := e.must(200, req{method: "GET", path: "/api/v1/jobs?q=nowhere&limit=500", auth: roToken})
	res.json(t, &p)
	if len(p.Jobs) != 0 || p.Scanned != 13 || p.NextAfter != nil || len(res.body) > 200 {
		t.Errorf("search matching nothing: %s", res.body)
	}
	if rec.most > listReadBytes {
		t.Errorf("one query read %d bytes of arguments, over %d", rec.most, listReadBytes)
	}
}

// TestJobListSummary: the dashboard's list and view=summary show every
// job of a page, however large, with a preview of its arguments and its
// last error.
func TestJobListSummary(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	ids := e.bigJobs(12, 700_000)
	id := e.enqueue(map[string]any{"kind": "k", "args": map[string]string{"to": "<b>"}})
	c := e.claim(nil)[0] // the first big job
	e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", c.ID), auth: adminToken, body: map[string]any{"fence": *c.Fence, "error": "first line\nsecond", "trace": strings.Repeat("t", 200_000)}})
	rec := e.recordReads()

	res := e.must(200, req{method: "GET", path: "/jobs?limit=500", auth: roToken})
	if len(res.body) > 64<<10 || bytes.Count(res.body, []byte("<tr data-id=")) != 13 || bytes.Contains(res.body, []byte(`id="page-note"`)) {
		t.Errorf("dashboard list of 13 jobs: %d bytes, %d rows", len(res.body), bytes.Count(res.body, []byte("<tr data-id=")))
	}
	for _, want := range []string{`{&#34;payload&#34;:&#34;xxxxx`, "…", `{&#34;to&#34;:&#34;&lt;b&gt;&#34;}`, "first line"} {
		if !bytes.Contains(res.body, []byte(want)) {
			t.Errorf("dashboard list lacks %q", want)
		}
	}

	var p struct {
		Jobs []jobSummaryJSON
		pageInfo
	}
	res = e.must(200, req{method: "GET", path: "/api/v1/jobs?limit=500&view=summary", auth: roToken})
	res.json(t, &p)
	if len(p.Jobs) != 13 || p.Truncated || p.NextAfter != nil || len(res.body) > 16<<10 {
		t.Fatalf("summary page: %d jobs, truncated %v, %d bytes", len(p.Jobs), p.Truncated, len(res.body))
	}
	first, last := p.Jobs[0], p.Jobs[12]
	if first.ID != ids[0] || !strings.HasPrefix(first.ArgsPreview, `{"payload":"xxx`) || !strings.HasSuffix(first.ArgsPreview, "…") ||
		len(first.ArgsPreview) > previewBytes+len("…") || first.ArgsBytes < 700_000 || first.ErrorCount != 1 || first.LastError == nil || *first.LastError != "first line" {
		t.Errorf("first summary %+v", first)
	}
	if last.ID != id || last.ArgsPreview != `{"to":"<b>"}` || last.LastError != nil || last.ErrorCount != 0 {
		t.Errorf("last summary %+v", last)
	}
	if rec.most > listReadBytes {
		t.Errorf("one query read %d bytes of arguments, over %d", rec.most, listReadBytes)
	}
	e.must(400, req{method: "GET", path: "/api/v1/jobs?view=compact", auth: roToken})
}

// TestArgsMatcherIsLowerContains: the search's matcher finds what
// strings.Contains(strings.ToLower(...)) of the unescaped arguments did.
func TestArgsMatcherIsLowerContains(t *testing.T) {
	for _, c := range []struct {
		args, text string
		want       bool
	}{
		{`{"w":"Needle"}`, "needle", true},
		{`{"w":"NEEDLE"}`, "nEEdle", true},
		{`{"w":"\u003cb\u003e \u0026"}`, "<B> &", true},
		{`{"w":"\u003Cb"}`, "<b", false},
		{`{"w":"ÉCOLE Straße"}`, "école straße", true},
		{`{"w":"needl"}`, "needle", false},
		{"{\"w\":\"bad \xff byte\"}", "bad \uFFFD byte", true},
	} {
		m := newArgsMatcher(c.text)
		if got := m.match([]byte(c.args)); got != c.want {
			t.Errorf("match(%s, %q) = %v, want %v", c.args, c.text, got, c.want)
		}
		if old := strings.Contains(strings.ToLower(strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(c.args)), strings.ToLower(c.text)); old != c.want {
			t.Errorf("case %s %q: the old search says %v", c.args, c.text, old)
		}
	}
}
