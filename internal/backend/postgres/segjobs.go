package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/conveyorq/conveyor/internal/driver"
)

// The statements of the driver's job methods on the segment tables. Each
// builds its statement for the live segments of the phases it reads and
// the current segments it writes (segments.sql), runs it, and, when the
// incarnation guard refuses it, refreshes the registry and runs it again.

// guardOK reports whether the current segments of phs are still the
// incarnations v knows.
func (s *segStore) guardOK(ctx context.Context, v *segView, phs ...string) (bool, error) {
	var ok bool
	err := s.d.pool.QueryRow(ctx, s.stmt(&s.d.q.SegGuard, v, nil, phs...)).Scan(&ok)
	return ok, err
}

// insert inserts plain jobs through q. With inline, the statement
// notifies the queues of the jobs available now itself (an insert in a
// transaction whose commit the driver does not make); otherwise the
// caller notifies after the commit (see notify.go).
func (s *segStore) insert(ctx context.Context, q querier, jobs []driver.InsertParams, inline bool) ([]int64, error) {
	args := append(insertArgs(jobs), inline)
	ids := make([]int64, 0, len(jobs))
	err := s.withView(ctx, func(v *segView) error {
		ids = ids[:0]
		err := q(ctx, s.stmt(&s.d.q.SegInsert, v, nil, phReady, phWaiting), args, func(scan func(...any) error) error {
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

// insertClaim is insert with seg_insert_claim, in a transaction of its
// own followed by the notification of the queues of the jobs not flagged
// (see notifyingQuerier): the jobs c.Claim flags that the statement
// claimed come back as running rows (nil for the others), placed in the
// running segment they went into.
func (s *segStore) insertClaim(ctx context.Context, jobs []driver.InsertParams, c driver.InsertClaim) ([]int64, []*driver.JobRow, error) {
	var flags arrayLit
	flags.init(2 * len(jobs))
	for i := range jobs {
		flags.bool(i < len(c.Claim) && c.Claim[i])
	}
	args := append(insertArgs(jobs), flags.String(), micros(c.Lease), c.Worker, false)
	ids := make([]int64, 0, len(jobs))
	rows := make([]*driver.JobRow, 0, len(jobs))
	var claimed []*driver.JobRow
	var running string
	err := s.withView(ctx, func(v *segView) error {
		ids, rows, claimed = ids[:0], rows[:0], claimed[:0]
		running = v.cur[phRunning].tbl
		err := s.d.notifyingQuerier(dueQueues(jobs, c.Claim))(ctx, s.stmt(&s.d.q.SegInsertClaim, v, nil, phReady, phWaiting, phRunning), args,
			func(scan func(...any) error) error {
				var (
					id                        int64
					fence                     *int64
					at, lease, created, sched pgtype.Timestamptz
				)
				if err := scan(&id, &fence, &at, &lease, &created, &sched); err != nil {
					return err
				}
				ids = append(ids, id)
				if fence == nil {
					rows = append(rows, nil)
					return nil
				}
				j := &jobs[len(ids)-1]
				args := j.Args
				if len(args) == 0 {
					args = emptyArgs
				}
				r := &driver.JobRow{ID: id, Queue: j.Queue, Kind: j.Kind, Args: args, State: driver.StateRunning,
					Priority: j.Priority, Attempt: 1, Fence: *fence, MaxAttempts: j.MaxAttempts, TimeoutMS: j.TimeoutMS,
					ScheduledAt: sched.Time, CreatedAt: created.Time, AttemptedAt: at.Time, LeaseExpiresAt: lease.Time,
					AttemptedBy: c.Worker, Meta: j.Meta, Key: j.Key}
				rows = append(rows, r)
				claimed = append(claimed, r)
				return nil
			})
		if err == nil && len(ids) == 0 {
			return errStale
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if len(claimed) > 0 {
		s.place(running, claimed)
	}
	s.wakeJobs(jobs)
	return ids, rows, nil
}

// wakeJobs starts over the claim hints of the queues of jobs just
// inserted (see claimHints); the notification of their commit does it
// again, for an insert in the caller's transaction. It also ends the
// skip of the jobs without a key in their queues (see driver.QueueSkip).
func (s *segStore) wakeJobs(jobs []driver.InsertParams) {
	s.d.noKeyless.ForgetKeyless(jobs)
	for i := range jobs {
		if i == 0 || jobs[i].Queue != jobs[i-1].Queue {
			s.hints.wake(jobs[i].Queue)
		}
	}
}

// poolQuerier runs queries on the driver's pool.
func (d *Driver) poolQuerier() querier { return rowsQuerier(d.pool.Query) }

// uniqueInsert returns the insert statement of unique jobs, of a view
// read anew when stale is set.
func (s *segStore) uniqueInsert(ctx context.Context, stale bool) (string, error) {
	v, err := s.viewNow(ctx)
	if err == nil && stale {
		s.stale.Add(1)
		v, err = s.refresh(ctx, time.Now())
	}
	if err != nil {
		return "", err
	}
	return s.stmt(&s.d.q.SegInsertUnique, v, nil, phReady, phWaiting), nil
}

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
		rows, err := s.d.pool.Query(ctx, s.stmt(&s.d.q.SegClaim, v, v.live[phReady], phRunning),
			p.Queue, p.Limit, micros(p.Lease), p.Worker, h.prio, h.pos)
		if err != nil {
			return err
		}
		var pos int64
		var lastPos int64
		stale := false
		out, err = s.d.scanClaimedEach(rows, p, func(j *driver.JobRow) bool {
			if j.ID == -1 {
				// The guard's refusal (see seg_claim).
				stale = true
				return false
			}
			lastPos = pos
			return true
		}, &pos)
		if err != nil {
			return err
		}
		if len(out) > 0 {
			s.place(v.cur[phRunning].tbl, out)
			last = claimHint{prio: int32(out[len(out)-1].Priority), pos: lastPos}
			return nil
		}
		if stale {
			return errStale
		}
		return nil
	})
	return out, last, err
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

// leaseQuerier runs queries on the lease pool.
func (d *Driver) leaseQuerier() querier { return rowsQuerier(d.lease.Query) }

// adminRounds bounds how many times admin runs its statement again for
// a job that another statement moved between segments under it.
const adminRounds = 10

// admin runs a single-job move statement over the live segments of
// srcPhases, guarded by the current segments of guarded; when it moves
// nothing it tells a stale view (run again), a missing job (ErrNotFound)
// and one in the wrong state (ErrWrongState) apart. A job found in one
// of srcPhases after all was moved there by a statement that committed
// while this one waited for its row (a claim, a promotion, an outcome):
// the row it waited for was gone and the moved one is newer than its
// snapshot. The statement runs again for it.
func (s *segStore) admin(ctx context.Context, op string, tpl *string, id int64, srcPhases, guarded []string, args ...any) (*driver.JobRow, error) {
	for round := 0; ; round++ {
		var j *driver.JobRow
		err := s.withView(ctx, func(v *segView) error {
			var err error
			j, err = scanJob(s.d.pool.QueryRow(ctx, s.stmt(tpl, v, v.srcs(srcPhases...), guarded...), args...))
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
		if round < adminRounds && slices.ContainsFunc(phasesOf([]string{cur.State}), func(ph string) bool { return slices.Contains(srcPhases, ph) }) {
			continue
		}
		return nil, fmt.Errorf("conveyor/postgres: %s job %d: job is %s: %w", op, id, cur.State, driver.ErrWrongState)
	}
}

// getJob looks the job up in every live segment (nil when none holds
// it).
func (s *segStore) getJob(ctx context.Context, id int64) (*driver.JobRow, error) {
	var j *driver.JobRow
	err := s.read(ctx, func(v *segView) error {
		var err error
		j, err = scanJob(s.d.pool.QueryRow(ctx, s.stmt(&s.d.q.SegGetJob, v, v.srcs(phases...)), id))
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
	tpl := &s.d.q.SegListJobs
	if desc {
		tpl = &s.d.q.SegListJobsDesc
	}
	return strings.NewReplacer("{queue}", queue, "{kind}", kind, "{before}", below).Replace(s.stmt(tpl, v, v.srcs(phs...)))
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
	return s.stmt(&s.d.q.SegOverview, v, srcs)
}

// statsQuery returns the stats statement of v, over every live segment.
func (s *segStore) statsQuery(v *segView) string {
	return s.stmt(&s.d.q.SegStats, v, v.srcs(phases...))
}
