package torture

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
)

// Bugs the suite found, reproduced on their own so that they stay fixed.

// On MySQL/MariaDB a transaction told that its unique job is a duplicate
// kept a shared lock on the holder's unique-index entry until it ended
// (fixed: the driver's InsertUnique looks the key up without a lock
// first, and returns ErrUniqueRace instead of holding one). The holder's completion waits for it
// while holding the holder's row, and the process's heartbeat, one UPDATE
// over all its running jobs, waits behind that row and times out: while
// the caller's transaction stays open, every other job of the process
// loses its lease and is cancelled and run again. Found by the txrollback
// phase under load (heartbeats timing out at 1.6s, premature rescues).
// PostgreSQL is not affected.
func TestMySQLDuplicateTxDoesNotStallHeartbeats(t *testing.T) {
	dsn := testdb.MySQL(t)
	ctx := context.Background()
	cfg := &conveyor.Config{TablePrefix: newPrefix(), Lease: 2 * time.Second, Queues: map[string]conveyor.QueueConfig{Queue: {MaxWorkers: 8}},
		PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond, RescueInterval: 250 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	c, err := openMigrated(ctx, dsn, cfg, connect.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lab.DropTables(ctx, c); c.Close() }()
	started := make(chan struct{}, 1)
	var others, cancelled atomic.Int32
	_ = conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[workJob]) error {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return nil
	}))
	_ = conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[dbworkJob]) error {
		others.Add(1)
		select {
		case <-time.After(8 * time.Second):
			return nil
		case <-ctx.Done():
			cancelled.Add(1)
			return context.Cause(ctx)
		}
	}))
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(ctx) }()
	unique := &conveyor.EnqueueOpts{Queue: Queue, Unique: liveUnique}
	args := conveyor.RawArgs{KindName: KindWork, JSON: json.RawMessage(`{"u":"L0"}`)}
	if _, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: args, Opts: unique}}); err != nil {
		t.Fatal(err)
	}
	<-started // the holder runs (300ms)
	for i := 0; i < 3; i++ {
		if _, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: KindDBWork, JSON: json.RawMessage(`{}`)}, &conveyor.EnqueueOpts{Queue: Queue}); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := openTxBeginner(ctx, dsn, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.close()
	tx, err := tb.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.EnqueueManyTx(ctx, tx.tx, []conveyor.EnqueueItem{{Args: args, Opts: unique}})
	if err != nil || !res[0].Duplicate {
		t.Fatalf("enqueue in the transaction: %+v %v, want a duplicate", res, err)
	}
	time.Sleep(3 * cfg.Lease) // the caller's transaction stays open
	_ = tx.commit(ctx)
	time.Sleep(9 * time.Second) // the other jobs end
	if n := cancelled.Load(); n > 0 {
		t.Errorf("%d executions of 3 unrelated jobs cancelled (%d executions in all) while a transaction told a duplicate stayed open %v", n, others.Load(), 3*cfg.Lease)
	}
}
