package main

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Stopping serve ends the long-polling claims first: they answer at once
// with no jobs (web.Handler.Close before http.Server.Shutdown), so the
// server stops promptly instead of waiting out its shutdown bound while
// HTTP workers long-poll, and then cutting their connections.
func TestServeStopEndsLongPolls(t *testing.T) {
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	base, stop := startServe(t, io.Discard, "--db", dsn, "--insecure-loopback-dev", "--maintenance=false")
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	type answer struct {
		status int
		body   []byte
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := http.Post(base+"/api/v1/claim", "application/json", strings.NewReader(`{"queue":"q","wait_ms":30000}`))
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		got <- answer{res.StatusCode, b, err}
	}()
	// The claim is in the handler once its worker is registered (before
	// its claim statement, which then waits on the empty queue).
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(base + "/api/v1/processes")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if bytes.Contains(b, []byte(`"kind":"http"`)) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim's worker was not registered within 30s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Before, Shutdown waited out its 10s bound for the claim and then cut
	// its connection: the claim got EOF.
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || a.status != 200 || !bytes.Contains(a.body, []byte(`"jobs":[]`)) {
		t.Errorf("the long-polling claim answered %d %s (%v), want 200 with no jobs", a.status, a.body, a.err)
	}
}
