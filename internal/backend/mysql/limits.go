package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Queue limits. A queue's limits live in its {p}queues row; the slots
// that enforce them are rows of {p}limit_slots, one per unit of a limit
// (migrations/010_limits.sql), so that concurrent claimers take different
// rows and never queue on one counter row. A claim locks slots before
// jobs; every statement that ends an attempt locks the job before its
// slot. The two orders cannot deadlock: a claim never waits for a slot
// that an attempt holds (it takes free slots only, skipping locked rows
// with SKIP LOCKED, and its optimistic reservation reads the committed
// version of a locked row, which an attempt's slot never matches), and
// what remains (a lowered limit racing a claim, the optimistic claim's
// waits on rows of other claims) is retried whole on error 1213 as any
// deadlock, as are Galera's certification conflicts on a slot that two
// nodes took at once. A concurrency slot may also be leased to a process
// in a block (blocks.go), which LeaseSlots takes after a shared lock of
// the queue's row, in the order SetQueueLimits locks them; a leased slot
// is as taken as an attempt's. Key limits keep their slots in the same
// table (type 'k', one per key and unit of the limit; type 'w', one per
// key and unit of its rate): see keys.go.

// errLimitsChanged says that a claim's transaction locked slots under
// limits that changed after the claim read them: it is rolled back and
// the claim runs again under the new ones.
var errLimitsChanged = errors.New("the queue's limits changed during the claim")

// errSlotsLost says that a claim's transaction no longer held a slot it
// had locked or reserved when it came to take it (see slot_take): it is
// rolled back and run again.
var errSlotsLost = errors.New("a slot locked by the claim was no longer free")

// limitRounds bounds the limited claims run again in a row because the
// queue's limits changed during them; past it the claim takes nothing.
const limitRounds = 3

// slotInsertChunk bounds the rows of one slot_insert statement.
const slotInsertChunk = 1000

// ClaimLimited claims up to p.Limit due jobs of p.Queue within the
// queue's limits, in one transaction: it takes a concurrency slot and a
// rate slot for each job it claims (locked with SKIP LOCKED on the
// skip-locked strategy, reserved with a conditional UPDATE on the
// optimistic one), claims at most as many jobs as it got slots, and
// writes the slots' holders and starts with the clock value the claim
// wrote as attempted_at. A queue without limits is claimed by Claim. A
// blocked claim (p.Blocked) is held to the queue's limits but MaxRunning
// (see claimLimits): a queue with only a MaxRunning is claimed by Claim
// after the read of its limits.
func (d *Driver) ClaimLimited(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	if p.Limit <= 0 {
		return driver.ClaimResult{}, nil
	}
	p.Limit = min(p.Limit, maxBucket)
	for round := 0; ; round++ {
		res, err := d.claimLimitedOnce(ctx, p)
		if !errors.Is(err, errLimitsChanged) && !errors.Is(err, errSlotsLost) {
			return res, err
		}
		if round == limitRounds {
			return driver.ClaimResult{}, nil
		}
	}
}

// claimLimitedOnce is one round of ClaimLimited: it reads the queue's
// limits and claims under them, or fails with errLimitsChanged.
func (d *Driver) claimLimitedOnce(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	var c limitCols
	var above int
	var weights sql.NullString
	err := d.retry(ctx, "claim limited", func() error {
		err := d.db.QueryRowContext(ctx, d.q.LimitsRead, p.Queue).Scan(append(c.dest(), &above, &weights)...)
		if err == sql.ErrNoRows {
			c, above, weights = limitCols{}, 0, sql.NullString{}
			return nil
		}
		return err
	})
	if err != nil {
		return driver.ClaimResult{}, err
	}
	// maxRunning is reported whatever the claim is held to.
	maxRunning := c.limits().MaxRunning
	l := claimLimits(c.limits(), p)
	if l.IsZero() {
		rows, err := d.Claim(ctx, p)
		return driver.ClaimResult{Rows: rows, MaxRunning: maxRunning}, err
	}
	if l.MaxRunning == 0 {
		above = 0
	}
	if l.MaxRunning > 0 && above >= l.MaxRunning {
		// A lowered limit: as many attempts as it allows, or more, still
		// hold slots beyond it, or owners hold them leased.
		res, err := d.heldEmpty(ctx, p.Queue)
		res.MaxRunning = maxRunning
		return res, err
	}
	var kw *keyWalk
	if l.HasKeyLimits() {
		var w map[string]int
		if l.Fair {
			if w, err = d.weights.Get(p.Queue, weights.String); err != nil {
				return driver.ClaimResult{}, fmt.Errorf("conveyor/mysql: claim limited of queue %q: %w", p.Queue, err)
			}
		}
		if kw, err = d.walkKeys(ctx, p.Queue, l, p.Limit, w); err != nil {
			return driver.ClaimResult{}, err
		}
	}
	var res driver.ClaimResult
	err = d.inTx(ctx, "claim limited", func(tx *sql.Tx) error {
		from := leaseFrom()
		var err error
		res, err = d.claimLimitedTx(ctx, tx, p, l, above, kw)
		for _, j := range res.Rows {
			j.LeaseFrom = from
		}
		return err
	})
	if err != nil {
		return driver.ClaimResult{}, err
	}
	res.MaxRunning = maxRunning
	return res, nil
}

