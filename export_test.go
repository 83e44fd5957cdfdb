package conveyor

import (
	"context"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/backend/mysql"
	"github.com/conveyorq/conveyor/internal/backend/postgres"
	"github.com/conveyorq/conveyor/internal/backend/sqlite"
	"github.com/conveyorq/conveyor/internal/driver"
)

// ClaimForTest claims job id as another process would (without running it)
// and returns the attempt, so tests can play a process that dies.
func ClaimForTest(c *Client, id int64, lease time.Duration) (int, error) {
	j, err := c.drv.GetJob(context.Background(), id)
	if err != nil {
		return 0, err
	}
	rows, err := c.drv.Claim(context.Background(), driver.ClaimParams{Queue: j.Queue, Limit: 1, Lease: lease, Worker: "dead-process"})
	if err != nil {
		return 0, err
	}
	if len(rows) != 1 || rows[0].ID != id {
		return 0, fmt.Errorf("claimed %d rows, not job %d", len(rows), id)
	}
	return rows[0].Attempt, nil
}

// AckForTest acknowledges attempt of job id as completed, as a late worker
// would, and returns how many rows the acknowledgement changed.
func AckForTest(c *Client, id int64, attempt int) (int, error) {
	applied, err := c.drv.Complete(context.Background(), []driver.Outcome{{ID: id, Attempt: attempt, State: driver.StateCompleted}})
	return len(applied), err
}

// BumpSchemaForTest records schema version v as applied, as a newer
// conveyor binary would.
func BumpSchemaForTest(c *Client, v int) error {
	ctx := context.Background()
	p := c.cfg.TablePrefix
	switch d := c.drv.(type) {
	case *postgres.Driver:
		_, err := d.Pool().Exec(ctx, "INSERT INTO "+p+"schema_migrations (version) VALUES ($1)", v)
		return err
	case *mysql.Driver:
		_, err := d.DB().ExecContext(ctx, "INSERT INTO `"+p+"schema_migrations` (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))", v)
		return err
	case *sqlite.Driver:
		_, err := d.DB().ExecContext(ctx, "INSERT INTO "+p+"schema_migrations (version, applied_at) VALUES (?, 0)", v)
		return err
	}
	return fmt.Errorf("unknown driver %T", c.drv)
}
