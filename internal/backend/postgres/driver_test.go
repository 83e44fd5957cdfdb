package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver for InsertTx tests

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
)

func TestDriver(t *testing.T) {
	dsn := testdb.Postgres(t)
	drivertest.Run(t, testdb.Prefix, func(t *testing.T, prefix string) driver.Driver {
		d, err := Open(context.Background(), dsn, driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// open returns a migrated driver on a fresh prefix, dropped at the end.
func open(t *testing.T, opts driver.Options) *Driver {
	t.Helper()
	dsn := testdb.Postgres(t)
	if opts.Prefix == "" {
		opts.Prefix = testdb.Prefix()
	}
	d, err := Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Migrate(context.Background()); err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.DropAll(context.Background()); err != nil {
			t.Errorf("drop: %v", err)
		}
		d.Close()
	})
	return d
}

func pj(queue string) driver.InsertParams {
	return driver.InsertParams{Queue: queue, Kind: "k", Args: json.RawMessage(`{"b": 2, "a": [1,2]}`), MaxAttempts: 3}
}

// collect receives notifications from l until quiet for the given time.
func collect(t *testing.T, l driver.Listener, quiet time.Duration) []string {
	t.Helper()
	var got []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		q, err := l.Wait(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			sort.Strings(got)
			return got
		}
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		got = append(got, q)
	}
}

func TestOpenRejectsOtherSchemes(t *testing.T) {
	_, err := Open(context.Background(), "mysql://root@127.0.0.1/test", driver.Options{Prefix: "conveyor_"})
	if err == nil || !strings.Contains(err.Error(), "postgres://") {
		t.Fatalf("open with mysql DSN: %v", err)
	}
}

func TestPoolSize(t *testing.T) {
	d := open(t, driver.Options{PoolSize: 3})
	if got := d.Pool().Config().MaxConns; got != 3 {
		t.Fatalf("MaxConns %d, want 3", got)
	}
	d2 := open(t, driver.Options{})
	if got, want := d2.Pool().Config().MaxConns, int32(max(8, 4*runtime.GOMAXPROCS(0))); got != want {
		t.Fatalf("default MaxConns %d, want %d", got, want)
	}
}

func TestInsertOrderAndSchedule(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	past := pj("q")
	past.RunAt = time.Now().Add(-time.Hour)
	future := pj("q")
	future.RunAt = time.Now().Add(time.Hour)
	delayed := pj("q")
	delayed.Delay = time.Hour
	noArgs := pj("other")
	noArgs.Args = nil
	in := []driver.InsertParams{future, pj("q"), past, delayed, noArgs}
	in[1].Priority = 7
	in[1].TimeoutMS = 1234
	ids, err := d.Insert(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(in) {
		t.Fatalf("got %d ids", len(ids))
	}
	wantState := []string{driver.StateScheduled, driver.StateAvailable, driver.StateAvailable, driver.StateScheduled, driver.StateAvailable}
	for i, id := range ids {
		j, err := d.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != wantState[i] || j.Queue != in[i].Queue || j.Priority != in[i].Priority || j.TimeoutMS != in[i].TimeoutMS {
			t.Fatalf("job %d (input %d): %+v", id, i, j)
		}
		if i > 0 && id <= ids[i-1] {
			t.Fatalf("ids not ascending in input order: %v", ids)
		}
	}
	j, _ := d.GetJob(ctx, ids[0])
	if !j.ScheduledAt.Equal(future.RunAt.Truncate(time.Microsecond)) && j.ScheduledAt.Sub(future.RunAt).Abs() > time.Microsecond {
		t.Fatalf("run_at %v stored as %v", future.RunAt, j.ScheduledAt)
	}
	if string(j.Args) != `{"b": 2, "a": [1,2]}` {
		t.Fatalf("args not kept verbatim: %s", j.Args)
	}
	if j.Errors != nil || j.CreatedAt.IsZero() || !j.AttemptedAt.IsZero() {
		t.Fatalf("fresh job: %+v", j)
	}
	j, _ = d.GetJob(ctx, ids[3])
	if d := time.Until(j.ScheduledAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("delay of an hour scheduled %v ahead", d)
	}
}

func TestInsertNotifiesOncePerQueue(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	l, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	later := pj("later")
	later.Delay = time.Hour
	var in []driver.InsertParams
	for i := 0; i < 50; i++ {
		in = append(in, pj("a"), pj("b"), later)
	}
	if _, err := d.Insert(ctx, in); err != nil {
		t.Fatal(err)
	}
	got := collect(t, l, 300*time.Millisecond)
	if fmt.Sprint(got) != "[a b]" {
		t.Fatalf("notifications %v, want one each for a and b (none for a queue with only scheduled jobs)", got)
	}

	// Bulk insert notifies once per queue as well.
	in = in[:0]
	for i := 0; i < 500; i++ {
		in = append(in, pj("c"), later)
	}
	if n, err := d.BulkInsert(ctx, in); err != nil || n != 1000 {
		t.Fatalf("bulk insert %d %v", n, err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[c]" {
		t.Fatalf("bulk notifications %v, want [c]", got)
	}
	st, _ := d.Stats(ctx)
	for _, s := range st {
		if s.Queue == "later" && s.Counts[driver.StateScheduled] != 550 {
			t.Fatalf("scheduled count %v", s.Counts)
		}
	}

	// Promote wakes the queue it made jobs available in.
	p := pj("soon")
	p.Delay = 50 * time.Millisecond
	if _, err := d.Insert(ctx, []driver.InsertParams{p, p}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 200*time.Millisecond); len(got) != 0 {
		t.Fatalf("scheduled insert notified %v", got)
	}
	if m, err := d.Promote(ctx, 10); err != nil || m["soon"] != 2 {
		t.Fatalf("promote %v %v", m, err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[soon]" {
		t.Fatalf("promote notifications %v", got)
	}
}

func TestInsertTx(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	l, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	if _, err := d.InsertTx(ctx, "not a tx", []driver.InsertParams{pj("x")}); !errors.Is(err, driver.ErrTxType) || !strings.Contains(err.Error(), "string") {
		t.Fatalf("wrong tx type: %v", err)
	}

	// pgx.Tx: rolled back leaves nothing and wakes nobody.
	tx, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{pj("tx"), pj("tx")})
	if err != nil || len(ids) != 2 {
		t.Fatalf("insert tx: %v %v", ids, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("rolled-back job exists: %v", err)
	}
	if got := collect(t, l, 200*time.Millisecond); len(got) != 0 {
		t.Fatalf("rolled back insert notified %v", got)
	}

	// pgx.Tx committed by the caller.
	tx, _ = d.Pool().Begin(ctx)
	ids, err = d.InsertTx(ctx, tx, []driver.InsertParams{pj("tx"), pj("tx")})
	if err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 200*time.Millisecond); len(got) != 0 {
		t.Fatalf("notified before commit: %v", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[tx]" {
		t.Fatalf("commit notifications %v", got)
	}
	if j, err := d.GetJob(ctx, ids[1]); err != nil || j.State != driver.StateAvailable {
		t.Fatalf("committed job: %+v %v", j, err)
	}

	// *sql.Tx from the pgx stdlib driver.
	db, err := sql.Open("pgx", testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	delayed := pj("sql")
	delayed.Delay = time.Minute
	ids, err = d.InsertTx(ctx, stx, []driver.InsertParams{pj("sql"), delayed, pj("sql2")})
	if err != nil || len(ids) != 3 || ids[0] >= ids[1] || ids[1] >= ids[2] {
		t.Fatalf("insert sql tx: %v %v", ids, err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[sql sql2]" {
		t.Fatalf("sql tx notifications %v", got)
	}
	if j, _ := d.GetJob(ctx, ids[1]); j == nil || j.State != driver.StateScheduled {
		t.Fatalf("delayed job via sql tx: %+v", j)
	}
}

func TestCompleteStatesAndErrors(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	ids, _ := d.Insert(ctx, []driver.InsertParams{pj("q"), pj("q"), pj("q")})
	claimed, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 3, Lease: time.Minute, Worker: "w"})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim %d %v", len(claimed), err)
	}
	fence := drivertest.Fences(claimed)
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	out := []driver.Outcome{
		{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateDiscarded, Err: &driver.AttemptError{Attempt: 1, At: at, Error: `quote " and \ back`}},
		{ID: ids[1], Fence: fence[ids[1]], Attempt: 1, State: driver.StateCancelled},
		{ID: ids[2], Fence: fence[ids[2]], Attempt: 1, State: driver.StateRetryable, RetryIn: 0, Err: &driver.AttemptError{Attempt: 1, At: at, Error: "e1"}},
	}
	applied, err := d.Complete(ctx, out)
	if err != nil || len(applied) != 3 {
		t.Fatalf("complete %v %v", applied, err)
	}
	j, _ := d.GetJob(ctx, ids[0])
	if j.State != driver.StateDiscarded || j.FinalizedAt.IsZero() || len(j.Errors) != 1 || !j.Errors[0].At.Equal(at) || j.Errors[0].Error != `quote " and \ back` {
		t.Fatalf("discarded: %+v", j)
	}
	j, _ = d.GetJob(ctx, ids[1])
	if j.State != driver.StateCancelled || j.FinalizedAt.IsZero() || j.Errors != nil {
		t.Fatalf("cancelled: %+v", j)
	}
	// Second attempt of the retryable job appends a second error.
	if m, _ := d.Promote(ctx, 10); m["q"] != 1 {
		t.Fatalf("promote %v", m)
	}
	rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: 3, Lease: time.Minute, Worker: "w"})
	if len(rows) != 1 || rows[0].Attempt != 2 || len(rows[0].Errors) != 1 || rows[0].Errors[0].Error != "e1" {
		t.Fatalf("reclaimed: %+v", rows)
	}
	applied, _ = d.Complete(ctx, []driver.Outcome{{ID: ids[2], Fence: rows[0].Fence, Attempt: 2, State: driver.StateDiscarded, Err: &driver.AttemptError{Attempt: 2, At: at, Error: "e2", Trace: "t"}}})
	j, _ = d.GetJob(ctx, ids[2])
	if len(applied) != 1 || len(j.Errors) != 2 || j.Errors[1].Error != "e2" || j.Errors[1].Trace != "t" || j.Errors[1].Attempt != 2 {
		t.Fatalf("second error: %+v", j)
	}
	if _, err := d.Complete(ctx, []driver.Outcome{{ID: ids[2], Fence: rows[0].Fence, Attempt: 2, State: "running"}}); err == nil {
		t.Fatal("complete accepted state running")
	}
}

func TestClaimReturnsFullRows(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	p := pj("full")
	p.Priority, p.MaxAttempts, p.TimeoutMS = 2, 9, 5000
	ids, _ := d.Insert(ctx, []driver.InsertParams{p})
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "full", Limit: 5, Lease: 10 * time.Second, Worker: "host:1"})
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim %v %v", rows, err)
	}
	r := rows[0]
	g, _ := d.GetJob(ctx, ids[0])
	if r.ID != g.ID || r.Queue != g.Queue || r.Kind != g.Kind || string(r.Args) != string(g.Args) || r.State != g.State ||
		r.Priority != 2 || r.MaxAttempts != 9 || r.TimeoutMS != 5000 || r.Attempt != 1 || r.AttemptedBy != g.AttemptedBy ||
		!r.ScheduledAt.Equal(g.ScheduledAt) || !r.CreatedAt.Equal(g.CreatedAt) || !r.AttemptedAt.Equal(g.AttemptedAt) ||
		!r.LeaseExpiresAt.Equal(g.LeaseExpiresAt) || !r.FinalizedAt.IsZero() {
		t.Fatalf("claimed row %+v differs from stored %+v", r, g)
	}
	if lease := r.LeaseExpiresAt.Sub(r.AttemptedAt); lease != 10*time.Second {
		t.Fatalf("lease %v", lease)
	}
}

