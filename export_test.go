package conveyor

import (
	"context"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/backend/mysql"
	"github.com/conveyorq/conveyor/internal/backend/postgres"
	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/driver"
)

// ClaimForTest claims job id as another process would (without running it)
// and returns the attempt and its fence token, so tests can play a process
// that dies.
func ClaimForTest[TTx any](c *Client[TTx], id int64, lease time.Duration) (int, int64, error) {
	j, err := c.drv.GetJob(context.Background(), id)
	if err != nil {
		return 0, 0, err
	}
	rows, err := c.drv.Claim(context.Background(), driver.ClaimParams{Queue: j.Queue, Limit: 1, Lease: lease, Worker: "dead-process"})
	if err != nil {
		return 0, 0, err
	}
	if len(rows) != 1 || rows[0].ID != id {
		return 0, 0, fmt.Errorf("claimed %d rows, not job %d", len(rows), id)
	}
	return rows[0].Attempt, rows[0].Fence, nil
}

// AckForTest acknowledges job id as completed under fence, as a late
// worker would, and returns how many rows the acknowledgement changed.
func AckForTest[TTx any](c *Client[TTx], id int64, fence int64) (int, error) {
	applied, err := c.drv.Complete(context.Background(), []driver.Outcome{{ID: id, Fence: fence, State: driver.StateCompleted}})
	return len(applied), err
}

// ReleaseForTest releases job id's attempt under fence, as a process
// shutting down gracefully does, and returns how many rows it changed.
func ReleaseForTest[TTx any](c *Client[TTx], id int64, fence int64) (int64, error) {
	return c.drv.Release(context.Background(), []driver.Lease{{ID: id, Fence: fence}})
}

// FenceForTest returns job id's current fence token.
func FenceForTest[TTx any](c *Client[TTx], id int64) (int64, error) {
	j, err := c.drv.GetJob(context.Background(), id)
	if err != nil {
		return 0, err
	}
	return j.Fence, nil
}

// InserterForTest returns how many enqueue calls wait for c's group-commit
// writers, and how many they have taken so far.
func InserterForTest[TTx any](c *Client[TTx]) (queued int, taken int64) {
	return c.eng.QueuedInserts(), c.eng.TakenInserts()
}

// OneUniqueLaneForTest makes c write every enqueue with unique jobs in one
// lane, as a single writer would, so that unique callers line up behind a
// waiting one.
func OneUniqueLaneForTest[TTx any](c *Client[TTx]) { c.eng.OneUniqueLane() }

// HoldPlainWriterForTest keeps c's group-commit writer of plain jobs from
// writing its next batch until release is called, as a write in progress
// would.
func HoldPlainWriterForTest[TTx any](c *Client[TTx]) (release func()) {
	return c.eng.HoldPlainInserts()
}

// BumpSchemaForTest records schema version v as applied, as a newer
// conveyor binary would.
func BumpSchemaForTest[TTx any](c *Client[TTx], v int) error {
	ctx := context.Background()
	p := c.cfg.TablePrefix
	switch d := c.drv.(type) {
	case *postgres.Driver:
		_, err := d.Pool().Exec(ctx, "INSERT INTO "+p+"schema_migrations (version) VALUES ($1)", v)
		return err
	case *mysql.Driver:
		_, err := d.DB().ExecContext(ctx, "INSERT INTO `"+p+"schema_migrations` (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))", v)
		return err
	case *sqlite.Driver:
		_, err := d.DB().ExecContext(ctx, "INSERT INTO "+p+"schema_migrations (version, applied_at) VALUES (?, 0)", v)
		return err
	}
	return fmt.Errorf("unknown driver %T", c.drv)
}

// ScheduleTouchesForTest returns when each recorded schedule's row was
// last recorded or marked as in use (the database's clock), by name.
func ScheduleTouchesForTest[TTx any](c *Client[TTx]) (map[string]time.Time, error) {
	rows, err := c.drv.Schedules(context.Background())
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(rows))
	for _, r := range rows {
		out[r.Name] = r.UpdatedAt
	}
	return out, nil
}

// FireBatchesForTest runs the maintenance leader's firing of finished
// batches once, as any process may, and returns the callbacks it
// enqueued by batch id.
func FireBatchesForTest[TTx any](c *Client[TTx], limit int) (map[int64]int64, error) {
	return c.drv.FireBatches(context.Background(), limit, nil)
}

// PeriodicCatchUpForTest plays a process whose periodic loop stalled: the
// next slot of c's schedule name is set to from, and the loop's work at a
// wake at now is done (every slot from from up to now enqueued, in
// order). c must not be started.
func PeriodicCatchUpForTest[TTx any](c *Client[TTx], name string, from, now time.Time) error {
	for _, j := range c.periodic.jobs {
		if j.Name == name {
			j.next = from
			c.periodic.recorded = nil // the wake plays hours later: its read is stale
			c.periodicWake(context.Background(), []*periodicState{j}, now)
			return nil
		}
	}
	return fmt.Errorf("no periodic job %q", name)
}

// UniqueKeyForTest returns the unique key of a job of kind on queue with
// args (JSON) and options u, due now: tests use it to know in which order
// conveyor inserts keys.
func UniqueKeyForTest(kind, queue string, args []byte, u *UniqueOpts) ([]byte, error) {
	k, _, err := uniqueKey(kind, queue, args, time.Now(), u)
	return k, err
}

// CatchUpForTest plays c's periodic loop waking at now (its clock) with
// the periodic job name's next slot at from, as a process that stalled
// since from does, and returns the next slot it is left at.
func CatchUpForTest[TTx any](c *Client[TTx], name string, from, now time.Time) time.Time {
	for _, j := range c.periodic.jobs {
		if j.Name == name {
			j.next = from
			c.periodic.recorded = nil // the wake plays hours later: its read is stale
			c.periodicWake(context.Background(), []*periodicState{j}, now)
			return j.next
		}
	}
	panic("no periodic job " + name)
}

// PruneForTest runs the leader's prune once with the given age for both
// retentions and returns how many jobs it deleted.
func PruneForTest[TTx any](c *Client[TTx], age time.Duration) (int64, error) {
	return c.drv.Prune(context.Background(), age, age, 1000)
}

// LatestSlotForTest is the latest slot of sched in (after, now], which
// RunMissed enqueues at start.
func LatestSlotForTest(sched Schedule, after, now time.Time) time.Time {
	return latestSlot(sched, after, now)
}

// PeriodicWakeForTest runs c's periodic loop's work at a wake at now (its
// clock) from where the schedule name's slots stand, and returns the next
// slot it is left at. c must not be started.
func PeriodicWakeForTest[TTx any](c *Client[TTx], name string, now time.Time) time.Time {
	for _, j := range c.periodic.jobs {
		if j.Name == name {
			c.periodic.recorded = nil
			c.periodicWake(context.Background(), []*periodicState{j}, now)
			return j.next
		}
	}
	panic("no periodic job " + name)
}
