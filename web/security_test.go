package web

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