func TestRescueErrorAndNotify(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	l, _ := d.Listen(ctx)
	defer l.Close()
	ids, _ := d.Insert(ctx, []driver.InsertParams{pj("r")})
	collect(t, l, 200*time.Millisecond)
	d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Millisecond, Worker: "host-7"})
	time.Sleep(20 * time.Millisecond)
	if m, err := d.Rescue(ctx, 10); err != nil || m["r"] != 1 {
		t.Fatalf("rescue %v %v", m, err)
	}
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[r]" {
		t.Fatalf("rescue notifications %v", got)
	}
	j, _ := d.GetJob(ctx, ids[0])
	if len(j.Errors) != 1 || j.Errors[0].Error != "lease expired: host-7 stopped heartbeating" || j.Errors[0].Attempt != 1 ||
		time.Since(j.Errors[0].At).Abs() > time.Minute {
		t.Fatalf("rescue error: %+v", j.Errors)
	}
}

func TestListenReconnectAndClose(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	li, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := li.(*listener)
	pid := l.conn.PgConn().PID()

	// Kill the listener's backend: Wait reconnects and reports "".
	if _, err := d.Pool().Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	q, err := l.Wait(wctx)
	cancel()
	if err != nil || q != "" {
		t.Fatalf("wait after kill: %q %v; want \"\" nil", q, err)
	}
	if d.Counters()["listen_reconnects"] != 1 {
		t.Fatalf("counters %v", d.Counters())
	}
	if l.conn.PgConn().PID() == pid {
		t.Fatal("same backend after reconnect")
	}
	// Still subscribed after the reconnect.
	d.Insert(ctx, []driver.InsertParams{pj("after")})
	if got := collect(t, l, 300*time.Millisecond); fmt.Sprint(got) != "[after]" {
		t.Fatalf("after reconnect %v", got)
	}

	// Close interrupts a blocked Wait, and nothing is left running.
	before := runtime.NumGoroutine()
	done := make(chan error)
	go func() {
		_, err := l.Wait(context.Background())
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("wait returned nil after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt Wait")
	}
	if _, err := l.Wait(ctx); err == nil {
		t.Fatal("wait on closed listener succeeded")
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("goroutines %d after close, %d before", n, before)
	}
}

