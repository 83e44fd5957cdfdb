package web

import (
	"fmt"
	"strings"
	"testing"
)

// TestRetryUniqueKeyHeld: retrying a finished unique job whose key another
// job holds answers 409 naming the holder (not a 500), and a bulk retry
// reports it for that job alone.
func TestRetryUniqueKeyHeld(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		job := map[string]any{"kind": "report", "args": map[string]any{"day": "mon"}, "unique": map[string]any{"by_args": true}}
		first := e.enqueue(job)
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", first), auth: adminToken})
		holder := e.enqueue(job)
		other := e.enqueue(map[string]any{"kind": "report"})
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", other), auth: adminToken})
		res := e.must(409, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/retry", first), auth: adminToken})
		if !strings.Contains(string(res.body), fmt.Sprintf("held by job %d", holder)) {
			t.Errorf("409 body %s does not name the holder %d", res.body, holder)
		}
		var out struct{ Results []bulkResult }
		e.must(200, req{method: "POST", path: "/api/v1/jobs/bulk", auth: adminToken, body: map[string]any{"action": "retry", "ids": []int64{first, other}}}).json(t, &out)
		if len(out.Results) != 2 || out.Results[0].Error == nil || !strings.Contains(*out.Results[0].Error, fmt.Sprintf("held by job %d", holder)) ||
			out.Results[1].State == nil || *out.Results[1].State != "available" {
			t.Fatalf("bulk retry: %+v", out.Results)
		}
		if j := e.job(first); j.State != "cancelled" {
			t.Errorf("job %d is %s after the refused retries, want cancelled", first, j.State)
		}
	})
}
