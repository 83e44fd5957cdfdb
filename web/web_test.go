package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// Credentials of the test servers.
const (
	adminToken = "admin-token-0123456789abcdef"
	roToken    = "read-only-token-0123456789ab"
	userName   = "alice"
	userPass   = "correct horse battery"
)

// backends are the databases the tests run on: SQLite always, PostgreSQL
// and MariaDB when reachable (testdb skips or, in CI, fails).
var backends = []struct {
	name string
	dsn  func(testing.TB) string
}{
	{"sqlite", func(tb testing.TB) string { return filepath.Join(tb.TempDir(), "q.db") }},
	{"postgres", testdb.Postgres},
	{"mysql", testdb.MySQL},
	{"postgres-pgbouncer", pgbouncerDSN},
}

// bouncer is PgBouncer in transaction pooling in front of the PostgreSQL
// test server, shared by this package's tests and stopped by TestMain.
var bouncer = &topology.SharedPgBouncer{Options: topology.PgBouncerOptions{Mode: "transaction", PoolSize: 20}}

// pgbouncerDSN is the postgres-pgbouncer backend: through PgBouncer, with
// the listener on a direct connection, as the documentation configures
// an application behind it.
func pgbouncerDSN(tb testing.TB) string {
	direct := testdb.Postgres(tb)
	return bouncer.Get(tb).DSN("sslmode=disable&conveyor_direct_dsn=" + url.QueryEscape(direct))
}

func TestMain(m *testing.M) {
	code := m.Run()
	bouncer.Stop()
	os.Exit(code)
}

// env is a handler on a fresh, migrated schema, served on loopback.
type env struct {
	t      *testing.T
	client *conveyor.Client[any]
	h      *Handler
	srv    *httptest.Server
	logs   *bytes.Buffer
}

func newEnv(t *testing.T, dsn string, mod func(*Options)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		c.Close()
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	o := Options{
		Tokens: []Token{{Value: adminToken, Role: RoleAdmin}, {Value: roToken, Role: RoleReadOnly}},
		Users:  []User{{Name: userName, Password: userPass, Role: RoleAdmin}},
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: logs}, nil)),
	}
	if mod != nil {
		mod(&o)
	}
	h, err := New(c, o)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	e := &env{t: t, client: c, h: h, srv: httptest.NewServer(h), logs: logs}
	t.Cleanup(func() {
		e.srv.Close()
		e.h.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := seam.DropTables(ctx, c); err != nil {
			t.Errorf("dropping tables: %v", err)
		}
		c.Close()
	})
	return e
}

// lockedWriter serialises writes to the log buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// forEachBackend runs f on every backend as a subtest.
func forEachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f(t, newEnv(t, b.dsn(t), nil))
		})
	}
}

// req is one request; auth is a token, "basic" for the test user, or "".
type req struct {
	method, path, auth string
	body               any // string, []byte or a value encoded as JSON
	header             map[string]string
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

func (e *env) do(r req) resp {
	e.t.Helper()
	var body io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		body = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, r.method, e.srv.URL+r.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	switch r.auth {
	case "":
	case "basic":
		hr.SetBasicAuth(userName, userPass)
	default:
		hr.Header.Set("Authorization", "Bearer "+r.auth)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := cl.Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// must does r and fails unless it answers status.
func (e *env) must(status int, r req) resp {
	e.t.Helper()
	res := e.do(r)
	if res.status != status {
		e.t.Fatalf("%s %s: status %d, want %d: %s", r.method, r.path, res.status, status, res.body)
	}
	return res
}

func (e *env) enqueue(job map[string]any) int64 {
	e.t.Helper()
	var out struct{ ID int64 }
	e.must(201, req{method: "POST", path: "/api/v1/jobs", auth: adminToken, body: job}).json(e.t, &out)
	return out.ID
}

func (e *env) claim(body map[string]any) []JobJSON {
	e.t.Helper()
	var out struct{ Jobs []JobJSON }
	e.must(200, req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: body}).json(e.t, &out)
	return out.Jobs
}

func (e *env) job(id int64) JobJSON {
	e.t.Helper()
	var j JobJSON
	e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs/%d", id), auth: roToken}).json(e.t, &j)
	return j
}

// count returns how many jobs exist, by the API.
func (e *env) count() int {
	e.t.Helper()
	var p jobPage
	e.must(200, req{method: "GET", path: "/api/v1/jobs?limit=500", auth: roToken}).json(e.t, &p)
	return len(p.Jobs)
}

func TestEnqueueClaimComplete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		id := e.enqueue(map[string]any{"kind": "email", "args": map[string]any{"to": "a@example.com"}, "queue": "mail", "priority": 3, "max_attempts": 2, "timeout_ms": 5000})
		var batch struct{ IDs []int64 }
		e.must(201, req{method: "POST", path: "/api/v1/jobs/batch", auth: "basic", body: map[string]any{"jobs": []map[string]any{
			{"kind": "email", "queue": "mail", "priority": 5}, {"kind": "email", "queue": "mail", "priority": 5, "args": []int{1, 2}},
		}}}).json(t, &batch)
		if len(batch.IDs) != 2 {
			t.Fatalf("batch ids %v", batch.IDs)
		}
		jobs := e.claim(map[string]any{"queue": "mail", "limit": 10, "worker": "py-1"})
		if len(jobs) != 3 || jobs[0].ID != id || jobs[0].Fence == nil || jobs[0].State != "running" {
			t.Fatalf("claimed %+v", jobs)
		}
		if got := string(jobs[0].Args); got != `{"to":"a@example.com"}` {
			t.Errorf("args %s", got)
		}
		if jobs[0].AttemptedBy == nil || *jobs[0].AttemptedBy != "http:py-1" {
			t.Errorf("attempted_by %v", jobs[0].AttemptedBy)
		}
		j0, j1, j2 := jobs[0], jobs[1], jobs[2]
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/heartbeat", j0.ID), auth: adminToken, body: map[string]any{"fence": *j0.Fence, "lease_ms": 60000}})
		// A result over the limit is refused, and the job left running.
		e.must(400, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", j0.ID), auth: adminToken,
			body: map[string]any{"fence": *j0.Fence, "result": strings.Repeat("x", conveyor.MaxResultBytes)}})
		if j := e.job(j0.ID); j.State != "running" || string(j.Result) != "null" {
			t.Errorf("after a refused result: %+v", j)
		}
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", j0.ID), auth: adminToken, body: map[string]any{"fence": *j0.Fence, "result": map[string]any{"sent": true}}})
		if j := e.job(j0.ID); j.State != "completed" || j.FinalizedAt == nil || string(j.Result) != `{"sent":true}` {
			t.Errorf("after complete: %+v (result %s)", j, j.Result)
		}
		// A failure with attempts left is retryable, with the error kept.
		var out struct{ State string }
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", j1.ID), auth: adminToken, body: map[string]any{"fence": *j1.Fence, "error": "boom", "trace": "at line 3", "retry_in_ms": 60000}}).json(t, &out)
		if j := e.job(j1.ID); out.State != "retryable" || j.State != "retryable" || len(j.Errors) != 1 || j.Errors[0].Error != "boom" || j.Errors[0].Trace == nil {
			t.Errorf("after fail: %s %+v", out.State, j)
		}
		// cancel: true cancels.
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", j2.ID), auth: adminToken, body: map[string]any{"fence": *j2.Fence, "error": "bad input", "cancel": true}})
		if j := e.job(j2.ID); j.State != "cancelled" {
			t.Errorf("after fail with cancel: %s", j.State)
		}
		// The last attempt's failure discards.
		id = e.enqueue(map[string]any{"kind": "once", "max_attempts": 1})
		c := e.claim(map[string]any{"limit": 1})
		if len(c) != 1 || c[0].ID != id {
			t.Fatalf("claimed %+v", c)
		}
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", id), auth: adminToken, body: map[string]any{"fence": *c[0].Fence, "error": "x"}})
		if j := e.job(id); j.State != "discarded" {
			t.Errorf("last attempt failed: %s", j.State)
		}
		// Admin actions.
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/retry", id), auth: adminToken})
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", id), auth: adminToken})
		e.must(409, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/discard", id), auth: adminToken})
		e.must(404, req{method: "GET", path: "/api/v1/jobs/999999", auth: adminToken})
		// Queues.
		var qs queuesJSON
		e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken}).json(t, &qs)
		if len(qs.Queues) != 2 || qs.Queues[1].Queue != "mail" || qs.Queues[1].Counts["completed"] != 1 {
			t.Errorf("queues %+v", qs)
		}
	})
}

