package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statement, so a claim that starts after PauseQueue returns takes
// nothing). Other processes notice a resume at their next poll.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	err := d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q.PauseQueue, queue, paused)
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: pause queue %q: %w", queue, err)
	}
	return nil
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.r.QueryContext(ctx, d.q.PausedQueues)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: paused queues: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var name string
		var at int64
		if err := rows.Scan(&name, &at); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: paused queues: %w", err)
		}
		out[name] = time.UnixMicro(at).UTC()
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: paused queues: %w", err)
	}
	return out, nil
}

// RecordSchedule records a schedule's latest slot and next one.
func (d *Driver) RecordSchedule(ctx context.Context, s driver.ScheduleRow) error {
	err := d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q.RecordSchedule, s.Name, s.Spec, nullMicros(s.LastSlot), nullID(s.LastJob), nullMicros(s.NextSlot))
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: record schedule %q: %w", s.Name, err)
	}
	return nil
}

// TouchSchedules marks the named schedules' rows as still in use,
// through the write gate.
func (d *Driver) TouchSchedules(ctx context.Context, names []string) error {
	for _, n := range names {
		err := d.retry(ctx, func() error {
			_, err := d.w.ExecContext(ctx, d.q.TouchSchedule, n)
			return err
		})
		if err != nil {
			return fmt.Errorf("conveyor/sqlite: touch schedule %q: %w", n, err)
		}
	}
	return nil
}

// PruneSchedules deletes the schedules no process recorded or touched
// for age, through the write gate.
func (d *Driver) PruneSchedules(ctx context.Context, age time.Duration) (int64, error) {
	var n int64
	err := d.retry(ctx, func() error {
		res, err := d.w.ExecContext(ctx, d.q.PruneSchedules, us(age))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: prune schedules: %w", err)
	}
	return n, nil
}

// Schedules lists the recorded schedules by name.
func (d *Driver) Schedules(ctx context.Context) ([]driver.ScheduleRow, error) {
	rows, err := d.r.QueryContext(ctx, d.q.Schedules)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: schedules: %w", err)
	}
	defer rows.Close()
	var out []driver.ScheduleRow
	for rows.Next() {
		var s driver.ScheduleRow
		var last, next, job sql.NullInt64
		var updated int64
		if err := rows.Scan(&s.Name, &s.Spec, &last, &job, &next, &updated); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: schedules: %w", err)
		}
		if last.Valid {
			s.LastSlot = time.UnixMicro(last.Int64).UTC()
		}
		if next.Valid {
			s.NextSlot = time.UnixMicro(next.Int64).UTC()
		}
		s.LastJob, s.UpdatedAt = job.Int64, time.UnixMicro(updated).UTC()
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: schedules: %w", err)
	}
	return out, nil
}

// nullMicros is t in microseconds since the epoch, or NULL for zero.
func nullMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// nullID is id, or NULL for 0.
func nullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}
