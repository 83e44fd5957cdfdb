package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
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
