package postgres

import (
	"context"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Key weights (Driver.SetKeyWeights) are the key_weights column of the
// queue's row in {p}queues, beside its limits: the text
// driver.EncodeKeyWeights makes, NULL for none. A claim of a fair queue
// reads it with the limits (limit_begin) and decodes it once per value
// (driver.KeyWeightCache).

// SetKeyWeights stores queue's key weights (nil or empty removes them),
// making the queue's row if it has none (no limits, not paused) and
// leaving its other columns as they are.
func (d *Driver) SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error {
	if err := driver.CheckKeyWeights(weights); err != nil {
		return d.wrap("set key weights of queue "+queue, err)
	}
	var raw any
	if b := driver.EncodeKeyWeights(weights); b != nil {
		raw = string(b)
	}
	_, err := d.pool.Exec(ctx, d.q.SetKeyWeights, queue, raw)
	return d.wrap("set key weights of queue "+queue, err)
}

// KeyWeights returns the key weights of every queue that has some.
func (d *Driver) KeyWeights(ctx context.Context) (map[string]map[string]int, error) {
	rows, err := d.pool.Query(ctx, d.q.KeyWeights)
	if err != nil {
		return nil, d.wrap("key weights", err)
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var name, raw string
		if err := rows.Scan(&name, &raw); err != nil {
			return nil, d.wrap("key weights", err)
		}
		w, err := driver.DecodeKeyWeights([]byte(raw))
		if err != nil {
			return nil, d.wrap("key weights of queue "+name, err)
		}
		if len(w) > 0 {
			out[name] = w
		}
	}
	return out, d.wrap("key weights", rows.Err())
}
