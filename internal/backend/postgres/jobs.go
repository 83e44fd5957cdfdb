package postgres

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/conveyorq/conveyor/internal/driver"
)

// emptyArgs stands in for jobs inserted without arguments.
var emptyArgs = json.RawMessage("{}")

// insertArgs turns jobs into the column arrays (as array literals, see
// arrayLit) that the insert query unnests.
func insertArgs(jobs []driver.InsertParams) []any {
	n := len(jobs)
	textSize := 0
	for i := range jobs {
		textSize += len(jobs[i].Queue) + len(jobs[i].Kind) + len(jobs[i].Args)
	}
	var queues, kinds, args, priorities, maxAttempts, timeouts, runAt, delays, metas, keys arrayLit
	withMeta, withKey := false, false
	for i := range jobs {
		if len(jobs[i].Meta) > 0 {
			withMeta = true
			textSize += len(jobs[i].Meta)
		}
		if jobs[i].Key != "" {
			withKey = true
		}
	}
	queues.init(textSize/2 + 3*n)
	kinds.init(textSize/2 + 3*n)
	args.init(textSize + 3*n)
	priorities.init(2 * n)
	maxAttempts.init(3 * n)
	timeouts.init(3 * n)
	runAt.init(5 * n)
	delays.init(2 * n)
	// A batch without metadata sends an empty array: unnest pads it with
	// NULLs (see the insert query).
	metas.init(0)
	keys.init(0) // the same for the limit keys
	for i := range jobs {
		j := &jobs[i]
		queues.str(j.Queue)
		kinds.str(j.Kind)
		if len(j.Args) == 0 {
			args.bytes(emptyArgs)
		} else {
			args.bytes(j.Args)
		}
		priorities.int(int64(j.Priority))
		maxAttempts.int(int64(j.MaxAttempts))
		timeouts.int(j.TimeoutMS)
		runAt.time(j.RunAt)
		delays.int(micros(j.Delay))
		if withMeta {
			if len(j.Meta) == 0 {
				metas.null()
			} else {
				metas.bytes(j.Meta)
			}
		}
		if withKey {
			if j.Key == "" {
				keys.null()
			} else {
				keys.str(j.Key)
			}
		}
	}
	return []any{queues.String(), kinds.String(), args.String(), priorities.String(),
		maxAttempts.String(), timeouts.String(), runAt.String(), delays.String(), metas.String(), keys.String()}
}

// Insert inserts jobs with one statement in its own transaction, into
// the current ready segment (due now) or waiting segment (due later), and
// returns their ids in input order. A second transaction, sent in the
// same round trip once the first has committed, notifies each distinct
// queue that may have received a job available now, once (see
// notifyingQuerier). Its error is marked driver.NotCommitted when nothing
// was committed (see refused).
func (d *Driver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	ids, err := d.seg.insert(ctx, d.notifyingQuerier(dueQueues(jobs, nil)), jobs, false)
	return ids, d.wrap("insert", refused(err))
}

// InsertClaiming is Insert that also claims the jobs c.Claim flags, when
// due now and their queue is not paused, by writing them straight into
// the current running segment (seg_insert_claim): the statement commits
// synchronously, as an insert does, and only the queues of the jobs not
// flagged are notified.
func (d *Driver) InsertClaiming(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	ids, rows, err := d.seg.insertClaim(ctx, jobs, c)
	return ids, rows, d.wrap("insert", refused(err))
}

// InsertTx inserts jobs inside the caller's transaction, which must be a
// pgx.Tx or a *sql.Tx of the pgx stdlib driver ("pgx"). The wake-up
// notifications are part of that transaction: they are delivered when it
// commits and dropped if it rolls back. It never commits.
func (d *Driver) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	q, _, err := txQuerier("insert tx", tx)
	if err != nil || len(jobs) == 0 {
		return nil, err
	}
	ids, err := d.seg.insert(ctx, q, jobs, true)
	return ids, d.wrap("insert tx", err)
}

// txQuerier returns the querier of the caller's transaction tx, a pgx.Tx
// or a *sql.Tx of the pgx stdlib driver, and whether it is a *sql.Tx;
// op names the call in the error of any other type (driver.ErrTxType).
func txQuerier(op string, tx any) (querier, bool, error) {
	switch t := tx.(type) {
	case pgx.Tx:
		return pgxQuerier(t), false, nil
	case *sql.Tx:
		if t != nil {
			return sqlQuerier(t), true, nil
		}
	}
	return nil, false, fmt.Errorf("conveyor/postgres: %s: transaction of type %T: accepted are pgx.Tx and *sql.Tx (pgx stdlib driver): %w", op, tx, driver.ErrTxType)
}

