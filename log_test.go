package conveyor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
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

// Each failed attempt is one structured record at the chosen level, with
// the job's attributes; a successful job logs nothing.
func TestFailedAttemptsLogged(t *testing.T) {
	ctx := context.Background()
	var buf syncBuffer
	cfg := fast(testdb.Prefix())
	cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.FailedAttemptLevel = slog.LevelInfo
	c := openDropped(t, filepath.Join(t.TempDir(), "log.db"), cfg)
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
		if j.Args.N == 1 && j.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}))
	okID, err := c.Enqueue(ctx, noop{N: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	failID, err := c.Enqueue(ctx, noop{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both jobs completed", 15*time.Second, func() bool {
		return jobState(t, c, okID).State == conveyor.JobStateCompleted && jobState(t, c, failID).State == conveyor.JobStateCompleted
	})
	var records []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r["msg"] == "conveyor: job attempt failed" {
			records = append(records, r)
		}
	}
	if len(records) != 1 {
		t.Fatalf("%d failed-attempt records, want 1 (log: %s)", len(records), buf.String())
	}
	r := records[0]
	want := map[string]any{"level": "INFO", "job_id": float64(failID), "kind": "noop", "queue": "default",
		"attempt": float64(1), "error": "first attempt fails", "next_state": string(conveyor.JobStateRetryable)}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("record %s = %v, want %v (record %v)", k, r[k], v, r)
		}
	}
	if _, ok := r["duration"]; !ok {
		t.Errorf("record has no duration: %v", r)
	}
}
