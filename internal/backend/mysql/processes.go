package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// RegisterProcess inserts or refreshes p's row: one upsert, retried on
// a deadlock like every write.
func (d *Driver) RegisterProcess(ctx context.Context, p driver.ProcessRow, ttl time.Duration) error {
	qs, err := json.Marshal(queuesOrEmpty(p.Queues))
	if err != nil {
		return d.wrap("register process "+p.ID, err)
	}
	_, err = d.execCount(ctx, d.main, "register process "+p.ID, true, d.q.RegisterProcess,
		[]any{p.ID, p.Kind, p.Host, nullPID(p.PID), p.Version, string(qs), micros(ttl)})
	return err
}

// RemoveProcess deletes process id's row.
func (d *Driver) RemoveProcess(ctx context.Context, id string) error {
	_, err := d.execCount(ctx, d.main, "remove process "+id, true, d.q.RemoveProcess, []any{id})
	return err
}

// Processes lists the stored processes, alive first.
func (d *Driver) Processes(ctx context.Context) ([]driver.ProcessRow, error) {
	rows, err := d.db.QueryContext(ctx, d.q.Processes)
	if err != nil {
		return nil, d.wrap("processes", err)
	}
	defer rows.Close()
	var out []driver.ProcessRow
	for rows.Next() {
		var p driver.ProcessRow
		var pid sql.NullInt64
		var qs string
		if err := rows.Scan(&p.ID, &p.Kind, &p.Host, &pid, &p.Version, &qs, &p.StartedAt, &p.HeartbeatAt, &p.ExpiresAt, &p.Alive); err != nil {
			return nil, d.wrap("processes", err)
		}
		p.PID = int(pid.Int64)
		if err := json.Unmarshal([]byte(qs), &p.Queues); err != nil {
			return nil, d.wrap("processes: queues of "+p.ID, err)
		}
		p.StartedAt, p.HeartbeatAt, p.ExpiresAt = p.StartedAt.UTC(), p.HeartbeatAt.UTC(), p.ExpiresAt.UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrap("processes", err)
	}
	return out, nil
}

// PruneProcesses deletes processes expired longer ago than age.
func (d *Driver) PruneProcesses(ctx context.Context, age time.Duration) (int64, error) {
	return d.execCount(ctx, d.main, "prune processes", true, d.q.PruneProcesses, []any{micros(age)})
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
