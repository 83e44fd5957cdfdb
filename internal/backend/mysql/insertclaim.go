package mysql

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Claims at insert (driver.InsertClaimer). A process that enqueues jobs of
// a queue it works while its workers of that queue wait has the engine
// flag them; the insert writes each flagged job that is due at once, in a
// queue not paused, as running, leased to the process, so that its worker
// starts it as the insert returns: no poll, no claim's three round trips
// (lock, mark, commit) and no second write of the row.
//
// MySQL's INSERT returns no rows (MariaDB's RETURNING could return the
// clock, fence and pause check computed inline in one statement; one path
// serves both servers instead), so the insert first reads, in one plain read that locks nothing
// (insert_claim_state), the database's clock, this server's fence floor
// and which of the flagged jobs' queues are paused, and then writes the
// flagged rows with those values (insert_claim_row), which is what it
// returns: two round trips, each statement autocommitted (on Galera the
// read waits for the node to apply what the cluster had ordered, so that
// a pause made through another node is seen). A pause that
// commits between the read and the insert does not stop the jobs that
// insert claimed, as it does not stop a job a claim took just before it.
// A server without a fence epoch of its own yet (its first claim takes
// one, see fence_floor) takes it first, in a transaction of its own.
//
// On Galera a multi-row insert returns its ids (RETURNING id, as Insert's
// does there); on a Galera server without RETURNING, and for an insert
// too large for one statement, nothing is claimed: the jobs are written
// as Insert writes them, and the engine gives the workers it reserved
// back.

// InsertClaiming is Insert (one autocommitted statement, its error marked
// as Insert's) that writes the jobs c.Claim flags as running, as a claim
// would leave them, when they are due at once and their queue is not
// paused. It returns the ids in order and, per job, the claimed row (nil
// for a job not claimed).
func (d *Driver) InsertClaiming(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	rows := make([]*driver.JobRow, len(jobs))
	var queues []string
	for i := range jobs {
		if flaggedDue(jobs, c.Claim, i) && !slices.Contains(queues, jobs[i].Queue) {
			queues = append(queues, jobs[i].Queue)
		}
	}
	if len(queues) == 0 || d.rowPerStatement(len(jobs)) {
		ids, err := d.Insert(ctx, jobs)
		if err != nil {
			return nil, nil, err
		}
		return ids, rows, nil
	}
	p, err := d.planInsert("insert", jobs)
	if err != nil {
		return nil, nil, driver.NotCommitted(err)
	}
	if len(p.chunks) != 1 {
		ids, err := d.Insert(ctx, jobs)
		if err != nil {
			return nil, nil, err
		}
		return ids, rows, nil
	}
	defer d.behindInserted(jobs)
	ids := make([]int64, len(jobs))
	err = d.retry(ctx, "insert", func() error {
		clear(rows)
		st, err := d.insertClaimState(ctx, queues)
		if err != nil {
			return d.refused(err)
		}
		return d.refused(d.insertClaimed(ctx, jobs, c, st, ids, rows))
	})
	if err != nil {
		return nil, nil, err
	}
	return ids, rows, nil
}

// flaggedDue reports whether claim flags job i of jobs and the job is due
// at once (no delay, no run time).
func flaggedDue(jobs []driver.InsertParams, claim []bool, i int) bool {
	return i < len(claim) && claim[i] && jobs[i].Delay == 0 && jobs[i].RunAt.IsZero()
}

// claimState is what insert_claim_state read: the clock, this server's
// fence floor (zero: none, claim nothing) and the paused queues among
// those asked about.
type claimState struct {
	now    time.Time
	floor  int64
	paused []string
}