// claimLimits returns the limits claim p is held to, of the queue's
// limits l: all of them, but for a blocked claim (p.Blocked) MaxRunning,
// which the caller's block of slots holds (driver.SlotLeaser): the claim
// takes no concurrency slot and is not cut by the slots free.
func claimLimits(l driver.QueueLimits, p driver.ClaimParams) driver.QueueLimits {
	if p.Blocked {
		l.MaxRunning = 0
	}
	return l
}

// limitCols is a queues row's limit columns, in the order the
// statements that read them return them.
type limitCols struct {
	maxRunning, rate, periodUS, keyMax, keyOrder, keyRate, keyRatePeriodUS, fair sql.NullInt64
}

// dest returns the columns' scan destinations, in order.
func (c *limitCols) dest() []any {
	return []any{&c.maxRunning, &c.rate, &c.periodUS, &c.keyMax, &c.keyOrder, &c.keyRate, &c.keyRatePeriodUS, &c.fair}
}

// limits converts the columns.
func (c *limitCols) limits() driver.QueueLimits {
	l := limitsOf(c.maxRunning, c.rate, c.periodUS, c.keyMax, c.keyOrder)
	if c.keyRate.Valid && c.keyRate.Int64 > 0 && c.keyRatePeriodUS.Valid && c.keyRatePeriodUS.Int64 > 0 {
		l.KeyRate = int(c.keyRate.Int64)
		l.KeyRatePeriod = time.Duration(c.keyRatePeriodUS.Int64) * time.Microsecond
	}
	l.Fair = c.fair.Valid && c.fair.Int64 != 0
	return l
}

// limitsOf converts a queues row's limit columns but those of the rate per
// key and Fair (see limitCols).
func limitsOf(maxRunning, rate, periodUS, keyMax, keyOrder sql.NullInt64) driver.QueueLimits {
	var l driver.QueueLimits
	if keyMax.Valid && keyMax.Int64 > 0 {
		l.KeyMaxRunning = int(keyMax.Int64)
	}
	switch keyOrder.Int64 {
	case keyOrdered:
		l.Ordered = true
	case keyOrderedMoveOn:
		l.Ordered, l.OrderedMoveOn = true, true
	}
	if l.Ordered {
		l.KeyMaxRunning = 1
	}
	if maxRunning.Valid && maxRunning.Int64 > 0 {
		l.MaxRunning = int(maxRunning.Int64)
	}
	if rate.Valid && rate.Int64 > 0 && periodUS.Valid && periodUS.Int64 > 0 {
		l.Rate = int(rate.Int64)
		l.RatePeriod = time.Duration(periodUS.Int64) * time.Microsecond
	}
	return l
}

