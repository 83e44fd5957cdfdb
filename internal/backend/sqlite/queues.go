package sqlite

import (
	"context"
	"fmt"
	"time"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statement, so a claim that starts after PauseQueue returns takes
// nothing). Other processes notice a resume at their next poll.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	err := d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q["pause_queue"], queue, paused)
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: pause queue %q: %w", queue, err)
	}
	return nil
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.r.QueryContext(ctx, d.q["paused_queues"])
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