// insertClaimState reads the claimState for an insert claiming jobs of
// queues. When this server has no fence epoch of its own yet, it takes
// one (in a transaction of its own, as a claim would in its) and reads
// again.
func (d *Driver) insertClaimState(ctx context.Context, queues []string) (claimState, error) {
	n := bucket(len(queues))
	q := strings.Replace(d.q.InsertClaimState, "{names}", placeholders(n), 1)
	args := make([]any, 0, n)
	for i := range n {
		args = append(args, queues[min(i, len(queues)-1)])
	}
	for try := 0; ; try++ {
		var st claimState
		var floor sql.NullInt64
		rs, err := d.query(ctx, nil, n <= maxBucket, q, args...)
		if err != nil {
			return st, err
		}
		for rs.Next() {
			var name sql.NullString
			if err := rs.Scan(&st.now, &floor, &name); err != nil {
				rs.Close()
				return st, err
			}
			if name.Valid {
				st.paused = append(st.paused, name.String)
			}
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return st, err
		}
		if floor.Valid || try > 0 {
			st.floor = floor.Int64
			return st, nil
		}
		err = d.inTx(ctx, "fence epoch", func(tx *sql.Tx) error {
			_, err := d.fenceFloor(ctx, tx, sql.NullInt64{})
			return err
		})
		if err != nil {
			return st, err
		}
	}
}

// insertClaimed writes jobs in one INSERT (insert_claim_head), the jobs
// claim flags that are due at once and of a queue st does not find paused
// as running, leased to c.Worker from st's clock for c.Lease under st's
// fence floor, and the others as Insert writes them. It fills ids and,
// for the jobs claimed, rows.
func (d *Driver) insertClaimed(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim, st claimState, ids []int64, rows []*driver.JobRow) error {
	lease := st.now.Add(c.Lease).Truncate(time.Microsecond)
	var b strings.Builder
	b.WriteString(d.q.InsertClaimHead)
	b.WriteByte(' ')
	args := make([]any, 0, len(jobs)*(insertParamsPerRow+4))
	claimed := make([]bool, len(jobs))
	for i := range jobs {
		if i > 0 {
			b.WriteString(", ")
		}
		j := &jobs[i]
		claimed[i] = st.floor > 0 && flaggedDue(jobs, c.Claim, i) && !slices.Contains(st.paused, j.Queue)
		if !claimed[i] {
			b.WriteString(d.q.InsertClaimPlainRow)
			args = insertArgs(args, jobs[i:i+1])
			continue
		}
		b.WriteString(d.q.InsertClaimRow)
		now := dbTime(st.now)
		a := []byte(j.Args)
		if len(a) == 0 {
			a = []byte("null")
		}
		var meta, key any
		if len(j.Meta) > 0 {
			meta = []byte(j.Meta)
		}
		if j.Key != "" {
			key = j.Key
		}
		args = append(args, j.Queue, j.Kind, a, int64(j.Priority), int64(j.MaxAttempts), j.TimeoutMS, now, now, meta, key,
			now, dbTime(lease), c.Worker, st.floor)
	}
	if d.galera && len(jobs) > 1 {
		// The cluster's auto-increment step can change under a session:
		// the ids come back from the insert (see insertChunk).
		rs, err := d.query(ctx, nil, false, b.String()+" "+d.q.InsertReturning, args...)
		if err != nil {
			return err
		}
		if err := scanIDs(rs, ids); err != nil {
			return err
		}
	} else {
		res, err := d.exec(ctx, nil, len(jobs) <= 4, b.String(), args...)
		if err != nil {
			return err
		}
		if err := d.sequentialIDs(res, ids); err != nil {
			return err
		}
	}
	for i := range jobs {
		if !claimed[i] {
			continue
		}
		j := &jobs[i]
		a := j.Args
		if len(a) == 0 {
			a = []byte("null")
		}
		r := &driver.JobRow{ID: ids[i], Queue: j.Queue, Kind: j.Kind, Args: a, State: driver.StateRunning,
			Priority: j.Priority, Attempt: 1, MaxAttempts: j.MaxAttempts, TimeoutMS: j.TimeoutMS,
			ScheduledAt: st.now, CreatedAt: st.now, AttemptedAt: st.now, LeaseExpiresAt: lease,
			AttemptedBy: c.Worker, Fence: st.floor, Key: j.Key}
		if len(j.Meta) > 0 {
			r.Meta = j.Meta
		}
		rows[i] = r
	}
	return nil
}
