package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type part struct {
	N    int    `json:"n"`
	Mode string `json:"mode"`
}

func (part) Kind() string { return "part" }

type partsDone struct {
	Tag string `json:"tag"`
}

func (partsDone) Kind() string { return "parts_done" }

// TestBatchCallbackExactlyOnce: three clients on one database work a
// batch's jobs (completed with results, cancelled, discarded) while eight
// goroutines of theirs race to fire finished batches, besides each
// client's maintenance loop. While one job is held running, no callback
// exists; once it finishes, the callback is enqueued exactly once, runs
// once, and reads every job's final state and result.
func TestBatchCallbackExactlyOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		gate, held := make(chan struct{}), make(chan struct{}, 1)
		type ran struct {
			job   *conveyor.JobInfo
			batch *conveyor.Batch
		}
		callbacks := make(chan ran, 10)
		var clients []*conveyor.Client[any]
		for i := range 3 {
			var c *conveyor.Client[any]
			if i == 0 {
				c = openDropped(t, dsn, fast(prefix))
			} else {
				c = open(t, dsn, fast(prefix))
			}
			conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[part]) error {
				switch j.Args.Mode {
				case "gate":
					select { // once is enough (an attempt cut off runs again)
					case held <- struct{}{}:
					default:
					}
					<-gate
				case "cancel":
					return conveyor.JobCancel(errors.New("cancelled"))
				case "fail":
					return errors.New("failed")
				}
				return conveyor.SetResult(ctx, j.Args.N*2)
			}))
			conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[partsDone]) error {
				id, ok := conveyor.BatchOf(j.JobInfo)
				if !ok {
					return conveyor.JobCancel(fmt.Errorf("callback %d has no batch", j.ID))
				}
				b, err := c.Batch(ctx, id)
				if err != nil {
					return err
				}
				callbacks <- ran{j.JobInfo, b}
				return nil
			}))
			clients = append(clients, c)
		}
		const n = 30
		var items []conveyor.EnqueueItem
		for i := range n {
			p := part{N: i, Mode: "ok"}
			// Only the failing jobs have one attempt (discarded at
			// once); the others have the default, so that an attempt
			// cut off on a loaded machine (a lease renewal too slow)
			// runs again instead of discarding a job meant to finish
			// otherwise.
			var opts *conveyor.EnqueueOpts
			switch {
			case i == 0:
				p.Mode = "gate"
			case i%10 == 1:
				p.Mode = "cancel"
			case i%10 == 2:
				p.Mode = "fail"
				opts = &conveyor.EnqueueOpts{MaxAttempts: 1}
			}
			items = append(items, conveyor.EnqueueItem{Args: p, Opts: opts})
		}
		batchID, ids, err := clients[0].EnqueueBatch(ctx, items, conveyor.EnqueueItem{Args: partsDone{Tag: "t"}})
		if err != nil || len(ids) != n {
			t.Fatalf("enqueue batch: %d ids, %v", len(ids), err)
		}
		var stop atomic.Bool
		var fired atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					m, err := conveyor.FireBatchesForTest(clients[g%3], 100)
					if err != nil {
						t.Errorf("fire batches: %v", err)
						return
					}
					fired.Add(int64(len(m)))
					time.Sleep(time.Millisecond)
				}
			}()
		}
		for _, c := range clients {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		<-held
		waitFor(t, "every job but the held one finished", 30*time.Second, func() bool {
			b, err := clients[1].Batch(ctx, batchID)
			if err != nil {
				t.Fatal(err)
			}
			return b.Counts[conveyor.JobStateRunning] == 1 && len(b.Jobs) == n &&
				b.Counts[conveyor.JobStateCompleted]+b.Counts[conveyor.JobStateCancelled]+b.Counts[conveyor.JobStateDiscarded] == n-1
		})
		// The firers keep going while the job is held: no callback.
		for range 20 {
			b, err := clients[2].Batch(ctx, batchID)
			if err != nil {
				t.Fatal(err)
			}
			if b.CallbackID != 0 || b.Finished() {
				t.Fatalf("batch with a running job: callback %d, finished %v", b.CallbackID, b.Finished())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if js, err := clients[0].Jobs(ctx, conveyor.JobFilter{Kind: "parts_done"}); err != nil || len(js) != 0 {
			t.Fatalf("callbacks before the batch finished: %d (%v)", len(js), err)
		}
		close(gate)
		var got ran
		select {
		case got = <-callbacks:
		case <-time.After(30 * time.Second):
			t.Fatal("the callback never ran")
		}
		// Let the firers and the maintenance loops have more rounds.
		time.Sleep(300 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		select {
		case again := <-callbacks:
			t.Fatalf("the callback ran twice: jobs %d and %d", got.job.ID, again.job.ID)
		default:
		}
		if js, err := clients[0].Jobs(ctx, conveyor.JobFilter{Kind: "parts_done"}); err != nil || len(js) != 1 || js[0].ID != got.job.ID {
			t.Fatalf("callback jobs: %d (%v), want exactly the one that ran", len(js), err)
		}
		if fired.Load() > 1 {
			t.Fatalf("the firers report %d callbacks enqueued, want at most 1", fired.Load())
		}
		b := got.batch
		if !b.Finished() || b.CallbackID != got.job.ID || b.CallbackKind != "parts_done" || len(b.Jobs) != n {
			t.Fatalf("batch read by its callback: %+v", b)
		}
		if b.Counts[conveyor.JobStateCancelled] != 3 || b.Counts[conveyor.JobStateDiscarded] != 3 || b.Counts[conveyor.JobStateCompleted] != n-6 {
			t.Fatalf("counts %v", b.Counts)
		}
		for i, j := range b.Jobs {
			if j.ID != ids[i] {
				t.Fatalf("job %d of the batch is %d, want %d", i, j.ID, ids[i])
			}
			if want := fmt.Sprint(i * 2); j.State == conveyor.JobStateCompleted && string(j.Result) != want {
				t.Fatalf("job %d's result %q, want %s", j.ID, j.Result, want)
			}
			if j.State != conveyor.JobStateCompleted && j.Result != nil {
				t.Fatalf("job %d (%s) has a result %q", j.ID, j.State, j.Result)
			}
		}
		if _, err := clients[0].Batch(ctx, batchID+1000); !errors.Is(err, conveyor.ErrBatchNotFound) {
			t.Fatalf("a batch that does not exist: %v", err)
		}
	})
}

// TestBatchInTransaction: a batch enqueued in the caller's transaction
// does not exist until it commits, nor after a rollback; a unique job or
// an empty batch is refused.
func TestBatchInTransaction(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		c := openDropped(t, dsn, cfg)
		cb := conveyor.EnqueueItem{Args: partsDone{}}
		if _, _, err := c.EnqueueBatch(ctx, nil, cb); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("empty batch: %v", err)
		}
		uniq := []conveyor.EnqueueItem{{Args: part{}, Opts: &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{}}}}
		if _, _, err := c.EnqueueBatch(ctx, uniq, cb); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("unique job in a batch: %v", err)
		}
		// A refused job or callback is named as the caller named it.
		bad := &conveyor.EnqueueOpts{MaxAttempts: -1}
		if _, _, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: part{}}, {Args: part{}, Opts: bad}}, cb); !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.HasPrefix(err.Error(), "batch job 1 of 2: ") {
			t.Fatalf("invalid batch job: %v", err)
		}
		if _, _, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: part{}}}, conveyor.EnqueueItem{Args: partsDone{}, Opts: bad}); !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.HasPrefix(err.Error(), "batch callback: ") {
			t.Fatalf("invalid callback: %v", err)
		}
		for _, commit := range []bool{false, true} {
			tx, doCommit, rollback := beginTx(t, appDSN(dsn))
			id, ids, err := c.EnqueueBatchTx(ctx, tx, []conveyor.EnqueueItem{{Args: part{N: 1}}, {Args: part{N: 2}}}, cb)
			if err != nil || len(ids) != 2 {
				t.Fatalf("enqueue batch in tx: %v", err)
			}
			if commit {
				if err := doCommit(); err != nil {
					t.Fatal(err)
				}
				b, err := c.Batch(ctx, id)
				if err != nil || len(b.Jobs) != 2 || b.Counts[conveyor.JobStateAvailable] != 2 || b.CallbackID != 0 {
					t.Fatalf("committed batch: %+v %v", b, err)
				}
			} else {
				if err := rollback(); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Batch(ctx, id); !errors.Is(err, conveyor.ErrBatchNotFound) {
					t.Fatalf("rolled back batch: %v", err)
				}
			}
		}
	})
}

