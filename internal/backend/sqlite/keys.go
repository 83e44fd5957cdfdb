package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// keyCursors remembers, per queue, the last key this driver's previous
// keyed claim of the queue examined: the next claim walks the keys after
// it, so that keys are served in rotation. For a fair queue whose claim
// filled up during a key's turn before the key took its weight, it also
// remembers how many jobs the key took in that turn: the next claim goes
// on with that turn first.
type keyCursors struct {
	mu sync.Mutex
	m  map[string]keyCursor
}

// keyCursor is where a queue's next keyed claim starts: after key, or,
// when taken > 0, at key for the rest of its turn.
type keyCursor struct {
	key   string
	taken int
}

func (c *keyCursors) get(queue string) keyCursor {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[queue]
}

func (c *keyCursors) set(queue string, at keyCursor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]keyCursor{}
	}
	c.m[queue] = at
}

// keyPick is a job a keyed claim admits into slot n of its key (n < 0:
// the queue has no concurrency limit per key, no slot) and, under a rate
// per key, rate slot r (0 for none).
type keyPick struct {
	id  int64
	key string
	n   int64
	r   int64
}

// keyLimits are a queue's limits per key as a claim read them: max jobs
// of a key at once (0 for none), ordered keys, rate starts of a key per
// period microseconds (0 for none), and whether keys are served in turns
// of their weights (fair; weights nil: every key weighs 1).
type keyLimits struct {
	max     int
	ordered bool
	rate    int
	period  int64
	fair    bool
	weights map[string]int
}

// keyTurn is what a keyed claim read of one key, for the turns it gives
// the key: the key's candidates not picked yet, its free concurrency
// slots not used yet and how many more jobs they admit (capC), its rate
// slots (rOpen, of which usedR are used; capR of them open, seenR rows,
// rIn until its window has room once full), whether an ordered key's
// kept job is not due yet, and its weight.
type keyTurn struct {
	key       string
	cands     []int64
	free      []int64
	capC      int
	rOpen     []int64
	usedR     int
	capR      int
	seenR     int
	rIn       int64
	keptWaits bool
	w         int
}

