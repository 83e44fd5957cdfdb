package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Wake-up notifications of the driver's own writes are sent after their
// commit, in a transaction of their own committed asynchronously
// (notify_queues_async), not inside the write: PostgreSQL serializes the
// commits of all transactions that notified, server-wide, holding one
// lock across each commit's WAL flush, so writes that notify inside their
// own transaction commit one at a time however many connections write at
// once (every enqueue of every process, one fsync each). A write in the
// caller's transaction still notifies inside it: the wake-up must be
// delivered at the caller's commit, which the driver does not see.

// wakeList is the wake-up a write of the driver's own sends after its
// commit: each queue that may have received a job available at once,
// with the earliest run-at among its jobs (zero: a job due at once
// without one). The notification statement keeps the queues whose time
// has come by the database's clock, as the insert decided available or
// scheduled by it (a run-at in between the two statements' clocks wakes
// a fetcher that may find nothing; that is all it costs).
type wakeList struct {
	queues []string
	at     []time.Time
}

// empty reports whether there is nothing to notify.
func (w wakeList) empty() bool { return len(w.queues) == 0 }

// args returns the notification statement's parameters.
func (w wakeList) args() []any {
	var qs, ats arrayLit
	qs.init(16 * len(w.queues))
	ats.init(32 * len(w.queues))
	for i, q := range w.queues {
		qs.str(q)
		ats.time(w.at[i])
	}
	return []any{qs.String(), ats.String()}
}

// dueQueues returns the wake-up of jobs: the queues of the jobs without a
// delay, except those flagged in skip (jobs an insert is to claim, or
// held unique keys that did not go in; nil for none).
func dueQueues(jobs []driver.InsertParams, skip []bool) wakeList {
	var w wakeList
	var at map[string]int // queue -> its index in w, once a batch names several
	for i := range jobs {
		j := &jobs[i]
		if skip != nil && i < len(skip) && skip[i] || j.RunAt.IsZero() && j.Delay > 0 {
			continue
		}
		k := -1
		switch {
		case len(w.queues) > 0 && w.queues[len(w.queues)-1] == j.Queue:
			k = len(w.queues) - 1
		case at != nil:
			if n, ok := at[j.Queue]; ok {
				k = n
			}
		case len(w.queues) > 0 && w.queues[0] == j.Queue:
			k = 0
		}
		switch {
		case k < 0:
			if at == nil && len(w.queues) > 0 {
				at = map[string]int{w.queues[0]: 0}
			}
			if at != nil {
				at[j.Queue] = len(w.queues)
			}
			w.queues, w.at = append(w.queues, j.Queue), append(w.at, j.RunAt)
		case w.at[k].IsZero():
		case j.RunAt.IsZero() || j.RunAt.Before(w.at[k]):
			w.at[k] = j.RunAt
		}
	}
	return w
}

// notifyingQuerier runs each query in a transaction of its own on a
// connection of the pool and, in the same round trip, the notification
// wake in a second transaction committed asynchronously: BEGIN, the
// query, COMMIT, then notify_queues_async, sent as one batch. The query's
// statement must not notify itself. Its error is the query's or the
// commit's; a notification that failed after the commit is sent again
// once on another connection, and otherwise dropped (the listeners poll).
func (d *Driver) notifyingQuerier(wake wakeList) querier {
	return func(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
		c, err := d.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if c.Conn().PgConn().TxStatus() != 'I' && !c.Conn().IsClosed() {
				// The batch stopped inside its transaction (the query
				// failed): end it before the connection goes back.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if _, rerr := c.Exec(rctx, "ROLLBACK"); rerr != nil {
					_ = c.Conn().Close(rctx)
				}
				cancel()
			}
			c.Release()
		}()
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(query, args...)
		b.Queue("COMMIT")
		if !wake.empty() {
			b.Queue(d.q.NotifyAsync, wake.args()...)
		}
		br := c.SendBatch(ctx, b)
		err = readNotifying(br, row)
		cerr := br.Close()
		if err != nil {
			return err
		}
		if cerr != nil && !wake.empty() {
			d.notifyAgain(ctx, wake)
		}
		return nil
	}
}

// readNotifying reads the results of notifyingQuerier's batch up to the
// commit's answer and returns the query's or the commit's error; the
// notification's error is left to the batch's Close. (The whole batch is
// sent before any answer is read: an error of row's does not keep the
// commit from running, as it did not when the statement committed alone.)
func readNotifying(br pgx.BatchResults, row func(scan func(dest ...any) error) error) error {
	if _, err := br.Exec(); err != nil {
		return err
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = br.Exec()
	return err
}

// notifyAfter sends wake after a commit of the driver's own, as a
// transaction of its own committed asynchronously (see
// notifyingQuerier). A failure is tried once more, then dropped: the
// jobs are committed, and the listeners poll.
func (d *Driver) notifyAfter(ctx context.Context, wake wakeList) {
	if wake.empty() {
		return
	}
	if _, err := d.pool.Exec(ctx, d.q.NotifyAsync, wake.args()...); err != nil {
		d.notifyAgain(ctx, wake)
	}
}

// notifyAgain is the one retry of a notification that failed after its
// jobs' commit, bounded in time whatever the caller's context says.
func (d *Driver) notifyAgain(ctx context.Context, wake wakeList) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := d.pool.Exec(rctx, d.q.NotifyAsync, wake.args()...); err != nil {
		d.notifyLost.Add(1)
	}
}
