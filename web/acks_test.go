package web

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// completeRecorder is a driver whose Complete records each batch and
// applies an outcome only to a job not yet finished (as a fence would);
// its first call waits for release.
type completeRecorder struct {
	driver.Driver
	release chan struct{}
	mu      sync.Mutex
	batches [][]int64
	done    map[int64]bool
}

func (f *completeRecorder) Complete(ctx context.Context, os []driver.Outcome) ([]int64, error) {
	f.mu.Lock()
	first := len(f.batches) == 0
	ids := make([]int64, len(os))
	for i, o := range os {
		ids[i] = o.ID
	}
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	if first {
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var applied []int64
	for _, o := range os {
		if !f.done[o.ID] {
			f.done[o.ID] = true
			applied = append(applied, o.ID)
		}
	}
	return applied, nil
}

// TestAcksBatch: outcomes that arrive while a batch is being written go
// together in the next one, each still decided on its own; two outcomes
// for one job never share a batch, and only the first is applied.
func TestAcksBatch(t *testing.T) {
	f := &completeRecorder{release: make(chan struct{}), done: map[int64]bool{}}
	a := newAcks(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		id      int64
		applied bool
		err     error
	}
	results := make(chan result, 20)
	send := func(id int64) {
		go func() {
			ok, err := a.write(ctx, driver.Outcome{ID: id, State: driver.StateCompleted})
			results <- result{id, ok, err}
		}()
	}
	send(1) // written alone; its write blocks until release
	for ctx.Err() == nil {
		f.mu.Lock()
		n := len(f.batches)
		f.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for id := int64(2); id <= 11; id++ {
		send(id)
	}
	send(5) // a second outcome for job 5
	for ctx.Err() == nil {
		a.mu.Lock()
		n := len(a.pending)
		a.mu.Unlock()
		if n == 11 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(f.release)
	applied := map[int64]int{}
	refused := map[int64]int{}
	for range 12 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.applied {
			applied[r.id]++
		} else {
			refused[r.id]++
		}
	}
	for id := int64(1); id <= 11; id++ {
		if applied[id] != 1 {
			t.Errorf("job %d applied %d times, want once", id, applied[id])
		}
	}
	if len(refused) != 1 || refused[5] != 1 {
		t.Errorf("refused %v, want job 5's second outcome only", refused)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) != 3 || len(f.batches[0]) != 1 || len(f.batches[1]) != 10 || len(f.batches[2]) != 1 || f.batches[2][0] != 5 {
		t.Errorf("batches %v, want [1], the ten others together, then [5]", f.batches)
	}
}