// copyColumns are the columns BulkInsert copies; the others take their
// defaults.
var copyColumns = []string{"queue", "kind", "args", "state", "priority", "max_attempts", "timeout_ms", "scheduled_at", "meta", "lkey"}

// copySource streams jobs to CopyFrom, reusing one row of values.
type copySource struct {
	jobs   []driver.InsertParams
	now    time.Time
	i      int
	row    [10]any
	queues map[string]struct{} // queues with a job available now
}

// Next implements pgx.CopyFromSource.
func (s *copySource) Next() bool {
	s.i++
	return s.i <= len(s.jobs)
}

// Values implements pgx.CopyFromSource: the row for the current job,
// with its state decided against the transaction's now().
func (s *copySource) Values() ([]any, error) {
	j := &s.jobs[s.i-1]
	sched := j.RunAt
	if sched.IsZero() {
		sched = s.now.Add(j.Delay)
	}
	sched = sched.Round(time.Microsecond) // the server's precision
	state := driver.StateAvailable
	if sched.After(s.now) {
		state = driver.StateScheduled
	} else if _, ok := s.queues[j.Queue]; !ok {
		s.queues[j.Queue] = struct{}{}
	}
	args := j.Args
	if len(args) == 0 {
		args = emptyArgs
	}
	var meta any // an untyped nil is NULL
	if len(j.Meta) > 0 {
		meta = string(j.Meta)
	}
	var key any // NULL: no key
	if j.Key != "" {
		key = j.Key
	}
	s.row = [10]any{j.Queue, j.Kind, args, state, int32(j.Priority), int32(j.MaxAttempts), j.TimeoutMS, sched, meta, key}
	return s.row[:], nil
}

// Err implements pgx.CopyFromSource.
func (s *copySource) Err() error { return nil }

// BulkInsert copies jobs into the current ready and waiting segments
// with COPY in one transaction, deciding scheduled or available against
// the transaction's now() (the same instant the rows' created_at default
// takes), then, once it committed, notifies each queue that received an
// available job once (see notifyAfter). It locks the two segments as an insert would
// (ROW EXCLUSIVE), then checks their incarnations, so that COPY, which
// has no guard of its own, never writes into a reclaimed table. An error
// before the commit, or the server's refusal of the commit, is marked
// driver.NotCommitted; a commit whose answer was lost is not.
func (d *Driver) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	var committing bool
	n, err := d.bulkInsert(ctx, jobs, &committing)
	if err != nil && !committing {
		err = driver.NotCommitted(err)
	}
	return n, d.wrap("bulk insert", err)
}

