package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ClaimStrategies are the strategies the claims workload knows:
//
//   - conveyor: conveyor's own claim, through the real client (a drain
//     with Workers as the queue's MaxWorkers).
//   - conveyor-b1: the same with Config.ClaimBatch 1.
//   - pessimistic: BEGIN; SELECT the first available job ... FOR UPDATE
//     (SQLite: BEGIN IMMEDIATE, its only lock); UPDATE it to running;
//     COMMIT; run it; DELETE it. A completion that fails (deadlock, lock
//     timeout) is treated as the job failing: the job is made available
//     again and runs again, as the frameworks that claim this way do.
//   - optimistic: read the first available job's id and version, then
//     UPDATE ... SET version = version + 1 WHERE id = ? AND version = ?;
//     0 rows means another worker took it: read again.
//   - random: as optimistic, picking at random among the first Window
//     available jobs.
//
// The last three run on a throw-away table of the bench's own, with one
// connection per worker at the server's default settings. They exist only
// in the bench, for comparison.
var ClaimStrategies = []string{"conveyor", "conveyor-b1", "pessimistic", "optimistic", "random"}

// DefaultStrategies are the strategies compared by default.
var DefaultStrategies = []string{"conveyor", "pessimistic", "optimistic", "random"}

// ClaimFigures are a claims run's contention figures.
type ClaimFigures struct {
	// Deadlocks the workers' statements failed with (PostgreSQL 40P01,
	// MySQL 1213); for conveyor, the deadlocks its driver retried.
	Deadlocks int64 `json:"deadlocks"`
	// LockTimeouts: lock waits that gave up (PostgreSQL 55P03, MySQL
	// 1205, SQLite busy); for conveyor, its driver's lock timeouts and
	// busy retries.
	LockTimeouts int64 `json:"lock_timeouts"`
	// DeadlockDuplicates counts completions rolled back by a deadlock
	// after the job ran; each made the job run again.
	DeadlockDuplicates int64 `json:"deadlock_duplicates"`
	// TimeoutDuplicates counts completions that failed on a lock timeout
	// (or SQLite busy) after the job ran; each made the job run again.
	TimeoutDuplicates int64 `json:"timeout_duplicates"`
	// Collisions: claim rounds that found their job taken by another
	// worker (optimistic: 0 rows updated; pessimistic: an empty result
	// while jobs were available). For conveyor on MySQL's optimistic
	// claim, its driver's claim conflicts.
	Collisions int64 `json:"collisions"`
	// Rounds is the number of claim rounds: statements or transactions
	// that tried to claim a job, idle polls excluded.
	Rounds int64 `json:"rounds"`
	// RoundsPerJob is Rounds per successful claim.
	RoundsPerJob float64 `json:"rounds_per_job"`
	// Window is the random strategy's window.
	Window int `json:"window,omitempty"`
}

