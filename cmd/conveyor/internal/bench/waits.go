package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// WaitEvent is one wait event's count of samples and its share of all
// session samples (Result.Waits["events"]).
type WaitEvent struct {
	// Count is the number of session samples in this event.
	Count int64 `json:"count"`
	// Share is Count over all active-session samples.
	Share float64 `json:"share"`
}

// SampleInterval is how often the wait sampler looks at the database's
// sessions.
const SampleInterval = 10 * time.Millisecond

// Wait sampling queries. The sampler has its own connection and counts
// the other active sessions of the bench's database; it asks nothing of
// conveyor's backend.
const (
	// An active session with no wait event is on CPU (or in a wait
	// PostgreSQL does not instrument).
	pgSampleSQL = `SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '')
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'`
	pgCountersSQL = `SELECT deadlocks, xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()`

	// Sessions by processlist state (MariaDB shows a session waiting for a
	// row lock as "Sending data" or "Updating"). InnoDB's innodb_trx would
	// say LOCK WAIT, but InnoDB refreshes that table only once it has gone
	// unread for 100ms, so a 10ms sampler would read a frozen snapshot: row
	// lock waits come from Innodb_row_lock_time instead (row_lock_waiting_avg).
	mySampleSQL = `SELECT COALESCE(NULLIF(state, ''), command)
FROM information_schema.processlist
WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command NOT IN ('Sleep', 'Daemon', 'Binlog Dump')`
	myStatusSQL   = `SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_deadlocks')`
	myMetricSQL   = `SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'lock_deadlocks'`
	myPSOnSQL     = `SELECT @@performance_schema`
	myPSWaitsSQL  = `SELECT EVENT_NAME, COUNT_STAR, SUM_TIMER_WAIT FROM performance_schema.events_waits_summary_global_by_event_name WHERE COUNT_STAR > 0`
	psPicoPerMS   = 1e9
	psTopEvents   = 10
	waitsGraceDur = 200 * time.Millisecond
)

// waits samples contention inside the database while a run lasts: wait
// events of the other active sessions every SampleInterval (PostgreSQL
// pg_stat_activity, MySQL processlist and innodb_trx), and deltas of the
// server's cumulative counters between start and finish. On SQLite there
// is nothing to sample: finish reports the client's busy retries.
type waits struct {
	backend string
	quit    chan struct{}
	done    chan struct{}

	pg *pgx.Conn
	my *sql.DB

	// Owned by the sampling goroutine until done is closed.
	events map[string]int64
	rounds int64
	active int64
	serr   error

	before   map[string]int64
	psBefore map[string][2]int64 // performance_schema: count, picoseconds
	psOn     bool
	note     string
	t0       time.Time
}

// startWaits starts sampling the database dsn names. Failing to sample
// is not fatal: the result then says why there are no samples.
func startWaits(ctx context.Context, dsn, backend string) *waits {
	w := &waits{backend: backend, quit: make(chan struct{}), done: make(chan struct{}), events: map[string]int64{}, t0: time.Now()}
	var sample func(context.Context) error
	switch backend {
	case "postgres":
		cfg, err := pgSideConfig(dsn)
		if err == nil {
			cfg.RuntimeParams["application_name"] = "conveyor-bench-sampler"
			w.pg, err = pgx.ConnectConfig(ctx, cfg)
		}
		if err != nil {
			w.note = "sampler: " + err.Error()
			break
		}
		w.before, w.note = w.pgCounters(ctx)
		sample = w.pgSample
	case "mysql":
		cfg, err := mysqlConfig(dsn)
		var conn driver.Connector
		if err == nil {
			conn, err = gomysql.NewConnector(cfg)
		}
		if err != nil {
			w.note = "sampler: " + err.Error()
			break
		}
		w.my = sql.OpenDB(conn)
		w.my.SetMaxOpenConns(1)
		w.before, w.note = w.myCounters(ctx)
		var on sql.NullInt64
		if err := w.my.QueryRowContext(ctx, myPSOnSQL).Scan(&on); err == nil && on.Int64 == 1 {
			w.psOn = true
			w.psBefore = w.psWaits(ctx)
		}
		sample = w.mySample
	}
	if sample == nil {
		close(w.done)
		return w
	}
	go func() {
		// stop waits for the sample in flight rather than cancel it: a
		// cancelled query costs pgx its connection, which finish needs.
		defer close(w.done)
		tick := time.NewTicker(SampleInterval)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := sample(ctx); err != nil {
					if ctx.Err() == nil {
						w.serr = err
					}
					return
				}
				w.rounds++
			}
		}
	}()
	return w
}