func TestListenQuietPeriodsPing(t *testing.T) {
	old := listenPingInterval
	listenPingInterval = 100 * time.Millisecond
	defer func() { listenPingInterval = old }()
	d := open(t, driver.Options{})
	ctx := context.Background()
	li, err := d.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer li.Close()
	// Quiet periods with a healthy connection do not end Wait.
	wctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	_, err = li.Wait(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("quiet wait: %v", err)
	}
	d.Insert(ctx, []driver.InsertParams{pj("ping")})
	if got := collect(t, li, 300*time.Millisecond); fmt.Sprint(got) != "[ping]" {
		t.Fatalf("after pings %v", got)
	}
}

func TestMigrateConcurrentAndTooNew(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var ds []*Driver
	for i := 0; i < 4; i++ {
		d, err := Open(ctx, dsn, driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	defer func() {
		ds[0].DropAll(ctx)
		for _, d := range ds {
			d.Close()
		}
	}()
	if cur, latest, err := ds[0].SchemaVersion(ctx); err != nil || cur != 0 || latest < 1 {
		t.Fatalf("fresh schema version %d/%d %v", cur, latest, err)
	}
	var wg sync.WaitGroup
	results := make([][]int, len(ds))
	errs := make([]error, len(ds))
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = d.Migrate(ctx)
		}()
	}
	wg.Wait()
	total := 0
	for i := range ds {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(results[i])
	}
	if total != len(ds[0].migrations) {
		t.Fatalf("concurrent migrators applied %v, want each version once", results)
	}
	// The prefix was converted once: one current segment per phase, and
	// the one table of earlier versions is gone.
	var segs int
	if err := ds[0].Pool().QueryRow(ctx, "SELECT count(*) FROM "+prefix+"segments").Scan(&segs); err != nil || segs != len(phases) {
		t.Fatalf("%d segments registered after concurrent migrations (%v), want %d", segs, err, len(phases))
	}
	var gone bool
	if err := ds[0].Pool().QueryRow(ctx, "SELECT to_regclass($1) IS NULL", prefix+"jobs").Scan(&gone); err != nil || !gone {
		t.Fatalf("%sjobs still exists after Migrate (%v)", prefix, err)
	}
	for i, d := range ds {
		if cur, latest, err := d.SchemaVersion(ctx); err != nil || cur != latest {
			t.Fatalf("migrator %d: schema version %d/%d %v after Migrate", i, cur, latest, err)
		}
	}

	if _, err := ds[0].Pool().Exec(ctx, fmt.Sprintf("INSERT INTO %sschema_migrations (version) VALUES (99)", prefix)); err != nil {
		t.Fatal(err)
	}
	_, err := ds[1].Migrate(ctx)
	if !errors.Is(err, driver.ErrSchemaTooNew) || !strings.Contains(err.Error(), "99") {
		t.Fatalf("migrate on newer schema: %v", err)
	}
	if cur, _, _ := ds[1].SchemaVersion(ctx); cur != 99 {
		t.Fatalf("schema version %d", cur)
	}
}

