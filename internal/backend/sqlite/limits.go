package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// ClaimLimited claims up to p.Limit jobs of p.Queue within the queue's
// limits, in one BEGIN IMMEDIATE transaction: it reads the limits with
// the count of the queue's concurrency slots in use, takes as many free
// rate slots as it may, claims at most MaxRunning less the slots in use
// (and no more than the rate slots) with the claim statement Claim runs,
// and stamps a rate slot with each claimed attempt's attempted_at. The
// transaction holds the write lock, so no other claimer, in this process
// or another, starts a job or takes a slot between its count or read and
// its update. A queue without limits is claimed as Claim claims it.
//
// A concurrency limit admits a claim while fewer of the queue's slots
// than the limit are in use: the slots leased in blocks (LeaseSlots),
// and the running jobs of the queue that no block's owner claimed (state
// running: claimed by any process or HTTP worker, ClaimJob's included,
// and not yet ended, an expired lease until Rescue ends it). Nothing is
// held beside the job's own state, so nothing is freed when an attempt
// ends, and a lowered limit holds as soon as fewer slots than it are in
// use.
//
// A claim under a block (p.Blocked) counts nothing and is not cut by
// MaxRunning, which it reports: its owner runs no more of the jobs at
// once than its block allows, and they count through the block's rows.
// It is held by the rate, the limits per key, fairness and the pause as
// any other; a queue with a MaxRunning only is claimed by the claim
// statement, after one read of the queue's row.
//
// A queue with limits per key (KeyMaxRunning, Ordered, KeyRate) or a
// fair one (whose key weights the limits' statement reads) claims its
// jobs with a key through claimKeyed, within the room the queue's own
// limits leave, then its jobs without one. RetryIn is the earliest
// of the queue's rate window and the full windows of the keys the claim
// left jobs of.
func (d *Driver) ClaimLimited(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	var res driver.ClaimResult
	if p.Limit <= 0 {
		return res, nil
	}
	// Prepared before the transaction: the write handle's one
	// connection is the transaction's until it ends.
	var ls limitStmts
	for _, x := range []struct {
		st    **sql.Stmt
		query string
	}{
		{&ls.claim, d.q.Claim}, {&ls.limitsOf, d.q.LimitsOf},
		{&ls.freeR, d.q.FreeRateSlots},
		{&ls.takeR, d.q.TakeRateSlot}, {&ls.due, d.q.DueJobWaits}, {&ls.retryIn, d.q.RateRetryIn},
		{&ls.claimUnkeyed, d.q.ClaimUnkeyed}, {&ls.claimIDs, d.q.ClaimIDs}, {&ls.nextKeys, d.q.NextKeys},
		{&ls.nextKeysHeads, d.q.NextKeysHeads}, {&ls.nextKeysHeadsOrd, d.q.NextKeysHeadsOrd},
		{&ls.openKeySlots, d.q.OpenKeySlots}, {&ls.keptDue, d.q.KeptJobDue},
		{&ls.keyJobs, d.q.KeyJobs}, {&ls.keyJobsOrdered, d.q.KeyJobsOrdered}, {&ls.takeKeySlots, d.q.TakeKeySlots},
		{&ls.addKeyRateSlots, d.q.AddKeyRateSlots}, {&ls.keyRateSlots, d.q.KeyRateSlots}, {&ls.takeKeyRateSlot, d.q.TakeKeyRateSlot},
	} {
		var err error
		if *x.st, err = d.prepared(ctx, x.query); err != nil {
			return res, fmt.Errorf("conveyor/sqlite: claim from queue %q within its limits: %w", p.Queue, err)
		}
	}
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = d.claimLimitedIn(ctx, tx, &ls, p)
		return err
	})
	if err != nil {
		return driver.ClaimResult{}, fmt.Errorf("conveyor/sqlite: claim from queue %q within its limits: %w", p.Queue, err)
	}
	return res, nil
}

// limitStmts are the statements of a limited claim, prepared on the write
// handle.
type limitStmts struct {
	claim, limitsOf, freeR, takeR, due, retryIn *sql.Stmt
	// The keyed claim's.
	claimUnkeyed, claimIDs, nextKeys, nextKeysHeads, nextKeysHeadsOrd, openKeySlots, keptDue, keyJobs, keyJobsOrdered, takeKeySlots *sql.Stmt
	// The rate per key's.
	addKeyRateSlots, keyRateSlots, takeKeyRateSlot *sql.Stmt
}

