package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type tenantKey struct{}

// TestMiddleware: client and kind work middleware run in order around the
// handler and can pass it a context, replace its outcome or skip it;
// enqueue middleware can change the items, pass a context, and refuse.
func TestMiddleware(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var trail []string
	log := func(s string) {
		mu.Lock()
		trail = append(trail, s)
		mu.Unlock()
	}
	cfg := fast(testdb.Prefix())
	cfg.WorkMiddleware = []conveyor.WorkMiddleware{
		func(ctx context.Context, j *conveyor.JobInfo, next func(context.Context) error) error {
			log("client-in " + j.Kind)
			err := next(context.WithValue(ctx, tenantKey{}, "acme"))
			log(fmt.Sprintf("client-out %v", err))
			return err
		},
	}
	cfg.EnqueueMiddleware = []conveyor.EnqueueMiddleware{
		func(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
			for i := range items {
				if a, ok := items[i].Args.(tagged); ok && a.Tag == "refuse" {
					return errors.New("refused by the enqueue middleware")
				}
				if items[i].Opts == nil {
					items[i].Opts = &conveyor.EnqueueOpts{}
				}
				o := *items[i].Opts
				o.Priority = 3 // stamped on every job
				items[i].Opts = &o
			}
			return next(ctx, items)
		},
	}
	c := openDropped(t, backends[0].dsn(t), cfg)
	done := make(chan string, 3)
	err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
		log("handler " + j.Args.Tag + " " + fmt.Sprint(ctx.Value(tenantKey{})))
		done <- j.Args.Tag
		if j.Args.Tag == "fail" {
			return errors.New("handler failed")
		}
		return nil
	}), conveyor.WorkerOpts{Middleware: []conveyor.WorkMiddleware{
		func(ctx context.Context, j *conveyor.JobInfo, next func(context.Context) error) error {
			log("kind-in")
			err := next(ctx)
			if err != nil && strings.Contains(err.Error(), "handler failed") {
				return conveyor.JobCancel(err) // the middleware turns a failure into a cancel
			}
			return err
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, tagged{"refuse"}, nil); err == nil || !strings.Contains(err.Error(), "refused by the enqueue middleware") {
		t.Fatalf("refused enqueue: %v", err)
	}
	ok, err := c.Enqueue(ctx, tagged{"ok"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, ok, conveyor.JobStateCompleted)
	if j := jobState(t, c, ok); j.Priority != 3 {
		t.Errorf("priority %d, want 3 (stamped by the enqueue middleware)", j.Priority)
	}
	fail, err := c.Enqueue(ctx, tagged{"fail"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, fail, conveyor.JobStateCancelled)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	okTrail := []string{"client-in tagged", "kind-in", "handler ok acme", "client-out <nil>"}
	if !slices.Equal(trail[:4], okTrail) {
		t.Fatalf("trail %q, want it to start %q", trail, okTrail)
	}
	if len(trail) != 8 || trail[6] != "handler fail acme" || !strings.Contains(trail[7], "client-out") || !strings.Contains(trail[7], "cancelled") {
		t.Fatalf("trail %q", trail)
	}
}

// TestOutcomeState: the states middleware is told match the engine's
// (internal/engine's outcome).
func TestOutcomeState(t *testing.T) {
	j := &conveyor.JobInfo{Attempt: 1, MaxAttempts: 2}
	last := &conveyor.JobInfo{Attempt: 2, MaxAttempts: 2}
	for _, c := range []struct {
		job  *conveyor.JobInfo
		err  error
		want conveyor.JobState
	}{
		{j, nil, conveyor.JobStateCompleted},
		{j, errors.New("boom"), conveyor.JobStateRetryable},
		{last, errors.New("boom"), conveyor.JobStateDiscarded},
		{last, conveyor.JobCancel(errors.New("no")), conveyor.JobStateCancelled},
		{j, fmt.Errorf("wrapped: %w", conveyor.JobCancel(nil)), conveyor.JobStateCancelled},
		{last, conveyor.JobSnooze(time.Second), conveyor.JobStateScheduled},
	} {
		if got := conveyor.OutcomeState(c.job, c.err); got != c.want {
			t.Errorf("OutcomeState(attempt %d/%d, %v) = %s, want %s", c.job.Attempt, c.job.MaxAttempts, c.err, got, c.want)
		}
	}
}

// TestEnqueueMiddlewareChangingTheCount: an enqueue middleware that
// passes on more or fewer jobs than Enqueue or EnqueueMany(Tx) was given,
// which return one result per job given, is refused before anything is
// written; it used to be written and then either reported as a failure
// (Enqueue) or answered with results that no longer match the jobs given
// (EnqueueMany).
func TestEnqueueMiddlewareChangingTheCount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.EnqueueMiddleware = []conveyor.EnqueueMiddleware{func(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
			if len(items) == 1 {
				items = append(items, conveyor.EnqueueItem{Args: tagged{"audit"}}) // one more
			} else {
				items = items[:1] // one less
			}
			return next(ctx, items)
		}}
		c := openDropped(t, dsn, cfg)
		if id, err := c.Enqueue(ctx, tagged{"a"}, nil); err == nil || !strings.Contains(err.Error(), "middleware") {
			t.Errorf("Enqueue: %d, %v; want an error naming the middleware", id, err)
		}
		if rs, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: tagged{"b"}}, {Args: tagged{"c"}}}); err == nil || !strings.Contains(err.Error(), "middleware") {
			t.Errorf("EnqueueMany of 2 jobs: %v, %v; want an error naming the middleware", rs, err)
		}
		tx, commit, rollback := beginTx(t, dsn)
		t.Cleanup(func() { _ = rollback() })
		if rs, err := c.EnqueueManyTx(ctx, tx, []conveyor.EnqueueItem{{Args: tagged{"d"}}, {Args: tagged{"e"}}}); err == nil || !strings.Contains(err.Error(), "middleware") {
			t.Errorf("EnqueueManyTx of 2 jobs: %v, %v; want an error naming the middleware", rs, err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if got := tagsOf(t, c); len(got) != 0 {
			t.Fatalf("jobs %v written by refused enqueues", got)
		}
	})
}