func TestServerInfoAndCapabilities(t *testing.T) {
	d := open(t, driver.Options{})
	info, err := d.ServerInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"backend", "server_version", "synchronous_commit", "fsync", "wal_level", "max_connections", "shared_buffers"} {
		if info[k] == "" {
			t.Fatalf("server info lacks %s: %v", k, info)
		}
	}
	if c := d.Capabilities(); !c.Listen || d.Name() != "postgres" {
		t.Fatalf("capabilities %+v", c)
	}
	for _, k := range []string{"deadlock_retries", "lock_timeouts"} {
		if _, ok := d.Counters()[k]; !ok {
			t.Fatalf("counters lack %s", k)
		}
	}
}

func TestRetryOnDeadlock(t *testing.T) {
	d := open(t, driver.Options{})
	calls := 0
	err := d.retryable(context.Background(), func() error {
		calls++
		if calls < 3 {
			// Provoke a real server error with the deadlock SQLSTATE.
			_, err := d.Pool().Exec(context.Background(), `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'deadlock_detected'; END $$`)
			return err
		}
		return nil
	})
	if err != nil || calls != 3 || d.Counters()["deadlock_retries"] != 2 {
		t.Fatalf("retry: err %v calls %d counters %v", err, calls, d.Counters())
	}
}

