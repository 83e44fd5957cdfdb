package conveyor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type sum struct {
	A, B int
	Fail bool
}

func (sum) Kind() string { return "sum" }

// TestJobResults: a handler's result is stored with its completion and read
// back by Client.Job; a failed attempt's result is not stored; an invalid
// one is refused with ErrInvalidResult; an HTTP worker's completion
// carries one, and a stale worker's result is refused with its outcome.
func TestJobResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		setErrs := make(chan error, 10)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[sum]) error {
			// Refused: too large, and not JSON-encodable. Neither
			// replaces the result set below.
			setErrs <- conveyor.SetResult(ctx, strings.Repeat("x", conveyor.MaxResultBytes))
			setErrs <- conveyor.SetResult(ctx, func() {})
			if err := conveyor.SetResult(ctx, map[string]int{"sum": j.Args.A + j.Args.B}); err != nil {
				return err
			}
			if j.Args.Fail {
				return conveyor.JobCancel(errors.New("no"))
			}
			return nil
		}))
		if err := conveyor.SetResult(ctx, 1); !errors.Is(err, conveyor.ErrInvalidResult) {
			t.Fatalf("SetResult outside a handler: %v, want ErrInvalidResult", err)
		}
		ok, err := c.Enqueue(ctx, sum{A: 1, B: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		failed, err := c.Enqueue(ctx, sum{A: 3, B: 4, Fail: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "both jobs finished", 20*time.Second, func() bool {
			return jobState(t, c, ok).State == conveyor.JobStateCompleted && jobState(t, c, failed).State == conveyor.JobStateCancelled
		})
		for range 4 {
			if err := <-setErrs; !errors.Is(err, conveyor.ErrInvalidResult) {
				t.Fatalf("an invalid result: %v, want ErrInvalidResult", err)
			}
		}
		if got := string(jobState(t, c, ok).Result); got != `{"sum":3}` {
			t.Fatalf("completed job's result %q, want {\"sum\":3}", got)
		}
		if got := jobState(t, c, failed).Result; got != nil {
			t.Fatalf("cancelled job's result %q, want none", got)
		}

		// An HTTP worker's completion: the stale claim's result is
		// refused with its outcome; the owner's is stored.
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		id, err := c.Enqueue(ctx, sum{A: 5}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rw := c.RemoteWorkers()
		claim := func() int64 {
			t.Helper()
			got, err := rw.Claim(ctx, conveyor.RemoteClaim{Worker: "w", Lease: time.Minute})
			if err != nil || len(got) != 1 || got[0].ID != id {
				t.Fatalf("claim: %+v %v", got, err)
			}
			return got[0].Fence
		}
		stale := claim()
		if err := rw.Release(ctx, id, stale); err != nil {
			t.Fatal(err)
		}
		fresh := claim()
		if err := rw.Complete(ctx, id, fresh, json.RawMessage(`{"bad"`)); !errors.Is(err, conveyor.ErrInvalidResult) {
			t.Fatalf("invalid JSON result: %v, want ErrInvalidResult", err)
		}
		if err := rw.Complete(ctx, id, stale, json.RawMessage(`"stale"`)); !errors.Is(err, conveyor.ErrLeaseLost) {
			t.Fatalf("stale completion: %v, want ErrLeaseLost", err)
		}
		if j := jobState(t, c, id); j.State != conveyor.JobStateRunning || j.Result != nil {
			t.Fatalf("after the stale completion: %s with result %q, want running without one", j.State, j.Result)
		}
		if err := rw.Complete(ctx, id, fresh, json.RawMessage(`[1, "two"]`)); err != nil {
			t.Fatal(err)
		}
		j := jobState(t, c, id)
		var got []any
		if err := json.Unmarshal(j.Result, &got); err != nil || j.State != conveyor.JobStateCompleted || len(got) != 2 || got[1] != "two" {
			t.Fatalf("HTTP worker's result: %s %q (%v)", j.State, j.Result, err)
		}

		// Retried by hand and completed again without a result: the
		// earlier completion's result is not the job's any more.
		if _, err := c.Retry(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := rw.Complete(ctx, id, claim(), nil); err != nil {
			t.Fatal(err)
		}
		if j := jobState(t, c, id); j.State != conveyor.JobStateCompleted || j.Result != nil {
			t.Fatalf("completed again without a result: %s with %q, want none", j.State, j.Result)
		}
	})
}

// TestJobResultsFreeLimitSlots: completions that carry results free the
// concurrency slot of a limited queue, as other completions do: three
// jobs of a queue limited to one running job all complete, with their
// results. Rescue, which also frees the slots of attempts that ended
// without freeing theirs, does not run during the test.
func TestJobResultsFreeLimitSlots(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.RescueInterval = time.Hour
		c := openDropped(t, dsn, cfg)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[sum]) error {
			return conveyor.SetResult(ctx, j.Args.A+j.Args.B)
		}))
		if err := c.SetQueueLimits(ctx, "default", conveyor.QueueLimits{MaxRunning: 1}); err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for i := range 3 {
			id, err := c.Enqueue(ctx, sum{A: i, B: 10}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "three jobs completed through one slot", 30*time.Second, func() bool {
			for _, id := range ids {
				if jobState(t, c, id).State != conveyor.JobStateCompleted {
					return false
				}
			}
			return true
		})
		for i, id := range ids {
			if got, want := string(jobState(t, c, id).Result), fmt.Sprint(i+10); got != want {
				t.Fatalf("job %d's result %q, want %s", id, got, want)
			}
		}
	})
}

// TestJobResultNull: a result that is JSON null is no result, as the
// HTTP API's completion takes it: SetResult(ctx, nil) clears a result set
// before (the last call wins), and RemoteWorkers.Complete with null
// stores none. Both used to store the JSON null, read back as a result
// (JobInfo.Result "null", not nil) unlike the API's.
func TestJobResultNull(t *testing.T) {
	ctx := context.Background()
	cfg := fast(testdb.Prefix())
	cfg.AllowUnregisteredKinds = true
	c := openDropped(t, filepath.Join(t.TempDir(), "c.db"), cfg)
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[sum]) error {
		if err := conveyor.SetResult(ctx, "set first"); err != nil {
			return err
		}
		var none map[string]int
		return conveyor.SetResult(ctx, none)
	}))
	id, err := c.Enqueue(ctx, sum{A: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w, err := seam.WorkOne(ctx, c, id); err != nil || w.Err != nil || !w.Applied {
		t.Fatalf("work: %+v %v", w, err)
	}
	if j := jobState(t, c, id); j.State != conveyor.JobStateCompleted || j.Result != nil {
		t.Errorf("SetResult(nil) after a result: %s, result %q; want completed without one", j.State, j.Result)
	}
	remote, err := c.Enqueue(ctx, tagged{"r"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rw := c.RemoteWorkers()
	got, err := rw.Claim(ctx, conveyor.RemoteClaim{Worker: "w", Lease: time.Minute})
	if err != nil || len(got) != 1 || got[0].ID != remote {
		t.Fatalf("claim: %v %v", got, err)
	}
	if err := rw.Complete(ctx, remote, got[0].Fence, []byte(" null ")); err != nil {
		t.Fatal(err)
	}
	if j := jobState(t, c, remote); j.State != conveyor.JobStateCompleted || j.Result != nil {
		t.Errorf("Complete with null: %s, result %q; want completed without one", j.State, j.Result)
	}
}
