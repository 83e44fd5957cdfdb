package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"modernc.org/sqlite"

	"github.com/conveyorq/conveyor/internal/driver"
)

// execer is what the insert path needs from *sql.DB, *sql.Tx or *sql.Conn.
type execer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Insert inserts jobs in one autocommit statement (several, in one
// IMMEDIATE transaction, when the encoded batch exceeds insertChunkBytes)
// and returns their ids in input order. Its error is marked
// driver.NotCommitted when nothing was committed: a job refused before
// the statement, or the statement (or transaction) failed.
func (d *Driver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	var chunks []string
	err := insertChunks(jobs, 0, func(chunk string, _ int) error {
		chunks = append(chunks, chunk)
		return nil
	})
	if err != nil {
		return nil, driver.NotCommitted(fmt.Errorf("conveyor/sqlite: insert %d jobs: %w", len(jobs), err))
	}
	ids := make([]int64, 0, len(jobs))
	if len(chunks) == 1 {
		// One statement is atomic by itself and commits once.
		var st *sql.Stmt
		if st, err = d.prepared(ctx, d.q.Insert); err != nil {
			err = driver.NotCommitted(err)
		} else {
			err = d.retry(ctx, func() error {
				ids = ids[:0]
				return scanIDs(ctx, st, &ids, chunks[0])
			})
		}
	} else {
		err = d.inTx(ctx, func(tx *sql.Tx) error {
			ids = ids[:0]
			for _, c := range chunks {
				if err := d.insertChunk(ctx, tx, c, &ids); err != nil {
					return err
				}
			}
			return nil
		})
	}
	// After the commit, or the failure, which may follow one.
	d.noKeyless.ForgetKeyless(jobs)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: insert %d jobs: %w", len(jobs), err)
	}
	if len(ids) != len(jobs) {
		return nil, fmt.Errorf("conveyor/sqlite: insert %d jobs: %d ids returned", len(jobs), len(ids))
	}
	return ids, nil
}

