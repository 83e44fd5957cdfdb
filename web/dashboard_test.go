package web

import (
	"bytes"
	"fmt"
	"html"
	"log/slog"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listPage is what the dashboard's job list shows: its rows' ids, top to
// bottom, and its pager's links ("" when absent or hidden).
type listPage struct {
	ids                  []int64
	newest, newer, older string
}

var (
	rowRE   = regexp.MustCompile(`<tr data-id="(\d+)">`)
	pagerRE = regexp.MustCompile(`<a href="([^"]*)" id="(newest|newer|older)-page"[^>]*?( hidden)?>`)
)

// jobsPage reads the dashboard's job list at path, following a redirect.
func (e *env) jobsPage(path string) listPage {
	e.t.Helper()
	res := e.do(req{method: "GET", path: path, auth: roToken})
	if res.status == 303 {
		res = e.do(req{method: "GET", path: res.header.Get("Location"), auth: roToken})
	}
	if res.status != 200 {
		e.t.Fatalf("GET %s: %d %s", path, res.status, res.body)
	}
	body := res.body
	var p listPage
	for _, m := range rowRE.FindAllSubmatch(body, -1) {
		id, _ := strconv.ParseInt(string(m[1]), 10, 64)
		p.ids = append(p.ids, id)
	}
	for _, m := range pagerRE.FindAllSubmatch(body, -1) {
		if len(m[3]) > 0 {
			continue // hidden
		}
		href := html.UnescapeString(string(m[1]))
		switch string(m[2]) {
		case "newest":
			p.newest = href
		case "newer":
			p.newer = href
		case "older":
			p.older = href
		}
	}
	return p
}

// TestJobsPageNewestFirst: the dashboard's job list shows the newest jobs
// first; Older and Newer page by id, so that paging back and forth
// returns to the same jobs, jobs enqueued meanwhile shift no page, and
// the newer page past the newest jobs is the newest page.
func TestJobsPageNewestFirst(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	var ids []int64
	for range 8 {
		ids = append(ids, e.enqueue(map[string]any{"kind": "k", "queue": "pg"}))
	}
	e.enqueue(map[string]any{"kind": "k", "queue": "other"}) // filtered out below
	desc := func(is ...int) string {
		var out []int64
		for _, i := range is {
			out = append(out, ids[i])
		}
		return fmt.Sprint(out)
	}

	first := e.jobsPage("/jobs?queue=pg&limit=3")
	if fmt.Sprint(first.ids) != desc(7, 6, 5) || first.newer != "" || first.newest != "" || first.older == "" {
		t.Fatalf("first page: %+v, want %s with only an Older link", first, desc(7, 6, 5))
	}
	if !strings.Contains(first.older, "queue=pg") || !strings.Contains(first.older, "limit=3") {
		t.Errorf("Older link %q drops the filters", first.older)
	}
	second := e.jobsPage(first.older)
	if fmt.Sprint(second.ids) != desc(4, 3, 2) || second.newer == "" || second.newest == "" || second.older == "" {
		t.Fatalf("second page: %+v, want %s with every link", second, desc(4, 3, 2))
	}
	last := e.jobsPage(second.older)
	if fmt.Sprint(last.ids) != desc(1, 0) || last.older != "" {
		t.Fatalf("last page: %+v, want %s without Older", last, desc(1, 0))
	}
	// Newer from the last page, then from the second: back to the first.
	if back := e.jobsPage(last.newer); fmt.Sprint(back.ids) != desc(4, 3, 2) || back.older == "" {
		t.Fatalf("Newer from the last page: %+v, want %s", back, desc(4, 3, 2))
	}
	if back := e.jobsPage(second.newer); fmt.Sprint(back.ids) != desc(7, 6, 5) {
		t.Fatalf("Newer from the second page: %+v, want %s", back, desc(7, 6, 5))
	}

	// Jobs enqueued while paging: the older pages do not move, and
	// Newer from the second page is the jobs just above it, then the
	// new ones.
	var added []int64
	for range 2 {
		added = append(added, e.enqueue(map[string]any{"kind": "k", "queue": "pg"}))
	}
	if again := e.jobsPage(first.older); fmt.Sprint(again.ids) != desc(4, 3, 2) {
		t.Errorf("second page after enqueues: %v, want %s", again.ids, desc(4, 3, 2))
	}
	up := e.jobsPage(second.newer)
	if fmt.Sprint(up.ids) != desc(7, 6, 5) || up.newer == "" {
		t.Fatalf("Newer from the second page after enqueues: %+v, want %s and a Newer link", up, desc(7, 6, 5))
	}
	top := e.jobsPage(up.newer)
	if want := fmt.Sprint([]int64{added[1], added[0], ids[7]}); fmt.Sprint(top.ids) != want || top.newer != "" || top.newest != "" {
		t.Errorf("Newer again: %+v, want the newest page %s", top, want)
	}
	// A newer page with nothing newer than its cursor redirects to the
	// newest page, with the filters.
	res := e.must(303, req{method: "GET", path: fmt.Sprintf("/jobs?queue=pg&limit=3&after=%d", added[1]), auth: roToken})
	if loc := res.header.Get("Location"); loc != "/jobs?limit=3&queue=pg" {
		t.Errorf("newer page past the newest: Location %q", loc)
	}
	// After a bulk action its message shows on the page it returned to,
	// through that redirect too, and the pager's links leave it behind.
	res = e.must(303, req{method: "GET", path: fmt.Sprintf("/jobs?queue=pg&limit=3&after=%d&bulk=retry&done=2&refused=0", added[1]), auth: roToken})
	if loc := res.header.Get("Location"); loc != "/jobs?limit=3&queue=pg&bulk=retry&done=2&refused=0" {
		t.Errorf("newer page past the newest after a bulk action: Location %q", loc)
	}
	after := e.jobsPage("/jobs?queue=pg&limit=3&bulk=retry&done=2&refused=0")
	if strings.Contains(after.older, "bulk") || after.older == "" {
		t.Errorf("Older link after a bulk action: %q", after.older)
	}
}

// TestAPIListNewestFirst: GET /api/v1/jobs?order=desc pages newest first
// by next_before, on every backend; the default stays in id order.
func TestAPIListNewestFirst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		var ids []int64
		for i := range 5 {
			ids = append(ids, e.enqueue(map[string]any{"kind": "k", "args": map[string]any{"n": i, "w": []string{"hay", "needle"}[i%2]}}))
		}
		var seen []int64
		path := "/api/v1/jobs?order=desc&limit=2&view=summary"
		for range 5 {
			var p jobPage
			e.must(200, req{method: "GET", path: path, auth: roToken}).json(t, &p)
			if p.NextAfter != nil {
				t.Fatalf("next_after %d newest first", *p.NextAfter)
			}
			for _, j := range p.Jobs {
				seen = append(seen, j.ID)
			}
			if p.NextBefore == nil {
				break
			}
			path = fmt.Sprintf("/api/v1/jobs?order=desc&limit=2&view=summary&before=%d", *p.NextBefore)
		}
		if want := fmt.Sprint([]int64{ids[4], ids[3], ids[2], ids[1], ids[0]}); fmt.Sprint(seen) != want {
			t.Errorf("pages newest first: %v, want %s", seen, want)
		}
		// A search newest first continues by next_before too.
		var p jobPage
		e.must(200, req{method: "GET", path: "/api/v1/jobs?order=desc&q=needle", auth: roToken}).json(t, &p)
		if len(p.Jobs) != 2 || p.Jobs[0].ID != ids[3] || p.Jobs[1].ID != ids[1] || p.Scanned != 5 {
			t.Errorf("search newest first: %+v", p)
		}
		// The default is id order, bounded by before= when given.
		e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs?before=%d", ids[3]), auth: roToken}).json(t, &p)
		if len(p.Jobs) != 3 || p.Jobs[0].ID != ids[0] || p.Jobs[2].ID != ids[2] || p.NextBefore != nil {
			t.Errorf("id order below before=: %+v", p)
		}
		e.must(400, req{method: "GET", path: "/api/v1/jobs?order=newest", auth: roToken})
		e.must(400, req{method: "GET", path: "/api/v1/jobs?before=0", auth: roToken})
	})
}

