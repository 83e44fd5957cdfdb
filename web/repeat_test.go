package web

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/seam"
)

// outcomeJSON is the answer of complete, fail and snooze.
type outcomeJSON struct {
	ID              int64  `json:"id"`
	State           string `json:"state"`
	AlreadyRecorded bool   `json:"already_recorded"`
}

// ack sends an outcome (complete, fail or snooze) of job id and checks
// the status; on 200 it returns the answer.
func (e *env) ack(status int, id int64, action string, body map[string]any) outcomeJSON {
	e.t.Helper()
	var out outcomeJSON
	res := e.must(status, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/%s", id, action), auth: adminToken, body: body})
	if status == 200 {
		res.json(e.t, &out)
	}
	return out
}

// TestRepeatedOutcome: an outcome sent again under the same fence (its
// first answer lost on the way back) is answered 200 with
// already_recorded when that very outcome was written, and the job is
// left as the first one left it; an outcome of another kind, or of an
// attempt whose job was claimed again since, still gets 409.
func TestRepeatedOutcome(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		job := func(queue string, maxAttempts int) (int64, int64) {
			t.Helper()
			id := e.enqueue(map[string]any{"kind": "k", "queue": queue, "max_attempts": maxAttempts})
			c := e.claim(map[string]any{"queue": queue})
			if len(c) != 1 || c[0].ID != id {
				t.Fatalf("claimed %+v, want job %d", c, id)
			}
			return id, *c[0].Fence
		}
		checkRepeat := func(what string, first, again outcomeJSON, state string) {
			t.Helper()
			if first.AlreadyRecorded || first.State != state {
				t.Errorf("%s: first answer %+v, want state %s and not already recorded", what, first, state)
			}
			if !again.AlreadyRecorded || again.State != state || again.ID != first.ID {
				t.Errorf("%s: repeated answer %+v, want state %s, already recorded", what, again, state)
			}
		}

		// complete, then the same complete again: success, marked.
		id, fence := job("q-complete", 3)
		body := map[string]any{"fence": fence, "result": map[string]any{"n": 1}}
		first := e.ack(200, id, "complete", body)
		checkRepeat("complete", first, e.ack(200, id, "complete", body), "completed")
		if j := e.job(id); j.State != "completed" || string(j.Result) != `{"n":1}` {
			t.Errorf("after the repeated complete: %+v", j)
		}
		// A fail under that fence is another outcome than the one written.
		e.ack(409, id, "fail", map[string]any{"fence": fence, "error": "late"})
		e.ack(409, id, "snooze", map[string]any{"fence": fence, "delay_ms": 1000})

		// fail (retryable), repeated: success with the same state; a
		// complete (or a fail with another error) under that fence: 409.
		id, fence = job("q-fail", 3)
		body = map[string]any{"fence": fence, "error": "smtp: timeout", "trace": "at send", "retry_in_ms": 3600000}
		first = e.ack(200, id, "fail", body)
		checkRepeat("fail", first, e.ack(200, id, "fail", body), "retryable")
		e.ack(409, id, "complete", map[string]any{"fence": fence})
		e.ack(409, id, "fail", map[string]any{"fence": fence, "error": "another error", "retry_in_ms": 3600000})
		if j := e.job(id); j.State != "retryable" || len(j.Errors) != 1 || j.Errors[0].Error != "smtp: timeout" {
			t.Errorf("after the repeated fail: %+v", j)
		}
		// Once retried (available again) the failure is still its own.
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/retry", id), auth: adminToken})
		checkRepeat("fail after retry", first, e.ack(200, id, "fail", body), "retryable")

		// The last attempt's fail (discarded) and a cancelling fail,
		// repeated.
		id, fence = job("q-discard", 1)
		body = map[string]any{"fence": fence, "error": "x"}
		checkRepeat("discarding fail", e.ack(200, id, "fail", body), e.ack(200, id, "fail", body), "discarded")
		e.ack(409, id, "complete", map[string]any{"fence": fence})
		id, fence = job("q-cancel", 3)
		body = map[string]any{"fence": fence, "error": "bad input", "cancel": true}
		checkRepeat("cancelling fail", e.ack(200, id, "fail", body), e.ack(200, id, "fail", body), "cancelled")
		// Without cancel it is another failure than the one written.
		e.ack(409, id, "fail", map[string]any{"fence": fence, "error": "bad input"})

		// snooze, repeated; a complete under that fence: 409.
		id, fence = job("q-snooze", 3)
		body = map[string]any{"fence": fence, "delay_ms": 3600000}
		checkRepeat("snooze", e.ack(200, id, "snooze", body), e.ack(200, id, "snooze", body), "scheduled")
		e.ack(409, id, "complete", map[string]any{"fence": fence})

		// A cancel by hand while running is not the worker's failure.
		id, fence = job("q-hand", 3)
		e.must(200, req{method: "POST", path: fmt.Sprintf("/api/v1/jobs/%d/cancel", id), auth: adminToken})
		e.ack(409, id, "fail", map[string]any{"fence": fence, "error": "x", "cancel": true})
		e.ack(409, id, "complete", map[string]any{"fence": fence})

		// Leases that expire: one job rescued and claimed again (and
		// completed by its new claim), one rescued on its last attempt
		// (discarded, under the same fence, by the rescue).
		lost := e.enqueue(map[string]any{"kind": "k", "queue": "q-lost", "max_attempts": 3})
		last := e.enqueue(map[string]any{"kind": "k", "queue": "q-last", "max_attempts": 1})
		old := e.claim(map[string]any{"queue": "q-lost", "lease_ms": 1000})[0]
		oldLast := e.claim(map[string]any{"queue": "q-last", "lease_ms": 1000})[0]
		time.Sleep(1200 * time.Millisecond) // past both leases
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if n, err := seam.DriverOf(e.client).Rescue(ctx, 100); err != nil || n["q-lost"] != 1 || n["q-last"] != 1 {
			t.Fatalf("rescue: %v %v", n, err)
		}
		cur := e.claim(map[string]any{"queue": "q-lost"})[0]
		if cur.ID != lost || *cur.Fence == *old.Fence {
			t.Fatalf("claimed again %+v after %+v", cur, old)
		}
		e.ack(409, lost, "complete", map[string]any{"fence": *old.Fence})
		e.ack(200, lost, "complete", map[string]any{"fence": *cur.Fence})
		// The job is completed now, but not under the old fence.
		e.ack(409, lost, "complete", map[string]any{"fence": *old.Fence})
		if j := e.job(last); j.State != "discarded" {
			t.Fatalf("after the rescue of the last attempt: %+v", j)
		}
		e.ack(409, last, "fail", map[string]any{"fence": *oldLast.Fence, "error": "x"})
		e.ack(409, last, "complete", map[string]any{"fence": *oldLast.Fence})
	})
}
