package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Key limits (QueueLimits.KeyMaxRunning, Ordered). A job's key is its
// lkey column; a queue's key limits are the key_max_running and key_order
// columns of its queues row; the slots that enforce them are rows of
// limit_slots of type 'k', one per key and unit of the limit (lkey, n),
// made by claims when first needed (migrations/013_keys.sql). A limited
// claim of a key-limited queue walks the queue's keys in rotation
// (walkKeys, before its transaction, with the missing slots made in a
// statement of their own), then in its transaction locks the open slots
// of the keys it found, claims the keys' next jobs into them and takes
// them (claimKeyedTx), and claims the jobs without a key after them. The
// statements that end an attempt free its key slot as they free its
// concurrency slot (by job and fence), or keep it for the job (see
// complete_freeing in queries.sql).

// Values of the queues.key_order column.
const (
	keyUnordered     = 0
	keyOrdered       = 1
	keyOrderedMoveOn = 2
)

// maxKeyMaxRunning bounds QueueLimits.KeyMaxRunning.
const maxKeyMaxRunning = 100000

// checkKeyLimits refuses key limits the database cannot hold.
func checkKeyLimits(l driver.QueueLimits) error {
	switch {
	case l.KeyMaxRunning < 0 || l.KeyMaxRunning > maxKeyMaxRunning:
		return fmt.Errorf("KeyMaxRunning %d is not within 0 to %d", l.KeyMaxRunning, maxKeyMaxRunning)
	case l.Ordered && l.KeyMaxRunning > 1:
		return fmt.Errorf("an Ordered queue runs one job per key: KeyMaxRunning must be 0 or 1, not %d", l.KeyMaxRunning)
	case l.OrderedMoveOn && !l.Ordered:
		return errors.New("OrderedMoveOn needs Ordered")
	}
	return nil
}

// keyColumns returns the key_max_running and key_order values stored for
// l (NULL for none); an Ordered queue stores a limit of 1.
func keyColumns(l driver.QueueLimits) (keyMax, keyOrder any) {
	switch {
	case l.Ordered && l.OrderedMoveOn:
		return int64(1), int64(keyOrderedMoveOn)
	case l.Ordered:
		return int64(1), int64(keyOrdered)
	case l.KeyMaxRunning > 0:
		return int64(l.KeyMaxRunning), int64(keyUnordered)
	}
	return nil, nil
}

// keyCursor is, per queue, the last key this driver's previous claim of
// the queue examined: the next claim's walk starts after it.
type keyCursor struct {
	mu  sync.Mutex
	key string
}

func (d *Driver) keyCursor(queue string) *keyCursor {
	c, _ := d.keyCursors.LoadOrStore(queue, &keyCursor{})
	return c.(*keyCursor)
}

// lookForKeyless reports whether a limited claim of key-limited queue
// looks for jobs without a key: not for cursorFor after one of this
// driver's claims of the queue found none. claim_select_nokey reads the
// claim index in claim order and skips the keyed jobs it meets, so in a
// queue whose available jobs all have a key (the usual key-limited queue)
// it reads every one of them to find nothing; after such a claim a job
// without a key waits at most cursorFor longer, as a job behind the claim
// cursor does (see claimCursor).
func (d *Driver) lookForKeyless(queue string) bool {
	v, ok := d.noKeyless.Load(queue)
	return !ok || time.Now().UnixNano() >= v.(*atomic.Int64).Load()
}

// noKeylessSeen records that a claim of queue found no job without a key.
func (d *Driver) noKeylessSeen(queue string) {
	v, _ := d.noKeyless.LoadOrStore(queue, new(atomic.Int64))
	v.(*atomic.Int64).Store(time.Now().Add(cursorFor).UnixNano())
}

// keyWalk is what a claim's walk of keys found: the candidate keys (with
// room below the limit, as a plain read saw them) in rotation order, how
// many free slots each may take (the limit less the attempts holding or
// kept in any of its slots: a read before the claim's transaction, which
// can only have seen more of them than there are), and whether a key with
// due jobs had no room.
type keyWalk struct {
	keys []string
	free map[string]int
	held bool
}

// keyStats is a key's slots as key_slot_stats read them: the rows below
// the limit, and the held and kept slots at any n.
type keyStats struct {
	rows, held, kept int
}

