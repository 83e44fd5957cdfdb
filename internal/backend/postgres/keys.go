package postgres

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Key limits (driver.QueueLimits.KeyMaxRunning, Ordered): a job's key is
// the lkey column of its row, and each key of a limited queue has
// KeyMaxRunning slot rows in {p}key_slots, made on demand by the claims
// (seg_key_walk) and taken by the attempts they admit, as the queue's own
// slots are (limits.go). The statements that end an attempt free its key
// slot (segments.sql, kf), or keep it for an ordered key's job that waits
// for its retry.
//
// A rate per key (KeyRate, KeyRatePeriod) is held by rate slot rows of
// the same table, n -1 .. -KeyRate of each key, job_id and fence NULL,
// made on demand by the walk (unstamped: open) and stamped by the claims
// with the start each admitted. A slot is open once its stamp is at
// least KeyRatePeriod old; a claim locks open ones SKIP LOCKED and admits
// at most as many jobs of a key as it locked both free slots and open
// rate slots of it. No outcome frees a rate slot (the statements that
// free key slots match the held ones only); Rescue's sweep deletes them
// once out of the window (beyond a lowered rate too: until then a raised
// rate counts them).
//
// A fair queue (Fair) is claimed by the same walk and pick: each key
// walked takes at most its weight (weights.go) per turn, within what its
// slots and window admit, and once every key with due jobs had a turn,
// the keys cut by their weight alone get further rounds (fairRounds).
// Without KeyMaxRunning, Ordered or KeyRate it makes, locks and takes no
// slot: it orders the claim and holds no job back.

// keyState is what a process remembers of a queue's key limits: the
// limits its last claim read (the walk before the claim's transaction
// needs KeyMaxRunning and the rate per key) and where that claim's walk
// of the keys stopped.
type keyState struct {
	max, order int
	// rate starts per key in periodUS microseconds (0: none).
	rate     int
	periodUS int64
	// fair: the keys are served in turns (QueueLimits.Fair).
	fair   bool
	cursor string
	// taken: the jobs the key cursor took in a turn that the last claim
	// left unfinished (a fair queue's claim that filled up first): the
	// next walk starts at cursor, not after it. 0: its turn is over.
	taken int
}

// keyed reports whether the state limits jobs per key, or serves keys
// in turns: the keyed claim's walk runs.
func (st keyState) keyed() bool { return st.max > 0 || st.rate > 0 || st.fair }

// keyStates holds the keyState of every queue this process claimed.
type keyStates struct {
	mu sync.Mutex
	m  map[string]keyState
	// deep counts, per queue, the walks left to run without a window
	// (seg_key_walk): its last window found deep keys.
	deep map[string]int
}

const (
	// windowMax bounds the entries of a walk's window.
	windowMax = 4096
	// deepWalks is how many walks of a queue whose window found deep
	// keys run without one, before a window is tried again.
	deepWalks = 32
	// deepMin is the fewest entries a window must read to find keys deep.
	deepMin = 16
)

// window returns the entries of the window for the next walk of queue
// for want jobs (0: none, while its keys were last found deep).
func (k *keyStates) window(queue string, want int) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := k.deep[queue]; n > 0 {
		k.deep[queue] = n - 1
		return 0
	}
	return min(3*want+32, windowMax)
}

// sawWindow records that a walk's window held entries index entries of
// keys distinct keys: fewer than one key per four entries (keys that
// deep), over at least deepMin entries, turns the window off for the
// next deepWalks walks of queue, since a probe per key then reads less.
// A window cut short by the last key (a walk near the end of the keys)
// says nothing of their depth unless it read that many.
func (k *keyStates) sawWindow(queue string, entries, keys int) {
	if entries < deepMin || 4*keys >= entries {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.deep == nil {
		k.deep = map[string]int{}
	}
	k.deep[queue] = deepWalks
}

// get returns queue's state and whether one is known.
func (k *keyStates) get(queue string) (keyState, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	st, ok := k.m[queue]
	return st, ok
}

// set records queue's state.
func (k *keyStates) set(queue string, st keyState) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]keyState{}
	}
	k.m[queue] = st
}

