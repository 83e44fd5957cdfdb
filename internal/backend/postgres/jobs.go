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
	var queues, kinds, args, priorities, maxAttempts, timeouts, runAt, delays, metas arrayLit
	withMeta := false
	for i := range jobs {
		if len(jobs[i].Meta) > 0 {
			withMeta = true
			textSize += len(jobs[i].Meta)
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
	}
	return []any{queues.String(), kinds.String(), args.String(), priorities.String(),
		maxAttempts.String(), timeouts.String(), runAt.String(), delays.String(), metas.String()}
}

// Insert inserts jobs with one statement in its own (implicit) transaction
// and returns their ids in input order. The same statement notifies each
// distinct queue that received a job available now, once. Its error is
// marked driver.NotCommitted when nothing was committed (see refused).
func (d *Driver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	out, err := d.tryInsert(ctx, jobs)
	if d.converted(ctx, err) {
		return d.tryInsert(ctx, jobs)
	}
	return out, err
}

// tryInsert is Insert on the storage this driver last read (see converted).
func (d *Driver) tryInsert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	if s := d.segs(); s != nil {
		ids, err := s.insert(ctx, d.poolQuerier(), jobs)
		return ids, wrap("insert", refused(err))
	}
	rows, err := d.pool.Query(ctx, d.q.insert, insertArgs(jobs)...)
	if err != nil {
		return nil, wrap("insert", refused(err))
	}
	ids, err := collectIDs(rows, len(jobs))
	if err != nil {
		return nil, wrap("insert", refused(err))
	}
	return ids, nil
}

// InsertTx inserts jobs inside the caller's transaction, which must be a
// pgx.Tx or a *sql.Tx of the pgx stdlib driver ("pgx"). The wake-up
// notifications are part of that transaction: they are delivered when it
// commits and dropped if it rolls back. It never commits.
func (d *Driver) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	out, err := d.tryInsertTx(ctx, tx, jobs)
	if d.converted(ctx, err) {
		err = fmt.Errorf("%w (the prefix was converted to the segments storage meanwhile; this driver now uses it: run the transaction again)", err)
	}
	return out, err
}

// tryInsertTx is InsertTx on the storage this driver last read (see converted).
func (d *Driver) tryInsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	switch t := tx.(type) {
	case pgx.Tx:
		if len(jobs) == 0 {
			return nil, nil
		}
		if s := d.segs(); s != nil {
			ids, err := s.insert(ctx, pgxQuerier(t), jobs)
			return ids, wrap("insert tx", err)
		}
		rows, err := t.Query(ctx, d.q.insert, insertArgs(jobs)...)
		if err != nil {
			return nil, wrap("insert tx", err)
		}
		ids, err := collectIDs(rows, len(jobs))
		return ids, wrap("insert tx", err)
	case *sql.Tx:
		if t == nil {
			break
		}
		if len(jobs) == 0 {
			return nil, nil
		}
		if s := d.segs(); s != nil {
			ids, err := s.insert(ctx, sqlQuerier(t), jobs)
			return ids, wrap("insert tx", err)
		}
		rows, err := t.QueryContext(ctx, d.q.insert, insertArgs(jobs)...)
		if err != nil {
			return nil, wrap("insert tx", err)
		}
		defer rows.Close()
		ids := make([]int64, 0, len(jobs))
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return nil, wrap("insert tx", err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			return nil, wrap("insert tx", err)
		}
		return ids, nil
	}
	return nil, fmt.Errorf("conveyor/postgres: insert tx: transaction of type %T: accepted are pgx.Tx and *sql.Tx (pgx stdlib driver): %w", tx, driver.ErrTxType)
}

// copyColumns are the columns BulkInsert copies; the others take their
// defaults.
var copyColumns = []string{"queue", "kind", "args", "state", "priority", "max_attempts", "timeout_ms", "scheduled_at", "meta"}