// claims runs the same drain with each of o.Strategies and returns one
// result per strategy.
func claims(ctx context.Context, o Options) ([]*Result, error) {
	for _, s := range o.Strategies {
		if !isStrategy(s) {
			return nil, fmt.Errorf("bench: unknown claim strategy %q (%s)", s, strings.Join(ClaimStrategies, ", "))
		}
	}
	var rs []*Result
	var errs []error
	for _, s := range o.Strategies {
		var r *Result
		var err error
		switch s {
		case "conveyor", "conveyor-b1":
			r, err = conveyorClaims(ctx, o, s)
		default:
			r, err = rawClaims(ctx, o, s)
		}
		if r == nil {
			return rs, errors.Join(append(errs, err)...)
		}
		o.emit(r)
		rs = append(rs, r)
		if err != nil {
			// Duplicates are what some strategies are known for: report
			// them in the table, not as a failure of the bench; anything
			// else (lost jobs, errors) is a failure.
			if r.Lost > 0 || !strings.Contains(err.Error(), "duplicate") || r.Strategy == "conveyor" || r.Strategy == "conveyor-b1" {
				errs = append(errs, err)
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	return rs, errors.Join(errs...)
}

func isStrategy(s string) bool {
	for _, x := range ClaimStrategies {
		if s == x {
			return true
		}
	}
	return false
}

// conveyorClaims drains o.Jobs jobs with the real client.
func conveyorClaims(ctx context.Context, o Options, strategy string) (*Result, error) {
	ro := o
	ro.Workload, ro.label, ro.Emit = "drain", "claims "+strategy, nil
	if strategy == "conveyor-b1" {
		ro.Config.ClaimBatch = 1
	}
	r, err := Run(ctx, ro)
	if r == nil {
		return nil, err
	}
	r.Workload, r.Strategy = "claims", strategy
	c := r.Counters
	r.Claims = &ClaimFigures{
		Deadlocks:    c["deadlock_retries"],
		LockTimeouts: c["lock_timeouts"] + c["busy_retries"],
		Collisions:   c["claim_conflicts"],
	}
	return r, err
}

// claimSQL are one strategy table's statements, with ? placeholders.
type claimSQL struct {
	create       []string
	drop         string
	insert       string // one row's VALUES group follows
	first        string // pessimistic: the first available job, locked
	setRunning   string
	window       string // optimistic: the first N available jobs with versions
	claimVer     string
	complete     string
	release      string
	anyAvailable string
	placeholder  func(i int) string
}

func newClaimSQL(backend, table string) claimSQL {
	q := claimSQL{
		drop:         "DROP TABLE IF EXISTS " + table,
		insert:       "INSERT INTO " + table + " (seq, args) VALUES ",
		first:        "SELECT id, seq FROM " + table + " WHERE state = 'available' ORDER BY id LIMIT 1",
		setRunning:   "UPDATE " + table + " SET state = 'running' WHERE id = ?",
		window:       "SELECT id, seq, version FROM " + table + " WHERE state = 'available' ORDER BY id LIMIT ?",
		claimVer:     "UPDATE " + table + " SET state = 'running', version = version + 1 WHERE id = ? AND version = ?",
		complete:     "DELETE FROM " + table + " WHERE id = ?",
		release:      "UPDATE " + table + " SET state = 'available', version = version + 1 WHERE id = ?",
		anyAvailable: "SELECT 1 FROM " + table + " WHERE state = 'available' LIMIT 1",
	}
	idx := "CREATE INDEX " + table + "_state_id ON " + table + " (state, id)"
	switch backend {
	case "postgres":
		q.create = []string{"CREATE TABLE " + table + " (id bigserial PRIMARY KEY, seq bigint NOT NULL, state text NOT NULL DEFAULT 'available', version integer NOT NULL DEFAULT 0, args text NOT NULL DEFAULT '')", idx}
		q.first += " FOR UPDATE"
	case "mysql":
		q.create = []string{"CREATE TABLE " + table + " (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, seq BIGINT NOT NULL, state VARCHAR(16) NOT NULL DEFAULT 'available', version INT NOT NULL DEFAULT 0, args MEDIUMTEXT NOT NULL, KEY " + table + "_state_id (state, id)) ENGINE=InnoDB"}
		q.first += " FOR UPDATE"
	default: // SQLite: no FOR UPDATE; the transaction is BEGIN IMMEDIATE
		q.create = []string{"CREATE TABLE " + table + " (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'available', version INTEGER NOT NULL DEFAULT 0, args TEXT NOT NULL DEFAULT '')", idx}
	}
	if backend == "postgres" {
		for _, p := range []*string{&q.setRunning, &q.window, &q.claimVer, &q.complete, &q.release} {
			*p = dollar(*p)
		}
		q.placeholder = func(i int) string { return "$" + strconv.Itoa(i) }
	} else {
		q.placeholder = func(int) string { return "?" }
	}
	return q
}

// dollar numbers ? placeholders as $1, $2...
func dollar(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// rawClaim is one raw-SQL strategy run.
type rawClaim struct {
	strategy string
	q        claimSQL
	o        Options
	rec      *Recorder
	n        int64

	// Bookkeeping of the workers (not of the measured jobs' executions,
	// which the recorder keeps without shared state).
	done, claimed                                  atomic.Int64
	rounds, collisions, deadlocks, timeouts        atomic.Int64
	deadlockDups, timeoutDups, serializationErrors atomic.Int64
}

// rawClaims runs a raw-SQL strategy: o.Jobs rows in a fresh table, then
// o.Workers goroutines, each on its own connection, claim, run and delete
// them one at a time.
func rawClaims(ctx context.Context, o Options, strategy string) (*Result, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	db, backend, err := openRaw(ctx, o.DSN, o.Workers+1, o.Connect.SQLiteSynchronous)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	table := freshPrefix("bench") + "claims"
	rc := &rawClaim{strategy: strategy, q: newClaimSQL(backend, table), o: o, rec: NewRecorder(), n: int64(o.Jobs)}
	for _, s := range rc.q.create {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return nil, fmt.Errorf("bench: claims %s: create table: %w", strategy, err)
		}
	}
	dropped := false
	drop := func() error {
		if o.Keep || dropped {
			return nil
		}
		dropped = true
		_, err := db.ExecContext(context.WithoutCancel(ctx), rc.q.drop)
		return err
	}
	defer drop()
	if err := rc.fill(ctx, db); err != nil {
		return nil, fmt.Errorf("bench: claims %s: insert jobs: %w", strategy, err)
	}
	if o.Herd {
		if _, err := db.ExecContext(ctx, "UPDATE "+table+" SET state = 'scheduled'"); err != nil {
			return nil, fmt.Errorf("bench: claims %s: schedule jobs: %w", strategy, err)
		}
	}
	res := &Result{Workload: "claims", Strategy: strategy, Backend: backend, Workers: o.Workers}
	res.Settings = rawSettings(ctx, db, backend)
	res.Settings["cores"] = fmt.Sprint(runtime.NumCPU())
	res.Settings["gomaxprocs"] = fmt.Sprint(runtime.GOMAXPROCS(0))
	res.Settings["raw_claims"] = "own table with an index on (state, id); one connection per worker"

	conns := make([]*sql.Conn, o.Workers)
	for i := range conns {
		if conns[i], err = db.Conn(ctx); err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return nil, err
		}
	}
	w := startWaits(ctx, o.DSN, backend)
	stop := make(chan struct{})
	pwg := progress(o.Progress, "claims "+strategy, rc.n, rc.done.Load, stop)
	t0 := time.Now()
	var wg sync.WaitGroup
	var werr error
	var once sync.Once
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(t0.UnixNano()), uint64(i)))
			if err := rc.worker(ctx, conn, rng); err != nil {
				once.Do(func() { werr = err; cancel() })
			}
		}()
	}
	if o.Herd {
		// Every job becomes due at once, in one statement.
		t0 = time.Now()
		if _, err := db.ExecContext(ctx, "UPDATE "+table+" SET state = 'available' WHERE state = 'scheduled'"); err != nil {
			once.Do(func() { werr = fmt.Errorf("bench: claims %s: release the herd: %w", strategy, err); cancel() })
		}
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(stop)
	pwg.Wait()
	w.stop()
	for _, c := range conns {
		c.Close()
	}
	derr := drop()
	db.Close()
	var counters map[string]int64
	if backend == "sqlite" { // busy errors are SQLite's only contention figure
		counters = map[string]int64{"busy_retries": rc.timeouts.Load()}
	}
	res.Waits = w.finish(context.WithoutCancel(ctx), counters)
	fig := &ClaimFigures{
		Deadlocks:          rc.deadlocks.Load(),
		LockTimeouts:       rc.timeouts.Load(),
		DeadlockDuplicates: rc.deadlockDups.Load(),
		TimeoutDuplicates:  rc.timeoutDups.Load(),
		Collisions:         rc.collisions.Load(),
		Rounds:             rc.rounds.Load(),
	}
	if c := rc.claimed.Load(); c > 0 {
		fig.RoundsPerJob = float64(fig.Rounds) / float64(c)
	}
	if strategy == "random" {
		fig.Window = o.Window
		res.Settings["random_window"] = strconv.Itoa(o.Window)
	}
	res.Claims = fig
	ferr := res.fill(rc.rec.Summarize(), elapsed)
	if werr != nil || derr != nil {
		return res, errors.Join(werr, derr)
	}
	return res, ferr
}