// InsertClaiming is Insert that also claims the jobs c.Claim flags
// (driver.InsertClaimer): insert_claim writes each flagged job that is
// due now, by the statement's clock, and whose queue is not paused as
// running, as the claim statement would have left it, and every other
// job as Insert writes it, in the same statement (or, for a batch Insert
// splits, the same transaction), under the same commit and with its
// error marked as Insert's. It returns the ids in input order and, per
// job, the claimed row as Claim returns it (nil for a job not claimed).
// A queue of unlimited jobs needs nothing beside the row: its running
// jobs are counted from their state (jobs_running), and only limited
// claims take rate or key slots. SQLite sends no notification; the skip
// of jobs without a key ends, after the commit, for the queues of the
// jobs left to a claim (all of them when the insert failed).
func (d *Driver) InsertClaiming(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	if len(jobs) == 0 {
		return nil, nil, nil
	}
	if !slices.Contains(c.Claim[:min(len(c.Claim), len(jobs))], true) {
		ids, err := d.Insert(ctx, jobs)
		if err != nil {
			return nil, nil, err
		}
		return ids, make([]*driver.JobRow, len(jobs)), nil
	}
	if flagsKeyed(jobs, c.Claim) {
		return d.insertClaimingKeyed(ctx, jobs, c)
	}
	var chunks []claimChunk
	from := 0
	err := insertChunks(jobs, 0, func(chunk string, n int) error {
		chunks = append(chunks, claimChunk{text: chunk, flags: claimFlags(c.Claim, from, n), jobs: jobs[from : from+n]})
		from += n
		return nil
	})
	if err != nil {
		return nil, nil, driver.NotCommitted(fmt.Errorf("conveyor/sqlite: insert %d jobs: %w", len(jobs), err))
	}
	ids := make([]int64, 0, len(jobs))
	rows := make([]*driver.JobRow, 0, len(jobs))
	st, err := d.prepared(ctx, d.q.InsertClaim)
	switch {
	case err != nil:
		err = driver.NotCommitted(err)
	case len(chunks) == 1:
		// One statement is atomic by itself and commits once.
		err = d.retry(ctx, func() error {
			ids, rows = ids[:0], rows[:0]
			return insertClaimChunk(ctx, st, true, chunks[0], c, &ids, &rows)
		})
	default:
		err = d.inTx(ctx, func(tx *sql.Tx) error {
			ids, rows = ids[:0], rows[:0]
			txst := tx.StmtContext(ctx, st)
			for _, ch := range chunks {
				if err := insertClaimChunk(ctx, txst, false, ch, c, &ids, &rows); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return d.insertClaimed(jobs, ids, rows, err)
}

// insertClaimed ends an insert that claims, after its commit or its
// failure (which may follow one): the skip of jobs without a key ends
// for the queues of the jobs left to a claim (all of them on failure).
func (d *Driver) insertClaimed(jobs []driver.InsertParams, ids []int64, rows []*driver.JobRow, err error) ([]int64, []*driver.JobRow, error) {
	if err != nil {
		d.noKeyless.ForgetKeyless(jobs)
		return nil, nil, fmt.Errorf("conveyor/sqlite: insert %d jobs: %w", len(jobs), err)
	}
	d.forgetUnclaimed(jobs, rows)
	return ids, rows, nil
}

// flagsKeyed reports whether claim flags a job with a limit key: the
// insert then checks the limits of its queue (insertClaimingKeyed).
func flagsKeyed(jobs []driver.InsertParams, claim []bool) bool {
	for i := range jobs {
		if i < len(claim) && claim[i] && jobs[i].Key != "" {
			return true
		}
	}
	return false
}

// insertClaimingKeyed is InsertClaiming for an insert that flags jobs
// with a limit key (driver.Capabilities.KeyedInsertClaim). In one
// transaction, under the write lock, it reads the limits of the flagged
// jobs' queues and keeps the flag of a job only where a claim would
// have taken it at once:
//   - a queue without limits: every flagged job, as InsertClaiming;
//   - a queue with a limit other than per key (MaxRunning, Rate, KeyRate,
//     Fair): none of its jobs;
//   - a queue limited only per key (KeyMaxRunning, Ordered): its jobs
//     without a key, and of each key with no due job waiting, as many
//     as the key has free concurrency slots (the limit less the slots
//     held by running attempts or kept for a job waiting for its retry),
//     first come first;
//
// then inserts the jobs, claiming those still flagged, and has each
// claimed job with a key hold its slot, as a claim's attempt would
// (take_key_slots), before the commit.
func (d *Driver) insertClaimingKeyed(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	// Prepared before the transaction: the write handle's one
	// connection is the transaction's until it ends.
	var insClaim, limitsOf, waits, openSlots, takeSlots *sql.Stmt
	for _, x := range []struct {
		st    **sql.Stmt
		query string
	}{
		{&insClaim, d.q.InsertClaim}, {&limitsOf, d.q.InsertClaimLimits}, {&waits, d.q.KeyWaits},
		{&openSlots, d.q.OpenKeySlots}, {&takeSlots, d.q.TakeKeySlots},
	} {
		var err error
		if *x.st, err = d.prepared(ctx, x.query); err != nil {
			return nil, nil, fmt.Errorf("conveyor/sqlite: insert %d jobs: %w", len(jobs), driver.NotCommitted(err))
		}
	}
	var ids []int64
	var rows []*driver.JobRow
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		ids, rows = ids[:0], rows[:0]
		flags := make([]bool, len(jobs))
		copy(flags, c.Claim)
		slot, err := keyedClaimPlan(ctx, tx.StmtContext(ctx, limitsOf), tx.StmtContext(ctx, waits), tx.StmtContext(ctx, openSlots), jobs, flags)
		if err != nil {
			return err
		}
		txst := tx.StmtContext(ctx, insClaim)
		from := 0
		err = insertChunks(jobs, 0, func(chunk string, n int) error {
			ch := claimChunk{text: chunk, flags: claimFlags(flags, from, n), jobs: jobs[from : from+n]}
			from += n
			return insertClaimChunk(ctx, txst, false, ch, c, &ids, &rows)
		})
		if err != nil {
			return err
		}
		// The claimed jobs with a key hold their slots, queue by queue.
		take := map[string][]any{}
		var order []string
		for i, r := range rows {
			n, ok := slot[i]
			if r == nil || !ok {
				continue
			}
			q := jobs[i].Queue
			if _, seen := take[q]; !seen {
				order = append(order, q)
			}
			take[q] = append(take[q], []any{jobs[i].Key, n, r.ID, r.Fence, r.AttemptedAt.UnixMicro()})
		}
		st := tx.StmtContext(ctx, takeSlots)
		for _, q := range order {
			enc, err := json.Marshal(take[q])
			if err != nil {
				return err
			}
			if _, err := st.ExecContext(ctx, q, string(enc)); err != nil {
				return fmt.Errorf("take the key slots of the jobs claimed: %w", err)
			}
		}
		return nil
	})
	return d.insertClaimed(jobs, ids, rows, err)
}

// keyedClaimPlan clears the flags of the jobs an insert that claims must
// leave to a claim (see insertClaimingKeyed) and returns, by job index,
// the key slot each flagged job with a key is to hold. It reads in the
// insert's transaction: limitsOf is insert_claim_limits, waits key_waits
// and openSlots open_key_slots, prepared on it.
func keyedClaimPlan(ctx context.Context, limitsOf, waits, openSlots *sql.Stmt, jobs []driver.InsertParams, flags []bool) (map[int]int64, error) {
	type limits struct {
		other  bool
		keyMax int
		keyed  bool
	}
	queues := map[string]*limits{}
	type qk struct{ queue, key string }
	byKey := map[qk][]int{}
	var keys []qk
	for i := range jobs {
		if !flags[i] {
			continue
		}
		q := jobs[i].Queue
		l := queues[q]
		if l == nil {
			l = &limits{}
			queues[q] = l
			var keyOrder int
			err := limitsOf.QueryRowContext(ctx, q).Scan(&l.other, &l.keyMax, &keyOrder)
			switch {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return nil, fmt.Errorf("read the limits of queue %q: %w", q, err)
			default:
				if keyOrder > 0 && l.keyMax <= 0 {
					l.keyMax = 1
				}
				l.keyed = l.keyMax > 0
			}
		}
		if l.other {
			flags[i] = false
		}
	}
	// Every job of a limited key, flagged or not: a job left to a claim
	// is ahead of the key's later jobs of the insert, which are then left
	// to a claim too.
	for i := range jobs {
		l := queues[jobs[i].Queue]
		if l == nil || !l.keyed || jobs[i].Key == "" {
			continue
		}
		k := qk{jobs[i].Queue, jobs[i].Key}
		if _, seen := byKey[k]; !seen {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	slot := map[int]int64{}
	for _, k := range keys {
		idx := byKey[k]
		if !flags[idx[0]] {
			for _, i := range idx {
				flags[i] = false
			}
			continue
		}
		var waiting bool
		if err := waits.QueryRowContext(ctx, k.queue, k.key).Scan(&waiting); err != nil {
			return nil, fmt.Errorf("look for a waiting job of key %q: %w", k.key, err)
		}
		var free []int64
		if !waiting {
			var err error
			if free, err = freeKeySlots(ctx, openSlots, k.queue, k.key, queues[k.queue].keyMax); err != nil {
				return nil, err
			}
		}
		for n, i := range idx {
			if n < len(free) && flags[i] {
				slot[i] = free[n]
				continue
			}
			// Out of slots, or a job left to a claim: the key's jobs
			// from here on are left to one.
			for _, j := range idx[n:] {
				flags[j] = false
			}
			break
		}
	}
	return slot, nil
}

// freeKeySlots returns the concurrency slots of a key, below keyMax, that
// a new attempt may hold: those neither held by an attempt nor kept for
// a job (rows of open_key_slots with no job, and the missing ones), no
// more than keyMax less every slot held or kept (rows at or above a
// lowered limit count too).
func freeKeySlots(ctx context.Context, openSlots *sql.Stmt, queue, key string, keyMax int) ([]int64, error) {
	rs, err := openSlots.QueryContext(ctx, queue, key, keyMax)
	if err != nil {
		return nil, fmt.Errorf("read the slots of key %q: %w", key, err)
	}
	defer rs.Close()
	taken := map[int64]bool{}
	for rs.Next() {
		var n int64
		var job sql.NullInt64
		var open, below bool
		if err := rs.Scan(&n, &job, &open, &below); err != nil {
			return nil, fmt.Errorf("read the slots of key %q: %w", key, err)
		}
		if job.Valid {
			taken[n] = true
		}
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("read the slots of key %q: %w", key, err)
	}
	room := keyMax - len(taken)
	var free []int64
	for n := int64(0); n < int64(keyMax) && len(free) < room; n++ {
		if !taken[n] {
			free = append(free, n)
		}
	}
	return free, nil
}

// claimChunk is one statement of an insert that claims: the encoded rows,
// their flags (see insert_claim) and the jobs they encode.
type claimChunk struct {
	text, flags string
	jobs        []driver.InsertParams
}

// claimFlags encodes the flags of claim for the n jobs from from on, as
// insert_claim reads them: '1' for a job to claim, '0' for one not to
// (or beyond claim).
func claimFlags(claim []bool, from, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '0'
		if k := from + i; k < len(claim) && claim[k] {
			b[i] = '1'
		}
	}
	return string(b)
}

// claimedInsert is one row insert_claim returned.
type claimedInsert struct {
	id, fence, scheduled, created int64
	attempted, lease              sql.NullInt64
}

// insertClaimChunk runs st, insert_claim prepared (on a transaction's
// connection unless autocommit), for ch and appends the new ids, in
// input order, to ids and, per job, its claimed row (nil when it was not
// claimed) to rows. Run in autocommit, a statement that failed (and so
// changed nothing) is marked driver.NotCommitted, as scanIDs marks it.
// A claimed row's LeaseFrom is when the statement was sent, less the
// clock's millisecond: its lease starts later, once it holds the write
// lock, as a claim's does.
func insertClaimChunk(ctx context.Context, st *sql.Stmt, autocommit bool, ch claimChunk, c driver.InsertClaim, ids *[]int64, rows *[]*driver.JobRow) error {
	began := time.Now().Add(-time.Millisecond)
	res, err := st.QueryContext(ctx, ch.text, ch.flags, us(c.Lease), c.Worker)
	if err != nil {
		var se *sqlite.Error
		if autocommit && errors.As(err, &se) {
			err = driver.NotCommitted(err)
		}
		return err
	}
	defer res.Close()
	got := make([]claimedInsert, 0, len(ch.jobs))
	for res.Next() {
		var r claimedInsert
		if err := res.Scan(&r.id, &r.attempted, &r.lease, &r.fence, &r.scheduled, &r.created); err != nil {
			return err
		}
		got = append(got, r)
	}
	if err := res.Err(); err != nil {
		return err
	}
	if len(got) != len(ch.jobs) {
		return fmt.Errorf("%d rows returned for %d jobs", len(got), len(ch.jobs))
	}
	// Ids grow with the input position (see insert), whatever order
	// RETURNING used.
	slices.SortFunc(got, func(a, b claimedInsert) int { return cmp.Compare(a.id, b.id) })
	for i, r := range got {
		*ids = append(*ids, r.id)
		if !r.attempted.Valid {
			*rows = append(*rows, nil)
			continue
		}
		*rows = append(*rows, claimedRow(&ch.jobs[i], r, c.Worker, began))
	}
	return nil
}

// claimedRow is the row of job j that insert_claim claimed (r), as
// scanJob reads it from a claim's: the columns the statement computed
// come from r, those it copied from j.
func claimedRow(j *driver.InsertParams, r claimedInsert, worker string, leaseFrom time.Time) *driver.JobRow {
	args := j.Args
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	var meta json.RawMessage
	if len(j.Meta) > 0 {
		meta = j.Meta
	}
	return &driver.JobRow{ID: r.id, Queue: j.Queue, Kind: j.Kind, Args: args, State: driver.StateRunning,
		Priority: j.Priority, Attempt: 1, Fence: r.fence, MaxAttempts: j.MaxAttempts, TimeoutMS: j.TimeoutMS,
		ScheduledAt: fromUS(r.scheduled), CreatedAt: fromUS(r.created), AttemptedAt: fromUS(r.attempted.Int64),
		LeaseExpiresAt: fromUS(r.lease.Int64), AttemptedBy: worker, Meta: meta, Key: j.Key, LeaseFrom: leaseFrom}
}

// forgetUnclaimed ends the skip of jobs without a key (ForgetKeyless) for
// the queues of the jobs an insert that claims left to a claim (rows[i]
// nil), run by run of them: a claimed job is no claim's to find.
func (d *Driver) forgetUnclaimed(jobs []driver.InsertParams, rows []*driver.JobRow) {
	start := -1
	for i := range jobs {
		switch {
		case rows[i] == nil && start < 0:
			start = i
		case rows[i] != nil && start >= 0:
			d.noKeyless.ForgetKeyless(jobs[start:i])
			start = -1
		}
	}
	if start >= 0 {
		d.noKeyless.ForgetKeyless(jobs[start:])
	}
}

// InsertTx inserts jobs inside the caller's transaction, which must be a
// *sql.Tx on this database (ideally begun on DB(), whose transactions take
// the write lock at BEGIN). It never commits.
func (d *Driver) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	t, ok := tx.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("conveyor/sqlite: insert in transaction: got %T, want *sql.Tx: %w", tx, driver.ErrTxType)
	}
	if t == nil {
		return nil, fmt.Errorf("conveyor/sqlite: insert in transaction: got a nil *sql.Tx: %w", driver.ErrTxType)
	}
	if len(jobs) == 0 {
		return nil, nil
	}
	// Validate everything first, so that a bad job does not leave earlier
	// chunks inserted in the caller's transaction.
	for i := range jobs {
		if err := checkInsert(i, &jobs[i]); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: insert %d jobs in transaction: %w", len(jobs), err)
		}
	}
	ids := make([]int64, 0, len(jobs))
	err := insertChunks(jobs, 0, func(chunk string, _ int) error {
		return d.insertChunk(ctx, t, chunk, &ids)
	})
	// Before the caller's commit (see driver.QueueSkip).
	d.noKeyless.ForgetKeyless(jobs)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: insert %d jobs in transaction: %w", len(jobs), err)
	}
	return ids, nil
}

