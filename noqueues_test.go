package conveyor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestNoQueuesRunsMaintenanceOnly: a started client with NoQueues is the
// only started client on its tables. It promotes a scheduled job that
// comes due (leader maintenance) and claims nothing: the available job
// stays available.
func TestNoQueuesRunsMaintenanceOnly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.NoQueues = true
		c := openDropped(t, dsn, cfg)
		if got := c.Config().Queues; len(got) != 0 {
			t.Fatalf("Config().Queues = %v, want none", got)
		}
		waiting, err := c.Enqueue(ctx, tagged{"waiting"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		due, err := c.Enqueue(ctx, tagged{"due"}, &conveyor.EnqueueOpts{Delay: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if j, err := c.Job(ctx, due); err != nil || j.State != conveyor.JobStateScheduled {
			t.Fatalf("delayed job: %v, %v; want scheduled", j, err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			j, err := c.Job(ctx, due)
			if err != nil {
				t.Fatal(err)
			}
			if j.State == conveyor.JobStateAvailable {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("delayed job still %s after 15s: no maintenance ran", j.State)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// A client with no queues has no claim to wait for: the absence
		// of claims is shown over several poll intervals of a queue,
		// had it one, by the jobs and by its own count of claim rounds
		// (which a fetcher counts even when it finds nothing).
		time.Sleep(300 * time.Millisecond)
		if n := c.Counters().ClaimRounds; n != 0 {
			t.Errorf("a client with no queues issued %d claim rounds", n)
		}
		for _, id := range []int64{waiting, due} {
			j, err := c.Job(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if j.State != conveyor.JobStateAvailable || j.Attempt != 0 {
				t.Errorf("job %d: %s, attempt %d; a client with no queues claimed it", id, j.State, j.Attempt)
			}
		}
	})
}

func TestNoQueuesWithQueuesRefused(t *testing.T) {
	cfg := &conveyor.Config{NoQueues: true, Queues: map[string]conveyor.QueueConfig{"a": {}}}
	_, err := connect.Open(context.Background(), "sqlite:"+t.TempDir()+"/q.db", cfg)
	if err == nil || !strings.Contains(err.Error(), "NoQueues") {
		t.Fatalf("NoQueues with Queues: err = %v, want a refusal naming NoQueues", err)
	}
}