// claimLimitedIn is ClaimLimited's transaction.
func (d *Driver) claimLimitedIn(ctx context.Context, tx *sql.Tx, ls *limitStmts, p driver.ClaimParams) (driver.ClaimResult, error) {
	var res driver.ClaimResult
	var maxRunning, rate, running, keyMax, keyOrder, keyRate, fair int
	var period, keyRatePeriod int64
	var paused bool
	var rawWeights sql.NullString
	err := tx.StmtContext(ctx, ls.limitsOf).QueryRowContext(ctx, p.Queue, p.Blocked).Scan(&maxRunning, &rate, &period, &running, &keyMax, &keyOrder, &paused, &keyRate, &keyRatePeriod, &fair, &rawWeights)
	if errors.Is(err, sql.ErrNoRows) || err == nil && maxRunning <= 0 && rate <= 0 && keyMax <= 0 && keyRate <= 0 && fair <= 0 {
		res.Rows, err = claimIn(ctx, tx, ls.claim, p, p.Limit)
		return res, err
	}
	if err != nil {
		return res, fmt.Errorf("read limits: %w", err)
	}
	res.MaxRunning = max(maxRunning, 0)
	want := p.Limit
	// allowed: what the concurrency limit lets this claim take, counted
	// under the write lock: no job of the queue starts, and no block
	// grows, before this claim's commit but this claim's. A claim under
	// a block is not counted (running is 0) nor cut.
	allowed := want
	if maxRunning > 0 && !p.Blocked {
		allowed = max(min(allowed, maxRunning-running), 0)
	}
	k := allowed
	rateCut := false
	var keyRetryIn time.Duration // until a window of a key the claim left jobs of has room
	var rSlots []int64
	if rate > 0 && allowed > 0 {
		if rSlots, err = slotNumbers(ctx, tx.StmtContext(ctx, ls.freeR), p.Queue, rate, period, allowed); err != nil {
			return res, fmt.Errorf("read free rate slots: %w", err)
		}
		k = len(rSlots)
		rateCut = k < allowed
	}
	if k <= 0 {
		var waits bool
		if err := tx.StmtContext(ctx, ls.due).QueryRowContext(ctx, p.Queue).Scan(&waits); err != nil {
			return res, fmt.Errorf("look for a due job: %w", err)
		}
		res.Held = waits
	} else {
		var keyHeld bool
		switch {
		case (keyMax > 0 || keyRate > 0 || fair > 0) && !paused:
			// Jobs with a key into free slots of their keys (in turns
			// when fair), then those without one.
			kl := keyLimits{max: keyMax, ordered: keyOrder > 0, rate: keyRate, period: keyRatePeriod, fair: fair > 0}
			if kl.fair {
				if kl.weights, err = d.weights.Get(p.Queue, rawWeights.String); err != nil {
					return res, fmt.Errorf("read key weights: %w", err)
				}
			}
			if res.Rows, keyHeld, keyRetryIn, err = d.claimKeyed(ctx, tx, ls, p, k, kl); err != nil {
				return res, fmt.Errorf("claim jobs with a key: %w", err)
			}
			if rest := k - len(res.Rows); rest > 0 {
				if look, mark := d.noKeyless.Look(p.Queue); look {
					more, err := claimIn(ctx, tx, ls.claimUnkeyed, p, rest)
					if err != nil {
						return res, err
					}
					if len(more) == 0 {
						d.noKeyless.Skip(p.Queue, mark)
					}
					res.Rows = append(res.Rows, more...)
				}
			}
		default:
			if res.Rows, err = claimIn(ctx, tx, ls.claim, p, k); err != nil {
				return res, err
			}
		}
		if len(res.Rows) > 0 && len(rSlots) > 0 {
			if err := takeRateSlots(ctx, tx, ls, p.Queue, res.Rows, rSlots); err != nil {
				return res, fmt.Errorf("take rate slots: %w", err)
			}
		}
		res.Held = keyHeld || k < want && len(res.Rows) == k
	}
	if res.Held && rateCut {
		var in int64
		if err := tx.StmtContext(ctx, ls.retryIn).QueryRowContext(ctx, p.Queue, period, rate).Scan(&in); err != nil {
			return res, fmt.Errorf("read the rate's window: %w", err)
		}
		// The window is full (the rate cut the claim), so its oldest
		// start leaves it in at most one period: at least a millisecond,
		// the clock's resolution, for a start leaving it now.
		res.RetryIn = max(time.Duration(in)*time.Microsecond, time.Millisecond)
		// Every free rate slot taken (or none was): the window is full,
		// and no job of the queue starts before it has room, whatever
		// its key.
		res.RateFull = len(res.Rows) == k
	}
	if keyRetryIn > 0 && !res.RateFull && (res.RetryIn == 0 || keyRetryIn < res.RetryIn) {
		res.RetryIn = keyRetryIn
	}
	return res, nil
}