// claimKeyed claims, in tx, up to k jobs with a key of p.Queue, a queue
// with limits per key kl, and reports whether due jobs with a key were
// left for want of a slot of their key or of room in its rate window
// and, when a window left some, how long until the earliest of those
// windows has room again. It walks the distinct keys of the queue's due
// jobs from the key after the queue's cursor, wrapping around once.
//
// Under a concurrency limit per key (kl.max, Ordered) it admits each
// key's jobs into its open slots, a missing slot row counting as a free
// slot (take_key_slots makes the rows the claim takes): a slot kept for
// a job admits only that job, when it is due; free slots admit the key's
// next due jobs by priority then id (ordered: its oldest due job, and
// none while a slot of the key is kept). Under a rate per key (kl.rate) it makes the key's missing rate
// slots it can use, and admits at most as many of the key's jobs as it
// has open rate slots (stamped at least a period ago, or never), a job
// kept for included; each admitted job stamps one. Without a concurrency
// limit per key, the rate alone bounds a key.
//
// A fair queue (kl.fair) admits at most a key's weight of its jobs per
// turn, within what the key's slots and window admit. Once the walk has
// given every key it examined its turn, the keys its weight alone cut
// get further turns, in walk order, each up to its weight per round,
// until the claim is full or none has more: they take from the jobs
// their first turn read (as many as the claim had room for), so the
// rounds read nothing. Fairness holds no job back: a key the weight cut
// is not held.
//
// It examines at most 4k+64 keys, so that its cost depends neither on
// the number of keys with no room nor on any key's depth. The jobs
// admitted are claimed together and each takes its slots.
func (d *Driver) claimKeyed(ctx context.Context, tx *sql.Tx, ls *limitStmts, p driver.ClaimParams, k int, kl keyLimits) ([]*driver.JobRow, bool, time.Duration, error) {
	nextKeys := tx.StmtContext(ctx, ls.nextKeys)
	openSlots := tx.StmtContext(ctx, ls.openKeySlots)
	keptDue := tx.StmtContext(ctx, ls.keptDue)
	keyJobs := tx.StmtContext(ctx, ls.keyJobs)
	if kl.ordered {
		keyJobs = tx.StmtContext(ctx, ls.keyJobsOrdered)
	}
	var addRate, rateSlots *sql.Stmt
	if kl.rate > 0 {
		addRate = tx.StmtContext(ctx, ls.addKeyRateSlots)
		rateSlots = tx.StmtContext(ctx, ls.keyRateSlots)
	}
	var picks []keyPick
	held := false
	var retryIn int64 // µs until the earliest full window a claim was cut by has room; 0: none
	rateHeld := func(in int64) {
		held = true
		if retryIn == 0 || in < retryIn {
			retryIn = in
		}
	}
	// admit gives t a turn of at most w of its candidates (w < 0: no
	// bound but its slots, its window and the claim's room) and reports
	// whether the bound w alone left some of them. Otherwise, when jobs
	// are left, it records what held them.
	admit := func(t *keyTurn, w int) bool {
		room := k - len(picks)
		limit := min(t.capC, room, t.capR-t.usedR, len(t.cands))
		n := limit
		if w >= 0 {
			n = min(n, w)
		}
		for i, id := range t.cands[:n] {
			pk := keyPick{id: id, key: t.key, n: -1}
			if kl.max > 0 {
				pk.n = t.free[i]
			}
			if kl.rate > 0 {
				pk.r = t.rOpen[t.usedR]
				t.usedR++
			}
			picks = append(picks, pk)
		}
		capC := t.capC
		t.cands = t.cands[n:]
		if kl.max > 0 {
			t.free = t.free[n:]
		}
		t.capC -= n
		switch {
		case len(t.cands) == 0:
			return false // none left
		case n < limit:
			return true // the weight left them: the key may have another turn
		}
		if kl.rate > 0 && t.usedR >= t.capR && t.seenR >= kl.rate {
			// The key's window, not the claim's room, left them.
			rateHeld(windowIn(t.rIn, t.usedR, kl.period))
		}
		if capC < room && !(kl.ordered && t.keptWaits) {
			// The key's limit, not the claim's room, left them. Not
			// when an ordered key waits for its kept job's retry: no
			// attempt's end frees that slot, the retry's promotion
			// does (and wakes claims), so claiming sooner is vain.
			held = true
		}
		return false
	}
	var more []*keyTurn // keys the weight alone cut, in walk order
	at := d.cursors.get(p.Queue)
	start := at.key
	cur, last := start, ""
	wrapped := start == ""
	// resume: the cursor's key, whose turn the previous claim left
	// unfinished (it took carried jobs of it), is examined first, when it
	// still has due jobs.
	resume, carried, lastTaken := false, 0, 0
	if kl.fair && at.taken > 0 && start != "" {
		ids, err := queryInts(ctx, keyJobs, p.Queue, start, 1)
		if err != nil {
			return nil, false, 0, err
		}
		resume = len(ids) > 0
	}
	// ahead: the keys after cur that the walk read and has not examined
	// yet, read a batch at a time (next_keys) since no job of the queue
	// changes until the claim's jobs are claimed. Under a limit of one
	// job per key without a rate, the batch carries each key's slot and
	// first two due jobs too (next_keys_heads), all the walk reads of it.
	var ahead []keyHead
	heads := kl.max == 1 && kl.rate == 0
	var nextHeads *sql.Stmt
	if heads {
		nextHeads = tx.StmtContext(ctx, ls.nextKeysHeads)
		if kl.ordered {
			nextHeads = tx.StmtContext(ctx, ls.nextKeysHeadsOrd)
		}
	}
	for examined := 0; examined < 4*k+64 && len(picks) < k; {
		var key string
		var err error
		resumed := false
		var pre *keyHead // the key's slot and first jobs, when the walk read them
		if resume {
			key, resume, resumed = start, false, true
		} else {
			if len(ahead) == 0 {
				// As many keys as the claim has room for, and a few
				// more for keys with no room.
				n := min(k-len(picks)+8, 4*k+64-examined)
				if heads {
					ahead, err = keyHeads(ctx, nextHeads, p.Queue, cur, n)
				} else {
					ahead, err = queryKeys(ctx, nextKeys, p.Queue, cur, n)
				}
				if err != nil {
					return nil, false, 0, err
				}
			}
			if len(ahead) == 0 {
				if wrapped {
					break
				}
				wrapped, cur = true, ""
				continue
			}
			key = ahead[0].key
			if heads {
				pre = &ahead[0]
			}
			ahead = ahead[1:]
			if wrapped && start != "" && (key > start || key == start && at.taken > 0 && kl.fair) {
				break // every key examined
			}
		}
		examined++
		cur, last, lastTaken, carried = key, key, 0, 0
		if resumed {
			carried = at.taken
		}
		room := k - len(picks)
		// capC: how many jobs the key's free concurrency slots admit.
		capC := room
		var free []int64
		var kept []keyPick
		if kl.max > 0 {
			var have []int64
			var heldAbove int
			var keptAbove []keyPick
			if pre != nil && pre.above {
				pre = nil // read the key's slots and jobs again, below
			}
			if pre != nil {
				free, kept, have = pre.slots()
			} else if free, kept, have, heldAbove, keptAbove, err = keySlots(ctx, openSlots, p.Queue, key, kl.max); err != nil {
				return nil, false, 0, err
			}
			if len(have) < kl.max && len(free) < room {
				// Some of the key's slots are missing, free: the lowest
				// of them, up to room in all, are open to the claim, and
				// take_key_slots makes those it takes, so that a limit
				// costs rows only as claims use them.
				free = missingSlots(free, have, kl.max, room)
			}
			// Slots at or above a lowered limit, held by attempts that
			// began under the higher one or kept for a job's retry,
			// still count against the key: each takes one of the free
			// slots out of the claim's reach (the highest first; fewer
			// than room were listed only when room was short, so this
			// never admits more than the limit). A kept one admits its
			// job on its own row once it has a free slot to count
			// against; until then it holds that job back, and in an
			// ordered queue the key with it.
			for range heldAbove {
				if len(free) > 0 {
					free = free[:len(free)-1]
				}
			}
			for _, kp := range keptAbove {
				if len(free) > 0 {
					free = free[:len(free)-1]
					kept = append(kept, kp)
				} else if kl.ordered {
					free = nil
				}
			}
			if len(free) == 0 && len(kept) == 0 {
				held = true // the key's due jobs wait for its slots
				continue
			}
			capC = len(free)
		}
		// Kept slots first: each admits its own job once it is due.
		var keptIDs []int64
		var dueKept []keyPick
		keptWaits := false // a kept slot's job is not due yet
		for _, kp := range kept {
			keptIDs = append(keptIDs, kp.id)
			var due bool
			if err := keptDue.QueryRowContext(ctx, kp.id).Scan(&due); err != nil {
				return nil, false, 0, err
			}
			keptWaits = keptWaits || !due
			if due {
				dueKept = append(dueKept, kp)
			}
		}
		if kl.ordered && len(kept) > 0 {
			free, capC = nil, 0 // the kept slot holds the key for its job
		}
		if len(dueKept) == 0 && capC == 0 {
			continue // an ordered key waiting for its kept job's retry
		}
		// The key's next jobs, one more than the free slots can take
		// (and the jobs kept slots are kept for, read past) to tell
		// whether some are left waiting.
		var ids []int64
		if pre != nil {
			// min(capC, room)+len(kept)+1 is 2 under a limit of one.
			ids = pre.ids
		} else if ids, err = queryInts(ctx, keyJobs, p.Queue, key, min(capC, room)+len(kept)+1); err != nil {
			return nil, false, 0, err
		}
		var cands []int64
		for _, id := range ids {
			if !slices.Contains(keptIDs, id) {
				cands = append(cands, id)
			}
		}
		// capR: how many starts the key's window admits; rOpen: its open
		// rate slots; rIn: until its window has room once full.
		capR := room
		var rOpen []int64
		var rIn int64
		var seenR int
		if need := min(room, len(dueKept)+min(capC, len(cands))); kl.rate > 0 && need > 0 {
			if rOpen, seenR, rIn, err = keyRateSlots(ctx, rateSlots, p.Queue, key, kl); err != nil {
				return nil, false, 0, err
			}
			if seenR < kl.rate && len(rOpen) < need {
				if _, err := addRate.ExecContext(ctx, p.Queue, key, min(kl.rate, seenR+need)); err != nil {
					return nil, false, 0, err
				}
				if rOpen, seenR, rIn, err = keyRateSlots(ctx, rateSlots, p.Queue, key, kl); err != nil {
					return nil, false, 0, err
				}
			}
			capR = len(rOpen)
			if capR == 0 {
				rateHeld(rIn) // the key's window is full
				continue
			}
		}
		usedR := 0
		before := len(picks)
		// full: the claim used every start of the key's window.
		full := func() bool { return kl.rate > 0 && usedR >= capR && seenR >= kl.rate }
		rate := func(pk keyPick) keyPick {
			if kl.rate > 0 {
				pk.r = rOpen[usedR]
				usedR++
			}
			return pk
		}
		for _, kp := range dueKept {
			switch {
			case len(picks) >= k:
			case full():
				rateHeld(windowIn(rIn, usedR, kl.period))
			case usedR >= capR:
			default:
				picks = append(picks, rate(kp))
			}
		}
		t := &keyTurn{key: key, cands: cands, free: free, capC: capC, rOpen: rOpen, usedR: usedR, capR: capR,
			seenR: seenR, rIn: rIn, keptWaits: keptWaits, w: -1}
		if kl.max == 0 {
			t.capC = math.MaxInt // only the claim's room bounds the key
		}
		if kl.rate == 0 {
			t.capR = math.MaxInt
		}
		turn := -1
		if kl.fair {
			t.w = driver.KeyWeight(kl.weights, key)
			// The jobs kept for count, and those the key took in the
			// previous claim's part of its turn.
			turn = max(t.w-carried-(len(picks)-before), 0)
		}
		if admit(t, turn) {
			more = append(more, t)
		}
		if took := len(picks) - before; kl.fair && len(picks) >= k && len(t.cands) > 0 && carried+took < t.w {
			// The claim filled up during the key's turn: the next
			// claim goes on with it.
			lastTaken = carried + took
		}
	}
	// Further rounds for the keys the weight cut, while the claim has
	// room: each round takes at least one job, so there are at most k.
	for len(more) > 0 && len(picks) < k {
		next := more[:0]
		for _, t := range more {
			if len(picks) < k && admit(t, t.w) {
				next = append(next, t)
			}
		}
		more = next
	}
	if last != "" {
		d.cursors.set(p.Queue, keyCursor{key: last, taken: lastTaken})
	}
	var in time.Duration
	if retryIn > 0 {
		// At least a millisecond, the clock's resolution, for a start
		// leaving the window now.
		in = max(time.Duration(retryIn)*time.Microsecond, time.Millisecond)
	}
	if len(picks) == 0 {
		return nil, held, in, nil
	}
	idList := make([]int64, len(picks))
	for i, pk := range picks {
		idList[i] = pk.id
	}
	b, err := json.Marshal(idList)
	if err != nil {
		return nil, false, 0, err
	}
	began := time.Now().Add(-time.Millisecond)
	rows, err := tx.StmtContext(ctx, ls.claimIDs).QueryContext(ctx, string(b), us(p.Lease), p.Worker)
	if err != nil {
		return nil, false, 0, err
	}
	out := make([]*driver.JobRow, 0, len(picks))
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			rows.Close()
			return nil, false, 0, err
		}
		j.LeaseFrom = began
		out = append(out, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, 0, err
	}
	var takeRate *sql.Stmt
	if kl.rate > 0 {
		takeRate = tx.StmtContext(ctx, ls.takeKeyRateSlot)
	}
	var takes [][]any // [key, slot, job id, fence, attempted_at] per slot taken
	for _, j := range out {
		i := slices.IndexFunc(picks, func(pk keyPick) bool { return pk.id == j.ID })
		if i < 0 {
			return nil, false, 0, errors.New("claimed a job no slot admitted")
		}
		pk := picks[i]
		if pk.n >= 0 {
			takes = append(takes, []any{j.Key, pk.n, j.ID, j.Fence, j.AttemptedAt.UnixMicro()})
		}
		if pk.r < 0 {
			if _, err := takeRate.ExecContext(ctx, p.Queue, j.Key, pk.r, j.AttemptedAt.UnixMicro()); err != nil {
				return nil, false, 0, err
			}
		}
	}
	if len(takes) > 0 {
		b, err := json.Marshal(takes)
		if err != nil {
			return nil, false, 0, err
		}
		if _, err := tx.StmtContext(ctx, ls.takeKeySlots).ExecContext(ctx, p.Queue, string(b)); err != nil {
			return nil, false, 0, err
		}
	}
	return out, held, in, nil
}

