package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestPauseReachesEveryClient: three clients work one queue; a pause from
// one stops claims in all three (a job already running finishes), holds
// for a client opened afterwards, and a resume from another lets every
// waiting job run.
func TestPauseReachesEveryClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		const n = 30
		var (
			mu      sync.Mutex
			ran     = map[string]int{}
			started = make(chan struct{})
			release = make(chan struct{})
			done    = make(chan string, n+1)
		)
		clients := make([]*conveyor.Client[any], 3)
		for i := range clients {
			if i == 0 {
				clients[i] = openDropped(t, dsn, fast(prefix))
			} else {
				clients[i] = open(t, dsn, fast(prefix))
			}
			err := conveyor.AddWorker(clients[i], conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[tagged]) error {
				if j.Args.Tag == "hold" {
					close(started)
					<-release
				}
				mu.Lock()
				ran[j.Args.Tag]++
				mu.Unlock()
				done <- j.Args.Tag
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			if err := clients[i].Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		hold, err := clients[0].Enqueue(ctx, tagged{"hold"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the first job did not start within 30s")
		}
		if err := clients[0].PauseQueue(ctx, conveyor.DefaultQueue); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := clients[2].Enqueue(ctx, tagged{fmt.Sprint(i)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		// The running job finishes while the queue is paused.
		close(release)
		select {
		case tag := <-done:
			if tag != "hold" {
				t.Fatalf("job %q ran while its queue was paused", tag)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the running job did not finish within 30s of the pause")
		}
		waitState(t, clients[1], hold, conveyor.JobStateCompleted)
		// Every client has claimed (and found nothing) since the jobs
		// were enqueued: two claim rounds each, the second begun after
		// the first ended, so after this point.
		claimedSince(t, clients, 2)
		select {
		case tag := <-done:
			t.Fatalf("job %q ran while its queue was paused", tag)
		default:
		}
		st, err := clients[1].Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var q *conveyor.QueueStats
		for i := range st.Queues {
			if st.Queues[i].Queue == conveyor.DefaultQueue {
				q = &st.Queues[i]
			}
		}
		if q == nil || q.PausedAt.IsZero() || q.Counts[conveyor.JobStateAvailable] != n {
			t.Fatalf("stats while paused: %+v, want paused with %d available", q, n)
		}
		// A client opened now (a restarted process) sees the pause.
		late := open(t, dsn, fast(prefix))
		if paused, err := late.PausedQueues(ctx); err != nil || paused[conveyor.DefaultQueue].IsZero() {
			t.Fatalf("a new client's paused queues: %v, %v", paused, err)
		}
		if err := clients[1].ResumeQueue(ctx, conveyor.DefaultQueue); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(60 * time.Second)
		for range n {
			select {
			case <-done:
			case <-deadline:
				t.Fatalf("after resume, %v ran within 60s; want all %d", ran, n)
			}
		}
		if paused, err := clients[2].PausedQueues(ctx); err != nil || len(paused) != 0 {
			t.Fatalf("after resume: paused %v, %v", paused, err)
		}
		mu.Lock()
		defer mu.Unlock()
		for tag, k := range ran {
			if k != 1 {
				t.Errorf("job %q ran %d times", tag, k)
			}
		}
	})
}

// TestPauseRefusesBadQueueName: a bad queue name is refused before
// anything is written.
func TestPauseRefusesBadQueueName(t *testing.T) {
	c := open(t, backends[0].dsn(t), fast(testdb.Prefix()))
	for _, q := range []string{"", "a b", "<script>"} {
		if err := c.PauseQueue(context.Background(), q); err == nil {
			t.Errorf("PauseQueue(%q) succeeded", q)
		}
		// The error is ErrInvalidOpts (a 400 in the API) but speaks of
		// the pause, not of enqueue options.
		for op, err := range map[string]error{"pause": c.PauseQueue(context.Background(), q), "resume": c.ResumeQueue(context.Background(), q)} {
			want := fmt.Sprintf("conveyor: %s queue %q: invalid queue name", op, q)
			if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.HasPrefix(fmt.Sprint(err), want) || strings.Contains(fmt.Sprint(err), "enqueue") {
				t.Errorf("%s %q: %v, want ErrInvalidOpts starting %q", op, q, err, want)
			}
		}
	}
	if paused, err := c.PausedQueues(context.Background()); err != nil || len(paused) != 0 {
		t.Errorf("paused queues after refusals: %v, %v", paused, err)
	}
}

// waitState waits, for at most 30s, until job id is in state want.
func waitState(t *testing.T, c *conveyor.Client[any], id int64, want conveyor.JobState) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		j := jobState(t, c, id)
		if j.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d is %s after 30s, want %s", id, j.State, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// claimedSince waits until each client has issued n more claim rounds
// than it had when called (Counters.ClaimRounds): with n of 2, at least
// one of them began after the call. It bounds a check that something
// was not claimed by the claims that would have taken it, not by a sleep.
func claimedSince(t *testing.T, clients []*conveyor.Client[any], n int64) {
	t.Helper()
	base := make([]int64, len(clients))
	for i, c := range clients {
		base[i] = c.Counters().ClaimRounds
	}
	waitFor(t, fmt.Sprintf("%d claim rounds of every client", n), 30*time.Second, func() bool {
		for i, c := range clients {
			if c.Counters().ClaimRounds < base[i]+n {
				return false
			}
		}
		return true
	})
}
