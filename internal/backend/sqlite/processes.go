package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// RegisterProcess inserts or refreshes p's row: one upsert, an ordinary
// write that takes the write gate like claims and inserts.
func (d *Driver) RegisterProcess(ctx context.Context, p driver.ProcessRow, ttl time.Duration) error {
	qs, err := json.Marshal(queuesOrEmpty(p.Queues))
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: register process %q: %w", p.ID, err)
	}
	err = d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q.RegisterProcess, p.ID, p.Kind, p.Host, nullPID(p.PID), p.Version, string(qs), us(ttl))
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: register process %q: %w", p.ID, err)
	}
	return nil
}

// RemoveProcess deletes process id's row, through the write gate.
func (d *Driver) RemoveProcess(ctx context.Context, id string) error {
	err := d.retry(ctx, func() error {
		_, err := d.w.ExecContext(ctx, d.q.RemoveProcess, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: remove process %q: %w", id, err)
	}
	return nil
}

// Processes lists the stored processes, alive first.
func (d *Driver) Processes(ctx context.Context) ([]driver.ProcessRow, error) {
	rows, err := d.r.QueryContext(ctx, d.q.Processes)
	if err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: processes: %w", err)
	}
	defer rows.Close()
	var out []driver.ProcessRow
	for rows.Next() {
		var p driver.ProcessRow
		var pid sql.NullInt64
		var qs string
		var started, beat, expires int64
		if err := rows.Scan(&p.ID, &p.Kind, &p.Host, &pid, &p.Version, &qs, &started, &beat, &expires, &p.Alive); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: processes: %w", err)
		}
		p.PID = int(pid.Int64)
		if err := json.Unmarshal([]byte(qs), &p.Queues); err != nil {
			return nil, fmt.Errorf("conveyor/sqlite: processes: queues of %q: %w", p.ID, err)
		}
		p.StartedAt, p.HeartbeatAt, p.ExpiresAt = time.UnixMicro(started).UTC(), time.UnixMicro(beat).UTC(), time.UnixMicro(expires).UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conveyor/sqlite: processes: %w", err)
	}
	return out, nil
}

// PruneProcesses deletes processes expired longer ago than age, through
// the write gate.
func (d *Driver) PruneProcesses(ctx context.Context, age time.Duration) (int64, error) {
	var n int64
	err := d.retry(ctx, func() error {
		res, err := d.w.ExecContext(ctx, d.q.PruneProcesses, us(age))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("conveyor/sqlite: prune processes: %w", err)
	}
	return n, nil
}

// queuesOrEmpty is qs, or an empty map for nil (stored as {}).
func queuesOrEmpty(qs map[string]int) map[string]int {
	if qs == nil {
		return map[string]int{}
	}
	return qs
}

// nullPID is pid, or NULL for 0 (unknown).
func nullPID(pid int) any {
	if pid == 0 {
		return nil
	}
	return int64(pid)
}
