package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), nil, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("serve: %v (%v)", err, <-done)
	}
	go io.Copy(io.Discard, pr)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop")
		}
	})
	u := regexp.MustCompile(`http://\S+/`).FindString(line)
	if u == "" {
		t.Fatalf("no URL in %q", line)
	}
	return strings.TrimSuffix(u, "/")
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