// claimLimitedTx is ClaimLimited's transaction for a limited queue.
// above is the number of attempts holding concurrency slots at or beyond
// MaxRunning (a lowered limit): they count against the limit, so the
// claim takes that many fewer of the free slots below it. The count was
// read before the transaction; it only falls as those attempts end, so
// a stale one holds back more than needed, never less. kw, for a queue
// with key limits, is the claim's walk of keys (walkKeys): the keyed jobs
// are claimed first (claimKeyedTx), then the jobs without a key.
func (d *Driver) claimLimitedTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, l driver.QueueLimits, above int, kw *keyWalk) (driver.ClaimResult, error) {
	want := p.Limit
	wantC := min(want+above, l.MaxRunning)
	period := micros(l.RatePeriod)
	var cslots, rslots []int64
	var marker int64
	optimistic := d.claimMethod == ClaimOptimistic
	if optimistic {
		marker = -1 - mrand.Int64N(1<<62)
		var err error
		if cslots, rslots, err = d.reserveSlots(ctx, tx, p.Queue, l, wantC, want, above, marker); err != nil {
			return driver.ClaimResult{}, err
		}
	} else {
		var err error
		if l.MaxRunning > 0 {
			if cslots, err = d.slotNumbers(ctx, d.main, tx, d.q.SlotLockC, p.Queue, int64(l.MaxRunning), int64(wantC)); err != nil {
				return driver.ClaimResult{}, err
			}
		}
		if l.Rate > 0 && (l.MaxRunning == 0 || len(cslots) > above) {
			if rslots, err = d.slotNumbers(ctx, d.main, tx, d.q.SlotLockR, p.Queue, int64(l.Rate), period, int64(want)); err != nil {
				return driver.ClaimResult{}, err
			}
		}
	}
	if len(cslots) > 0 || len(rslots) > 0 {
		// The limits were read before the transaction. A slot at or
		// beyond a MaxRunning lowered since, freed after the change, is
		// locked here as free under the old limit while claims under
		// the new one fill the slots below it. Read after the slots were
		// locked (a new snapshot, which holds every change committed
		// before the slots were freed), the limits must be the same.
		same, err := d.limitsStill(ctx, tx, p, l)
		if err != nil {
			return driver.ClaimResult{}, err
		}
		if !same {
			return driver.ClaimResult{}, errLimitsChanged
		}
	}
	k := want
	if l.MaxRunning > 0 {
		k = min(k, max(len(cslots)-above, 0))
	}
	// The rate's slots were sought unless no concurrency slot was free.
	rateCut := false
	if l.Rate > 0 && (l.MaxRunning == 0 || len(cslots) > above) {
		rateCut = len(rslots) < want && len(rslots) <= k
		k = min(k, len(rslots))
	}
	var rows []*driver.JobRow
	heldK := kw != nil && kw.held
	var rated []string // keys whose window held jobs back
	if kw != nil {
		rated = slices.Clone(kw.rated)
	}
	if k > 0 && kw != nil {
		var err error
		var held bool
		var inTx []string
		if rows, held, inTx, err = d.claimKeyedTx(ctx, tx, p, l, kw, k); err != nil {
			return driver.ClaimResult{}, err
		}
		heldK = heldK || held
		rated = append(rated, inTx...)
		if rest := k - len(rows); rest > 0 {
			if look, mark := d.noKeyless.Look(p.Queue); look {
				cp := p
				cp.Limit = rest
				more, err := d.claimLockedTx(ctx, tx, cp, d.q.ClaimSelectNoKey, []any{p.Queue, p.Queue, int64(rest)})
				if err != nil {
					return driver.ClaimResult{}, err
				}
				if len(more) == 0 {
					d.noKeyless.Skip(p.Queue, mark)
				}
				rows = append(rows, more...)
			}
		}
		if err := d.takeSlots(ctx, tx, p.Queue, l, rows, cslots, rslots, marker); err != nil {
			return driver.ClaimResult{}, err
		}
	} else if k > 0 {
		cp := p
		cp.Limit = k
		var err error
		if optimistic {
			rows, err = d.claimOptimisticTx(ctx, tx, cp)
		} else {
			rows, err = d.claimLockedTx(ctx, tx, cp, d.q.ClaimSelect, []any{p.Queue, p.Queue, int64(k)})
		}
		if err != nil {
			return driver.ClaimResult{}, err
		}
		if err := d.takeSlots(ctx, tx, p.Queue, l, rows, cslots, rslots, marker); err != nil {
			return driver.ClaimResult{}, err
		}
	}
	if optimistic && (len(cslots) > 0 || len(rslots) > 0) {
		if _, err := d.exec(ctx, tx, true, d.q.SlotUnreserve, marker); err != nil {
			return driver.ClaimResult{}, err
		}
	}
	res := driver.ClaimResult{Rows: rows}
	if k >= want || len(rows) < k {
		// Not cut by the queue's limits, or the queue ran out of due
		// jobs: held only when keys without room left some.
		res.Held = heldK
		return d.keyRateWait(ctx, tx, p.Queue, l, rated, res)
	}
	if k == 0 {
		due, err := d.dueExists(ctx, tx, p.Queue)
		if err != nil || !due {
			return res, err
		}
	}
	res.Held = true
	if rateCut {
		in, err := d.rateRetryIn(ctx, tx, p.Queue, l)
		if err != nil {
			return driver.ClaimResult{}, err
		}
		res.RetryIn = in
		// Every rate slot it locked taken (or none locked): the window
		// is full, and no job of the queue starts before it has room,
		// whatever its key.
		res.RateFull = len(rows) == len(rslots)
		if res.RateFull {
			return res, nil
		}
	}
	return d.keyRateWait(ctx, tx, p.Queue, l, rated, res)
}

