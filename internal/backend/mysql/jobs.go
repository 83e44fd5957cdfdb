package mysql

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor/internal/driver"
)

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }

// scanJob reads the job_columns of one row, after the extra leading
// destinations.
func scanJob(r rowScanner, extra ...any) (*driver.JobRow, error) {
	j := &driver.JobRow{}
	var (
		args                  []byte
		errs                  []byte
		attempted, fin, lease sql.NullTime
		by                    sql.NullString
		meta                  []byte // NULL scans as nil, without allocating
		lkey                  sql.NullString
	)
	dest := make([]any, 0, len(extra)+19)
	dest = append(dest, extra...)
	dest = append(dest, &j.ID, &j.Queue, &j.Kind, &args, &j.State, &j.Priority, &j.Attempt, &j.MaxAttempts, &j.TimeoutMS,
		&j.ScheduledAt, &j.CreatedAt, &attempted, &fin, &lease, &by, &errs, &j.Fence, &meta, &lkey)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	j.Args = json.RawMessage(args)
	j.Key = lkey.String
	if len(meta) > 0 {
		j.Meta = meta
	}
	j.AttemptedAt = attempted.Time
	j.FinalizedAt = fin.Time
	j.LeaseExpiresAt = lease.Time
	j.AttemptedBy = by.String
	if len(errs) > 2 {
		if err := json.Unmarshal(errs, &j.Errors); err != nil {
			return nil, fmt.Errorf("job %d: decode errors: %w", j.ID, err)
		}
	}
	return j, nil
}