// insertChunk runs the insert query for one encoded chunk and appends the
// new ids, in input order, to ids.
func (d *Driver) insertChunk(ctx context.Context, e execer, chunk string, ids *[]int64) error {
	rows, err := e.QueryContext(ctx, d.q.Insert, chunk)
	return sortedIDs(rows, err, ids)
}

// scanIDs is insertChunk with the insert statement prepared, run in
// autocommit. SQLite reports a statement that failed (and so changed
// nothing) at its first step, within QueryContext: that error is marked
// driver.NotCommitted. A context that ends meanwhile is not: the statement
// may have run, and committed once reset.
func scanIDs(ctx context.Context, st *sql.Stmt, ids *[]int64, chunk string) error {
	rows, err := st.QueryContext(ctx, chunk)
	if err != nil {
		var se *sqlite.Error
		if errors.As(err, &se) {
			err = driver.NotCommitted(err)
		}
		return err
	}
	return sortedIDs(rows, nil, ids)
}

// sortedIDs appends the ids an insert returned, in input order.
func sortedIDs(rows *sql.Rows, err error, ids *[]int64) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	first := len(*ids)
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		*ids = append(*ids, id)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// The query assigns id = base + position + 1 (see queries.sql), so
	// ascending ids are input order, whatever order RETURNING used.
	slices.Sort((*ids)[first:])
	return nil
}

