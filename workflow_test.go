package conveyor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type step struct {
	Name string `json:"name"`
	Fail bool   `json:"fail"`
}

func (step) Kind() string { return "step" }

// stepWorker runs a workflow step: its result is its name around the
// sorted results of its dependencies, read from its batch.
func stepWorker(c *conveyor.Client[any], ran chan<- string) conveyor.Worker[step] {
	return conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[step]) error {
		ran <- j.Args.Name
		if j.Args.Fail {
			return errors.New("step failed")
		}
		var deps []string
		if id, ok := conveyor.BatchOf(j.JobInfo); ok {
			b, err := c.Batch(ctx, id)
			if err != nil {
				return err
			}
			for _, d := range b.Jobs {
				if d.Result == nil { // a dependency that failed (RunDependents)
					continue
				}
				var s string
				if err := json.Unmarshal(d.Result, &s); err != nil {
					return fmt.Errorf("dependency %d (%s) result %q: %w", d.ID, d.State, d.Result, err)
				}
				deps = append(deps, s)
			}
		}
		slices.Sort(deps)
		r := j.Args.Name
		if len(deps) > 0 {
			r += "(" + strings.Join(deps, ",") + ")"
		}
		return conveyor.SetResult(ctx, r)
	})
}

// diamond is A -> B, C -> D.
func diamond(failA bool) []conveyor.WorkflowJob {
	one := &conveyor.EnqueueOpts{MaxAttempts: 1}
	return []conveyor.WorkflowJob{
		{Name: "D", Args: step{Name: "D"}, Opts: one, DependsOn: []string{"B", "C"}},
		{Name: "B", Args: step{Name: "B"}, Opts: one, DependsOn: []string{"A"}},
		{Name: "A", Args: step{Name: "A", Fail: failA}, Opts: one},
		{Name: "C", Args: step{Name: "C"}, Opts: one, DependsOn: []string{"A"}},
	}
}

// TestWorkflowDiamond: A -> B, C -> D on two clients. Each job runs once,
// only after its dependencies completed, and D reads B's and C's
// results. When A is discarded, B, C and D are cancelled without running
// under the default policy, and run under RunDependents.
func TestWorkflowDiamond(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		ran := make(chan string, 100)
		var cs []*conveyor.Client[any]
		for i := range 2 {
			var c *conveyor.Client[any]
			if i == 0 {
				c = openDropped(t, dsn, fast(prefix))
			} else {
				c = open(t, dsn, fast(prefix))
			}
			conveyor.AddWorker(c, stepWorker(c, ran))
			cs = append(cs, c)
		}
		c := cs[0]
		if _, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{
			{Name: "A", Args: step{}, DependsOn: []string{"B"}}, {Name: "B", Args: step{}, DependsOn: []string{"A"}},
		}, nil); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("a cycle: %v", err)
		}
		if _, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{{Name: "A", Args: step{}, DependsOn: []string{"Z"}}}, nil); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("an unknown dependency: %v", err)
		}
		// Named by its name, not by its place in dependency order (B is
		// second in the list, third in that order).
		if _, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{
			{Name: "C", Args: step{}, DependsOn: []string{"A"}}, {Name: "B", Args: step{}, Opts: &conveyor.EnqueueOpts{MaxAttempts: -1}, DependsOn: []string{"C"}}, {Name: "A", Args: step{}},
		}, nil); !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.HasPrefix(err.Error(), `workflow job "B": `) {
			t.Fatalf("an invalid job: %v", err)
		}
		ok, err := c.EnqueueWorkflow(ctx, diamond(false), nil)
		if err != nil || len(ok.JobIDs) != 1 || len(ok.BatchIDs) != 3 {
			t.Fatalf("enqueue: %+v %v", ok, err)
		}
		for _, c := range cs {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		callbackOf := func(name string, wf *conveyor.Workflow) *conveyor.JobInfo {
			t.Helper()
			b, err := c.Batch(ctx, wf.BatchIDs[name])
			if err != nil {
				t.Fatal(err)
			}
			if b.CallbackID == 0 {
				return nil
			}
			return jobState(t, c, b.CallbackID)
		}
		waitFor(t, "D completed", 30*time.Second, func() bool {
			d := callbackOf("D", ok)
			return d != nil && d.State == conveyor.JobStateCompleted
		})
		if got := string(callbackOf("D", ok).Result); got != `"D(B(A),C(A))"` {
			t.Fatalf("D's result %s, want \"D(B(A),C(A))\"", got)
		}
		var order []string
		for len(ran) > 0 {
			order = append(order, <-ran)
		}
		if len(order) != 4 || order[0] != "A" || order[3] != "D" {
			t.Fatalf("steps ran in the order %v, want A first, D last, each once", order)
		}

		for _, p := range []struct {
			opts *conveyor.WorkflowOpts
			want conveyor.JobState
			runs int
		}{{nil, conveyor.JobStateCancelled, 1}, {&conveyor.WorkflowOpts{OnDependencyFailure: conveyor.RunDependents}, conveyor.JobStateCompleted, 4}} {
			wf, err := c.EnqueueWorkflow(ctx, diamond(true), p.opts)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "D finished", 30*time.Second, func() bool {
				d := callbackOf("D", wf)
				return d != nil && (d.State == conveyor.JobStateCompleted || d.State == conveyor.JobStateCancelled || d.State == conveyor.JobStateDiscarded)
			})
			for _, name := range []string{"B", "C", "D"} {
				if j := callbackOf(name, wf); j.State != p.want {
					t.Fatalf("policy %+v: %s is %s, want %s", p.opts, name, j.State, p.want)
				}
			}
			if a := jobState(t, c, wf.JobIDs["A"]); a.State != conveyor.JobStateDiscarded {
				t.Fatalf("A is %s", a.State)
			}
			n := 0
			for len(ran) > 0 {
				<-ran
				n++
			}
			if n != p.runs {
				t.Fatalf("policy %+v: %d handlers ran, want %d", p.opts, n, p.runs)
			}
		}
	})
}