// TestRelativeTime: times read as operators say them, to one unit,
// rounded down, ahead or behind.
func TestRelativeTime(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "now"},
		{-999 * time.Millisecond, "now"},
		{-time.Second, "1 s ago"},
		{-59 * time.Second, "59 s ago"},
		{-3*time.Minute - 59*time.Second, "3 min ago"},
		{20*time.Second + 500*time.Millisecond, "in 20 s"},
		{-47 * time.Hour, "47 h ago"},
		{72 * time.Hour, "in 3 d"},
	} {
		if got := relativeTime(now.Add(c.d), now); got != c.want {
			t.Errorf("relativeTime(now%+v) = %q, want %q", c.d, got, c.want)
		}
	}
	if got := humanDuration(850 * time.Millisecond); got != "850 ms" {
		t.Errorf("humanDuration(850ms) = %q", got)
	}
	v := newTimeView(now.Add(-90*time.Second).In(time.FixedZone("X", 3600)), now)
	if v.ISO != "2030-01-02T03:02:35.000Z" || v.Title != "2030-01-02 03:02:35.000 UTC" || v.Rel != "1 min ago" {
		t.Errorf("time view %+v", v)
	}
}

// TestPagesShowRelativeTimes: the job list and the job's page show their
// times relative to now, with the absolute time in the title, without
// the script.
func TestPagesShowRelativeTimes(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueue(map[string]any{"kind": "k", "delay_ms": 3_600_000})
	timeRE := regexp.MustCompile(`<time class="rel" datetime="(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)" title="(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC)">([^<]*)</time>`)
	for _, path := range []string{"/jobs", fmt.Sprintf("/jobs/%d", id)} {
		body := e.must(200, req{method: "GET", path: path, auth: roToken}).body
		var rels []string
		for _, m := range timeRE.FindAllSubmatch(body, -1) {
			rels = append(rels, string(m[3]))
		}
		// Created now (or a second ago on a slow machine), scheduled in
		// an hour (59 min by the time the page renders).
		joined := strings.Join(rels, "|")
		if !regexp.MustCompile(`^(now|\d s ago)\|in (59 min|1 h)$`).MatchString(joined) {
			t.Errorf("%s: relative times %q, want created and scheduled", path, joined)
		}
		if bytes.Contains(body, []byte(".000Z</td>")) {
			t.Errorf("%s still shows an absolute time as text", path)
		}
	}
}