// bulkInsert is BulkInsert, its error not yet named nor marked; it sets
// committing once it sends the commit, and marks the commit's error.
func (d *Driver) bulkInsert(ctx context.Context, jobs []driver.InsertParams, committing *bool) (int64, error) {
	s := d.seg
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var now time.Time
	if err := tx.QueryRow(ctx, d.q.BulkNow).Scan(&now); err != nil {
		return 0, err
	}
	var v *segView
	err = s.withView(ctx, func(vv *segView) error {
		v = vv
		if _, err := tx.Exec(ctx, s.stmt(&d.q.SegBulkLock, v, nil)); err != nil {
			return err
		}
		var ok bool
		if err := tx.QueryRow(ctx, s.stmt(&d.q.SegBulkGuard, v, nil, phReady, phWaiting)).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errStale
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var due, later []driver.InsertParams
	for _, j := range jobs {
		sched := j.RunAt
		if sched.IsZero() {
			sched = now.Add(j.Delay)
		}
		if sched.Round(time.Microsecond).After(now) {
			later = append(later, j)
		} else {
			due = append(due, j)
		}
	}
	var total int64
	queues := map[string]struct{}{}
	for _, part := range []struct {
		tbl  string
		jobs []driver.InsertParams
	}{{v.cur[phReady].tbl, due}, {v.cur[phWaiting].tbl, later}} {
		if len(part.jobs) == 0 {
			continue
		}
		src := &copySource{jobs: part.jobs, now: now, queues: queues}
		n, err := tx.CopyFrom(ctx, pgx.Identifier{part.tbl}, copyColumns, src)
		if err != nil {
			return 0, fmt.Errorf("copy: %w", err)
		}
		total += n
		if n >= bulkAnalyze {
			// The planner needs to know the segment is no longer a few
			// rows (see seg_analyze); it sees this transaction's rows.
			// Once is enough while the segment grows: the planner
			// scales the rows it last saw by the pages the table has
			// now, and the maintenance leader analyzes again each time
			// the segment doubles. So only when this copy alone is more
			// than the segment held at its last analyze (a bulk enqueue
			// of 100,000 jobs in copies of 10,000 analyzed ten times, at
			// 8-40 ms each, growing with the segment).
			var known float64
			if err := tx.QueryRow(ctx, d.q.SegReltuples, part.tbl).Scan(&known); err != nil {
				return 0, fmt.Errorf("analyze: %w", err)
			}
			if float64(n) > known {
				if _, err := tx.Exec(ctx, s.table(d.q.SegAnalyze, part.tbl, "")); err != nil {
					return 0, fmt.Errorf("analyze: %w", err)
				}
			}
		}
	}
	*committing = true
	if err := tx.Commit(ctx); err != nil {
		return 0, refused(err)
	}
	if len(queues) > 0 {
		var wake wakeList
		for q := range queues {
			wake.queues, wake.at = append(wake.queues, q), append(wake.at, time.Time{})
		}
		d.notifyAfter(ctx, wake)
	}
	s.wakeJobs(due)
	return total, nil
}

// bulkAnalyze is the size of a copy after which BulkInsert analyzes the
// segment it filled.
const bulkAnalyze = 5000

// Claim moves up to p.Limit available jobs of p.Queue from the live ready
// segments to the current running segment, in (priority, pos) order, with
// one statement whose selection is FOR UPDATE SKIP LOCKED (see
// segStore.claim).
func (d *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	jobs, err := d.seg.claim(ctx, p)
	return jobs, d.wrap("claim", err)
}

// scanClaimed reads the rows of a claim (the columns of the claim query)
// and closes them.
func (d *Driver) scanClaimed(rows pgx.Rows, p driver.ClaimParams, extra ...any) ([]*driver.JobRow, error) {
	return d.scanClaimedEach(rows, p, nil, extra...)
}

// scanClaimedEach is scanClaimed calling keep, when set, on each row
// scanned (extra filled in): a row it refuses is left out.
func (d *Driver) scanClaimedEach(rows pgx.Rows, p driver.ClaimParams, keep func(*driver.JobRow) bool, extra ...any) ([]*driver.JobRow, error) {
	defer rows.Close()

	// One set of destinations for every row: scanning allocates only what
	// the row itself needs (args, and errors when there are any).
	var (
		j    driver.JobRow
		args []byte
	)
	dest := []any{&j.ID, &internScanner{in: &d.kinds, dst: &j.Kind}, &args, &j.Priority, &j.Attempt,
		&j.MaxAttempts, &j.TimeoutMS, &j.ScheduledAt, &j.CreatedAt, &j.AttemptedAt, &j.LeaseExpiresAt,
		&errorsScanner{dst: &j.Errors}, &j.Fence, metaScanner{&j.Meta}, keyScanner{&j.Key}}
	dest = append(dest, extra...)
	var jobs []driver.JobRow // allocated on the first row: empty polls cost nothing
	for rows.Next() {
		if jobs == nil {
			jobs = make([]driver.JobRow, 0, min(p.Limit, 64))
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if keep != nil && !keep(&j) {
			continue
		}
		j.Args = args
		j.Queue = p.Queue
		j.State = driver.StateRunning
		j.AttemptedBy = p.Worker
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]*driver.JobRow, len(jobs))
	for i := range jobs {
		out[i] = &jobs[i]
	}
	return out, nil
}

// Complete applies all outcomes with one fenced statement (only jobs
// still running under the given claim's fence move) and returns the ids
// applied. It looks for the jobs in the running segments they were
// claimed into, then in every live one (see segStore.leaseOp), on the
// lease pool, retried after deadlocks and lock timeouts.
func (d *Driver) Complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	n := len(outcomes)
	if n == 0 {
		return nil, nil
	}
	var ids, fences, states, retryIn, errs, resIDs, results arrayLit
	ids.init(12 * n)
	fences.init(17 * n) // clock fences: 16 digits
	states.init(12 * n)
	retryIn.init(2 * n)
	errs.init(3 * n)
	resIDs.init(0)
	results.init(0)
	jobIDs := make([]int64, n)
	allDone := true // every outcome completed, without an error
	for i := range outcomes {
		o := &outcomes[i]
		switch o.State {
		case driver.StateCompleted, driver.StateRetryable, driver.StateDiscarded, driver.StateCancelled, driver.StateScheduled:
		default:
			return nil, fmt.Errorf("conveyor/postgres: complete: job %d: invalid outcome state %q", o.ID, o.State)
		}
		jobIDs[i] = o.ID
		ids.int(o.ID)
		fences.int(o.Fence)
		states.str(o.State)
		retryIn.int(micros(o.RetryIn))
		allDone = allDone && o.State == driver.StateCompleted && o.Err == nil
		if o.State == driver.StateCompleted && len(o.Result) > 0 {
			resIDs.int(o.ID)
			results.bytes(o.Result)
		}
		if o.Err == nil {
			errs.str("")
			continue
		}
		b, err := json.Marshal(o.Err)
		if err != nil {
			return nil, fmt.Errorf("conveyor/postgres: complete: job %d: %w", o.ID, err)
		}
		errs.bytes(b)
	}
	args := []any{ids.String(), fences.String(), states.String(), retryIn.String(), errs.String(), resIDs.String(), results.String()}
	tpl, guarded := &d.q.SegComplete, []string{phWaiting, phDone, phDead}
	if allDone {
		// A drain's every batch: the statement without the rows of
		// every kind of outcome (seg_complete_done).
		tpl, guarded, args = &d.q.SegCompleteDone, []string{phDone}, []any{args[0], args[1], args[5], args[6]}
	}
	defer d.seg.forget(jobIDs)
	applied, err := d.seg.leaseOp(ctx, jobIDs, args, func(v *segView, srcs []string) string {
		return d.seg.stmt(tpl, v, srcs, guarded...)
	})
	return applied, d.wrap("complete", err)
}

// leaseArgs turns leases into id and fence array literals.
func leaseArgs(leases []driver.Lease) (string, string) {
	var ids, fences arrayLit
	ids.init(12 * len(leases))
	fences.init(17 * len(leases))
	for _, l := range leases {
		ids.int(l.ID)
		fences.int(l.Fence)
	}
	return ids.String(), fences.String()
}

// leaseIDs returns the job ids of leases.
func leaseIDs(leases []driver.Lease) []int64 {
	out := make([]int64, len(leases))
	for i, l := range leases {
		out[i] = l.ID
	}
	return out
}

// Heartbeat extends the leases still owned, in place, in one statement
// on the lease pool, and returns their ids: in the running segments their
// jobs were claimed into, else in every live one.
func (d *Driver) Heartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	ids, fences := leaseArgs(leases)
	owned, err := d.seg.leaseOp(ctx, leaseIDs(leases), []any{ids, fences, micros(lease)}, func(v *segView, srcs []string) string {
		return d.seg.stmt(&d.q.SegHeartbeat, v, srcs)
	})
	return owned, d.wrap("heartbeat", err)
}

