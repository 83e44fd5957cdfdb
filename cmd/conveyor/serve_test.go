package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

func TestServeRefusesWithoutCredentials(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--db", dsn}, "no credentials"},
		{[]string{"serve", "--db", dsn, "--insecure-loopback-dev", "--listen", "0.0.0.0:8080"}, "loopback only"},
		{[]string{"serve", "--db", dsn, "--insecure-loopback-dev", "--listen", ":8080"}, "loopback only"},
		{[]string{"serve", "--db", dsn, "--insecure-loopback-dev", "--listen", "192.0.2.1:8080"}, "loopback only"},
		{[]string{"serve", "--db", dsn, "--token-file", filepath.Join(t.TempDir(), "none")}, "no such file"},
	} {
		_, _, err := cli(t, "", c.args...)
		oneLineErr(t, c.args, err, c.want)
	}
}

// serve starts `conveyor serve` with args and returns its base URL; the
// server stops when the test ends.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	return serveLogging(t, io.Discard, args...)
}

// serveLogging is serve with the server's log (its standard error) going
// to stderr.
func serveLogging(t *testing.T, stderr io.Writer, args ...string) string {
	t.Helper()
	base, stop := startServe(t, stderr, args...)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return base
}

// startServe starts `conveyor serve` with args, its log going to stderr,
// and returns its base URL and stop, which stops it and returns its
// error (or that it did not stop within 30s).
func startServe(t *testing.T, stderr io.Writer, args ...string) (base string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), nil, pw, stderr)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("serve: %v (%v)", err, <-done)
	}
	go io.Copy(io.Discard, pr)
	stop = func() error {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("serve did not stop within 30s")
		}
	}
	u := regexp.MustCompile(`http://\S+/`).FindString(line)
	if u == "" {
		_ = stop()
		t.Fatalf("no URL in %q", line)
	}
	return strings.TrimSuffix(u, "/"), stop
}

