package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Queue limits (driver.QueueLimits): a queue's limits are columns of its
// row in {p}queues, beside its pause, and each limit of N is N rows of
// {p}limit_slots that claimers lock with SKIP LOCKED, never one counter
// row that every claim must lock. A concurrency slot is held by the
// attempt (job, fence) that took it until a statement that ends the
// attempt frees it in a CTE of its own (segments.sql); a rate slot
// records the start it last admitted (used_at), and admits another once
// that start has left the window.

// limits is a queue's row of limits as a claim reads it.
type limits struct {
	maxRunning, rate int
	periodUS         int64
	paused           bool
	keyMax, keyOrder int
	// keyRate starts per key in keyPeriodUS microseconds (0: none).
	keyRate     int
	keyPeriodUS int64
	// fair: the keys are served in turns, up to their weight each
	// (weights, as stored: '' for none).
	fair    bool
	weights string
}

// keyed reports whether l limits jobs per key, or serves keys in turns:
// the keyed claim serves the queue.
func (l limits) keyed() bool { return l.keyMax > 0 || l.keyRate > 0 || l.fair }

// keyLimited reports whether l limits jobs per key (slot rows).
func (l limits) keyLimited() bool { return l.keyMax > 0 || l.keyRate > 0 }

// ClaimLimited claims up to p.Limit jobs of p.Queue within its limits. A
// queue without limits is claimed by Claim's statement alone (after the
// first statement of the transaction below finds none: the engine calls
// ClaimLimited for the queues it knows are limited, and for every queue
// only while it cannot tell). A limited one is claimed in one
// transaction, which commits without waiting for the WAL flush as a
// claim does: its first statement reads the limits and locks free
// concurrency slots and the rate slots whose last start has left the
// window (SKIP LOCKED); it claims at most as many jobs as it locked
// slots of each with Claim's statement, and gives each claimed attempt
// one concurrency slot and one rate slot, stamped with the claim's
// now(), the attempted_at of its job, in a statement that checks in its
// own snapshot, taken after the slots were locked, that the limits are
// still those the transaction read; if not, it runs again under the new
// ones. That is three round trips (BEGIN with limits and slots, the
// claim, stamps with COMMIT) where an unlimited claim is one.
//
// A lowered MaxRunning leaves slots at or above it held by attempts that
// started before; while one is, claims count every held slot against the
// new limit, one claim at a time per queue (the queue's row, locked SKIP
// LOCKED: a second claimer claims nothing meanwhile), so that the limit
// holds as soon as fewer attempts than it run.
func (d *Driver) ClaimLimited(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	if p.Limit <= 0 {
		return driver.ClaimResult{}, nil
	}
	s := d.seg
	v, err := s.viewNow(ctx)
	changes := 0
	for round := 0; err == nil; round++ {
		var res driver.ClaimResult
		var again, unlimited, changed bool
		res, again, unlimited, changed, err = d.claimLimited(ctx, v, p)
		if changed {
			// The limits changed between their read and the lock of
			// the slots: the transaction was rolled back; it runs
			// again under the new ones.
			if changes++; changes > limitRounds {
				return driver.ClaimResult{}, nil
			}
			round--
			continue
		}
		if err != nil {
			s.hints.drop(p.Queue)
			if !s.goneSegment(err) {
				break
			}
			// A view older than the drop of a segment it names: the
			// transaction is aborted; it runs again on a fresh view.
			again, err = true, nil
		}
		switch {
		case unlimited:
			// The limits were removed since the first read, or the
			// only one left is the MaxRunning the caller's block holds.
			rows, err := d.Claim(ctx, p)
			return driver.ClaimResult{Rows: rows, MaxRunning: res.MaxRunning}, err
		case !again:
			return res, nil
		}
		s.stale.Add(1)
		if round == segRounds {
			err = fmt.Errorf("the segments this process knows were reclaimed %d times in a row", segRounds)
			break
		}
		v, err = s.refresh(ctx, time.Now())
	}
	return driver.ClaimResult{}, d.wrap("claim", err)
}

// limitRounds bounds the limited claims run again in a row because the
// queue's limits changed during them; past it the claim takes nothing.
const limitRounds = 3