// TestStaleWorkerRefused: a worker whose claim no longer owns the job
// (released, or its lease expired and the job was rescued and claimed
// again) gets 409 for every acknowledgement, and the job is unchanged.
func TestStaleWorkerRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		id := e.enqueue(map[string]any{"kind": "k"})
		old := e.claim(map[string]any{"lease_ms": 1000})[0]
		// The lease expires and the leader's rescue makes the job
		// available again; another worker claims it.
		time.Sleep(1200 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if n, err := seam.DriverOf(e.client).Rescue(ctx, 100); err != nil || n["default"] != 1 {
			t.Fatalf("rescue: %v %v", n, err)
		}
		cur := e.claim(map[string]any{"worker": "new"})[0]
		if cur.ID != id || *cur.Fence <= *old.Fence {
			t.Fatalf("second claim %+v after %+v", cur, old)
		}
		before := e.job(id)
		for _, op := range []struct {
			action string
			body   map[string]any
		}{
			{"complete", map[string]any{"fence": *old.Fence}},
			{"fail", map[string]any{"fence": *old.Fence, "error": "late"}},
			{"heartbeat", map[string]any{"fence": *old.Fence}},
			{"release", map[string]any{"fence": *old.Fence}},
		} {
			res := e.must(409, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/%s", id, op.action), auth: adminToken, body: op.body})
			if !strings.Contains(string(res.body), "no longer held under fence") {
				t.Errorf("%s: %s", op.action, res.body)
			}
		}
		after := e.job(id)
		if after.State != "running" || after.Attempt != before.Attempt || len(after.Errors) != len(before.Errors) || *after.AttemptedBy != "http:new" {
			t.Errorf("stale acknowledgements changed the job: %+v -> %+v", before, after)
		}
		// Released by the current worker, then claimed again: the
		// released fence is refused too.
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/release", id), auth: adminToken, body: map[string]any{"fence": *cur.Fence}})
		third := e.claim(nil)[0]
		e.must(409, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", id), auth: adminToken, body: map[string]any{"fence": *cur.Fence}})
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", id), auth: adminToken, body: map[string]any{"fence": *third.Fence}})
		if j := e.job(id); j.State != "completed" {
			t.Errorf("state %s", j.State)
		}
	})
}

// TestFenceRequired: an acknowledgement without a fence (absent, or not
// one a claim can have given) is a malformed request, answered 400 naming
// the field; not a 409, which tells the worker its claim was lost and to
// stop working the job. The job is unchanged.
func TestFenceRequired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		id := e.enqueue(map[string]any{"kind": "k"})
		j := e.claim(nil)[0]
		before := e.job(id)
		for _, action := range []string{"heartbeat", "complete", "fail", "snooze", "release"} {
			for _, body := range []map[string]any{{}, {"fence": 0}, {"fence": -1}} {
				res := e.must(400, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/%s", id, action), auth: adminToken, body: body})
				if !strings.Contains(string(res.body), "fence") {
					t.Errorf("%s %v: %s", action, body, res.body)
				}
			}
		}
		after := e.job(id)
		if after.State != "running" || after.Attempt != before.Attempt || len(after.Errors) != 0 {
			t.Errorf("acknowledgements without a fence changed the job: %+v -> %+v", before, after)
		}
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", id), auth: adminToken, body: map[string]any{"fence": *j.Fence}})
	})
}

