package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// batchHook is a pgx tracer that runs before, once, the first batch that
// holds the statement match: the test's change made between a claim's
// read of its limits and its lock of the key slots.
type batchHook struct {
	mu    sync.Mutex
	match string
	once  sync.Once
	run   func()
}

func (h *batchHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (h *batchHook) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (h *batchHook) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	h.mu.Lock()
	match := h.match
	h.mu.Unlock()
	if match == "" || data.Batch == nil {
		return ctx
	}
	for _, q := range data.Batch.QueuedQueries {
		if q.SQL == match {
			h.once.Do(h.run)
			break
		}
	}
	return ctx
}

func (h *batchHook) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (h *batchHook) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestKeyLimitLoweredDuringClaim: a KeyMaxRunning lowered (or the queue
// made Ordered) after a claim read the queue's limits but before it
// locked the key slots: the claim must not admit a key's jobs under the
// old limit. It runs again under the new one.
func TestKeyLimitLoweredDuringClaim(t *testing.T) {
	for _, c := range []struct {
		name string
		to   driver.QueueLimits
	}{
		{"KeyMaxRunning", driver.QueueLimits{KeyMaxRunning: 1}},
		{"Ordered", driver.QueueLimits{Ordered: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			d := open(t, driver.Options{})
			hook := &batchHook{}
			cfg, err := pgxpool.ParseConfig(testdb.Postgres(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.Tracer = hook
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			claimer, err := New(ctx, pool, nil, driver.Options{Prefix: d.prefix})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = claimer.Close() })
			if err := d.SetQueueLimits(ctx, "kl", driver.QueueLimits{KeyMaxRunning: 2}); err != nil {
				t.Fatal(err)
			}
			claim := func() driver.ClaimResult {
				r, err := claimer.ClaimLimited(ctx, driver.ClaimParams{Queue: "kl", Limit: 5, Lease: time.Minute, Worker: "w"})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			// The claimer knows the limit of 2: its next walk runs
			// under it.
			if r := claim(); len(r.Rows) != 0 {
				t.Fatalf("claimed %d from an empty queue", len(r.Rows))
			}
			j := pj("kl")
			j.Key = "a"
			ids, err := d.Insert(ctx, []driver.InsertParams{j, j, j})
			if err != nil {
				t.Fatal(err)
			}
			hook.run = func() {
				if err := d.SetQueueLimits(ctx, "kl", c.to); err != nil {
					t.Error(err)
				}
			}
			hook.mu.Lock()
			hook.match = claimer.q.KeyLock
			hook.mu.Unlock()
			r := claim()
			if len(r.Rows) != 1 || r.Rows[0].ID != ids[0] {
				got := []int64{}
				for _, row := range r.Rows {
					got = append(got, row.ID)
				}
				t.Fatalf("limits lowered to %+v during the claim: claimed jobs %v of key a, want only job %d", c.to, got, ids[0])
			}
		})
	}
}