// BulkInsert inserts jobs in chunks of bulkChunkRows rows, one multi-row
// statement per chunk, all in one IMMEDIATE transaction.
func (d *Driver) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	var n int64
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		n = 0
		return insertChunks(jobs, bulkChunkRows, func(chunk string, rows int) error {
			res, err := tx.ExecContext(ctx, d.q.BulkInsert, chunk)
			if err != nil {
				return err
			}
			c, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += c
			return nil
		})
	})
	d.noKeyless.ForgetKeyless(jobs)
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: bulk insert %d jobs: %w", len(jobs), err)
	}
	return n, nil
}

// Claim takes up to p.Limit available jobs of p.Queue in one UPDATE ...
// RETURNING inside a BEGIN IMMEDIATE transaction. Claimers wait for the
// write lock in turn (in Go for this process, on busy_timeout for others)
// and never deadlock; each sees the previous claimer's commit, so no job is
// given twice.
func (d *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	var out []*driver.JobRow
	st, err := d.prepared(ctx, d.q.Claim)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: claim from queue %q: %w", p.Queue, err)
	}
	err = d.inTx(ctx, func(tx *sql.Tx) error {
		out, err = claimIn(ctx, tx, st, p, p.Limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: claim from queue %q: %w", p.Queue, err)
	}
	return out, nil
}

// claimIn runs the claim statement st (the prepared claim query) in tx,
// a BEGIN IMMEDIATE transaction, for up to limit jobs of p.Queue.
func claimIn(ctx context.Context, tx *sql.Tx, st *sql.Stmt, p driver.ClaimParams, limit int) ([]*driver.JobRow, error) {
	var out []*driver.JobRow
	// BEGIN IMMEDIATE has taken the write lock: the statement's clock,
	// which is this process's, starts the leases from now on (in whole
	// milliseconds, hence the one taken off).
	began := time.Now().Add(-time.Millisecond)
	rows, err := tx.StmtContext(ctx, st).QueryContext(ctx, p.Queue, limit, us(p.Lease), p.Worker)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = make([]*driver.JobRow, 0, limit)
		}
		j.LeaseFrom = began
		out = append(out, j)
	}
	return out, rows.Err()
}