func TestLongPollClaimWokenByEnqueue(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	start := time.Now()
	got := make(chan []JobJSON, 1)
	go func() {
		var out struct{ Jobs []JobJSON }
		res := e.do(req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"queue": "q", "wait_ms": 20000}})
		_ = json.Unmarshal(res.body, &out)
		got <- out.Jobs
	}()
	time.Sleep(300 * time.Millisecond)
	id := e.enqueue(map[string]any{"kind": "k", "queue": "q"})
	select {
	case jobs := <-got:
		if len(jobs) != 1 || jobs[0].ID != id {
			t.Fatalf("claimed %+v", jobs)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("claim took %v", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("long-polling claim not woken")
	}
	// An empty wait ends with no jobs, after about wait_ms.
	start = time.Now()
	if jobs := e.claim(map[string]any{"queue": "q", "wait_ms": 300}); len(jobs) != 0 {
		t.Errorf("claimed %+v", jobs)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 10*time.Second {
		t.Errorf("wait of 300ms took %v", d)
	}
	e.must(400, req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"wait_ms": 31000}})
	e.must(400, req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"limit": 1001}})
	e.must(400, req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"queue": "<x>"}})
}

// Handler.Close ends the claims waiting in the handler: they answer at
// once with no jobs, and later claims do not wait.
func TestCloseEndsWaitingClaims(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	got := make(chan resp, 1)
	go func() {
		got <- e.do(req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"queue": "q", "wait_ms": 30000}})
	}()
	time.Sleep(200 * time.Millisecond) // the claim is waiting (if not yet, it will not wait at all)
	if err := e.h.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.status != 200 || !bytes.Contains(r.body, []byte(`"jobs":[]`)) {
			t.Fatalf("the waiting claim answered %d %s, want 200 with no jobs", r.status, r.body)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not end the waiting claim (its wait is 30s)")
	}
	id := e.enqueue(map[string]any{"kind": "k", "queue": "q"})
	if jobs := e.claim(map[string]any{"queue": "q", "wait_ms": 30000}); len(jobs) != 1 || jobs[0].ID != id {
		t.Fatalf("a claim after Close: %+v, want the job", jobs)
	}
}

func TestPauseResume(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e.enqueue(map[string]any{"kind": "k", "queue": "p"})
	e.must(200, req{method: "POST", path: "/api/v1/queues/p/pause", auth: adminToken})
	if jobs := e.claim(map[string]any{"queue": "p"}); len(jobs) != 0 {
		t.Fatalf("claimed from a paused queue: %+v", jobs)
	}
	var qs queuesJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken}).json(t, &qs)
	if len(qs.Queues) != 1 || !qs.Queues[0].Paused || qs.Queues[0].PausedAt == nil {
		t.Errorf("queues %+v", qs.Queues)
	}
	e.must(200, req{method: "POST", path: "/api/v1/queues/p/resume", auth: adminToken})
	if jobs := e.claim(map[string]any{"queue": "p"}); len(jobs) != 1 {
		t.Fatalf("claimed %+v after resume", jobs)
	}
	e.must(400, req{method: "POST", path: "/api/v1/queues/bad%20name/pause", auth: adminToken})
}

// TestBodiesRefused: oversized bodies get 413, malformed ones 400, each
// with one JSON message, and nothing is written.
func TestBodiesRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		big := `{"kind":"k","args":{"s":"` + strings.Repeat("x", 1<<20) + `"}}`
		for _, c := range []struct {
			path, body string
			status     int
			want       string
		}{
			{"/api/v1/jobs", big, 413, "request body over the 1048576-byte limit"},
			{"/api/v1/jobs/batch", `{"jobs":[` + big + `]}`, 413, "over the 1048576-byte limit"},
			{"/api/v1/jobs", `{"kind":"k",`, 400, "malformed JSON"},
			{"/api/v1/jobs", `{"kind":"k"} {"kind":"k"}`, 400, "unexpected data after the JSON value"},
			{"/api/v1/jobs", `{"kind":"k","priorty":1}`, 400, `unknown field "priorty"`},
			{"/api/v1/jobs", ``, 400, "empty body"},
			{"/api/v1/jobs", `{"kind":"k","priority":"high"}`, 400, "malformed JSON"},
			{"/api/v1/jobs", `{"kind":"k","priority":5000}`, 400, "priority 5000 out of range"},
			{"/api/v1/jobs", `{"kind":"<bad>"}`, 400, "kind name"},
			{"/api/v1/jobs/batch", `{"jobs":[{"kind":"k"},{"kind":"k","max_attempts":-1}]}`, 400, "job 1 of 2"},
			{"/api/v1/jobs/batch", `{"jobs":[]}`, 400, "empty"},
		} {
			res := e.do(req{method: "POST", path: c.path, auth: adminToken, body: c.body})
			var ae apiError
			if res.status != c.status || json.Unmarshal(res.body, &ae) != nil || !strings.Contains(ae.Error, c.want) || strings.Count(string(res.body), "\n") != 1 {
				t.Errorf("%s %.60q: %d %s, want %d with %q", c.path, c.body, res.status, res.body, c.status, c.want)
			}
		}
		if n := e.count(); n != 0 {
			t.Errorf("%d jobs written by refused requests", n)
		}
	})
}

