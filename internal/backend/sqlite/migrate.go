package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Migrate applies the missing migrations, each in its own BEGIN IMMEDIATE
// transaction: concurrent migrators (in any process) serialise on the
// write lock, and each re-reads the applied version inside its
// transaction, so a version is applied once. It returns the versions this
// call applied.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	latest := len(d.migrations)
	var applied []int
	for {
		var did int
		err := d.inTx(ctx, func(tx *sql.Tx) error {
			did = 0
			if _, err := tx.ExecContext(ctx, d.q.CreateMigrationsTable); err != nil {
				return err
			}
			var cur int
			if err := tx.QueryRowContext(ctx, d.q.SchemaVersion).Scan(&cur); err != nil {
				return err
			}
			if cur > latest {
				return fmt.Errorf("database is at version %d, this binary knows up to %d: %w", cur, latest, driver.ErrSchemaTooNew)
			}
			if cur == latest {
				return nil
			}
			m := d.migrations[cur] // versions are 1..n, so this is cur+1
			for i, s := range m.Statements {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("migration %d (%s) statement %d: %w", m.Version, m.Name, i+1, err)
				}
			}
			if _, err := tx.ExecContext(ctx, d.q.RecordMigration, m.Version); err != nil {
				return err
			}
			did = m.Version
			return nil
		})
		if err != nil {
			return applied, fmt.Errorf("conveyor/sqlite: migrate: %w", err)
		}
		if did == 0 {
			return applied, nil
		}
		applied = append(applied, did)
	}
}

// SchemaVersion returns the applied version (0 when never migrated) and
// the latest version this binary embeds.
func (d *Driver) SchemaVersion(ctx context.Context) (current, latest int, err error) {
	latest = len(d.migrations)
	var n int
	if err := d.r.QueryRowContext(ctx, d.q.MigrationsTableExists).Scan(&n); err != nil {
		return 0, latest, fmt.Errorf("conveyor/sqlite: schema version: %w", err)
	}
	if n == 0 {
		return 0, latest, nil
	}
	if err := d.r.QueryRowContext(ctx, d.q.SchemaVersion).Scan(&current); err != nil {
		return 0, latest, fmt.Errorf("conveyor/sqlite: schema version: %w", err)
	}
	return current, latest, nil
}

// DropAll drops every table under this driver's prefix, in one
// transaction.
func (d *Driver) DropAll(ctx context.Context) error {
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		for _, q := range []string{d.q.DropJobs, d.q.DropLeader, d.q.DropQueues, d.q.DropSchedules, d.q.DropProcesses, d.q.DropLimitSlotsTable, d.q.DropKeySlotsTable, d.q.DropResults, d.q.DropBatches, d.q.DropBatchJobs, d.q.DropBatchDeps, d.q.DropMigrations} {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("conveyor/sqlite: drop all: %w", err)
	}
	return nil
}