// missingSlots adds to free, the numbers of a key's free slots, the
// lowest numbers below keyMax that have no row (have: the numbers of its
// rows below keyMax, in order) until free holds room, and returns them in
// order.
func missingSlots(free, have []int64, keyMax, room int) []int64 {
	for n, i := int64(0), 0; n < int64(keyMax) && len(free) < room; n++ {
		if i < len(have) && have[i] == n {
			i++
			continue
		}
		free = append(free, n)
	}
	slices.Sort(free)
	return free
}

// windowIn is how long (µs) until a key's window has room again once a
// claim used used of its open rate slots: rIn, until the oldest stamp
// within the window leaves it (0 when none is within it), or at most a
// period for the stamps the claim makes.
func windowIn(rIn int64, used int, period int64) int64 {
	if rIn > 0 {
		return rIn
	}
	if used > 0 {
		return period
	}
	return rIn
}

// keyRateSlots reads key's rate slots within kl.rate with st
// (key_rate_slots): the numbers of the open ones (stamped at least a
// period ago, or never), how many rows there are, and how long (µs)
// until the oldest stamp within the period leaves it (0 when none is
// within it).
func keyRateSlots(ctx context.Context, st *sql.Stmt, queue, key string, kl keyLimits) (open []int64, seen int, in int64, err error) {
	rows, err := st.QueryContext(ctx, queue, key, kl.rate)
	if err != nil {
		return nil, 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var n, usedAt, now int64
		if err := rows.Scan(&n, &usedAt, &now); err != nil {
			return nil, 0, 0, err
		}
		seen++
		if usedAt <= now-kl.period {
			open = append(open, n)
			continue
		}
		if left := usedAt + kl.period - now; in == 0 || left < in {
			in = left
		}
	}
	return open, seen, in, rows.Err()
}