// TestAuthRequired: without credentials every route but the login page
// and the static assets answers 401, and pages show only the login.
func TestAuthRequired(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueue(map[string]any{"kind": "secret_kind", "args": map[string]string{"secret": "s3cr3t"}})
	paths := map[string]bool{}
	for _, rt := range e.h.routes {
		p := strings.NewReplacer("{id}", fmt.Sprint(id), "{queue}", "default", "{action}", "retry", "{$}", "").Replace(rt.path)
		if rt.public {
			continue
		}
		paths[rt.method+" "+p] = true
	}
	paths["GET /no/such/page"] = true
	paths["GET /api/v1/nothing"] = true
	for mp := range paths {
		method, path, _ := strings.Cut(mp, " ")
		for _, auth := range []string{"", "wrong-token-0123456789abcdef"} {
			e.h.throttle.reset() // failing on purpose: the throttle has its own tests
			res := e.do(req{method: method, path: path, auth: auth, body: `{}`})
			if res.status != 401 {
				t.Errorf("%s %s (auth %q): %d, want 401", method, path, auth, res.status)
			}
			if bytes.Contains(res.body, []byte("s3cr3t")) || bytes.Contains(res.body, []byte("secret_kind")) {
				t.Errorf("%s %s: job data without credentials", method, path)
			}
			if !strings.HasPrefix(path, "/api/") && method == "GET" && !bytes.Contains(res.body, []byte(`name="token"`)) {
				t.Errorf("%s %s: no login form in %s", method, path, res.body)
			}
		}
	}
	e.must(200, req{method: "GET", path: "/login"})
	e.must(200, req{method: "GET", path: "/static/app.js"})
	// Wrong basic-auth password.
	res := e.do(req{method: "GET", path: "/api/v1/jobs", header: map[string]string{"Authorization": "Basic YWxpY2U6d3Jvbmc="}})
	if res.status != 401 {
		t.Errorf("wrong password: %d", res.status)
	}
	e.must(200, req{method: "GET", path: "/api/v1/jobs", auth: "basic"})
}

// TestReadOnlyCannotChangeState: every state-changing route answers 403
// to a read-only credential, and nothing changes.
func TestReadOnlyCannotChangeState(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueue(map[string]any{"kind": "k"})
	before := e.job(id)
	n := 0
	for _, rt := range e.h.routes {
		if rt.role != RoleAdmin {
			continue
		}
		n++
		p := strings.NewReplacer("{id}", fmt.Sprint(id), "{queue}", "default", "{action}", "cancel").Replace(rt.path)
		res := e.do(req{method: rt.method, path: p, auth: roToken, body: map[string]any{"kind": "k", "fence": 1}})
		if res.status != 403 {
			t.Errorf("%s %s with a read-only token: %d %s", rt.method, p, res.status, res.body)
		}
	}
	if n < 10 {
		t.Fatalf("only %d admin routes", n)
	}
	if after := e.job(id); after.State != before.State || e.count() != 1 {
		t.Errorf("read-only requests changed state: %+v", after)
	}
	var qs queuesJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken}).json(t, &qs)
	if qs.Queues[0].Paused {
		t.Error("paused by a read-only token")
	}
}

// login logs in through the form and returns the session cookie.
func (e *env) login(token string) *http.Cookie {
	e.t.Helper()
	res, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).
		PostForm(e.srv.URL+"/login", map[string][]string{"token": {token}, "next": {"/jobs"}})
	if err != nil {
		e.t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 303 || res.Header.Get("Location") != "/jobs" {
		e.t.Fatalf("login: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	for _, c := range res.Cookies() {
		if c.Name == cookieName {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
				e.t.Errorf("session cookie %+v: want HttpOnly and SameSite=Strict", c)
			}
			return c
		}
	}
	e.t.Fatal("no session cookie")
	return nil
}

func TestLoginAndCrossOriginProtection(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueue(map[string]any{"kind": "k"})
	ck := e.login(adminToken)
	cookie := map[string]string{"Cookie": ck.Name + "=" + ck.Value}
	res := e.must(200, req{method: "GET", path: "/jobs", header: cookie})
	if !bytes.Contains(res.body, []byte(`data-id="`+fmt.Sprint(id)+`"`)) {
		t.Errorf("job list lacks job %d", id)
	}
	// A wrong token at the login: 401 with the form again.
	r2, err := http.PostForm(e.srv.URL+"/login", map[string][]string{"token": {"nope-nope-nope-nope"}})
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 401 {
		t.Errorf("wrong token login: %d", r2.StatusCode)
	}
	// Cross-origin state changes are refused, with the cookie or a token.
	path := fmt.Sprintf("/jobs/%d/cancel", id)
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://evil.example"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		for k, v := range cookie {
			h[k] = v
		}
		res := e.do(req{method: "POST", path: path, header: h})
		if res.status != 403 || !bytes.Contains(res.body, []byte("cross-origin request refused")) {
			t.Errorf("cross-origin POST %v: %d %s", h, res.status, res.body)
		}
		res = e.do(req{method: "POST", path: "/api/v1/jobs/" + fmt.Sprint(id) + "/cancel", auth: adminToken, header: map[string]string{"Sec-Fetch-Site": "cross-site"}})
		if res.status != 403 {
			t.Errorf("cross-origin API POST: %d", res.status)
		}
	}
	if j := e.job(id); j.State != "available" {
		t.Fatalf("cross-origin requests changed the job: %s", j.State)
	}
	// Same origin: allowed, redirects back to the job.
	h := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": e.srv.URL}
	for k, v := range cookie {
		h[k] = v
	}
	res = e.must(303, req{method: "POST", path: path, header: h})
	if loc := res.header.Get("Location"); loc != fmt.Sprintf("/jobs/%d?ok=cancel", id) {
		t.Errorf("redirect to %q", loc)
	}
	if j := e.job(id); j.State != "cancelled" {
		t.Errorf("state %s", j.State)
	}
	// A tampered cookie is refused.
	bad := map[string]string{"Cookie": ck.Name + "=" + ck.Value + "x"}
	if res := e.do(req{method: "GET", path: "/api/v1/jobs", header: bad}); res.status != 401 {
		t.Errorf("tampered cookie: %d", res.status)
	}
	// Logout clears it; the login's redirect stays inside the handler.
	if got := e.h.safeNext("//evil.example/x"); got != "/" {
		t.Errorf("safeNext: %q", got)
	}
	if got := e.h.safeNext("https://evil.example/"); got != "/" {
		t.Errorf("safeNext: %q", got)
	}
}

