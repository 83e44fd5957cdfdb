package mysql

import (
	"context"
	"database/sql"
	"maps"
	"slices"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Slot blocks (driver.SlotLeaser). A queue's concurrency slot (limits.go)
// is free, held by an attempt (job_id, fence), or leased to an owner, a
// process's worker id, until leased_until by the database's clock
// (migrations/018_slot_blocks.sql), never two of these: per-attempt
// claims and LeaseSlots both take free slots only, and a leased slot
// counts as held wherever held slots are counted (LimitUsage, the slots
// held at or beyond a lowered limit). The owner's claims take no slot
// (ClaimParams.Blocked, see claimLimits) and the ends of their attempts
// free none: nothing of the limit is written per job. A slot stays leased
// until its owner gives it back (a LeaseSlots that wants fewer) or the
// rescue does, once the lease expired and no job of the queue runs under
// a claim of the owner (freeExpiredBlocks). A lowered limit takes no slot
// from its owner, whose handlers may still run under it: the owner keeps
// the slots it asks for, at or beyond the limit too, and may use only
// what the limit leaves beside the slots of the attempts and the other
// owners (SlotBlock.Usable); SetQueueLimits and the rescue's trim delete
// a slot beyond a lowered limit only once no owner holds it.

var _ driver.SlotLeaser = (*Driver)(nil)

// LeaseSlots sets how many of each queue's concurrency slots owner holds,
// for each queue of want (see driver.SlotLeaser), in one transaction on
// the lease path's pool, queue by queue in name order (leaseQueue; see
// lease_limit in queries.sql for the statements and their locks), run
// again whole on a deadlock, a lock wait timeout or a Galera
// certification failure. The calls of one owner are expected one at a
// time, as its process's leaser makes them: two at once would each count
// only the slots it kept or took.
func (d *Driver) LeaseSlots(ctx context.Context, owner string, want map[string]int, ttl time.Duration) (map[string]driver.SlotBlock, error) {
	queues := slices.Sorted(maps.Keys(want))
	out := make(map[string]driver.SlotBlock, len(want))
	err := d.inTxOn(ctx, d.lease, "lease slots", func(tx *sql.Tx) error {
		for _, q := range queues {
			b, err := d.leaseQueue(ctx, tx, owner, q, max(want[q], 0), micros(ttl))
			if err != nil {
				return err
			}
			out[q] = b
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// leaseQueue is LeaseSlots for queue, in its transaction tx: it reads the
// queue's MaxRunning (lease_limit) and the owner's slots (lease_read),
// keeps the owner's lowest want slots (those below the limit, then those
// at or beyond a lowered one, which its handlers may still run under;
// none without a limit) and gives back the others (lease_give_back),
// renews those it keeps (lease_renew), and takes free ones below the
// limit until the owner holds min(want, MaxRunning) (leaseFree), unless
// a slot at or beyond the limit is held by an attempt or another owner
// (a lowered limit). Last, after the writes, it reads the slots held by
// the attempts and the other owners (lease_others) for Usable.
func (d *Driver) leaseQueue(ctx context.Context, tx *sql.Tx, owner, queue string, want int, ttlUS int64) (driver.SlotBlock, error) {
	var maxRunning sql.NullInt64
	if err := tx.QueryRowContext(ctx, d.q.LeaseLimit, queue).Scan(&maxRunning); err != nil && err != sql.ErrNoRows {
		return driver.SlotBlock{}, err
	}
	limit := int(max(maxRunning.Int64, 0))
	mine, lowered, err := d.leaseRead(ctx, tx, owner, queue, limit)
	if err != nil {
		return driver.SlotBlock{}, err
	}
	keep := 0
	if limit > 0 {
		keep = min(len(mine), want)
	}
	if keep < len(mine) {
		if _, err := d.lease.exec(ctx, tx, true, d.q.LeaseGiveBack, queue, owner, mine[keep]); err != nil {
			return driver.SlotBlock{}, err
		}
	}
	kept := 0
	if keep > 0 {
		res, err := d.lease.exec(ctx, tx, true, d.q.LeaseRenew, ttlUS, queue, owner)
		if err != nil {
			return driver.SlotBlock{}, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return driver.SlotBlock{}, err
		}
		kept = int(n)
	}
	taken := 0
	if k := min(want, limit) - kept; k > 0 && !lowered {
		if taken, err = d.leaseFree(ctx, tx, owner, queue, limit, k, ttlUS); err != nil {
			return driver.SlotBlock{}, err
		}
	}
	b := driver.SlotBlock{Held: kept + taken, MaxRunning: limit}
	if b.Held > 0 {
		others, err := d.slotNumbers(ctx, d.lease, tx, d.q.LeaseOthers, queue, owner)
		if err != nil {
			return driver.SlotBlock{}, err
		}
		b.Usable = max(min(b.Held, limit-len(others)), 0)
	}
	return b, nil
}

// leaseRead reads (lease_read, in tx) the slots of queue that owner
// holds, in slot order (those below limit first), and whether an attempt
// or another owner holds one at or beyond limit.
func (d *Driver) leaseRead(ctx context.Context, tx *sql.Tx, owner, queue string, limit int) (mine []int64, lowered bool, err error) {
	rows, err := d.lease.query(ctx, tx, true, d.q.LeaseRead, owner, queue, owner, int64(limit))
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var own bool
		if err := rows.Scan(&n, &own); err != nil {
			return nil, false, err
		}
		if own {
			mine = append(mine, n)
		} else {
			lowered = true
		}
	}
	return mine, lowered, rows.Err()
}

// leaseFree leases to owner, in tx, up to k free slots of queue below
// limit, the lowest first, and returns how many it took: locked with
// SKIP LOCKED as a skip-locked claim locks them (slot_lock_c), then
// leased (lease_take); on the optimistic strategy, leased by one
// conditional UPDATE (lease_take_free), as an optimistic claim reserves
// them.
func (d *Driver) leaseFree(ctx context.Context, tx *sql.Tx, owner, queue string, limit, k int, ttlUS int64) (int, error) {
	if d.claimMethod == ClaimOptimistic {
		res, err := d.lease.exec(ctx, tx, true, d.q.LeaseTakeFree, owner, ttlUS, queue, int64(limit), int64(k))
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		return int(n), err
	}
	free, err := d.slotNumbers(ctx, d.lease, tx, d.q.SlotLockC, queue, int64(limit), int64(k))
	if err != nil || len(free) == 0 {
		return 0, err
	}
	q, args, _ := d.inList(d.q.LeaseTake, free, owner, ttlUS, queue)
	if err := d.execTake(ctx, d.lease, tx, q, args, len(free), "leased", "free slots"); err != nil {
		return 0, err
	}
	return len(free), nil
}

// freeExpiredBlocks is the rescue's giving back of the blocks whose
// lease expired: it reads up to limit expired slots, oldest lease first
// (block_expired), and gives back each owner's expired slots of each
// queue among them in a statement of its own (block_free), which keeps
// them while a job of the queue runs under a claim of the owner and
// re-checks each slot's lease on its latest version. MySQL has no
// channel to wake other processes' claims: they find the slots free at
// their next claim or lease.
func (d *Driver) freeExpiredBlocks(ctx context.Context, limit int) error {
	type block struct{ queue, owner string }
	var expired []block
	seen := map[block]bool{}
	err := d.retry(ctx, "rescue: expired blocks", func() error {
		expired = expired[:0]
		clear(seen)
		rows, err := d.query(ctx, nil, true, d.q.BlockExpired, int64(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b block
			if err := rows.Scan(&b.queue, &b.owner); err != nil {
				return err
			}
			if !seen[b] {
				seen[b] = true
				expired = append(expired, b)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return err
	}
	for _, b := range expired {
		if _, err := d.execCount(ctx, d.main, "rescue: free expired block", true, d.q.BlockFree, []any{b.queue, b.owner, b.queue, b.owner}); err != nil {
			return err
		}
	}
	return nil
}