func (w *waits) pgSample(ctx context.Context) error {
	rows, err := w.pg.Query(ctx, pgSampleSQL)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var typ, ev string
		if err := rows.Scan(&typ, &ev); err != nil {
			return err
		}
		if ev != "" {
			typ += "/" + ev
		}
		w.events[typ]++
		w.active++
	}
	return rows.Err()
}

func (w *waits) pgCounters(ctx context.Context) (map[string]int64, string) {
	var dl, commits, rollbacks int64
	if err := w.pg.QueryRow(ctx, pgCountersSQL).Scan(&dl, &commits, &rollbacks); err != nil {
		return nil, "pg_stat_database: " + err.Error()
	}
	return map[string]int64{"deadlocks": dl, "commits": commits, "rollbacks": rollbacks}, ""
}

func (w *waits) mySample(ctx context.Context) error {
	rows, err := w.my.QueryContext(ctx, mySampleSQL)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		if err := rows.Scan(&state); err != nil {
			return err
		}
		w.events["state/"+state]++
		w.active++
	}
	return rows.Err()
}

func (w *waits) myCounters(ctx context.Context) (map[string]int64, string) {
	rows, err := w.my.QueryContext(ctx, myStatusSQL)
	if err != nil {
		return nil, "status: " + err.Error()
	}
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, "status: " + err.Error()
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "Innodb_row_lock_waits":
			m["row_lock_waits"] = n
		case "Innodb_row_lock_time":
			m["row_lock_time_ms"] = n
		case "Innodb_deadlocks":
			m["deadlocks"] = n
		}
	}
	if _, ok := m["deadlocks"]; !ok { // MySQL: no status variable, an InnoDB metric
		var n sql.NullInt64
		if err := w.my.QueryRowContext(ctx, myMetricSQL).Scan(&n); err == nil && n.Valid {
			m["deadlocks"] = n.Int64
		}
	}
	return m, ""
}

func (w *waits) psWaits(ctx context.Context) map[string][2]int64 {
	rows, err := w.my.QueryContext(ctx, myPSWaitsSQL)
	if err != nil {
		return nil
	}
	defer rows.Close()
	m := map[string][2]int64{}
	for rows.Next() {
		var ev string
		var n, t int64
		if rows.Scan(&ev, &n, &t) == nil {
			m[ev] = [2]int64{n, t}
		}
	}
	return m
}

