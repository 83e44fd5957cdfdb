package mysql

import (
	"context"
	"time"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statements). Other processes notice a resume at their next poll.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	_, err := d.db.ExecContext(ctx, d.q["PauseQueue"], queue, paused)
	return d.wrap("pause queue "+queue, err)
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.db.QueryContext(ctx, d.q["PausedQueues"])
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