// setCursor records where queue's last walk stopped: at key cursor,
// which took taken jobs of a turn left unfinished (0: its turn is over).
func (k *keyStates) setCursor(queue, cursor string, taken int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st, ok := k.m[queue]; ok {
		st.cursor, st.taken = cursor, taken
		k.m[queue] = st
	}
}

// keyWalk is the result of seg_key_walk: the keys examined in walk order,
// whether each had room and whether its rate's window was full.
type keyWalk struct {
	keys  []string
	room  []bool
	rated []bool
	// from and taken: the cursor the walk started from (at from when
	// taken > 0, a turn left unfinished with taken jobs; after it else).
	from  string
	taken int
	// wentries and wkeys: the index entries the walk's window read, and
	// the distinct keys they held.
	wentries, wkeys int
}

// walkBudget bounds the keys one claim examines for want jobs.
func walkBudget(want int) int { return 4*want + 64 }

// queueWalk queues seg_key_walk in b for a claim of want jobs of queue,
// under the key limits of st.
func (s *segStore) queueWalk(b *pgx.Batch, v *segView, queue string, st keyState, want int) {
	b.Queue(s.stmt(&s.d.q.SegKeyWalk, v, v.live[phReady]),
		queue, st.cursor, walkBudget(want), want, st.max, st.rate, st.periodUS, st.taken > 0,
		s.d.keys.window(queue, want))
}

// readWalk reads the result of the walk queueWalk queued for st from br.
func readWalk(br pgx.BatchResults, st keyState) (keyWalk, error) {
	w := keyWalk{from: st.cursor, taken: st.taken}
	err := br.QueryRow().Scan(&w.keys, &w.room, &w.rated, &w.wkeys, &w.wentries)
	return w, err
}

// keyTakes are the key slots a keyed claim takes, one per claimed job
// that took a slot, and the rate slots it stamps (a negative number, id
// and fence 0), one per claimed job of a rated queue.
type keyTakes struct {
	keys        []string
	ns          []int32
	ids, fences []int64
}

// keySlot is a slot key_lock locked: its number and, when kept for a
// job waiting for its retry, that job.
type keySlot struct {
	n    int32
	kept int64
}

// keyHead is a job seg_key_pick found for a key.
type keyHead struct {
	id   int64
	prio int32
	kept bool
}