// Complete applies outcomes in one fenced UPDATE ... FROM json_each and
// returns the ids that took effect. It is idempotent (fenced by attempt and
// state), so a busy database is simply retried.
func (d *Driver) Complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	bp := getBuf()
	defer putBuf(bp)
	b, err := encodeOutcomes((*bp)[:0], outcomes)
	*bp = b
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: complete: %w", err)
	}
	param := string(b)
	applied := make([]int64, 0, len(outcomes))
	st, err := d.prepared(ctx, d.q.Complete)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: complete %d outcomes: %w", len(outcomes), err)
	}
	freeKeys, err := d.prepared(ctx, d.q.FreeKeySlots)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: complete %d outcomes: %w", len(outcomes), err)
	}
	// Completions run on the write connection, ahead of every write
	// waiting for it, not on the lease path's: they are as frequent as
	// claims and inserts, and each switch of connection makes the other
	// drop its page cache (SQLite flushes a connection's cache when
	// another one has written). A completion that waits keeps its lease
	// through the heartbeats, which have the lease path to themselves.
	// The key slots of the ended attempts with a key, which the complete
	// statement names, are freed in the same transaction: jobs without
	// one cost nothing more. A queue's concurrency limit needs nothing
	// freed: claims count its running jobs.
	withResults := hasResults(outcomes)
	var keyed []keyEnd
	err = d.writeTx(ctx, true, func(tx *sql.Tx) error {
		applied, keyed = applied[:0], keyed[:0]
		rows, err := tx.StmtContext(ctx, st).QueryContext(ctx, param)
		if err := scanEnds(rows, err, &applied, &keyed); err != nil {
			return err
		}
		if len(keyed) > 0 {
			if _, err := tx.StmtContext(ctx, freeKeys).ExecContext(ctx, encodeKeyEnds(outcomeEnds(keyed, outcomes))); err != nil {
				return err
			}
		}
		if !withResults {
			return nil
		}
		// The results of the outcomes just applied, in the same
		// transaction: a stale attempt's result goes with its outcome.
		res := encodeResults(outcomes, applied)
		if res == "" {
			return nil
		}
		_, err = tx.ExecContext(ctx, d.q.StoreResults, res)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: complete %d outcomes: %w", len(outcomes), err)
	}
	return applied, nil
}