// stop ends the sampling (call it when the measured work ends).
func (w *waits) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// finish stops the sampling if it still runs, reads the server's
// counters again (call it after the run's connections are closed, since
// PostgreSQL publishes a session's statistics at the latest when it
// ends), closes the sampler's connection and returns the Result.Waits
// object. counters are the client's own (busy retries, deadlock retries).
func (w *waits) finish(ctx context.Context, counters map[string]int64) map[string]any {
	w.stop()
	out := map[string]any{}
	if w.pg != nil || w.my != nil {
		evs := make(map[string]WaitEvent, len(w.events))
		for k, n := range w.events {
			evs[k] = WaitEvent{Count: n, Share: float64(n) / float64(max(1, w.active))}
		}
		out["events"] = evs
		out["samples"] = w.rounds
		out["active"] = w.active
		out["interval_ms"] = SampleInterval.Milliseconds()
	}
	var after map[string]int64
	var note string
	ctx = context.WithoutCancel(ctx)
	switch {
	case w.pg != nil:
		out["source"] = "pg_stat_activity (active sessions of this database but the sampler's), pg_stat_database deltas"
		time.Sleep(waitsGraceDur) // let closed sessions publish their statistics
		after, note = w.pgCounters(ctx)
		w.pg.Close(ctx)
	case w.my != nil:
		out["source"] = "information_schema.processlist (sessions of this database but the sampler's), SHOW GLOBAL STATUS deltas"
		after, note = w.myCounters(ctx)
		if w.psOn {
			out["performance_schema"] = psDelta(w.psBefore, w.psWaits(ctx))
		} else {
			out["performance_schema"] = "OFF"
		}
		w.my.Close()
	case w.backend == "sqlite":
		out["source"] = "client counters (SQLite has no wait statistics)"
		out["busy_retries"] = counters["busy_retries"]
	default:
		out["source"] = "none"
	}
	for k, v := range after {
		if b, ok := w.before[k]; ok {
			out[k] = v - b
		}
	}
	if t, ok := out["row_lock_time_ms"].(int64); ok {
		// Time waited for row locks over the run's time: the average
		// number of sessions waiting for a row lock.
		el := time.Since(w.t0).Milliseconds()
		out["row_lock_waiting_avg"] = float64(t) / float64(max(1, el))
	}
	if note != "" && w.note == "" {
		w.note = note
	}
	if w.note != "" {
		out["error"] = w.note
	}
	if w.serr != nil {
		out["error"] = "sampler: " + w.serr.Error()
	}
	client := map[string]int64{}
	for _, k := range []string{"deadlock_retries", "lock_timeouts", "serialization_retries", "busy_retries", "starved_writes", "claim_conflicts"} {
		if _, top := out[k]; top {
			continue
		}
		if v, ok := counters[k]; ok {
			client[k] = v
		}
	}
	if len(client) > 0 {
		out["client"] = client
	}
	return out
}

// PSWait is one performance_schema wait event's activity during a run.
type PSWait struct {
	// Count is the number of waits.
	Count int64 `json:"count"`
	// MS is the time waited, in milliseconds.
	MS float64 `json:"ms"`
}

// psDelta returns the psTopEvents events with the most wait time between
// two snapshots of events_waits_summary_global_by_event_name.
func psDelta(before, after map[string][2]int64) map[string]PSWait {
	type kv struct {
		k string
		v PSWait
	}
	var all []kv
	for k, a := range after {
		b := before[k]
		if n := a[0] - b[0]; n > 0 {
			all = append(all, kv{k, PSWait{Count: n, MS: float64(a[1]-b[1]) / psPicoPerMS}})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v.MS > all[j].v.MS })
	out := map[string]PSWait{}
	for i := 0; i < len(all) && i < psTopEvents; i++ {
		out[all[i].k] = all[i].v
	}
	return out
}

// TopWaits returns a result's wait events, most sampled first, at most n
// (all if n <= 0).
func TopWaits(r *Result, n int) []NamedWait {
	evs, _ := r.Waits["events"].(map[string]WaitEvent)
	out := make([]NamedWait, 0, len(evs))
	for k, v := range evs {
		out = append(out, NamedWait{Event: k, WaitEvent: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Event < out[j].Event
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// NamedWait is a wait event with its name, as TopWaits lists them.
type NamedWait struct {
	// Event names the wait event, as "type/event" on PostgreSQL.
	Event string
	WaitEvent
}

// WaitCounters returns a result's counted contention figures (deadlocks,
// lock waits, busy retries...) as "name=value" strings in a stable order.
func WaitCounters(r *Result) []string {
	var out []string
	keys := make([]string, 0, len(r.Waits))
	for k := range r.Waits {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch v := r.Waits[k].(type) {
		case string:
			switch k {
			case "error":
				out = append(out, "error: "+v)
			case "performance_schema":
				out = append(out, "performance_schema="+v)
			}
		case int64:
			if k != "samples" && k != "active" && k != "interval_ms" {
				out = append(out, fmt.Sprintf("%s=%d", k, v))
			}
		case float64:
			out = append(out, fmt.Sprintf("%s=%.2f", k, v))
		case map[string]int64:
			ks := make([]string, 0, len(v))
			for kk := range v {
				ks = append(ks, kk)
			}
			sort.Strings(ks)
			var parts []string
			for _, kk := range ks {
				parts = append(parts, fmt.Sprintf("%s=%d", kk, v[kk]))
			}
			out = append(out, k+"("+strings.Join(parts, " ")+")")
		}
	}
	return out
}
