package postgres

import (
	"context"
	"time"
)

// PauseQueue pauses (paused) or resumes queue for every process on the
// database: claims skip a paused queue (the check is part of the claim
// statement). Resuming notifies the queue, waking every process's
// fetchers for it.
func (d *Driver) PauseQueue(ctx context.Context, queue string, paused bool) error {
	_, err := d.pool.Exec(ctx, d.q.pauseQueue, queue, paused)
	return wrap("pause queue "+queue, err)
}

// PausedQueues returns the paused queues and when each was paused.
func (d *Driver) PausedQueues(ctx context.Context) (map[string]time.Time, error) {
	rows, err := d.pool.Query(ctx, d.q.pausedQueues)
	if err != nil {
		return nil, wrap("paused queues", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var name string
		var at time.Time
		if err := rows.Scan(&name, &at); err != nil {
			return nil, wrap("paused queues", err)
		}
		out[name] = at.UTC()
	}
	return out, wrap("paused queues", rows.Err())
}
