package web

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// overviewClient answers Overview from a list of finish times, as the
// database would through its finalized_at index; the rest of client is
// not used by statsCache.
type overviewClient struct {
	client
	mu       sync.Mutex
	finishes []time.Time
	sinces   []time.Time
}

func (c *overviewClient) finish(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range n {
		c.finishes = append(c.finishes, time.Now())
	}
}

func (c *overviewClient) Overview(_ context.Context, since time.Time) (*conveyor.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sinces = append(c.sinces, since)
	var n int64
	for _, at := range c.finishes {
		if !at.Before(since) {
			n++
		}
	}
	q := conveyor.QueueStats{Queue: "q", Counts: map[conveyor.JobState]int64{conveyor.JobStateCompleted: n, conveyor.JobStateAvailable: 2}}
	return &conveyor.Stats{Queues: []conveyor.QueueStats{q}, FinishedSince: since}, nil
}

func (c *overviewClient) Processes(context.Context) ([]conveyor.ProcessInfo, error) { return nil, nil }

// TestSeriesFinishedBetweenSamples: the table's reading counts the jobs
// finished in the last finishedWindow, and each chart sample after the
// first the jobs finished since the previous sample (not the window).
func TestSeriesFinishedBetweenSamples(t *testing.T) {
	c := &overviewClient{}
	s := newStatsCache(c, time.Nanosecond, time.Nanosecond)
	ctx := context.Background()
	c.finish(3) // before the first sample: in the window, not in a rate
	rd, err := s.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := rd.Stats.Queues[0].Counts[conveyor.JobStateCompleted]; got != 3 {
		t.Fatalf("window count %d, want 3", got)
	}
	if w := rd.At.Sub(rd.Stats.FinishedSince); w != finishedWindow {
		t.Fatalf("window %v, want %v", w, finishedWindow)
	}
	time.Sleep(time.Millisecond)
	c.finish(2)
	time.Sleep(time.Millisecond)
	rd2, err := s.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := rd2.Stats.Queues[0].Counts[conveyor.JobStateCompleted]; got != 5 {
		t.Fatalf("window count %d, want 5", got)
	}
	ser := s.series()
	if len(ser.Samples) != 2 {
		t.Fatalf("%d samples, want 2", len(ser.Samples))
	}
	first, second := ser.Samples[0], ser.Samples[1]
	if first.Finished != nil || first.FinishedPerSec != nil {
		t.Fatalf("first sample has a count: %+v", first)
	}
	if second.Finished == nil || *second.Finished != 2 || second.FinishedPerSec == nil || *second.FinishedPerSec <= 0 {
		t.Fatalf("second sample: %+v, want 2 finished since the first", second)
	}
	if second.Available != 2 {
		t.Fatalf("available %d", second.Available)
	}
	if !c.sinces[len(c.sinces)-1].Equal(time.Time(first.At)) {
		t.Fatalf("sample counted since %v, want the previous sample's %v", c.sinces[len(c.sinces)-1], time.Time(first.At))
	}
}
