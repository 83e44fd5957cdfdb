package mysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statements). Other processes notice a resume at their next poll.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	_, err := d.execCount(ctx, d.main, "pause queue "+queue, false, d.q.PauseQueue, []any{queue, paused})
	return err
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.db.QueryContext(ctx, d.q.PausedQueues)
	if err != nil {
		return nil, d.wrap("paused queues", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var name string
		var at time.Time
		if err := rows.Scan(&name, &at); err != nil {
			return nil, d.wrap("paused queues", err)
		}
		out[name] = at.UTC()
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("paused queues", err)
	}
	return out, nil
}

// RecordSchedule records a schedule's latest slot and next one (retried
// on a deadlock: on Galera, processes recording the same schedule through
// different nodes conflict at certification).
func (d *Driver) RecordSchedule(ctx context.Context, s driver.ScheduleRow) error {
	_, err := d.execCount(ctx, d.main, "record schedule "+s.Name, false, d.q.RecordSchedule,
		[]any{s.Name, s.Spec, nullTime(s.LastSlot), nullID(s.LastJob), nullTime(s.NextSlot)})
	return err
}

// TouchSchedules marks the named schedules' rows as still in use.
func (d *Driver) TouchSchedules(ctx context.Context, names []string) error {
	for _, n := range names {
		if _, err := d.execCount(ctx, d.main, "touch schedule "+n, false, d.q.TouchSchedule, []any{n}); err != nil {
			return err
		}
	}
	return nil
}

// PruneSchedules deletes the schedules no process recorded or touched
// for age.
func (d *Driver) PruneSchedules(ctx context.Context, age time.Duration) (int64, error) {
	return d.execCount(ctx, d.main, "prune schedules", true, d.q.PruneSchedules, []any{micros(age)})
}

// Schedules lists the recorded schedules by name.
func (d *Driver) Schedules(ctx context.Context) ([]driver.ScheduleRow, error) {
	rows, err := d.db.QueryContext(ctx, d.q.Schedules)
	if err != nil {
		return nil, d.wrap("schedules", err)
	}
	defer rows.Close()
	var out []driver.ScheduleRow
	for rows.Next() {
		var s driver.ScheduleRow
		var last, next sql.NullTime
		var job sql.NullInt64
		if err := rows.Scan(&s.Name, &s.Spec, &last, &job, &next, &s.UpdatedAt); err != nil {
			return nil, d.wrap("schedules", err)
		}
		if last.Valid {
			s.LastSlot = last.Time.UTC()
		}
		if next.Valid {
			s.NextSlot = next.Time.UTC()
		}
		s.LastJob, s.UpdatedAt = job.Int64, s.UpdatedAt.UTC()
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("schedules", err)
	}
	return out, nil
}

// nullTime is t as the driver writes times, or NULL for zero.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return dbTime(t.Truncate(time.Microsecond))
}

// nullID is id, or NULL for 0.
func nullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}
