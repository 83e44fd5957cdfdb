package web

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

// slowOverview is a client whose Overview takes at least 100ms.
type slowOverview struct {
	client
	reads atomic.Int64
}

func (s *slowOverview) Overview(ctx context.Context, since time.Time) (*conveyor.Stats, error) {
	s.reads.Add(1)
	time.Sleep(100 * time.Millisecond)
	return &conveyor.Stats{}, nil
}

func (s *slowOverview) Processes(ctx context.Context) ([]conveyor.ProcessInfo, error) {
	return nil, nil
}

// TestStatsReuseScalesWithCost: a reading that took 100ms is shared for
// at least a second (ten times as long), though StatsMaxAge is 1ms, so a
// slow count is not run again by every request; below 1ms every request
// reads.
func TestStatsReuseScalesWithCost(t *testing.T) {
	ctx := context.Background()
	c := &slowOverview{}
	s := newStatsCache(c, time.Millisecond, time.Hour)
	for i := 0; i < 3; i++ {
		if _, err := s.get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first get reads once (the first chart sample needs no second
	// reading); the two after it reuse that reading.
	if n := c.reads.Load(); n != 1 {
		t.Errorf("%d readings for three requests, want 1", n)
	}

	c2 := &slowOverview{}
	s2 := newStatsCache(c2, time.Nanosecond, time.Hour)
	for i := 0; i < 2; i++ {
		if _, err := s2.get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := c2.reads.Load(); n != 2 {
		t.Errorf("StatsMaxAge 1ns: %d readings for two requests, want 2", n)
	}
}