// queryIDs runs an autocommit statement returning ids on conn.
func queryIDs(ctx context.Context, conn execer, query string, ids *[]int64, args ...any) error {
	rows, err := conn.QueryContext(ctx, query, args...)
	return appendIDs(rows, err, ids)
}

// appendIDs appends the ids rows returns.
func appendIDs(rows *sql.Rows, err error, ids *[]int64) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		*ids = append(*ids, id)
	}
	return rows.Err()
}

// Heartbeat extends the leases of running attempts in one statement and
// returns the ids still owned.
func (d *Driver) Heartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	bp := getBuf()
	defer putBuf(bp)
	*bp = encodeLeases((*bp)[:0], leases)
	param := string(*bp)
	owned := make([]int64, 0, len(leases))
	err := d.leaseRetry(ctx, true, func(conn *sql.Conn) error {
		owned = owned[:0]
		return queryIDs(ctx, conn, d.q.Heartbeat, &owned, param, us(lease))
	})
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: heartbeat %d leases: %w", len(leases), err)
	}
	return owned, nil
}

// Release makes running attempts available again without counting them.
func (d *Driver) Release(ctx context.Context, leases []driver.Lease) (int64, error) {
	if len(leases) == 0 {
		return 0, nil
	}
	bp := getBuf()
	defer putBuf(bp)
	*bp = encodeLeases((*bp)[:0], leases)
	param := string(*bp)
	var n int64
	err := d.leaseRetry(ctx, false, func(conn *sql.Conn) error {
		// The released attempts' key slots are freed in the same
		// transaction (BEGIN IMMEDIATE: the lease connection's
		// transactions take the write lock up front).
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var ids []int64
		var keyed []keyEnd
		rows, err := tx.QueryContext(ctx, d.q.Release, param)
		if err := scanEnds(rows, err, &ids, &keyed); err != nil {
			return err
		}
		n = int64(len(ids))
		if len(keyed) > 0 {
			fences := make(map[int64]int64, len(leases))
			for _, l := range leases {
				fences[l.ID] = l.Fence
			}
			for i := range keyed {
				keyed[i].fence, keyed[i].state = fences[keyed[i].id], driver.StateAvailable
			}
			if err := d.freeKeySlots(ctx, tx, keyed); err != nil {
				return err
			}
		}
		return tx.Commit()
	})
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: release %d leases: %w", len(leases), err)
	}
	return n, nil
}