func scanJobs(rows *sql.Rows) ([]*driver.JobRow, error) {
	defer rows.Close()
	var out []*driver.JobRow
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

// insertPlan is a validated batch split into statements that each fit in
// max_allowed_packet and the placeholder limit.
type insertPlan struct {
	chunks [][]driver.InsertParams
}

const insertParamsPerRow = 10

func (d *Driver) planInsert(op string, jobs []driver.InsertParams) (insertPlan, error) {
	var p insertPlan
	budget := d.maxPacket - d.maxPacket/8 - 4096
	rowText := len(d.q.InsertRow) + 2
	start, size := 0, len(d.q.InsertHead)
	for i := range jobs {
		j := &jobs[i]
		if len(j.Args) > d.maxArgs {
			return p, fmt.Errorf("conveyor/mysql: %s: job %d (kind %q): args are %d bytes, more than this server accepts (%d bytes, from max_allowed_packet %d)",
				op, i, j.Kind, len(j.Args), d.maxArgs, d.maxPacket)
		}
		if n := utf8.RuneCountInString(j.Queue); n == 0 || n > 128 {
			return p, fmt.Errorf("conveyor/mysql: %s: job %d: queue name must be 1 to 128 characters, got %d", op, i, n)
		}
		if n := utf8.RuneCountInString(j.Kind); n == 0 || n > 128 {
			return p, fmt.Errorf("conveyor/mysql: %s: job %d: kind must be 1 to 128 characters, got %d", op, i, n)
		}
		if len(j.Key) > driver.MaxKeyBytes || strings.IndexByte(j.Key, 0) >= 0 || !utf8.ValidString(j.Key) {
			return p, fmt.Errorf("conveyor/mysql: %s: job %d: key must be at most %d bytes of UTF-8 without NUL", op, i, driver.MaxKeyBytes)
		}
		// Each row costs its values, the parameter headers and its share of
		// the statement text (the prepare packet must fit too).
		row := len(j.Args) + len(j.Meta) + len(j.Key) + len(j.Queue) + len(j.Kind) + 104 + rowText
		if i > start && (size+row > budget || i-start >= maxInsertRows) {
			p.chunks = append(p.chunks, jobs[start:i])
			start, size = i, len(d.q.InsertHead)
		}
		size += row
	}
	if start < len(jobs) {
		p.chunks = append(p.chunks, jobs[start:])
	}
	return p, nil
}

// insertSQL returns the multi-row INSERT for n rows.
func (d *Driver) insertSQL(n int) string {
	head, row := d.q.InsertHead, d.q.InsertRow
	var b strings.Builder
	b.Grow(len(head) + 1 + n*(len(row)+2))
	b.WriteString(head)
	b.WriteByte(' ')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}

func insertArgs(args []any, jobs []driver.InsertParams) []any {
	for i := range jobs {
		j := &jobs[i]
		a := []byte(j.Args)
		if len(a) == 0 {
			a = []byte("null")
		}
		var runAt any
		if !j.RunAt.IsZero() {
			runAt = dbTime(j.RunAt.Truncate(time.Microsecond))
		}
		var meta any // NULL without metadata
		if len(j.Meta) > 0 {
			meta = []byte(j.Meta)
		}
		var key any // NULL without a key
		if j.Key != "" {
			key = j.Key
		}
		args = append(args, j.Queue, j.Kind, a, int64(j.Priority), int64(j.MaxAttempts), j.TimeoutMS, runAt, micros(j.Delay), meta, key)
	}
	return args
}

// insertChunk runs one multi-row INSERT and writes the ids in order. The
// INSERT ... VALUES of a known number of rows is a "simple insert": InnoDB
// reserves its auto-increment values in one step in every
// innodb_autoinc_lock_mode (0, 1 and 2), so they are consecutive from the
// LAST_INSERT_ID() of the statement, spaced by auto_increment_increment.
// On Galera that step follows the cluster's size and can change under an
// open session, so there the INSERT returns its ids (insert_returning),
// or, on servers without RETURNING, each row is a statement of its own,
// which must then run inside a transaction (tx or ext) so that the rows
// commit together (see rowPerStatement).
func (d *Driver) insertChunk(ctx context.Context, tx *sql.Tx, ext *sql.Tx, jobs []driver.InsertParams, ids []int64) error {
	if d.galera && len(jobs) > 1 {
		if d.returning {
			return d.insertReturning(ctx, tx, ext, jobs, ids)
		}
		if tx == nil && ext == nil {
			return fmt.Errorf("inserting %d rows one statement each needs a transaction", len(jobs))
		}
		for i := range jobs {
			if err := d.insertChunk(ctx, tx, ext, jobs[i:i+1], ids[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	}
	args := insertArgs(make([]any, 0, len(jobs)*insertParamsPerRow), jobs)
	q := d.insertSQL(len(jobs))
	var res sql.Result
	var err error
	if ext != nil {
		res, err = ext.ExecContext(ctx, q, args...)
	} else {
		res, err = d.exec(ctx, tx, len(jobs) <= maxCachedInsertRows, q, args...)
	}
	if err != nil {
		return err
	}
	return d.sequentialIDs(res, ids)
}

// sequentialIDs writes to ids the ids of the rows a multi-row "simple
// insert" res inserted (len(ids) of them, see insertChunk): consecutive
// from its LAST_INSERT_ID(), spaced by auto_increment_increment.
func (d *Driver) sequentialIDs(res sql.Result, ids []int64) error {
	first, err := res.LastInsertId()
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err == nil && n != int64(len(ids)) {
		return fmt.Errorf("inserted %d rows, expected %d", n, len(ids))
	}
	for i := range ids {
		ids[i] = first + int64(i)*d.autoincStep
	}
	return nil
}

// insertReturning is insertChunk's multi-row INSERT ... RETURNING id: the
// rows come back in the order of the VALUES list.
func (d *Driver) insertReturning(ctx context.Context, tx *sql.Tx, ext *sql.Tx, jobs []driver.InsertParams, ids []int64) error {
	args := insertArgs(make([]any, 0, len(jobs)*insertParamsPerRow), jobs)
	q := d.insertSQL(len(jobs)) + " " + d.q.InsertReturning
	var rows *sql.Rows
	var err error
	if ext != nil {
		rows, err = ext.QueryContext(ctx, q, args...)
	} else {
		rows, err = d.query(ctx, tx, len(jobs) <= maxCachedInsertRows, q, args...)
	}
	if err != nil {
		return err
	}
	return scanIDs(rows, ids)
}

// scanIDs reads the ids a multi-row INSERT ... RETURNING id returned, in
// the order of its VALUES list, into ids, and closes rows.
func scanIDs(rows *sql.Rows, ids []int64) error {
	defer rows.Close()
	n := 0
	for rows.Next() {
		if n == len(ids) {
			return fmt.Errorf("inserted more rows than the %d expected", len(ids))
		}
		if err := rows.Scan(&ids[n]); err != nil {
			return err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(ids) {
		return fmt.Errorf("inserted %d rows, expected %d", n, len(ids))
	}
	return nil
}

// Insert inserts jobs with one multi-row INSERT (several, in one
// transaction, when the batch exceeds max_allowed_packet or each row is a
// statement of its own, see rowPerStatement) and returns their ids in
// order. There is no notification channel to wake. Its error is marked
// driver.NotCommitted when nothing was committed (see refused).
func (d *Driver) Insert(ctx context.Context, jobs []driver.InsertParams) ([]int64, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	defer d.behindInserted(jobs)
	p, err := d.planInsert("insert", jobs)
	if err != nil {
		return nil, driver.NotCommitted(err)
	}
	ids := make([]int64, len(jobs))
	if len(p.chunks) == 1 && !d.rowPerStatement(len(jobs)) {
		if err := d.retry(ctx, "insert", func() error { return d.refused(d.insertChunk(ctx, nil, nil, jobs, ids)) }); err != nil {
			return nil, err
		}
		return ids, nil
	}
	err = d.inTx(ctx, "insert", func(tx *sql.Tx) error {
		off := 0
		for _, c := range p.chunks {
			if err := d.insertChunk(ctx, tx, nil, c, ids[off:off+len(c)]); err != nil {
				return err
			}
			off += len(c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// rowPerStatement reports whether insertChunk writes n rows as n
// statements (Galera without RETURNING). Without a transaction each would
// commit on its own: a failure on a later row would leave the earlier
// ones committed, and a retry would insert them again.
func (d *Driver) rowPerStatement(n int) bool {
	return d.galera && !d.returning && n > 1
}

// InsertTx inserts jobs inside the caller's transaction, which must be a
// *sql.Tx on a MySQL or MariaDB connection; it never commits it. Times are
// sent as UTC text and computed with UTC_TIMESTAMP, so the caller's
// connection settings (loc, time_zone) do not matter.
func (d *Driver) InsertTx(ctx context.Context, tx any, jobs []driver.InsertParams) ([]int64, error) {
	t, ok := tx.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("conveyor/mysql: insert tx: got %T, want *sql.Tx (database/sql on a go-sql-driver/mysql connection): %w", tx, driver.ErrTxType)
	}
	if len(jobs) == 0 {
		return nil, nil
	}
	defer d.behindInserted(jobs)
	p, err := d.planInsert("insert tx", jobs)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(jobs))
	off := 0
	for _, c := range p.chunks {
		if err := d.insertChunk(ctx, nil, t, c, ids[off:off+len(c)]); err != nil {
			return nil, d.wrap("insert tx", err)
		}
		off += len(c)
	}
	return ids, nil
}

// BulkInsert inserts many jobs in one transaction, as multi-row INSERTs
// sized to max_allowed_packet; full-size chunks reuse one prepared
// statement.
func (d *Driver) BulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	defer d.behindInserted(jobs)
	p, err := d.planInsert("bulk insert", jobs)
	if err != nil {
		return 0, driver.NotCommitted(err)
	}
	err = d.inTx(ctx, "bulk insert", func(tx *sql.Tx) error {
		stmts := map[int]*sql.Stmt{}
		defer func() {
			for _, s := range stmts {
				s.Close()
			}
		}()
		args := make([]any, 0, maxInsertRows*insertParamsPerRow)
		for _, c := range p.chunks {
			args = insertArgs(args[:0], c)
			s, ok := stmts[len(c)]
			if !ok {
				var err error
				s, err = tx.PrepareContext(ctx, d.insertSQL(len(c)))
				if err != nil {
					return err
				}
				stmts[len(c)] = s
			}
			if _, err := s.ExecContext(ctx, args...); err != nil {
				return err
			}
			clear(args)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int64(len(jobs)), nil
}

// Claim takes up to p.Limit available jobs of p.Queue; see claim_select
// and claim_optimistic in queries.sql.
func (d *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	// "Up to Limit": one claim takes at most maxBucket rows, so that its id
	// lists stay within one prepared statement size.
	p.Limit = min(p.Limit, maxBucket)
	if d.claimMethod == ClaimOptimistic {
		return d.claimOptimistic(ctx, p)
	}
	return d.claimSkipLocked(ctx, p, d.claimCursor(p.Queue))
}

// claimCursor remembers, per queue, where this process's claims resume:
// the key of the last job it claimed, before which a claim from the front
// of the queue (claim_select) found nothing more to take. Resuming after
// it (claim_select_after) skips the claim-index entries of the jobs
// claimed before it: InnoDB keeps them, delete-marked, until purge removes
// them, which it cannot do while any transaction older than them is open
// (a long consistent snapshot, such as a backup's), and a claim from the
// front reads every one of them. A claim that comes back short, the queue
// drained, keeps the cursor. The front of the queue is read again
// frontAfter the last such read began: frontEvery, or frontShare times as
// long as that read took when longer, so that reading the front takes at
// most about a frontShare-th of the claims' time however many entries
// purge left, while a job behind the cursor still waits no more than
// about two such reads. It is read at once when this process inserted,
// released or retried a job that may sort before the cursor (see behind),
// and a job this process promoted or rescued moves the cursor back to it
// (see before). A job that becomes available before the cursor otherwise
// (a higher priority or past run_at inserted by another process, a job
// promoted, rescued or released by another process, a lock skipped and
// then rolled back, a job whose insert read the clock before a job the
// cursor passed and committed after it) waits at most frontAfter longer.
//
// Once a read of the front takes probeInline or more (purge is behind,
// most often because a long snapshot holds it back), the reads of the
// front that are only due by time no longer run in the claims: a probe
// (claim_probe, a plain read of the claim index that locks nothing, a
// tenth of the locking read's cost or less) runs on a goroutine of its
// own beside them, every probeShare times as long as it took, and the
// jobs it finds before the cursor are claimed by id (claim_select_ids) by
// the claims that follow, before they resume after the cursor. The claims
// then never wait for a read of the dead entries, however many there
// are; a job behind the cursor waits for the probe instead.
type claimCursor struct {
	mu    sync.Mutex
	valid bool // prio, sched, id hold a position
	prio  int
	sched time.Time
	id    int64
	// scanned is when the last claim from the front began, took how long
	// it took.
	scanned time.Time
	took    time.Duration
	// marked counts the calls of behind; clean is the count the last claim
	// from the front began after.
	marked, clean uint64
	// moved counts the times before moved the cursor back.
	moved uint64
	// probing: a probe of the front runs (see probeFront); probeTook is
	// how long the last one took, and found the jobs it saw before the
	// cursor, in claim order, that no claim has tried to take yet.
	probing   bool
	probeTook time.Duration
	found     []*driver.JobRow
}

// probeInline is the cost of a read of the front above which the reads
// due by time are probes apart from the claims (see claimCursor).
const probeInline = 5 * time.Millisecond

// probeShare spaces probes: one starts probeShare times as long after the
// last one began as it took (or frontEvery after, when longer), so that
// probes take at most about a probeShare-th of one connection's time.
const probeShare = 8

// probeRows is how many positions one probe reads from the front.
const probeRows = 256

// probeFor bounds one probe.
const probeFor = time.Minute

// cursorFor bounds how long a claim of jobs without a key in a queue
// limited per key waits after finding none (see keys.go).
const cursorFor = time.Second

// frontEvery bounds how long claims resume from a cursor before reading
// the queue from the front again, unless that read takes longer than a
// frontShare-th of it: a job that became available behind the cursor
// without this process knowing waits at most about that much longer
// while reads of the front are cheap (no long snapshot holds purge back).
const frontEvery = 100 * time.Millisecond

// frontShare bounds the share of a queue's claim time spent reading the
// front of the queue again (see claimCursor).
const frontShare = 2

// frontAfter is how long after the last claim from the front began the
// next one is due.
func (c *claimCursor) frontAfter() time.Duration {
	if c.probes() {
		return max(frontEvery, probeShare*c.probeTook)
	}
	return max(frontEvery, frontShare*c.took)
}

// probes reports whether the reads of the front due by time are probes:
// the last locking read of the front took probeInline or more, and the
// last probe did not show the front cheap again (under a quarter of
// that).
func (c *claimCursor) probes() bool {
	return c.took >= probeInline
}

func (d *Driver) claimCursor(queue string) *claimCursor {
	c, _ := d.cursors.LoadOrStore(queue, &claimCursor{})
	return c.(*claimCursor)
}

// before moves the cursor back so that the next claim resumes at job j
// (a job just made available), if j comes before it in claim order or is
// the job it stands at (a job claimed, then rescued, keeps its key).
// Without a position yet (the queue's first claim, or the first after a
// failed one, may be running from the front and set one past j), the
// next claim reads the front.
func (c *claimCursor) before(j *driver.JobRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.valid {
		c.marked++
		return
	}
	if !claimsBefore(c.prio, c.sched, c.id, j) {
		c.prio, c.sched, c.id = j.Priority, j.ScheduledAt, j.ID-1
		c.moved++
	}
}

// behind records that a job of the queue may have become available before
// its cursor: the next claim reads the queue from the front.
func (d *Driver) behind(queue string) {
	if c, ok := d.cursors.Load(queue); ok {
		c := c.(*claimCursor)
		c.mu.Lock()
		c.marked++
		c.mu.Unlock()
	}
}

// behindAll is behind for every queue this process claims from.
func (d *Driver) behindAll() {
	d.cursors.Range(func(q, _ any) bool {
		d.behind(q.(string))
		return true
	})
}

// behindInserted calls behind for the queues of jobs that may sort well
// before their queue's cursor: a job with a run_at (which may be past) or
// a priority ahead of the cursor's. The scheduled_at of other new jobs is
// the database's clock at the insert, so they sort after the cursor unless
// their insert committed after a claim took a job inserted later. Before
// the cursor holds a position, every insert is marked: a claim running
// from the front may set one past the job. It also ends the skip of the
// jobs without a key in their queues (see driver.QueueSkip).
func (d *Driver) behindInserted(jobs []driver.InsertParams) {
	d.noKeyless.ForgetKeyless(jobs)
	for i := range jobs {
		j := &jobs[i]
		c, ok := d.cursors.Load(j.Queue)
		if !ok {
			continue
		}
		cur := c.(*claimCursor)
		cur.mu.Lock()
		if !cur.valid || !j.RunAt.IsZero() || j.Priority < cur.prio {
			cur.marked++
		}
		cur.mu.Unlock()
	}
}

// claimStart is what a claim began after: whether it reads the queue from
// the front, and the cursor's marked and moved counts.
type claimStart struct {
	front         bool
	marked, moved uint64
	// probe: the claim starts a probe of the front (see probeFront);
	// ids are jobs an earlier probe found before the cursor, which the
	// claim takes by id first.
	probe bool
	ids   []int64
}

// query returns the claim statement and its arguments, and what the claim
// begins after.
func (c *claimCursor) query(d *Driver, p driver.ClaimParams) (string, []any, claimStart) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := claimStart{marked: c.marked, moved: c.moved}
	due := time.Since(c.scanned) >= c.frontAfter()
	if !c.valid || c.marked != c.clean || (due && !c.probes()) {
		c.scanned = time.Now()
		st.front = true
		return d.q.ClaimSelect, []any{p.Queue, p.Queue, int64(p.Limit)}, st
	}
	if due && !c.probing {
		c.scanned = time.Now()
		c.probing = true
		st.probe = true
	}
	for len(c.found) > 0 && len(st.ids) < p.Limit {
		st.ids = append(st.ids, c.found[0].ID)
		c.found = c.found[1:]
	}
	s := dbTime(c.sched)
	return d.q.ClaimSelectAfter, []any{p.Queue, p.Queue, c.prio, c.prio, s, s, c.id, int64(p.Limit)}, st
}

// advance moves the cursor after a claim of limit rows that returned rows
// (in claim order) and took took. A claim that read from the front and
// came back short saw every available job of the queue that no other
// claim held: the cursor keeps the later of its position and the last
// row. If before moved the cursor back while the claim ran, the claim may
// have passed the job it moved back to: the cursor keeps the earlier of
// the two. Otherwise the cursor moves to the last row, if any.
func (c *claimCursor) advance(rows []*driver.JobRow, limit int, st claimStart, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.front {
		c.clean, c.took = st.marked, took
	}
	if len(rows) == 0 {
		return
	}
	last := rows[len(rows)-1]
	if c.valid {
		earlier := claimsBefore(c.prio, c.sched, c.id, last)
		switch {
		case c.moved != st.moved:
			if earlier {
				return
			}
		case st.front && len(rows) < limit:
			if !earlier {
				return
			}
		}
	}
	c.valid, c.prio, c.sched, c.id = true, last.Priority, last.ScheduledAt, last.ID
}

// failed records a claim that failed: the rows it had locked, which
// concurrent claims skipped, are available again, so the next claim
// reads the front, even if a concurrent claim ends after this one and
// moves the cursor past them.
func (c *claimCursor) failed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.valid = false
	c.marked++
}

// claimsBefore reports whether the key (prio, sched, id) comes before
// job j's in claim order.
func claimsBefore(prio int, sched time.Time, id int64, j *driver.JobRow) bool {
	if prio != j.Priority {
		return prio < j.Priority
	}
	if !sched.Equal(j.ScheduledAt) {
		return sched.Before(j.ScheduledAt)
	}
	return id < j.ID
}

// claimSkipLocked runs claim_select (or claim_select_after) and
// claim_mark_queued in one transaction.
func (d *Driver) claimSkipLocked(ctx context.Context, p driver.ClaimParams, cur *claimCursor) ([]*driver.JobRow, error) {
	var out []*driver.JobRow
	q, qargs, st := cur.query(d, p)
	if st.probe {
		d.startProbe(p.Queue, cur)
	}
	// resumed: the rows the statement after the cursor returned, which
	// alone move the cursor (the jobs taken by id sort before it).
	var resumed []*driver.JobRow
	limit := p.Limit
	// took counts from when the transaction had a connection: a wait for
	// the pool (or a retry's backoff) is no part of the read's cost, and
	// counted in it would space the next read of the front (frontAfter)
	// by twice the wait.
	var took time.Duration
	err := d.inTx(ctx, "claim", func(tx *sql.Tx) error {
		began := time.Now()
		from := leaseFrom()
		var byID []*driver.JobRow
		var now time.Time
		var floor sql.NullInt64
		var err error
		if len(st.ids) > 0 {
			iq, iargs, _ := d.inList(d.q.ClaimSelectIDs, st.ids, p.Queue, p.Queue)
			if byID, now, floor, err = d.lockClaimTx(ctx, tx, iq, iargs); err != nil {
				return err
			}
		}
		// The rest after the cursor, marked with the jobs taken by id.
		limit = p.Limit - len(byID)
		resumed = nil
		if limit > 0 {
			qargs[len(qargs)-1] = int64(limit)
			var rnow time.Time
			var rfloor sql.NullInt64
			if resumed, rnow, rfloor, err = d.lockClaimTx(ctx, tx, q, qargs); err != nil {
				return err
			}
			// A job taken by id may also be after the cursor (moved
			// back since the probe): this transaction's own lock does
			// not skip it. Keep it once.
			if len(byID) > 0 {
				resumed = slices.DeleteFunc(resumed, func(r *driver.JobRow) bool {
					return slices.ContainsFunc(byID, func(b *driver.JobRow) bool { return b.ID == r.ID })
				})
			}
			if len(byID) == 0 {
				now, floor = rnow, rfloor
			}
		}
		out, err = d.markClaimedTx(ctx, tx, p, append(byID, resumed...), now, floor)
		if len(out) == 0 {
			resumed = nil
		}
		for _, j := range out {
			j.LeaseFrom = from
		}
		took = time.Since(began)
		return err
	})
	if err != nil {
		cur.failed()
		return nil, err
	}
	cur.advance(out[len(out)-len(resumed):], max(limit, 1), st, took)
	return out, nil
}

// startProbe runs probeFront for queue's cursor on a goroutine of its own,
// bounded by probeFor and by the driver's Close.
func (d *Driver) startProbe(queue string, cur *claimCursor) {
	ctx, stop, ok := d.background(probeFor)
	if !ok {
		cur.probed(nil, 0, errors.New("driver closed"))
		return
	}
	go func() {
		defer d.bgDone()
		defer stop()
		d.probeFront(ctx, queue, cur)
	}()
}

// probeFront reads where the available jobs of queue begin (claim_probe)
// and hands those before the cursor to the claims that follow.
func (d *Driver) probeFront(ctx context.Context, queue string, cur *claimCursor) {
	began := time.Now()
	found, err := func() ([]*driver.JobRow, error) {
		rows, err := d.query(ctx, nil, true, d.q.ClaimProbe, queue, probeRows)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var found []*driver.JobRow
		for rows.Next() {
			j := &driver.JobRow{}
			if err := rows.Scan(&j.Priority, &j.ScheduledAt, &j.ID); err != nil {
				return nil, err
			}
			found = append(found, j)
		}
		return found, rows.Err()
	}()
	cur.probed(found, time.Since(began), err)
}

// probed records a probe's outcome: the jobs it found that sort before the
// cursor become the ones the next claims take by id (in place of any an
// earlier probe found: those still available are among them). A failed
// probe leaves the cursor as it was; the next one is due frontAfter the
// failed one began. A probe that took under a quarter of probeInline shows
// the front cheap again: the next read due by time is a locking read of
// the front, in the claim.
func (c *claimCursor) probed(found []*driver.JobRow, took time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probing = false
	if err != nil {
		return
	}
	c.probeTook = took
	c.found = c.found[:0]
	for _, j := range found {
		if c.valid && claimsBefore(j.Priority, j.ScheduledAt, j.ID, &driver.JobRow{Priority: c.prio, ScheduledAt: c.sched, ID: c.id}) {
			c.found = append(c.found, j)
		}
	}
	if len(c.found) == probeRows {
		// More may follow: probe again at the next claim.
		c.scanned = time.Time{}
	}
	if took < probeInline/4 {
		c.took = 0
	}
}

// leaseFrom is the LeaseFrom of the jobs a claim's transaction, begun
// just now, will take: a millisecond before now, so that the lease its
// statements start by the server's clock (NOW(6) at each statement, after
// this) is never earlier. It leaves out the wait for a connection before
// the transaction began, which on a small pool shared with handlers can
// take most of a lease: counted from before it, the engine would cut the
// attempts off as they start.
func leaseFrom() time.Time { return time.Now().Add(-time.Millisecond) }

// claimLockedTx runs the locking claim statement q (claim_select or
// claim_select_after, with its arguments) and claim_mark_queued in tx,
// and returns the jobs as marked.
func (d *Driver) claimLockedTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, q string, qargs []any) ([]*driver.JobRow, error) {
	out, now, floor, err := d.lockClaimTx(ctx, tx, q, qargs)
	if err != nil {
		return nil, err
	}
	return d.markClaimedTx(ctx, tx, p, out, now, floor)
}

// lockClaimTx runs the locking claim statement q and returns the rows it
// locked, the clock it read and the fence floor.
func (d *Driver) lockClaimTx(ctx context.Context, tx *sql.Tx, q string, qargs []any) ([]*driver.JobRow, time.Time, sql.NullInt64, error) {
	var out []*driver.JobRow
	var now time.Time
	var floor sql.NullInt64
	rows, err := d.query(ctx, tx, true, q, qargs...)
	if err != nil {
		return nil, now, floor, err
	}
	for rows.Next() {
		j, err := scanJob(rows, &now, &floor)
		if err != nil {
			rows.Close()
			return nil, now, floor, err
		}
		out = append(out, j)
	}
	rows.Close()
	return out, now, floor, rows.Err()
}

// markClaimedTx marks the rows lockClaimTx locked in tx as claimed
// (claim_mark_queued), with the clock and fence floor it read.
func (d *Driver) markClaimedTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams, out []*driver.JobRow, now time.Time, floor sql.NullInt64) ([]*driver.JobRow, error) {
	if len(out) == 0 {
		return nil, nil
	}
	f, err := d.fenceFloor(ctx, tx, floor)
	if err != nil {
		return nil, err
	}
	lease := now.Add(p.Lease).Truncate(time.Microsecond)
	ids := make([]int64, len(out))
	for i, j := range out {
		ids[i] = j.ID
	}
	mq, args, cache := d.inList(d.q.ClaimMarkQueued, ids, dbTime(now), dbTime(lease), p.Worker, f, p.Queue)
	res, err := d.exec(ctx, tx, cache, mq, args...)
	if err != nil {
		return nil, err
	}
	switch n, _ := res.RowsAffected(); n {
	case int64(len(out)):
	case 0:
		// Paused since the rows were locked (see claim_mark_queued).
		return nil, nil
	default:
		return nil, fmt.Errorf("marked %d of %d locked rows", n, len(out))
	}
	for _, j := range out {
		j.State = driver.StateRunning
		j.Attempt++
		j.Fence = max(j.Fence+1, f)
		j.AttemptedAt = now
		j.LeaseExpiresAt = lease
		j.AttemptedBy = p.Worker
	}
	return out, nil
}

// claimWindow is how many due rows a contended optimistic claim picks
// from at random.
func claimWindow(limit int) int { return max(4*limit, limit+16) }

// contendedFor is how long optimistic claims keep picking at random after
// a conflict was seen.
const contendedFor = time.Second

// claimRounds bounds the window reads of one optimistic claim.
const claimRounds = 3

// claimOptimistic runs claim_window and claim_optimistic. Uncontended, the
// window is exactly the rows wanted, so jobs are taken strictly in claim
// order. When the UPDATE took fewer rows than it was given, another claimer
// got there first: the claim reads a wider window and picks the remainder
// at random, and for the next second claims pick at random straight away
// (claim order is then approximate within the window).
func (d *Driver) claimOptimistic(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	return d.claimOptimisticTx(ctx, nil, p)
}

// claimOptimisticTx is claimOptimistic inside tx, or with autocommit
// statements (each retried on its own) when tx is nil. Inside tx, the
// rows it took stay locked until tx ends and an error is returned at
// once, for the caller to retry the whole transaction. Without tx, each
// UPDATE that took rows has committed them as claimed (running, an
// attempt used): a later failure (of a further round, or ctx's end) must
// not drop them, or they would wait for their lease to expire, and a
// job on its last attempt would be discarded without having run. The
// claim then ends with the rows taken so far, read back even if ctx has
// ended.
func (d *Driver) claimOptimisticTx(ctx context.Context, tx *sql.Tx, p driver.ClaimParams) ([]*driver.JobRow, error) {
	run := func(op string, fn func() error) error {
		if tx != nil {
			return fn()
		}
		return d.retry(ctx, op, fn)
	}
	token, err := newToken()
	if err != nil {
		return nil, d.wrap("claim", err)
	}
	random := time.Now().UnixNano() < d.contendedUntil.Load()
	var cand []int64
	var floor sql.NullInt64
	got := 0
	// fail returns err, or, without tx, ends the rounds when rows may
	// be taken already (see above), keeping err in failed.
	// uncertain: an UPDATE failed without tx, and may have taken rows all
	// the same (its answer lost, or ctx ended while the server ran it):
	// its pick is read back by token with the rest.
	stop, uncertain := false, false
	var failed error
	fail := func(err error) error {
		if tx == nil && (got > 0 || uncertain) {
			stop, failed = true, err
			return nil
		}
		return err
	}
	for round := 0; round < claimRounds && got < p.Limit && !stop; round++ {
		want := p.Limit - got
		n := want
		if random {
			n = claimWindow(want)
		}
		var window []int64
		err := run("claim", func() error {
			window = window[:0]
			rows, err := d.query(ctx, tx, true, d.q.ClaimWindow, p.Queue, p.Queue, int64(n))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id, &floor); err != nil {
					return err
				}
				window = append(window, id)
			}
			return rows.Err()
		})
		if err != nil {
			if err = fail(err); err != nil {
				return nil, err
			}
			break
		}
		if len(window) == 0 {
			break
		}
		if d.claimStep != nil {
			d.claimStep("window")
		}
		if !floor.Valid {
			// A new primary, or a failback: take the next epoch first.
			take := func(tx *sql.Tx) error {
				f, err := d.fenceFloor(ctx, tx, floor)
				floor = sql.NullInt64{Int64: f, Valid: err == nil}
				return err
			}
			if tx != nil {
				err = take(tx)
			} else {
				err = d.inTx(ctx, "claim", take)
			}
			if err != nil {
				if err = fail(err); err != nil {
					return nil, err
				}
				break
			}
		}
		pick := window
		if len(window) > want {
			for i := 0; i < want; i++ {
				k := i + mrand.IntN(len(window)-i)
				window[i], window[k] = window[k], window[i]
			}
			pick = window[:want]
		}
		slices.Sort(pick)
		q, args, cache := d.inList(d.q.ClaimOptimistic, pick, floor.Int64, micros(p.Lease), p.Worker, token[:], floor.Int64>>fenceEpochShift)
		var took int64
		err = run("claim", func() error {
			res, err := d.exec(ctx, tx, cache, q, args...)
			if err != nil {
				return err
			}
			took, err = res.RowsAffected()
			return err
		})
		if err != nil {
			if tx == nil {
				cand = append(cand, pick...)
				uncertain = true
			}
			if err = fail(err); err != nil {
				return nil, err
			}
			break
		}
		if took > 0 && d.claimStep != nil {
			d.claimStep("taken")
		}
		got += int(took)
		cand = append(cand, pick...)
		if int(took) == len(pick) {
			break // no conflict: done, or the queue has no more
		}
		d.claimConflicts.Add(1)
		d.contendedUntil.Store(time.Now().Add(contendedFor).UnixNano())
		random = true
	}
	if got == 0 && !uncertain {
		return nil, nil
	}
	rctx := ctx
	if tx == nil {
		// The rows are claimed: read them back even if ctx has ended.
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	out := make([]*driver.JobRow, 0, got)
	for off := 0; off < len(cand); off += maxBucket {
		part := cand[off:min(off+maxBucket, len(cand))]
		q, args, cache := d.inList(d.q.ClaimByToken, part, token[:])
		var js []*driver.JobRow
		read := func() error {
			rows, err := d.query(rctx, tx, cache, q, args...)
			if err != nil {
				return err
			}
			js, err = scanJobs(rows)
			return err
		}
		var err error
		if tx != nil {
			err = d.wrap("claim", read())
		} else {
			err = d.retry(rctx, "claim", read)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, js...)
	}
	switch {
	case len(out) == 0 && failed != nil:
		return nil, failed
	case !uncertain && len(out) != got:
		return nil, fmt.Errorf("conveyor/mysql: claim: took %d rows but read back %d", got, len(out))
	}
	return out, nil
}

// batchSource expands {source} in query for n tuples of width fields,
// built by add: a JSON_TABLE over one JSON parameter (jsonSrc) where the
// server has it, else a UNION ALL derived table of rowSrc rows padded with
// id 0 rows to a power of two. It returns the query, the arguments (the
// source's first, then extra) and whether the query should be cached.
func (d *Driver) batchSource(query, jsonSrc, rowSrc string, n, width int, add func(i int, js []byte, row []any) []byte, extra ...any) (string, []any, bool) {
	if d.jsonTable {
		js := make([]byte, 0, n*32)
		js = append(js, '[')
		for i := 0; i < n; i++ {
			if i > 0 {
				js = append(js, ',')
			}
			js = add(i, js, nil)
		}
		js = append(js, ']')
		q := strings.Replace(query, "{source}", jsonSrc, 1)
		return q, append([]any{js}, extra...), true
	}
	b := bucket(n)
	var sb strings.Builder
	sb.WriteByte('(')
	for i := 0; i < b; i++ {
		if i > 0 {
			sb.WriteString(" UNION ALL ")
		}
		sb.WriteString(rowSrc)
	}
	sb.WriteByte(')')
	q := strings.Replace(query, "{source}", sb.String(), 1)
	args := make([]any, 0, b*width+len(extra))
	tuple := make([]any, width)
	for i := 0; i < b; i++ {
		if i < n {
			add(i, nil, tuple)
		} else {
			tuple[0], tuple[1] = int64(0), int64(0)
			for k := 2; k < width; k++ {
				tuple[k] = nil
			}
		}
		args = append(args, tuple...)
	}
	args = append(args, extra...)
	return q, args, b <= maxBucket
}

var outcomeStates = map[string]bool{
	driver.StateCompleted: true, driver.StateRetryable: true,
	driver.StateDiscarded: true, driver.StateCancelled: true,
	driver.StateScheduled: true, // a snooze
}

// Complete applies outcomes with one fenced UPDATE joined to the batch (see
// complete in queries.sql; outcomes carrying an error go in a second
// statement that also appends to errors). When every outcome matched, that
// is the whole call; otherwise the ids applied are read back by this call's
// op_token.
//
// Completions that carry a result are written apart, in one transaction
// (completeResults).
func (d *Driver) Complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	var withResult, rest []driver.Outcome
	for i := range outcomes {
		if outcomes[i].State == driver.StateCompleted && len(outcomes[i].Result) > 0 {
			if withResult == nil {
				rest = append(make([]driver.Outcome, 0, len(outcomes)), outcomes[:i]...)
			}
			withResult = append(withResult, outcomes[i])
		} else if withResult != nil {
			rest = append(rest, outcomes[i])
		}
	}
	if withResult == nil {
		return d.complete(ctx, outcomes)
	}
	applied, err := d.completeResults(ctx, withResult)
	if err != nil {
		return nil, err
	}
	// The completions with results are committed: reported applied even
	// when the rest fails (see driver.Driver.Complete).
	more, err := d.complete(ctx, rest)
	return append(more, applied...), err
}

// completeResults completes the jobs of outcomes, each fenced by its own
// statement (complete_one), stores the result of each job completed
// (store_result), and frees the slots their attempts held (free_slots),
// in one transaction on the lease pool, in ascending id order so that
// concurrent batches lock rows in the same order. It returns the ids
// applied.
func (d *Driver) completeResults(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	slices.SortFunc(outcomes, func(a, b driver.Outcome) int { return cmp.Compare(a.ID, b.ID) })
	var applied []int64
	var done []int
	err := d.inTxOn(ctx, d.lease, "complete", func(tx *sql.Tx) error {
		applied, done = applied[:0], done[:0]
		for i := range outcomes {
			o := &outcomes[i]
			res, err := d.lease.exec(ctx, tx, true, d.q.CompleteOne, o.ID, o.Fence)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				continue
			}
			if _, err := d.lease.exec(ctx, tx, true, d.q.StoreResult, o.ID, o.Fence, string(o.Result)); err != nil {
				return err
			}
			applied = append(applied, o.ID)
			done = append(done, i)
		}
		for off := 0; off < len(done); off += maxBucket {
			part := done[off:min(off+maxBucket, len(done))]
			q, args := d.freeSlotsQuery(outcomes, part)
			if _, err := d.lease.exec(ctx, tx, len(part) <= maxBucket, q, args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// complete applies outcomes without results (see Complete).
func (d *Driver) complete(ctx context.Context, outcomes []driver.Outcome) ([]int64, error) {
	if len(outcomes) == 0 {
		return nil, nil
	}
	token, err := newToken()
	if err != nil {
		return nil, d.wrap("complete", err)
	}
	for i := range outcomes {
		o := &outcomes[i]
		if !outcomeStates[o.State] {
			return nil, fmt.Errorf("conveyor/mysql: complete: job %d: outcome state %q is not completed, retryable, discarded or cancelled", o.ID, o.State)
		}
	}
	holders, err := d.slotHolders(ctx, outcomes)
	if err != nil {
		return nil, err
	}
	errs := make([]string, len(outcomes))
	var plain, failed, plainSlot, failedSlot []int
	for i := range outcomes {
		o := &outcomes[i]
		slot := holders[o.ID]
		if o.Err == nil {
			if slot {
				plainSlot = append(plainSlot, i)
			} else {
				plain = append(plain, i)
			}
			continue
		}
		b, err := d.encodeAttemptError(o.Err)
		if err != nil {
			return nil, d.wrap("complete", err)
		}
		errs[i] = b
		if slot {
			failedSlot = append(failedSlot, i)
		} else {
			failed = append(failed, i)
		}
	}
	var matched int64
	budget := d.maxPacket / 2
	// sent holds the ids of the statements that succeeded: each
	// autocommits, so when a later one fails they are applied already,
	// and the caller must not be told otherwise (it would write them again
	// and take the refusal for a stale attempt's).
	var sent []int64
	for _, part := range []struct {
		query string
		idx   []int
		slots bool
	}{{d.q.Complete, plain, false}, {d.q.CompleteWithErrors, failed, false}, {d.q.Complete, plainSlot, true}, {d.q.CompleteWithErrors, failedSlot, true}} {
		// Ascending ids: concurrent batches lock rows in the same order.
		slices.SortFunc(part.idx, func(a, b int) int { return cmp.Compare(outcomes[a].ID, outcomes[b].ID) })
		for len(part.idx) > 0 {
			// One statement per chunk that fits the packet and the bucket.
			n, size := 0, 0
			for n < len(part.idx) && n < maxBucket {
				sz := 64 + len(errs[part.idx[n]])*5/4
				if n > 0 && size+sz > budget {
					break
				}
				size += sz
				n++
			}
			chunk := part.idx[:n]
			part.idx = part.idx[n:]
			q, args, cache := d.batchSource(part.query, d.q.OutcomeSourceJSON, d.q.OutcomeSourceRow, len(chunk), 5,
				func(k int, js []byte, row []any) []byte {
					i := chunk[k]
					o := &outcomes[i]
					var retry int64
					if o.State == driver.StateRetryable || o.State == driver.StateScheduled {
						retry = max(micros(o.RetryIn), 0)
					}
					if row != nil {
						row[0], row[1], row[2], row[3], row[4] = o.ID, o.Fence, o.State, retry, errs[i]
						return nil
					}
					js = append(js, '[')
					js = strconv.AppendInt(js, o.ID, 10)
					js = append(js, ',')
					js = strconv.AppendInt(js, o.Fence, 10)
					js = append(js, ",\""...)
					js = append(js, o.State...)
					js = append(js, "\","...)
					js = strconv.AppendInt(js, retry, 10)
					js = append(js, ',')
					js = appendJSONString(js, errs[i])
					return append(js, ']')
				}, token[:])
			var n64 int64
			if part.slots {
				n64, err = d.completeFreeing(ctx, q, args, cache, outcomes, chunk)
			} else {
				n64, err = d.execCount(ctx, d.lease, "complete", cache, q, args)
			}
			if err != nil {
				return d.appliedBefore(ctx, token[:], sent), err
			}
			for _, i := range chunk {
				sent = append(sent, outcomes[i].ID)
			}
			matched += n64
		}
	}
	ids := make([]int64, len(outcomes))
	for i := range outcomes {
		ids[i] = outcomes[i].ID
	}
	if matched == int64(len(outcomes)) {
		return ids, nil
	}
	return d.fenceCheck(ctx, d.lease, "complete", token[:], ids)
}

// appliedBefore returns the ids among sent that complete's statements
// which succeeded applied (marked with token), read when a later
// statement of the call failed; nil when none was sent or they cannot
// be read. It reads even if ctx has ended (a statement cut off by its
// deadline is the usual failure), for a few seconds at most.
func (d *Driver) appliedBefore(ctx context.Context, token []byte, sent []int64) []int64 {
	if len(sent) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	ids, err := d.fenceCheck(rctx, d.lease, "complete", token, sent)
	if err != nil {
		return nil
	}
	return ids
}

// slotHolders returns the ids of the outcomes whose attempt holds a slot
// of a limited queue (slot_holders), or nil when none does, the case of
// every job of an unlimited queue.
func (d *Driver) slotHolders(ctx context.Context, outcomes []driver.Outcome) (map[int64]bool, error) {
	var out map[int64]bool
	for off := 0; off < len(outcomes); off += maxBucket {
		part := outcomes[off:min(off+maxBucket, len(outcomes))]
		leases := make([]driver.Lease, len(part))
		for i, o := range part {
			leases[i] = driver.Lease{ID: o.ID, Fence: o.Fence}
		}
		q, args, cache := d.leaseSource(d.q.SlotHolders, leases)
		err := d.retry(ctx, "complete", func() error {
			rows, err := d.lease.query(ctx, nil, cache, q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					return err
				}
				if out == nil {
					out = map[int64]bool{}
				}
				out[id] = true
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// completeFreeing runs q, complete or complete_with_errors over the
// outcomes of chunk (indexes into outcomes), and then frees the slots
// their attempts hold (free_slots), in one transaction on the lease pool,
// and returns how many jobs q matched. See free_slots in queries.sql for
// why these are two statements.
func (d *Driver) completeFreeing(ctx context.Context, q string, args []any, cache bool, outcomes []driver.Outcome, chunk []int) (int64, error) {
	fq, fargs := d.freeSlotsQuery(outcomes, chunk)
	var n int64
	err := d.inTxOn(ctx, d.lease, "complete", func(tx *sql.Tx) error {
		res, err := d.lease.exec(ctx, tx, cache, q, args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		_, err = d.lease.exec(ctx, tx, len(chunk) <= maxBucket, fq, fargs...)
		return err
	})
	return n, err
}

// freeSlotsQuery expands free_slots for the outcomes of chunk: their
// attempts (id, fence), and the ids of the retryable and snoozed ones,
// whose key slot an ordered queue that holds its keys keeps. Each list is
// padded to the chunk's bucket (with the first attempt, and with id 0,
// which no job has), so that the statement's text depends on the bucket
// alone.
func (d *Driver) freeSlotsQuery(outcomes []driver.Outcome, chunk []int) (string, []any) {
	b := bucket(len(chunk))
	args := make([]any, 0, 4*b)
	for _, i := range chunk {
		if st := outcomes[i].State; st == driver.StateRetryable || st == driver.StateScheduled {
			args = append(args, outcomes[i].ID)
		}
	}
	for len(args) < b {
		args = append(args, int64(0))
	}
	for k := 0; k < b; k++ {
		args = append(args, outcomes[chunk[min(k, len(chunk)-1)]].ID)
	}
	for k := 0; k < b; k++ {
		o := &outcomes[chunk[min(k, len(chunk)-1)]]
		args = append(args, o.ID, o.Fence)
	}
	q := strings.NewReplacer("{keep}", placeholders(b), "{ids}", placeholders(b), "{pairs}", strings.Repeat("(?, ?), ", b-1)+"(?, ?)").Replace(d.q.FreeSlots)
	return q, args
}

// execFreeing is execCount for release, which may free the slots of
// limited queues beside the jobs it changes: a freed slot counts as a
// matched row too, so it also reports whether any slot was freed (the
// statement's LAST_INSERT_ID(1), see release in queries.sql). The count
// is then not the jobs' alone.
func (d *Driver) execFreeing(ctx context.Context, p *stmtPool, op string, cache bool, q string, args []any) (int64, bool, error) {
	var n, id int64
	err := d.retry(ctx, op, func() error {
		res, err := p.exec(ctx, nil, cache, q, args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		id, err = res.LastInsertId()
		return err
	})
	return n, id != 0, err
}

// execCount runs one autocommit statement on pool p with deadlock retries
// and returns the number of rows it matched.
func (d *Driver) execCount(ctx context.Context, p *stmtPool, op string, cache bool, q string, args []any) (int64, error) {
	var n int64
	err := d.retry(ctx, op, func() error {
		res, err := p.exec(ctx, nil, cache, q, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// fenceCheck returns, in input order without duplicates, the ids among
// ids whose row carries token: the rows the call marked with it. It reads
// on pool p.
func (d *Driver) fenceCheck(ctx context.Context, p *stmtPool, op string, token []byte, ids []int64) ([]int64, error) {
	got := make(map[int64]bool, len(ids))
	for off := 0; off < len(ids); off += maxBucket {
		part := ids[off:min(off+maxBucket, len(ids))]
		q, args, cache := d.inList(d.q.FenceCheck, part, token)
		err := d.retry(ctx, op, func() error {
			rows, err := p.query(ctx, nil, cache, q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					return err
				}
				got[id] = true
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
	}
	out := make([]int64, 0, len(got))
	for _, id := range ids {
		if got[id] {
			out = append(out, id)
			delete(got, id)
		}
	}
	return out, nil
}

// newToken returns 16 random bytes marking the rows of one call.
func newToken() ([16]byte, error) {
	var t [16]byte
	_, err := rand.Read(t[:])
	return t, err
}

// encodeAttemptError renders e as the JSON element stored in errors. An
// error or trace so large that a few of them would not fit in
// max_allowed_packet is cut (with a marker), so that neither this Complete
// nor later reads of the row can fail on the packet size.
func (d *Driver) encodeAttemptError(e *driver.AttemptError) (string, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	limit := max(d.maxPacket/64, 4096)
	if len(b) <= limit {
		return string(b), nil
	}
	c := *e
	c.Error = truncate(c.Error, limit/4)
	c.Trace = truncate(c.Trace, limit/2)
	b, err = json.Marshal(&c)
	return string(b), err
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + " …[truncated]"
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(b []byte, s string) []byte {
	if s == "" {
		return append(b, `""`...)
	}
	q, _ := json.Marshal(s)
	return append(b, q...)
}

// leaseSource is batchSource for query over leases (id, fence tuples).
func (d *Driver) leaseSource(query string, leases []driver.Lease, extra ...any) (string, []any, bool) {
	return d.batchSource(query, d.q.LeaseSourceJSON, d.q.LeaseSourceRow, len(leases), 2,
		func(i int, js []byte, row []any) []byte {
			l := leases[i]
			if row != nil {
				row[0], row[1] = l.ID, l.Fence
				return nil
			}
			js = append(js, '[')
			js = strconv.AppendInt(js, l.ID, 10)
			js = append(js, ',')
			js = strconv.AppendInt(js, l.Fence, 10)
			return append(js, ']')
		}, extra...)
}

// Heartbeat extends the leases of running attempts with one fenced UPDATE
// and returns the ids still owned (read back only when some did not
// match).
func (d *Driver) Heartbeat(ctx context.Context, leases []driver.Lease, lease time.Duration) ([]int64, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	token, err := newToken()
	if err != nil {
		return nil, d.wrap("heartbeat", err)
	}
	var n int64
	for off := 0; off < len(leases); off += maxBucket {
		part := leases[off:min(off+maxBucket, len(leases))]
		q, args, cache := d.leaseSource(d.q.Heartbeat, part, micros(lease), token[:])
		m, err := d.execCount(ctx, d.lease, "heartbeat", cache, q, args)
		if err != nil {
			return nil, err
		}
		n += m
	}
	ids := make([]int64, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	if n == int64(len(leases)) {
		return ids, nil
	}
	return d.fenceCheck(ctx, d.lease, "heartbeat", token[:], ids)
}

// Release makes running attempts available again without counting them,
// freeing their slots in the same statement. When a slot was freed the
// matched count includes it, and the released jobs are counted by the
// call's op_token instead.
func (d *Driver) Release(ctx context.Context, leases []driver.Lease) (int64, error) {
	if len(leases) == 0 {
		return 0, nil
	}
	defer d.behindAll()
	token, err := newToken()
	if err != nil {
		return 0, d.wrap("release", err)
	}
	var n int64
	for off := 0; off < len(leases); off += maxBucket {
		part := leases[off:min(off+maxBucket, len(leases))]
		q, args, cache := d.leaseSource(d.q.Release, part, token[:])
		m, freed, err := d.execFreeing(ctx, d.lease, "release", cache, q, args)
		if err != nil {
			return n, err
		}
		if freed {
			ids := make([]int64, len(part))
			for i, l := range part {
				ids[i] = l.ID
			}
			got, err := d.fenceCheck(ctx, d.lease, "release", token[:], ids)
			if err != nil {
				return n, err
			}
			m = int64(len(got))
		}
		n += m
	}
	return n, nil
}

// lockAndUpdate runs selectQ (id, queue, priority, scheduled_at rows,
// locked FOR UPDATE) and then updateQ and each of then over the ids found,
// in one transaction, counts per queue, and moves each queue's claim
// cursor back before the first of its jobs in claim order (see
// claimCursor.before).
func (d *Driver) lockAndUpdate(ctx context.Context, op, selectQ, updateQ string, limit int, then ...string) (map[string]int, error) {
	out := map[string]int{}
	if limit <= 0 {
		return out, nil
	}
	first := map[string]*driver.JobRow{}
	err := d.inTx(ctx, op, func(tx *sql.Tx) error {
		clear(out)
		clear(first)
		rows, err := d.query(ctx, tx, true, selectQ, int64(limit))
		if err != nil {
			return err
		}
		var ids []int64
		var keys []*driver.JobRow
		for rows.Next() {
			k := &driver.JobRow{}
			if err := rows.Scan(&k.ID, &k.Queue, &k.Priority, &k.ScheduledAt); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, k.ID)
			keys = append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for off := 0; off < len(ids); off += maxBucket {
			part := ids[off:min(off+maxBucket, len(ids))]
			for _, uq := range append([]string{updateQ}, then...) {
				q, args, cache := d.inList(uq, part)
				if _, err := d.exec(ctx, tx, cache, q, args...); err != nil {
					return err
				}
			}
		}
		for _, k := range keys {
			out[k.Queue]++
			if f := first[k.Queue]; f == nil || claimsBefore(k.Priority, k.ScheduledAt, k.ID, f) {
				first[k.Queue] = k
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for q, k := range first {
		if c, ok := d.cursors.Load(q); ok {
			c.(*claimCursor).before(k)
		}
	}
	return out, nil
}

// Rescue requeues (or discards, when attempts are used up) up to limit
// running jobs whose lease expired, recording an AttemptError on each and
// freeing their slots in the same transaction; then it sweeps the slots
// of limited queues (see sweepSlots), giving back the expired blocks of
// owners that no longer run a job of their queue, those just rescued
// included.
func (d *Driver) Rescue(ctx context.Context, limit int) (map[string]int, error) {
	out, err := d.lockAndUpdate(ctx, "rescue", d.q.RescueSelect, d.q.RescueUpdate, limit, d.q.RescueFreeSlots)
	if err != nil {
		return nil, err
	}
	if err := d.sweepSlots(ctx, limit); err != nil {
		return out, err
	}
	return out, nil
}

// Promote makes up to limit due scheduled and retryable jobs available.
func (d *Driver) Promote(ctx context.Context, limit int) (map[string]int, error) {
	return d.lockAndUpdate(ctx, "promote", d.q.PromoteSelect, d.q.PromoteUpdate, limit)
}

// Prune deletes up to limit completed jobs finalized more than
// completedAge ago and discarded or cancelled jobs finalized more than
// discardedAge ago.
func (d *Driver) Prune(ctx context.Context, completedAge, discardedAge time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, nil
	}
	if _, err := d.execCount(ctx, d.main, "prune results", true, d.q.PruneResults, []any{micros(completedAge), int64(limit)}); err != nil {
		return 0, err
	}
	if err := d.pruneBatches(ctx, completedAge, limit); err != nil {
		return 0, err
	}
	n, err := d.execCount(ctx, d.main, "prune", true, d.q.PruneCompleted, []any{micros(completedAge), int64(limit)})
	if err != nil {
		return 0, err
	}
	if n >= int64(limit) {
		return n, nil
	}
	m, err := d.execCount(ctx, d.main, "prune", true, d.q.PruneDiscarded, []any{micros(discardedAge), int64(limit) - n})
	return n + m, err
}

// TryLead takes the maintenance leadership if it is free or expired, or
// extends it if id holds it, and reports whether id leads.
func (d *Driver) TryLead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	us := micros(ttl)
	if _, err := d.execCount(ctx, d.main, "try lead", true, d.q.TryLead, []any{id, us, id, id, id, us}); err != nil {
		return false, err
	}
	var leader string
	if err := d.retry(ctx, "try lead", func() error {
		return d.db.QueryRowContext(ctx, d.q.Leader).Scan(&leader)
	}); err != nil {
		return false, err
	}
	return leader == id, nil
}

// fenceEpochShift places the epoch in a fence floor: floor = epoch <<
// fenceEpochShift + server bits (see fence_floor in queries.sql).
const fenceEpochShift = 36

// fenceBumps bounds how many epochs one claim inserts before it gives up
// (each failed round means another claimer took the epoch meanwhile).
const fenceBumps = 5

// fenceFloor returns this server's fence floor: floor itself when the
// claim's read found one, else, in the claim's transaction tx (on the same
// server as the claim), the next epoch inserted for this server and its
// floor. See fence_floor in queries.sql.
func (d *Driver) fenceFloor(ctx context.Context, tx *sql.Tx, floor sql.NullInt64) (int64, error) {
	for range fenceBumps {
		if floor.Valid {
			return floor.Int64, nil
		}
		var server, epoch int64
		if err := tx.QueryRowContext(ctx, d.q.FenceEpochState).Scan(&floor, &server, &epoch); err != nil {
			return 0, fmt.Errorf("read fence epoch: %w", err)
		}
		if floor.Valid {
			return floor.Int64, nil
		}
		if _, err := tx.ExecContext(ctx, d.q.FenceEpochInsert, epoch+1, server); err != nil && myErrno(err) != errDupEntry {
			return 0, fmt.Errorf("take fence epoch %d for server %d: %w", epoch+1, server, err)
		}
	}
	return 0, fmt.Errorf("no fence epoch of this server after %d tries (other servers keep taking them: more than one primary?)", fenceBumps)
}
