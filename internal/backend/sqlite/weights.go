package sqlite

import (
	"context"
	"fmt"

	"github.com/conveyorq/conveyor/internal/driver"
)

// SetKeyWeights stores queue's key weights in its queues row as
// driver.EncodeKeyWeights encodes them (NULL for none), making the row
// when the queue has none: a row with no limits and no pause, which
// leaves the queue unlimited and unpaused. It touches no other column.
func (d *Driver) SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error {
	if err := driver.CheckKeyWeights(weights); err != nil {
		return fmt.Errorf("conveyor/sqlite: set key weights of queue %q: %w", queue, err)
	}
	var enc any
	if b := driver.EncodeKeyWeights(weights); b != nil {
		enc = string(b)
	}
	err := d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q.SetKeyWeights, queue, enc)
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: set key weights of queue %q: %w", queue, err)
	}
	return nil
}

// KeyWeights returns the key weights of every queue that has some.
func (d *Driver) KeyWeights(ctx context.Context) (map[string]map[string]int, error) {
	rows, err := d.r.QueryContext(ctx, d.q.KeyWeights)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: key weights: %w", err)
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var name, raw string
		if err := rows.Scan(&name, &raw); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: key weights: %w", err)
		}
		w, err := driver.DecodeKeyWeights([]byte(raw))
		if err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: key weights of queue %q: %w", name, err)
		}
		if len(w) > 0 {
			out[name] = w
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: key weights: %w", err)
	}
	return out, nil
}