// claimLimited is one transaction of ClaimLimited on view v. again says
// that the incarnation guard refused the claim (the transaction was
// rolled back: run it again with a fresh view); unlimited that the queue
// has no limits any more; changed that its limits changed after the
// transaction read them (rolled back: run it again).
func (d *Driver) claimLimited(ctx context.Context, v *segView, p driver.ClaimParams) (res driver.ClaimResult, again, unlimited, changed bool, err error) {
	s, q := d.seg, &d.q
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return res, false, false, false, err
	}
	committed := false
	defer func() {
		if !committed {
			// Ends the transaction, if one is open (else a warning
			// only): the pool closes a connection released in one.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		conn.Release()
	}()
	var l limits
	var async string
	want := p.Limit
	var high bool
	var cs, rs []int32
	// A queue with key limits, as the last claim of it read them: its
	// keys are walked (and their missing slots made) by the first
	// statement of the transaction, sent with BEGIN and the second in one
	// round trip (BEGIN makes the implicit transaction the walk ran in
	// this one). The walk is the only statement of the claim that may
	// wait, for a slot row another claimer's walk is making (ON CONFLICT),
	// until that claim commits: every later one locks SKIP LOCKED or
	// writes only rows this transaction locked, so no claim waits for
	// one that waits.
	ks, known := d.keys.get(p.Queue)
	var walk keyWalk
	walked := known && ks.keyed()
	b := &pgx.Batch{}
	if walked {
		s.queueWalk(b, v, p.Queue, ks, want)
	}
	b.Queue("BEGIN")
	b.Queue(q.LimitBegin, p.Queue, want, p.Blocked)
	br := conn.SendBatch(ctx, b)
	if walked {
		if walk, err = readWalk(br, ks); err == nil {
			d.keys.sawWindow(p.Queue, walk.wentries, walk.wkeys)
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&async, &l.maxRunning, &l.rate, &l.periodUS, &l.paused, &high, &cs, &rs,
			&l.keyMax, &l.keyOrder, &l.keyRate, &l.keyPeriodUS, &l.fair, &l.weights)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	// The MaxRunning read, which the result reports and limit_take checks
	// again; a claimer holding a block of the queue's concurrency slots
	// (p.Blocked) is not held by it here: it starts no more of the jobs
	// at once than its block allows.
	maxRunning := l.maxRunning
	if p.Blocked {
		l.maxRunning = 0
	}
	res.MaxRunning = maxRunning
	if errors.Is(err, pgx.ErrNoRows) || err == nil && l.maxRunning == 0 && l.rate == 0 && !l.keyed() {
		d.keys.set(p.Queue, keyState{cursor: ks.cursor, taken: ks.taken})
		return res, false, true, false, nil
	}
	if err != nil {
		return res, false, false, false, err
	}
	if now := (keyState{max: l.keyMax, order: l.keyOrder, rate: l.keyRate, periodUS: l.keyPeriodUS, fair: l.fair, cursor: ks.cursor, taken: ks.taken}); !known || now != ks {
		d.keys.set(p.Queue, now)
		if l.keyed() && (!ks.keyed() || ks.max != l.keyMax || ks.rate != l.keyRate || ks.periodUS != l.keyPeriodUS) {
			// The walk did not run, or made slots for another limit:
			// again, under the limits now known.
			return res, false, false, true, nil
		}
	}
	if l.paused {
		return res, false, false, false, nil
	}
	if high {
		// A lowered limit, slots at or above it still held: count them.
		var mine bool
		err := conn.QueryRow(ctx, q.LimitRowLock, p.Queue).Scan(&mine)
		if errors.Is(err, pgx.ErrNoRows) {
			// Another claim counts: nothing this time.
			return driver.ClaimResult{Held: true, MaxRunning: maxRunning}, false, false, false, nil
		}
		var held int
		if err == nil {
			err = conn.QueryRow(ctx, q.LimitHeld, p.Queue).Scan(&held)
		}
		if err != nil {
			return res, false, false, false, err
		}
		cs, rs = nil, nil
		if room := l.maxRunning - held; room > 0 {
			var same bool
			if _, same, cs, rs, err = d.lockSlots(ctx, conn, p.Queue, l, min(want, room), true); err != nil || !same {
				return res, false, false, err == nil && !same, err
			}
		}
	}
	k := want
	if l.maxRunning > 0 {
		k = min(k, len(cs))
	}
	if l.rate > 0 {
		k = min(k, len(rs))
	}
	var rows []*driver.JobRow
	var takes keyTakes
	keyHeld := false
	var rated []string
	switch {
	case k > 0 && l.keyed():
		// Jobs with a key into their keys' slots first, then jobs
		// without one for the rest of the allowance.
		s.hints.drop(p.Queue)
		var stale bool
		rows, takes, keyHeld, rated, stale, err = s.claimKeyed(ctx, conn, v, p, l, walk, k)
		if err != nil || stale {
			return res, stale, false, false, err
		}
		if rest := k - len(rows); rest > 0 {
			if look, mark := d.noKeyless.Look(p.Queue); look {
				cp := p
				cp.Limit = rest
				more, stale, err := s.claimNoKey(ctx, conn, v, cp)
				if err != nil || stale {
					return res, stale, false, false, err
				}
				if len(more) == 0 {
					d.noKeyless.Skip(p.Queue, mark)
				}
				rows = append(rows, more...)
			}
		}
	case k > 0:
		cp := p
		cp.Limit = k
		var stale bool
		rows, stale, err = s.claimIn(ctx, conn, v, cp)
		if err != nil || stale {
			return res, stale, false, false, err
		}
	}
	// The last statements and COMMIT in one round trip: the slots' stamps
	// (which fail the transaction if the limits changed, so that COMMIT
	// does not run), whether a due job waits when none was claimed, and
	// how long until the rate's window has room when the rate cut the
	// claim: when it locked fewer rate slots than it sought, as many as
	// the concurrency slots it locked (limit_begin), or want without a
	// concurrency limit. A claim the concurrency limit alone cut waits
	// for a slot to free, not for the window.
	b = &pgx.Batch{}
	if len(takes.keys) > 0 {
		b.Queue(q.KeyTake, p.Queue, takes.keys, takes.ns, takes.ids, takes.fences)
	}
	if len(rows) > 0 {
		var ns, fences, ids arrayLit
		ns.init(8 * len(rows))
		ids.init(12 * len(rows))
		fences.init(17 * len(rows))
		for i, r := range rows {
			if l.maxRunning > 0 {
				ns.int(int64(cs[i]))
				ids.int(r.ID)
				fences.int(r.Fence)
			}
		}
		var stamps arrayLit
		stamps.init(8 * len(rows))
		if l.rate > 0 {
			for _, n := range rs[:len(rows)] {
				stamps.int(int64(n))
			}
		}
		b.Queue(q.LimitTake, p.Queue, ns.String(), ids.String(), fences.String(), stamps.String(),
			maxRunning, l.rate, l.periodUS, l.keyRate, l.keyPeriodUS, l.keyMax, l.keyOrder)
	}
	res.Rows = rows
	ready := k == 0
	if ready {
		b.Queue(s.stmt(&q.SegHasReady, v, v.live[phReady]), p.Queue)
	} else if k < want {
		res.Held = len(rows) == k
	}
	res.Held = res.Held || keyHeld
	sought := want
	if l.maxRunning > 0 {
		sought = len(cs)
	}
	retry := l.rate > 0 && len(rs) < sought && (ready || res.Held)
	if retry {
		b.Queue(q.LimitRetryIn, p.Queue, l.rate, l.periodUS)
	}
	// Keys whose rate's window held jobs back: how long until the first
	// of their windows has room.
	keyRetry := len(rated) > 0 && res.Held
	if keyRetry {
		b.Queue(q.KeyRateRetryIn, p.Queue, rated, l.keyRate, l.keyPeriodUS)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	var us, keyUS int64
	if len(takes.keys) > 0 {
		_, err = br.Exec()
	}
	if err == nil && len(rows) > 0 {
		var one int
		err = br.QueryRow().Scan(&one)
	}
	if err == nil && ready {
		err = br.QueryRow().Scan(&res.Held)
	}
	if err == nil && retry {
		err = br.QueryRow().Scan(&us)
	}
	if err == nil && keyRetry {
		err = br.QueryRow().Scan(&keyUS)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if limitsChanged(err) {
		return driver.ClaimResult{}, false, false, true, nil
	}
	if err != nil {
		return driver.ClaimResult{}, false, false, false, err
	}
	committed = true
	if res.Held && retry {
		// At least a millisecond: a slot whose start left the window
		// but that another claimer had locked is taken or free again
		// by then.
		res.RetryIn = max(time.Duration(us)*time.Microsecond, time.Millisecond)
		// Every rate slot it locked taken (or none locked): the window
		// is full, and no job of the queue starts before it has room,
		// whatever its key.
		res.RateFull = len(rows) == len(rs)
	}
	if keyRetry && !res.RateFull {
		// The same floor: a key's open slot another claimer had locked
		// is taken or open again by then.
		in := max(time.Duration(keyUS)*time.Microsecond, time.Millisecond)
		if res.RetryIn == 0 || in < res.RetryIn {
			res.RetryIn = in
		}
	}
	if len(rows) > 0 {
		s.place(v.cur[phRunning].tbl, rows)
	}
	return res, false, false, false, nil
}

// limitsChanged reports whether err is limit_take's failure: the
// queue's limits changed after the claim read them.
func limitsChanged(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, limitsChangedText)
}

// limitsChangedText is in the message of limit_take's failure.
const limitsChangedText = "conveyor: the queue's limits changed"

// queryer runs the statements of a limited claim on its connection,
// inside its transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// lockSlots runs limit_lock: whether a concurrency slot at or above the
// limit is held (and, unless anyHeld, none was locked then), whether the
// queue's limits are still l in the statement's snapshot (if not, the
// slots were locked under limits no longer in force: the transaction
// must not use them), and the concurrency and rate slots locked, by
// number.
func (d *Driver) lockSlots(ctx context.Context, tx queryer, queue string, l limits, want int, anyHeld bool) (high, same bool, cs, rs []int32, err error) {
	err = tx.QueryRow(ctx, d.q.LimitLock, queue, l.maxRunning, l.rate, want, l.periodUS, anyHeld).Scan(&high, &same, &cs, &rs)
	return high, same, cs, rs, err
}

// claimIn runs the claim statement of view v in tx, past the queue's
// hint as claim does (see claimHints), and from the queue's start for
// the rest when a hinted claim comes back short. stale says that the
// guard refused it.
func (s *segStore) claimIn(ctx context.Context, tx queryer, v *segView, p driver.ClaimParams) ([]*driver.JobRow, bool, error) {
	h, hinted, gen, all := s.hints.begin(p.Queue, time.Now())
	run := func(p driver.ClaimParams, h claimHint) ([]*driver.JobRow, int64, error) {
		rows, err := tx.Query(ctx, s.stmt(&s.d.q.SegClaim, v, v.live[phReady], phRunning),
			p.Queue, p.Limit, micros(p.Lease), p.Worker, h.prio, h.pos)
		if err != nil {
			return nil, 0, err
		}
		var pos int64
		out, err := s.d.scanClaimed(rows, p, &pos)
		return out, pos, err
	}
	out, pos, err := run(p, h)
	if err != nil {
		return nil, false, err
	}
	if len(out) == p.Limit {
		// Dropped again by ClaimLimited should the transaction fail.
		s.hints.set(p.Queue, int32(out[len(out)-1].Priority), pos, h, gen, all, time.Now())
		return out, false, nil
	}
	s.hints.drop(p.Queue)
	if hinted {
		rest := p
		rest.Limit = p.Limit - len(out)
		more, _, err := run(rest, noHint)
		if err != nil {
			return nil, false, err
		}
		out = append(more, out...)
	}
	if len(out) > 0 {
		return out, false, nil
	}
	// In the claim's transaction: it holds a connection of the pool, and
	// a second one, taken while it waits, could be the pool's last (a
	// pool of one never had it, and every claim of a full pool would wait
	// for the others').
	var ok bool
	err = tx.QueryRow(ctx, s.stmt(&s.d.q.SegGuard, v, nil, phRunning)).Scan(&ok)
	return nil, err == nil && !ok, err
}

// SetQueueLimits stores queue's limits (the zero QueueLimits removes
// them) and makes or deletes its slots, in one statement, leaving its
// pause as it was; it wakes the queue's fetchers in every process. A
// lowered Rate counts the starts recorded in its first Rate slots: up to
// the old rate may start within the window of the change; the slots
// beyond it whose start is within the window stay, so that a rate raised
// again counts them. A lowered KeyRate leaves the starts recorded in the
// rate slots within it.
func (d *Driver) SetQueueLimits(ctx context.Context, queue string, l driver.QueueLimits) error {
	if err := checkKeyRate(l); err != nil {
		return d.wrap("set limits of queue "+queue, err)
	}
	period := int64(0)
	if l.Rate > 0 {
		period = micros(l.RatePeriod)
	}
	keyPeriod := int64(0)
	if l.KeyRate > 0 {
		keyPeriod = micros(l.KeyRatePeriod)
	}
	keyMax, keyOrder := l.KeyMaxRunning, 0
	if l.Ordered {
		keyMax, keyOrder = 1, 1
		if l.OrderedMoveOn {
			keyOrder = 2
		}
	}
	// Retried after a deadlock: the statement locks the concurrency
	// slots at or above the limit, held ones included, which an outcome
	// freeing several of them may lock in another order.
	err := d.retryable(ctx, func() error {
		_, err := d.pool.Exec(ctx, d.q.SetQueueLimits, queue, l.MaxRunning, l.Rate, period, keyMax, keyOrder,
			l.KeyRate, keyPeriod, l.Fair)
		return err
	})
	return d.wrap("set limits of queue "+queue, err)
}

// maxKeyRate bounds QueueLimits.KeyRate: a key's rate slots are rows.
const maxKeyRate = 100000

// checkKeyRate refuses a rate per key the database cannot hold, naming
// the field.
func checkKeyRate(l driver.QueueLimits) error {
	switch {
	case l.KeyRate < 0 || l.KeyRate > maxKeyRate:
		return fmt.Errorf("KeyRate %d is out of range 0..%d", l.KeyRate, maxKeyRate)
	case l.KeyRate > 0 && l.KeyRatePeriod < time.Microsecond:
		return fmt.Errorf("KeyRate %d needs a KeyRatePeriod of at least a microsecond, got %v", l.KeyRate, l.KeyRatePeriod)
	case l.KeyRate == 0 && l.KeyRatePeriod != 0:
		return fmt.Errorf("KeyRatePeriod %v without a KeyRate", l.KeyRatePeriod)
	}
	return nil
}

// QueueLimits returns the limits of every limited queue.
func (d *Driver) QueueLimits(ctx context.Context) (map[string]driver.QueueLimits, error) {
	rows, err := d.pool.Query(ctx, d.q.QueueLimits)
	if err != nil {
		return nil, d.wrap("queue limits", err)
	}
	defer rows.Close()
	out := map[string]driver.QueueLimits{}
	for rows.Next() {
		var name string
		var l driver.QueueLimits
		var periodUS, keyPeriodUS int64
		var keyOrder int
		if err := rows.Scan(&name, &l.MaxRunning, &l.Rate, &periodUS, &l.KeyMaxRunning, &keyOrder,
			&l.KeyRate, &keyPeriodUS, &l.Fair); err != nil {
			return nil, d.wrap("queue limits", err)
		}
		l.RatePeriod = time.Duration(periodUS) * time.Microsecond
		l.KeyRatePeriod = time.Duration(keyPeriodUS) * time.Microsecond
		setKeyOrder(&l, keyOrder)
		out[name] = l
	}
	return out, d.wrap("queue limits", rows.Err())
}

// setKeyOrder sets l's Ordered and OrderedMoveOn from a stored key_order,
// clearing KeyMaxRunning (stored as 1) for an ordered queue: the limits
// read back are those set.
func setKeyOrder(l *driver.QueueLimits, keyOrder int) {
	if keyOrder > 0 {
		l.Ordered, l.OrderedMoveOn, l.KeyMaxRunning = true, keyOrder == 2, 0
	}
}

// LimitUsage returns every limited queue's limits and their use, read in
// one statement by the database's clock.
func (d *Driver) LimitUsage(ctx context.Context) (map[string]driver.LimitUsage, error) {
	rows, err := d.pool.Query(ctx, d.q.LimitUsage)
	if err != nil {
		return nil, d.wrap("limit usage", err)
	}
	defer rows.Close()
	out := map[string]driver.LimitUsage{}
	for rows.Next() {
		var name string
		var u driver.LimitUsage
		var periodUS, nextUS, keyPeriodUS int64
		var keyOrder int
		if err := rows.Scan(&name, &u.Limits.MaxRunning, &u.Limits.Rate, &periodUS, &u.Running, &u.Started, &nextUS,
			&u.Limits.KeyMaxRunning, &keyOrder, &u.KeysRunning, &u.Limits.KeyRate, &keyPeriodUS, &u.KeysRated,
			&u.Limits.Fair); err != nil {
			return nil, d.wrap("limit usage", err)
		}
		u.Limits.RatePeriod = time.Duration(periodUS) * time.Microsecond
		u.Limits.KeyRatePeriod = time.Duration(keyPeriodUS) * time.Microsecond
		setKeyOrder(&u.Limits, keyOrder)
		u.NextStart = time.Duration(nextUS) * time.Microsecond
		out[name] = u
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("limit usage", err)
	}
	rows.Close()
	held, err := d.seg.keyHeld(ctx)
	if err != nil {
		return nil, d.wrap("limit usage", err)
	}
	for name, n := range held {
		if u, ok := out[name]; ok {
			u.KeyHeld = n
			out[name] = u
		}
	}
	return out, nil
}

// liveSig lists the live segments of phases in v as "tbl:inc" joined
// by ",", in byte order: the form seg_sweep_slots and seg_sweep_kept
// compare with the registry in their own snapshot.
func (v *segView) liveSig(phases ...string) string {
	tbls := slices.Clone(v.srcs(phases...))
	slices.Sort(tbls)
	parts := make([]string, len(tbls))
	for i, t := range tbls {
		parts[i] = t + ":" + strconv.FormatInt(v.inc[t], 10)
	}
	return strings.Join(parts, ",")
}

// sweepRounds bounds the sweeps whose registry changed under them.
const sweepRounds = 3

// sweepSlots frees the limit slots whose holder is no longer running
// under the slot's fence, and deletes free concurrency slots above their
// queue's limit (seg_sweep_slots). Its statement reads the running
// segments of a view read anew for it, never a cached one (a running
// segment the view did not know would make it free a slot held there),
// and checks in its own snapshot that the registry names exactly those;
// if not, it frees nothing and runs again on a fresh view. It returns
// how many slots it freed.
func (s *segStore) sweepSlots(ctx context.Context) (int64, error) {
	return s.sweepChecked(ctx, &s.d.q.SegSweepSlots, "limit slots", phRunning)
}

// sweepChecked runs a sweep statement (tpl) on the live segments of
// phases of a view read anew for it, never a cached one, with their
// signature (liveSig), which the statement compares with the registry in
// its own snapshot: it frees nothing when they differ (a segment created
// or retired since the view was read), and the sweep runs again on a
// fresh view, sweepRounds times at most. The statement returns whether
// the registry was the same, how many slots it freed and how many jobs it
// woke; what names the slots in the error. It returns how many slots it
// freed.
func (s *segStore) sweepChecked(ctx context.Context, tpl *string, what string, phases ...string) (int64, error) {
	for round := 0; ; round++ {
		v, err := s.refresh(ctx, time.Now())
		if err != nil {
			return 0, err
		}
		var same bool
		var freed, woke int64
		err = s.d.pool.QueryRow(ctx, s.stmt(tpl, v, v.srcs(phases...)), v.liveSig(phases...)).
			Scan(&same, &freed, &woke)
		if s.goneSegment(err) {
			err, same = nil, false
		}
		if err != nil || same {
			return freed, err
		}
		s.stale.Add(1)
		if round == sweepRounds {
			return 0, fmt.Errorf("the segment registry changed during each of %d sweeps of the %s", sweepRounds+1, what)
		}
	}
}
