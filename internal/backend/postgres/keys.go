package postgres

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

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
// once out of the window, or beyond a lowered rate.

// keyState is what a process remembers of a queue's key limits: the
// limits its last claim read (the walk before the claim's transaction
// needs KeyMaxRunning and the rate per key) and where that claim's walk
// of the keys stopped.
type keyState struct {
	max, order int
	// rate starts per key in periodUS microseconds (0: none).
	rate     int
	periodUS int64
	cursor   string
}

// keyed reports whether the state limits jobs per key.
func (st keyState) keyed() bool { return st.max > 0 || st.rate > 0 }

// keyStates holds the keyState of every queue this process claimed.
type keyStates struct {
	mu sync.Mutex
	m  map[string]keyState
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

// setCursor records where queue's last walk stopped.
func (k *keyStates) setCursor(queue, cursor string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st, ok := k.m[queue]; ok {
		st.cursor = cursor
		k.m[queue] = st
	}
}

// keyWalk is the result of seg_key_walk: the keys examined in walk order,
// whether each had room and whether its rate's window was full.
type keyWalk struct {
	keys  []string
	room  []bool
	rated []bool
}

// walkBudget bounds the keys one claim examines for want jobs.
func walkBudget(want int) int { return 4*want + 64 }

// walkKeys runs seg_key_walk on conn, outside any transaction, for a
// claim of want jobs of queue, under the key limits of st.
func (s *segStore) walkKeys(ctx context.Context, conn queryer, v *segView, queue string, st keyState, want int) (keyWalk, error) {
	var w keyWalk
	err := conn.QueryRow(ctx, s.stmt(&s.d.q.SegKeyWalk, v, v.live[phReady]),
		queue, st.cursor, walkBudget(want), want, st.max, st.rate, st.periodUS).Scan(&w.keys, &w.room, &w.rated)
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
// to allowance, and claims exactly those jobs. It returns them, the slots
// they take and stamp, whether a keyed job was left for want of a slot,
// of room in its key's window or of allowance, the keys whose window held
// jobs back, and whether the guard refused the claim.
func (s *segStore) claimKeyed(ctx context.Context, tx queryer, v *segView, p driver.ClaimParams, l limits, w keyWalk, allowance int) (rows []*driver.JobRow, takes keyTakes, held bool, rated []string, stale bool, err error) {
	q := &s.d.q
	keyMax, ordered, rate := l.keyMax, l.keyOrder > 0, l.keyRate > 0
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
		return nil, takes, held, rated, false, nil
	}
	slots := map[string][]keySlot{}
	rslots := map[string][]int32{} // open rate slots locked
	over := map[string]int{}       // held slots at or above a lowered limit
	r, err := tx.Query(ctx, q.KeyLock, p.Queue, cand, keyMax, l.keyRate, l.keyPeriodUS, allowance)
	if err != nil {
		return nil, takes, false, nil, false, err
	}
	for r.Next() {
		var k string
		var sl keySlot
		var above int
		if err := r.Scan(&k, &sl.n, &sl.kept, &above); err != nil {
			r.Close()
			return nil, takes, false, nil, false, err
		}
		if sl.n < 0 {
			rslots[k] = append(rslots[k], sl.n)
			continue
		}
		slots[k] = append(slots[k], sl)
		over[k] = above
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, takes, false, nil, false, err
	}
	var pkeys []string
	var cnts []int32
	var kept []int64
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
		if keyMax > 0 {
			free = -over[k]
			for _, sl := range ss {
				if sl.kept != 0 {
					kept = append(kept, sl.kept)
				} else {
					free++
				}
			}
			free = max(free, 0)
			if rate {
				free = min(free, len(rslots[k]))
			}
		}
		// One more than can be admitted: a head left over says that the
		// key holds jobs back.
		n := free + 1
		if ordered {
			n = 2
		}
		pkeys = append(pkeys, k)
		cnts = append(cnts, int32(n))
	}
	if len(pkeys) == 0 {
		return nil, takes, held, rated, false, nil
	}
	heads := map[string][]keyHead{}
	r, err = tx.Query(ctx, s.stmt(&q.SegKeyPick, v, v.live[phReady]), p.Queue, pkeys, cnts, ordered, kept)
	if err != nil {
		return nil, takes, false, nil, false, err
	}
	for r.Next() {
		var k string
		var h keyHead
		if err := r.Scan(&k, &h.id, &h.prio, &h.kept); err != nil {
			r.Close()
			return nil, takes, false, nil, false, err
		}
		heads[k] = append(heads[k], h)
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, takes, false, nil, false, err
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
		skip := over[k] // free slots that a lowered limit's held ones use up
		for _, sl := range slots[k] {
			if sl.kept == 0 {
				if skip > 0 {
					skip--
					continue
				}
				free = append(free, sl.n)
				continue
			}
			anyKept = true
			if keptHere[sl.kept] {
				admit = append(admit, pick{key: k, n: sl.n})
				admitIDs = append(admitIDs, sl.kept)
			}
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
		keptWaits := ordered && anyKept && len(admit) == 0
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
		for i, id := range admitIDs {
			if len(ids) == allowance {
				// The claim's own room is full: not held, the next
				// claim takes the rest at once.
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
	if len(ids) < allowance && len(w.keys) > 0 {
		last = w.keys[len(w.keys)-1]
	}
	if last != "" {
		s.d.keys.setCursor(p.Queue, last)
	}
	if len(ids) == 0 {
		return nil, takes, held, rated, false, nil
	}
	r, err = tx.Query(ctx, s.stmt(&q.SegClaimIDs, v, v.live[phReady], phRunning), p.Queue, ids, micros(p.Lease), p.Worker)
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
// live ready or waiting segment (seg_sweep_kept), on a view read anew.
func (s *segStore) sweepKept(ctx context.Context) (int64, error) {
	v, err := s.refresh(ctx, time.Now())
	if err != nil {
		return 0, err
	}
	var freed, woke int64
	err = s.d.pool.QueryRow(ctx, s.stmt(&s.d.q.SegSweepKept, v, v.srcs(phReady, phWaiting))).Scan(&freed, &woke)
	if s.goneSegment(err) {
		return 0, nil
	}
	return freed, err
}