// walkKeys walks the distinct keys of queue's available keyed jobs in key
// order from the key after the queue's cursor, wrapping around to the
// start once, until it has want keys with room or has examined
// 4*want+64 keys; it makes the candidate keys' missing slots (enough for
// want attempts each, within the limit) and moves the cursor to the last
// key examined.
func (d *Driver) walkKeys(ctx context.Context, queue string, l driver.QueueLimits, want int) (*keyWalk, error) {
	limit := l.KeyMaxRunning
	cur := d.keyCursor(queue)
	cur.mu.Lock()
	start := cur.key
	cur.mu.Unlock()
	maxExamine := 4*want + 64
	kw := &keyWalk{free: map[string]int{}}
	stats := map[string]keyStats{}
	examined := 0
	last := start
	after, wrapped := start, start == ""
	for examined < maxExamine && len(kw.keys) < want {
		var upto *string
		if wrapped && start != "" {
			upto = &start
		}
		// As many keys as the claim still wants: the walk reads no
		// further than the keys it takes, unless some have no room.
		chunk := min(want-len(kw.keys), maxExamine-examined)
		keys, err := d.readKeys(ctx, queue, after, upto, chunk)
		if err != nil {
			return nil, err
		}
		if len(keys) > 0 {
			st, err := d.keySlotStats(ctx, queue, limit, keys)
			if err != nil {
				return nil, err
			}
			for _, k := range keys {
				examined++
				last = k
				s := st[k]
				if s.held >= limit {
					kw.held = true
				} else {
					kw.keys = append(kw.keys, k)
					kw.free[k] = max(limit-s.held-s.kept, 0)
					stats[k] = s
				}
			}
			after = keys[len(keys)-1]
		}
		if len(keys) < chunk {
			if wrapped {
				break
			}
			wrapped, after = true, ""
		}
	}
	cur.mu.Lock()
	cur.key = last
	cur.mu.Unlock()
	return kw, d.makeKeySlots(ctx, queue, limit, want, kw.keys, stats)
}