// TestWorkflowBatchWaiting: the batch of a workflow step whose
// dependencies are steps not enqueued yet is not finished, and names the
// batches it waits for; each dependency becomes one of its jobs once
// enqueued, and the batch is finished once they have all finished.
func TestWorkflowBatchWaiting(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		c := openDropped(t, dsn, cfg)
		wf, err := c.EnqueueWorkflow(ctx, diamond(false), nil)
		if err != nil {
			t.Fatal(err)
		}
		batch := func(name string) *conveyor.Batch {
			t.Helper()
			b, err := c.Batch(ctx, wf.BatchIDs[name])
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		waits := []int64{wf.BatchIDs["B"], wf.BatchIDs["C"]}
		slices.Sort(waits)
		if d := batch("D"); d.Finished() || len(d.Jobs) != 0 || !slices.Equal(d.WaitingFor, waits) {
			t.Fatalf("D's batch before B and C are enqueued: finished %v, %d jobs, waiting for %v; want not finished, waiting for %v", d.Finished(), len(d.Jobs), d.WaitingFor, waits)
		}
		if b := batch("B"); b.Finished() || len(b.Jobs) != 1 || len(b.WaitingFor) != 0 {
			t.Fatalf("B's batch: finished %v, %d jobs, waiting for %v", b.Finished(), len(b.Jobs), b.WaitingFor)
		}
		rw := c.RemoteWorkers()
		complete := func(n int) {
			t.Helper()
			got, err := rw.Claim(ctx, conveyor.RemoteClaim{Worker: "w", Lease: time.Minute, Limit: n})
			if err != nil || len(got) != n {
				t.Fatalf("claim %d: %d %v", n, len(got), err)
			}
			for _, j := range got {
				if err := rw.Complete(ctx, j.ID, j.Fence, []byte(`"r"`)); err != nil {
					t.Fatal(err)
				}
			}
		}
		complete(1) // A
		fire := func(want int) {
			t.Helper()
			fired, err := seam.DriverOf(c).FireBatches(ctx, 10, nil)
			if err != nil || len(fired) != want {
				t.Fatalf("fired %v, %v; want %d", fired, err, want)
			}
		}
		fire(2) // B and C
		// B's job, a job of D's batch, is read as its member, as A is of
		// B's batch.
		for _, m := range []struct {
			name          string
			id, batch, of int64
		}{{"A", wf.JobIDs["A"], min(wf.BatchIDs["B"], wf.BatchIDs["C"]), 0}, {"B", batch("B").CallbackID, wf.BatchIDs["D"], wf.BatchIDs["B"]}} {
			if j := jobState(t, c, m.id); j.BatchID != m.batch || j.CallbackOf != m.of {
				t.Errorf("job %s: batch %d, callback of %d; want %d, %d", m.name, j.BatchID, j.CallbackOf, m.batch, m.of)
			}
		}
		if d := batch("D"); d.Finished() || len(d.Jobs) != 2 || d.Counts[conveyor.JobStateAvailable] != 2 || len(d.WaitingFor) != 0 {
			t.Fatalf("D's batch once B and C are enqueued: finished %v, %d jobs %v, waiting for %v", d.Finished(), len(d.Jobs), d.Counts, d.WaitingFor)
		}
		complete(2) // B and C
		if d := batch("D"); !d.Finished() || len(d.Jobs) != 2 || d.Counts[conveyor.JobStateCompleted] != 2 {
			t.Fatalf("D's batch once B and C completed: finished %v, %d jobs %v", d.Finished(), len(d.Jobs), d.Counts)
		}
	})
}

// TestWorkflowUnknownPolicy: a failure policy that is neither
// CancelDependents nor RunDependents is refused with ErrInvalidOpts
// naming it, and nothing is enqueued; it used to be taken for
// RunDependents.
func TestWorkflowUnknownPolicy(t *testing.T) {
	ctx := context.Background()
	cfg := fast(testdb.Prefix())
	cfg.AllowUnregisteredKinds = true
	c := openDropped(t, filepath.Join(t.TempDir(), "c.db"), cfg)
	_, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{
		{Name: "A", Args: step{Name: "A"}}, {Name: "B", Args: step{Name: "B"}, DependsOn: []string{"A"}},
	}, &conveyor.WorkflowOpts{OnDependencyFailure: 7})
	if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), "7") {
		t.Fatalf("policy 7: %v, want ErrInvalidOpts naming it", err)
	}
	if js, err := c.Jobs(ctx, conveyor.JobFilter{}); err != nil || len(js) != 0 {
		t.Fatalf("jobs after a refused workflow: %d %v", len(js), err)
	}
	if st, err := c.Stats(ctx); err != nil || len(st.Queues) != 0 {
		t.Fatalf("queues after a refused workflow: %+v %v", st, err)
	}
}