// claimKeyed is the keyed part of a limited claim, in its transaction on
// conn, under the key limits of l: it locks the open slots of the keys of
// w that had room (and, with a rate per key, open rate slots of each, up
// to allowance), picks each key's jobs for them (a kept slot admits only
// its own job; free slots the key's next jobs by priority then id, or for
// an ordered queue its oldest job only, and only while no slot of the key
// is kept; without KeyMaxRunning, no concurrency slot is needed; with a
// rate, each admitted job needs an open rate slot too), in walk order up
// to allowance (in a fair queue, at most each key's weight per turn, and
// further rounds once every key had one: fairRounds), and claims exactly
// those jobs. It returns them, the slots
// they take and stamp, whether a keyed job was left for want of a slot,
// of room in its key's window or of allowance, the keys whose window held
// jobs back, and whether the guard refused the claim.
func (s *segStore) claimKeyed(ctx context.Context, tx queryer, v *segView, p driver.ClaimParams, l limits, w keyWalk, allowance int) (rows []*driver.JobRow, takes keyTakes, held bool, rated []string, stale bool, err error) {
	q := &s.d.q
	keyMax, ordered, rate := l.keyMax, l.keyOrder > 0, l.keyRate > 0
	// A key's turn: at most its weight in a fair queue, else unbounded.
	var weights map[string]int
	if l.fair {
		if weights, err = s.d.weights.Get(p.Queue, l.weights); err != nil {
			return nil, keyTakes{}, false, nil, false, fmt.Errorf("read key weights: %w", err)
		}
	}
	turn := func(k string) int {
		if !l.fair {
			return math.MaxInt32
		}
		return driver.KeyWeight(weights, k)
	}
	var cand []string
	for i, k := range w.keys {
		if w.room[i] {
			cand = append(cand, k)
			continue
		}
		held = true
		if w.rated[i] {
			rated = append(rated, k)
		}
	}
	if len(cand) == 0 {
		// No key it looked at had room: the next claim looks at the
		// keys after them, not at the same ones again (a key with room
		// beyond the walk's budget of busy keys would never be reached).
		s.walkedPast(p.Queue, w)
		return nil, takes, held, rated, false, nil
	}
	// key_lock and seg_key_pick in one round trip: the heads are read
	// for every candidate, as many as its slots could admit at most (the
	// pick's snapshot is taken after the lock, as if it were sent once
	// the locks were known), and each key keeps below what the slots it
	// did lock admit.
	bound := allowance // fair alone: no slot bounds the key
	switch {
	case keyMax > 0:
		bound = keyMax // its free slots, below the limit
	case rate:
		bound = min(l.keyRate, allowance) // its open rate slots locked
	}
	need := func(k string) int {
		// One more than can be admitted: a head left over says that the
		// key holds jobs back, or, past its turn, that it has more.
		if ordered {
			return 2
		}
		return min(bound, turn(k)) + 1
	}
	ucnts := make([]int32, len(cand))
	for i, k := range cand {
		ucnts[i] = int32(need(k))
	}
	b := &pgx.Batch{}
	if l.keyLimited() {
		b.Queue(q.KeyLock, p.Queue, cand, l.keyMax, l.keyRate, l.keyPeriodUS, allowance)
	}
	sig := ""
	if ordered {
		sig = v.liveSig(phReady)
	}
	b.Queue(s.stmt(&q.SegKeyPick, v, v.live[phReady]), p.Queue, cand, ucnts, ordered, keyMax > 0, sig)
	br := tx.SendBatch(ctx, b)
	slots := map[string][]keySlot{}
	rslots := map[string][]int32{} // open rate slots locked
	over := map[string]int{}       // held or kept slots at or above a lowered limit
	// Fair alone takes no slot: nothing to lock.
	if l.keyLimited() {
		if err := scanKeyLock(br, slots, rslots, over); err != nil {
			br.Close()
			return nil, takes, false, nil, false, err
		}
	}
	all := map[string][]keyHead{}
	if err := scanHeads(br, all); err != nil {
		br.Close()
		return nil, takes, false, nil, false, err
	}
	if err := br.Close(); err != nil {
		return nil, takes, false, nil, false, err
	}
	if hs := all[""]; len(hs) > 0 && hs[0].id == -1 {
		// The registry's live ready segments are not the view's: the
		// heads read may miss an ordered key's oldest job (seg_key_pick).
		return nil, takes, false, nil, true, nil
	}
	var pkeys []string
	cnts := map[string]int{}
	for _, k := range cand {
		ss := slots[k]
		if keyMax > 0 && len(ss) == 0 {
			// Every slot held, or locked by another claimer.
			held = true
			continue
		}
		if rate && len(rslots[k]) == 0 {
			// Its window filled since the walk, or its open rate slots
			// are locked by another claimer.
			held = true
			rated = append(rated, k)
			continue
		}
		free := len(rslots[k])
		if !l.keyLimited() {
			// Fair alone: no slot bounds the key, the claim does.
			free = allowance
		}
		if keyMax > 0 {
			free = -over[k] // a kept one above this claim locked too
			for _, sl := range ss {
				if sl.kept == 0 {
					free++
				}
			}
			free = max(free, 0)
			if rate {
				free = min(free, len(rslots[k]))
			}
		}
		n := min(free, turn(k)) + 1
		if ordered {
			n = 2
		}
		pkeys = append(pkeys, k)
		cnts[k] = n
	}
	if len(pkeys) == 0 {
		s.walkedPast(p.Queue, w)
		return nil, takes, held, rated, false, nil
	}
	// Each key's heads as a pick of its own count would have read them:
	// its first cnts[k] jobs in the claim's order, and the jobs that the
	// kept slots it locked wait for.
	heads := map[string][]keyHead{}
	for _, k := range pkeys {
		locked := map[int64]bool{}
		for _, sl := range slots[k] {
			if sl.kept != 0 {
				locked[sl.kept] = true
			}
		}
		var hs []keyHead
		for _, h := range all[k] {
			if !h.kept {
				hs = append(hs, h)
			}
		}
		slices.SortFunc(hs, func(a, b keyHead) int {
			if !ordered && a.prio != b.prio {
				return cmp.Compare(a.prio, b.prio)
			}
			return cmp.Compare(a.id, b.id)
		})
		hs = hs[:min(len(hs), cnts[k])]
		for _, h := range all[k] {
			if h.kept && locked[h.id] {
				hs = append(hs, h)
			}
		}
		heads[k] = hs
	}
	// The jobs admitted, key by key in walk order, each with its slot
	// (n, -1: none without KeyMaxRunning) and its rate slot (r, 0: none).
	type pick struct {
		key  string
		n, r int32
	}
	picked := map[int64]pick{}
	var ids []int64
	last := ""
	lastTaken := 0 // jobs last took of a turn left unfinished
	// The keys of a fair queue cut by their turn alone, in walk order:
	// they get further turns if the claim has room once every key had
	// one.
	var more []fairKey
	for _, k := range pkeys {
		hs := heads[k]
		keptHere := map[int64]bool{}
		for _, h := range hs {
			if h.kept {
				keptHere[h.id] = true
			}
		}
		var others []keyHead
		for _, h := range hs {
			if !h.kept && !keptHere[h.id] {
				others = append(others, h)
			}
		}
		slices.SortFunc(others, func(a, b keyHead) int {
			if !ordered && a.prio != b.prio {
				return cmp.Compare(a.prio, b.prio)
			}
			return cmp.Compare(a.id, b.id)
		})
		anyKept := false
		var free []int32
		var admit []pick
		var admitIDs []int64
		if keyMax == 0 {
			// A rate per key alone: no concurrency slot to take.
			for range others {
				free = append(free, -1)
			}
		}
		// Slots at or above a lowered limit, held by attempts that began
		// under the higher one or kept for a job's retry, still count
		// against the key: each takes one free slot out of the claim's
		// reach (the walk gave the key room: fewer held than the limit).
		// A kept one this claim locked admits its job on its own row
		// once it has a free slot to count against, so that the key
		// runs no more than the limit; until then it holds that job
		// back, and in an ordered queue the key with it. over counts the
		// kept ones this claim locked too: they are counted here.
		var keptAbove []keySlot
		for _, sl := range slots[k] {
			if sl.kept != 0 && sl.n >= int32(keyMax) {
				keptAbove = append(keptAbove, sl)
			}
		}
		skip := max(over[k]-len(keptAbove), 0) // free slots that the held ones above use up
		keptBlocked := false                   // a due kept job above waits for a free slot
		for _, sl := range slots[k] {
			if sl.kept == 0 {
				if skip > 0 {
					skip--
					continue
				}
				free = append(free, sl.n)
				continue
			}
			if sl.n >= int32(keyMax) {
				continue
			}
			anyKept = true
			if keptHere[sl.kept] {
				admit = append(admit, pick{key: k, n: sl.n})
				admitIDs = append(admitIDs, sl.kept)
			}
		}
		for _, sl := range keptAbove {
			anyKept = true
			if len(free) == 0 {
				keptBlocked = keptBlocked || keptHere[sl.kept]
				continue
			}
			free = free[:len(free)-1]
			if keptHere[sl.kept] {
				admit = append(admit, pick{key: k, n: sl.n})
				admitIDs = append(admitIDs, sl.kept)
			}
		}
		if keptBlocked {
			held = true // a slot's end admits it
		}
		if ordered && (anyKept || len(free) > 1) {
			free = free[:min(len(free), 1)]
			if anyKept {
				free = nil
			}
		}
		// An ordered key kept for a job that is not due waits for that
		// job's retry, which no attempt's end brings nearer (its
		// promotion wakes claims): its jobs do not hold the claim.
		keptWaits := ordered && anyKept && len(admit) == 0 && !keptBlocked
		left := 0 // jobs of the key left for want of a free slot
		for i, h := range others {
			if i < len(free) {
				admit = append(admit, pick{key: k, n: free[i]})
				admitIDs = append(admitIDs, h.id)
			} else if !keptWaits {
				held = true
				left++
			}
		}
		if rate {
			// Each start takes an open rate slot of the key (a kept
			// slot's retry too). A key left with jobs once its open
			// slots are used waits for its window too (whether or not
			// a slot of the key frees first). The claim locked at most
			// allowance of them: beyond that its own room cuts it, not
			// the window.
			rs := rslots[k]
			if len(admit)+left > len(rs) && len(rs) < allowance {
				held = true
				rated = append(rated, k)
			}
			if len(admit) > len(rs) {
				admit, admitIDs = admit[:len(rs)], admitIDs[:len(rs)]
			}
			for i := range admit {
				admit[i].r = rs[i]
			}
		}
		// A turn the last claim left unfinished goes on for the rest of
		// the key's weight (at least one job, should the weight have
		// been lowered since).
		t, before := turn(k), 0
		if l.fair && k == w.from && w.taken > 0 {
			before = w.taken
			t = max(t-before, 1)
		}
		if len(admit) > t {
			// Cut by its turn alone: its slots and window admit more.
			fk := fairKey{key: k, turn: turn(k), taken: t, room: allowance}
			if keyMax > 0 {
				fk.ns = free[t:]
				fk.room = len(fk.ns)
			}
			if rate {
				fk.rs = rslots[k][t:]
				fk.room = min(fk.room, len(fk.rs))
			}
			more = append(more, fk)
			admit, admitIDs = admit[:t], admitIDs[:t]
		}
		for i, id := range admitIDs {
			if len(ids) == allowance {
				// The claim's own room is full: not held, the next
				// claim takes the rest at once (in a fair queue, the
				// rest of this key's turn first).
				if l.fair {
					lastTaken = before + i
				}
				break
			}
			picked[id] = admit[i]
			ids = append(ids, id)
			last = k
		}
		if len(ids) == allowance {
			break
		}
		last = k
	}
	if len(ids) < allowance && len(more) > 0 && w.ranOut(p.Limit) {
		// Every key with due jobs had its turn, and the claim has room:
		// further turns for the keys that have more, in walk order, up
		// to its turn each per round.
		taken := func(id int64) bool { _, ok := picked[id]; return ok }
		extra, partial, held2, rated2, err := s.fairRounds(ctx, tx, v, p, l, more, taken, allowance-len(ids), allowance)
		if err != nil {
			return nil, takes, false, nil, false, err
		}
		lastTaken = partial
		held = held || held2
		rated = append(rated, rated2...)
		for _, e := range extra {
			picked[e.id] = pick{key: e.key, n: e.n, r: e.r}
			ids = append(ids, e.id)
		}
		if len(ids) == allowance && len(extra) > 0 {
			last = extra[len(extra)-1].key
		}
	}
	if len(ids) < allowance && len(w.keys) > 0 {
		last, lastTaken = w.keys[len(w.keys)-1], 0
	}
	if last != "" {
		s.d.keys.setCursor(p.Queue, last, lastTaken)
	}
	if len(ids) == 0 {
		return nil, takes, held, rated, false, nil
	}
	r, err := tx.Query(ctx, s.stmt(&q.SegClaimIDs, v, v.live[phReady], phRunning), p.Queue, ids, micros(p.Lease), p.Worker)
	if err != nil {
		return nil, takes, false, nil, false, err
	}
	var pos int64
	out, err := s.d.scanClaimed(r, p, &pos)
	if err != nil {
		return nil, takes, false, nil, false, err
	}
	for _, j := range out {
		if j.ID == -1 {
			return nil, takes, false, nil, true, nil
		}
		pk := picked[j.ID]
		if pk.n >= 0 {
			takes.keys = append(takes.keys, pk.key)
			takes.ns = append(takes.ns, pk.n)
			takes.ids = append(takes.ids, j.ID)
			takes.fences = append(takes.fences, j.Fence)
		}
		if pk.r < 0 {
			takes.keys = append(takes.keys, pk.key)
			takes.ns = append(takes.ns, pk.r)
			takes.ids = append(takes.ids, 0)
			takes.fences = append(takes.fences, 0)
		}
	}
	return out, takes, held, rated, false, nil
}

