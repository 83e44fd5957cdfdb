package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// useFakeClock makes the handler's sessions run on a clock the test
// moves.
func (e *env) useFakeClock() *fakeClock {
	c := &fakeClock{t: time.Now()}
	e.h.sessions.now = c.now
	return c
}

// postLogin posts the login form and returns the answer, without
// following a redirect.
func (e *env) postLogin(path string, form url.Values) *http.Response {
	e.t.Helper()
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := cl.PostForm(e.srv.URL+path, form)
	if err != nil {
		e.t.Fatal(err)
	}
	res.Body.Close()
	return res
}

// TestLoginRedirectStaysUnderBase: after a login, next may only lead to a
// clean path under the base path; anything else leads to the base.
func TestLoginRedirectStaysUnderBase(t *testing.T) {
	for _, base := range []string{"", "/conveyor"} {
		t.Run("base="+base, func(t *testing.T) {
			e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.BasePath = base })
			home := base + "/"
			cases := map[string]string{
				base + "/jobs?state=failed&queue=a": base + "/jobs?state=failed&queue=a",
				base + "/jobs/7":                    base + "/jobs/7",
				home:                                home,
				"":                                  home,
				"/\t/127.0.0.1:18099/x":             home, // browsers drop the tab: //127.0.0.1:18099/x
				base + "/\t/127.0.0.1:18099/x":      home,
				base + "/%09/127.0.0.1:18099/x":     home,
				base + "/\n/evil.example":           home,
				base + "/\x7f/evil.example":         home,
				"//evil.example/x":                  home,
				base + "//evil.example/x":           home,
				base + "/%2f%2fevil.example/x":      home,
				"/\\evil.example/x":                 home,
				base + "/\\evil.example/x":          home,
				base + "/%5cevil.example/x":         home,
				"https://evil.example/":             home,
				base + "/../evil":                   home,
				base + "/jobs/../../evil":           home,
				base + "/%2e%2e/evil":               home,
				base + "/.%2E/evil":                 home,
				base + "/./jobs":                    home,
				base + "/jobs/..":                   home,
				base + "/login?next=/x":             home,
				base + "/jobs#frag":                 home,
				base + "/jobs\u00a0":                home,
				base + "/%zz":                       home,
			}
			if base != "" {
				cases["/conveyorx/jobs"] = home // outside the base
				cases["/jobs"] = home
			}
			for next, want := range cases {
				res := e.postLogin(base+"/login", url.Values{"token": {adminToken}, "next": {next}})
				if res.StatusCode != 303 || res.Header.Get("Location") != want {
					t.Errorf("login with next %q: %d to %q, want 303 to %q", next, res.StatusCode, res.Header.Get("Location"), want)
				}
			}
			// The login page carries only a safe next to its form.
			res := e.do(req{method: "GET", path: base + "/login?next=" + url.QueryEscape(base+"/../evil")})
			if bytes.Contains(res.body, []byte("evil")) {
				t.Errorf("login page keeps an unsafe next: %s", res.body)
			}
		})
	}
}

// TestLogoutEndsSession: after logout the old cookie is refused by the
// server, not only cleared in the browser; other sessions go on.
func TestLogoutEndsSession(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	ck := e.login(adminToken)
	other := e.login(adminToken)
	cookie := map[string]string{"Cookie": ck.Name + "=" + ck.Value}
	e.must(200, req{method: "GET", path: "/api/v1/jobs", header: cookie})
	res := e.must(303, req{method: "POST", path: "/logout", header: cookie})
	cleared := false
	for _, c := range (&http.Response{Header: res.header}).Cookies() {
		cleared = cleared || (c.Name == cookieName && c.MaxAge < 0)
	}
	if !cleared {
		t.Error("logout does not clear the cookie")
	}
	for _, path := range []string{"/api/v1/jobs", "/jobs"} {
		if res := e.do(req{method: "GET", path: path, header: cookie}); res.status != 401 {
			t.Errorf("GET %s with the cookie of a session logged out: %d, want 401", path, res.status)
		}
	}
	if res := e.do(req{method: "POST", path: "/api/v1/jobs", header: cookie, body: map[string]any{"kind": "k"}}); res.status != 401 {
		t.Errorf("enqueue with the cookie of a session logged out: %d, want 401", res.status)
	}
	e.must(200, req{method: "GET", path: "/api/v1/jobs", header: map[string]string{"Cookie": other.Name + "=" + other.Value}})
	if n := e.count(); n != 0 {
		t.Errorf("%d jobs enqueued", n)
	}
}