// keyRateWait sets the RetryIn of a held claim res whose keys rated were
// held back by their window: until the oldest start within the windows of
// those keys leaves it, or the queue's rate's RetryIn when that is sooner.
func (d *Driver) keyRateWait(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, rated []string, res driver.ClaimResult) (driver.ClaimResult, error) {
	if !res.Held || len(rated) == 0 || l.KeyRate == 0 {
		return res, nil
	}
	in, err := d.keyRateRetryIn(ctx, tx, queue, l, rated)
	if err != nil {
		return driver.ClaimResult{}, err
	}
	if res.RetryIn == 0 || in < res.RetryIn {
		res.RetryIn = in
	}
	return res, nil
}

// limitsStill reports whether the limits claim p is held to (claimLimits),
// read again in tx, are still l.
func (d *Driver) limitsStill(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, l driver.QueueLimits) (bool, error) {
	rows, err := d.query(ctx, tx, true, d.q.LimitsRead, p.Queue)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	var now driver.QueueLimits
	if rows.Next() {
		var c limitCols
		var above int
		var weights sql.NullString
		if err := rows.Scan(append(c.dest(), &above, &weights)...); err != nil {
			return false, err
		}
		now = claimLimits(c.limits(), p)
	}
	return now == l, rows.Err()
}