func TestNewRequiresCredentials(t *testing.T) {
	ctx := context.Background()
	c, err := connect.Open(ctx, filepath.Join(t.TempDir(), "q.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, Options{}); err == nil || !strings.Contains(err.Error(), "no credentials") {
		t.Errorf("New without credentials: %v", err)
	}
	if _, err := New(c, Options{Tokens: []Token{{Value: "short", Role: RoleAdmin}}}); err == nil {
		t.Error("short token accepted")
	}
	if _, err := New(c, Options{Tokens: []Token{{Value: adminToken, Role: "root"}}}); err == nil {
		t.Error("unknown role accepted")
	}
	h, err := New(c, Options{InsecureLoopbackDev: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]int{"127.0.0.1:5000": 200, "[::1]:5000": 200, "192.0.2.7:5000": 403} {
		r := httptest.NewRequest("GET", "/api/v1/queues", nil)
		r.RemoteAddr, r.Host = addr, "127.0.0.1:8080"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		// Loopback gets in without credentials; anything else is refused.
		if w.Code != want {
			t.Errorf("dev mode from %s: %d, want %d: %s", addr, w.Code, want, w.Body)
		}
	}
}

// xss are payloads that must reach pages as text.
var xss = []string{`<script>alert(1)</script>`, `"><img src=x onerror=alert(1)>`, `'><svg onload=alert(1)>`, `javascript:alert(1)`}

func TestXSSEscaped(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	payload := strings.Join(xss, " ")
	id := e.enqueue(map[string]any{"kind": "xss", "args": map[string]string{"p": payload, payload: "key"}})
	c := e.claim(nil)[0]
	e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/fail", id), auth: adminToken, body: map[string]any{"fence": *c.Fence, "error": "failed: " + payload, "trace": payload}})
	for _, path := range []string{"/", fmt.Sprintf("/jobs/%d", id), "/jobs", "/jobs?q=script", "/jobs?kind=xss"} {
		res := e.must(200, req{method: "GET", path: path, auth: adminToken})
		body := string(res.body)
		for _, bad := range []string{"<script>alert", "<img src=x", "<svg onload", "onerror=alert(1)>"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s: raw %q in the page", path, bad)
			}
		}
		if path != "/" && !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%s: escaped payload missing", path)
		}
		if csp := res.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	// JSON answers escape markup too, in case a browser sniffs them.
	res := e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs/%d", id), auth: adminToken})
	if bytes.Contains(res.body, []byte("<script>")) || res.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("JSON answer: %s", res.body)
	}
}

func TestArgsSearchBounded(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	jobs := []map[string]any{}
	for i := range 30 {
		word := "plain"
		if i%10 == 3 {
			word = "Needle"
		}
		jobs = append(jobs, map[string]any{"kind": "k", "args": map[string]any{"w": word, "i": i}})
	}
	e.must(201, req{method: "POST", path: "/api/v1/jobs/batch", auth: adminToken, body: map[string]any{"jobs": jobs}})
	var p jobPage
	e.must(200, req{method: "GET", path: "/api/v1/jobs?q=needle&limit=2", auth: roToken}).json(t, &p)
	if len(p.Jobs) != 2 || p.NextAfter == nil || p.ScanLimit != textScanLimit {
		t.Fatalf("page %+v", p)
	}
	var p2 jobPage
	e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs?q=needle&limit=2&after=%d", *p.NextAfter), auth: roToken}).json(t, &p2)
	if len(p2.Jobs) != 1 || p2.NextAfter != nil {
		t.Fatalf("second page %+v", p2)
	}
	e.must(400, req{method: "GET", path: "/api/v1/jobs?state=bogus", auth: roToken})
	e.must(400, req{method: "GET", path: "/api/v1/jobs?limit=100000", auth: roToken})
}

// A job list filtered by a queue or kind name that no job can have
// (enqueue refuses it) is refused with 400 and an error naming the
// parameter, rather than answered with an empty page; so is the
// dashboard's list.
func TestListJobsRefusesInvalidNames(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e.enqueue(map[string]any{"kind": "k", "queue": "mail"})
	for _, c := range []struct{ query, want string }{
		{"queue=bad%20q", `queue="bad q": invalid queue name`},
		{"queue=-x&state=available", `queue="-x": invalid queue name`},
		{"kind=bad%20kind", `kind="bad kind": invalid kind name`},
		{"queue=mail&kind=%3Cx%3E", `kind="<x>": invalid kind name`},
	} {
		var out struct{ Error string }
		e.must(400, req{method: "GET", path: "/api/v1/jobs?" + c.query, auth: roToken}).json(t, &out)
		if !strings.Contains(out.Error, c.want) {
			t.Errorf("GET /api/v1/jobs?%s: error %q, want one with %s", c.query, out.Error, c.want)
		}
		e.must(400, req{method: "GET", path: "/jobs?" + c.query, auth: roToken})
	}
	var p jobPage
	e.must(200, req{method: "GET", path: "/api/v1/jobs?queue=mail&kind=k", auth: roToken}).json(t, &p)
	if len(p.Jobs) != 1 {
		t.Fatalf("valid filter: %+v", p)
	}
}

func TestAccessLog(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e.must(200, req{method: "GET", path: "/api/v1/queues?secret=1", auth: roToken})
	e.must(401, req{method: "GET", path: "/api/v1/queues"})
	log := func() string {
		w := e.logs
		_ = w
		return e.logs.String()
	}()
	if !strings.Contains(log, `path=/api/v1/queues status=200`) || !strings.Contains(log, `who="token #2"`) || !strings.Contains(log, "status=401") {
		t.Errorf("access log:\n%s", log)
	}
	if strings.Contains(log, "secret=1") || strings.Contains(log, roToken) {
		t.Errorf("access log holds the query or a token:\n%s", log)
	}
}

// TestOpenAPIDescribesEveryRoute: every API route is in openapi.json with
// its method, and the description has nothing else.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	e.must(200, req{method: "GET", path: "/api/v1/openapi.json", auth: roToken}).json(t, &doc)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
	described := map[string]bool{}
	for p, ops := range doc.Paths {
		for m := range ops {
			described[strings.ToUpper(m)+" "+p] = true
		}
	}
	for _, rt := range e.h.routes {
		if !rt.api {
			continue
		}
		k := rt.method + " " + rt.path
		if !described[k] {
			t.Errorf("route %s is not in openapi.json", k)
		}
		delete(described, k)
	}
	for k := range described {
		t.Errorf("openapi.json describes %s, which is not a route", k)
	}
}