// fill inserts the jobs in sequence order (ids follow sequence numbers)
// in one transaction.
func (rc *rawClaim) fill(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	pad := strings.Repeat("x", rc.o.ArgBytes)
	const chunk = 500
	first := rc.rec.Reserve(int(rc.n))
	t0 := time.Now()
	for off := int64(0); off < rc.n; off += chunk {
		k := min(chunk, rc.n-off)
		var b strings.Builder
		b.WriteString(rc.q.insert)
		args := make([]any, 0, 2*k)
		for i := int64(0); i < k; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(%s, %s)", rc.q.placeholder(int(2*i+1)), rc.q.placeholder(int(2*i+2)))
			args = append(args, first+off+i, pad)
		}
		if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	t1 := time.Now()
	for i := int64(0); i < rc.n; i++ {
		rc.rec.Enqueued(first+i, t0, t1)
	}
	return nil
}

// claim outcomes.
const (
	claimedJob = iota
	collided
	empty
)

// transient counts a deadlock, lock timeout, busy or serialization error
// and reports whether it is one (the statement is then retried).
func (rc *rawClaim) transient(err error) (errKind, bool) {
	k := classify(err)
	switch k {
	case errDeadlock:
		rc.deadlocks.Add(1)
	case errLockTimeout, errBusy:
		rc.timeouts.Add(1)
	case errSerialization:
		rc.serializationErrors.Add(1)
	default:
		return k, false
	}
	return k, true
}

