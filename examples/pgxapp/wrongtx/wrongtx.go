//go:build conveyor_wrongtx

// Package wrongtx does not compile, on purpose: TestEnqueueTxTypeChecked
// builds it to show that a client on the PostgreSQL driver refuses a
// *sql.Tx at compile time.
package wrongtx

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor"
)

type args struct{}

func (args) Kind() string { return "wrongtx" }

// Enqueue passes a *sql.Tx to a client on driver/pgxv5, whose EnqueueTx takes a pgx.Tx.
func Enqueue(ctx context.Context, c *conveyor.Client[pgx.Tx], tx *sql.Tx) {
	c.EnqueueTx(ctx, tx, args{}, nil)
}