// TestSessionExpiresAndTableBounded: a session ends at its TTL, and one
// credential's logins beyond maxSessionsPerCred end its oldest ones.
func TestSessionExpiresAndTableBounded(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.SessionTTL = time.Hour })
	clock := e.useFakeClock()
	first := e.login(adminToken)
	h := map[string]string{"Cookie": first.Name + "=" + first.Value}
	e.must(200, req{method: "GET", path: "/api/v1/jobs", header: h})
	clock.add(time.Hour)
	e.must(401, req{method: "GET", path: "/api/v1/jobs", header: h})

	var cks []*http.Cookie
	for range maxSessionsPerCred + 1 {
		clock.add(time.Second)
		cks = append(cks, e.login(adminToken))
	}
	ro := e.login(roToken)
	e.h.sessions.mu.Lock()
	n := len(e.h.sessions.byID)
	e.h.sessions.mu.Unlock()
	if n != maxSessionsPerCred+1 {
		t.Errorf("%d sessions held, want %d (one credential's cap, and the other's one)", n, maxSessionsPerCred+1)
	}
	e.must(401, req{method: "GET", path: "/api/v1/jobs", header: map[string]string{"Cookie": cks[0].Name + "=" + cks[0].Value}})
	for _, c := range []*http.Cookie{cks[1], cks[len(cks)-1], ro} {
		e.must(200, req{method: "GET", path: "/api/v1/jobs", header: map[string]string{"Cookie": c.Name + "=" + c.Value}})
	}
}

// TestLoopbackDevRefusesForeignHost: without authentication on loopback,
// a request addressed to any other name (DNS rebinding: a page of
// another site whose name resolves to 127.0.0.1) is refused with 421.
func TestLoopbackDevRefusesForeignHost(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) {
		o.Tokens, o.Users, o.InsecureLoopbackDev = nil, nil, true
	})
	_, port, _ := strings.Cut(strings.TrimPrefix(e.srv.URL, "http://"), ":")
	do := func(host, method, path, body string) (int, string) {
		r, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Host = host
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		return res.StatusCode, b.String()
	}
	for _, host := range []string{"rebind.example:" + port, "rebind.example", "127.0.0.1.nip.io:" + port, "localhost.evil.example:" + port, "0.0.0.0:" + port} {
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/api/v1/jobs", `{"kind":"k"}`},
			{"GET", "/api/v1/jobs", ""},
			{"GET", "/", ""},
			{"GET", "/login", ""},
		} {
			status, body := do(host, c.method, c.path, c.body)
			if status != 421 || !strings.Contains(body, "InsecureLoopbackDev") {
				t.Errorf("%s %s with Host %q: %d %s, want 421", c.method, c.path, host, status, body)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port, "127.0.0.1", "localhost", "[::1]"} {
		if status, body := do(host, "POST", "/api/v1/jobs", `{"kind":"k"}`); status != 201 {
			t.Errorf("enqueue with Host %q: %d %s", host, status, body)
		}
	}
	if status, body := do("localhost:"+port, "GET", "/api/v1/jobs", ""); status != 200 || strings.Count(body, `"kind":"k"`) != 7 {
		t.Errorf("list with Host localhost: %d %s", status, body)
	}
}

