package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// The JSON fields the issue requires of every run.
var requiredFields = []string{"workload", "backend", "workers", "jobs", "seconds", "jobs_per_s",
	"p50_ms", "p95_ms", "p99_ms", "max_ms", "lost", "duplicates", "reorder_max", "reorder_p99", "waits"}

func checkJSON(t *testing.T, r *Result) {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range requiredFields {
		if _, ok := m[f]; !ok {
			t.Errorf("%s: JSON lacks %q: %s", r.label(), f, b)
		}
	}
	if _, ok := m["waits"].(map[string]any); !ok {
		t.Errorf("%s: waits is not an object: %s", r.label(), b)
	}
}

func TestRequiredJSONFieldsOnZeroResult(t *testing.T) {
	checkJSON(t, &Result{Waits: map[string]any{}})
}

func sqliteDSNForTest(t *testing.T) string {
	return filepath.Join(t.TempDir(), "bench.db")
}

// small returns options for a quick run of workload on dsn.
func small(dsn, workload string) Options {
	return Options{
		DSN: dsn, Workload: workload, Workers: 4, Jobs: 200, Interval: time.Millisecond,
		Counts: []int{1, 4}, Producers: 2, Window: 8, Timeout: 2 * time.Minute,
		Strategies: ClaimStrategies,
	}
}

// checkRuns checks the results every workload must satisfy: no lost or
// duplicated job where duplicates are not the point, the required JSON,
// and the contention figure of the backend.
func checkRuns(t *testing.T, backend string, rs []*Result) {
	t.Helper()
	for _, r := range rs {
		checkJSON(t, r)
		if r.Backend != backend {
			t.Errorf("%s: backend %q, want %q", r.label(), r.Backend, backend)
		}
		if r.Lost != 0 {
			t.Errorf("%s: %d lost (%v)", r.label(), r.Lost, r.LostSeqs)
		}
		if r.Settings["server_version"] == "" || r.Settings["cores"] == "" {
			t.Errorf("%s: settings lack the server version or cores: %v", r.label(), r.Settings)
		}
		switch backend {
		case "sqlite":
			if _, ok := r.Waits["busy_retries"]; !ok {
				t.Errorf("%s: waits lack busy_retries: %v", r.label(), r.Waits)
			}
		case "postgres":
			if _, ok := r.Waits["events"].(map[string]WaitEvent); !ok {
				t.Errorf("%s: waits lack sampled events: %v", r.label(), r.Waits)
			}
			if _, ok := r.Waits["deadlocks"]; !ok {
				t.Errorf("%s: waits lack deadlocks: %v", r.label(), r.Waits)
			}
		case "mysql":
			if _, ok := r.Waits["row_lock_waits"]; !ok {
				t.Errorf("%s: waits lack row_lock_waits: %v", r.label(), r.Waits)
			}
		}
		if e, ok := r.Waits["error"]; ok {
			t.Errorf("%s: waits: %v", r.label(), e)
		}
	}
}