// TestOpenAPINamePatterns: every pattern of openapi.json is the library's
// rule for queue names or for kind names, as ValidQueueName and
// ValidKindName state it, so that the description follows the rule.
func TestOpenAPINamePatterns(t *testing.T) {
	b, err := os.ReadFile("assets/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	rule := func(err error, prefix string) string {
		if err == nil || !strings.HasPrefix(err.Error(), prefix) {
			t.Fatalf("%v: want %q and the rule", err, prefix)
		}
		return strings.TrimPrefix(err.Error(), prefix)
	}
	rules := map[string]bool{
		rule(conveyor.ValidQueueName(""), "invalid queue name: must match "): true,
		rule(conveyor.ValidKindName(""), "invalid kind name: must match "):   true,
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if p, ok := x.(string); ok && k == "pattern" {
					n++
					if !rules[p] {
						t.Errorf("%s: pattern %q is neither the queue nor the kind rule %v", path, p, rules)
					}
				}
				walk(path+"/"+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s/%d", path, i), x)
			}
		}
	}
	walk("", doc)
	if n == 0 {
		t.Error("no pattern in openapi.json")
	}
}

func TestBasePath(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.BasePath = "/ops/conveyor" })
	e.must(200, req{method: "GET", path: "/ops/conveyor/api/v1/queues", auth: adminToken})
	res := e.must(200, req{method: "GET", path: "/ops/conveyor/", auth: adminToken})
	if !bytes.Contains(res.body, []byte(`href="/ops/conveyor/static/style.css"`)) {
		t.Errorf("links do not carry the base path")
	}
	e.must(200, req{method: "GET", path: "/ops/conveyor/static/style.css"})
	e.must(404, req{method: "GET", path: "/api/v1/queues", auth: adminToken})
}

func TestBulkActions(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	a := e.enqueue(map[string]any{"kind": "k"})
	b := e.enqueue(map[string]any{"kind": "k"})
	e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", b), auth: adminToken})
	var out struct{ Results []bulkResult }
	e.must(200, req{method: "POST", path: "/api/v1/jobs/bulk", auth: adminToken, body: map[string]any{"action": "discard", "ids": []int64{a, b, 999999}}}).json(t, &out)
	if len(out.Results) != 3 || out.Results[0].State == nil || *out.Results[0].State != "discarded" || out.Results[1].Error == nil || out.Results[2].Error == nil {
		t.Fatalf("bulk discard: %+v", out.Results)
	}
	e.must(400, req{method: "POST", path: "/api/v1/jobs/bulk", auth: adminToken, body: map[string]any{"action": "delete", "ids": []int64{a}}})
	e.must(400, req{method: "POST", path: "/api/v1/jobs/bulk", auth: adminToken, body: map[string]any{"action": "retry", "ids": []int64{}}})
	// From the dashboard's form: back to the list with the counts.
	res := e.must(303, req{method: "POST", path: "/jobs/bulk", auth: adminToken,
		body:   fmt.Sprintf("action=retry&id=%d&id=%d&back=%%2Fjobs%%3Fkind%%3Dk", a, b),
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	loc := res.header.Get("Location")
	if loc != "/jobs?kind=k&bulk=retry&done=2&refused=0" {
		t.Fatalf("redirect to %q", loc)
	}
	page := e.must(200, req{method: "GET", path: loc, auth: adminToken})
	if !bytes.Contains(page.body, []byte("Retried 2 job(s).")) {
		t.Errorf("no bulk message")
	}
	if j := e.job(a); j.State != "available" {
		t.Errorf("state %s", j.State)
	}
	// The back address cannot leave the handler.
	res = e.must(303, req{method: "POST", path: "/jobs/bulk", auth: adminToken,
		body:   fmt.Sprintf("action=cancel&id=%d&back=https%%3A%%2F%%2Fevil.example%%2F", a),
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	if loc := res.header.Get("Location"); !strings.HasPrefix(loc, "/?bulk=cancel") {
		t.Errorf("redirect to %q", loc)
	}
}

func TestUniqueEnqueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		job := map[string]any{"kind": "report", "args": map[string]any{"day": "mon", "x": 1}, "unique": map[string]any{"args_fields": []string{"day"}}}
		var first, second enqueuedJSON
		e.must(201, req{method: "POST", path: "/api/v1/jobs", auth: adminToken, body: job}).json(t, &first)
		job["args"] = map[string]any{"day": "mon", "x": 2}
		e.must(200, req{method: "POST", path: "/api/v1/jobs", auth: adminToken, body: job}).json(t, &second)
		if first.Duplicate || !second.Duplicate || second.ID != first.ID {
			t.Fatalf("unique: %+v then %+v", first, second)
		}
		var batch struct {
			IDs     []int64
			Results []enqueuedJSON
		}
		e.must(201, req{method: "POST", path: "/api/v1/jobs/batch", auth: adminToken, body: map[string]any{"jobs": []any{
			job, map[string]any{"kind": "report", "args": map[string]any{"day": "tue"}, "unique": map[string]any{"args_fields": []string{"day"}}},
		}}}).json(t, &batch)
		if len(batch.Results) != 2 || !batch.Results[0].Duplicate || batch.Results[1].Duplicate || batch.IDs[0] != first.ID {
			t.Fatalf("batch: %+v", batch)
		}
		if n := e.count(); n != 2 {
			t.Errorf("%d jobs, want 2", n)
		}
		e.must(400, req{method: "POST", path: "/api/v1/jobs", auth: adminToken, body: map[string]any{"kind": "r", "unique": map[string]any{"states": []string{"bogus"}}}})
	})
}

func TestSnooze(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		id := e.enqueue(map[string]any{"kind": "k"})
		c := e.claim(nil)[0]
		e.must(400, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/snooze", id), auth: adminToken, body: map[string]any{"fence": *c.Fence, "delay_ms": -1}})
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/snooze", id), auth: adminToken, body: map[string]any{"fence": *c.Fence, "delay_ms": 60000}})
		j := e.job(id)
		if j.State != "scheduled" || j.Attempt != 0 || len(j.Errors) != 0 {
			t.Errorf("after snooze: %+v", j)
		}
		// The same snooze sent again: already recorded (TestRepeatedOutcome).
		if out := e.ack(200, id, "snooze", map[string]any{"fence": *c.Fence, "delay_ms": 60000}); !out.AlreadyRecorded {
			t.Errorf("snooze sent again: %+v", out)
		}
		e.ack(409, id, "complete", map[string]any{"fence": *c.Fence})
	})
}

