package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/driver"
)

// refusingBind opens SQLite and refuses, without writing anything, every
// insert of unique jobs larger than max: a database on which a batch that
// large cannot go in within its deadline.
type refusingBind struct {
	path string
	max  int
	mu   sync.Mutex
	// tries are the sizes of the unique inserts asked for.
	tries []int
}

func (b *refusingBind) Bind(ctx context.Context, opts driver.Options) (driver.Driver, error) {
	d, err := sqlite.Open(ctx, b.path, opts)
	if err != nil {
		return nil, err
	}
	return &refusingDriver{Driver: d, b: b}, nil
}

func (b *refusingBind) UnwrapTx(tx any) any { return tx }

type refusingDriver struct {
	driver.Driver
	b *refusingBind
}

func (d *refusingDriver) InsertUnique(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, []bool, error) {
	d.b.mu.Lock()
	d.b.tries = append(d.b.tries, len(jobs))
	d.b.mu.Unlock()
	if len(jobs) > d.b.max {
		return nil, nil, driver.NotCommitted(fmt.Errorf("%d jobs: %w", len(jobs), errTooSlow))
	}
	return d.Driver.InsertUnique(ctx, tx, jobs)
}

var errTooSlow = errors.New("refused: a batch this large does not go in within its deadline")

// TestPeriodicCatchUpShrinksFailedBatches: a process that reaches 40
// slots late on a database where inserts of more than 16 jobs do not go
// in (a write lock held behind stalled writers, every try cut by its
// deadline) still enqueues every slot, once: a batch that failed is
// tried again smaller. Retried at the same size, it never would.
func TestPeriodicCatchUpShrinksFailedBatches(t *testing.T) {
	ctx := context.Background()
	b := &refusingBind{path: filepath.Join(t.TempDir(), "shrink.db"), max: 16}
	cfg := fast("")
	cfg.AllowUnregisteredKinds = true
	c, err := conveyor.New[any](ctx, b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "late", Schedule: conveyor.Every(time.Second), Args: tick{},
		Opts: &conveyor.EnqueueOpts{Queue: "late"}}); err != nil {
		t.Fatal(err)
	}
	const n = 40
	now := time.Now().Truncate(time.Second)
	first := now.Add(-(n - 1) * time.Second)
	next := conveyor.CatchUpForTest(c, "late", first, now)
	wakes := 1
	for ; wakes < 10 && next.Before(now.Add(time.Second)); wakes++ {
		next = conveyor.PeriodicWakeForTest(c, "late", now)
	}
	b.mu.Lock()
	tries := append([]int(nil), b.tries...)
	b.mu.Unlock()
	if !next.Equal(now.Add(time.Second)) {
		t.Fatalf("after %d wakes the next slot is %v, want %v (insert sizes tried: %v)", wakes, next, now.Add(time.Second), tries)
	}
	oneJobPerSlot(t, c, "late", first, now, n, fmt.Sprintf("; insert sizes tried: %v", tries))
	refused := 0
	for _, k := range tries {
		if k > b.max {
			refused++
		}
	}
	if refused == 0 {
		t.Fatalf("no insert was refused (sizes %v): the test did not play a slow database", tries)
	}
	t.Logf("%d wakes, insert sizes %v", wakes, tries)
}