// TestAccessLogLiveRefresh: a live refresh of the dashboard (its
// script's polls, marked by a header) is logged at Debug; any other
// request at Info, and so is a refresh that failed, or a state change
// that claims to be one.
func TestAccessLogLiveRefresh(t *testing.T) {
	var logs lockedWriter
	buf := &bytes.Buffer{}
	logs.w = buf
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	live := map[string]string{liveHeader: "live"}
	e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken, header: live})
	e.must(200, req{method: "GET", path: "/api/v1/series", auth: roToken})
	e.must(401, req{method: "GET", path: "/api/v1/processes", header: live})
	e.must(200, req{method: "POST", path: "/api/v1/queues/q/pause", auth: adminToken, header: live})
	e.must(200, req{method: "GET", path: "/api/v1/jobs", auth: roToken, header: map[string]string{liveHeader: "yes"}})
	logs.mu.Lock()
	text := buf.String()
	logs.mu.Unlock()
	for _, want := range []string{
		"level=DEBUG msg=\"conveyor web\" method=GET path=/api/v1/queues status=200",
		"level=INFO msg=\"conveyor web\" method=GET path=/api/v1/series status=200",
		"level=INFO msg=\"conveyor web\" method=GET path=/api/v1/processes status=401",
		"level=INFO msg=\"conveyor web\" method=POST path=/api/v1/queues/q/pause status=200",
		"level=INFO msg=\"conveyor web\" method=GET path=/api/v1/jobs status=200",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("access log lacks %q:\n%s", want, text)
		}
	}
	// At the default level (Info) a live refresh leaves no line.
	e2 := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e2.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken, header: live})
	e2.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken})
	if n := strings.Count(e2.logs.String(), "path=/api/v1/queues"); n != 1 {
		t.Errorf("at Info, %d access lines for a live refresh and a normal read, want 1:\n%s", n, e2.logs.String())
	}
}