func (rc *rawClaim) worker(ctx context.Context, conn *sql.Conn, rng *rand.Rand) error {
	work := rc.o.Work
	for rc.done.Load() < rc.n {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench: claims %s: %d of %d jobs done: %w", rc.strategy, rc.done.Load(), rc.n, err)
		}
		var id, seq int64
		var st int
		var err error
		if rc.strategy == "pessimistic" {
			id, seq, st, err = rc.claimPessimistic(ctx, conn)
		} else {
			n := 1
			if rc.strategy == "random" {
				n = rc.o.Window
			}
			id, seq, st, err = rc.claimOptimistic(ctx, conn, n, rng)
		}
		if err != nil {
			if _, ok := rc.transient(err); ok {
				continue
			}
			return fmt.Errorf("bench: claims %s: claim: %w", rc.strategy, err)
		}
		switch st {
		case collided:
			continue
		case empty:
			time.Sleep(time.Millisecond) // the rest are running
			continue
		}
		rc.rec.Started(seq, time.Now())
		simulate(work, rc.o.Spin)
		if _, err := conn.ExecContext(ctx, rc.q.complete, id); err != nil {
			k, ok := rc.transient(err)
			if !ok {
				return fmt.Errorf("bench: claims %s: complete: %w", rc.strategy, err)
			}
			// The delete was rolled back after the job ran: the worker
			// handles it as the job failing, and the job runs again.
			if k == errDeadlock {
				rc.deadlockDups.Add(1)
			} else {
				rc.timeoutDups.Add(1)
			}
			if err := rc.release(ctx, conn, id); err != nil {
				return err
			}
			continue
		}
		rc.done.Add(1)
	}
	return nil
}

// release makes a job available again, retrying transient errors.
func (rc *rawClaim) release(ctx context.Context, conn *sql.Conn, id int64) error {
	for {
		_, err := conn.ExecContext(ctx, rc.q.release, id)
		if err == nil {
			return nil
		}
		if _, ok := rc.transient(err); !ok {
			return fmt.Errorf("bench: claims %s: release: %w", rc.strategy, err)
		}
	}
}

// noJob classifies an empty read by asking the database whether any job
// is available: if one is, the round lost a race (for the pessimistic
// claim, PostgreSQL returns no row when the row it locked was claimed
// meanwhile) and counts as a collision; if none is, it is an idle poll
// (the remaining jobs are running).
func (rc *rawClaim) noJob(ctx context.Context, conn *sql.Conn) (int, error) {
	var one int
	err := conn.QueryRowContext(ctx, rc.q.anyAvailable).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return empty, nil
	case err != nil:
		return 0, err
	}
	rc.rounds.Add(1)
	rc.collisions.Add(1)
	return collided, nil
}

func (rc *rawClaim) claimPessimistic(ctx context.Context, conn *sql.Conn) (id, seq int64, st int, err error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, rc.q.first).Scan(&id, &seq); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			tx.Rollback()
			st, err := rc.noJob(ctx, conn)
			return 0, 0, st, err
		}
		rc.rounds.Add(1)
		return 0, 0, 0, err
	}
	rc.rounds.Add(1)
	if _, err := tx.ExecContext(ctx, rc.q.setRunning, id); err != nil {
		return 0, 0, 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, 0, err
	}
	rc.claimed.Add(1)
	return id, seq, claimedJob, nil
}

func (rc *rawClaim) claimOptimistic(ctx context.Context, conn *sql.Conn, window int, rng *rand.Rand) (id, seq int64, st int, err error) {
	rows, err := conn.QueryContext(ctx, rc.q.window, window)
	if err != nil {
		return 0, 0, 0, err
	}
	type cand struct{ id, seq, ver int64 }
	cands := make([]cand, 0, window)
	for rows.Next() {
		var c cand
		if err := rows.Scan(&c.id, &c.seq, &c.ver); err != nil {
			rows.Close()
			return 0, 0, 0, err
		}
		cands = append(cands, c)
	}
	if err := rows.Close(); err != nil {
		return 0, 0, 0, err
	}
	if err := rows.Err(); err != nil {
		return 0, 0, 0, err
	}
	if len(cands) == 0 {
		st, err := rc.noJob(ctx, conn)
		return 0, 0, st, err
	}
	c := cands[0]
	if len(cands) > 1 {
		c = cands[rng.IntN(len(cands))]
	}
	rc.rounds.Add(1)
	r, err := conn.ExecContext(ctx, rc.q.claimVer, c.id, c.ver)
	if err != nil {
		return 0, 0, 0, err
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, 0, 0, err
	}
	if n == 0 {
		rc.collisions.Add(1)
		return 0, 0, collided, nil
	}
	rc.claimed.Add(1)
	return c.id, c.seq, claimedJob, nil
}