func TestPruneAndLead(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	ids, _ := d.Insert(ctx, []driver.InsertParams{pj("p"), pj("p"), pj("p")})
	claimed, _ := d.Claim(ctx, driver.ClaimParams{Queue: "p", Limit: 3, Lease: time.Minute, Worker: "w"})
	fence := drivertest.Fences(claimed)
	d.Complete(ctx, []driver.Outcome{
		{ID: ids[0], Fence: fence[ids[0]], Attempt: 1, State: driver.StateCompleted},
		{ID: ids[1], Fence: fence[ids[1]], Attempt: 1, State: driver.StateDiscarded},
		{ID: ids[2], Fence: fence[ids[2]], Attempt: 1, State: driver.StateCancelled},
	})
	time.Sleep(20 * time.Millisecond)
	if n, err := d.Prune(ctx, -1, time.Millisecond, 10); err != nil || n != 2 {
		t.Fatalf("prune discarded/cancelled only: %d %v", n, err)
	}
	if _, err := d.GetJob(ctx, ids[0]); err != nil {
		t.Fatalf("completed job pruned with negative age: %v", err)
	}
	if n, _ := d.Prune(ctx, time.Millisecond, -1, 10); n != 1 {
		t.Fatalf("prune completed: %d", n)
	}
	if ok, err := d.TryLead(ctx, "x", time.Minute); !ok || err != nil {
		t.Fatalf("lead %v %v", ok, err)
	}
}

func TestArrayLiteralsRoundTrip(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	tricky := []driver.InsertParams{
		{Queue: `we"ird\q`, Kind: "{a,b}", Args: json.RawMessage(`{"s":"a\"b\\c {x}, NULL","u":"é✓"}`), MaxAttempts: 1, Priority: -3},
		{Queue: "NULL", Kind: " spaced ", Args: json.RawMessage(`[1, "}" ,null]`), MaxAttempts: 1, TimeoutMS: -1, RunAt: time.Date(2001, 2, 3, 4, 5, 6, 789123000, time.FixedZone("x", 3600))},
		{Queue: "", Kind: "", Args: json.RawMessage(`"\\"`), MaxAttempts: 1},
	}
	ids, err := d.Insert(ctx, tricky)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		j, err := d.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		w := tricky[i]
		if j.Queue != w.Queue || j.Kind != w.Kind || string(j.Args) != string(w.Args) || j.Priority != w.Priority || j.TimeoutMS != w.TimeoutMS {
			t.Fatalf("round trip %d: got %q %q %s %d %d", i, j.Queue, j.Kind, j.Args, j.Priority, j.TimeoutMS)
		}
		if !w.RunAt.IsZero() && !j.ScheduledAt.Equal(w.RunAt) {
			t.Fatalf("run at %v stored as %v", w.RunAt, j.ScheduledAt)
		}
	}
	rows, _ := d.Claim(ctx, driver.ClaimParams{Queue: `we"ird\q`, Limit: 1, Lease: time.Minute, Worker: "w"})
	if len(rows) != 1 {
		t.Fatalf("claim tricky queue: %d", len(rows))
	}
	msg := "line1\n\"quoted\" \\ {brace}, NULL é"
	applied, err := d.Complete(ctx, []driver.Outcome{{ID: rows[0].ID, Fence: rows[0].Fence, Attempt: 1, State: driver.StateDiscarded, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: msg, Trace: "t\tx"}}})
	if err != nil || len(applied) != 1 {
		t.Fatalf("complete %v %v", applied, err)
	}
	j, _ := d.GetJob(ctx, rows[0].ID)
	if len(j.Errors) != 1 || j.Errors[0].Error != msg || j.Errors[0].Trace != "t\tx" {
		t.Fatalf("errors %+v", j.Errors)
	}
}

