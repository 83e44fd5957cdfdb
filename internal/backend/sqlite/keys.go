package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keyCursors remembers, per queue, the last key this driver's previous
// keyed claim of the queue examined: the next claim walks the keys after
// it, so that keys are served in rotation.
type keyCursors struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *keyCursors) get(queue string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[queue]
}

func (c *keyCursors) set(queue, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]string{}
	}
	c.m[queue] = key
}

// keyPick is a job a keyed claim admits into slot n of its key.
type keyPick struct {
	id  int64
	key string
	n   int64
}

// claimKeyed claims, in tx, up to k jobs with a key of p.Queue, a queue
// whose keys may each run keyMax jobs at once (one at a time in id order
// when ordered), and reports whether due jobs with a key were left for
// want of a slot of their key. It walks the distinct keys of the queue's
// due jobs from the key after the queue's cursor, wrapping around once,
// and for each key makes the missing slot rows it can use and admits
// jobs into its open slots: a slot kept for a job admits only that job,
// when it is due; free slots admit the key's next due jobs by priority
// then id (ordered: its oldest due job, and none while a slot of the key
// is kept). It
// examines at most 4k+64 keys, so that its cost depends neither on the
// number of keys with no room nor on any key's depth. The jobs admitted
// are claimed together and each takes its slot.
func (d *Driver) claimKeyed(ctx context.Context, tx *sql.Tx, ls *limitStmts, p driver.ClaimParams, k, keyMax int, ordered bool) ([]*driver.JobRow, bool, error) {
	nextKey := tx.StmtContext(ctx, ls.nextKey)
	addSlots := tx.StmtContext(ctx, ls.addKeySlots)
	openSlots := tx.StmtContext(ctx, ls.openKeySlots)
	keptDue := tx.StmtContext(ctx, ls.keptDue)
	keyJobs := tx.StmtContext(ctx, ls.keyJobs)
	if ordered {
		keyJobs = tx.StmtContext(ctx, ls.keyJobsOrdered)
	}
	var picks []keyPick
	held := false
	start := d.cursors.get(p.Queue)
	cur, last := start, ""
	wrapped := start == ""
	for examined := 0; examined < 4*k+64 && len(picks) < k; {
		var key string
		err := nextKey.QueryRowContext(ctx, p.Queue, cur).Scan(&key)
		if errors.Is(err, sql.ErrNoRows) {
			if wrapped {
				break
			}
			wrapped, cur = true, ""
			continue
		}
		if err != nil {
			return nil, false, err
		}
		if wrapped && start != "" && key > start {
			break // every key examined
		}
		examined++
		cur, last = key, key
		free, kept, seen, err := keySlots(ctx, openSlots, p.Queue, key, keyMax)
		if err != nil {
			return nil, false, err
		}
		if room := k - len(picks); seen < keyMax && len(free) < room {
			// Some of the key's slots are missing: make those below
			// seen+room that are, at least room-len(free) more free
			// slots (all the key's slots when its limit is small),
			// so that a large limit costs rows only as claims use them.
			if _, err := addSlots.ExecContext(ctx, p.Queue, key, min(keyMax, seen+room)); err != nil {
				return nil, false, err
			}
			if free, kept, _, err = keySlots(ctx, openSlots, p.Queue, key, keyMax); err != nil {
				return nil, false, err
			}
		}
		if len(free) == 0 && len(kept) == 0 {
			held = true // the key's due jobs wait for its slots
			continue
		}
		// Kept slots first: each admits its own job once it is due.
		var keptIDs []int64
		keptWaits := false // a kept slot's job is not due yet
		for _, kp := range kept {
			keptIDs = append(keptIDs, kp.id)
			var due bool
			if err := keptDue.QueryRowContext(ctx, kp.id).Scan(&due); err != nil {
				return nil, false, err
			}
			keptWaits = keptWaits || !due
			if due && len(picks) < k {
				picks = append(picks, kp)
			}
		}
		if ordered && len(kept) > 0 {
			free = nil // the kept slot holds the key for its job
		}
		// The key's next jobs, one more than the free slots can take
		// (and the jobs kept slots are kept for, read past) to tell
		// whether some are left waiting.
		room := k - len(picks)
		take := min(len(free), room)
		ids, err := queryInts(ctx, keyJobs, p.Queue, key, take+len(kept)+1)
		if err != nil {
			return nil, false, err
		}
		taken, left := 0, false
		for _, id := range ids {
			if slices.Contains(keptIDs, id) {
				continue
			}
			if taken < take {
				picks = append(picks, keyPick{id: id, key: key, n: free[taken]})
				taken++
				continue
			}
			left = true
		}
		if left && len(free) < room && !(ordered && keptWaits) {
			// The key's limit, not the claim's room, left them. Not
			// when an ordered key waits for its kept job's retry: no
			// attempt's end frees that slot, the retry's promotion
			// does (and wakes claims), so claiming sooner is vain.
			held = true
		}
	}
	if last != "" {
		d.cursors.set(p.Queue, last)
	}
	if len(picks) == 0 {
		return nil, held, nil
	}
	idList := make([]int64, len(picks))
	for i, pk := range picks {
		idList[i] = pk.id
	}
	b, err := json.Marshal(idList)
	if err != nil {
		return nil, false, err
	}
	began := time.Now().Add(-time.Millisecond)
	rows, err := tx.StmtContext(ctx, ls.claimIDs).QueryContext(ctx, string(b), us(p.Lease), p.Worker)
	if err != nil {
		return nil, false, err
	}
	out := make([]*driver.JobRow, 0, len(picks))
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			rows.Close()
			return nil, false, err
		}
		j.LeaseFrom = began
		out = append(out, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	take := tx.StmtContext(ctx, ls.takeKeySlot)
	for _, j := range out {
		var slot int64 = -1
		for _, pk := range picks {
			if pk.id == j.ID {
				slot = pk.n
				break
			}
		}
		if _, err := take.ExecContext(ctx, p.Queue, j.Key, slot, j.ID, j.Fence, j.AttemptedAt.UnixMicro()); err != nil {
			return nil, false, err
		}
	}
	return out, held, nil
}

// keySlots reads key's slots below keyMax with st (open_key_slots): the
// numbers of the free ones, the kept ones with their job, and how many
// rows there are.
func keySlots(ctx context.Context, st *sql.Stmt, queue, key string, keyMax int) (free []int64, kept []keyPick, seen int, err error) {
	rows, err := st.QueryContext(ctx, queue, key, keyMax)
	if err != nil {
		return nil, nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var job sql.NullInt64
		var open bool
		if err := rows.Scan(&n, &job, &open); err != nil {
			return nil, nil, 0, err
		}
		seen++
		switch {
		case !open:
		case job.Valid:
			kept = append(kept, keyPick{id: job.Int64, key: key, n: n})
		default:
			free = append(free, n)
		}
	}
	return free, kept, seen, rows.Err()
}

// queryInts runs st, a query returning integers.
func queryInts(ctx context.Context, st *sql.Stmt, args ...any) ([]int64, error) {
	return slotNumbers(ctx, st, args...)
}
