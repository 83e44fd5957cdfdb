package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rotation and reclaim of segments, run by the maintenance leader:
// Maintain seals, reclaims and drops; Prune seals and reclaims finished
// segments by age (retention). Every step is a short transaction of its own under
// a per-prefix advisory lock, and every lock on a segment table is taken
// NOWAIT: when it is not free at once (a worker is inside, or a held
// snapshot read the table) the step gives up and the next round tries
// again, so no ACCESS EXCLUSIVE request ever waits in a lock queue in
// front of the workers.

// segMaintEvery rate-limits maintenance rounds.
const segMaintEvery = 200 * time.Millisecond

// regRow is one registry row as maintenance reads it.
type regRow struct {
	tbl, phase, status string
	inc                int64
	graceOver          bool
	// toCount: a sealed done or dead segment past tuning.lateWrites
	// whose counts are not recorded (see recordCounts).
	toCount bool
	// age is retention's age, for a finished segment it reclaims: its
	// newest row must still be older under the reclaim's lock (see
	// leftovers).
	age time.Duration
}

// maintain runs one round of rotation and reclaim, unless one ran less
// than segMaintEvery ago, and reports what it did (see Maintain).
func (s *segStore) maintain(ctx context.Context) (map[string]int, error) {
	s.maintMu.Lock()
	defer s.maintMu.Unlock()
	if time.Since(s.lastMaint) < segMaintEvery {
		return nil, nil
	}
	s.lastMaint = time.Now()
	before := s.counts()
	err := s.round(ctx)
	after := s.counts()
	report := map[string]int{}
	for task, n := range after {
		if d := n - before[task]; d > 0 {
			report[task] = int(d)
		}
	}
	return report, err
}

// counts returns the maintenance counters by task.
func (s *segStore) counts() map[string]int64 {
	return map[string]int64{
		"sealed": s.sealed.Load(), "reclaimed": s.reclaims.Load(), "drained": s.drained.Load(),
		"created": s.created.Load(), "dropped": s.dropped.Load(), "counted": s.counted.Load(),
		"synced": s.synced.Load(), "refused": s.refusals.Load(),
	}
}

// round seals full current segments, reclaims drained-out sealed ones,
// truncates drained ones whose lock is free and drops extra free tables.
func (s *segStore) round(ctx context.Context) error {
	regs, err := s.registry(ctx)
	if err != nil {
		return err
	}
	changed, err := s.syncCurrent(ctx, regs)
	if err != nil {
		return err
	}
	// A reclaim may have moved jobs into the current ready segment below
	// a claim hint (see claimHints), also in a round that fails later on;
	// other processes start theirs over on the notification below.
	defer func() {
		if changed {
			// This process's own view is stale too: the next statement
			// reads the registry (others do on the notification below).
			s.invalidate()
			s.hints.wakeAll()
		}
	}()
	for _, r := range regs {
		limit := s.tune.sealBytes
		if r.phase == phDone || r.phase == phDead {
			limit = s.tune.finishedBytes
		}
		if r.status != "current" {
			continue
		}
		var size int64
		if err := s.d.pool.QueryRow(ctx, s.d.q.SegSize, r.tbl).Scan(&size); err != nil {
			return err
		}
		if size >= limit {
			if err := s.rotate(ctx, r.phase); err != nil {
				return err
			}
			changed = true
			continue
		}
		if err := s.analyzeGrown(ctx, r.tbl, r.phase, size, 64<<10); err != nil {
			return err
		}
	}
	// The key slots (key limits): the keyed claim's statements on them
	// keep generic plans too, and one made while the table was a few
	// rows scans a queue's every slot for each slot it takes. From its
	// first page on, then each time it doubles.
	ks := s.d.prefix + "key_slots"
	var size int64
	if err := s.d.pool.QueryRow(ctx, s.d.q.SegSize, ks).Scan(&size); err != nil {
		return err
	}
	if err := s.analyzeGrown(ctx, ks, "", size, 1); err != nil {
		return err
	}
	free := map[string]int{}
	for _, r := range regs {
		var ok bool
		switch {
		case r.status == "sealed" && r.graceOver && r.phase != phDone && r.phase != phDead:
			ok, _, err = s.reclaim(ctx, r, true, false)
		case r.status == "drained":
			ok, _, err = s.reclaim(ctx, r, false, false)
		case r.status == "free":
			free[r.phase]++
			if free[r.phase] > s.tune.ring {
				ok, err = s.dropSegment(ctx, r)
			}
		}
		if err != nil {
			return err
		}
		changed = changed || ok
	}
	// One finished segment counted per round: a 64 MiB segment takes a
	// scan, and a round should stay short.
	for _, r := range regs {
		if r.toCount {
			if _, err := s.recordCounts(ctx, r.tbl); err != nil {
				return err
			}
			break
		}
	}
	if changed {
		_, err := s.d.pool.Exec(ctx, s.d.q.SegNotify)
		return err
	}
	return nil
}