// slotNumbers runs st, a query returning slot numbers.
func slotNumbers(ctx context.Context, st *sql.Stmt, args ...any) ([]int64, error) {
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// takeRateSlots stamps one of the rate slots rSlots, which holds at
// least len(rows), with each claimed job's attempted_at.
func takeRateSlots(ctx context.Context, tx *sql.Tx, ls *limitStmts, queue string, rows []*driver.JobRow, rSlots []int64) error {
	takeR := tx.StmtContext(ctx, ls.takeR)
	for i, r := range rows {
		if _, err := takeR.ExecContext(ctx, queue, rSlots[i], r.AttemptedAt.UnixMicro()); err != nil {
			return err
		}
	}
	return nil
}

// SetQueueLimits stores queue's limits (the zero QueueLimits removes
// them) and, in the same transaction, creates the rate slots they need
// and deletes those they no longer do, at or above Rate: those whose
// start has left the window, and all of them when the rate is removed.
// A lowered rate counts the starts recorded in its first Rate slots, so
// within the window of the change it may admit up to the old rate; the
// slots beyond it within the window stay, so that the rate raised again
// counts their starts. MaxRunning needs no row: claims count the queue's
// running jobs and the slots leased in blocks. The blocks stay, whatever
// the new limits: under a lowered MaxRunning their owners keep, at their
// next lease, the slots they ask for, those at or above it too (their
// handlers may still run under them), counted in use until given back,
// so that nothing is taken or started while more than the limit are in
// use (LeaseSlots); a removed one makes them give back all at their
// next lease; Rescue gives back those whose lease expired. The queue's
// pause is kept.
//
// Key limits are stored as key_max_running (1 when Ordered) and
// key_order; their slot rows are made by the claims that need them. A
// lowered or removed key limit frees no slot an attempt holds (each frees
// when its attempt ends); Rescue's sweep deletes the free ones it no
// longer needs, and a queue without key limits claims its jobs with a key
// at once, as any other.
//
// A rate per key is stored as key_rate and key_rate_period_us; its rate
// slots are made by the claims that need them and are not touched here:
// those beyond a lowered KeyRate are ignored by claims (and counted
// again if it is raised), and Rescue's sweep deletes them once their
// start has left the window, and those of a removed one.
//
// Fair is stored as key_fair (1, or NULL); it needs no slot. The queue's
// key weights (SetKeyWeights) are kept.
func (d *Driver) SetQueueLimits(ctx context.Context, queue string, l driver.QueueLimits) error {
	if err := checkLimits(l); err != nil {
		return fmt.Errorf("conveyor/sqlite: set limits of queue %q: %w", queue, err)
	}
	var maxRunning, rate, period, keyMax, keyRate, keyRatePeriod, fair any
	if l.MaxRunning > 0 {
		maxRunning = l.MaxRunning
	}
	if l.Rate > 0 {
		rate, period = l.Rate, us(l.RatePeriod)
	}
	if l.KeyRate > 0 {
		keyRate, keyRatePeriod = l.KeyRate, us(l.KeyRatePeriod)
	}
	if l.Fair {
		fair = 1
	}
	keyOrder := 0
	switch {
	case l.Ordered && l.OrderedMoveOn:
		keyMax, keyOrder = 1, 2
	case l.Ordered:
		keyMax, keyOrder = 1, 1
	case l.KeyMaxRunning > 0:
		keyMax = l.KeyMaxRunning
	}
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, d.q.SetQueueLimits, queue, maxRunning, rate, period, keyMax, keyOrder, keyRate, keyRatePeriod, fair); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, d.q.AddLimitSlots, queue, "r", l.Rate); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, d.q.DropLimitSlots, queue, l.Rate, period)
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: set limits of queue %q: %w", queue, err)
	}
	return nil
}

// maxKeyMaxRunning bounds QueueLimits.KeyMaxRunning and KeyRate: a key's
// slots are rows, made by the claims that need them.
const maxKeyMaxRunning = 100000

// checkLimits refuses limits the database cannot hold.
func checkLimits(l driver.QueueLimits) error {
	switch {
	case l.MaxRunning < 0:
		return fmt.Errorf("MaxRunning %d is negative", l.MaxRunning)
	case l.Rate < 0:
		return fmt.Errorf("Rate %d is negative", l.Rate)
	case l.Rate > 0 && l.RatePeriod < time.Microsecond:
		return fmt.Errorf("Rate %d needs a RatePeriod of at least a microsecond, got %v", l.Rate, l.RatePeriod)
	case l.Rate == 0 && l.RatePeriod != 0:
		return fmt.Errorf("RatePeriod %v without a Rate", l.RatePeriod)
	case l.KeyMaxRunning < 0 || l.KeyMaxRunning > maxKeyMaxRunning:
		return fmt.Errorf("KeyMaxRunning %d is out of range 0..%d", l.KeyMaxRunning, maxKeyMaxRunning)
	case l.Ordered && l.KeyMaxRunning > 1:
		return fmt.Errorf("Ordered runs one job per key at a time: KeyMaxRunning must be 0 or 1, got %d", l.KeyMaxRunning)
	case l.OrderedMoveOn && !l.Ordered:
		return errors.New("OrderedMoveOn needs Ordered")
	case l.KeyRate < 0 || l.KeyRate > maxKeyMaxRunning:
		return fmt.Errorf("KeyRate %d is out of range 0..%d", l.KeyRate, maxKeyMaxRunning)
	case l.KeyRate > 0 && l.KeyRatePeriod < time.Microsecond:
		return fmt.Errorf("KeyRate %d needs a KeyRatePeriod of at least a microsecond, got %v", l.KeyRate, l.KeyRatePeriod)
	case l.KeyRate == 0 && l.KeyRatePeriod != 0:
		return fmt.Errorf("KeyRatePeriod %v without a KeyRate", l.KeyRatePeriod)
	}
	return nil
}

