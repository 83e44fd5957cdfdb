package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// The driver's job methods on the segments storage. Each builds its
// statement for the live segments of the phases it reads and the current
// segments it writes (segments.sql), runs it, and, when the incarnation
// guard refuses it, refreshes the registry and runs it again.

// guardOK reports whether the current segments of phs are still the
// incarnations v knows.
func (s *segStore) guardOK(ctx context.Context, v *segView, phs ...string) (bool, error) {
	var ok bool
	err := s.d.pool.QueryRow(ctx, s.stmt("seg_guard", v, nil, phs...)).Scan(&ok)
	return ok, err
}

// insert inserts plain jobs through q (the pool or the caller's
// transaction).
func (s *segStore) insert(ctx context.Context, q querier, jobs []driver.InsertParams) ([]int64, error) {
	args := insertArgs(jobs)
	ids := make([]int64, 0, len(jobs))
	err := s.withView(ctx, func(v *segView) error {
		ids = ids[:0]
		err := q(ctx, s.stmt("seg_insert", v, nil, phReady, phWaiting), args, func(scan func(...any) error) error {
			var id int64
			if err := scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		})
		if err == nil && len(ids) == 0 {
			return errStale
		}
		return err
	})
	if err == nil {
		s.wakeJobs(jobs)
	}
	return ids, err
}

// wakeJobs starts over the claim hints of the queues of jobs just
// inserted (see claimHints); the notification of their commit does it
// again, for an insert in the caller's transaction.
func (s *segStore) wakeJobs(jobs []driver.InsertParams) {
	for i := range jobs {
		if i == 0 || jobs[i].Queue != jobs[i-1].Queue {
			s.hints.wake(jobs[i].Queue)
		}
	}
}

// poolQuerier runs queries on the driver's pool.
func (d *Driver) poolQuerier() querier { return rowsQuerier(d.pool.Query) }

// uniqueStatements returns the insert statement of unique jobs and the
// holders' lookup, of a view read anew when stale is set.
func (s *segStore) uniqueStatements(ctx context.Context, stale bool) (string, string, error) {
	v, err := s.viewNow(ctx)
	if err == nil && stale {
		s.stale.Add(1)
		v, err = s.refresh(ctx, time.Now())
	}
	if err != nil {
		return "", "", err
	}
	return s.stmt("seg_insert_unique", v, nil, phReady, phWaiting), s.q("seg_unique_holders"), nil
}