// keySlots reads key's slots with st (open_key_slots): below keyMax, the
// numbers of the free ones, the kept ones with their job, and the numbers
// of every row, in order; at or above keyMax (rows left from a higher
// limit), how many are held by a running attempt (held) and the kept ones
// (keptAbove).
func keySlots(ctx context.Context, st *sql.Stmt, queue, key string, keyMax int) (free []int64, kept []keyPick, have []int64, held int, keptAbove []keyPick, err error) {
	rows, err := st.QueryContext(ctx, queue, key, keyMax)
	if err != nil {
		return nil, nil, nil, 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var job sql.NullInt64
		var open, below bool
		if err := rows.Scan(&n, &job, &open, &below); err != nil {
			return nil, nil, nil, 0, nil, err
		}
		if !below {
			switch {
			case !open:
				held++
			case job.Valid:
				keptAbove = append(keptAbove, keyPick{id: job.Int64, key: key, n: n})
			}
			continue
		}
		have = append(have, n)
		switch {
		case !open:
		case job.Valid:
			kept = append(kept, keyPick{id: job.Int64, key: key, n: n})
		default:
			free = append(free, n)
		}
	}
	return free, kept, have, held, keptAbove, rows.Err()
}

// keyHead is a key the walk read, with, under a limit of one job per
// key (next_keys_heads), its slot 0 (n invalid: no row; job and open as
// open_key_slots reads them), its first two due jobs, and whether a slot
// above 0 is held or kept (above: the claim reads the key's slots again
// with open_key_slots).
type keyHead struct {
	key   string
	n     sql.NullInt64
	job   sql.NullInt64
	open  bool
	ids   []int64
	above bool
}