// TestEnqueueMiddlewareDroppingEveryJob: an enqueue middleware that passes
// on no jobs at all is refused, as one that passes on fewer, by the calls
// that return one result per job given and by batches and workflows; it
// used to be taken for an enqueue of nothing, answered with no error: a
// batch id of 0, a workflow without jobs, no results.
func TestEnqueueMiddlewareDroppingEveryJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		cfg.EnqueueMiddleware = []conveyor.EnqueueMiddleware{func(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
			return next(ctx, nil)
		}}
		c := openDropped(t, dsn, cfg)
		refused := func(what string, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), "middleware passed on 0 jobs") {
				t.Errorf("%s: %v; want an error naming the middleware", what, err)
			}
		}
		_, err := c.Enqueue(ctx, tagged{"a"}, nil)
		refused("Enqueue", err)
		_, err = c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: tagged{"b"}}})
		refused("EnqueueMany", err)
		tx, commit, rollback := beginTx(t, dsn)
		t.Cleanup(func() { _ = rollback() })
		_, err = c.EnqueueManyTx(ctx, tx, []conveyor.EnqueueItem{{Args: tagged{"c"}}})
		refused("EnqueueManyTx", err)
		_, _, err = c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: tagged{"d"}}}, conveyor.EnqueueItem{Args: tagged{"e"}})
		refused("EnqueueBatch", err)
		_, _, err = c.EnqueueBatchTx(ctx, tx, []conveyor.EnqueueItem{{Args: tagged{"f"}}}, conveyor.EnqueueItem{Args: tagged{"g"}})
		refused("EnqueueBatchTx", err)
		_, err = c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{{Name: "h", Args: tagged{"h"}}, {Name: "i", Args: tagged{"i"}, DependsOn: []string{"h"}}}, nil)
		refused("EnqueueWorkflow", err)
		_, err = c.EnqueueWorkflowTx(ctx, tx, []conveyor.WorkflowJob{{Name: "j", Args: tagged{"j"}}}, nil)
		refused("EnqueueWorkflowTx", err)
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		// EnqueueBulk takes what the middleware passes on: nothing.
		if n, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: tagged{"k"}}}); n != 0 || err != nil {
			t.Errorf("EnqueueBulk: %d, %v; want 0 jobs inserted", n, err)
		}
		if got := tagsOf(t, c); len(got) != 0 {
			t.Fatalf("jobs %v written by refused enqueues", got)
		}
	})
}
