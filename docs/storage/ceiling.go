//go:build ignore

// ceiling measures what raw SQL reaches on the phase tables' moves, with
// no queue library around it: the ceiling the drain of
// docs/postgres-storage.md ("Where a job's time goes") is compared with.
// It fills a ready table with -jobs rows shaped as conveyor's segment
// rows (the same columns and indexes), then -clients connections drain
// it in batches of -batch:
//
//   - moves 1: one statement per batch, DELETE ... SKIP LOCKED RETURNING
//     from ready into an INSERT into done, committed synchronously;
//   - moves 2 (conveyor's path): a claim moves the batch from ready to
//     running (asynchronous commit, as conveyor's claims), then a second
//     statement moves it from running to done by id (synchronous
//     commit, as conveyor's outcomes).
//
// Run from the repository root:
//
//	go run docs/storage/ceiling.go -db postgres://postgres@127.0.0.1:5432/test -moves 2
//
// It creates and drops only tables named ceiling_* in the database given.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	dsn     = flag.String("db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL DSN")
	jobs    = flag.Int("jobs", 100000, "rows to drain")
	batch   = flag.Int("batch", 500, "rows per move")
	clients = flag.Int("clients", 2, "concurrent draining connections")
	moves   = flag.Int("moves", 2, "1: ready to done in one statement; 2: ready to running, then running to done")
	rounds  = flag.Int("rounds", 1, "drains, each on fresh tables")
)

const cols = `pos bigint NOT NULL, id bigint NOT NULL, queue varchar(128) NOT NULL, kind varchar(128) NOT NULL,
	args json NOT NULL DEFAULT '{}', state text NOT NULL, priority integer NOT NULL DEFAULT 0,
	attempt integer NOT NULL DEFAULT 0, max_attempts integer NOT NULL DEFAULT 25, timeout_ms bigint NOT NULL DEFAULT 0,
	scheduled_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
	attempted_at timestamptz, finalized_at timestamptz, lease_expires_at timestamptz, attempted_by text,
	errors jsonb NOT NULL DEFAULT '[]', fence bigint NOT NULL DEFAULT 0, unique_key bytea,
	unique_keep smallint NOT NULL DEFAULT 0, meta jsonb`

const rowCols = `pos, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms, scheduled_at,
	created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors, fence, unique_key, unique_keep, meta`

func main() {
	flag.Parse()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = int32(*clients + 1)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	for r := 0; r < *rounds; r++ {
		if err := setup(ctx, pool); err != nil {
			log.Fatal(err)
		}
		var stmts atomic.Int64
		t0 := time.Now()
		var wg sync.WaitGroup
		var moved atomic.Int64
		errs := make(chan error, *clients)
		for c := 0; c < *clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := drain(ctx, pool, &moved, &stmts); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		el := time.Since(t0)
		close(errs)
		for err := range errs {
			log.Fatal(err)
		}
		var done int64
		if err := pool.QueryRow(ctx, "SELECT count(DISTINCT id) FROM ceiling_done").Scan(&done); err != nil {
			log.Fatal(err)
		}
		if done != int64(*jobs) || moved.Load() != int64(*jobs) {
			log.Fatalf("moved %d, %d distinct in done, want %d", moved.Load(), done, *jobs)
		}
		fmt.Printf("moves=%d clients=%d batch=%d jobs=%d seconds=%.2f jobs/s=%.0f statements=%d\n",
			*moves, *clients, *batch, *jobs, el.Seconds(), float64(*jobs)/el.Seconds(), stmts.Load())
	}
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS ceiling_ready, ceiling_running, ceiling_done"); err != nil {
		log.Fatal(err)
	}
}