// slots is keySlots of h's slot.
func (h *keyHead) slots() (free []int64, kept []keyPick, have []int64) {
	if !h.n.Valid {
		return nil, nil, nil
	}
	have = []int64{h.n.Int64}
	switch {
	case !h.open:
	case h.job.Valid:
		kept = []keyPick{{id: h.job.Int64, key: h.key, n: h.n.Int64}}
	default:
		free = []int64{h.n.Int64}
	}
	return free, kept, have
}

// queryKeys runs st (next_keys), a query returning keys.
func queryKeys(ctx context.Context, st *sql.Stmt, args ...any) ([]keyHead, error) {
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []keyHead
	for rows.Next() {
		var h keyHead
		if err := rows.Scan(&h.key); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// keyHeads runs st (next_keys_heads or next_keys_heads_ordered).
func keyHeads(ctx context.Context, st *sql.Stmt, args ...any) ([]keyHead, error) {
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []keyHead
	for rows.Next() {
		var h keyHead
		var open sql.NullBool
		var id1, id2 sql.NullInt64
		if err := rows.Scan(&h.key, &h.n, &h.job, &open, &id1, &id2, &h.above); err != nil {
			return nil, err
		}
		h.open = open.Bool
		for _, id := range []sql.NullInt64{id1, id2} {
			if id.Valid {
				h.ids = append(h.ids, id.Int64)
			}
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// queryInts runs st, a query returning integers.
func queryInts(ctx context.Context, st *sql.Stmt, args ...any) ([]int64, error) {
	return slotNumbers(ctx, st, args...)
}
