package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// openAt returns a driver on a fresh prefix migrated up to version (0:
// the latest) and not converted: the prefix as a release whose newest
// migration was version left it, its jobs in the one table {p}jobs.
// Dropped at the end.
func openAt(t *testing.T, version int) *Driver {
	t.Helper()
	ctx := context.Background()
	d, err := Open(ctx, testdb.Postgres(t), driver.Options{Prefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.DropAll(context.Background()); err != nil {
			t.Errorf("drop: %v", err)
		}
		d.Close()
	})
	if version == 0 {
		version = len(d.migrations)
	}
	applied, err := d.MigrateTo(ctx, version)
	if err != nil || len(applied) != version {
		t.Fatalf("migrate to %d: applied %v, %v", version, applied, err)
	}
	return d
}

// oldJob is a row of the one table, as an earlier version wrote it.
type oldJob struct {
	queue, state        string
	attempt, maxAttempt int
	fence               int64
	scheduledIn         time.Duration // from now
	lease               bool          // running: a lease an hour ahead
	finished            bool          // finalized now
	errs                int           // attempt errors recorded
	uniqueKey           string
	meta                string
}

// insertOld writes j into d's one table with SQL of its own (an earlier
// version's process) and returns its id.
func insertOld(t *testing.T, d *Driver, j oldJob) int64 {
	t.Helper()
	errs := "[]"
	if j.errs > 0 {
		errs = `[{"attempt": 1, "at": "2024-01-01T00:00:00Z", "error": "boom"}]`
	}
	var key, meta any
	if j.uniqueKey != "" {
		key = []byte(j.uniqueKey)
	}
	if j.meta != "" {
		meta = j.meta
	}
	var id int64
	err := d.pool.QueryRow(context.Background(), `INSERT INTO `+d.prefix+`jobs
		(queue, kind, args, state, attempt, max_attempts, fence, scheduled_at, attempted_at, attempted_by,
		 lease_expires_at, finalized_at, errors, unique_key, unique_keep, meta)
		VALUES ($1, 'k', '{"n": 1}', $2, $3, $4, $5, now() + $6 * interval '1 microsecond',
		        CASE WHEN $3 > 0 THEN now() END, CASE WHEN $3 > 0 THEN 'old-worker' END,
		        CASE WHEN $7 THEN now() + interval '1 hour' END, CASE WHEN $8 THEN now() END,
		        $9::jsonb, $10, 0, $11::jsonb)
		RETURNING id`,
		j.queue, j.state, j.attempt, j.maxAttempt, j.fence, micros(j.scheduledIn), j.lease, j.finished, errs, key, meta).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestConvertFromOneTable: a database an earlier version left at
// migration 9, its jobs in every state in the one table (one running,
// one unique, one with metadata), is converted by Migrate (migrations 10
// to 12, then the conversion). Every job is still there with its state,
// attempt, fence, lease, schedule, errors and metadata, and workable:
// the running attempt's fence completes it, the available job is
// claimed, the unique key is still held, a cancelled job is retried, a
// scheduled one cancelled, and new ids go on after the old ones.
func TestConvertFromOneTable(t *testing.T) {
	ctx := context.Background()
	d := openAt(t, 9)
	if cur, latest, err := d.SchemaVersion(ctx); err != nil || cur != 9 || latest != len(d.migrations) {
		t.Fatalf("schema version %d/%d %v at migration 9", cur, latest, err)
	}
	ids := map[string]int64{}
	for name, j := range map[string]oldJob{
		"avail":     {queue: "avail", state: driver.StateAvailable, maxAttempt: 3},
		"sched":     {queue: "sched", state: driver.StateScheduled, maxAttempt: 3, scheduledIn: time.Hour},
		"running":   {queue: "run", state: driver.StateRunning, attempt: 1, maxAttempt: 3, fence: 1700000000000001, lease: true},
		"retry":     {queue: "retry", state: driver.StateRetryable, attempt: 1, maxAttempt: 3, fence: 7, scheduledIn: time.Hour, errs: 1},
		"done":      {queue: "done", state: driver.StateCompleted, attempt: 1, maxAttempt: 3, fence: 8, finished: true},
		"dead":      {queue: "dead", state: driver.StateDiscarded, attempt: 3, maxAttempt: 3, fence: 9, finished: true, errs: 1},
		"cancelled": {queue: "cancel", state: driver.StateCancelled, maxAttempt: 3, finished: true},
		"uniq":      {queue: "uniq", state: driver.StateAvailable, maxAttempt: 3, uniqueKey: "key-1"},
		"meta":      {queue: "meta", state: driver.StateAvailable, maxAttempt: 3, meta: `{"tenant": "a"}`},
	} {
		ids[name] = insertOld(t, d, j)
	}
	// The jobs as the one table holds them, in id order.
	rows, err := d.pool.Query(ctx, `SELECT id, queue, state, attempt, fence, scheduled_at, lease_expires_at,
		jsonb_array_length(errors), meta::text FROM `+d.prefix+`jobs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id           int64
		queue, state string
		attempt      int
		fence        int64
		scheduledAt  time.Time
		lease        *time.Time
		errs         int
		meta         *string
	}
	before, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.queue, &x.state, &x.attempt, &x.fence, &x.scheduledAt, &x.lease, &x.errs, &x.meta)
	})
	if err != nil || len(before) != len(ids) {
		t.Fatalf("%d jobs in the one table, %v", len(before), err)
	}

	// A process of this version on the unconverted prefix is told to
	// migrate.
	if _, err := d.Insert(ctx, []driver.InsertParams{pj("early")}); !errors.Is(err, driver.ErrSchemaOutdated) {
		t.Fatalf("insert before the conversion: %v, want ErrSchemaOutdated", err)
	}
	var want []int
	for v := 10; v <= len(d.migrations); v++ {
		want = append(want, v)
	}
	applied, err := d.Migrate(ctx)
	if err != nil || !slices.Equal(applied, want) {
		t.Fatalf("upgrade from version 9: applied %v, %v", applied, err)
	}
	if cur, latest, err := d.SchemaVersion(ctx); err != nil || cur != latest {
		t.Fatalf("schema version %d/%d %v after Migrate", cur, latest, err)
	}
	var gone bool
	if err := d.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", d.prefix+"jobs").Scan(&gone); err != nil || !gone {
		t.Fatalf("%sjobs still exists after the conversion (%v)", d.prefix, err)
	}
	if again, err := d.Migrate(ctx); err != nil || len(again) != 0 {
		t.Fatalf("Migrate again: applied %v, %v", again, err)
	}
	after, err := d.ListJobs(ctx, driver.JobFilter{})
	if err != nil || len(after) != len(before) {
		t.Fatalf("listed %d jobs after the conversion, %v; want %d", len(after), err, len(before))
	}
	for i, b := range before {
		a := after[i]
		lease := b.lease != nil && a.LeaseExpiresAt.Equal(*b.lease) || b.lease == nil && a.LeaseExpiresAt.IsZero()
		meta := b.meta == nil && a.Meta == nil || b.meta != nil && a.Meta != nil && strings.ReplaceAll(string(a.Meta), " ", "") == strings.ReplaceAll(*b.meta, " ", "")
		if a.ID != b.id || a.Queue != b.queue || a.State != b.state || a.Attempt != b.attempt || a.Fence != b.fence ||
			!a.ScheduledAt.Equal(b.scheduledAt) || !lease || len(a.Errors) != b.errs || !meta {
			t.Errorf("job %d: before %+v\nafter %+v", b.id, b, a)
		}
	}

	// Workable: the running attempt completes with its fence...
	if applied, err := d.Complete(ctx, []driver.Outcome{{ID: ids["running"], Fence: 1700000000000001, Attempt: 1, State: driver.StateCompleted}}); err != nil || len(applied) != 1 {
		t.Fatalf("the running job's fence did not complete it after the conversion: %v %v", applied, err)
	}
	// ... the available job is claimed...
	if js, err := d.Claim(ctx, driver.ClaimParams{Queue: "avail", Limit: 5, Lease: time.Minute, Worker: "w"}); err != nil || len(js) != 1 || js[0].ID != ids["avail"] {
		t.Fatalf("claim after the conversion: %v %v, want job %d", js, err, ids["avail"])
	}
	// ... the unique key is still held by its job...
	u := pj("uniq")
	u.UniqueKey = []byte("key-1")
	if got, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u}); err != nil || !dup[0] || got[0] != ids["uniq"] {
		t.Fatalf("unique key after the conversion: %v %v %v, want held by job %d", got, dup, err, ids["uniq"])
	}
	// ... a cancelled job is retried and a scheduled one cancelled...
	if j, err := d.Retry(ctx, ids["cancelled"]); err != nil || j.State != driver.StateAvailable {
		t.Fatalf("retry of the cancelled job: %+v %v", j, err)
	}
	if j, err := d.Cancel(ctx, ids["sched"]); err != nil || j.State != driver.StateCancelled {
		t.Fatalf("cancel of the scheduled job: %+v %v", j, err)
	}
	// ... and new jobs take ids after the old ones.
	next, err := d.Insert(ctx, []driver.InsertParams{pj("new")})
	if err != nil || next[0] <= before[len(before)-1].id {
		t.Fatalf("a new job's id %v (%v), want more than the old table's last %d", next, err, before[len(before)-1].id)
	}
}

// TestConvertKeptTable: a prefix that an earlier version migrated past
// migration 10 but kept on its one table (migrations up to 11 recorded,
// the registry empty) reports schema version 9, so that a client of this
// version asks for Migrate; the driver's statements refuse with
// ErrSchemaOutdated meanwhile. Migrate applies no migration, converts
// it, and its job is claimed.
func TestConvertKeptTable(t *testing.T) {
	ctx := context.Background()
	d := openAt(t, 0)
	id := insertOld(t, d, oldJob{queue: "kept", state: driver.StateAvailable, maxAttempt: 3})
	if cur, latest, err := d.SchemaVersion(ctx); err != nil || cur != segmentsVersion-1 || latest != len(d.migrations) {
		t.Fatalf("schema version %d/%d %v of a kept prefix, want %d/%d", cur, latest, err, segmentsVersion-1, len(d.migrations))
	}
	if _, err := d.Claim(ctx, driver.ClaimParams{Queue: "kept", Limit: 2, Lease: time.Minute, Worker: "w"}); !errors.Is(err, driver.ErrSchemaOutdated) ||
		!strings.Contains(err.Error(), "migrate") {
		t.Fatalf("claim on a kept prefix: %v, want ErrSchemaOutdated naming migrate", err)
	}
	if applied, err := d.Migrate(ctx); err != nil || len(applied) != 0 {
		t.Fatalf("converting a kept table: applied %v, %v", applied, err)
	}
	if cur, latest, err := d.SchemaVersion(ctx); err != nil || cur != latest {
		t.Fatalf("schema version %d/%d %v after the conversion", cur, latest, err)
	}
	js, err := d.Claim(ctx, driver.ClaimParams{Queue: "kept", Limit: 2, Lease: time.Minute, Worker: "w"})
	if err != nil || len(js) != 1 || js[0].ID != id {
		t.Fatalf("claim after the conversion: %v %v, want job %d", js, err, id)
	}
}

// TestConvertBesideHeldLock: a transaction holds a lock on {p}jobs (as
// pg_dump does) through the conversion's attempts. An earlier version's
// inserts into the table keep completing meanwhile (each attempt waits
// in the lock queue for 200 ms at most), the conversion fails naming the
// held lock and leaves the prefix on the one table, and it succeeds once
// the lock is gone.
func TestConvertBesideHeldLock(t *testing.T) {
	ctx := context.Background()
	d := openAt(t, 9)
	hold, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, "SELECT count(*) FROM "+d.prefix+"jobs"); err != nil {
		t.Fatal(err)
	}
	saved := convertLockFor
	convertLockFor = 2 * time.Second
	defer func() { convertLockFor = saved }()
	conv, err := Open(ctx, testdb.Postgres(t), driver.Options{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer conv.Close()
	migrated := make(chan error, 1)
	go func() {
		_, err := conv.Migrate(ctx)
		migrated <- err
	}()
	inserts := 0
	for {
		select {
		case err = <-migrated:
		default:
			ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, ierr := d.pool.Exec(ictx, "INSERT INTO "+d.prefix+"jobs (queue, kind) VALUES ('beside', 'k')")
			cancel()
			if ierr != nil {
				t.Fatalf("insert %d while the conversion tried its lock: %v", inserts, ierr)
			}
			inserts++
			continue
		}
		break
	}
	if err == nil || !strings.Contains(err.Error(), "another transaction held a lock") {
		t.Fatalf("conversion beside a held lock: %v", err)
	}
	if cur, _, err := conv.SchemaVersion(ctx); err != nil || cur != segmentsVersion-1 || inserts == 0 {
		t.Fatalf("after the refused conversion: schema version %d (%v), %d inserts", cur, err, inserts)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conv.Migrate(ctx); err != nil {
		t.Fatalf("conversion after the lock was released: %v", err)
	}
	st, err := conv.Stats(ctx)
	if err != nil || len(st) != 1 || st[0].Queue != "beside" || st[0].Counts[driver.StateAvailable] != int64(inserts) {
		t.Fatalf("stats after the conversion: %+v %v, want the %d jobs inserted available", st, err, inserts)
	}
}

// The connections of the pools conveyor makes keep generic plans
// (force_generic_plan); a DSN that names a plan_cache_mode keeps it; on
// an application's pool (New), the lease pool gets the generic mode and
// the application's own connections are left as they are.
func TestPlanCacheMode(t *testing.T) {
	ctx := context.Background()
	all := func(modes []string, want string) bool {
		for _, m := range modes {
			if m != want {
				return false
			}
		}
		return len(modes) > 0
	}
	d := open(t, driver.Options{})
	n := int(d.pool.Config().MaxConns)
	if m := planModesOf(t, d.pool, n); !all(m, planGeneric) {
		t.Errorf("pool modes %v, want %s", m, planGeneric)
	}
	if m := planModesOf(t, d.lease, leaseConns); !all(m, planGeneric) {
		t.Errorf("lease pool modes %v, want %s", m, planGeneric)
	}

	dsn := testdb.Postgres(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	own, err := Open(ctx, dsn+sep+"plan_cache_mode=force_custom_plan", driver.Options{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if m := planModesOf(t, own.pool, n); !all(m, "force_custom_plan") {
		t.Errorf("DSN plan_cache_mode=force_custom_plan: pool modes %v", m)
	}
	if m := planModesOf(t, own.lease, leaseConns); !all(m, "force_custom_plan") {
		t.Errorf("DSN plan_cache_mode=force_custom_plan: lease pool modes %v", m)
	}

	app, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	server := planModesOf(t, app, 1)[0]
	nd, err := New(ctx, app, nil, driver.Options{Prefix: d.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	if m := planModesOf(t, nd.lease, leaseConns); !all(m, planGeneric) {
		t.Errorf("New: lease pool modes %v, want %s", m, planGeneric)
	}
	if m := planModesOf(t, app, int(app.Config().MaxConns)); !all(m, server) {
		t.Errorf("New: the application's pool modes %v, want its own %s", m, server)
	}
}

// TestMaintain: rotation and reclaim are the leader's Maintain, not a
// side effect of Promote. A current ready segment grown past its size
// stays current through Promote; Maintain seals it (reporting it), and
// once its jobs are claimed the next round reclaims it (truncated and
// free again). A round within segMaintEvery of the last one does
// nothing.
func TestMaintain(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	s.tune.sealBytes, s.tune.grace = 8<<10, 0
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := v.cur[phReady].tbl
	jobs := make([]driver.InsertParams, 200)
	for i := range jobs {
		jobs[i] = pj("m")
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Promote(ctx, 1000); err != nil {
		t.Fatal(err)
	}
	if st := status(t, d, a); st != "current" {
		t.Fatalf("after Promote the full segment %s is %s, want current: Promote rotates nothing", a, st)
	}
	s.lastMaint = time.Now().Add(time.Hour) // as if a round had just run
	if report, err := d.Maintain(ctx); err != nil || len(report) != 0 || status(t, d, a) != "current" {
		t.Fatalf("Maintain within segMaintEvery of the last round: %v, %v, %s is %s", report, err, a, status(t, d, a))
	}
	s.lastMaint = time.Time{}
	report, err := d.Maintain(ctx)
	if err != nil || report["sealed"] < 1 {
		t.Fatalf("Maintain of a full segment: %v, %v; want it sealed", report, err)
	}
	if st := status(t, d, a); st != "sealed" {
		t.Fatalf("after Maintain the full segment %s is %s, want sealed", a, st)
	}
	if got := claimN(t, d, "m", len(jobs)); len(got) != len(jobs) {
		t.Fatalf("claimed %d of %d jobs from the sealed segment", len(got), len(jobs))
	}
	s.lastMaint = time.Time{}
	report, err = d.Maintain(ctx)
	if err != nil || report["reclaimed"] < 1 {
		t.Fatalf("Maintain of a drained-out sealed segment: %v, %v; want it reclaimed", report, err)
	}
	if st, n := status(t, d, a), rowsIn(t, d, a); st != "free" || n != 0 {
		t.Fatalf("after the reclaim %s is %s with %d rows, want free and empty", a, st, n)
	}
}