func TestSchedulesListed(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	id := e.enqueue(map[string]any{"kind": "nightly"})
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Hour)
	if err := seam.DriverOf(e.client).RecordSchedule(ctx, driver.ScheduleRow{Name: "nightly", Spec: "every 1h " + xss[1], LastSlot: now, LastJob: id, NextSlot: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	var out struct{ Schedules []scheduleJSON }
	e.must(200, req{method: "GET", path: "/api/v1/schedules", auth: roToken}).json(t, &out)
	if len(out.Schedules) != 1 || out.Schedules[0].LastJobID == nil || *out.Schedules[0].LastJobID != id || out.Schedules[0].Next == nil {
		t.Fatalf("schedules %+v", out.Schedules)
	}
	page := e.must(200, req{method: "GET", path: "/", auth: roToken})
	if !bytes.Contains(page.body, []byte(fmt.Sprintf(`href="/jobs/%d">%d</a>`, id, id))) || bytes.Contains(page.body, []byte("<img src=x")) {
		t.Errorf("queues page schedules:\n%s", page.body)
	}
}

// On PostgreSQL a long-polling claim is woken by the notification of an
// insert made by any process, not only by this handler's enqueues.
func TestLongPollWokenByNotification(t *testing.T) {
	e := newEnv(t, testdb.Postgres(t), nil)
	other, err := connect.Open(context.Background(), testdb.Postgres(t), &conveyor.Config{TablePrefix: e.client.Config().TablePrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var slow []time.Duration
	for round := range 3 {
		got := make(chan time.Time, 1)
		go func() {
			var out struct{ Jobs []JobJSON }
			res := e.do(req{method: "POST", path: "/api/v1/claim", auth: adminToken, body: map[string]any{"queue": "n", "wait_ms": 20000}})
			_ = json.Unmarshal(res.body, &out)
			if len(out.Jobs) == 1 {
				got <- time.Now()
			}
			close(got)
		}()
		time.Sleep(2 * time.Second) // the poll's backoff is at its 1s cap by now
		at := time.Now()
		if _, err := other.Enqueue(context.Background(), conveyor.RawArgs{KindName: "k"}, &conveyor.EnqueueOpts{Queue: "n"}); err != nil {
			t.Fatal(err)
		}
		done, ok := <-got
		if !ok {
			t.Fatalf("round %d: no job claimed", round)
		}
		if d := done.Sub(at); d > 500*time.Millisecond {
			slow = append(slow, d)
		}
	}
	if len(slow) == 3 {
		t.Errorf("every claim took over 500ms after the enqueue (%v): not woken by the notification", slow)
	}
}

// processesOf lists the processes by the API, by id.
func (e *env) processesOf() map[string]processJSON {
	e.t.Helper()
	var out processesJSON
	e.must(200, req{method: "GET", path: "/api/v1/processes", auth: roToken}).json(e.t, &out)
	m := map[string]processJSON{}
	for _, p := range out.Processes {
		m[p.ID] = p
	}
	return m
}

// queueOf returns one queue of GET /api/v1/queues.
func (e *env) queueOf(name string) queueJSON {
	e.t.Helper()
	var out queuesJSON
	e.must(200, req{method: "GET", path: "/api/v1/queues", auth: roToken}).json(e.t, &out)
	for _, q := range out.Queues {
		if q.Queue == name {
			return q
		}
	}
	e.t.Fatalf("queue %q not in %+v", name, out.Queues)
	return queueJSON{}
}

// A queue with available jobs and no process working it is flagged, in
// the API and on the page, until a process works it: the started client
// serving the handler (listed as itself) or an HTTP worker, listed from
// its claims and kept alive by the heartbeats of the jobs it holds.
func TestProcessesAndUnworkedQueues(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b.dsn(t), func(o *Options) { o.StatsMaxAge = time.Nanosecond })
			ctx := context.Background()
			e.enqueue(map[string]any{"kind": "email", "queue": "mail"})
			e.enqueue(map[string]any{"kind": "email", "queue": "mail"})
			if q := e.queueOf("mail"); !q.Unworked || q.Processes != 0 {
				t.Fatalf("mail with no process: %+v, want unworked", q)
			}
			page := e.must(200, req{method: "GET", path: "/", auth: roToken})
			for _, want := range []string{`<span class="badge unworked"`, "⚠ no process", `id="unworked-list">mail</span>`} {
				if !bytes.Contains(page.body, []byte(want)) {
					t.Fatalf("queues page lacks %q:\n%s", want, page.body)
				}
			}
			if ps := e.processesOf(); len(ps) != 0 {
				t.Fatalf("processes before any started: %+v", ps)
			}

			// The handler's own client, started, works "default".
			if err := e.client.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.client.Stop(context.Background()) })
			var self processJSON
			waitFor(t, "the started client listed", func() bool {
				for _, p := range e.processesOf() {
					self = p
				}
				return self.Self
			})
			if self.Kind != "client" || !self.Alive || self.PID == nil || self.Queues["default"] != 100 || len(self.Queues) != 1 {
				t.Fatalf("the started client listed as %+v", self)
			}
			if q := e.queueOf("mail"); !q.Unworked {
				t.Fatalf("mail flagged worked by a client of another queue: %+v", q)
			}

			// An HTTP worker claims one of the two jobs of mail.
			name := "mailer " + xss[1]
			jobs := e.claim(map[string]any{"queue": "mail", "worker": name})
			if len(jobs) != 1 {
				t.Fatalf("claimed %d jobs", len(jobs))
			}
			// The reading is reused for ten times the time it took, even
			// with StatsMaxAge at 1ns: wait for the next.
			var hw processJSON
			waitFor(t, "the HTTP worker listed", func() bool {
				hw = e.processesOf()["http:"+name]
				return hw.ID != ""
			})
			if hw.Kind != "http" || !hw.Alive || hw.Host != "127.0.0.1" || hw.PID != nil || len(hw.Queues) != 1 || hw.Queues["mail"] != 0 {
				t.Fatalf("the HTTP worker listed as %+v", hw)
			}
			if *jobs[0].AttemptedBy != hw.ID {
				t.Fatalf("job attempted by %q, process listed as %q", *jobs[0].AttemptedBy, hw.ID)
			}
			if q := e.queueOf("mail"); q.Unworked || q.Processes != 1 || q.Counts["available"] != 1 {
				t.Fatalf("mail worked by the HTTP worker: %+v, want 1 process and not flagged", q)
			}
			page = e.must(200, req{method: "GET", path: "/", auth: roToken})
			if bytes.Contains(page.body, []byte("⚠ no process")) || bytes.Contains(page.body, []byte("<img src=x")) ||
				!bytes.Contains(page.body, []byte(`mailer &#34;&gt;&lt;img src=x onerror=alert(1)&gt;`)) {
				t.Fatalf("queues page after the claim (flag gone, worker name escaped):\n%s", page.body)
			}

			// (Refreshing the row from heartbeats once the interval passed is
			// the engine's: internal/engine TestRemoteWorkersRegistered.)
			// Within the interval, requests write nothing.
			e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/heartbeat", jobs[0].ID), auth: adminToken, body: map[string]any{"fence": *jobs[0].Fence}})
			if p := e.processesOf()[hw.ID]; !time.Time(p.HeartbeatAt).Equal(time.Time(hw.HeartbeatAt)) || !p.Alive {
				t.Fatalf("a heartbeat within the interval rewrote the row: %v, then %v", hw.HeartbeatAt, p.HeartbeatAt)
			}
			e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", jobs[0].ID), auth: adminToken, body: map[string]any{"fence": *jobs[0].Fence}})
			// Stopping the client removes its row; the HTTP worker's stays.
			if err := e.client.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if ps := e.processesOf(); len(ps) != 1 || !ps[hw.ID].Alive {
				t.Fatalf("after the client stopped: %+v", ps)
			}
		})
	}
}

