package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
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
// them (claimKeyedTx), and claims the jobs without a key after them. Each
// step is one statement for all the claim's keys, whatever their number
// and depth: the walk reads a window of key_idx, a second one sized for
// the depth the first saw, or the rest of its keys grouped by key when
// they are deeper than a window holds (readKeys); the
// slots are locked by one range read when the claim may take every open
// slot of a key (lockKeySlots), and the next jobs of the keys the walk
// found shallow are read all at once (readKeyJobs), while a part per key
// with its own LIMIT serves the others. The
// statements that end an attempt free its key slot as they free its
// concurrency slot (by job and fence), or keep it for the job (see
// free_slots in queries.sql).
//
// Rates per key (QueueLimits.KeyRate, KeyRatePeriod) are the key_rate and
// key_rate_period_us columns of the queues row, held by rows of
// limit_slots of type 'w', one per key and unit of the rate (lkey, n),
// made open by the walk when first needed (migrations/014_key_rates.sql).
// A key has room in its window while fewer than KeyRate of its slots are
// stamped within the last KeyRatePeriod. The claim locks the open rate
// slots of its keys after their key slots (skipping those other claims
// hold) and stamps one with the start of each keyed job it claims, in its
// transaction; a key takes the fewer of its free key slots and its open
// rate slots. Nothing frees a rate slot: the statements that end an
// attempt match slots by job and fence, which a rate slot never has, and
// only the passing of time opens it. A queue with a rate per key and no
// key slots (no KeyMaxRunning, not Ordered) claims by keys all the same,
// with no slot per key to hold or free.
//
// A Fair queue (QueueLimits.Fair, the key_fair column) claims by keys
// too: each key of the walk takes at most its weight (the key_weights
// column, read with the limits; see weights.go) in its turn, within its
// room (a turn a claim filled up in goes on in the driver's next claim of
// the queue: see keyCursor), and once every key had its turn the keys
// that weight alone cut take further rounds (fairRounds). Alone it makes
// no slot and holds no job: it orders the claim.

// Values of the queues.key_order column.
const (
	keyUnordered     = 0
	keyOrdered       = 1
	keyOrderedMoveOn = 2
)

// maxKeyMaxRunning bounds QueueLimits.KeyMaxRunning.
const maxKeyMaxRunning = 100000

// maxKeyRate bounds QueueLimits.KeyRate.
const maxKeyRate = 100000