// recordCounts records the job counts of a sealed done or dead segment in
// the registry, which Stats then reads instead of counting the segment.
// It advances the segment's incarnation first, so that a late write from
// a process whose view still takes it for current fails its guard. Its
// rows change after that only by a by-hand retry taking one out, which
// clears the counts in its own transaction; the registry row's lock
// (seg_counts_lock) orders the two, so a count never outlives a retry it
// did not see. It reports whether it recorded them.
func (s *segStore) recordCounts(ctx context.Context, tbl string) (bool, error) {
	ok, err := s.maintTx(ctx, func(tx pgx.Tx) error {
		var due bool
		err := tx.QueryRow(ctx, s.d.q.SegCountsLock, tbl).Scan(&due)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !due) {
			return errSkip
		}
		if err != nil {
			return err
		}
		// No writer inside while counting (a retry out of the segment,
		// a late write); refused at once if one is, for the next round.
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegLockShare, tbl, "")); err != nil {
			return err
		}
		// Its list indexes, now that no more rows enter it.
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegIndexFinished, tbl, "")); err != nil {
			return err
		}
		var inc int64
		if err := tx.QueryRow(ctx, s.table(s.d.q.SegAdvance, tbl, "")).Scan(&inc); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, s.table(s.d.q.SegRecordCounts, tbl, ""), tbl, inc)
		return err
	})
	if ok {
		s.counted.Add(1)
	}
	return ok, err
}

// syncCurrent sets the incarnation sequence of every current segment
// whose sequence is not at its registry incarnation back to it (see
// seg_sync in segments.sql: after a crash, a sequence advanced by nextval
// resumes up to 32 past it, and every insert into or claim through the
// segment would be refused by its guard for good). It reports whether it
// changed any.
func (s *segStore) syncCurrent(ctx context.Context, regs []regRow) (bool, error) {
	var cur []string
	for _, r := range regs {
		if r.status == "current" {
			cur = append(cur, r.tbl)
		}
	}
	if len(cur) == 0 {
		return false, nil
	}
	rows, err := s.d.pool.Query(ctx, expandEach(s.d.q.SegOutOfSync, cur))
	if err != nil {
		return false, err
	}
	off, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(off) == 0 {
		return false, err
	}
	changed := false
	for _, tbl := range off {
		ok, err := s.maintTx(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, s.table(s.d.q.SegSync, tbl, ""))
			return err
		})
		if err != nil {
			return changed, err
		}
		if ok {
			s.synced.Add(1)
			changed = true
		}
	}
	return changed, nil
}

// analyzeGrown analyzes table tbl (a current segment of phase, or the key
// slots when phase is "") once it has doubled in size (and reached least
// bytes) since it was last analyzed. The statistics steer the
// claim (see seg_analyze), and the analyze invalidates the plans cached
// on the segment: the segments' statements keep generic plans (see
// planGeneric), which are thus never made with statistics of a table less
// than half its size. A done or dead segment is analyzed from a smaller
// sample (seg_analyze_sample).
func (s *segStore) analyzeGrown(ctx context.Context, tbl, phase string, size, least int64) error {
	if s.analyzed == nil {
		s.analyzed = map[string]int64{}
	}
	if last := s.analyzed[tbl]; size < least || size < 2*last {
		if size < last/2 {
			s.analyzed[tbl] = size // truncated and current again
		}
		return nil
	}
	s.analyzed[tbl] = size
	q := &s.d.q
	switch phase {
	case "":
		_, err := s.d.pool.Exec(ctx, s.table(q.SegAnalyzeTable, tbl, ""))
		return err
	case phDone, phDead:
		tx, err := s.d.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, q.SegAnalyzeSample); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.table(q.SegAnalyze, tbl, "")); err != nil {
			return err
		}
		return tx.Commit(ctx)
	default:
		_, err := s.d.pool.Exec(ctx, s.table(q.SegAnalyze, tbl, ""))
		return err
	}
}

// registry reads every registry row.
func (s *segStore) registry(ctx context.Context) ([]regRow, error) {
	rows, err := s.d.pool.Query(ctx, s.d.q.SegRegistryAll, micros(s.tune.grace), micros(s.tune.lateWrites))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (regRow, error) {
		var g regRow
		return g, r.Scan(&g.tbl, &g.phase, &g.status, &g.inc, &g.graceOver, &g.toCount)
	})
}