func runWorkloads(t *testing.T, dsn, backend string) {
	ctx := context.Background()
	t.Run("sweep", func(t *testing.T) {
		o := small(dsn, "sweep")
		o.Jobs = 30
		var emitted int
		o.Emit = func(*Result) { emitted++ }
		rs, err := RunAll(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 || emitted != 2 || rs[0].Workers != 1 || rs[1].Workers != 4 || rs[0].Of != "latency" || rs[0].Workload != "sweep" {
			t.Fatalf("sweep: %d results (%d emitted): %+v", len(rs), emitted, rs)
		}
		for _, r := range rs {
			if r.Jobs != 30 || r.Duplicates != 0 {
				t.Errorf("%s: jobs %d duplicates %d", r.label(), r.Jobs, r.Duplicates)
			}
		}
		checkRuns(t, backend, rs)
	})
	t.Run("flow-bulk", func(t *testing.T) {
		o := small(dsn, "flow")
		o.Mode = "bulk"
		rs, err := RunAll(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].Mode != "bulk" || rs[0].Jobs < 100 || rs[0].Jobs%100 != 0 || rs[0].EnqueuedPerS <= 0 || rs[0].Duplicates != 0 {
			t.Fatalf("flow bulk: %+v", rs)
		}
		checkRuns(t, backend, rs)
	})
	t.Run("isolation", func(t *testing.T) {
		o := small(dsn, "isolation")
		o.Jobs = 20
		rs, err := RunAll(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 3 || rs[0].Phase != "cold-idle" || rs[1].Phase != "cold-under-hot" || rs[2].Phase != "hot" {
			t.Fatalf("isolation: %d results", len(rs))
		}
		for _, r := range rs[:2] {
			if r.Jobs != 20 || r.Duplicates != 0 {
				t.Errorf("%s: jobs %d duplicates %d", r.label(), r.Jobs, r.Duplicates)
			}
		}
		if rs[2].Jobs < 500 || rs[2].Duplicates != 0 || rs[1].HotBacklogMin == nil {
			t.Errorf("hot: jobs %d (want at least the 500 prefilled) duplicates %d backlog reported %t", rs[2].Jobs, rs[2].Duplicates, rs[1].HotBacklogMin != nil)
		}
		checkRuns(t, backend, rs)
	})
	t.Run("claims", func(t *testing.T) {
		rs, err := RunAll(ctx, small(dsn, "claims"))
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != len(ClaimStrategies) {
			t.Fatalf("claims: %d results, want %d", len(rs), len(ClaimStrategies))
		}
		for i, r := range rs {
			c := r.Claims
			if r.Strategy != ClaimStrategies[i] || c == nil || r.Jobs != 200 || r.Workers != 4 {
				t.Fatalf("claims %d: %+v", i, r)
			}
			// Every duplicate execution is accounted for by a completion
			// that was rolled back after the job ran.
			if r.Duplicates != c.DeadlockDuplicates+c.TimeoutDuplicates {
				t.Errorf("%s: %d duplicates, %d+%d rolled-back completions", r.Strategy, r.Duplicates, c.DeadlockDuplicates, c.TimeoutDuplicates)
			}
			switch r.Strategy {
			case "conveyor", "conveyor-b1":
				if r.Duplicates != 0 {
					t.Errorf("%s: %d duplicates", r.Strategy, r.Duplicates)
				}
			default:
				if c.Rounds < 200 || c.RoundsPerJob < 1 || c.Collisions > c.Rounds {
					t.Errorf("%s: rounds %d (%.2f/job), collisions %d", r.Strategy, c.Rounds, c.RoundsPerJob, c.Collisions)
				}
			}
			if r.Strategy == "random" && c.Window != 8 {
				t.Errorf("random: window %d, want 8", c.Window)
			}
		}
		checkRuns(t, backend, rs)
	})
	t.Run("limits", func(t *testing.T) {
		o := small(dsn, "limits")
		o.Workers = 40 // the held phase needs more workers than its 10 slots
		rs, err := RunAll(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"unlimited", "limit-above", "limit-10", "rate", "key-rate"}
		if len(rs) != len(want) {
			t.Fatalf("limits: %d results, want %d", len(rs), len(want))
		}
		for i, r := range rs {
			if r.Phase != want[i] || r.Duplicates != 0 {
				t.Fatalf("limits %d: phase %q duplicates %d", i, r.Phase, r.Duplicates)
			}
		}
		// The held phases are held, and as measured outside the queue.
		if p := rs[2].PeakRunning; p > 10 || p < 2 || rs[2].Limits == nil || rs[2].Limits.MaxRunning != 10 {
			t.Errorf("limit-10: peak %d running (want 2 to 10), limits %+v", p, rs[2].Limits)
		}
		if w := rs[3].MaxStartsInWindow; w > limitsRate || w < limitsRate/2 || rs[3].Seconds < 1.5 {
			t.Errorf("rate: %d claims in a period over %.1fs, want at most %d and a run of about 3s", w, rs[3].Seconds, limitsRate)
		}
		// Each key held to its rate, by the database's clock, and the
		// waits after a key's window opened measured.
		if r := rs[4]; r.KeyMaxStartsInWindow > limitsKeyRate || r.KeyMaxStartsInWindow < limitsKeyRate/2 || r.Seconds < 1.5 || r.PickupN == 0 || r.Lost != 0 {
			t.Errorf("key-rate: %d claims of one key in a period over %.1fs, %d pick-up waits, %d lost; want at most %d, a run of about 2s, waits measured",
				r.KeyMaxStartsInWindow, r.Seconds, r.PickupN, r.Lost, limitsKeyRate)
		}
		checkRuns(t, backend, rs)
	})
	t.Run("keys", func(t *testing.T) {
		o := small(dsn, "keys")
		rs, err := RunAll(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"small-keys", "flood", "fair-small-keys", "fair-flood", "unlimited", "key-limit-1", "ordered-1000", "ordered-deep", "ordered-wide", "fair-weights"}
		if len(rs) != len(want) {
			t.Fatalf("keys: %d results, want %d", len(rs), len(want))
		}
		for i, r := range rs {
			if r.Phase != want[i] || r.Duplicates != 0 || r.Lost != 0 {
				t.Fatalf("keys %d: phase %q lost %d duplicates %d", i, r.Phase, r.Lost, r.Duplicates)
			}
		}
		// Counted by the handlers: one job of a key at a time where the
		// limit is 1, at most 5 of the flooded key, and the small keys'
		// latency measured.
		for _, r := range rs[5:9] {
			if r.KeyPeakRunning != 1 || r.KeyReorders != 0 && r.Limits.Ordered {
				t.Errorf("%s: %d of one key at once, %d out of order", r.Phase, r.KeyPeakRunning, r.KeyReorders)
			}
		}
		smallJobs := int64(keysSmallKeys * keysSmallJobs)
		if p := rs[1].KeyPeakRunning; p < 1 || p > keysFloodLimit || rs[1].SmallJobs != smallJobs || rs[0].SmallJobs != smallJobs {
			t.Errorf("flood: %d of the flooded key at once (want 1 to %d), small keys' p99 %.2f ms (alone %.2f ms)", p, keysFloodLimit, rs[1].SmallP99ms, rs[0].SmallP99ms)
		}
		// Fair: the small keys' latency measured beside the flood, and the
		// weighed keys' starts in the ratio of their weights.
		if rs[3].SmallJobs != smallJobs || rs[2].SmallJobs != smallJobs || rs[3].Limits == nil || !rs[3].Limits.Fair {
			t.Errorf("fair-flood: small keys' p99 %.2f ms (alone %.2f ms), limits %+v", rs[3].SmallP99ms, rs[2].SmallP99ms, rs[3].Limits)
		}
		if r := rs[9]; r.Limits == nil || !r.Limits.Fair || r.ShareRatio < 2 || r.ShareRatio > 4 || r.KeyShares["heavy"] == 0 || r.KeyShares["light"] == 0 {
			t.Errorf("fair-weights: limits %+v, starts %v, ratio %.2f; want fair, about 3:1", r.Limits, r.KeyShares, r.ShareRatio)
		}
		checkRuns(t, backend, rs)
	})
}

func TestWorkloadsSQLite(t *testing.T) {
	runWorkloads(t, sqliteDSNForTest(t), "sqlite")
}

func TestWorkloadsPostgres(t *testing.T) {
	runWorkloads(t, testdb.Postgres(t), "postgres")
}

func TestWorkloadsMySQL(t *testing.T) {
	runWorkloads(t, testdb.MySQL(t), "mysql")
}

func TestUnknownWorkloadAndStrategy(t *testing.T) {
	dsn := sqliteDSNForTest(t)
	if _, err := RunAll(context.Background(), Options{DSN: dsn, Workload: "nope"}); err == nil {
		t.Error("unknown workload accepted")
	}
	if _, err := RunAll(context.Background(), Options{DSN: dsn, Workload: "claims", Strategies: []string{"nope"}}); err == nil {
		t.Error("unknown strategy accepted")
	}
	if _, err := RunAll(context.Background(), Options{DSN: dsn, Workload: "sweep", Of: "claims"}); err == nil {
		t.Error("sweep of claims accepted")
	}
	if _, err := RunAll(context.Background(), Options{DSN: dsn, Workload: "flow", Mode: "nope"}); err == nil {
		t.Error("unknown mode accepted")
	}
	if _, err := RunAll(context.Background(), Options{DSN: dsn, Workload: "isolation", Mode: "bulk"}); err == nil {
		t.Error("isolation's producers accepted bulk, a flow mode")
	}
}

func TestDSNHelpers(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u@h/db": "postgres", "postgresql://h/db": "postgres", "mysql://root@h:3306/db": "mysql",
		"./x.db": "sqlite", "sqlite:x.db": "sqlite", "file:x.db?mode=rwc": "sqlite", "/tmp/x.db": "sqlite",
	} {
		if got := backendOf(dsn); got != want {
			t.Errorf("backendOf(%q) = %q, want %q", dsn, got, want)
		}
	}
	for in, want := range map[string]string{
		"/tmp/x.db":          "/tmp/x.db?a=1&b=2",
		"sqlite:/tmp/x.db":   "/tmp/x.db?a=1&b=2",
		"sqlite:///tmp/x.db": "/tmp/x.db?a=1&b=2",
		"file:x.db?mode=rwc": "file:x.db?mode=rwc&a=1&b=2",
	} {
		if got := sqliteDSN(in, "a=1", "b=2"); got != want {
			t.Errorf("sqliteDSN(%q) = %q, want %q", in, got, want)
		}
	}
	cfg, err := mysqlConfig("mysql://bob:secret@db.example:3307/app?timeout=5s")
	if err != nil || cfg.User != "bob" || cfg.Passwd != "secret" || cfg.Addr != "db.example:3307" || cfg.DBName != "app" || cfg.Timeout != 5*time.Second {
		t.Errorf("mysqlConfig: %+v, %v", cfg, err)
	}
	if cfg, err := mysqlConfig("mysql://root@localhost/app"); err != nil || cfg.Addr != "localhost:3306" {
		t.Errorf("mysqlConfig default port: %+v, %v", cfg, err)
	}
	if _, err := mysqlConfig("mysql://root@localhost/"); err == nil {
		t.Error("mysqlConfig accepted a DSN without a database")
	}
	if got := dollar("UPDATE t SET a = ? WHERE id = ? AND v = ?"); got != "UPDATE t SET a = $1 WHERE id = $2 AND v = $3" {
		t.Errorf("dollar: %q", got)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want errKind
	}{
		{&pgconn.PgError{Code: "40P01"}, errDeadlock},
		{&pgconn.PgError{Code: "55P03"}, errLockTimeout},
		{&pgconn.PgError{Code: "40001"}, errSerialization},
		{&pgconn.PgError{Code: "23505"}, errOther},
		{fmt.Errorf("wrapped: %w", &gomysql.MySQLError{Number: 1213}), errDeadlock},
		{&gomysql.MySQLError{Number: 1205}, errLockTimeout},
		{errors.New("other"), errOther},
		{nil, errOther},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestPSDelta(t *testing.T) {
	before := map[string][2]int64{"wait/a": {1, 1e9}, "wait/b": {5, 0}}
	after := map[string][2]int64{"wait/a": {3, 4e9}, "wait/b": {5, 0}, "wait/c": {2, 1e9}}
	got := psDelta(before, after)
	if len(got) != 2 || got["wait/a"] != (PSWait{Count: 2, MS: 3}) || got["wait/c"] != (PSWait{Count: 2, MS: 1}) {
		t.Fatalf("psDelta: %v", got)
	}
}

func TestTopWaitsAndCounters(t *testing.T) {
	r := &Result{Waits: map[string]any{
		"events":    map[string]WaitEvent{"CPU": {3, 0.3}, "Lock/tuple": {7, 0.7}},
		"deadlocks": int64(2), "samples": int64(10),
		"client": map[string]int64{"deadlock_retries": 1},
	}}
	top := TopWaits(r, 1)
	if len(top) != 1 || top[0].Event != "Lock/tuple" || top[0].Count != 7 {
		t.Fatalf("TopWaits: %+v", top)
	}
	c := WaitCounters(r)
	if len(c) != 2 || c[0] != "client(deadlock_retries=1)" || c[1] != "deadlocks=2" {
		t.Fatalf("WaitCounters: %q", c)
	}
}
