package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
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

// useFakeClock makes the handler's sessions and login throttle run on a
// clock the test moves.
func (e *env) useFakeClock() *fakeClock {
	c := &fakeClock{t: time.Now()}
	e.h.sessions.now = c.now
	e.h.throttle.now = c.now
	return c
}

// reset forgets every failure, for tests that fail to log in on purpose.
func (t *loginThrottle) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addrs, t.overflow = map[string]*failures{}, failures{}
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

// TestFailedLoginsThrottled: after freeFailures failed logins an address
// waits, doubling, and while it waits even a correct credential is not
// looked at (429 with Retry-After); each failure is logged without the
// secret.
func TestFailedLoginsThrottled(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	clock := e.useFakeClock()
	const wrongPass = "wrong-password-guess-42"
	basic := func(pass string) map[string]string {
		r, _ := http.NewRequest("GET", "/", nil)
		r.SetBasicAuth(userName, pass)
		return map[string]string{"Authorization": r.Header.Get("Authorization")}
	}
	for i := range freeFailures + 1 {
		if res := e.do(req{method: "GET", path: "/api/v1/jobs", header: basic(wrongPass)}); res.status != 401 {
			t.Fatalf("failure %d: %d, want 401", i+1, res.status)
		}
	}
	// Waiting 1s now: every credential is refused unseen.
	for _, r := range []req{
		{method: "GET", path: "/api/v1/jobs", auth: "basic"},
		{method: "GET", path: "/api/v1/jobs", auth: adminToken},
		{method: "GET", path: "/jobs", auth: adminToken},
	} {
		res := e.do(r)
		if res.status != 429 || res.header.Get("Retry-After") != "1" {
			t.Errorf("%s %s while throttled: %d, Retry-After %q; want 429, 1", r.method, r.path, res.status, res.header.Get("Retry-After"))
		}
	}
	if res := e.postLogin("/login", url.Values{"token": {adminToken}}); res.StatusCode != 429 || res.Header.Get("Retry-After") != "1" {
		t.Errorf("login form while throttled: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	clock.add(time.Second)
	e.must(200, req{method: "GET", path: "/api/v1/jobs", auth: "basic"})
	// A success does not reset the count: the next failure waits 2s.
	e.must(401, req{method: "GET", path: "/api/v1/jobs", auth: "wrong-token-0123456789abcdef"})
	if res := e.do(req{method: "GET", path: "/api/v1/jobs", auth: adminToken}); res.status != 429 || res.header.Get("Retry-After") != "2" {
		t.Errorf("after the 7th failure: %d, Retry-After %q; want 429, 2", res.status, res.header.Get("Retry-After"))
	}
	// The form's failures count too, and the user name is logged.
	clock.add(2 * time.Second)
	if res := e.postLogin("/login", url.Values{"user": {"mallory"}, "password": {wrongPass}}); res.StatusCode != 401 {
		t.Errorf("wrong password at the form: %d", res.StatusCode)
	}
	if res := e.postLogin("/login", url.Values{"user": {userName}, "password": {userPass}}); res.StatusCode != 429 || res.Header.Get("Retry-After") != "4" {
		t.Errorf("form after the 8th failure: %d, Retry-After %q; want 429, 4", res.StatusCode, res.Header.Get("Retry-After"))
	}
	// Forgotten forgetAfter after the last failure.
	clock.add(forgetAfter + time.Second)
	for range freeFailures {
		e.must(401, req{method: "GET", path: "/api/v1/jobs", header: basic(wrongPass)})
	}
	e.must(200, req{method: "GET", path: "/api/v1/jobs", auth: "basic"})

	logs := e.logs.String()
	if strings.Contains(logs, wrongPass) || strings.Contains(logs, userPass) || strings.Contains(logs, adminToken) {
		t.Errorf("a secret in the log:\n%s", logs)
	}
	var warn []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "failed login") {
			warn = append(warn, l)
		}
	}
	if len(warn) != freeFailures+3+freeFailures {
		t.Errorf("%d failed-login warnings, want %d:\n%s", len(warn), freeFailures+3+freeFailures, strings.Join(warn, "\n"))
	}
	for _, want := range []string{"remote=127.0.0.1:", "method=basic user=alice failures=1", "method=bearer failures=7 blocked_for=2s", "method=\"login form\" user=mallory failures=8 blocked_for=4s"} {
		if !strings.Contains(strings.Join(warn, "\n"), want) {
			t.Errorf("no %q in the failed-login warnings:\n%s", want, strings.Join(warn, "\n"))
		}
	}
}

// TestLoginThrottleBounded: the throttle remembers at most max addresses,
// the others share one entry (so they are slowed down too), an IPv6 host
// counts by its /64, and the warnings are rate-limited, the next line
// saying how many were left out.
func TestLoginThrottleBounded(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	clock := &fakeClock{t: time.Now()}
	th := newLoginThrottle()
	th.now, th.max = clock.now, 10
	ctx := t.Context()
	for i := range 1000 {
		th.fail(ctx, log, fmt.Sprintf("192.0.2.%d:4000", i%250), "basic", "u")
	}
	if n := len(th.addrs); n > th.max {
		t.Errorf("%d addresses remembered, max %d", n, th.max)
	}
	if d := th.wait("198.51.100.1:1"); d != maxBlock {
		t.Errorf("a new address while the table is full waits %v, want %v (the overflow's)", d, maxBlock)
	}
	if lines := strings.Count(logs.String(), "failed login"); lines != failLogBurst {
		t.Errorf("%d warnings for 1000 failures at once, want %d", lines, failLogBurst)
	}
	clock.add(failLogEvery)
	th.fail(ctx, log, "192.0.2.1:4000", "basic", "u")
	if !strings.Contains(logs.String(), fmt.Sprintf("not_logged_before=%d", 1000-failLogBurst)) {
		t.Errorf("the next warning does not count the ones left out:\n%s", logs.String())
	}
	// After forgetAfter the table is swept at the next new address.
	clock.add(forgetAfter + maxBlock)
	th.fail(ctx, log, "203.0.113.9:1", "basic", strings.Repeat("x", 1000))
	if _, ok := th.addrs["203.0.113.9"]; !ok || len(th.addrs) != 1 {
		t.Errorf("after a sweep: %v", th.addrs)
	}
	if strings.Contains(logs.String(), strings.Repeat("x", maxLoggedName+1)) || !strings.Contains(logs.String(), "user="+strings.Repeat("x", maxLoggedName)+"...") {
		t.Error("a long user name is not logged cut to maxLoggedName bytes")
	}
	// IPv6: one /64 is one host.
	th2 := newLoginThrottle()
	th2.now = clock.now
	for i := range freeFailures + 1 {
		th2.fail(ctx, log, fmt.Sprintf("[2001:db8:1:2::%x]:5000", i), "bearer", "")
	}
	if th2.wait("[2001:db8:1:2:ffff::1]:1") == 0 || th2.wait("[2001:db8:1:3::1]:1") != 0 {
		t.Error("IPv6 addresses are not counted by their /64")
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