// walkedPast moves queue's cursor to the last key the walk w examined,
// when it examined any: a claim that took no job of them goes on after
// them next time.
func (s *segStore) walkedPast(queue string, w keyWalk) {
	if len(w.keys) > 0 {
		s.d.keys.setCursor(queue, w.keys[len(w.keys)-1], 0)
	}
}

// claimNoKey claims up to p.Limit jobs without a key of p.Queue, a queue
// with key limits, in tx: seg_claim restricted to them, from the queue's
// start (the claim hints serve the plain claim only). stale says that
// the guard refused it.
func (s *segStore) claimNoKey(ctx context.Context, tx queryer, v *segView, p driver.ClaimParams) ([]*driver.JobRow, bool, error) {
	r, err := tx.Query(ctx, s.stmt(&s.d.q.SegClaimNoKey, v, v.live[phReady], phRunning),
		p.Queue, p.Limit, micros(p.Lease), p.Worker, noHint.prio, noHint.pos)
	if err != nil {
		return nil, false, err
	}
	var pos int64
	out, err := s.d.scanClaimed(r, p, &pos)
	if err != nil {
		return nil, false, err
	}
	for i, j := range out {
		if j.ID == -1 {
			if len(out) == 1 {
				return nil, true, nil
			}
			// Jobs moved before a reclaim: they are this claim's.
			return slices.Delete(out, i, i+1), false, nil
		}
	}
	return out, false, nil
}