// waitFor polls cond every 10ms for up to 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGetBatch: GET /api/v1/batches/{id} answers the batch's jobs, their
// states and results, and its callback once enqueued; 404 for none. A
// job's GET names the batch it is a member of (batch_id) or whose
// callback it is (callback_of), and its page links that batch's; a job
// of no batch has neither key.
func TestGetBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		bid, ids, err := e.client.EnqueueBatch(ctx, []conveyor.EnqueueItem{
			{Args: conveyor.RawArgs{KindName: "part"}}, {Args: conveyor.RawArgs{KindName: "part"}},
		}, conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: "parts_done"}})
		if err != nil {
			t.Fatal(err)
		}
		plain := e.enqueue(map[string]any{"kind": "other", "queue": "elsewhere"})
		links := func(id, batchID, callbackOf int64) {
			t.Helper()
			b := e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/jobs/%d", id), auth: roToken}).body
			var j map[string]any
			if err := json.Unmarshal(b, &j); err != nil {
				t.Fatal(err)
			}
			for k, want := range map[string]int64{"batch_id": batchID, "callback_of": callbackOf} {
				got, ok := j[k]
				if want == 0 && ok || want != 0 && got != float64(want) {
					t.Errorf("job %d: %s %v (present %v), want %d: %s", id, k, got, ok, want, b)
				}
			}
			page := string(e.must(200, req{method: "GET", path: fmt.Sprintf("/jobs/%d", id), auth: roToken}).body)
			for elem, want := range map[string]int64{"job-member-of": batchID, "job-batch": callbackOf} {
				link := fmt.Sprintf(`/batches/%d" id="%s"`, want, elem)
				if has := strings.Contains(page, `id="`+elem+`"`); has != (want != 0) || want != 0 && !strings.Contains(page, link) {
					t.Errorf("job %d's page: %s link present %v, want %d (%s)", id, elem, has, want, link)
				}
			}
		}
		links(ids[0], bid, 0)
		links(ids[1], bid, 0)
		links(plain, 0, 0)
		c := e.claim(map[string]any{"limit": 2})
		if len(c) != 2 {
			t.Fatalf("claimed %d", len(c))
		}
		for i, j := range c {
			e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/complete", j.ID), auth: adminToken, body: map[string]any{"fence": *j.Fence, "result": i}})
		}
		fired, err := seam.DriverOf(e.client).FireBatches(ctx, 10, nil)
		if err != nil || fired[bid] == 0 {
			t.Fatalf("fire: %v %v", fired, err)
		}
		var b BatchJSON
		e.must(200, req{method: "GET", path: fmt.Sprintf("/api/v1/batches/%d", bid), auth: roToken}).json(t, &b)
		if b.ID != bid || !b.Finished || b.CallbackKind != "parts_done" || b.CallbackID == nil || *b.CallbackID != fired[bid] ||
			b.FiredAt == nil || b.Counts["completed"] != 2 || len(b.Jobs) != 2 || b.Jobs[0].ID != ids[0] {
			t.Fatalf("batch %+v", b)
		}
		for _, j := range b.Jobs {
			if j.State != "completed" || (string(j.Result) != "0" && string(j.Result) != "1") {
				t.Fatalf("batch job %+v (result %s)", j, j.Result)
			}
		}
		links(fired[bid], 0, bid)
		links(ids[0], bid, 0)
		e.must(404, req{method: "GET", path: fmt.Sprintf("/api/v1/batches/%d", bid+100), auth: roToken})
	})
}
