package conveyor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	bigmath "math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// FuzzEnqueue feeds arbitrary arguments, queue names, kinds, priorities
// and delays to Enqueue on a SQLite database. Each call either fails with
// an error wrapping ErrInvalidArgs, ErrInvalidOpts or ErrUnknownKind and
// inserts nothing, or succeeds and stores arguments that mean the same
// JSON as the ones given, with the queue and priority given.
//
//	go test -run '^$' -fuzz FuzzEnqueue -fuzztime 1m .
func FuzzEnqueue(f *testing.F) {
	f.Add([]byte(`{"n":1}`), "default", "noop", 0, int64(0))
	f.Add([]byte(`{"s":"h\u00e9llo","a":[1,2.5e3,true,null,{"x":{}}]}`), "q.1:a-b_c", "kind/sub", -1000, int64(time.Second))
	f.Add([]byte(`{"n":`), "default", "noop", 0, int64(0))
	f.Add([]byte(`{"s":"a\u0000b"}`), "default", "noop", 0, int64(0))
	f.Add([]byte("{\"s\":\"\xff\"}"), "default", "noop", 0, int64(0))
	f.Add([]byte(`{"big":123456789012345678901234567890,"f":1e-400,"e":1E+2}`), "default", "noop", 0, int64(0))
	f.Add([]byte(`"just a string"`), "default", "noop", 0, int64(0))
	f.Add([]byte(`[1, 2 ,3]`), "default", "noop", 0, int64(0))
	f.Add([]byte(`null`), "default", "noop", 0, int64(0))
	f.Add([]byte(`{"a":1,"a":2}`), "default", "noop", 0, int64(0))
	f.Add([]byte(`{"s":"\ud800"}`), "default", "noop", 0, int64(0))
	f.Add([]byte(`{}`), "", "noop", 0, int64(0))
	f.Add([]byte(`{}`), "no spaces", "noop", 0, int64(0))
	f.Add([]byte(`{}`), strings.Repeat("q", 129), "noop", 0, int64(0))
	f.Add([]byte(`{}`), "default", "", 0, int64(0))
	f.Add([]byte(`{}`), "default", "bad kind", 0, int64(0))
	f.Add([]byte(`{}`), "default", "noop", 1001, int64(0))
	f.Add([]byte(`{}`), "default", "noop", 0, int64(-1))
	f.Add([]byte(`{}`), "default", "noop", 0, int64(1)<<62)
	f.Add([]byte(`{"pad":"`+strings.Repeat("x", 5000)+`"}`), "default", "noop", 0, int64(0))
	f.Add([]byte(strings.Repeat("[", 10000)+strings.Repeat("]", 10000)), "default", "noop", 0, int64(0))

	ctx := context.Background()
	c, err := connect.Open(ctx, filepath.Join(f.TempDir(), "fuzz.db"), &conveyor.Config{MaxArgsBytes: 4096})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	if _, err := c.Migrate(ctx); err != nil {
		f.Fatal(err)
	}
	var last int64 // the highest job id so far

	f.Fuzz(func(t *testing.T, args []byte, queue, kind string, priority int, delay int64) {
		opts := &conveyor.EnqueueOpts{Queue: queue, Priority: priority, Delay: time.Duration(delay), MaxAttempts: 1}
		id, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: kind, JSON: args}, opts)
		newer, lerr := c.Jobs(ctx, conveyor.JobFilter{AfterID: last, Limit: 10})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if err != nil {
			if !errors.Is(err, conveyor.ErrInvalidArgs) && !errors.Is(err, conveyor.ErrInvalidOpts) && !errors.Is(err, conveyor.ErrUnknownKind) {
				t.Fatalf("Enqueue(%q, queue %q, kind %q, priority %d, delay %d): error wraps no sentinel: %v", args, queue, kind, priority, delay, err)
			}
			if len(newer) != 0 {
				t.Fatalf("Enqueue failed (%v) but inserted job %d", err, newer[0].ID)
			}
			return
		}
		if len(newer) != 1 || newer[0].ID != id {
			t.Fatalf("Enqueue returned id %d; new rows: %d", id, len(newer))
		}
		last = id
		j := newer[0]
		wantQueue := queue
		if wantQueue == "" {
			wantQueue = conveyor.DefaultQueue
		}
		if j.Queue != wantQueue || j.Kind != kind || j.Priority != priority {
			t.Fatalf("stored queue %q kind %q priority %d, want %q %q %d", j.Queue, j.Kind, j.Priority, wantQueue, kind, priority)
		}
		given := args
		if len(given) == 0 {
			given = []byte("{}") // RawArgs with no JSON means {}
		}
		if !sameJSON(t, given, j.EncodedArgs) {
			t.Fatalf("stored args %s, given %s", j.EncodedArgs, given)
		}
		// A delay of a second or more is visible in the state (shorter
		// ones are below some backends' clock resolution).
		if delay >= int64(time.Second) && j.State != conveyor.JobStateScheduled {
			t.Fatalf("delay %v: state %s", time.Duration(delay), j.State)
		}
	})
}

// sameJSON reports whether a and b are the same JSON value: same
// structure and strings, numbers equal as numbers.
func sameJSON(t *testing.T, a, b []byte) bool {
	va, err := decodeJSON(a)
	if err != nil {
		t.Fatalf("given args accepted but not decodable: %v", err)
	}
	vb, err := decodeJSON(b)
	if err != nil {
		t.Fatalf("stored args not decodable: %v (%s)", err, b)
	}
	return equalJSON(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func equalJSON(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		fx, _, ex := bigmath.ParseFloat(string(x), 10, 2000, bigmath.ToNearestEven)
		fy, _, ey := bigmath.ParseFloat(string(y), 10, 2000, bigmath.ToNearestEven)
		if ex != nil || ey != nil {
			return x == y
		}
		return fx.Cmp(fy) == 0
	default:
		return a == b
	}
}