// checkKeyLimits refuses key limits the database cannot hold.
func checkKeyLimits(l driver.QueueLimits) error {
	switch {
	case l.KeyMaxRunning < 0 || l.KeyMaxRunning > maxKeyMaxRunning:
		return fmt.Errorf("KeyMaxRunning %d is not within 0 to %d", l.KeyMaxRunning, maxKeyMaxRunning)
	case l.Ordered && l.KeyMaxRunning > 1:
		return fmt.Errorf("an Ordered queue runs one job per key: KeyMaxRunning must be 0 or 1, not %d", l.KeyMaxRunning)
	case l.OrderedMoveOn && !l.Ordered:
		return errors.New("OrderedMoveOn needs Ordered")
	case l.KeyRate < 0 || l.KeyRate > maxKeyRate:
		return fmt.Errorf("KeyRate %d is not within 0 to %d", l.KeyRate, maxKeyRate)
	case l.KeyRate > 0 && l.KeyRatePeriod < time.Microsecond:
		return fmt.Errorf("KeyRatePeriod %v is below a microsecond for a KeyRate of %d", l.KeyRatePeriod, l.KeyRate)
	case l.KeyRate == 0 && l.KeyRatePeriod != 0:
		return fmt.Errorf("KeyRatePeriod %v is set without a KeyRate", l.KeyRatePeriod)
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
// the queue examined: the next claim's walk starts after it; or, for a
// Fair queue whose previous claim filled up during a key's turn, that key
// and the jobs it took in the turn (taken > 0): the next claim's walk
// starts at it, for the rest of its turn.
type keyCursor struct {
	mu    sync.Mutex
	key   string
	taken int
}

func (d *Driver) keyCursor(queue string) *keyCursor {
	c, _ := d.keyCursors.LoadOrStore(queue, &keyCursor{})
	return c.(*keyCursor)
}

// keyWalk is what a claim's walk of keys found: the candidate keys (with
// room below the limit and in their rate's window, as a plain read saw
// them) in rotation order, how many free slots each may take (the limit
// less the attempts holding or kept in any of its slots: a read before the
// claim's transaction, which can only have seen more of them than there
// are), how many starts its window has left (KeyRate, read likewise),
// whether a key with due jobs had no room, the keys whose window was
// full (rated), whether the walk examined every key of the queue's due
// jobs (complete: it wrapped around or ran out of keys) and, for a Fair
// queue, its key weights (read with its limits; nil for none) and the key
// whose turn the walk goes on with (cont, its first, which took contTaken
// of its weight in the previous claims; "" for none) and, per key, how
// many available jobs the walk's windows of key_idx held (depth; 0 when
// a window ended within the key's entries or the walk did not count it),
// and per key the slots running attempts held at any n (busy, read with
// free).
type keyWalk struct {
	keys      []string
	free      map[string]int
	busy      map[string]int
	rfree     map[string]int
	held      bool
	rated     []string
	complete  bool
	weights   map[string]int
	cont      string
	contTaken int
	depth     map[string]int
	// last is the last key the walk examined (the cursor's key when it
	// examined none): the next claim's walk starts after it unless the
	// claim stopped taking jobs at an earlier key (claimKeyedTx).
	last string
}

// rateStats is a key's rate slots as key_rate_stats read them: the rows
// below the rate and those of them stamped within the window.
type rateStats struct {
	rows, closed int
}

// keyStats is a key's slots as key_slot_stats read them: the rows below
// the limit, and the held and kept slots at any n.
type keyStats struct {
	rows, held, kept int
}

// moveKeyCursor sets where queue's next keyed claim starts: after
// at.key, or at it for the rest of its turn when at.taken > 0.
func (d *Driver) moveKeyCursor(queue string, at fairTurn) {
	cur := d.keyCursor(queue)
	cur.mu.Lock()
	cur.key, cur.taken = at.key, at.taken
	cur.mu.Unlock()
}

// walkKeys walks the distinct keys of queue's available keyed jobs in key
// order from the key after the queue's cursor, wrapping around to the
// start once, until it has want keys with room or has examined
// 4*want+64 keys; it makes the candidate keys' missing slots (enough for
// want attempts each, within the limit and the rate) and records the last
// key examined (kw.last); claimKeyedTx moves the cursor. A key has room when it has a slot free
// (KeyMaxRunning, Ordered; always without them) and a start left in its
// window (KeyRate; always without one). A Fair walk whose cursor is
// within a key's turn (the previous claim filled up before the key took
// its weight) begins at the cursor's key, to go on with its turn.
func (d *Driver) walkKeys(ctx context.Context, queue string, l driver.QueueLimits, want int, weights map[string]int) (*keyWalk, error) {
	limit := l.KeyMaxRunning
	cur := d.keyCursor(queue)
	cur.mu.Lock()
	start, taken := cur.key, cur.taken
	cur.mu.Unlock()
	maxExamine := 4*want + 64
	kw := &keyWalk{free: map[string]int{}, busy: map[string]int{}, rfree: map[string]int{}, weights: weights}
	cont := l.Fair && !l.Ordered && start != "" && taken > 0 && taken < driver.KeyWeight(weights, start)
	stats := map[string]keyStats{}
	rstats := map[string]rateStats{}
	jobs := map[string]int{} // the keys' available jobs, for their rate slots and their reads
	kw.depth = jobs
	examined := 0
	last := start
	// consider examines keys, in walk order, and takes those with room.
	consider := func(keys []string) error {
		if len(keys) == 0 {
			return nil
		}
		var st map[string]keyStats
		var rs map[string]rateStats
		var err error
		if limit > 0 {
			if st, err = d.keySlotStats(ctx, queue, limit, keys); err != nil {
				return err
			}
		}
		if l.KeyRate > 0 {
			if rs, err = d.keyRateStats(ctx, queue, l, keys); err != nil {
				return err
			}
		}
		for _, k := range keys {
			examined++
			last = k
			room := true
			if limit > 0 && st[k].held >= limit {
				kw.held, room = true, false
			}
			if l.KeyRate > 0 && rs[k].closed >= l.KeyRate {
				kw.held, room = true, false
				kw.rated = append(kw.rated, k)
			}
			if !room {
				continue
			}
			kw.keys = append(kw.keys, k)
			if limit > 0 {
				s := st[k]
				kw.free[k] = max(limit-s.held-s.kept, 0)
				kw.busy[k] = s.held
				stats[k] = s
			}
			if l.KeyRate > 0 {
				kw.rfree[k] = l.KeyRate - rs[k].closed
				rstats[k] = rs[k]
			}
		}
		return nil
	}
	if cont {
		at, err := d.keyAt(ctx, queue, start)
		if err != nil {
			return nil, err
		}
		if at != "" {
			jobs[at] = 0 // not counted
			if err := consider([]string{at}); err != nil {
				return nil, err
			}
			if len(kw.keys) > 0 {
				kw.cont, kw.contTaken = at, taken
			}
		}
	}
	after, wrapped := start, start == ""
	for examined < maxExamine && len(kw.keys) < want {
		var upto *string
		if wrapped && start != "" {
			upto = &start
		}
		// As many keys as the claim still wants: the walk reads no
		// further than the keys it takes, unless some have no room.
		chunk := min(want-len(kw.keys), maxExamine-examined)
		keys, err := d.readKeys(ctx, queue, after, upto, chunk, jobs)
		if err != nil {
			return nil, err
		}
		if len(keys) > 0 {
			after = keys[len(keys)-1]
			fresh := keys
			if cont && wrapped && strings.TrimRight(after, " ") == strings.TrimRight(start, " ") {
				fresh = keys[:len(keys)-1] // examined first
			}
			if err := consider(fresh); err != nil {
				return nil, err
			}
		}
		if len(keys) < chunk {
			if wrapped {
				kw.complete = true
				break
			}
			wrapped, after = true, ""
		}
	}
	// The cursor moves once the claim knows where it stopped
	// (claimKeyedTx): the walk looks at more keys than a claim may take
	// from, and a cursor left at the last of them would skip the others.
	kw.last = last
	if limit > 0 {
		if err := d.makeKeySlots(ctx, queue, limit, want, kw.keys, stats); err != nil {
			return nil, err
		}
	}
	if l.KeyRate > 0 {
		if err := d.makeRateSlots(ctx, queue, l, want, kw, rstats, jobs); err != nil {
			return nil, err
		}
	}
	return kw, nil
}

// keyAt returns key as queue's available keyed jobs spell it (the first
// of the keys the column's collation holds equal to it), or "" when none
// has it.
func (d *Driver) keyAt(ctx context.Context, queue, key string) (string, error) {
	var at string
	err := d.retry(ctx, "claim limited: walk keys", func() error {
		at = ""
		rows, err := d.query(ctx, nil, true, d.q.KeyWalkAt, queue, key)
		if err != nil {
			return err
		}
		defer rows.Close()
		if rows.Next() {
			if err := rows.Scan(&at); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return at, err
}

// readKeys returns up to n keys of queue's available keyed jobs after
// after (and up to *upto when upto is not nil), in key order: windows of
// key_idx (key_walk, key_walk_upto), the first of 2n+16 entries, each
// from a seek past the last key the previous one found, until it has n
// keys or a window ends before its size. A window after one that ended
// within the keys is sized for the keys still wanted at the depth that
// one saw, within walkWindowMax entries; when they would need more, the
// keys are deep and the rest are read at once by readKeysGrouped. Keys
// the column's collation holds equal (utf8mb4_bin pads with spaces: "a"
// and "a ") are one key, found as the first of them in the index. When
// jobs is not nil it gets, per key returned, how many available jobs it
// has, or 0 when the window ended within the key's entries (it may have
// more) or the key was read grouped.
func (d *Driver) readKeys(ctx context.Context, queue, after string, upto *string, n int, jobs map[string]int) ([]string, error) {
	var keys []string
	per := 0 // the entries per key of the last window
	for len(keys) < n {
		size := 2*(n-len(keys)) + 16
		if per > 0 {
			// As many entries as the keys still wanted hold if they are
			// as deep as the last window's, and some.
			size = max(size, (n-len(keys))*per*3/2+16)
		}
		if per > 0 && size > walkWindowMax {
			// The keys are deep: the rest at once by a loose index scan.
			got, err := d.readKeysGrouped(ctx, queue, after, upto, n-len(keys))
			if err != nil {
				return nil, err
			}
			if jobs != nil {
				for _, k := range got {
					jobs[k] = 0 // not counted
				}
			}
			return append(keys, got...), nil
		}
		q, args := d.q.KeyWalk, []any{queue, after}
		if upto != nil {
			q, args = d.q.KeyWalkUpto, append(args, *upto)
		}
		args = append(args, int64(size))
		var got []string
		var counts []int
		read := 0
		err := d.retry(ctx, "claim limited: walk keys", func() error {
			got, counts, read = got[:0], counts[:0], 0
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
					counts = append(counts, 0)
				}
				counts[len(counts)-1]++
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		if jobs != nil {
			if read == size {
				counts[len(counts)-1] = 0 // the window ended within it
			}
			for i, k := range got[:min(len(got), n-len(keys))] {
				jobs[k] = counts[i]
			}
		}
		keys = append(keys, got[:min(len(got), n-len(keys))]...)
		if read < size {
			break // no more keys in the range
		}
		after = got[len(got)-1]
		per = (read + len(got) - 1) / len(got)
	}
	return keys, nil
}

// walkWindowMax bounds the entries of key_idx one window of the walk
// reads (readKeys); a variable for the tests.
var walkWindowMax = 2048

// readKeysGrouped returns up to n keys of queue's available keyed jobs
// after after (and up to *upto when upto is not nil), in key order, in
// one statement that groups key_idx by key (key_walk_grouped,
// key_walk_grouped_upto): the server reads it by a loose index scan, a
// seek per key, when its statistics say the keys are deep, and else
// reads the returned keys' entries in order, few when they are shallow.
// readKeys reads its first window of entries by key_walk, whose cost is
// bounded whatever the keys' depths, and the rest of its keys by this
// only when that window found the keys deep.
func (d *Driver) readKeysGrouped(ctx context.Context, queue, after string, upto *string, n int) ([]string, error) {
	q, args := d.q.KeyWalkGrouped, []any{queue, after}
	if upto != nil {
		q, args = d.q.KeyWalkGroupedUpto, append(args, *upto)
	}
	args = append(args, int64(n))
	var got []string
	err := d.retry(ctx, "claim limited: walk keys", func() error {
		got = got[:0]
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
			got = append(got, k)
		}
		return rows.Err()
	})
	return got, err
}

// keySlotStats reads the slots below limit of queue's keys.
func (d *Driver) keySlotStats(ctx context.Context, queue string, limit int, keys []string) (map[string]keyStats, error) {
	return readKeyStats(ctx, d, "claim limited: key slots", d.q.KeySlotStats, []any{int64(limit), queue}, keys,
		func(s *keyStats) []any { return []any{&s.rows, &s.held, &s.kept} })
}

// keyRateStats reads the rate slots of queue's keys.
func (d *Driver) keyRateStats(ctx context.Context, queue string, l driver.QueueLimits, keys []string) (map[string]rateStats, error) {
	return readKeyStats(ctx, d, "claim limited: key rate slots", d.q.KeyRateStats,
		[]any{int64(l.KeyRate), int64(l.KeyRate), micros(l.KeyRatePeriod), queue}, keys,
		func(s *rateStats) []any { return []any{&s.rows, &s.closed} })
}

// readKeyStats runs stmt, its {keys} filled with a placeholder per key
// of keys and its arguments lead then keys, under retry as op, and reads
// its rows, a key then the columns into which cols points, by key: the
// same read for the key slots and the key rate slots, which differ only
// in their statement and their columns.
func readKeyStats[S any](ctx context.Context, d *Driver, op, stmt string, lead []any, keys []string, cols func(*S) []any) (map[string]S, error) {
	out := map[string]S{}
	q := strings.Replace(stmt, "{keys}", placeholders(len(keys)), 1)
	args := make([]any, 0, len(lead)+len(keys))
	args = append(args, lead...)
	for _, k := range keys {
		args = append(args, k)
	}
	err := d.retry(ctx, op, func() error {
		clear(out)
		rows, err := d.query(ctx, nil, false, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			var s S
			if err := rows.Scan(append([]any{&k}, cols(&s)...)...); err != nil {
				return err
			}
			out[k] = s
		}
		return rows.Err()
	})
	return out, err
}

// makeRateSlots inserts, in key order and in statements of their own, the
// rate slots n < min(KeyRate, closed+need) of each candidate key of kw
// that has fewer rows below the rate than that (as stats read them;
// closed is its slots stamped within the window, need the attempts the
// claim may start of it: want, its available jobs as the walk counted
// them (jobs; 0 for not counted), its free key slots, one when Ordered):
// among them at least need are open, or every slot below the rate that
// no start within the window stamped. Each is made open (unstamped).
func (d *Driver) makeRateSlots(ctx context.Context, queue string, l driver.QueueLimits, want int, kw *keyWalk, stats map[string]rateStats, jobs map[string]int) error {
	return d.insertKeySlots(ctx, "claim limited: make key rate slots", d.q.KeyRateInsert, d.q.KeyRateInsertRow, queue, kw.keys, func(k string) int {
		s := stats[k]
		need := want
		if jobs[k] > 0 {
			need = min(need, jobs[k])
		}
		if l.KeyMaxRunning > 0 {
			need = min(need, max(kw.free[k], 1))
		}
		need = min(l.KeyRate, s.closed+need)
		if s.rows >= need {
			return 0
		}
		return need
	})
}

// makeKeySlots inserts, in key order and in statements of their own, the
// slots n < min(limit, used+want) of each key that has fewer rows below
// the limit than that (as stats read them; used is its held and kept
// slots): among them at least want are free, or every slot below the
// limit that no attempt uses.
func (d *Driver) makeKeySlots(ctx context.Context, queue string, limit, want int, keys []string, stats map[string]keyStats) error {
	return d.insertKeySlots(ctx, "claim limited: make key slots", d.q.KeySlotInsert, d.q.KeySlotInsertRow, queue, keys, func(k string) int {
		s := stats[k]
		used := s.held + s.kept
		need := min(limit, used+want)
		if s.rows >= need {
			return 0
		}
		return need
	})
}

// insertKeySlots inserts, in key order and in statements of their own
// (insert with insertRow repeated, at most slotInsertChunk rows each, run
// under retry as op), the slots n < need(k) of each of queue's keys: the
// same chunked insert for the key slots and the key rate slots, which
// differ only in their statement and in how many slots a key needs.
func (d *Driver) insertKeySlots(ctx context.Context, op, insert, insertRow, queue string, keys []string, need func(key string) int) error {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	var args []any
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		q := d.rowsSQL(insert, insertRow, "", len(args)/3)
		err := d.retry(ctx, op, func() error {
			_, err := d.exec(ctx, nil, false, q, args...)
			return err
		})
		args = args[:0]
		return err
	}
	for _, k := range sorted {
		for n := range need(k) {
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
// key in key order, skipping those other claims hold, in one statement)
// and then their open rate slots (KeyRate, likewise), reads the next jobs
// of the keys with room (in one statement), picks in rotation order for
// each key the job its kept slot is kept for, or else the key's next jobs
// for its room (Ordered: its oldest job only), claims those still
// available, gives each a slot and stamps a rate slot of its key with its
// start. A key's room is the fewer of its free slots (KeyMaxRunning,
// Ordered) and its open rate slots (KeyRate); a limit the queue does not
// have bounds nothing. A Fair queue's key takes at most its weight in its
// turn (less what it took in the turn in the previous claims: see
// walkKeys), and more in the rounds after every key's turn (fairRounds);
// a Fair claim that fills up leaves the cursor at the key whose turn it
// ended in, with what the key took when the claim filled up within its
// turn. held is true when a key's due jobs were left for want of room
// (not when only the claim's allowance k ran out: the queue's limits, or
// the claim's own limit); rated are the keys whose jobs were left because
// their window was full.
func (d *Driver) claimKeyedTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, l driver.QueueLimits, kw *keyWalk, k int) (rows []*driver.JobRow, held bool, rated []string, err error) {
	if len(kw.keys) == 0 {
		d.moveKeyCursor(p.Queue, fairTurn{key: kw.last})
		return nil, false, nil, nil
	}
	concur, rate := l.KeyMaxRunning > 0, l.KeyRate > 0
	sorted := slices.Clone(kw.keys)
	slices.Sort(sorted)
	var free map[string][]int64
	var kept map[string][]keySlot
	if concur {
		if free, kept, err = d.lockKeySlots(ctx, tx, p.Queue, sorted, int64(l.KeyMaxRunning), int64(k)); err != nil {
			return nil, false, nil, err
		}
		for key, fs := range free {
			free[key] = fs[:min(len(fs), kw.free[key])]
		}
		// A slot kept at or beyond a lowered limit (its job failed while
		// running there, and the queue keeps its key's order) admits its
		// job on its own row while the key has room for it: the slots
		// running attempts hold (at any n; the walk gave the key room,
		// fewer than the limit) and the kept jobs admitted before it
		// stay below the limit. Kept slots read below the limit first.
		limit := l.KeyMaxRunning
		for key, ks := range kept {
			var admit []keySlot
			for _, s := range ks {
				if s.n >= int64(limit) && kw.busy[key]+len(admit) >= limit {
					continue
				}
				admit = append(admit, s)
			}
			if len(admit) == 0 {
				// Every kept slot waits for room: so does the key.
				held = true
				delete(kept, key)
				free[key] = nil
				continue
			}
			kept[key] = admit
		}
	}
	// capC is the key's room by its slots: its kept slots, else its free
	// ones; unbounded without key slots.
	capC := func(key string) int {
		switch {
		case !concur:
			return math.MaxInt
		case len(kept[key]) > 0:
			return len(kept[key])
		}
		return len(free[key])
	}
	var rfree map[string][]int64
	asked := map[string]int{} // the rate slots locked for, per key
	if rate {
		var keys []string
		var counts []int64
		for _, key := range sorted {
			n := min(k, capC(key), kw.rfree[key])
			if l.Ordered {
				n = min(n, 1)
			}
			if n > 0 {
				keys = append(keys, key)
				counts = append(counts, int64(n))
				asked[key] = n
			}
		}
		if rfree, err = d.lockRateSlots(ctx, tx, p.Queue, l, keys, counts); err != nil {
			return nil, false, nil, err
		}
	}
	// capR is the key's room in its window: the rate slots the claim
	// locked when it found fewer open than it asked for, else the starts
	// the walk saw left (the claim locked no more than it can take, and
	// none for a key without room by its slots); unbounded without a
	// rate per key.
	capR := func(key string) int {
		switch {
		case !rate:
			return math.MaxInt
		case len(rfree[key]) < asked[key]:
			return len(rfree[key])
		}
		return kw.rfree[key]
	}
	// The next jobs of the keys with room, read at once: as many as the
	// key's room or the claim's allowance could take, and one more.
	var reads []string
	var counts []int64
	for _, key := range kw.keys {
		n := min(capC(key), capR(key))
		if len(kept[key]) > 0 || n == 0 {
			continue
		}
		reads = append(reads, key)
		switch {
		case l.Ordered:
			counts = append(counts, 2)
		case l.Fair:
			// One turn's worth: the rounds after the turns read more
			// of the keys that have more (fairRounds).
			counts = append(counts, int64(min(n, k, kw.turn(key))+1))
		default:
			counts = append(counts, int64(min(n, k)+1))
		}
	}
	next, err := d.readKeyJobs(ctx, tx, p.Queue, l.Ordered, reads, counts, kw.depth)
	if err != nil {
		return nil, false, nil, err
	}
	left := k
	var ids []int64
	slotOf := map[int64]keySlot{} // kept slots by job
	var more []fairKey            // Fair: the keys cut by their weight only
	var last fairTurn             // Fair: the last key's turn
	for _, key := range kw.keys {
		if left == 0 {
			break // the claim's allowance is taken
		}
		last = fairTurn{key: key}
		room := min(capC(key), capR(key))
		byRate := capR(key) <= capC(key) // the window bounds the key's room
		if ks := kept[key]; len(ks) > 0 {
			// A kept slot holds the key for its own job, whose retry
			// is a start of the key too.
			if room == 0 {
				held, rated = true, append(rated, key)
				continue
			}
			for _, s := range ks[:min(room, left)] {
				ids = append(ids, s.job)
				slotOf[s.job] = s
				left--
			}
			// The key's other jobs wait for the kept job: held (below)
			// once it runs, but not while its retry is not due, which
			// no attempt's end changes (its promotion wakes claims).
			continue
		}
		if room == 0 {
			held = true
			if byRate {
				rated = append(rated, key)
			}
			continue
		}
		got := next[key]
		take := min(room, left)
		if l.Ordered {
			take = 1
		} else if l.Fair {
			w := kw.turn(key)
			if take = min(take, w); take == w && w < room && len(got) > take {
				more = append(more, fairKey{key: key, room: room, taken: take, byRate: byRate})
			}
			if take < w && take < room && len(got) > take {
				// The claim filled up within the key's turn.
				last.taken = take + driver.KeyWeight(kw.weights, key) - w
			}
		}
		got = got[:min(len(got), take+1)]
		if len(got) > take {
			// More of the key's jobs are due: held by the key when
			// its room, not the claim's allowance, ran out.
			if l.Ordered || take == room {
				held = true
			}
			if take == room && byRate {
				rated = append(rated, key)
			}
			got = got[:take]
		}
		ids = append(ids, got...)
		left -= len(got)
	}
	if l.Fair {
		if left > 0 && len(more) > 0 && kw.complete {
			extra, moreHeld, moreRated, end, err := d.fairRounds(ctx, tx, p.Queue, kw.weights, more, ids, left)
			if err != nil {
				return nil, false, nil, err
			}
			ids = append(ids, extra...)
			held = held || moreHeld
			rated = append(rated, moreRated...)
			left -= len(extra)
			last = end
		}
	}
	if left == 0 && last.key != "" {
		// The claim filled up at last.key: the next claim goes on after
		// it (Fair: or with the rest of its turn), not after the keys
		// the walk looked at beyond it, which this claim did not serve.
		d.moveKeyCursor(p.Queue, last)
	} else {
		// Every key the walk found had its chance.
		d.moveKeyCursor(p.Queue, fairTurn{key: kw.last})
	}
	if len(ids) == 0 {
		return nil, held, rated, nil
	}
	cp := p
	cp.Limit = len(ids)
	q, args, _ := d.inList(d.q.KeyClaimSelect, ids, p.Queue)
	rows, err = d.claimLockedTx(ctx, tx, cp, q, args)
	if err != nil {
		return nil, false, nil, err
	}
	claimed := make(map[int64]bool, len(rows))
	for _, j := range rows {
		claimed[j.ID] = true
		if _, kept := slotOf[j.ID]; kept {
			held = true // the key's other jobs wait for it
		}
	}
	if concur || rate {
		for _, id := range ids {
			if _, kept := slotOf[id]; !kept && !claimed[id] {
				held = true // taken by another claim meanwhile
			}
		}
	}
	if len(rows) == 0 {
		return nil, held, rated, nil
	}
	if concur || rate {
		// The limits were read before the transaction, and the queue's
		// own check (claimLimitedTx) ran before the key slots were
		// locked, if at all: a KeyMaxRunning lowered (or Ordered set)
		// since would have the claim admit a key's jobs into slots
		// under the old limit. Read after the key slots were locked,
		// the limits must be the same.
		same, err := d.limitsStill(ctx, tx, p, l)
		if err != nil {
			return nil, false, nil, err
		}
		if !same {
			return nil, false, nil, errLimitsChanged
		}
	}
	if concur {
		slots := make([]keySlot, len(rows))
		for i, j := range rows {
			s, ok := slotOf[j.ID]
			if !ok {
				fs := free[j.Key]
				if len(fs) == 0 {
					return nil, false, nil, fmt.Errorf("%w: no key slot locked for job %d of key %q", errSlotsLost, j.ID, j.Key)
				}
				s = keySlot{n: fs[0]}
				free[j.Key] = fs[1:]
			}
			slots[i] = s
		}
		if err := d.takeKeySlots(ctx, tx, p.Queue, rows, slots); err != nil {
			return nil, false, nil, err
		}
	}
	if rate {
		slots := make([]int64, len(rows))
		for i, j := range rows {
			rs := rfree[j.Key]
			if len(rs) == 0 {
				return nil, false, nil, fmt.Errorf("%w: no rate slot locked for job %d of key %q", errSlotsLost, j.ID, j.Key)
			}
			slots[i] = rs[0]
			rfree[j.Key] = rs[1:]
		}
		if err := d.takeRateSlots(ctx, tx, p.Queue, l, rows, slots); err != nil {
			return nil, false, nil, err
		}
	}
	return rows, held, rated, nil
}

// fairTurn is the key of a Fair claim's last turn and, when the claim
// filled up before it took its weight (and it had more), the jobs it took
// in the turn; 0 otherwise.
type fairTurn struct {
	key   string
	taken int
}

// turn is key's share of its turn in the walk: its weight, less what it
// took in the previous claims when the walk goes on with its turn.
func (kw *keyWalk) turn(key string) int {
	w := driver.KeyWeight(kw.weights, key)
	if key == kw.cont {
		w = max(w-kw.contTaken, 1)
	}
	return w
}

// fairKey is a key of a Fair claim whose turn its weight cut: its room
// (by its slots and window), the jobs it took and whether its window
// bounds its room.
type fairKey struct {
	key    string
	room   int
	taken  int
	byRate bool
}

// fairRounds gives the keys more (in walk order), each cut by its weight
// alone in its turn of a Fair claim that has left jobs to go once every
// key had its turn, further rounds of up to their weight each, until the
// claim is full or no key has more within its room. It reads the keys'
// next jobs once, in one statement, as many as each could take (its room
// less what it took, at most left) past those of its jobs the claim
// already picked (picked), and one more; it returns the jobs picked, in
// round order, whether a key's room left some of its due jobs (held) and
// the keys whose window did (rated), and the last key's turn (end).
func (d *Driver) fairRounds(ctx context.Context, tx *sql.Tx, queue string, weights map[string]int, more []fairKey, picked []int64, left int) (ids []int64, held bool, rated []string, end fairTurn, err error) {
	keys := make([]string, len(more))
	counts := make([]int64, len(more))
	for i, f := range more {
		keys[i] = f.key
		counts[i] = int64(f.taken + min(f.room-f.taken, left) + 1)
	}
	next, err := d.readKeyJobs(ctx, tx, queue, false, keys, counts, nil)
	if err != nil {
		return nil, false, nil, fairTurn{}, err
	}
	seen := make(map[int64]bool, len(picked))
	for _, id := range picked {
		seen[id] = true
	}
	cand := make([][]int64, len(more))
	for i, f := range more {
		for _, id := range next[f.key] {
			if !seen[id] {
				cand[i] = append(cand[i], id)
			}
		}
	}
	for left > 0 {
		took := false
		for i := range more {
			f := &more[i]
			w := driver.KeyWeight(weights, f.key)
			n := min(w, f.room-f.taken, left, len(cand[i]))
			if n <= 0 {
				continue
			}
			ids = append(ids, cand[i][:n]...)
			cand[i] = cand[i][n:]
			f.taken += n
			left -= n
			took = true
			end = fairTurn{key: f.key}
			if n < w && f.taken < f.room && len(cand[i]) > 0 {
				end.taken = n // the claim filled up within the turn
			}
			if left == 0 {
				break
			}
		}
		if !took {
			break
		}
	}
	for i, f := range more {
		if f.taken == f.room && len(cand[i]) > 0 {
			// Its room, not its weight, left its due jobs.
			held = true
			if f.byRate {
				rated = append(rated, f.key)
			}
		}
	}
	return ids, held, rated, end, nil
}

// lockRateSlots locks, in tx and in one statement (key_rate_lock_part),
// up to counts[i] open rate slots below the rate of queue's key keys[i]
// (sorted, in key order), skipping those other claims hold, and returns
// each key's locked slots in slot order.
func (d *Driver) lockRateSlots(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, keys []string, counts []int64) (map[string][]int64, error) {
	out := map[string][]int64{}
	if len(keys) == 0 {
		return out, nil
	}
	rate, period := int64(l.KeyRate), micros(l.KeyRatePeriod)
	q, b, cached := keyParts(d.q.KeyRateLockPart, len(keys))
	args := make([]any, 0, 5*b)
	for i, key := range keys {
		args = append(args, queue, key, rate, period, counts[i])
	}
	for i := len(keys); i < b; i++ {
		args = append(args, nil, nil, rate, period, int64(1)) // a NULL queue matches nothing
	}
	r, err := d.query(ctx, tx, cached, q, args...)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for r.Next() {
		var key string
		var n int64
		if err := r.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = append(out[key], n)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	for _, ns := range out {
		slices.Sort(ns)
	}
	return out, nil
}

// takeRateSlots stamps, in one statement (key_rate_take), the rate slot
// slots[i] of each claimed job rows[i]'s key with the claim's clock;
// errSlotsLost unless every one was still open.
func (d *Driver) takeRateSlots(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, rows []*driver.JobRow, slots []int64) error {
	k := len(rows)
	args := make([]any, 0, 2*k+3)
	// The claim's clock: every keyed job was marked by one statement.
	args = append(args, dbTime(rows[0].AttemptedAt), queue)
	for i, j := range rows {
		args = append(args, j.Key, slots[i])
	}
	args = append(args, micros(l.KeyRatePeriod))
	q := strings.Replace(d.q.KeyRateTake, "{pairs}", strings.TrimSuffix(strings.Repeat("(?, ?), ", k), ", "), 1)
	return d.execTake(ctx, d.main, tx, q, args, k, "stamped", "key rate slots")
}

// keyRateRetryIn returns how long until the oldest start within the
// window of queue's keys rated leaves it (at least a millisecond: a slot
// another claim holds without a stamp yet is open again as soon as that
// claim ends).
func (d *Driver) keyRateRetryIn(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, rated []string) (time.Duration, error) {
	period := micros(l.KeyRatePeriod)
	q := strings.Replace(d.q.KeyRateRetryIn, "{keys}", placeholders(len(rated)), 1)
	args := make([]any, 0, len(rated)+4)
	args = append(args, period, queue)
	for _, k := range rated {
		args = append(args, k)
	}
	args = append(args, int64(l.KeyRate), period)
	rows, err := d.query(ctx, tx, false, q, args...)
	if err != nil {
		return 0, err
	}
	return retryIn(rows)
}

// takeKeySlots gives each claimed job rows[i] the key slot slots[i] of
// its key (key_slot_take), keySlotTakeChunk slots a statement;
// errSlotsLost unless it took every one.
func (d *Driver) takeKeySlots(ctx context.Context, tx *sql.Tx, queue string, rows []*driver.JobRow, slots []keySlot) error {
	for len(rows) > 0 {
		k := min(len(rows), keySlotTakeChunk)
		if err := d.takeKeySlotsPart(ctx, tx, queue, rows[:k], slots[:k]); err != nil {
			return err
		}
		rows, slots = rows[k:], slots[k:]
	}
	return nil
}

// keySlotTakeChunk bounds the slots one statement of key_slot_take
// takes. The server tries a CASE's branches in turn for every row it
// updates, so one statement's work grows with the square of its slots:
// 500 slots took about 25 ms on MariaDB 10.11, where statements of 64
// (eight of them, in the same transaction) take a few.
const keySlotTakeChunk = 64

// takeKeySlotsPart is takeKeySlots for one statement.
func (d *Driver) takeKeySlotsPart(ctx context.Context, tx *sql.Tx, queue string, rows []*driver.JobRow, slots []keySlot) error {
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
	return d.execTake(ctx, d.main, tx, q, args, k, "took", "key slots")
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

// lockKeySlots locks, in tx and in one statement (key_slot_lock_part, or
// key_slot_lock_in when limit is at most count), up to count open slots
// of each of queue's keys (sorted, in key order), free ones below limit
// and ones kept for a job at any n, skipping those other claims hold, and
// returns each key's free slots and its slots kept for a job, in slot
// order.
func (d *Driver) lockKeySlots(ctx context.Context, tx *sql.Tx, queue string, sorted []string, limit, count int64) (map[string][]int64, map[string][]keySlot, error) {
	var q string
	var args []any
	var cached bool
	if limit <= count {
		// Every open slot below the limit: one range read (key_slot_lock_in).
		b := bucket(len(sorted))
		q, cached = strings.Replace(d.q.KeySlotLockIn, "{keys}", placeholders(b), 1), b <= maxCachedKeyParts
		args = make([]any, 0, b+2)
		args = append(args, queue)
		for _, key := range sorted {
			args = append(args, key)
		}
		for i := len(sorted); i < b; i++ {
			args = append(args, sorted[0])
		}
		args = append(args, limit)
	} else {
		var b int
		q, b, cached = keyParts(d.q.KeySlotLockPart, len(sorted))
		args = make([]any, 0, 4*b)
		for _, key := range sorted {
			args = append(args, queue, key, limit, count)
		}
		for i := len(sorted); i < b; i++ {
			args = append(args, nil, nil, limit, count) // a NULL queue matches nothing
		}
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

// shallowKey bounds the available jobs (as the walk counted them) of a key
// whose next jobs readKeyJobs reads by key_jobs_in, and shallowRead the
// jobs that statement reads in all.
const (
	shallowKey  = 32
	shallowRead = 2048
)

// readKeyJobs reads, in tx, up to counts[i] of the next available jobs of
// queue's key keys[i]: Ordered its oldest by id, else its next by
// priority then id. The keys that depth (the walk's counts; nil for none)
// says are shallow, at most shallowKey available jobs each and
// shallowRead in all, are read in one statement of every job of theirs
// (key_jobs_in): when
// they are all of keys, or at least minShallowRead of them, the others in
// one statement of a part per key (key_head_part, key_next_part), each
// with its own LIMIT, which reads no further into a deep key.
func (d *Driver) readKeyJobs(ctx context.Context, tx *sql.Tx, queue string, ordered bool, keys []string, counts []int64, depth map[string]int) (map[string][]int64, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	var shallow, deep []string
	var deepCounts []int64
	read := 0
	for i, key := range keys {
		if n := depth[key]; n > 0 && n <= shallowKey && read+n <= shallowRead {
			shallow = append(shallow, key)
			read += n
		} else {
			deep = append(deep, key)
			deepCounts = append(deepCounts, counts[i])
		}
	}
	if len(deep) > 0 && len(shallow) < minShallowRead {
		shallow, deep, deepCounts = nil, keys, counts
	}
	out := make(map[string][]int64, len(keys))
	if len(shallow) > 0 {
		b := bucket(len(shallow))
		q := strings.Replace(d.q.KeyJobsIn, "{keys}", placeholders(b), 1)
		args := make([]any, 0, b+1)
		args = append(args, queue)
		for _, key := range shallow {
			args = append(args, key)
		}
		for i := len(shallow); i < b; i++ {
			args = append(args, shallow[0])
		}
		if err := d.readKeyJobRows(ctx, tx, b <= maxCachedKeyParts, q, args, ordered, out); err != nil {
			return nil, err
		}
		want := make(map[string]int, len(keys))
		for i, key := range keys {
			want[key] = int(counts[i])
		}
		for key, ids := range out {
			out[key] = ids[:min(len(ids), want[key])]
		}
	}
	if len(deep) == 0 {
		return out, nil
	}
	part := d.q.KeyNextPart
	if ordered {
		part = d.q.KeyHeadPart
	}
	q, b, cached := keyParts(part, len(deep))
	args := make([]any, 0, 3*b)
	for i, key := range deep {
		args = append(args, queue, key, deepCounts[i])
	}
	for i := len(deep); i < b; i++ {
		args = append(args, nil, nil, int64(1)) // a NULL queue matches nothing
	}
	if err := d.readKeyJobRows(ctx, tx, cached, q, args, ordered, out); err != nil {
		return nil, err
	}
	return out, nil
}

// minShallowRead is the fewest shallow keys read in a statement of their
// own when some of the keys are deep (see readKeyJobs).
const minShallowRead = 8

// readKeyJobRows runs q, a read of keys' jobs (lkey, priority, id rows),
// in tx and adds each key's ids to out in the key's order: by id when
// ordered, else by priority then id.
func (d *Driver) readKeyJobRows(ctx context.Context, tx *sql.Tx, cached bool, q string, args []any, ordered bool, out map[string][]int64) error {
	r, err := d.query(ctx, tx, cached, q, args...)
	if err != nil {
		return err
	}
	defer r.Close()
	type job struct{ prio, id int64 }
	jobs := map[string][]job{}
	for r.Next() {
		var key string
		var j job
		if err := r.Scan(&key, &j.prio, &j.id); err != nil {
			return err
		}
		jobs[key] = append(jobs[key], j)
	}
	if err := r.Err(); err != nil {
		return err
	}
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
	return nil
}

// keyUsage adds the key limits' use of queue to u: the keys with a slot
// held or kept, the keys whose rate window is full, and the available
// keyed jobs whose key has no open slot for them or no start left in its
// window (an admin read: it counts the queue's available keyed jobs).
func (d *Driver) keyUsage(ctx context.Context, queue string, u *driver.LimitUsage) error {
	limit := int64(u.Limits.KeyMaxRunning)
	rate, period := int64(u.Limits.KeyRate), micros(u.Limits.KeyRatePeriod)
	return d.retry(ctx, "limit usage", func() error {
		if err := d.db.QueryRowContext(ctx, d.q.KeysRunning, queue).Scan(&u.KeysRunning); err != nil {
			return err
		}
		u.KeysRated = 0
		if rate > 0 {
			if err := d.db.QueryRowContext(ctx, d.q.KeysRated, queue, rate, period, rate).Scan(&u.KeysRated); err != nil {
				return err
			}
		}
		u.KeyHeld = 0
		rows, err := d.db.QueryContext(ctx, d.q.KeyUsage, queue, queue, limit, queue, rate, period)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var avail, heldSlots, keptSlots, keptAvail, closed int64
			if err := rows.Scan(&avail, &heldSlots, &keptSlots, &keptAvail, &closed); err != nil {
				return err
			}
			if rate > 0 && closed >= rate {
				u.KeyHeld += avail // the key's window is full
				continue
			}
			if limit == 0 {
				continue // no slots per key
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
// freed by key_kept_free, fenced by the job and its state), deletes up to
// limit free key slots unused for a minute, at or beyond their key's
// limit, or of a queue without key limits (key_slot_trim), and up to
// limit rate slots stamped longer ago than their KeyRatePeriod or a
// minute, whichever is longer, or never, at or beyond their queue's
// KeyRate, or of a queue without one (key_rate_trim).
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
	if _, err := d.execCount(ctx, d.main, "rescue: trim key slots", true, d.q.KeySlotTrim, []any{int64(limit)}); err != nil {
		return err
	}
	_, err = d.execCount(ctx, d.main, "rescue: trim key rate slots", true, d.q.KeyRateTrim, []any{int64(limit)})
	return err
}