// Rescue handles up to limit running jobs whose lease expired (which
// leaves them out of their queue's count of running jobs, its
// concurrency limit's) and, in the same transaction, gives back the
// slots of blocks whose lease expired and whose owner has no job of the
// slot's queue running (a dead owner's, in the round that rescued its
// last job of the queue or a later one), and sweeps the key slots: it
// frees those held by attempts no longer running under their fence and
// those kept for jobs that no longer wait to run, and deletes the free
// ones unused for a minute, above their key's limit or of a queue
// without key limits. It deletes the rate slots of keys stamped more
// than max(KeyRatePeriod, a minute) ago, those beyond their queue's
// KeyRate and those of a queue without one.
func (d *Driver) Rescue(ctx context.Context, limit int) (map[string]int, error) {
	m, err := d.queueCounts(ctx, d.q.Rescue, limit, d.q.SweepBlocks, d.q.SweepKeySlots, d.q.SweepIdleKeySlots, d.q.SweepKeyRateSlots)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: rescue: %w", err)
	}
	return m, nil
}

// Promote makes up to limit due scheduled and retryable jobs available.
func (d *Driver) Promote(ctx context.Context, limit int) (map[string]int, error) {
	m, err := d.queueCounts(ctx, d.q.Promote, limit)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: promote: %w", err)
	}
	return m, nil
}

// queueCounts runs a statement returning one queue name per changed row
// and counts them; then, in the same transaction, the statements of
// after (which take no argument).
func (d *Driver) queueCounts(ctx context.Context, query string, limit int, after ...string) (map[string]int, error) {
	m := map[string]int{}
	if limit <= 0 {
		return m, nil
	}
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		clear(m)
		rows, err := tx.QueryContext(ctx, query, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var q string
			if err := rows.Scan(&q); err != nil {
				return err
			}
			m[q]++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows.Close()
		for _, a := range after {
			if _, err := tx.ExecContext(ctx, a); err != nil {
				return err
			}
		}
		return nil
	})
	return m, err
}