// QueueLimits returns the limits of every limited queue.
func (d *Driver) QueueLimits(ctx context.Context) (map[string]driver.QueueLimits, error) {
	rows, err := d.r.QueryContext(ctx, d.q.QueueLimits)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: queue limits: %w", err)
	}
	defer rows.Close()
	out := map[string]driver.QueueLimits{}
	for rows.Next() {
		var name string
		var l driver.QueueLimits
		var period, keyRatePeriod int64
		var keyOrder, fair int
		if err := rows.Scan(&name, &l.MaxRunning, &l.Rate, &period, &l.KeyMaxRunning, &keyOrder, &l.KeyRate, &keyRatePeriod, &fair); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: queue limits: %w", err)
		}
		l.RatePeriod = time.Duration(period) * time.Microsecond
		l.KeyRatePeriod = time.Duration(keyRatePeriod) * time.Microsecond
		setKeyOrder(&l, keyOrder)
		l.Fair = fair > 0
		out[name] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: queue limits: %w", err)
	}
	return out, nil
}

// setKeyOrder sets l's Ordered and OrderedMoveOn from a stored
// key_order, clearing KeyMaxRunning (stored as 1) for an ordered queue.
func setKeyOrder(l *driver.QueueLimits, keyOrder int) {
	if keyOrder > 0 {
		l.Ordered, l.OrderedMoveOn, l.KeyMaxRunning = true, keyOrder == 2, 0
	}
}

// LimitUsage returns every limited queue's limits and their use, read in
// one read transaction by the database's clock: one statement for every
// queue (with, for a rate per key, the keys whose window is full), then,
// per queue with key limits, the count of its due jobs their keys hold
// back (which reads the queue's due jobs with a key).
func (d *Driver) LimitUsage(ctx context.Context) (map[string]driver.LimitUsage, error) {
	tx, err := d.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: limit usage: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, d.q.LimitUsage)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: limit usage: %w", err)
	}
	defer rows.Close()
	out := map[string]driver.LimitUsage{}
	for rows.Next() {
		var name string
		var u driver.LimitUsage
		var period, now, keyRatePeriod int64
		var keyOrder, fair int
		var oldest sql.NullInt64
		if err := rows.Scan(&name, &u.Limits.MaxRunning, &u.Limits.Rate, &period, &u.Limits.KeyMaxRunning, &keyOrder,
			&u.Running, &u.Started, &oldest, &u.KeysRunning, &now, &u.Limits.KeyRate, &keyRatePeriod, &u.KeysRated, &fair); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: limit usage: %w", err)
		}
		u.Limits.RatePeriod = time.Duration(period) * time.Microsecond
		u.Limits.KeyRatePeriod = time.Duration(keyRatePeriod) * time.Microsecond
		if u.Limits.Rate > 0 && u.Started >= u.Limits.Rate && oldest.Valid {
			u.NextStart = max(time.Duration(oldest.Int64+period-now)*time.Microsecond, 0)
		}
		setKeyOrder(&u.Limits, keyOrder)
		u.Limits.Fair = fair > 0
		out[name] = u
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: limit usage: %w", err)
	}
	rows.Close()
	for name, u := range out {
		if u.Limits.KeyMaxRunning == 0 && !u.Limits.Ordered && u.Limits.KeyRate == 0 {
			continue // no limit per key (fairness alone holds no job)
		}
		n := u.Limits.KeyMaxRunning
		if u.Limits.Ordered {
			n = 1
		}
		if err := tx.QueryRowContext(ctx, d.q.KeyHeld, name, n, u.Limits.Ordered, u.Limits.KeyRate, us(u.Limits.KeyRatePeriod)).Scan(&u.KeyHeld); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: limit usage of queue %q: %w", name, err)
		}
		out[name] = u
	}
	return out, nil
}
