package postgres

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Blocks of a queue's concurrency slots (driver.SlotLeaser): a slot of
// {p}limit_slots ('c') is free, held by an attempt (job_id, fence), or
// leased to an owner until owner_until (migration 20). A process leases
// the slots it runs its attempts under in one transaction, renews them
// with its heartbeats and gives them back when it idles or stops; its
// claims take no slot and its outcomes free none. Rescue's sweep
// (seg_sweep_slots) gives back the slots of an owner whose lease expired
// and who has no job of the queue running.

// LeaseSlots sets how many of each queue's concurrency slots owner holds
// (see driver.SlotLeaser), in one transaction on the lease path's pool,
// committed durably (the server's synchronous_commit: a block lost in a
// crash while its owner runs attempts under it would let another process
// take its slots): the queues' limits and the owner's slots (locked) with
// BEGIN, the free slots it takes (SKIP LOCKED) in a second round trip
// when it needs more, and the writes, the count of the slots others use
// (for Usable) and COMMIT in a third; the writes fail, and make it run
// again, if a limit changed after it was read. Deadlocks with the
// sweep or a lowered limit, which lock owned slots too, are run again.
func (d *Driver) LeaseSlots(ctx context.Context, owner string, want map[string]int, ttl time.Duration) (map[string]driver.SlotBlock, error) {
	queues := make([]string, 0, len(want))
	for q := range want {
		queues = append(queues, q)
	}
	slices.Sort(queues)
	var out map[string]driver.SlotBlock
	err := d.retryable(ctx, func() error {
		for range limitRounds {
			var changed bool
			var err error
			out, changed, err = d.leaseSlots(ctx, owner, queues, want, ttl)
			if err != nil || !changed {
				return err
			}
		}
		return errors.New("the queues' limits changed while their slots were leased, every time")
	})
	return out, d.wrap("lease slots", err)
}

// leaseSlots is one transaction of LeaseSlots; changed says that a
// queue's MaxRunning changed after it was read (rolled back: run it
// again).
func (d *Driver) leaseSlots(ctx context.Context, owner string, queues []string, want map[string]int, ttl time.Duration) (out map[string]driver.SlotBlock, changed bool, err error) {
	q := &d.q
	conn, err := d.lease.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		conn.Release()
	}()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(q.LeaseLimits, queues)
	b.Queue(q.LeaseMine, owner, queues)
	br := conn.SendBatch(ctx, b)
	maxRun := make(map[string]int, len(queues))
	mine := map[string][]int32{}
	_, err = br.Exec()
	if err == nil {
		var name string
		var mr int
		_, err = pgx.ForEachRow(mustRows(br.Query()), []any{&name, &mr}, func() error {
			maxRun[name] = mr
			return nil
		})
	}
	if err == nil {
		var name string
		var n int32
		_, err = pgx.ForEachRow(mustRows(br.Query()), []any{&name, &n}, func() error {
			mine[name] = append(mine[name], n)
			return nil
		})
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, err
	}

	// Keep the owner's slots up to want, the lowest below the limit
	// first, then those above a lowered one (its handlers may still run
	// under them); give the others back; take free ones for the rest.
	var keepQ, giveQ []string
	var keepN, giveN []int32
	held := make(map[string]int, len(queues))
	b = &pgx.Batch{}
	var takers []string
	for _, qu := range queues {
		mr, w := maxRun[qu], max(want[qu], 0)
		if mr == 0 {
			w = 0 // no limit: nothing to hold
		}
		for _, above := range []bool{false, true} {
			for _, n := range mine[qu] { // in number order
				if (int(n) >= mr) != above {
					continue
				}
				if held[qu] < w {
					keepQ, keepN = append(keepQ, qu), append(keepN, n)
					held[qu]++
				} else {
					giveQ, giveN = append(giveQ, qu), append(giveN, n)
				}
			}
		}
		if need := min(w, mr) - held[qu]; need > 0 {
			b.Queue(q.LeaseTake, qu, mr, need, owner)
			takers = append(takers, qu)
		}
	}
	if len(takers) > 0 {
		br = conn.SendBatch(ctx, b)
		for _, qu := range takers {
			var n int32
			_, err = pgx.ForEachRow(mustRows(br.Query()), []any{&n}, func() error {
				keepQ, keepN = append(keepQ, qu), append(keepN, n)
				held[qu]++
				return nil
			})
			if err != nil {
				break
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, false, err
		}
	}
	mrs := make([]int32, len(queues))
	for i, qu := range queues {
		mrs[i] = int32(maxRun[qu])
	}
	b = &pgx.Batch{}
	b.Queue(q.LeaseSet, owner, keepQ, keepN, micros(ttl), giveQ, giveN, queues, mrs)
	b.Queue(q.LeaseOthers, owner, queues)
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	var one int
	others := make(map[string]int, len(queues))
	err = br.QueryRow().Scan(&one)
	if err == nil {
		var name string
		var n int
		_, err = pgx.ForEachRow(mustRows(br.Query()), []any{&name, &n}, func() error {
			others[name] = n
			return nil
		})
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if limitsChanged(err) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	committed = true
	out = make(map[string]driver.SlotBlock, len(queues))
	for _, qu := range queues {
		usable := max(0, min(held[qu], maxRun[qu]-others[qu]))
		out[qu] = driver.SlotBlock{Held: held[qu], Usable: usable, MaxRunning: maxRun[qu]}
	}
	return out, false, nil
}

// mustRows is rows from a batch's Query, whose error the rows carry too:
// pgx.ForEachRow reports it.
func mustRows(rows pgx.Rows, _ error) pgx.Rows { return rows }