// Prune deletes up to limit finished jobs: completed ones finalized more
// than completedAge ago, discarded and cancelled ones more than
// discardedAge ago.
func (d *Driver) Prune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := d.retry(ctx, func() error {
		res, err := d.w.ExecContext(ctx, d.q.Prune, us(completedAge), us(discardedAge), limit)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		_, err = d.w.ExecContext(ctx, d.q.PruneResults, us(completedAge), limit)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: prune: %w", err)
	}
	// Batches fired longer ago than completed jobs are kept, with their
	// members.
	err = d.inTx(ctx, func(tx *sql.Tx) error {
		var ids []int64
		if err := queryIDs(ctx, tx, d.q.PruneBatches, &ids, us(completedAge), limit); err != nil || len(ids) == 0 {
			return err
		}
		b, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, d.q.PruneBatchJobs, string(b)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, d.q.PruneBatchDeps, string(b))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: prune: %w", err)
	}
	return n, nil
}

// TryLead takes or keeps the maintenance leadership for ttl.
func (d *Driver) TryLead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	var won bool
	err := d.retry(ctx, func() error {
		rows, err := d.w.QueryContext(ctx, d.q.TryLead, id, us(ttl))
		if err != nil {
			return err
		}
		defer rows.Close()
		won = rows.Next()
		for rows.Next() {
		}
		return rows.Err()
	})
	if err != nil {
		return false, fmt.Errorf("conveyor/sqlite: try lead: %w", err)
	}
	return won, nil
}

// keyEnd is an attempt ended, or a job finished by hand, whose job has a
// limit key: the key slot it holds (or that is kept for it) is freed, or
// kept for the job by a retryable or snoozed outcome in an ordered queue.
type keyEnd struct {
	id, fence         int64
	state, queue, key string
}

// scanEnds reads the rows of a statement ending attempts (id, key or
// NULL, queue or NULL): it appends every id to ids and the jobs with a key
// to keyed (id, queue and key set).
func scanEnds(rows *sql.Rows, err error, ids *[]int64, keyed *[]keyEnd) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	// Declared once: each variable Scan is given escapes to the heap.
	var id int64
	var key, queue sql.NullString
	for rows.Next() {
		if err := rows.Scan(&id, &key, &queue); err != nil {
			return err
		}
		*ids = append(*ids, id)
		if key.Valid {
			*keyed = append(*keyed, keyEnd{id: id, queue: queue.String, key: key.String})
		}
	}
	return rows.Err()
}

// outcomeEnds completes keyed with the fence and new state of their
// outcomes.
func outcomeEnds(keyed []keyEnd, outcomes []driver.Outcome) []keyEnd {
	at := make(map[int64]int, len(outcomes))
	for i := range outcomes {
		at[outcomes[i].ID] = i
	}
	for i := range keyed {
		o := &outcomes[at[keyed[i].id]]
		keyed[i].fence, keyed[i].state = o.Fence, o.State
	}
	return keyed
}

// freeKeySlots runs free_key_slots in tx for ends.
func (d *Driver) freeKeySlots(ctx context.Context, tx *sql.Tx, ends []keyEnd) error {
	_, err := tx.ExecContext(ctx, d.q.FreeKeySlots, encodeKeyEnds(ends))
	return err
}

// encodeKeyEnds encodes [[id, fence, state, queue, key], ...].
func encodeKeyEnds(ends []keyEnd) string {
	b := []byte{'['}
	for i, e := range ends {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, e.id, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, e.fence, 10)
		b = append(b, ',')
		b = appendJSONStr(b, e.state)
		b = append(b, ',')
		b = appendJSONStr(b, e.queue)
		b = append(b, ',')
		b = appendJSONStr(b, e.key)
		b = append(b, ']')
	}
	b = append(b, ']')
	return string(b)
}
