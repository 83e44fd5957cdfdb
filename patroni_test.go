package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// runLog records each run of each job, outside the queue.
type runLog struct {
	mu   sync.Mutex
	runs map[string][]jobRun // by tag
}

type jobRun struct {
	id      int64
	attempt int
	start   time.Time
	ok      bool
}

func (r *runLog) add(tag string, run jobRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil {
		r.runs = map[string][]jobRun{}
	}
	r.runs[tag] = append(r.runs[tag], run)
}

func (r *runLog) succeeded(tag string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, run := range r.runs[tag] {
		if run.ok {
			n++
		}
	}
	return n
}

// TestPatroniSwitchoverAndFailover runs a worker and an enqueuer through
// a switchover and a kill -9 of the primary's postmaster of a Patroni
// cluster with synchronous replication, connected through a multi-host
// DSN with target_session_attrs=read-write. After each fault: every
// enqueue that returned success ends completed; a job runs successfully
// more than once only if a run began before the cluster recovered (its
// claim, committed asynchronously, may have been lost with the old
// primary, or its lease with the pause); a job enqueued once everything is idle is worked without the
// fallback poll (an hour here), so LISTEN works again; and the
// maintenance leader's row is renewed after the fault.
func TestPatroniSwitchoverAndFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Patroni cluster")
	}
	cluster := topology.StartPatroniT(t, topology.PatroniOptions{})
	ctx := context.Background()
	dsn := cluster.DSN("test")
	prefix := testdb.Prefix()

	log := &runLog{}
	wcfg := fast(prefix)
	wcfg.Lease, wcfg.HeartbeatInterval = 5*time.Second, time.Second
	wcfg.ListenPoll = time.Hour // only a notification wakes an idle worker
	wcfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 8}}
	worker := openDropped(t, dsn, wcfg)
	ecfg := fast(prefix)
	ecfg.NoQueues = true
	enq := open(t, dsn, ecfg)
	err := conveyor.AddWorker(worker, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
		run := jobRun{id: j.ID, attempt: j.Attempt, start: time.Now()}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			log.add(j.Args.Tag, run)
			return ctx.Err()
		}
		run.ok = true
		log.add(j.Args.Tag, run)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}

	var (
		ackMu sync.Mutex
		acked = map[string]int64{} // tag -> id of each enqueue that returned success
		seq   int
	)
	enqueue := func(tag string) error {
		id, err := enq.Enqueue(ctx, tagged{tag}, nil)
		if err != nil {
			return err
		}
		ackMu.Lock()
		acked[tag] = id
		ackMu.Unlock()
		return nil
	}
	// enqueueWhile enqueues until stop is closed, and counts the failed
	// enqueues (refused or of unknown outcome during the pause).
	enqueueWhile := func(stop <-chan struct{}, failed *int) {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			ackMu.Lock()
			seq++
			tag := fmt.Sprintf("j%d", seq)
			ackMu.Unlock()
			if err := enqueue(tag); err != nil {
				*failed++
			}
		}
	}
	allDone := func() bool {
		ackMu.Lock()
		defer ackMu.Unlock()
		for tag := range acked {
			if log.succeeded(tag) == 0 {
				return false
			}
		}
		return true
	}
	leaderExpiry := func() time.Time {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, dsn)
		if err != nil {
			return time.Time{}
		}
		defer conn.Close(ctx)
		var exp time.Time
		_ = conn.QueryRow(cctx, fmt.Sprintf("SELECT expires_at FROM %sleader WHERE name = 'maintenance'", prefix)).Scan(&exp)
		return exp
	}

	type window struct{ from, to time.Time }
	var faults []window // a lease before each fault, to when it was over (a writable new primary)
	for i, fault := range []struct {
		name string
		do   func(context.Context, time.Duration) (*topology.PatroniNode, *topology.PatroniNode, error)
	}{
		{"switchover", cluster.Switchover},
		{"kill -9 of the primary's postmaster", cluster.KillPrimary},
	} {
		stop := make(chan struct{})
		var failed int
		done := make(chan struct{})
		go func() { defer close(done); enqueueWhile(stop, &failed) }()
		time.Sleep(2 * time.Second)
		began := time.Now()
		old, nw, err := fault.do(ctx, 90*time.Second)
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("%s: %v", fault.name, err)
		}
		over := time.Now()
		faults = append(faults, window{began.Add(-wcfg.Lease), over})
		time.Sleep(2 * time.Second)
		close(stop)
		<-done
		t.Logf("%s: %s -> %s in %v; %d enqueues failed during it", fault.name, old.Name, nw.Name, over.Sub(began).Round(time.Millisecond), failed)
		if err := cluster.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}

		// Every acknowledged enqueue is worked (lost claims are rescued
		// once their leases expire).
		waitFor(t, fault.name+": every acknowledged job worked", 90*time.Second, allDone)

		// LISTEN again: the worker is idle now, and only a notification
		// wakes it before the hour-long fallback poll.
		time.Sleep(500 * time.Millisecond)
		probe := fmt.Sprintf("probe%d", i)
		if err := enqueue(probe); err != nil {
			t.Fatalf("%s: enqueue after recovery: %v", fault.name, err)
		}
		waitFor(t, fault.name+": the probe job worked without the fallback poll (LISTEN after the fault)", 30*time.Second, func() bool {
			return log.succeeded(probe) > 0
		})

		// A leader renews its row after the fault: its expiry is then at
		// least the leadership TTL (15s) past the fault's end, which no
		// renewal from before the fault reaches.
		waitFor(t, fault.name+": a maintenance leader after the fault", 30*time.Second, func() bool {
			return !leaderExpiry().Before(over.Add(15 * time.Second))
		})
	}

	// Every acknowledged job is completed in the queue, and a job ran
	// successfully more than once only when its first run began within a
	// lease before a fault and the fault's end.
	ackMu.Lock()
	defer ackMu.Unlock()
	reruns := 0
	for tag, id := range acked {
		j, err := enq.Job(ctx, id)
		if err != nil {
			if errors.Is(err, conveyor.ErrNotFound) {
				t.Errorf("acknowledged job %d (%s) lost", id, tag)
				continue
			}
			t.Fatal(err)
		}
		if j.State != conveyor.JobStateCompleted {
			t.Errorf("acknowledged job %d (%s) is %s, want completed", id, tag, j.State)
		}
		log.mu.Lock()
		runs := log.runs[tag]
		log.mu.Unlock()
		var oks []jobRun
		for _, r := range runs {
			if r.ok {
				oks = append(oks, r)
			}
		}
		if len(oks) <= 1 {
			continue
		}
		reruns++
		explained := false
		for _, w := range faults {
			if oks[0].start.After(w.from) && oks[0].start.Before(w.to) {
				explained = true
			}
		}
		if !explained {
			t.Errorf("job %d (%s) completed %d times, its first run at %v outside every fault %v: %+v", id, tag, len(oks), oks[0].start, faults, oks)
		}
	}
	t.Logf("%d acknowledged jobs, %d run successfully more than once (a claim or lease lost in a fault)", len(acked), reruns)
}
