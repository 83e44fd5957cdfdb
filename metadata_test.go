package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// traced declares metadata of its own, which the call's merges into.
type traced struct {
	N int `json:"n"`
}

func (traced) Kind() string { return "traced" }

func (traced) EnqueueOpts() conveyor.EnqueueOpts {
	return conveyor.EnqueueOpts{Metadata: map[string]string{"tenant": "declared", "source": "declared"}}
}

// TestMetadata: EnqueueOpts.Metadata reaches the worker, the work
// middleware and Job through every enqueue call, merged over the kind's
// declared metadata and set by enqueue middleware; a job without any has
// none; oversized metadata is refused with nothing written.
func TestMetadata(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		cfg.EnqueueMiddleware = []conveyor.EnqueueMiddleware{
			func(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
				for i := range items {
					var o conveyor.EnqueueOpts
					if items[i].Opts != nil {
						o = *items[i].Opts
					}
					m := maps.Clone(o.Metadata)
					if m == nil {
						m = map[string]string{}
					}
					if _, ok := items[i].Args.(traced); ok {
						m["mw"] = "stamped"
					}
					o.Metadata = m
					items[i].Opts = &o
				}
				return next(ctx, items)
			},
		}
		var mu sync.Mutex
		seen := map[int]map[string]string{}   // by args.N: what the handler saw
		seenMW := map[int]map[string]string{} // what the work middleware saw
		cfg.WorkMiddleware = []conveyor.WorkMiddleware{
			func(ctx context.Context, j *conveyor.JobInfo, next func(context.Context) error) error {
				var a traced
				fmt.Sscanf(strings.TrimPrefix(string(j.EncodedArgs), `{"n":`), "%d", &a.N)
				mu.Lock()
				seenMW[a.N] = j.Metadata
				mu.Unlock()
				return next(ctx)
			},
		}
		c := openDropped(t, dsn, cfg)
		done := make(chan int, 16)
		err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[traced]) error {
			mu.Lock()
			seen[j.Args.N] = j.Metadata
			mu.Unlock()
			done <- j.Args.N
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}

		// Oversized metadata is refused before anything is written.
		big := map[string]string{"k": strings.Repeat("x", conveyor.MaxMetadataBytes)}
		_, err = c.Enqueue(ctx, traced{N: 99}, &conveyor.EnqueueOpts{Metadata: big})
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), "bytes encoded, over the 65536-byte limit") {
			t.Fatalf("oversized metadata: %v, want ErrInvalidOpts naming the size", err)
		}
		if _, err := c.Enqueue(ctx, traced{N: 98}, &conveyor.EnqueueOpts{Metadata: map[string]string{"k": "a\x00b"}}); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("NUL in metadata: %v, want ErrInvalidOpts", err)
		}
		if n := totalJobs(t, c); n != 0 {
			t.Fatalf("%d jobs written by refused enqueues", n)
		}

		call := map[string]string{"source": "call", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		want := map[string]string{"tenant": "declared", "source": "call", "mw": "stamped", "traceparent": call["traceparent"]}
		var ids []int64
		id, err := c.Enqueue(ctx, traced{N: 1}, &conveyor.EnqueueOpts{Metadata: call})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		rs, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{
			{Args: traced{N: 2}, Opts: &conveyor.EnqueueOpts{Metadata: call}},
			{Args: traced{N: 3}, Opts: &conveyor.EnqueueOpts{Metadata: call, Unique: &conveyor.UniqueOpts{ByArgs: true}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rs[0].ID, rs[1].ID)
		if n, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: traced{N: 4}, Opts: &conveyor.EnqueueOpts{Metadata: call}}}); err != nil || n != 1 {
			t.Fatalf("bulk: %d %v", n, err)
		}
		tx, commit, _ := beginTx(t, dsn)
		id, err = c.EnqueueTx(ctx, tx, traced{N: 5}, &conveyor.EnqueueOpts{Metadata: call})
		if err != nil {
			t.Fatal(err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		// Without metadata anywhere: none stored (noop declares none and
		// the middleware stamps only traced).
		plain, err := c.Enqueue(ctx, noop{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			j, err := c.Job(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(j.Metadata, want) {
				t.Fatalf("job %d: metadata %v, want %v", id, j.Metadata, want)
			}
		}
		if j, err := c.Job(ctx, plain); err != nil || j.Metadata != nil {
			t.Fatalf("job without metadata: %v %v", j.Metadata, err)
		}
		if _, err := c.Cancel(ctx, plain); err != nil {
			t.Fatal(err)
		}

		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("jobs did not run")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for n := 1; n <= 5; n++ {
			if !maps.Equal(seen[n], want) || !maps.Equal(seenMW[n], want) {
				t.Fatalf("job %d: handler saw %v, middleware %v; want %v", n, seen[n], seenMW[n], want)
			}
		}
		// The declared map was not changed by the merge.
		if d := (traced{}).EnqueueOpts().Metadata; len(d) != 2 {
			t.Fatalf("declared metadata changed: %v", d)
		}
	})
}

// Keys under ReservedMetadataPrefix are conveyor's own: an enqueue that
// sets one is refused, naming the key, and stores nothing, whether the
// call or the arguments' declared options set it; a workflow still
// marks its dependents with its own.
func TestMetadataReservedPrefix(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	for _, key := range []string{"conveyor.batch_id", "conveyor.anything"} {
		_, err := c.Enqueue(ctx, traced{N: 1}, &conveyor.EnqueueOpts{Metadata: map[string]string{key: "7"}})
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), key) {
			t.Fatalf("metadata key %q: %v, want ErrInvalidOpts naming it", key, err)
		}
	}
	if n := totalJobs(t, c); n != 0 {
		t.Fatalf("%d jobs stored after refused enqueues", n)
	}
	if _, err := c.Enqueue(ctx, traced{N: 2}, &conveyor.EnqueueOpts{Metadata: map[string]string{"conveyorx": "ok", "tenant": "conveyor.x"}}); err != nil {
		t.Fatalf("keys outside the prefix: %v", err)
	}
}