// TestBatchPruned: once a batch's callback was enqueued longer ago than
// the completed jobs' retention and has finished, Prune deletes the batch
// with its jobs and their results; the callback, still a job, then names
// no batch.
func TestBatchPruned(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.AllowUnregisteredKinds = true
		c := openDropped(t, dsn, cfg)
		bid, ids, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: part{N: 1}}}, conveyor.EnqueueItem{Args: partsDone{}})
		if err != nil {
			t.Fatal(err)
		}
		batchOf := func(id, member, callbackOf int64) {
			t.Helper()
			j, err := c.Job(ctx, id)
			if err != nil || j.BatchID != member || j.CallbackOf != callbackOf {
				t.Fatalf("job %d: %+v %v; want batch %d, callback of %d", id, j, err, member, callbackOf)
			}
		}
		batchOf(ids[0], bid, 0)
		rw := c.RemoteWorkers()
		got, err := rw.Claim(ctx, conveyor.RemoteClaim{Worker: "w", Lease: time.Minute})
		if err != nil || len(got) != 1 || got[0].ID != ids[0] {
			t.Fatalf("claim: %v %v", got, err)
		}
		if err := rw.Complete(ctx, ids[0], got[0].Fence, []byte(`"r"`)); err != nil {
			t.Fatal(err)
		}
		drv := seam.DriverOf(c)
		// Not fired yet: Prune keeps the batch, whatever its jobs' age.
		if _, err := drv.Prune(ctx, 0, 0, 100); err != nil {
			t.Fatal(err)
		}
		if b, err := c.Batch(ctx, bid); err != nil || b.CallbackID != 0 || b.Jobs[0].State != "" {
			t.Fatalf("unfired batch after prune: %+v %v", b, err)
		}
		fired, err := drv.FireBatches(ctx, 10, nil)
		if err != nil || fired[bid] == 0 {
			t.Fatalf("fire (its one job pruned counts as finished): %v %v", fired, err)
		}
		batchOf(fired[bid], 0, bid)
		// Kept while its callback has not finished: the callback reads it.
		time.Sleep(10 * time.Millisecond)
		if _, err := drv.Prune(ctx, time.Millisecond, time.Millisecond, 100); err != nil {
			t.Fatal(err)
		}
		if b, err := c.Batch(ctx, bid); err != nil || b.CallbackID != fired[bid] {
			t.Fatalf("batch of an available callback after prune: %+v %v", b, err)
		}
		// Cancelled (finished, and kept by the discarded jobs' retention).
		if _, err := c.Cancel(ctx, fired[bid]); err != nil {
			t.Fatal(err)
		}
		if _, err := drv.Prune(ctx, time.Millisecond, time.Hour, 100); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Batch(ctx, bid); !errors.Is(err, conveyor.ErrBatchNotFound) {
			t.Fatalf("pruned batch: %v", err)
		}
		batchOf(fired[bid], 0, 0)
	})
}