// keyHeld returns, per queue with key limits, its ready jobs with a key
// that no slot of their key is open for, or whose key's rate window is
// full (LimitUsage).
func (s *segStore) keyHeld(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	err := s.withView(ctx, func(v *segView) error {
		clear(out)
		rows, err := s.d.pool.Query(ctx, s.stmt(&s.d.q.SegKeyHeld, v, v.live[phReady]))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var q string
			var n int64
			if err := rows.Scan(&q, &n); err != nil {
				return err
			}
			out[q] = n
		}
		return rows.Err()
	})
	return out, err
}

// sweepKept frees the key slots kept for jobs that no longer wait in a
// live ready or waiting segment (seg_sweep_kept), on a view read anew,
// whose ready and waiting segments the statement checks the registry
// still names in its own snapshot; if not, it frees nothing and runs
// again on a fresh view (as sweepSlots).
func (s *segStore) sweepKept(ctx context.Context) (int64, error) {
	return s.sweepChecked(ctx, &s.d.q.SegSweepKept, "kept key slots", phReady, phWaiting)
}

// ranOut reports whether the walk examined every key with due jobs: it
// stopped for want of keys, neither at its budget nor at want keys with
// room.
func (w keyWalk) ranOut(want int) bool {
	if len(w.keys) >= walkBudget(want) {
		return false
	}
	n := 0
	for _, r := range w.room {
		if r {
			n++
		}
	}
	return n < want
}