// maintTx runs f in a transaction that holds the prefix's maintenance
// lock; it returns false without running f when another maintainer holds
// it, and false when f reports a lock that was not free (SQLSTATE
// 55P03).
func (s *segStore) maintTx(ctx context.Context, f func(tx pgx.Tx) error) (bool, error) {
	tx, err := s.d.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var got bool
	if err := tx.QueryRow(ctx, s.d.q.SegMaintLock, s.d.prefix).Scan(&got); err != nil || !got {
		return false, err
	}
	if err := f(tx); err != nil {
		if pgCode(err) == "55P03" {
			s.refusals.Add(1)
			return false, nil
		}
		if errors.Is(err, errSkip) {
			return false, nil
		}
		return false, err
	}
	return true, tx.Commit(ctx)
}

// errSkip ends a maintenance step without changing anything.
var errSkip = errors.New("skip")

// currentOf returns the current segment of phase as the registry says in
// tx.
func (s *segStore) currentOf(ctx context.Context, tx pgx.Tx, phase string) (string, error) {
	var tbl string
	err := tx.QueryRow(ctx, s.d.q.SegCurrent, phase).Scan(&tbl)
	return tbl, err
}

// rotate seals the current segment of phase and makes a free table of the
// phase current, or a new one when none is free.
func (s *segStore) rotate(ctx context.Context, phase string) error {
	ok, err := s.maintTx(ctx, func(tx pgx.Tx) error {
		cur, err := s.currentOf(ctx, tx, phase)
		if err != nil {
			return err
		}
		var next string
		var inc int64
		err = tx.QueryRow(ctx, s.d.q.SegFree, phase).Scan(&next, &inc)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if _, _, err := s.createSegment(ctx, tx, phase, "current"); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if _, err := tx.Exec(ctx, s.d.q.SegSetStatus, next, "current", inc); err != nil {
				return err
			}
			// Its sequence may have resumed past inc after a crash.
			if _, err := tx.Exec(ctx, s.table(s.d.q.SegSync, next, "")); err != nil {
				return err
			}
			if phase == phDone || phase == phDead {
				// Its list indexes come when it is sealed and counted.
				if _, err := tx.Exec(ctx, s.table(s.d.q.SegUnindexFinished, next, "")); err != nil {
					return err
				}
			}
		}
		var curInc int64
		if err := tx.QueryRow(ctx, s.d.q.SegInc, cur).Scan(&curInc); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, s.d.q.SegSetStatus, cur, "sealed", curInc)
		return err
	})
	if ok {
		s.sealed.Add(1)
	}
	return err
}

// reclaim empties a sealed or drained segment. With the ACCESS EXCLUSIVE
// lock free at once, it moves its few leftover rows (unless finished)
// into the current segment of its phase, truncates it, advances its
// incarnation and marks it free. When only that lock is refused (a
// snapshot that read the table still holds it) and drain is set, it takes
// a SHARE lock instead (no writer inside), advances the incarnation, moves
// the leftovers out by DELETE and marks it drained: no statement reads or
// writes it any more, and a later round truncates it. finished marks a
// done or dead segment whose rows retention removes: their unique keys
// are freed and nothing moves. It reports whether the registry changed.
func (s *segStore) reclaim(ctx context.Context, r regRow, drain, finished bool) (bool, int64, error) {
	var rows int64
	if !finished && r.status != "drained" {
		// Too many rows left to move: not worth a lock (taken, it would
		// hold the claimers back for the count).
		if err := s.d.pool.QueryRow(ctx, s.table(s.d.q.SegRows, r.tbl, ""), s.tune.leftovers+1).Scan(&rows); err != nil {
			return false, 0, err
		}
		if rows > s.tune.leftovers {
			return false, 0, nil
		}
	}
	ok, err := s.maintTx(ctx, func(tx pgx.Tx) error {
		if err := s.still(ctx, tx, r); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegLockExclusive, r.tbl, "")); err != nil {
			return err
		}
		if r.status != "drained" { // a drained segment's rows are moved or pruned already
			if err := s.leftovers(ctx, tx, r, finished, s.d.q.SegMove, &rows); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegTruncate, r.tbl, "")); err != nil {
			return err
		}
		return s.advance(ctx, tx, r.tbl, "free")
	})
	if err != nil || ok {
		if ok {
			s.reclaims.Add(1)
		}
		return ok, rows, err
	}
	if !drain || r.status == "drained" {
		return false, 0, nil
	}
	ok, err = s.maintTx(ctx, func(tx pgx.Tx) error {
		if err := s.still(ctx, tx, r); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegLockShare, r.tbl, "")); err != nil {
			return err
		}
		if err := s.leftovers(ctx, tx, r, finished, s.d.q.SegMoveDelete, &rows); err != nil {
			return err
		}
		return s.advance(ctx, tx, r.tbl, "drained")
	})
	if ok {
		s.drained.Add(1)
	}
	return ok, rows, err
}