func TestServe(t *testing.T) {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	tokens := filepath.Join(dir, "tokens")
	ro := filepath.Join(dir, "ro")
	users := filepath.Join(dir, "users")
	os.WriteFile(tokens, []byte("# admin\nadmin-token-0123456789abcdef\n"), 0o600)
	os.WriteFile(ro, []byte("read-only-token-0123456789ab\n"), 0o600)
	os.WriteFile(users, []byte("bob:pass:word:with:colons:read-only\n"), 0o600)
	base := serve(t, "--db", dsn, "--token-file", tokens, "--read-only-token-file", ro, "--basic-auth-file", users)
	get := func(path, auth string, basic ...string) int {
		r, _ := http.NewRequest("GET", base+path, nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		if len(basic) == 2 {
			r.SetBasicAuth(basic[0], basic[1])
		}
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	post := func(path, auth, body string) int {
		r, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+auth)
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := get("/api/v1/queues", ""); s != 401 {
		t.Errorf("no credentials: %d", s)
	}
	if s := get("/api/v1/queues", "read-only-token-0123456789ab"); s != 200 {
		t.Errorf("read-only token: %d", s)
	}
	if s := get("/api/v1/queues", "", "bob", "pass:word:with:colons"); s != 200 {
		t.Errorf("basic auth: %d", s)
	}
	if s := post("/api/v1/jobs", "read-only-token-0123456789ab", `{"kind":"k"}`); s != 403 {
		t.Errorf("read-only enqueue: %d", s)
	}
	if s := post("/api/v1/jobs", "admin-token-0123456789abcdef", `{"kind":"k"}`); s != 201 {
		t.Errorf("admin enqueue: %d", s)
	}
}

func TestServeInsecureLoopbackDev(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	base := serve(t, "--db", dsn, "--insecure-loopback-dev", "--maintenance=false")
	res, err := http.Get(base + "/api/v1/queues")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("loopback dev: %d", res.StatusCode)
	}
}

// TestServeMaintenance: serve's client works no queue but, started with
// --maintenance (the default), promotes a delayed job when it comes due;
// nothing claims it (it stays available at attempt 0 for HTTP workers).
func TestServeMaintenance(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	base := serve(t, "--db", dsn, "--insecure-loopback-dev")
	res, err := http.Post(base+"/api/v1/jobs", "application/json", strings.NewReader(`{"kind":"k","delay_ms":100}`))
	if err != nil {
		t.Fatal(err)
	}
	var made struct{ ID int64 }
	err = json.NewDecoder(res.Body).Decode(&made)
	res.Body.Close()
	if err != nil || res.StatusCode != 201 || made.ID == 0 {
		t.Fatalf("enqueue: %d, %v, %+v", res.StatusCode, err, made)
	}
	job := func() (state string, attempt int) {
		t.Helper()
		res, err := http.Get(fmt.Sprintf("%s/api/v1/jobs/%d", base, made.ID))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var j struct {
			State   string
			Attempt int
		}
		if err := json.NewDecoder(res.Body).Decode(&j); err != nil {
			t.Fatal(err)
		}
		return j.State, j.Attempt
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _ := job()
		if st == "available" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delayed job still %s after 20s: serve ran no maintenance", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // past a few poll intervals, had serve a queue
	if st, att := job(); st != "available" || att != 0 {
		t.Errorf("job is %s at attempt %d: serve claimed it", st, att)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// request sends method path with body (JSON, or nothing when "") and the
// bearer token (none when ""), and returns the status and the body.
func request(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// TestServeUnknownKinds: the API's enqueue of a kind no job of which has
// completed on the database is logged as a warning by default (the first
// job of a new kind for an HTTP worker is one: it cannot have completed
// before it is enqueued), refused with 400 under --unknown-kinds refuse,
// and passed silently under --unknown-kinds allow; a kind a worker
// completed is accepted in every mode.
func TestServeUnknownKinds(t *testing.T) {
	ctx := context.Background()
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	// A worker completes one job of kind "sendmail".
	c, err := connect.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[sendmailArgs]) error { return nil }))
	id, err := c.Enqueue(ctx, sendmailArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State == conveyor.JobStateCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d is %s after a minute", id, j.State)
		}
	}
	c.Close()
	for _, mode := range []string{"", "warn", "refuse", "allow"} {
		t.Run("mode="+mode, func(t *testing.T) {
			var logs syncBuffer
			args := []string{"--db", dsn, "--insecure-loopback-dev", "--maintenance=false"}
			if mode != "" {
				args = append(args, "--unknown-kinds", mode)
			}
			base := serveLogging(t, &logs, args...)
			if st, body := request(t, "POST", base+"/api/v1/jobs", "", `{"kind":"sendmail"}`); st != 201 {
				t.Errorf("known kind: %d %s", st, body)
			}
			st, body := request(t, "POST", base+"/api/v1/jobs", "", `{"kind":"sendmial","queue":"mail"}`)
			warning := `msg="enqueued a kind no worker is known to handle`
			switch mode {
			case "refuse":
				if st != 400 || !strings.Contains(body, `unknown job kind \"sendmial\": no job of this kind has completed on this database`) {
					t.Errorf("unknown kind: %d %s, want 400 naming it", st, body)
				}
				if st, body := request(t, "POST", base+"/api/v1/jobs/batch", "", `{"jobs":[{"kind":"sendmail"},{"kind":"sendmial"}]}`); st != 400 || !strings.Contains(body, "sendmial") {
					t.Errorf("batch with an unknown kind: %d %s, want 400", st, body)
				}
			default:
				if st != 201 {
					t.Errorf("unknown kind: %d %s, want 201", st, body)
				}
				// The server logs before it answers: the log holds the
				// warning now, or never will.
				if got := strings.Count(logs.String(), warning); (mode == "allow") != (got == 0) {
					t.Errorf("%d warnings for mode %q:\n%s", got, mode, logs.String())
				}
				if mode != "allow" && !strings.Contains(logs.String(), "kind=sendmial queue=mail") {
					t.Errorf("the warning does not name the kind and queue:\n%s", logs.String())
				}
				// Once per kind, not once per job.
				request(t, "POST", base+"/api/v1/jobs", "", `{"kind":"sendmial"}`)
				if got := strings.Count(logs.String(), warning); mode != "allow" && got != 1 {
					t.Errorf("%d warnings after a second job of the kind, want 1", got)
				}
			}
		})
	}
}

// TestServeMetrics: /metrics answers Prometheus' text format to the API's
// credentials (read-only included) and to nobody else: the queues' depth,
// the jobs enqueued through the API, serve's own counters and the Go
// runtime's. --metrics=false leaves it out.
func TestServeMetrics(t *testing.T) {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	tokens, ro := filepath.Join(dir, "tokens"), filepath.Join(dir, "ro")
	os.WriteFile(tokens, []byte("admin-token-0123456789abcdef\n"), 0o600)
	os.WriteFile(ro, []byte("read-only-token-0123456789ab\n"), 0o600)
	base := serve(t, "--db", dsn, "--token-file", tokens, "--read-only-token-file", ro, "--unknown-kinds", "allow")
	if st, body := request(t, "POST", base+"/api/v1/jobs", "admin-token-0123456789abcdef", `{"kind":"k","queue":"mail"}`); st != 201 {
		t.Fatalf("enqueue: %d %s", st, body)
	}
	if st, _ := request(t, "GET", base+"/metrics", "", ""); st != 401 {
		t.Errorf("/metrics without credentials: %d, want 401", st)
	}
	st, body := request(t, "GET", base+"/metrics", "read-only-token-0123456789ab", "")
	if st != 200 {
		t.Fatalf("/metrics: %d %s", st, body)
	}
	for _, want := range []string{
		`conveyor_queue_jobs{queue="mail",state="available"} 1`,
		`conveyor_jobs_enqueued_total{kind="k",queue="mail"} 1`,
		`conveyor_queue_stats_up 1`,
		`conveyor_client_promoted_total 0`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	off := serve(t, "--db", dsn, "--token-file", tokens, "--metrics=false")
	if st, _ := request(t, "GET", off+"/metrics", "admin-token-0123456789abcdef", ""); st != 404 {
		t.Errorf("/metrics with --metrics=false: %d, want 404", st)
	}
}

// TestServeLogLevel: the dashboard's live refreshes are logged at debug,
// so serve's access log shows them with --log-level debug and not by
// default; an unknown level is refused.
func TestServeLogLevel(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	get := func(base, path string, live bool) {
		t.Helper()
		r, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if live {
			r.Header.Set("X-Conveyor-Refresh", "live")
		}
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: %d", path, res.StatusCode)
		}
	}
	var quiet, loud syncBuffer
	base := serveLogging(t, &quiet, "--db", dsn, "--insecure-loopback-dev", "--maintenance=false")
	get(base, "/api/v1/queues", true)
	get(base, "/api/v1/schedules", false) // logged at info, after the refresh
	baseDebug := serveLogging(t, &loud, "--db", dsn, "--insecure-loopback-dev", "--maintenance=false", "--log-level", "debug")
	get(baseDebug, "/api/v1/queues", true)
	waitUntil := time.Now().Add(10 * time.Second)
	for (!strings.Contains(loud.String(), "path=/api/v1/queues") || !strings.Contains(quiet.String(), "path=/api/v1/schedules")) && time.Now().Before(waitUntil) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(quiet.String(), "path=/api/v1/schedules") {
		t.Fatalf("default level: an ordinary request is not logged:\n%s", quiet.String())
	}
	if !strings.Contains(loud.String(), "level=DEBUG") || !strings.Contains(loud.String(), "path=/api/v1/queues") {
		t.Errorf("--log-level debug: the live refresh is not logged:\n%s", loud.String())
	}
	if strings.Contains(quiet.String(), "path=/api/v1/queues") {
		t.Errorf("default level: a live refresh is logged:\n%s", quiet.String())
	}
	if _, _, err := cli(t, "", "serve", "--db", dsn, "--insecure-loopback-dev", "--log-level", "loud"); err == nil || !strings.Contains(err.Error(), `--log-level "loud"`) {
		t.Errorf("--log-level loud: %v", err)
	}
}
