//go:build ignore

// segexp is the experiment behind docs/postgres-storage.md: claim cost
// under a held xmin, today's one-table design (A) against phase tables
// rotated in segments and truncated with NOWAIT (B). Run
// from the repository root: go run docs/storage/segexp.go -mode A (or B)
// -duration 4m -window 20s. It creates and drops only tables named
// segexp_* in the database it is given.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	dsn      = flag.String("db", "postgres://postgres@127.0.0.1:5432/test", "")
	mode     = flag.String("mode", "B", "A or B")
	rate     = flag.Int("rate", 1000, "jobs/s offered")
	dur      = flag.Duration("duration", 3*time.Minute, "")
	window   = flag.Duration("window", 15*time.Second, "")
	hold     = flag.Bool("hold", true, "hold a RR transaction that read the tables")
	segSize  = flag.Int64("seg", 2000, "B: ready/running segment size (rows inserted)")
	retain   = flag.Duration("retain", 30*time.Second, "B: done segments kept this long")
	claimers = flag.Int("claimers", 4, "")
	batch    = flag.Int("batch", 20, "")
)

const P = "segexp_"

type stats struct {
	mu      sync.Mutex
	pickups []float64
	done    int64
	claimNs int64
	claims  int64
	enq     int64
}

func main() {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *dur+time.Minute)
	defer cancel()
	cfg, _ := pgxpool.ParseConfig(*dsn)
	cfg.MaxConns = 30
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	drop(ctx, pool)
	defer drop(context.Background(), pool)

	var st stats
	var store Store
	if *mode == "A" {
		store = newA(ctx, pool)
	} else {
		store = newB(ctx, pool)
	}

	var holdConn *pgx.Conn
	if *hold {
		holdConn, err = pgx.Connect(ctx, *dsn)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := holdConn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			log.Fatal(err)
		}
		for _, t := range tables(ctx, pool) {
			var n int64
			if err := holdConn.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
				log.Fatal(err)
			}
		}
		defer holdConn.Close(context.Background())
	}

	runCtx, stop := context.WithTimeout(ctx, *dur)
	defer stop()
	var wg sync.WaitGroup
	// 8 producers on a fixed timetable.
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			interval := time.Duration(float64(time.Second) * 8 / float64(*rate))
			next := time.Now().Add(time.Duration(p) * interval / 8)
			for runCtx.Err() == nil {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				if err := store.Enqueue(runCtx, time.Now()); err != nil && runCtx.Err() == nil {
					log.Println("enqueue:", err)
				}
				atomic.AddInt64(&st.enq, 1)
			}
		}(p)
	}
	for c := 0; c < *claimers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				t0 := time.Now()
				got, err := store.Claim(runCtx, *batch)
				atomic.AddInt64(&st.claimNs, int64(time.Since(t0)))
				atomic.AddInt64(&st.claims, 1)
				if err != nil {
					if runCtx.Err() == nil {
						log.Println("claim:", err)
					}
					continue
				}
				now := time.Now()
				st.mu.Lock()
				for _, j := range got {
					st.pickups = append(st.pickups, float64(now.Sub(j.enq).Microseconds())/1000)
				}
				st.mu.Unlock()
				if len(got) > 0 {
					if err := store.Complete(runCtx, got); err != nil && runCtx.Err() == nil {
						log.Println("complete:", err)
					}
					atomic.AddInt64(&st.done, int64(len(got)))
				} else {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	if m, ok := store.(maint); ok {
		wg.Add(1)
		go func() { defer wg.Done(); m.Maintain(runCtx) }()
	}
	fmt.Printf("mode %s rate %d hold %v seg %d\n", *mode, *rate, *hold, *segSize)
	fmt.Println("t\tenq/s\tdone/s\tp50ms\tp99ms\tclaim_ms\tdead\tlive\tsizeMB\textra")
	start := time.Now()
	tick := time.NewTicker(*window)
	var lastDone, lastEnq, lastNs, lastClaims int64
	for {
		select {
		case <-runCtx.Done():
			wg.Wait()
			return
		case <-tick.C:
		}
		st.mu.Lock()
		ps := st.pickups
		st.pickups = nil
		st.mu.Unlock()
		sort.Float64s(ps)
		q := func(f float64) float64 {
			if len(ps) == 0 {
				return -1
			}
			return ps[int(f*float64(len(ps)-1))]
		}
		d, e, ns, cl := atomic.LoadInt64(&st.done), atomic.LoadInt64(&st.enq), atomic.LoadInt64(&st.claimNs), atomic.LoadInt64(&st.claims)
		var dead, live, size int64
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup),0), coalesce(sum(n_live_tup),0), coalesce(sum(pg_total_relation_size(relid)),0) FROM pg_stat_user_tables WHERE relname LIKE 'segexp_%'`).Scan(&dead, &live, &size)
		extra := ""
		if s, ok := store.(interface{ Extra() string }); ok {
			extra = s.Extra()
		}
		w := window.Seconds()
		cms := 0.0
		if cl-lastClaims > 0 {
			cms = float64(ns-lastNs) / float64(cl-lastClaims) / 1e6
		}
		fmt.Printf("%3.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.2f\t%d\t%d\t%.1f\t%s\n", time.Since(start).Seconds(), float64(e-lastEnq)/w, float64(d-lastDone)/w, q(.5), q(.99), cms, dead, live, float64(size)/1e6, extra)
		lastDone, lastEnq, lastNs, lastClaims = d, e, ns, cl
	}
}

type job struct {
	id, fence int64
	enq       time.Time
	seg       int
}

// Store is one design.
type Store interface {
	Enqueue(ctx context.Context, at time.Time) error
	Claim(ctx context.Context, n int) ([]job, error)
	Complete(ctx context.Context, js []job) error
}

type maint interface{ Maintain(ctx context.Context) }

func tables(ctx context.Context, pool *pgxpool.Pool) []string {
	rows, _ := pool.Query(ctx, `SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'segexp\_%'`)
	ts, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return ts
}

func drop(ctx context.Context, pool *pgxpool.Pool) {
	for _, t := range tables(ctx, pool) {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			log.Println(err)
		}
	}
	pool.Exec(ctx, "DROP SEQUENCE IF EXISTS segexp_pos")
	pool.Exec(ctx, "DROP SEQUENCE IF EXISTS segexp_id")
}

// ---- A: today's one-table design (same indexes and statements) ----

type A struct{ pool *pgxpool.Pool }

func newA(ctx context.Context, pool *pgxpool.Pool) *A {
	for _, s := range []string{
		`CREATE TABLE segexp_jobs (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, queue text NOT NULL, kind text NOT NULL, args json NOT NULL DEFAULT '{}',
		 state text NOT NULL DEFAULT 'available', priority int NOT NULL DEFAULT 0, attempt int NOT NULL DEFAULT 0, max_attempts int NOT NULL DEFAULT 25,
		 scheduled_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(), attempted_at timestamptz, finalized_at timestamptz,
		 lease_expires_at timestamptz, attempted_by text, errors jsonb NOT NULL DEFAULT '[]', fence bigint NOT NULL DEFAULT 0, enq timestamptz)
		 WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)`,
		`CREATE INDEX ON segexp_jobs (queue, priority, scheduled_at, id) WHERE state = 'available'`,
		`CREATE INDEX ON segexp_jobs (scheduled_at) WHERE state IN ('scheduled', 'retryable')`,
		`CREATE INDEX ON segexp_jobs (lease_expires_at) WHERE state = 'running'`,
		`CREATE INDEX ON segexp_jobs (finalized_at) WHERE finalized_at IS NOT NULL`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			log.Fatal(err)
		}
	}
	return &A{pool}
}

func (a *A) Enqueue(ctx context.Context, at time.Time) error {
	_, err := a.pool.Exec(ctx, `INSERT INTO segexp_jobs (queue, kind, args, enq) VALUES ('default', 'noop', '{"n":1}', $1)`, at)
	return err
}

func (a *A) Claim(ctx context.Context, n int) ([]job, error) {
	rows, _ := a.pool.Query(ctx, `WITH picked AS (SELECT id FROM segexp_jobs WHERE state = 'available' AND queue = 'default'
		ORDER BY priority, scheduled_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)
		UPDATE segexp_jobs j SET state = 'running', attempt = j.attempt + 1, fence = j.fence + 1, attempted_at = now(),
		lease_expires_at = now() + interval '30 seconds', attempted_by = 'w' FROM picked WHERE j.id = picked.id
		RETURNING j.id, j.fence, j.enq`, n)
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		return j, r.Scan(&j.id, &j.fence, &j.enq)
	})
}

func (a *A) Complete(ctx context.Context, js []job) error {
	ids, fences := make([]int64, len(js)), make([]int64, len(js))
	for i, j := range js {
		ids[i], fences[i] = j.id, j.fence
	}
	_, err := a.pool.Exec(ctx, `UPDATE segexp_jobs j SET state = 'completed', finalized_at = now(), lease_expires_at = NULL
		FROM unnest($1::bigint[], $2::bigint[]) AS o(id, fence) WHERE j.id = o.id AND j.fence = o.fence AND j.state = 'running'`, ids, fences)
	return err
}

// ---- B: phase tables in segments ----
//
// ready_<n>: available jobs, claimed by DELETE ... RETURNING into the
// current running segment. running_<n>: one row per attempt, deleted on
// completion into the current done segment. done_<n>: insert-only,
// truncated as a whole once older than the retention. A segment is sealed
// after segSize inserts; a sealed segment found empty (and whose writers
// have all ended) is truncated under LOCK ... NOWAIT, or, when the lock is
// not free (a held transaction read it), abandoned and replaced by a new
// table. (Single process: the segment map lives in memory here.)

type seg struct {
	tbl      string
	inserted int64
	sealedAt time.Time
	maxAt    time.Time // done: newest finalize
}

type phase struct {
	name    string
	ddl     string // %s = table name
	mu      sync.RWMutex
	cur     *seg
	sealed  []*seg
	free    []string
	created int
}

type B struct {
	pool                   *pgxpool.Pool
	ready, running, done   *phase
	truncOK, truncBusy, mk int64
}

func newB(ctx context.Context, pool *pgxpool.Pool) *B {
	b := &B{pool: pool}
	if _, err := pool.Exec(ctx, "CREATE SEQUENCE segexp_pos; CREATE SEQUENCE segexp_id"); err != nil {
		log.Fatal(err)
	}
	b.ready = &phase{name: "ready", ddl: `CREATE TABLE %[1]s (pos bigint NOT NULL, id bigint NOT NULL, queue text NOT NULL, kind text NOT NULL, args json NOT NULL,
		priority int NOT NULL DEFAULT 0, attempt int NOT NULL DEFAULT 0, max_attempts int NOT NULL DEFAULT 25, fence bigint NOT NULL DEFAULT 0,
		scheduled_at timestamptz NOT NULL, created_at timestamptz NOT NULL, errors jsonb NOT NULL DEFAULT '[]', enq timestamptz) WITH (autovacuum_enabled = off);
		CREATE INDEX %[1]s_claim ON %[1]s (queue, priority, pos)`}
	b.running = &phase{name: "running", ddl: `CREATE TABLE %[1]s (id bigint PRIMARY KEY, queue text NOT NULL, kind text NOT NULL, args json NOT NULL,
		priority int NOT NULL, attempt int NOT NULL, max_attempts int NOT NULL, fence bigint NOT NULL,
		scheduled_at timestamptz NOT NULL, created_at timestamptz NOT NULL, attempted_at timestamptz NOT NULL, lease_expires_at timestamptz NOT NULL,
		attempted_by text, errors jsonb NOT NULL, enq timestamptz) WITH (autovacuum_enabled = off, fillfactor = 80)`}
	b.done = &phase{name: "done", ddl: `CREATE TABLE %[1]s (id bigint PRIMARY KEY, queue text NOT NULL, kind text NOT NULL, args json NOT NULL, state text NOT NULL,
		priority int NOT NULL, attempt int NOT NULL, max_attempts int NOT NULL, fence bigint NOT NULL,
		scheduled_at timestamptz NOT NULL, created_at timestamptz NOT NULL, attempted_at timestamptz, finalized_at timestamptz NOT NULL,
		attempted_by text, errors jsonb NOT NULL) WITH (autovacuum_enabled = off)`}
	for _, p := range []*phase{b.ready, b.running, b.done} {
		// A ring of four to start with.
		for i := 0; i < 4; i++ {
			p.free = append(p.free, b.create(ctx, p))
		}
		p.cur = &seg{tbl: p.take()}
	}
	return b
}

func (b *B) create(ctx context.Context, p *phase) string {
	p.created++
	t := fmt.Sprintf("%s%s_%d", P, p.name, p.created)
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(p.ddl, t)); err != nil {
		log.Fatal(err)
	}
	return t
}

func (p *phase) take() string { t := p.free[0]; p.free = p.free[1:]; return t }

// live: sealed segments (oldest first) and the current one.
func (p *phase) live() []*seg {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append(append([]*seg(nil), p.sealed...), p.cur)
}

func (p *phase) current() *seg {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.cur
}

func (b *B) Enqueue(ctx context.Context, at time.Time) error {
	s := b.ready.current()
	_, err := b.pool.Exec(ctx, `INSERT INTO `+s.tbl+` (pos, id, queue, kind, args, scheduled_at, created_at, enq)
		VALUES (nextval('segexp_pos'), nextval('segexp_id'), 'default', 'noop', '{"n":1}', now(), now(), $1)`, at)
	atomic.AddInt64(&s.inserted, 1)
	return err
}

func (b *B) Claim(ctx context.Context, n int) ([]job, error) {
	run := b.running.current()
	var out []job
	for _, s := range b.ready.live() {
		if len(out) >= n {
			break
		}
		rows, _ := b.pool.Query(ctx, `WITH p AS (SELECT ctid FROM `+s.tbl+` WHERE queue = 'default' ORDER BY priority, pos LIMIT $1 FOR UPDATE SKIP LOCKED),
			d AS (DELETE FROM `+s.tbl+` r USING p WHERE r.ctid = p.ctid RETURNING r.*)
			INSERT INTO `+run.tbl+` (id, queue, kind, args, priority, attempt, max_attempts, fence, scheduled_at, created_at, attempted_at, lease_expires_at, attempted_by, errors, enq)
			SELECT id, queue, kind, args, priority, attempt + 1, max_attempts, fence + 1, scheduled_at, created_at, now(), now() + interval '30 seconds', 'w', errors, enq FROM d
			RETURNING id, fence, enq`, n-len(out))
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
			var j job
			return j, r.Scan(&j.id, &j.fence, &j.enq)
		})
		if err != nil {
			return out, err
		}
		atomic.AddInt64(&run.inserted, int64(len(got)))
		out = append(out, got...)
	}
	return out, nil
}

func (b *B) Complete(ctx context.Context, js []job) error {
	ids, fences := make([]int64, len(js)), make([]int64, len(js))
	for i, j := range js {
		ids[i], fences[i] = j.id, j.fence
	}
	dn := b.done.current()
	left := len(js)
	// Newest running segment first: a just-claimed job is most likely there.
	live := b.running.live()
	for i := len(live) - 1; i >= 0 && left > 0; i-- {
		ct, err := b.pool.Exec(ctx, `WITH d AS (DELETE FROM `+live[i].tbl+` r USING unnest($1::bigint[], $2::bigint[]) AS o(id, fence)
			WHERE r.id = o.id AND r.fence = o.fence RETURNING r.*)
			INSERT INTO `+dn.tbl+` (id, queue, kind, args, state, priority, attempt, max_attempts, fence, scheduled_at, created_at, attempted_at, finalized_at, attempted_by, errors)
			SELECT id, queue, kind, args, 'completed', priority, attempt, max_attempts, fence, scheduled_at, created_at, attempted_at, now(), attempted_by, errors FROM d`, ids, fences)
		if err != nil {
			return err
		}
		left -= int(ct.RowsAffected())
	}
	atomic.AddInt64(&dn.inserted, int64(len(js)))
	return nil
}

func (b *B) Extra() string {
	n := func(p *phase) int { p.mu.RLock(); defer p.mu.RUnlock(); return len(p.sealed) }
	return fmt.Sprintf("sealed r/run/d %d/%d/%d trunc ok %d busy %d created %d",
		n(b.ready), n(b.running), n(b.done), atomic.LoadInt64(&b.truncOK), atomic.LoadInt64(&b.truncBusy), atomic.LoadInt64(&b.mk))
}

func (b *B) Maintain(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range []*phase{b.ready, b.running} {
			b.rotate(ctx, p, func(s *seg) bool { return atomic.LoadInt64(&s.inserted) >= *segSize })
			b.reclaim(ctx, p, func(s *seg) bool { return b.empty(ctx, s.tbl) })
		}
		b.rotate(ctx, b.done, func(s *seg) bool { return atomic.LoadInt64(&s.inserted) >= *segSize*5 })
		b.reclaim(ctx, b.done, func(s *seg) bool { return time.Since(s.sealedAt) > *retain })
	}
}

func (b *B) rotate(ctx context.Context, p *phase, full func(*seg) bool) {
	if !full(p.current()) {
		return
	}
	var next string
	p.mu.Lock()
	if len(p.free) > 0 {
		next = p.take()
	}
	p.mu.Unlock()
	if next == "" {
		next = b.create(ctx, p)
		atomic.AddInt64(&b.mk, 1)
	}
	p.mu.Lock()
	p.cur.sealedAt = time.Now()
	p.sealed = append(p.sealed, p.cur)
	p.cur = &seg{tbl: next}
	p.mu.Unlock()
}

func (b *B) empty(ctx context.Context, tbl string) bool {
	var one int
	err := b.pool.QueryRow(ctx, `SELECT 1 FROM `+tbl+` LIMIT 1`).Scan(&one)
	return err == pgx.ErrNoRows
}

// reclaim truncates sealed segments that are done with: LOCK NOWAIT so
// that nothing queues behind a lock a held transaction keeps.
func (b *B) reclaim(ctx context.Context, p *phase, done func(*seg) bool) {
	for _, s := range p.live() {
		if s == p.current() || time.Since(s.sealedAt) < 500*time.Millisecond || !done(s) {
			continue
		}
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return
		}
		_, err = tx.Exec(ctx, `LOCK TABLE `+s.tbl+` IN ACCESS EXCLUSIVE MODE NOWAIT`)
		if err == nil {
			_, err = tx.Exec(ctx, `TRUNCATE `+s.tbl)
		}
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			tx.Rollback(ctx)
		}
		p.mu.Lock()
		for i, x := range p.sealed {
			if x == s {
				p.sealed = append(p.sealed[:i], p.sealed[i+1:]...)
				break
			}
		}
		if err == nil {
			atomic.AddInt64(&b.truncOK, 1)
			p.free = append(p.free, s.tbl)
		} else {
			// Locked by someone (a held transaction): abandon it for now;
			// a real design retries it later and drops extras.
			atomic.AddInt64(&b.truncBusy, 1)
			if !strings.Contains(err.Error(), "55P03") && !strings.Contains(err.Error(), "lock") {
				log.Println("truncate:", err)
			}
		}
		p.mu.Unlock()
	}
}