// TestDurationFieldsRangeChecked: a duration in milliseconds too large
// for a time.Duration is refused with its field's name, not wrapped
// around into range (288230376151712744 ms wraps to 1s,
// 9223372036854775807 ms to -1ms), and nothing is written.
func TestDurationFieldsRangeChecked(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	const wrapsTo1s, wrapsToMinus1ms = 288230376151712744, 9223372036854775807
	for _, c := range []struct {
		path  string
		body  map[string]any
		field string
	}{
		{"/api/v1/jobs", map[string]any{"kind": "k", "timeout_ms": wrapsTo1s}, "timeout_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "timeout_ms": wrapsToMinus1ms}, "timeout_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "timeout_ms": int64(maxJobTimeout/time.Millisecond) + 1}, "timeout_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "delay_ms": wrapsTo1s}, "delay_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "delay_ms": wrapsToMinus1ms}, "delay_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "delay_ms": -1}, "delay_ms -1 is negative"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "unique": map[string]any{"by_period_ms": wrapsTo1s}}, "unique.by_period_ms"},
		{"/api/v1/jobs", map[string]any{"kind": "k", "unique": map[string]any{"by_period_ms": -1}}, "unique.by_period_ms"},
		{"/api/v1/jobs/batch", map[string]any{"jobs": []any{map[string]any{"kind": "k"}, map[string]any{"kind": "k", "timeout_ms": wrapsTo1s}}}, "job 1: timeout_ms"},
		{"/api/v1/claim", map[string]any{"lease_ms": wrapsTo1s}, "lease_ms"},
		{"/api/v1/claim", map[string]any{"wait_ms": wrapsTo1s}, "wait_ms"},
		{"/api/v1/claim", map[string]any{"wait_ms": wrapsToMinus1ms}, "wait_ms"},
	} {
		res := e.do(req{method: "POST", path: c.path, auth: adminToken, body: c.body})
		var ae apiError
		if res.status != 400 || json.Unmarshal(res.body, &ae) != nil || !strings.Contains(ae.Error, c.field) {
			t.Errorf("%s %v: %d %s, want 400 naming %s", c.path, c.body, res.status, res.body, c.field)
		}
	}
	if n := e.count(); n != 0 {
		t.Fatalf("%d jobs written by refused requests", n)
	}
	// A claimed job: heartbeat and snooze refuse wrapping values and
	// leave the job as it was.
	id := e.enqueue(map[string]any{"kind": "k"})
	j := e.claim(map[string]any{"lease_ms": 60000})[0]
	before := e.job(id)
	for _, c := range []struct {
		path  string
		body  map[string]any
		field string
	}{
		{fmt.Sprintf("/api/v1/jobs/%d/heartbeat", id), map[string]any{"fence": *j.Fence, "lease_ms": wrapsTo1s}, "lease_ms"},
		{fmt.Sprintf("/api/v1/jobs/%d/snooze", id), map[string]any{"fence": *j.Fence, "delay_ms": wrapsTo1s}, "delay_ms"},
		{fmt.Sprintf("/api/v1/jobs/%d/snooze", id), map[string]any{"fence": *j.Fence, "delay_ms": wrapsToMinus1ms}, "delay_ms"},
		{fmt.Sprintf("/api/v1/jobs/%d/fail", id), map[string]any{"fence": *j.Fence, "retry_in_ms": wrapsTo1s}, "retry_in_ms"},
	} {
		res := e.do(req{method: "POST", path: c.path, auth: adminToken, body: c.body})
		var ae apiError
		if res.status != 400 || json.Unmarshal(res.body, &ae) != nil || !strings.Contains(ae.Error, c.field) {
			t.Errorf("%s %v: %d %s, want 400 naming %s", c.path, c.body, res.status, res.body, c.field)
		}
	}
	after := e.job(id)
	if after.State != "running" || !time.Time(*after.LeaseExpiresAt).Equal(time.Time(*before.LeaseExpiresAt)) {
		t.Errorf("refused requests changed the job: %+v -> %+v", before, after)
	}
	// In range: accepted and stored as given.
	id2 := e.enqueue(map[string]any{"kind": "k", "timeout_ms": int64(maxJobTimeout / time.Millisecond), "delay_ms": 3_600_000})
	if j := e.job(id2); j.TimeoutMS == nil || *j.TimeoutMS != int64(maxJobTimeout/time.Millisecond) || j.State != "scheduled" {
		t.Errorf("in-range job stored as %+v", j)
	}
}
