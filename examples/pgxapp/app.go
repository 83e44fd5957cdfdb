// Package pgxapp is an application that already has a *pgxpool.Pool and
// gives it to conveyor: it registers a user and enqueues the welcome
// email in the same pgx transaction, so the email job exists if and only
// if the user does.
package pgxapp

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/driver/pgxv5"
)

// WelcomeEmail is the job enqueued for a new user.
type WelcomeEmail struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// Kind names the job kind.
func (WelcomeEmail) Kind() string { return "welcome_email" }

// App is the application: its pool, its conveyor client and the mail it
// sent (a stand-in for a mail server).
type App struct {
	Pool   *pgxpool.Pool
	Client *conveyor.Client[pgx.Tx]
	Sent   chan WelcomeEmail
	table  string
}

// New builds the application on its own pool; table names its users
// table and prefix conveyor's tables (both so tests can share a database).
func New(ctx context.Context, pool *pgxpool.Pool, table, prefix string) (*App, error) {
	c, err := conveyor.New(ctx, pgxv5.New(pool), &conveyor.Config{TablePrefix: prefix})
	if err != nil {
		return nil, err
	}
	if _, err := c.Migrate(ctx); err != nil {
		c.Close()
		return nil, err
	}
	a := &App{Pool: pool, Client: c, Sent: make(chan WelcomeEmail, 16), table: table}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{table}.Sanitize()+" (id bigserial PRIMARY KEY, email text NOT NULL UNIQUE)"); err != nil {
		c.Close()
		return nil, err
	}
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(a.SendWelcome)); err != nil {
		c.Close()
		return nil, err
	}
	return a, nil
}

// SendWelcome is the handler of WelcomeEmail.
func (a *App) SendWelcome(ctx context.Context, job *conveyor.Job[WelcomeEmail]) error {
	select {
	case a.Sent <- job.Args:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Register inserts a user and enqueues the welcome email in one
// transaction of the application's pool.
func (a *App) Register(ctx context.Context, email string) (int64, error) {
	tx, err := a.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	id, err := a.RegisterTx(ctx, tx, email)
	if err != nil {
		return 0, err
	}
	return id, tx.Commit(ctx)
}

// RegisterTx inserts a user and enqueues the welcome email in tx, which
// the caller commits: the email job exists if and only if the user does.
func (a *App) RegisterTx(ctx context.Context, tx pgx.Tx, email string) (int64, error) {
	var id int64
	if err := tx.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{a.table}.Sanitize()+" (email) VALUES ($1) RETURNING id", email).Scan(&id); err != nil {
		return 0, fmt.Errorf("register %s: %w", email, err)
	}
	if _, err := a.Client.EnqueueTx(ctx, tx, WelcomeEmail{UserID: id, Email: email}, nil); err != nil {
		return 0, err
	}
	return id, nil
}