// copySource streams jobs to CopyFrom, reusing one row of values.
type copySource struct {
	jobs   []driver.InsertParams
	now    time.Time
	i      int
	row    [9]any
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
	s.row = [9]any{j.Queue, j.Kind, args, state, int32(j.Priority), int32(j.MaxAttempts), j.TimeoutMS, sched, meta}
	return s.row[:], nil
}

// Err implements pgx.CopyFromSource.
func (s *copySource) Err() error { return nil }

// BulkInsert copies jobs into the jobs table with COPY in one transaction,
// deciding scheduled or available against the transaction's now() (the
// same instant the rows' created_at default takes), then notifies each
// queue that received an available job once, in the same transaction.
func (d *Driver) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	out, err := d.tryBulkInsert(ctx, jobs)
	if d.converted(ctx, err) {
		return d.tryBulkInsert(ctx, jobs)
	}
	return out, err
}

// tryBulkInsert is BulkInsert on the storage this driver last read (see converted).
func (d *Driver) tryBulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	if s := d.segs(); s != nil {
		n, err := s.bulkInsert(ctx, jobs)
		return n, wrap("bulk insert", err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, wrap("bulk insert", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	src := &copySource{jobs: jobs, queues: make(map[string]struct{})}
	if err := tx.QueryRow(ctx, d.q.bulkNow).Scan(&src.now); err != nil {
		return 0, wrap("bulk insert", err)
	}
	n, err := tx.CopyFrom(ctx, pgx.Identifier{d.prefix + "jobs"}, copyColumns, src)
	if err != nil {
		return 0, wrap("bulk insert: copy", err)
	}
	if len(src.queues) > 0 {
		queues := make([]string, 0, len(src.queues))
		for q := range src.queues {
			queues = append(queues, q)
		}
		if _, err := tx.Exec(ctx, d.q.notifyQueues, queues); err != nil {
			return 0, wrap("bulk insert: notify", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, wrap("bulk insert: commit", err)
	}
	return n, nil
}

// Claim takes up to p.Limit available jobs of p.Queue in (priority,
// scheduled_at, id) order with one UPDATE fed by FOR UPDATE SKIP LOCKED.
func (d *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	out, err := d.tryClaim(ctx, p)
	if d.converted(ctx, err) {
		return d.tryClaim(ctx, p)
	}
	return out, err
}

// tryClaim is Claim on the storage this driver last read (see converted).
func (d *Driver) tryClaim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if s := d.segs(); s != nil {
		jobs, err := s.claim(ctx, p)
		return jobs, wrap("claim", err)
	}
	rows, err := d.pool.Query(ctx, d.q.claim, p.Queue, p.Limit, micros(p.Lease), p.Worker)
	if err != nil {
		return nil, wrap("claim", err)
	}
	jobs, err := d.scanClaimed(rows, p)
	return jobs, wrap("claim", err)
}

// scanClaimed reads the rows of a claim (the columns of the claim query)
// and closes them.
func (d *Driver) scanClaimed(rows pgx.Rows, p driver.ClaimParams, extra ...any) ([]*driver.JobRow, error) {
	defer rows.Close()

	// One set of destinations for every row: scanning allocates only what
	// the row itself needs (args, and errors when there are any).
	var (
		j    driver.JobRow
		args []byte
	)
	dest := []any{&j.ID, &internScanner{in: &d.kinds, dst: &j.Kind}, &args, &j.Priority, &j.Attempt,
		&j.MaxAttempts, &j.TimeoutMS, &j.ScheduledAt, &j.CreatedAt, &j.AttemptedAt, &j.LeaseExpiresAt,
		&errorsScanner{dst: &j.Errors}, &j.Fence, metaScanner{&j.Meta}}
	dest = append(dest, extra...)
	var jobs []driver.JobRow // allocated on the first row: empty polls cost nothing
	for rows.Next() {
		if jobs == nil {
			jobs = make([]driver.JobRow, 0, min(p.Limit, 64))
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
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

// Complete applies all outcomes with one fenced UPDATE (only rows still
// running under the given claim's fence change) and returns the ids
// applied. It runs on the lease pool and is retried after deadlocks and
// lock timeouts.
func (d *Driver) Complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	out, err := d.tryComplete(ctx, outcomes)
	if d.converted(ctx, err) {
		return d.tryComplete(ctx, outcomes)
	}
	return out, err
}

// tryComplete is Complete on the storage this driver last read (see converted).
func (d *Driver) tryComplete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	n := len(outcomes)
	if n == 0 {
		return nil, nil
	}
	var ids, fences, states, retryIn, errs arrayLit
	ids.init(12 * n)
	fences.init(17 * n) // clock fences: 16 digits
	states.init(12 * n)
	retryIn.init(2 * n)
	errs.init(3 * n)
	allDone := true // every outcome completed, without an error
	for i := range outcomes {
		o := &outcomes[i]
		switch o.State {
		case driver.StateCompleted, driver.StateRetryable, driver.StateDiscarded, driver.StateCancelled, driver.StateScheduled:
		default:
			return nil, fmt.Errorf("conveyor/postgres: complete: job %d: invalid outcome state %q", o.ID, o.State)
		}
		ids.int(o.ID)
		fences.int(o.Fence)
		states.str(o.State)
		retryIn.int(micros(o.RetryIn))
		allDone = allDone && o.State == driver.StateCompleted && o.Err == nil
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
	args := []any{ids.String(), fences.String(), states.String(), retryIn.String(), errs.String()}
	if s := d.segs(); s != nil {
		jobIDs := make([]int64, n)
		for i := range outcomes {
			jobIDs[i] = outcomes[i].ID
		}
		if allDone {
			applied, err := s.completeDone(ctx, jobIDs, args[:2])
			return applied, wrap("complete", err)
		}
		applied, err := s.complete(ctx, jobIDs, args)
		return applied, wrap("complete", err)
	}
	var applied []int64
	err := d.retryable(ctx, func() error {
		rows, err := d.lease.Query(ctx, d.q.complete, args...)
		if err != nil {
			return err
		}
		applied, err = collectIDs(rows, n)
		return err
	})
	if err != nil {
		return nil, wrap("complete", err)
	}
	return applied, nil
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

// Heartbeat extends the leases still owned, in one statement on the lease
// pool, and returns their ids.
func (d *Driver) Heartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	out, err := d.tryHeartbeat(ctx, leases, lease)
	if d.converted(ctx, err) {
		return d.tryHeartbeat(ctx, leases, lease)
	}
	return out, err
}

// tryHeartbeat is Heartbeat on the storage this driver last read (see converted).
func (d *Driver) tryHeartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	ids, fences := leaseArgs(leases)
	if s := d.segs(); s != nil {
		owned, err := s.heartbeat(ctx, leaseIDs(leases), ids, fences, lease)
		return owned, wrap("heartbeat", err)
	}
	var owned []int64
	err := d.retryable(ctx, func() error {
		rows, err := d.lease.Query(ctx, d.q.heartbeat, ids, fences, micros(lease))
		if err != nil {
			return err
		}
		owned, err = collectIDs(rows, len(leases))
		return err
	})
	if err != nil {
		return nil, wrap("heartbeat", err)
	}
	return owned, nil
}

// Release makes running attempts available again without counting them,
// in one statement that also wakes their queues, and returns how many it
// released.
func (d *Driver) Release(ctx context.Context, leases []driver.Lease) (int64, error) {
	out, err := d.tryRelease(ctx, leases)
	if d.converted(ctx, err) {
		return d.tryRelease(ctx, leases)
	}
	return out, err
}

// tryRelease is Release on the storage this driver last read (see converted).
func (d *Driver) tryRelease(ctx context.Context, leases []driver.Lease) (int64, error) {
	if len(leases) == 0 {
		return 0, nil
	}
	ids, fences := leaseArgs(leases)
	if s := d.segs(); s != nil {
		n, err := s.release(ctx, leaseIDs(leases), ids, fences)
		return n, wrap("release", err)
	}
	var total int64
	err := d.retryable(ctx, func() error {
		counts, err := queueCounts(d.lease.Query(ctx, d.q.release, ids, fences))
		total = 0
		for _, n := range counts {
			total += int64(n)
		}
		return err
	})
	if err != nil {
		return 0, wrap("release", err)
	}
	return total, nil
}

// Rescue makes up to limit running jobs whose lease expired available
// again (or discarded when out of attempts), recording the lost attempt,
// and wakes the queues that got available jobs.
func (d *Driver) Rescue(ctx context.Context, limit int) (map[string]int, error) {
	out, err := d.tryRescue(ctx, limit)
	if d.converted(ctx, err) {
		return d.tryRescue(ctx, limit)
	}
	return out, err
}

// tryRescue is Rescue on the storage this driver last read (see converted).
func (d *Driver) tryRescue(ctx context.Context, limit int) (map[string]int, error) {
	if limit <= 0 {
		return map[string]int{}, nil
	}
	if s := d.segs(); s != nil {
		m, err := s.rescue(ctx, limit)
		return m, wrap("rescue", err)
	}
	m, err := queueCounts(d.pool.Query(ctx, d.q.rescue, limit))
	return m, wrap("rescue", err)
}

// Promote makes up to limit due scheduled and retryable jobs available
// and wakes their queues.
func (d *Driver) Promote(ctx context.Context, limit int) (map[string]int, error) {
	out, err := d.tryPromote(ctx, limit)
	if d.converted(ctx, err) {
		return d.tryPromote(ctx, limit)
	}
	return out, err
}

// tryPromote is Promote on the storage this driver last read (see converted).
func (d *Driver) tryPromote(ctx context.Context, limit int) (map[string]int, error) {
	if limit <= 0 {
		return map[string]int{}, nil
	}
	if s := d.segs(); s != nil {
		m, err := s.promote(ctx, limit)
		return m, wrap("promote", err)
	}
	m, err := queueCounts(d.pool.Query(ctx, d.q.promote, limit))
	return m, wrap("promote", err)
}

// Prune deletes up to limit completed jobs finalized more than
// completedAge ago and discarded or cancelled jobs finalized more than
// discardedAge ago. A negative age keeps that class forever.
func (d *Driver) Prune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error) {
	out, err := d.tryPrune(ctx, completedAge, discardedAge, limit)
	if d.converted(ctx, err) {
		return d.tryPrune(ctx, completedAge, discardedAge, limit)
	}
	return out, err
}

// tryPrune is Prune on the storage this driver last read (see converted).
func (d *Driver) tryPrune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error) {
	if limit <= 0 || (completedAge < 0 && discardedAge < 0) {
		return 0, nil
	}
	if s := d.segs(); s != nil {
		n, err := s.pruneAll(ctx, completedAge, discardedAge)
		return n, wrap("prune", err)
	}
	lower := completedAge
	if lower < 0 || (discardedAge >= 0 && discardedAge < lower) {
		lower = discardedAge
	}
	age := func(a time.Duration) int64 {
		if a < 0 {
			return -1 // keep this class
		}
		return micros(a)
	}
	tag, err := d.pool.Exec(ctx, d.q.prune, age(completedAge), age(discardedAge), micros(lower), limit)
	if err != nil {
		return 0, wrap("prune", err)
	}
	return tag.RowsAffected(), nil
}

// TryLead takes the maintenance leadership for id when it is free or
// expired, or extends it when id already holds it.
func (d *Driver) TryLead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	var leader string
	err := d.pool.QueryRow(ctx, d.q.tryLead, id, micros(ttl)).Scan(&leader)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, wrap("try lead", err)
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

// queueCounts reads (queue, count) rows into a map and closes them.
func queueCounts(rows pgx.Rows, err error) (map[string]int, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]int{}
	var q string
	var n int64
	for rows.Next() {
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		m[q] += int(n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return m, nil
}
