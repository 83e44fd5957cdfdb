package postgres

import (
	"context"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statement). Resuming notifies the queue, waking every process's
// fetchers for it.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	_, err := d.pool.Exec(ctx, d.q.PauseQueue, queue, paused)
	return d.wrap("pause queue "+queue, err)
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.pool.Query(ctx, d.q.PausedQueues)
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
	return out, d.wrap("paused queues", rows.Err())
}

// RecordSchedule records a schedule's latest slot and next one.
func (d *Driver) RecordSchedule(ctx context.Context, s driver.ScheduleRow) error {
	_, err := d.pool.Exec(ctx, d.q.RecordSchedule, s.Name, s.Spec, nullTime(s.LastSlot), nullID(s.LastJob), nullTime(s.NextSlot))
	return d.wrap("record schedule "+s.Name, err)
}

// TouchSchedules marks the named schedules' rows as still in use.
func (d *Driver) TouchSchedules(ctx context.Context, names []string) error {
	for _, n := range names {
		if _, err := d.pool.Exec(ctx, d.q.TouchSchedule, n); err != nil {
			return d.wrap("touch schedule "+n, err)
		}
	}
	return nil
}

// PruneSchedules deletes the schedules no process recorded or touched
// for age.
func (d *Driver) PruneSchedules(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := d.pool.Exec(ctx, d.q.PruneSchedules, micros(age))
	if err != nil {
		return 0, d.wrap("prune schedules", err)
	}
	return tag.RowsAffected(), nil
}

// Schedules lists the recorded schedules by name.
func (d *Driver) Schedules(ctx context.Context) ([]driver.ScheduleRow, error) {
	rows, err := d.pool.Query(ctx, d.q.Schedules)
	if err != nil {
		return nil, d.wrap("schedules", err)
	}
	defer rows.Close()
	var out []driver.ScheduleRow
	for rows.Next() {
		var s driver.ScheduleRow
		var last, next *time.Time
		var job *int64
		if err := rows.Scan(&s.Name, &s.Spec, &last, &job, &next, &s.UpdatedAt); err != nil {
			return nil, d.wrap("schedules", err)
		}
		if last != nil {
			s.LastSlot = last.UTC()
		}
		if next != nil {
			s.NextSlot = next.UTC()
		}
		if job != nil {
			s.LastJob = *job
		}
		s.UpdatedAt = s.UpdatedAt.UTC()
		out = append(out, s)
	}
	return out, d.wrap("schedules", rows.Err())
}

// nullTime is t, or NULL for zero.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// nullID is id, or NULL for 0.
func nullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}