// fairKey is a key of a fair queue whose turn cut what its slots and
// window admit: the jobs it took (taken, turn), how many more they admit
// (room), and its free concurrency slots (ns; none without
// KeyMaxRunning) and open rate slots (rs; none without a rate per key)
// left after its turn, in the order they are taken.
type fairKey struct {
	key         string
	turn, taken int
	room        int
	ns, rs      []int32
}

// fairPick is a job a further turn admits, with its key's slot (n, -1:
// none) and rate slot (r, 0: none).
type fairPick struct {
	key  string
	id   int64
	n, r int32
}

// fairRoundsBound bounds the extra jobs fairRounds reads for a claim of
// room more jobs, beyond which each key reads its share of room only.
func fairRoundsBound(room int) int { return 2*room + 64 }

// fairRounds gives the keys ks (walk order) of a fair queue further
// turns for the room left in the claim: each round, each key that has
// more takes up to its turn, until the room is used or no key has more.
// Each key's extra jobs are read once, in one statement for all, skipping
// those the claim took already (taken): up to the room (or what its slots
// and window admit), or, when that would read more than fairRoundsBound,
// up to its share of the room by weight.
// It returns the jobs admitted in round order, the jobs the last key
// took of a turn the room cut (0: none was cut), whether a key was left
// with jobs for want of a slot or of room in its window, and the keys
// whose window did.
func (s *segStore) fairRounds(ctx context.Context, tx queryer, v *segView, p driver.ClaimParams, l limits, ks []fairKey, taken func(id int64) bool, room, allowance int) (out []fairPick, partial int, held bool, rated []string, err error) {
	ext := make([]int, len(ks))
	total, weight := 0, 0
	for i, k := range ks {
		ext[i] = min(k.room, room)
		total += ext[i]
		weight += k.turn
	}
	if total > fairRoundsBound(room) {
		for i, k := range ks {
			ext[i] = min(k.room, (room*k.turn+weight-1)/weight)
		}
	}
	keys := make([]string, len(ks))
	cnts := make([]int32, len(ks))
	for i, k := range ks {
		// The jobs it took come first again: one more than it may take
		// tells whether it is left with jobs.
		keys[i], cnts[i] = k.key, int32(k.taken+ext[i]+1)
	}
	r, err := tx.Query(ctx, s.stmt(&s.d.q.SegKeyPick, v, v.live[phReady]), p.Queue, keys, cnts, false, false, "")
	if err != nil {
		return nil, 0, false, nil, err
	}
	heads := map[string][]keyHead{}
	for r.Next() {
		var k string
		var h keyHead
		if err := r.Scan(&k, &h.id, &h.prio, &h.kept); err != nil {
			r.Close()
			return nil, 0, false, nil, err
		}
		if !h.kept && !taken(h.id) {
			heads[k] = append(heads[k], h)
		}
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, 0, false, nil, err
	}
	used := make([]int, len(ks))
	for i, k := range ks {
		hs := heads[k.key]
		slices.SortFunc(hs, func(a, b keyHead) int {
			if a.prio != b.prio {
				return cmp.Compare(a.prio, b.prio)
			}
			return cmp.Compare(a.id, b.id)
		})
		heads[k.key] = hs
		ext[i] = min(ext[i], len(hs))
	}
	for len(out) < room {
		took := false
		for i, k := range ks {
			t := min(k.turn, ext[i]-used[i], room-len(out))
			// The room cut the key's turn: the next claim goes on with
			// it.
			partial = 0
			if t < min(k.turn, ext[i]-used[i]) {
				partial = t
			}
			for range t {
				u := used[i]
				fp := fairPick{key: k.key, id: heads[k.key][u].id, n: -1}
				if l.keyMax > 0 {
					fp.n = k.ns[u]
				}
				if l.keyRate > 0 {
					fp.r = k.rs[u]
				}
				out = append(out, fp)
				used[i]++
				took = true
			}
			if len(out) == room {
				break
			}
		}
		if !took {
			break
		}
	}
	for i, k := range ks {
		if used[i] == k.room && len(heads[k.key]) > used[i] {
			// Its slots or window admit no more of its jobs (a fair
			// queue without key limits has room for the whole claim:
			// never here).
			held = true
			// The window cut it, unless the claim's own room did (it
			// locked at most allowance rate slots of the key).
			if l.keyRate > 0 && (l.keyMax == 0 || len(k.rs) <= len(k.ns)) && k.taken+len(k.rs) < allowance {
				rated = append(rated, k.key)
			}
		}
	}
	return out, partial, held, rated, nil
}

// scanKeyLock reads key_lock's rows from br: the concurrency slots
// locked per key (slots), the rate slots (rslots) and the held slots at
// or above a lowered limit (over).
func scanKeyLock(br pgx.BatchResults, slots map[string][]keySlot, rslots map[string][]int32, over map[string]int) error {
	r, err := br.Query()
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Next() {
		var k string
		var sl keySlot
		var above int
		if err := r.Scan(&k, &sl.n, &sl.kept, &above); err != nil {
			return err
		}
		if sl.n < 0 {
			rslots[k] = append(rslots[k], sl.n)
			continue
		}
		slots[k] = append(slots[k], sl)
		over[k] = above
	}
	return r.Err()
}

// scanHeads reads seg_key_pick's rows from br into heads, per key.
func scanHeads(br pgx.BatchResults, heads map[string][]keyHead) error {
	r, err := br.Query()
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Next() {
		var k string
		var h keyHead
		if err := r.Scan(&k, &h.id, &h.prio, &h.kept); err != nil {
			return err
		}
		heads[k] = append(heads[k], h)
	}
	return r.Err()
}
