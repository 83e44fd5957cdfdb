package drivertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// pause runs the suite's tests of paused queues: never claimed from while
// paused.
func pause(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("PausedQueueNotClaimed", func(t *testing.T) {
		d := s.setup(t)
		if _, err := d.Insert(ctx, []driver.InsertParams{job("p", 0), job("p", 0), job("other", 0)}); err != nil {
			t.Fatal(err)
		}
		claim := func(q string) int {
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: q, Limit: 1, Lease: time.Minute, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			return len(rows)
		}
		if err := d.PauseQueue(ctx, "p", true); err != nil {
			t.Fatal(err)
		}
		paused, err := d.PausedQueues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, ok := paused["p"]
		if len(paused) != 1 || !ok || first.IsZero() {
			t.Fatalf("paused queues %v, want p alone with its time", paused)
		}
		if n := claim("p"); n != 0 {
			t.Fatalf("claimed %d jobs of a paused queue", n)
		}
		if n := claim("other"); n != 1 {
			t.Fatalf("claimed %d jobs of another queue, want 1", n)
		}
		// Pausing again keeps the first pause's time.
		if err := d.PauseQueue(ctx, "p", true); err != nil {
			t.Fatal(err)
		}
		if again, _ := d.PausedQueues(ctx); !again["p"].Equal(first) {
			t.Fatalf("paused again: since %v, want the first pause's %v", again["p"], first)
		}
		if err := d.PauseQueue(ctx, "p", false); err != nil {
			t.Fatal(err)
		}
		if paused, err := d.PausedQueues(ctx); err != nil || len(paused) != 0 {
			t.Fatalf("after resume: paused %v, %v", paused, err)
		}
		if n := claim("p"); n != 1 {
			t.Fatalf("claimed %d jobs of a resumed queue, want 1", n)
		}
		// Resuming a queue that was never paused is not an error.
		if err := d.PauseQueue(ctx, "never", false); err != nil {
			t.Fatal(err)
		}
	})

	// A claim already running when a pause commits must not take a job
	// inserted after the pause: on InnoDB a locking read sees rows newer
	// than the statement's snapshot, so a pause check read from that
	// snapshot could miss a pause that the job's insert came after.
	// Claimers spin on the queue while each round pauses it, inserts one
	// job, resumes it and waits for the job. A claim that returned the
	// job before the resume began took it while the queue was paused.
	t.Run("PauseBeatsClaimInFlight", func(t *testing.T) {
		d := s.setup(t)
		const rounds, claimers = 60, 4
		var (
			phase   sync.Mutex // held by a claimer while it reads paused
			paused  bool
			claimed = make(chan int64, rounds)
			bad     = make(chan string, rounds)
			stop    = make(chan struct{})
			wg      sync.WaitGroup
		)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Minute, Worker: "w"})
					if err != nil {
						bad <- fmt.Sprintf("claim: %v", err)
						return
					}
					if len(rows) == 0 {
						continue
					}
					phase.Lock()
					if paused {
						bad <- fmt.Sprintf("job %d claimed while its queue was paused", rows[0].ID)
					}
					phase.Unlock()
					claimed <- rows[0].ID
				}
			}()
		}
		defer func() { close(stop); wg.Wait() }()
		for round := range rounds {
			if err := d.PauseQueue(ctx, "r", true); err != nil {
				t.Fatal(err)
			}
			phase.Lock()
			paused = true
			phase.Unlock()
			ids, err := d.Insert(ctx, []driver.InsertParams{job("r", 0)})
			if err != nil {
				t.Fatal(err)
			}
			// Let the claimers run a few claims against the paused queue.
			time.Sleep(2 * time.Millisecond)
			phase.Lock()
			paused = false
			phase.Unlock()
			if err := d.PauseQueue(ctx, "r", false); err != nil {
				t.Fatal(err)
			}
			select {
			case id := <-claimed:
				if id != ids[0] {
					t.Fatalf("round %d: claimed job %d, want %d", round, id, ids[0])
				}
			case msg := <-bad:
				t.Fatalf("round %d: %s", round, msg)
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: job %d not claimed within 30s of the resume", round, ids[0])
			}
		}
		select {
		case msg := <-bad:
			t.Fatal(msg)
		default:
		}
	})
}