// bulkInsert copies jobs into the current ready and waiting segments in
// one transaction: it locks them as an insert would (ROW EXCLUSIVE), then
// checks their incarnations, so that COPY, which has no guard of its own,
// never writes into a reclaimed table.
func (s *segStore) bulkInsert(ctx context.Context, jobs []driver.InsertParams) (int64, error) {
	tx, err := s.d.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var now time.Time
	if err := tx.QueryRow(ctx, s.d.q.bulkNow).Scan(&now); err != nil {
		return 0, err
	}
	var v *segView
	err = s.withView(ctx, func(vv *segView) error {
		v = vv
		if _, err := tx.Exec(ctx, "LOCK TABLE "+v.cur[phReady].tbl+", "+v.cur[phWaiting].tbl+" IN ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
		var ok bool
		if err := tx.QueryRow(ctx, s.stmt("seg_bulk_guard", v, nil, phReady, phWaiting)).Scan(&ok); err != nil {
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
			if _, err := tx.Exec(ctx, s.table("seg_analyze", part.tbl, "")); err != nil {
				return 0, fmt.Errorf("analyze: %w", err)
			}
		}
	}
	if len(queues) > 0 {
		qs := make([]string, 0, len(queues))
		for q := range queues {
			qs = append(qs, q)
		}
		if _, err := tx.Exec(ctx, s.d.q.notifyQueues, qs); err != nil {
			return 0, fmt.Errorf("notify: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	s.wakeJobs(due)
	return total, nil
}

// bulkAnalyze is the size of a copy after which BulkInsert analyzes the
// segment it filled.
const bulkAnalyze = 5000

// claim moves up to p.Limit jobs of p.Queue from the live ready segments
// to the current running segment, in (priority, pos) order across them,
// starting past the queue's hint when it has one (see claimHints).
func (s *segStore) claim(ctx context.Context, p driver.ClaimParams) ([]*driver.JobRow, error) {
	h, hinted, gen, all := s.hints.begin(p.Queue, time.Now())
	out, last, err := s.claimFrom(ctx, p, h)
	if err != nil {
		// The server may have restarted and lost claims (asynchronous
		// commits): their jobs are back below the hint.
		s.hints.drop(p.Queue)
		return nil, err
	}
	if len(out) == p.Limit {
		s.hints.set(p.Queue, last.prio, last.pos, h, gen, all, time.Now())
		return out, nil
	}
	s.hints.drop(p.Queue)
	if hinted {
		// The queue may look short only because of the hint: the rest
		// from its start, before the jobs past the hint.
		rest := p
		rest.Limit = p.Limit - len(out)
		more, _, err := s.claimFrom(ctx, rest, noHint)
		if err != nil {
			if len(out) == 0 {
				return nil, err
			}
			// The hinted claim committed: its jobs are this process's.
			return out, nil
		}
		out = append(more, out...)
	}
	return out, nil
}

// claimFrom runs one claim statement past h, returning the jobs and the
// (priority, pos) of the last.
func (s *segStore) claimFrom(ctx context.Context, p driver.ClaimParams, h claimHint) ([]*driver.JobRow, claimHint, error) {
	var out []*driver.JobRow
	last := noHint
	err := s.withView(ctx, func(v *segView) error {
		rows, err := s.d.pool.Query(ctx, s.stmt("seg_claim", v, v.live[phReady], phRunning),
			p.Queue, p.Limit, micros(p.Lease), p.Worker, h.prio, h.pos)
		if err != nil {
			return err
		}
		var pos int64
		if out, err = s.d.scanClaimed(rows, p, &pos); err != nil || len(out) > 0 {
			if err == nil {
				s.place(v.cur[phRunning].tbl, out)
				last = claimHint{prio: int32(out[len(out)-1].Priority), pos: pos}
			}
			return err
		}
		ok, err := s.guardOK(ctx, v, phRunning)
		if err == nil && !ok {
			return errStale
		}
		return err
	})
	return out, last, err
}

// complete applies fenced outcomes found in the running segments their
// jobs were claimed into (see place). An outcome not found is looked for
// once more in every live running segment with a fresh view of the
// registry, since a reclaim may have moved its job to a segment this
// process does not know yet. ids are the outcomes' job ids, in order.
func (s *segStore) complete(ctx context.Context, ids []int64, args []any) ([]int64, error) {
	defer s.forget(ids)
	return s.leaseOp(ctx, ids, args, func(v *segView, srcs []string) string {
		return s.stmt("seg_complete", v, srcs, phWaiting, phDone, phDead)
	})
}

// completeDone is complete for a batch of outcomes that are all completed
// without an error (seg_complete_done); args are the ids and fences.
func (s *segStore) completeDone(ctx context.Context, ids []int64, args []any) ([]int64, error) {
	defer s.forget(ids)
	return s.leaseOp(ctx, ids, args, func(v *segView, srcs []string) string {
		return s.stmt("seg_complete_done", v, srcs, phDone)
	})
}

// heartbeat extends leases in place, in the running segments their jobs
// were claimed into, else in every live running segment.
func (s *segStore) heartbeat(ctx context.Context, leases []int64, ids, fences string, lease time.Duration) ([]int64, error) {
	return s.leaseOp(ctx, leases, []any{ids, fences, micros(lease)}, func(v *segView, srcs []string) string {
		return s.stmt("seg_heartbeat", v, srcs)
	})
}

// leaseOp runs a fenced statement of the lease path on the lease pool
// (retried after deadlocks), first on the running segments that hold the
// jobs ids as far as this process knows, then again on every live one
// with a fresh view when the guard refused it or when fewer ids came back
// than were sent. The second run is idempotent: outcomes already applied
// are no longer running and match nothing.
func (s *segStore) leaseOp(ctx context.Context, ids []int64, args []any, build func(v *segView, srcs []string) string) ([]int64, error) {
	n := len(ids)
	var applied []int64
	fresh := false
	err := s.withView(ctx, func(v *segView) error {
		var got []int64
		srcs := v.live[phRunning]
		if !fresh {
			srcs = s.placedIn(v, ids)
		}
		err := s.d.retryable(ctx, func() error {
			rows, err := s.d.lease.Query(ctx, build(v, srcs), args...)
			if err != nil {
				return err
			}
			got, err = collectIDs(rows, n)
			return err
		})
		if err != nil {
			return err
		}
		stale := false
		for _, id := range got {
			if id == -1 {
				stale = true
			} else {
				applied = append(applied, id)
			}
		}
		if stale || (len(applied) < n && !fresh) {
			fresh = true
			return errStale
		}
		return nil
	})
	slices.Sort(applied)
	return slices.Compact(applied), err
}

// queueMove runs a statement returning (queue, count) rows, '!stale'
// when the guard refused it, again with a fresh view then.
func (s *segStore) queueMove(ctx context.Context, pool func() querier, build func(v *segView) string, args ...any) (map[string]int, error) {
	var out map[string]int
	err := s.withView(ctx, func(v *segView) error {
		out = map[string]int{}
		stale := false
		err := pool()(ctx, build(v), args, func(scan func(...any) error) error {
			var q string
			var n int64
			if err := scan(&q, &n); err != nil {
				return err
			}
			if q == "!stale" {
				stale = true
			} else {
				out[q] += int(n)
			}
			return nil
		})
		if err == nil && stale {
			return errStale
		}
		return err
	})
	for q := range out {
		s.hints.wake(q)
	}
	return out, err
}

// release moves running attempts back to ready, looking in every live
// running segment (releases are rare: a worker shutting down).
func (s *segStore) release(ctx context.Context, leases []int64, ids, fences string) (int64, error) {
	defer s.forget(leases)
	var total int64
	err := s.d.retryable(ctx, func() error {
		m, err := s.queueMove(ctx, s.d.leaseQuerier, func(v *segView) string {
			return s.stmt("seg_release", v, v.live[phRunning], phReady)
		}, ids, fences)
		total = 0
		for _, n := range m {
			total += int64(n)
		}
		return err
	})
	return total, err
}

// rescue moves running jobs whose lease expired to ready or dead.
func (s *segStore) rescue(ctx context.Context, limit int) (map[string]int, error) {
	return s.queueMove(ctx, s.d.poolQuerier, func(v *segView) string {
		return s.stmt("seg_rescue", v, v.live[phRunning], phReady, phDead)
	}, limit)
}

// promote runs a maintenance round (rotation and reclaim: Promote is the
// leader's most frequent task), then moves due waiting jobs to ready.
func (s *segStore) promote(ctx context.Context, limit int) (map[string]int, error) {
	if err := s.maintain(ctx); err != nil {
		return nil, fmt.Errorf("segments: %w", err)
	}
	return s.queueMove(ctx, s.d.poolQuerier, func(v *segView) string {
		return s.stmt("seg_promote", v, v.live[phWaiting], phReady)
	}, limit)
}

// leaseQuerier runs queries on the lease pool.
func (d *Driver) leaseQuerier() querier { return rowsQuerier(d.lease.Query) }

// pruneAll prunes done (completedAge) and dead (discardedAge) segments;
// a negative age keeps that phase.
func (s *segStore) pruneAll(ctx context.Context, completedAge, discardedAge time.Duration) (int64, error) {
	var total int64
	for _, c := range []struct {
		phase string
		age   time.Duration
	}{{phDone, completedAge}, {phDead, discardedAge}} {
		if c.age < 0 {
			continue
		}
		n, err := s.prune(ctx, c.phase, c.age)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// admin runs a single-job move statement over the live segments of
// srcPhases, guarded by the current segments of guarded; when it moves
// nothing it tells a stale view (run again), a missing job (ErrNotFound)
// and one in the wrong state (ErrWrongState) apart.
func (s *segStore) admin(ctx context.Context, op, name string, id int64, srcPhases, guarded []string, args ...any) (*driver.JobRow, error) {
	var j *driver.JobRow
	err := s.withView(ctx, func(v *segView) error {
		var err error
		j, err = scanJob(s.d.pool.QueryRow(ctx, s.stmt(name, v, v.srcs(srcPhases...), guarded...), args...))
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// Nothing moved: the job is missing, in another state, or in
		// a segment created since v (another process rotated or
		// reclaimed), which a registry read after the statement tells.
		now, err := s.refresh(ctx, time.Now())
		if err == nil && now.sig != v.sig {
			return errStale
		}
		if err == nil {
			err = pgx.ErrNoRows
		}
		return err
	})
	if err == nil {
		return j, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, wrap(op, err)
	}
	cur, err := s.getJob(ctx, id)
	if err != nil {
		return nil, wrap(op, err)
	}
	if cur == nil {
		return nil, fmt.Errorf("conveyor/postgres: %s job %d: %w", op, id, driver.ErrNotFound)
	}
	return nil, fmt.Errorf("conveyor/postgres: %s job %d: job is %s: %w", op, id, cur.State, driver.ErrWrongState)
}

// getJob looks the job up in every live segment (nil when none holds
// it).
func (s *segStore) getJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	var j *driver.JobRow
	err := s.read(ctx, func(v *segView) error {
		var err error
		j, err = scanJob(s.d.pool.QueryRow(ctx, s.stmt("seg_get_job", v, v.srcs(phases...)), id))
		if errors.Is(err, pgx.ErrNoRows) {
			j, err = nil, nil
		}
		return err
	})
	return j, err
}

// phasesOf returns the phases that hold jobs of the given states (all of
// them for none).
func phasesOf(states []string) []string {
	if len(states) == 0 {
		return phases
	}
	var out []string
	add := func(ph string) {
		if !slices.Contains(out, ph) {
			out = append(out, ph)
		}
	}
	for _, st := range states {
		switch st {
		case driver.StateAvailable:
			add(phReady)
		case driver.StateRunning:
			add(phRunning)
		case driver.StateScheduled, driver.StateRetryable:
			add(phWaiting)
		case driver.StateCompleted:
			add(phDone)
		case driver.StateDiscarded, driver.StateCancelled:
			add(phDead)
		}
	}
	return out
}

// listQuery returns the list statement of v for the phases of states,
// or "" when no phase holds such jobs; byQueue, byKind and before say
// whether the list is filtered by queue, by kind or by an upper id bound,
// desc whether it reads newest first (seg_list_jobs, seg_list_jobs_desc).
func (s *segStore) listQuery(v *segView, states []string, byQueue, byKind, before, desc bool) string {
	phs := phasesOf(states)
	if len(phs) == 0 {
		return ""
	}
	queue, kind, below := "$3::text = ''", "$4::text = ''", "$6::bigint = 0"
	if byQueue {
		queue = "queue = $3::text"
	}
	if byKind {
		kind = "kind = $4::text"
	}
	if before {
		below = "id < $6::bigint"
	}
	name := "seg_list_jobs"
	if desc {
		name = "seg_list_jobs_desc"
	}
	return strings.NewReplacer("{queue}", queue, "{kind}", kind, "{before}", below).Replace(s.stmt(name, v, v.srcs(phs...)))
}

// overviewQuery returns the overview statement of v: every live ready,
// running and waiting segment, and the done and dead segments that may
// hold a job finished at or after since (the current ones, and the
// sealed ones sealed after since less tuning.lateWrites). Finished
// segments are sealed by time, so these are a few whatever the
// retention.
func (s *segStore) overviewQuery(v *segView, since time.Time) string {
	srcs := v.srcs(phReady, phRunning, phWaiting)
	for _, t := range v.srcs(phDone, phDead) {
		if at, sealed := v.sealedAt[t]; !sealed || !at.Before(since.Add(-s.tune.lateWrites)) {
			srcs = append(srcs, t)
		}
	}
	return s.stmt("seg_overview", v, srcs)
}

// statsQuery returns the stats statement of v, over every live segment.
func (s *segStore) statsQuery(v *segView) string {
	return s.stmt("seg_stats", v, v.srcs(phases...))
}