// Release makes running attempts available again without counting them,
// in one statement that also wakes their queues, and returns how many it
// released. It looks in every live running segment (releases are rare: a
// worker shutting down).
func (d *Driver) Release(ctx context.Context, leases []driver.Lease) (int64, error) {
	if len(leases) == 0 {
		return 0, nil
	}
	ids, fences := leaseArgs(leases)
	defer d.seg.forget(leaseIDs(leases))
	var total int64
	err := d.retryable(ctx, func() error {
		m, err := d.seg.queueMove(ctx, d.leaseQuerier, func(v *segView) string {
			return d.seg.stmt(&d.q.SegRelease, v, v.live[phRunning], phReady)
		}, ids, fences)
		total = 0
		for _, n := range m {
			total += int64(n)
		}
		return err
	})
	return total, d.wrap("release", err)
}

// Rescue makes up to limit running jobs whose lease expired available
// again (or discarded when out of attempts), recording the lost attempt,
// frees their queue limit and key slots, and wakes the queues that got
// available jobs or a free slot. It then sweeps the limit and key slots
// (see sweepSlots and sweepKept).
func (d *Driver) Rescue(ctx context.Context, limit int) (map[string]int, error) {
	if limit <= 0 {
		return map[string]int{}, nil
	}
	m, err := d.seg.queueMove(ctx, d.poolQuerier, func(v *segView) string {
		return d.seg.stmt(&d.q.SegRescue, v, v.live[phRunning], phReady, phDead)
	}, limit)
	if err != nil {
		return m, d.wrap("rescue", err)
	}
	if _, err = d.seg.sweepSlots(ctx); err == nil {
		_, err = d.seg.sweepKept(ctx)
	}
	return m, d.wrap("rescue: sweep the limit slots", err)
}

