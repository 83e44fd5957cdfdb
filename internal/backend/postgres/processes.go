package postgres

import (
	"context"
	"encoding/json"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// RegisterProcess inserts or refreshes p's row: one upsert.
func (d *Driver) RegisterProcess(ctx context.Context, p driver.ProcessRow, ttl time.Duration) error {
	qs, err := json.Marshal(queuesOrEmpty(p.Queues))
	if err != nil {
		return d.wrap("register process "+p.ID, err)
	}
	_, err = d.pool.Exec(ctx, d.q.RegisterProcess, p.ID, p.Kind, p.Host, nullPID(p.PID), p.Version, string(qs), micros(ttl))
	return d.wrap("register process "+p.ID, err)
}

// RemoveProcess deletes process id's row.
func (d *Driver) RemoveProcess(ctx context.Context, id string) error {
	_, err := d.pool.Exec(ctx, d.q.RemoveProcess, id)
	return d.wrap("remove process "+id, err)
}

// Processes lists the stored processes, alive first.
func (d *Driver) Processes(ctx context.Context) ([]driver.ProcessRow, error) {
	rows, err := d.pool.Query(ctx, d.q.Processes)
	if err != nil {
		return nil, d.wrap("processes", err)
	}
	defer rows.Close()
	var out []driver.ProcessRow
	for rows.Next() {
		var p driver.ProcessRow
		var pid *int32
		var qs string
		if err := rows.Scan(&p.ID, &p.Kind, &p.Host, &pid, &p.Version, &qs, &p.StartedAt, &p.HeartbeatAt, &p.ExpiresAt, &p.Alive); err != nil {
			return nil, d.wrap("processes", err)
		}
		if pid != nil {
			p.PID = int(*pid)
		}
		if err := json.Unmarshal([]byte(qs), &p.Queues); err != nil {
			return nil, d.wrap("processes: queues of "+p.ID, err)
		}
		p.StartedAt, p.HeartbeatAt, p.ExpiresAt = p.StartedAt.UTC(), p.HeartbeatAt.UTC(), p.ExpiresAt.UTC()
		out = append(out, p)
	}
	return out, d.wrap("processes", rows.Err())
}

// PruneProcesses deletes processes expired longer ago than age.
func (d *Driver) PruneProcesses(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := d.pool.Exec(ctx, d.q.PruneProcesses, micros(age))
	if err != nil {
		return 0, d.wrap("prune processes", err)
	}
	return tag.RowsAffected(), nil
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
	return int32(pid)
}