// readKeys returns up to n keys of queue's available keyed jobs after
// after (and up to *upto when upto is not nil), in key order: windows of
// key_idx of at most 2n+16 entries each (key_walk, key_walk_upto), each
// from a seek past the last key the previous one found, until it has n
// keys or a window ends before its size. Keys the column's collation
// holds equal (utf8mb4_bin pads with spaces: "a" and "a ") are one key,
// found as the first of them in the index.
func (d *Driver) readKeys(ctx context.Context, queue, after string, upto *string, n int) ([]string, error) {
	var keys []string
	for len(keys) < n {
		size := 2*(n-len(keys)) + 16
		q, args := d.q.KeyWalk, []any{queue, after}
		if upto != nil {
			q, args = d.q.KeyWalkUpto, append(args, *upto)
		}
		args = append(args, int64(size))
		var got []string
		read := 0
		err := d.retry(ctx, "claim limited: walk keys", func() error {
			got, read = got[:0], 0
			rows, err := d.query(ctx, nil, true, q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return err
				}
				read++
				if len(got) == 0 || strings.TrimRight(got[len(got)-1], " ") != strings.TrimRight(k, " ") {
					got = append(got, k)
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		keys = append(keys, got[:min(len(got), n-len(keys))]...)
		if read < size {
			break // no more keys in the range
		}
		after = got[len(got)-1]
	}
	return keys, nil
}

// keySlotStats reads the slots below limit of queue's keys.
func (d *Driver) keySlotStats(ctx context.Context, queue string, limit int, keys []string) (map[string]keyStats, error) {
	out := map[string]keyStats{}
	q := strings.Replace(d.q.KeySlotStats, "{keys}", placeholders(len(keys)), 1)
	args := make([]any, 0, len(keys)+2)
	args = append(args, int64(limit), queue)
	for _, k := range keys {
		args = append(args, k)
	}
	err := d.retry(ctx, "claim limited: key slots", func() error {
		clear(out)
		rows, err := d.query(ctx, nil, false, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			var s keyStats
			if err := rows.Scan(&k, &s.rows, &s.held, &s.kept); err != nil {
				return err
			}
			out[k] = s
		}
		return rows.Err()
	})
	return out, err
}

// makeKeySlots inserts, in key order and in statements of their own, the
// slots n < min(limit, used+want) of each key that has fewer rows below
// the limit than that (as stats read them; used is its held and kept
// slots): among them at least want are free, or every slot below the
// limit that no attempt uses.
func (d *Driver) makeKeySlots(ctx context.Context, queue string, limit, want int, keys []string, stats map[string]keyStats) error {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	var args []any
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		q := d.rowsSQL(d.q.KeySlotInsert, d.q.KeySlotInsertRow, "", len(args)/3)
		err := d.retry(ctx, "claim limited: make key slots", func() error {
			_, err := d.exec(ctx, nil, false, q, args...)
			return err
		})
		args = args[:0]
		return err
	}
	for _, k := range sorted {
		s := stats[k]
		used := s.held + s.kept
		need := min(limit, used+want)
		if s.rows >= need {
			continue
		}
		for n := 0; n < need; n++ {
			args = append(args, queue, k, int64(n))
			if len(args) >= 3*slotInsertChunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// keySlot is a key slot locked by a claim: free, or kept for job.
type keySlot struct {
	n   int64
	job int64
}

// claimKeyedTx claims, in the limited claim's transaction tx, up to k
// keyed jobs of the walk's keys: it locks the keys' open slots (key by
// key in key order, skipping those other claims hold, in one statement),
// reads the next jobs of the keys with free slots (in one statement),
// picks in rotation order for each key the job its kept slot is kept
// for, or else the key's next jobs for its free slots (Ordered: its
// oldest job only), claims those still available and gives each a slot. held is true when a key's
// due jobs were left for want of a free slot (not when only the claim's
// allowance k ran out: the queue's limits, or the claim's own limit).
func (d *Driver) claimKeyedTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, l driver.QueueLimits, kw *keyWalk, k int) (rows []*driver.JobRow, held bool, err error) {
	if len(kw.keys) == 0 {
		return nil, false, nil
	}
	limit := int64(l.KeyMaxRunning)
	sorted := slices.Clone(kw.keys)
	slices.Sort(sorted)
	free, kept, err := d.lockKeySlots(ctx, tx, p.Queue, sorted, limit, int64(k))
	if err != nil {
		return nil, false, err
	}
	// The next jobs of the keys with open slots, read at once: as many as
	// the key's slots or the claim's allowance could take, and one more.
	var reads []string
	var counts []int64
	for _, key := range kw.keys {
		n := min(len(free[key]), kw.free[key])
		if len(kept[key]) > 0 || n == 0 {
			continue
		}
		reads = append(reads, key)
		if l.Ordered {
			counts = append(counts, 2)
		} else {
			counts = append(counts, int64(min(n, k)+1))
		}
	}
	next, err := d.readKeyJobs(ctx, tx, p.Queue, l.Ordered, reads, counts)
	if err != nil {
		return nil, false, err
	}
	left := k
	var ids []int64
	slotOf := map[int64]keySlot{} // kept slots by job
	for _, key := range kw.keys {
		if left == 0 {
			break // the claim's allowance is taken
		}
		if ks := kept[key]; len(ks) > 0 {
			// A kept slot holds the key for its own job.
			for _, s := range ks[:min(len(ks), left)] {
				ids = append(ids, s.job)
				slotOf[s.job] = s
				left--
			}
			// The key's other jobs wait for the kept job: held (below)
			// once it runs, but not while its retry is not due, which
			// no attempt's end changes (its promotion wakes claims).
			continue
		}
		fs := free[key]
		fs = fs[:min(len(fs), kw.free[key])]
		if len(fs) == 0 {
			held = true
			continue
		}
		got := next[key]
		take := min(len(fs), left)
		if l.Ordered {
			take = 1
		}
		got = got[:min(len(got), take+1)]
		if len(got) > take {
			// More of the key's jobs are due: held by the key when
			// its slots, not the claim's allowance, ran out.
			held = held || l.Ordered || take == len(fs)
			got = got[:take]
		}
		ids = append(ids, got...)
		left -= len(got)
	}
	if len(ids) == 0 {
		return nil, held, nil
	}
	cp := p
	cp.Limit = len(ids)
	q, args, _ := d.inList(d.q.KeyClaimSelect, ids, p.Queue)
	rows, err = d.claimLockedTx(ctx, tx, cp, q, args)
	if err != nil {
		return nil, false, err
	}
	claimed := make(map[int64]bool, len(rows))
	for _, j := range rows {
		claimed[j.ID] = true
		if _, kept := slotOf[j.ID]; kept {
			held = true // the key's other jobs wait for it
		}
	}
	for _, id := range ids {
		if _, kept := slotOf[id]; !kept && !claimed[id] {
			held = true // taken by another claim meanwhile
		}
	}
	if len(rows) == 0 {
		return nil, held, nil
	}
	slots := make([]keySlot, len(rows))
	for i, j := range rows {
		s, ok := slotOf[j.ID]
		if !ok {
			fs := free[j.Key]
			if len(fs) == 0 {
				return nil, false, fmt.Errorf("%w: no key slot locked for job %d of key %q", errSlotsLost, j.ID, j.Key)
			}
			s = keySlot{n: fs[0]}
			free[j.Key] = fs[1:]
		}
		slots[i] = s
	}
	if err := d.takeKeySlots(ctx, tx, p.Queue, rows, slots); err != nil {
		return nil, false, err
	}
	return rows, held, nil
}

// takeKeySlots gives each claimed job rows[i] the key slot slots[i] of
// its key, in one statement (key_slot_take); errSlotsLost unless it took
// every one.
func (d *Driver) takeKeySlots(ctx context.Context, tx *sql.Tx, queue string, rows []*driver.JobRow, slots []keySlot) error {
	k := len(rows)
	cases := make([]any, 0, 3*k)
	for i, j := range rows {
		cases = append(cases, j.Key, slots[i].n, j.ID)
	}
	args := make([]any, 0, 14*k+2)
	args = append(args, cases...)
	for i, j := range rows {
		args = append(args, j.Key, slots[i].n, j.Fence)
	}
	// The claim's clock: every keyed job was marked by one statement.
	args = append(args, dbTime(rows[0].AttemptedAt), queue)
	for i, j := range rows {
		args = append(args, j.Key, slots[i].n)
	}
	args = append(args, cases...)
	q := strings.NewReplacer("{cases}", strings.TrimSuffix(strings.Repeat("WHEN lkey = ? AND n = ? THEN ? ", k), " "),
		"{pairs}", strings.TrimSuffix(strings.Repeat("(?, ?), ", k), ", ")).Replace(d.q.KeySlotTake)
	res, err := d.exec(ctx, tx, k <= maxCachedInsertRows, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != int64(k) {
		return fmt.Errorf("%w: took %d of %d key slots", errSlotsLost, n, k)
	}
	return nil
}

// keyParts joins query's parenthesized part n times with UNION ALL, n
// rounded up to a power of two (see bucket), and returns it with whether
// it is worth caching; the parts beyond n are the caller's padding.
func keyParts(part string, n int) (string, int, bool) {
	b := bucket(n)
	return strings.TrimSuffix(strings.Repeat(part+" UNION ALL ", b), " UNION ALL "), b, b <= maxCachedKeyParts
}

// maxCachedKeyParts bounds the number of parts of a statement of
// key_slot_lock_part or key_head_part/key_next_part prepared and cached.
const maxCachedKeyParts = 256

// lockKeySlots locks, in tx and in one statement (key_slot_lock_part), up
// to count open slots below limit of each of queue's keys (sorted, in key
// order), skipping those other claims hold, and returns each key's free
// slots and its slots kept for a job, in slot order.
func (d *Driver) lockKeySlots(ctx context.Context, tx *sql.Tx, queue string, sorted []string, limit, count int64) (map[string][]int64, map[string][]keySlot, error) {
	q, b, cached := keyParts(d.q.KeySlotLockPart, len(sorted))
	args := make([]any, 0, 4*b)
	for _, key := range sorted {
		args = append(args, queue, key, limit, count)
	}
	for i := len(sorted); i < b; i++ {
		args = append(args, nil, nil, limit, count) // a NULL queue matches nothing
	}
	r, err := d.query(ctx, tx, cached, q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	free := map[string][]int64{}
	kept := map[string][]keySlot{}
	for r.Next() {
		var key string
		var n int64
		var job sql.NullInt64
		if err := r.Scan(&key, &n, &job); err != nil {
			return nil, nil, err
		}
		if job.Valid {
			kept[key] = append(kept[key], keySlot{n: n, job: job.Int64})
		} else {
			free[key] = append(free[key], n)
		}
	}
	if err := r.Err(); err != nil {
		return nil, nil, err
	}
	for _, fs := range free {
		slices.Sort(fs)
	}
	for _, ks := range kept {
		slices.SortFunc(ks, func(a, b keySlot) int { return cmp.Compare(a.n, b.n) })
	}
	return free, kept, nil
}

// readKeyJobs reads, in tx and in one statement, up to counts[i] of the
// next available jobs of queue's key keys[i]: Ordered its oldest by id
// (key_head_part), else its next by priority then id (key_next_part).
func (d *Driver) readKeyJobs(ctx context.Context, tx *sql.Tx, queue string, ordered bool, keys []string, counts []int64) (map[string][]int64, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	part := d.q.KeyNextPart
	if ordered {
		part = d.q.KeyHeadPart
	}
	q, b, cached := keyParts(part, len(keys))
	args := make([]any, 0, 3*b)
	for i, key := range keys {
		args = append(args, queue, key, counts[i])
	}
	for i := len(keys); i < b; i++ {
		args = append(args, nil, nil, int64(1)) // a NULL queue matches nothing
	}
	r, err := d.query(ctx, tx, cached, q, args...)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	type job struct{ prio, id int64 }
	jobs := map[string][]job{}
	for r.Next() {
		var key string
		var j job
		if err := r.Scan(&key, &j.prio, &j.id); err != nil {
			return nil, err
		}
		jobs[key] = append(jobs[key], j)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	out := make(map[string][]int64, len(jobs))
	for key, js := range jobs {
		slices.SortFunc(js, func(a, b job) int {
			if !ordered {
				if c := cmp.Compare(a.prio, b.prio); c != 0 {
					return c
				}
			}
			return cmp.Compare(a.id, b.id)
		})
		ids := make([]int64, len(js))
		for i, j := range js {
			ids[i] = j.id
		}
		out[key] = ids
	}
	return out, nil
}

// keyUsage adds the key limits' use of queue to u: the keys with a slot
// held or kept, and the available keyed jobs whose key has no open slot
// for them (an admin read: it counts the queue's available keyed jobs).
func (d *Driver) keyUsage(ctx context.Context, queue string, u *driver.LimitUsage) error {
	limit := int64(u.Limits.KeyMaxRunning)
	return d.retry(ctx, "limit usage", func() error {
		if err := d.db.QueryRowContext(ctx, d.q.KeysRunning, queue).Scan(&u.KeysRunning); err != nil {
			return err
		}
		u.KeyHeld = 0
		rows, err := d.db.QueryContext(ctx, d.q.KeyUsage, queue, queue, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var avail, heldSlots, keptSlots, keptAvail int64
			if err := rows.Scan(&avail, &heldSlots, &keptSlots, &keptAvail); err != nil {
				return err
			}
			open := max(limit-heldSlots-keptSlots, 0)
			if keptSlots > 0 {
				open = keptAvail // a kept slot admits only its job
			}
			u.KeyHeld += max(avail-open, 0)
		}
		return rows.Err()
	})
}

// sweepKeySlots is the rescue's sweep of key slots: it frees up to limit
// slots kept for a job that no longer waits to run (key_kept_stale, each
// freed by key_kept_free, fenced by the job and its state), and deletes
// up to limit free key slots unused for a minute, at or beyond their
// key's limit, or of a queue without key limits (key_slot_trim).
func (d *Driver) sweepKeySlots(ctx context.Context, limit int) error {
	type slot struct {
		queue, lkey string
		n, job      int64
	}
	var stale []slot
	err := d.retry(ctx, "rescue: sweep key slots", func() error {
		stale = stale[:0]
		rows, err := d.query(ctx, nil, true, d.q.KeyKeptStale, int64(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s slot
			if err := rows.Scan(&s.queue, &s.lkey, &s.n, &s.job); err != nil {
				return err
			}
			stale = append(stale, s)
		}
		return rows.Err()
	})
	if err != nil {
		return err
	}
	for _, s := range stale {
		if _, err := d.execCount(ctx, d.main, "rescue: free key slot", true, d.q.KeyKeptFree, []any{s.queue, s.lkey, s.n, s.job, s.job}); err != nil {
			return err
		}
	}
	_, err = d.execCount(ctx, d.main, "rescue: trim key slots", true, d.q.KeySlotTrim, []any{int64(limit)})
	return err
}