// Promote makes up to limit due scheduled and retryable jobs available
// and wakes their queues. It does no maintenance of the segments: the
// leader runs that with Maintain.
func (d *Driver) Promote(ctx context.Context, limit int) (map[string]int, error) {
	if limit <= 0 {
		return map[string]int{}, nil
	}
	m, err := d.seg.queueMove(ctx, d.poolQuerier, func(v *segView) string {
		return d.seg.stmt(&d.q.SegPromote, v, v.live[phWaiting], phReady)
	}, limit)
	return m, d.wrap("promote", err)
}

// Prune removes completed jobs finalized more than completedAge ago and
// discarded or cancelled jobs finalized more than discardedAge ago, by
// whole done and dead segments (see segStore.prune), and returns how many
// it removed. A negative age keeps that class forever. limit does not
// bound it: a segment is removed whole.
func (d *Driver) Prune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error) {
	if limit <= 0 || (completedAge < 0 && discardedAge < 0) {
		return 0, nil
	}
	var total int64
	for _, c := range []struct {
		phase string
		age   time.Duration
	}{{phDone, completedAge}, {phDead, discardedAge}} {
		if c.age < 0 {
			continue
		}
		n, err := d.seg.prune(ctx, c.phase, c.age)
		total += n
		if err != nil {
			return total, d.wrap("prune", err)
		}
	}
	if completedAge >= 0 {
		if _, err := d.pool.Exec(ctx, d.q.PruneResults, micros(completedAge), int64(limit)); err != nil {
			return total, d.wrap("prune results", err)
		}
		if err := d.pruneBatches(ctx, completedAge, limit); err != nil {
			return total, d.wrap("prune batches", err)
		}
	}
	return total, nil
}

// Maintain runs one round of the segments' maintenance, unless one ran
// less than segMaintEvery ago: it seals every current segment grown past
// its size (and makes a free or new table current in its place), reclaims
// sealed segments whose jobs have moved on (TRUNCATE, or drained while a
// snapshot holds them), drops free tables beyond the ring, records the
// counts of a sealed finished segment, analyzes current segments that
// doubled and puts the incarnation sequences of current segments back in
// step with the registry. Each step is a transaction of its own under the
// prefix's maintenance lock and takes every table lock NOWAIT (see
// segmaint.go). It returns what the round did, by task (sealed,
// reclaimed, drained, created, dropped, counted, synced, refused: a lock
// that was not free), leaving out tasks that did nothing.
func (d *Driver) Maintain(ctx context.Context) (map[string]int, error) {
	report, err := d.seg.maintain(ctx)
	return report, d.wrap("maintain", err)
}

// TryLead takes the maintenance leadership for id when it is free or
// expired, or extends it when id already holds it.
func (d *Driver) TryLead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	var leader string
	err := d.pool.QueryRow(ctx, d.q.TryLead, id, micros(ttl)).Scan(&leader)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, d.wrap("try lead", err)
	}
	return leader == id, nil
}

// collectIDs reads a single bigint column from rows and closes them. It
// decodes the binary value directly, so a batch of thousands of ids costs
// no per-row allocation.
func collectIDs(rows pgx.Rows, capHint int) ([]int64, error) {
	defer rows.Close()
	ids := make([]int64, 0, capHint)
	var binaryFmt bool
	var id int64
	dest := []any{&id}
	first := true
	for rows.Next() {
		if first {
			fds := rows.FieldDescriptions()
			binaryFmt = len(fds) == 1 && fds[0].Format == pgtype.BinaryFormatCode && fds[0].DataTypeOID == pgtype.Int8OID
			first = false
		}
		if raw := rows.RawValues(); binaryFmt && len(raw) == 1 && len(raw[0]) == 8 {
			ids = append(ids, int64(binary.BigEndian.Uint64(raw[0])))
			continue
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
