package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Key weights (SetKeyWeights) are the key_weights column of the queue's
// queues row, driver.EncodeKeyWeights of them, NULL for none
// (migrations/015_fair.sql). A claim of a Fair queue reads them with the
// queue's limits (limits_read) and gives each key at most its weight of
// jobs per turn (claimKeyedTx).

// SetKeyWeights replaces queue's key weights (nil or empty removes them)
// with one upsert of its queues row that writes its key_weights column
// only: its pause and limits are kept, and a new row has neither.
func (d *Driver) SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error {
	if err := driver.CheckKeyWeights(weights); err != nil {
		return fmt.Errorf("conveyor/mysql: set key weights of queue %q: %w", queue, err)
	}
	var enc any
	if b := driver.EncodeKeyWeights(weights); b != nil {
		enc = string(b)
	}
	return d.retry(ctx, "set key weights of queue "+queue, func() error {
		_, err := d.db.ExecContext(ctx, d.q.SetKeyWeights, queue, enc)
		return err
	})
}

// KeyWeights returns the key weights of every queue that has some.
func (d *Driver) KeyWeights(ctx context.Context) (map[string]map[string]int, error) {
	out := map[string]map[string]int{}
	err := d.retry(ctx, "key weights", func() error {
		clear(out)
		rows, err := d.db.QueryContext(ctx, d.q.KeyWeights)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var raw sql.NullString
			if err := rows.Scan(&name, &raw); err != nil {
				return err
			}
			w, err := driver.DecodeKeyWeights([]byte(raw.String))
			if err != nil {
				return fmt.Errorf("queue %q: %w", name, err)
			}
			if len(w) > 0 {
				out[name] = w
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