// slotNumbers runs a statement that reads slot numbers (slot_lock_*,
// lease_others) in tx, begun on pool p, and returns them.
func (d *Driver) slotNumbers(ctx context.Context, p *stmtPool, tx *sql.Tx, q string, args ...any) ([]int64, error) {
	rows, err := p.query(ctx, tx, true, q, args...)
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

// reserveSlots reserves up to wantC free concurrency slots and want rate
// slots for the optimistic strategy with conditional UPDATEs
// (slot_reserve_c, slot_reserve_r) marking them with marker, and returns
// their numbers; no rate slot when no more than above concurrency slots
// were free (see claimLimitedTx).
func (d *Driver) reserveSlots(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, wantC, want, above int, marker int64) (cslots, rslots []int64, err error) {
	var got int64
	if l.MaxRunning > 0 {
		res, err := d.exec(ctx, tx, true, d.q.SlotReserveC, marker, queue, int64(l.MaxRunning), int64(wantC))
		if err != nil {
			return nil, nil, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, nil, err
		}
		got += n
		if n <= int64(above) {
			want = 0
		}
	}
	if l.Rate > 0 && want > 0 {
		res, err := d.exec(ctx, tx, true, d.q.SlotReserveR, marker, queue, int64(l.Rate), micros(l.RatePeriod), int64(want))
		if err != nil {
			return nil, nil, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, nil, err
		}
		got += n
	}
	if got == 0 {
		return nil, nil, nil
	}
	rows, err := d.query(ctx, tx, true, d.q.SlotReserved, marker)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			return nil, nil, err
		}
		if typ == "c" {
			cslots = append(cslots, n)
		} else {
			rslots = append(rslots, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if int64(len(cslots)+len(rslots)) != got {
		return nil, nil, fmt.Errorf("reserved %d slots but read back %d", got, len(cslots)+len(rslots))
	}
	return cslots, rslots, nil
}

// takeSlots gives each claimed job one of the concurrency slots (its id
// and fence) and stamps one of the rate slots with its attempted_at, one
// statement per type of slot (slot_take). Every slot must still be free or
// reserved with marker (0 without a reservation): errSlotsLost otherwise.
func (d *Driver) takeSlots(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits, rows []*driver.JobRow, cslots, rslots []int64, marker int64) error {
	if len(rows) == 0 {
		return nil
	}
	for _, t := range []struct {
		typ   string
		on    bool
		slots []int64
	}{{"c", l.MaxRunning > 0, cslots}, {"r", l.Rate > 0, rslots}} {
		if !t.on {
			continue
		}
		k := len(rows)
		args := make([]any, 0, 7*k+3)
		for i, j := range rows {
			if t.typ == "c" {
				args = append(args, t.slots[i], j.ID)
			} else {
				args = append(args, t.slots[i], nil)
			}
		}
		for i, j := range rows {
			if t.typ == "c" {
				args = append(args, t.slots[i], j.Fence)
			} else {
				args = append(args, t.slots[i], nil)
			}
		}
		for i, j := range rows {
			args = append(args, t.slots[i], dbTime(j.AttemptedAt))
		}
		args = append(args, queue, t.typ)
		for i := range rows {
			args = append(args, t.slots[i])
		}
		args = append(args, marker)
		q := strings.NewReplacer("{cases}", strings.TrimSuffix(strings.Repeat("WHEN ? THEN ? ", k), " "),
			"{ids}", strings.TrimSuffix(strings.Repeat("?, ", k), ", ")).Replace(d.q.SlotTake)
		if err := d.execTake(ctx, d.main, tx, q, args, k, "took", t.typ+" slots"); err != nil {
			return err
		}
	}
	return nil
}

// execTake runs q, a statement that takes (or stamps) k slots, in tx
// (begun on pool p) with args, and returns errSlotsLost, saying what it
// did to how many of the k, unless it changed exactly k rows: the check
// every take of queue slots, key slots, key rate slots and slots leased
// in blocks makes.
func (d *Driver) execTake(ctx context.Context, p *stmtPool, tx *sql.Tx, q string, args []any, k int, did, what string) error {
	res, err := p.exec(ctx, tx, k <= maxCachedInsertRows, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != int64(k) {
		return fmt.Errorf("%w: %s %d of %d %s", errSlotsLost, did, n, k, what)
	}
	return nil
}

// rowsSQL is head, n rows and tail as one statement.
func (d *Driver) rowsSQL(head, row, tail string, n int) string {
	var b strings.Builder
	b.Grow(len(head) + len(tail) + 2 + n*(len(row)+2))
	b.WriteString(head)
	b.WriteByte(' ')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	b.WriteByte(' ')
	b.WriteString(tail)
	return b.String()
}

// dueExists reports whether queue has a due job, read in tx (or on the
// pool when tx is nil).
func (d *Driver) dueExists(ctx context.Context, tx *sql.Tx, queue string) (bool, error) {
	rows, err := d.query(ctx, tx, true, d.q.DueExists, queue)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	var due bool
	if rows.Next() {
		if err := rows.Scan(&due); err != nil {
			return false, err
		}
	}
	return due, rows.Err()
}

// rateRetryIn returns how long until the oldest start in queue's rate
// window leaves it (at least a millisecond: a slot another claim holds
// without a start yet is free again as soon as that claim ends).
func (d *Driver) rateRetryIn(ctx context.Context, tx *sql.Tx, queue string, l driver.QueueLimits) (time.Duration, error) {
	rows, err := d.query(ctx, tx, true, d.q.SlotRetryIn, micros(l.RatePeriod), queue, int64(l.Rate))
	if err != nil {
		return 0, err
	}
	return retryIn(rows)
}

// retryIn reads and closes rows, the result of a statement that returns
// in microseconds when a rate window has room again (no row, or NULL:
// now), and returns that wait, at least a millisecond: a queue's rate and
// a key's rate read it the same way.
func retryIn(rows *sql.Rows) (time.Duration, error) {
	defer rows.Close()
	var us sql.NullInt64
	if rows.Next() {
		if err := rows.Scan(&us); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return max(time.Duration(us.Int64)*time.Microsecond, time.Millisecond), nil
}

// heldEmpty is the result of a claim that a lowered concurrency limit
// cut to nothing before it began: Held when a due job waits.
func (d *Driver) heldEmpty(ctx context.Context, queue string) (driver.ClaimResult, error) {
	var due bool
	err := d.retry(ctx, "claim limited", func() error {
		var err error
		due, err = d.dueExists(ctx, nil, queue)
		return err
	})
	return driver.ClaimResult{Held: due}, err
}

// SetQueueLimits stores queue's limits (the zero QueueLimits removes
// them) in one transaction: the limit columns of its queues row (its
// pause and key weights are kept), the missing slots, and the deletion of
// free concurrency slots at or beyond MaxRunning and of the rate slots at
// or beyond Rate whose start has left the window (all of them when the
// rate is removed). A lowered rate counts the starts its first Rate slots
// recorded, so in the window of the change up to the old rate may start;
// those beyond it within the window stay, and count again should the
// rate be raised within it.
// The concurrency slots at or beyond MaxRunning stay locked until it
// commits (slot_lock_above).
func (d *Driver) SetQueueLimits(ctx context.Context, queue string, l driver.QueueLimits) error {
	if l.MaxRunning < 0 || l.Rate < 0 || (l.Rate > 0 && l.RatePeriod < time.Microsecond) {
		return fmt.Errorf("conveyor/mysql: set limits of queue %q: invalid limits %+v", queue, l)
	}
	if err := checkKeyLimits(l); err != nil {
		return fmt.Errorf("conveyor/mysql: set limits of queue %q: %w", queue, err)
	}
	keyMax, keyOrder := keyColumns(l)
	var keyRate, keyRatePeriod any
	if l.KeyRate > 0 {
		keyRate, keyRatePeriod = int64(l.KeyRate), micros(l.KeyRatePeriod)
	}
	var fair any
	if l.Fair {
		fair = int64(1)
	}
	var maxRunning, rate, period any
	if l.MaxRunning > 0 {
		maxRunning = int64(l.MaxRunning)
	}
	if l.Rate > 0 {
		rate, period = int64(l.Rate), micros(l.RatePeriod)
	}
	return d.inTx(ctx, "set limits of queue "+queue, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, d.q.SetQueueLimits, queue, maxRunning, rate, period, keyMax, keyOrder, keyRate, keyRatePeriod, fair); err != nil {
			return err
		}
		for _, s := range []struct {
			typ string
			n   int
		}{{"c", l.MaxRunning}, {"r", l.Rate}} {
			if err := d.createSlots(ctx, tx, queue, s.typ, s.n); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, d.q.SlotLockAbove, queue, int64(l.MaxRunning))
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		if err := rows.Err(); err != nil {
			rows.Close()
			return err
		}
		rows.Close()
		if _, err := tx.ExecContext(ctx, d.q.SlotTrimC, queue, int64(l.MaxRunning)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, d.q.SlotTrimR, queue, int64(l.Rate), int64(l.Rate), micros(l.RatePeriod))
		return err
	})
}

// createSlots creates the missing slots [0, n) of type typ for queue.
func (d *Driver) createSlots(ctx context.Context, tx *sql.Tx, queue, typ string, n int) error {
	if n <= 0 {
		return nil
	}
	var have int
	if err := tx.QueryRowContext(ctx, d.q.SlotCount, queue, typ, int64(n)).Scan(&have); err != nil {
		return err
	}
	if have == n {
		return nil
	}
	for from := 0; from < n; from += slotInsertChunk {
		to := min(from+slotInsertChunk, n)
		args := make([]any, 0, 3*(to-from))
		for i := from; i < to; i++ {
			args = append(args, queue, typ, int64(i))
		}
		if _, err := tx.ExecContext(ctx, d.rowsSQL(d.q.SlotInsertHead, d.q.SlotInsertRow, d.q.SlotInsertTail, to-from), args...); err != nil {
			return err
		}
	}
	return nil
}

// QueueLimits returns the limits of every limited queue.
func (d *Driver) QueueLimits(ctx context.Context) (map[string]driver.QueueLimits, error) {
	out := map[string]driver.QueueLimits{}
	err := d.retry(ctx, "queue limits", func() error {
		clear(out)
		rows, err := d.db.QueryContext(ctx, d.q.QueueLimits)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var c limitCols
			if err := rows.Scan(append([]any{&name}, c.dest()...)...); err != nil {
				return err
			}
			if l := c.limits(); !l.IsZero() {
				out[name] = publicLimits(l)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LimitUsage returns every limited queue's limits and their use, read in
// one statement by the database's clock.
func (d *Driver) LimitUsage(ctx context.Context) (map[string]driver.LimitUsage, error) {
	out := map[string]driver.LimitUsage{}
	err := d.retry(ctx, "limit usage", func() error {
		clear(out)
		rows, err := d.db.QueryContext(ctx, d.q.LimitUsage)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var c limitCols
			var next sql.NullInt64
			var running, started int
			if err := rows.Scan(append(append([]any{&name}, c.dest()...), &running, &started, &next)...); err != nil {
				return err
			}
			l := c.limits()
			if l.IsZero() {
				continue
			}
			u := driver.LimitUsage{Limits: l, Running: running, Started: started}
			if l.Rate > 0 && started >= l.Rate && next.Valid && next.Int64 > 0 {
				u.NextStart = time.Duration(next.Int64) * time.Microsecond
			}
			out[name] = u
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	for name, u := range out {
		if u.Limits.HasKeyLimits() {
			if err := d.keyUsage(ctx, name, &u); err != nil {
				return nil, err
			}
		}
		u.Limits = publicLimits(u.Limits)
		out[name] = u
	}
	return out, nil
}

// publicLimits is l as SetQueueLimits was given it: an Ordered queue
// stores (and its claims use) a KeyMaxRunning of 1, which it was set
// with implicitly.
func publicLimits(l driver.QueueLimits) driver.QueueLimits {
	if l.Ordered {
		l.KeyMaxRunning = 0
	}
	return l
}

// sweepSlots is the rescue's sweep of the limits' slots: it frees up to
// limit slots whose holder no longer runs under the slot's fence
// (slot_stale, each freed by slot_free fenced by its job and fence),
// gives back the blocks whose lease expired and whose owner runs no job
// of their queue (freeExpiredBlocks), and deletes the free concurrency
// slots at or beyond their queue's MaxRunning, or of a queue without one,
// under the lock of the queue's row (slot_lock_queue) that SetQueueLimits
// takes first.
func (d *Driver) sweepSlots(ctx context.Context, limit int) error {
	limit = max(limit, 100)
	if err := d.sweepKeySlots(ctx, limit); err != nil {
		return err
	}
	type slot struct {
		queue, typ, lkey string
		n, job, fence    int64
	}
	var stale []slot
	err := d.retry(ctx, "rescue: sweep slots", func() error {
		stale = stale[:0]
		rows, err := d.query(ctx, nil, true, d.q.SlotStale, int64(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s slot
			if err := rows.Scan(&s.queue, &s.typ, &s.lkey, &s.n, &s.job, &s.fence); err != nil {
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
		if _, err := d.execCount(ctx, d.main, "rescue: free slot", true, d.q.SlotFree, []any{s.queue, s.typ, s.lkey, s.n, s.job, s.fence}); err != nil {
			return err
		}
	}
	if err := d.freeExpiredBlocks(ctx, limit); err != nil {
		return err
	}

	top := map[string]int64{}
	err = d.retry(ctx, "rescue: sweep slots", func() error {
		clear(top)
		rows, err := d.query(ctx, nil, true, d.q.SlotMaxC)
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
			top[q] = n
		}
		return rows.Err()
	})
	if err != nil || len(top) == 0 {
		return err
	}
	limits, err := d.QueueLimits(ctx)
	if err != nil {
		return err
	}
	for q, n := range top {
		if n < int64(limits[q].MaxRunning) {
			continue
		}
		err := d.inTx(ctx, "rescue: trim slots of queue "+q, func(tx *sql.Tx) error {
			var maxRunning sql.NullInt64
			err := tx.QueryRowContext(ctx, d.q.SlotLockQueue, q).Scan(&maxRunning)
			if err != nil && err != sql.ErrNoRows {
				return err
			}
			_, err = tx.ExecContext(ctx, d.q.SlotTrimC, q, max(maxRunning.Int64, 0))
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}