// setup makes fresh tables, with conveyor's segment indexes, and fills
// ready.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	stmts := []string{
		"DROP TABLE IF EXISTS ceiling_ready, ceiling_running, ceiling_done",
		"CREATE TABLE ceiling_ready (" + cols + ") WITH (fillfactor = 80)",
		"CREATE UNIQUE INDEX ON ceiling_ready (id)",
		"CREATE INDEX ON ceiling_ready (queue, priority, pos)",
		"CREATE TABLE ceiling_running (" + cols + ") WITH (fillfactor = 80)",
		"CREATE UNIQUE INDEX ON ceiling_running (id)",
		"CREATE TABLE ceiling_done (" + cols + ") WITH (fillfactor = 80)",
		"CREATE UNIQUE INDEX ON ceiling_done (id)",
		"CREATE INDEX ON ceiling_done (queue, id)",
		"CREATE INDEX ON ceiling_done (kind, id)",
		fmt.Sprintf(`INSERT INTO ceiling_ready (pos, id, queue, kind, args, state)
			SELECT g, g, 'default', 'bench', json_build_object('seq', g), 'available' FROM generate_series(1, %d) g`, *jobs),
		"ANALYZE ceiling_ready, ceiling_running, ceiling_done",
		"CHECKPOINT",
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.40s: %w", s, err)
		}
	}
	return nil
}

var (
	claimPicked = `WITH picked AS (
	SELECT ctid AS c FROM ceiling_ready WHERE queue = 'default' ORDER BY priority, pos LIMIT $1 FOR UPDATE SKIP LOCKED
), d AS (DELETE FROM ceiling_ready r WHERE r.ctid = ANY (ARRAY(SELECT c FROM picked)) RETURNING r.*)`
	// oneMove: ready to done, the outcome written with the claim.
	oneMove = claimPicked + `
INSERT INTO ceiling_done (` + rowCols + `)
SELECT pos, id, queue, kind, args, 'completed', priority, attempt + 1, max_attempts, timeout_ms, scheduled_at,
       created_at, now(), now(), NULL, 'w', errors, fence + 1, unique_key, unique_keep, meta FROM d
RETURNING id`
	// claim: ready to running, returning what a worker needs.
	claim = claimPicked + `,
ins AS (
INSERT INTO ceiling_running (` + rowCols + `)
SELECT pos, id, queue, kind, args, 'running', priority, attempt + 1, max_attempts, timeout_ms, scheduled_at,
       created_at, now(), NULL, now() + interval '30 seconds', 'w', errors, fence + 1, unique_key, unique_keep, meta FROM d
RETURNING id, kind, args, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at, attempted_at,
          lease_expires_at, errors, fence, meta)
SELECT id, fence FROM ins`
	// complete: running to done by id and fence.
	complete = `WITH d AS (
DELETE FROM ceiling_running r USING unnest($1::bigint[], $2::bigint[]) AS o(id, fence)
 WHERE r.id = o.id AND r.fence = o.fence RETURNING r.*)
INSERT INTO ceiling_done (` + rowCols + `)
SELECT pos, id, queue, kind, args, 'completed', priority, attempt, max_attempts, timeout_ms, scheduled_at,
       created_at, attempted_at, now(), NULL, attempted_by, errors, fence, unique_key, unique_keep, meta FROM d
RETURNING id`
)

// drain moves batches until ready is empty.
func drain(ctx context.Context, pool *pgxpool.Pool, moved, stmts *atomic.Int64) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for {
		if *moves == 1 {
			n, err := count(ctx, conn.Conn(), oneMove, *batch)
			stmts.Add(1)
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			moved.Add(int64(n))
			continue
		}
		// The claim commits asynchronously (SET LOCAL in its own
		// transaction), as conveyor's does.
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, claim, *batch)
		if err != nil {
			return err
		}
		var ids, fences []int64
		for rows.Next() {
			var id, fence int64
			if err := rows.Scan(&id, &fence); err != nil {
				return err
			}
			ids, fences = append(ids, id), append(fences, fence)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		stmts.Add(4)
		if len(ids) == 0 {
			return nil
		}
		n, err := count(ctx, conn.Conn(), complete, ids, fences)
		stmts.Add(1)
		if err != nil {
			return err
		}
		if n != len(ids) {
			return fmt.Errorf("completed %d of %d claimed", n, len(ids))
		}
		moved.Add(int64(n))
	}
}

// count runs q and counts the rows it returns.
func count(ctx context.Context, c *pgx.Conn, q string, args ...any) (int, error) {
	rows, err := c.Query(ctx, strings.TrimSpace(q), args...)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}
