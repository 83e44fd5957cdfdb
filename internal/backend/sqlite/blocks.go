package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Its processes may lease a queue's concurrency slots in blocks.
var _ driver.SlotLeaser = (*Driver)(nil)

// LeaseSlots sets how many of each queue's concurrency slots owner holds
// (driver.SlotLeaser), in one BEGIN IMMEDIATE transaction on the lease
// path's own connection, which the application's handlers and this
// process's claims never hold: a block is renewed as a heartbeat is,
// without waiting for them, and committed in the driver's synchronous
// mode. The write lock is exclusive, so no claim starts a job and no
// other owner takes a slot between the count and the take.
//
// A block is 'b' rows of limit_slots, one per slot (migration 18). Per
// queue of want, in name order: the owner's slots but the lowest want[q]
// are given back (deleted), those below the queue's MaxRunning coming
// first, then those at or above a lowered one, which the owner's
// handlers may still run under; the rest are leased until ttl from the
// database's clock; then, while the owner holds fewer than want[q], it
// takes free slot numbers below MaxRunning for as many as the limit
// leaves: MaxRunning less the slots in use (the slots leased in blocks,
// every owner's, its own kept ones too, and the running jobs of the
// queue that no block's owner claimed). So under a lowered limit nothing
// is taken while as many slots as the limit are in use, and an owner
// never takes beyond MaxRunning. Usable is min(Held, MaxRunning less the
// slots in use by others), never below 0: Held unless the slots in use
// exceed a lowered limit, when the owner starts nothing until its
// handlers, or others', have ended enough of them. A queue without a
// MaxRunning gets none, its owner's slots given back. While owner holds
// a slot of a queue, every running job of the queue it claimed
// (attempted_by = owner), under the block or not, counts through the
// block, not by itself: an owner runs no more of them at once than it
// holds.
//
// Unlike a heartbeat it does not hold back the writes of other
// processes while it waits: a block renewed late costs its owner a
// pause in its starts, never a job run twice.
func (d *Driver) LeaseSlots(ctx context.Context, owner string, want map[string]int, ttl time.Duration) (map[string]driver.SlotBlock, error) {
	out := make(map[string]driver.SlotBlock, len(want))
	if len(want) == 0 {
		return out, nil
	}
	queues := make([]string, 0, len(want))
	for q := range want {
		queues = append(queues, q)
	}
	slices.Sort(queues)
	err := d.leaseRetry(ctx, false, func(conn *sql.Conn) error {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		clear(out)
		for _, q := range queues {
			b, err := d.leaseBlock(ctx, tx, owner, q, max(want[q], 0), ttl)
			if err != nil {
				return fmt.Errorf("queue %q: %w", q, err)
			}
			out[q] = b
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: lease slots for %s: %w", owner, err)
	}
	return out, nil
}

// leaseBlock is LeaseSlots for one queue, in its transaction tx.
func (d *Driver) leaseBlock(ctx context.Context, tx *sql.Tx, owner, queue string, want int, ttl time.Duration) (driver.SlotBlock, error) {
	var b driver.SlotBlock
	if _, err := tx.ExecContext(ctx, d.q.BlockGiveBack, queue, owner, want); err != nil {
		return b, fmt.Errorf("give back slots: %w", err)
	}
	res, err := tx.ExecContext(ctx, d.q.BlockRenew, queue, owner, us(ttl))
	if err != nil {
		return b, fmt.Errorf("renew slots: %w", err)
	}
	kept, err := res.RowsAffected()
	if err != nil {
		return b, fmt.Errorf("renew slots: %w", err)
	}
	b.Held = int(kept)
	var inUse int
	err = tx.QueryRowContext(ctx, d.q.BlockRoom, queue).Scan(&b.MaxRunning, &inUse)
	if errors.Is(err, sql.ErrNoRows) {
		return b, nil // no limits: block_give_back left nothing
	}
	if err != nil {
		return b, fmt.Errorf("count slots in use: %w", err)
	}
	// Others' slots in use: inUse counts the owner's kept slots as
	// block rows (and none of its running jobs, which count through
	// them). inUse >= b.Held, so what the limit leaves also keeps the
	// owner at or below MaxRunning.
	others := inUse - b.Held
	if n := min(want-b.Held, b.MaxRunning-inUse); n > 0 {
		res, err := tx.ExecContext(ctx, d.q.BlockTake, queue, owner, us(ttl), b.MaxRunning, n)
		if err != nil {
			return b, fmt.Errorf("take slots: %w", err)
		}
		taken, err := res.RowsAffected()
		if err != nil {
			return b, fmt.Errorf("take slots: %w", err)
		}
		b.Held += int(taken)
	}
	b.Usable = max(0, min(b.Held, b.MaxRunning-others))
	return b, nil
}