// leftovers counts a segment's rows into n and moves them (unfinished
// phases, at most tune.leftovers of them, else errSkip) into the current
// segment of the phase, or frees their unique keys (finished, once its
// newest row is seen older than r.age under tx's lock, else errSkip).
func (s *segStore) leftovers(ctx context.Context, tx pgx.Tx, r regRow, finished bool, move string, n *int64) error {
	limit := s.tune.leftovers + 1
	if finished {
		limit = 1 << 62
	}
	if finished {
		// Retention found the segment expired before this lock: a late
		// write (a completion through a view that still took it for
		// current) may have landed since, and would go with it.
		var due bool
		if err := tx.QueryRow(ctx, s.table(s.d.q.SegExpired, r.tbl, ""), micros(r.age)).Scan(&due); err != nil {
			return err
		}
		if !due {
			return errSkip
		}
	}
	if err := tx.QueryRow(ctx, s.table(s.d.q.SegRows, r.tbl, ""), limit).Scan(n); err != nil {
		return err
	}
	if *n == 0 {
		return nil
	}
	if finished {
		_, err := tx.Exec(ctx, s.table(s.d.q.SegFreeKeys, r.tbl, ""))
		return err
	}
	if *n > s.tune.leftovers {
		return errSkip
	}
	cur, err := s.currentOf(ctx, tx, r.phase)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.table(move, r.tbl, cur))
	return err
}

// still checks in tx, under the maintenance lock, that r's registry row
// is as the round read it, and locks it for the step; errSkip if not.
// The round reads the registry before its steps, each a transaction of
// its own: another process maintaining the prefix meanwhile (a leader
// whose lease ran out mid-round, and the next one) may have reclaimed
// the table and made it current again, and a reclaim or drop on the old
// row would truncate or drop the current segment with its jobs.
func (s *segStore) still(ctx context.Context, tx pgx.Tx, r regRow) error {
	var ok bool
	err := tx.QueryRow(ctx, s.d.q.SegStill, r.tbl, r.status, r.inc).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return errSkip
	}
	return err
}

// advance draws the next incarnation of tbl and records it with status.
func (s *segStore) advance(ctx context.Context, tx pgx.Tx, tbl, status string) error {
	var inc int64
	if err := tx.QueryRow(ctx, s.table(s.d.q.SegAdvance, tbl, "")).Scan(&inc); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, s.d.q.SegSetStatus, tbl, status, inc)
	return err
}

// dropSegment drops a free table beyond the ring, when its lock is free.
func (s *segStore) dropSegment(ctx context.Context, r regRow) (bool, error) {
	ok, err := s.maintTx(ctx, func(tx pgx.Tx) error {
		if err := s.still(ctx, tx, r); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegLockExclusive, r.tbl, "")); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.table(s.d.q.SegDrop, r.tbl, "")); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.d.q.SegUnregister, r.tbl)
		return err
	})
	if ok {
		s.dropped.Add(1)
	}
	return ok, err
}

// prune removes the finished jobs of one finished phase older than age
// by whole segments: the current segment is sealed once it holds a row
// older than age/16, and a sealed segment whose newest row is older than age
// is truncated (or, while a snapshot holds it, marked drained). It
// returns the number of jobs removed.
func (s *segStore) prune(ctx context.Context, phase string, age time.Duration) (int64, error) {
	regs, err := s.registry(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, r := range regs {
		if r.phase != phase || (r.status != "current" && r.status != "sealed") {
			continue
		}
		q, after := s.d.q.SegExpired, age
		if r.status == "current" {
			// Sealed by time, so that a segment spans a sixteenth of
			// the retention: jobs are kept at most that much longer.
			q, after = s.d.q.SegOldest, age/16
		}
		var due bool
		if err := s.d.pool.QueryRow(ctx, s.table(q, r.tbl, ""), micros(after)).Scan(&due); err != nil {
			return n, err
		}
		if !due {
			continue
		}
		if r.status == "current" {
			if err := s.rotate(ctx, phase); err != nil {
				return n, err
			}
			// Sealed now: its newest row decides, as for the others.
			if err := s.d.pool.QueryRow(ctx, s.table(s.d.q.SegExpired, r.tbl, ""), micros(age)).Scan(&due); err != nil || !due {
				continue
			}
			r.status = "sealed"
		}
		r.age = age
		ok, rows, err := s.reclaim(ctx, r, true, true)
		if err != nil {
			return n, err
		}
		if ok {
			n += rows
		}
	}
	if n > 0 {
		_, err := s.d.pool.Exec(ctx, s.d.q.SegNotify)
		return n, err
	}
	return n, nil
}