// ListJobsTx reads with a *sql.Tx of the pgx stdlib driver as with a
// pgx.Tx: the same jobs, the same fields.
func TestListJobsTxDatabaseSQL(t *testing.T) {
	d := open(t, driver.Options{})
	ctx := context.Background()
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("q")})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := d.ClaimJob(ctx, ids[0], time.Minute, "w")
	if err != nil {
		t.Fatal(err)
	}
	fail := driver.Outcome{ID: ids[0], Fence: claimed.Fence, Attempt: 1, State: driver.StateRetryable, RetryIn: time.Hour, Err: &driver.AttemptError{Attempt: 1, At: time.Now(), Error: "boom"}}
	if _, err := d.Complete(ctx, []driver.Outcome{fail}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	more, err := d.InsertTx(ctx, stx, []driver.InsertParams{pj("q")})
	if err != nil {
		t.Fatal(err)
	}
	viaSQL, err := d.ListJobsTx(ctx, stx, driver.JobFilter{States: []string{driver.StateRetryable, driver.StateAvailable}})
	if err != nil || len(viaSQL) != 2 || viaSQL[1].ID != more[0] {
		t.Fatalf("list in a *sql.Tx: %d jobs %v, want the retryable one and the one inserted", len(viaSQL), err)
	}
	ptx, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ptx.Rollback(ctx)
	viaPgx, err := d.ListJobsTx(ctx, ptx, driver.JobFilter{})
	if err != nil || len(viaPgx) != 1 {
		t.Fatalf("list in a pgx.Tx: %d jobs %v", len(viaPgx), err)
	}
	a, b := viaSQL[0], viaPgx[0]
	if a.State != driver.StateRetryable || a.AttemptedBy != "w" || len(a.Errors) != 1 || a.Errors[0].Error != "boom" || a.LeaseExpiresAt != (time.Time{}) {
		t.Fatalf("retryable job read in a *sql.Tx: %+v", a)
	}
	var aa, ba any
	json.Unmarshal(a.Args, &aa)
	json.Unmarshal(b.Args, &ba)
	if fmt.Sprint(aa) != fmt.Sprint(ba) || a.Queue != b.Queue || a.Kind != b.Kind || a.Fence != b.Fence || a.Attempt != b.Attempt ||
		!a.ScheduledAt.Equal(b.ScheduledAt) || !a.CreatedAt.Equal(b.CreatedAt) || !a.AttemptedAt.Equal(b.AttemptedAt) || !a.FinalizedAt.Equal(b.FinalizedAt) ||
		fmt.Sprint(a.Errors) != fmt.Sprint(b.Errors) {
		t.Fatalf("the same job read in a *sql.Tx and a pgx.Tx differs:\n%+v\n%+v", a, b)
	}
}

// TestDropAllLeavesNothing: DropAll removes every relation of its prefix
// (tables, segments, sequences, indexes), so that a bench or a test run
// leaves nothing behind in the user's database.
func TestDropAllLeavesNothing(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	prefix := testdb.Prefix()
	d, err := Open(ctx, dsn, driver.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.BulkInsert(ctx, []driver.InsertParams{pj("q")}); err != nil {
		t.Fatal(err)
	}
	count := func() (n int, names []string) {
		t.Helper()
		rows, err := d.pool.Query(ctx, `SELECT relname FROM pg_class WHERE starts_with(relname, $1) ORDER BY relname`, prefix)
		if err != nil {
			t.Fatal(err)
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return len(names), names
	}
	if n, _ := count(); n == 0 {
		t.Fatalf("no relation of prefix %s after Migrate and an insert", prefix)
	}
	if err := d.DropAll(ctx); err != nil {
		t.Fatal(err)
	}
	if n, names := count(); n != 0 {
		t.Errorf("%d relations left after DropAll: %v", n, names)
	}
}
