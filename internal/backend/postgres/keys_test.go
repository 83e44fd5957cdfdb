package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestMigrateKeysOnSegments applies migration 15 to a prefix whose jobs
// are already in segment tables (one converted by a release before key
// limits): every registered segment gets the lkey column, the ready ones
// the keyed claim's indexes, and the jobs already there keep working
// beside new keyed ones.
func TestMigrateKeysOnSegments(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("mk"), pj("mk")})
	if err != nil {
		t.Fatal(err)
	}
	tbls := undoKeys(t, d)
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tbls {
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_name = $1 AND column_name = 'lkey'", tbl).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s: lkey columns %d, %v", tbl, n, err)
		}
	}
	var idx int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname LIKE $1", d.prefix+"ready_%_key%idx").Scan(&idx); err != nil || idx == 0 {
		t.Fatalf("key indexes of the ready segments: %d, %v", idx, err)
	}
	// A process started after the migration (the statements this one
	// prepared name the tables as they were).
	o := openOther(t, d)
	keyed := pj("mk")
	keyed.Key = "tenant"
	more, err := o.Insert(ctx, []driver.InsertParams{keyed, keyed})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetQueueLimits(ctx, "mk", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := o.ClaimLimited(ctx, driver.ClaimParams{Queue: "mk", Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for _, row := range r.Rows {
		got[row.ID] = row.Key
	}
	if len(r.Rows) != 3 || got[ids[0]] != "" || got[ids[1]] != "" || got[more[0]] != "tenant" || !r.Held {
		t.Fatalf("claimed %v (held %v), want the 2 jobs from before and the key's first job", got, r.Held)
	}
}

// TestKeySlotSweep: Rescue frees a key slot whose attempt is no longer
// running under its fence, keeps a held one, and deletes free slots
// unused for a minute and those of a queue without key limits.
func TestKeySlotSweep(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	var jobs []driver.InsertParams
	for _, k := range []string{"a", "b", "c"} {
		j := pj("sw")
		j.Key = k
		jobs = append(jobs, j, j)
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.SetQueueLimits(ctx, "sw", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "sw", Limit: 2, Lease: time.Minute, Worker: "w"})
	if err != nil || len(r.Rows) != 2 {
		t.Fatalf("claimed %d, %v", len(r.Rows), err)
	}
	count := func(where string) int {
		t.Helper()
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.prefix+"key_slots WHERE queue = 'sw' AND "+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if held := count("fence IS NOT NULL"); held != 2 {
		t.Fatalf("%d key slots held, want 2", held)
	}
	// The first attempt's slot names a fence no attempt has (as left by
	// an end that did not free it); the second is held as it should be.
	if _, err := d.pool.Exec(ctx, "UPDATE "+d.prefix+"key_slots SET fence = fence + 1 WHERE job_id = $1", r.Rows[0].ID); err != nil {
		t.Fatal(err)
	}
	// A free slot unused for two minutes.
	if _, err := d.pool.Exec(ctx, "INSERT INTO "+d.prefix+"key_slots (queue, lkey, n, used_at) VALUES ('sw', 'old', 0, now() - interval '2 minutes')"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if held := count("fence IS NOT NULL"); held != 1 || count("job_id = "+itoa(r.Rows[1].ID)) != 1 {
		t.Fatalf("after the sweep: %d key slots held, want the second attempt's only", held)
	}
	if old := count("lkey = 'old'"); old != 0 {
		t.Fatalf("a free slot unused for two minutes was kept")
	}
	// Without key limits, every free slot goes; the held one stays.
	if err := d.SetQueueLimits(ctx, "sw", driver.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rescue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if free, all := count("job_id IS NULL"), count("true"); free != 0 || all != 1 {
		t.Fatalf("after the limits' removal: %d slots, %d free; want the held one only", all, free)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestKeyLimitLowered: attempts holding slots above a lowered
// KeyMaxRunning count against it until they end.
func TestKeyLimitLowered(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	var jobs []driver.InsertParams
	for i := 0; i < 6; i++ {
		j := pj("lo")
		j.Key = "a"
		jobs = append(jobs, j)
	}
	if _, err := d.Insert(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	claim := func() []*driver.JobRow {
		t.Helper()
		r, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: "lo", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Rows
	}
	complete := func(r *driver.JobRow) {
		t.Helper()
		if applied, err := d.Complete(ctx, []driver.Outcome{{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}}); err != nil || len(applied) != 1 {
			t.Fatalf("complete: %v, %v", applied, err)
		}
	}
	if err := d.SetQueueLimits(ctx, "lo", driver.QueueLimits{KeyMaxRunning: 3}); err != nil {
		t.Fatal(err)
	}
	running := claim()
	if len(running) != 3 {
		t.Fatalf("claimed %d under 3 per key", len(running))
	}
	if err := d.SetQueueLimits(ctx, "lo", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	// The attempt holding slot 0 ends: the slot below the new limit is
	// free, and the two above it still held.
	var first int64
	if err := d.pool.QueryRow(ctx, "SELECT job_id FROM "+d.prefix+"key_slots WHERE queue = 'lo' AND n = 0").Scan(&first); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(running, func(a, b *driver.JobRow) int {
		if a.ID == first {
			return -1
		}
		if b.ID == first {
			return 1
		}
		return 0
	})
	complete(running[0])
	if got := claim(); len(got) != 0 {
		t.Fatalf("claimed %d with 2 running under a limit lowered to 1", len(got))
	}
	complete(running[1])
	complete(running[2])
	if got := claim(); len(got) != 1 {
		t.Fatalf("claimed %d once none ran, want 1", len(got))
	}
}

// undoKeys takes d's prefix back to version 14, removing what migrations
// 18, 17, 16 and 15 add, and returns the segment tables.
func undoKeys(t *testing.T, d *Driver) []string {
	t.Helper()
	ctx := context.Background()
	var tbls []string
	rows, err := d.pool.Query(ctx, "SELECT tbl FROM "+d.prefix+"segments")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tbl string
		if err := rows.Scan(&tbl); err != nil {
			t.Fatal(err)
		}
		tbls = append(tbls, tbl)
	}
	rows.Close()
	if len(tbls) == 0 {
		t.Fatal("no segment tables")
	}
	undo := []string{
		"ALTER TABLE " + d.prefix + "limit_slots DROP COLUMN owner, DROP COLUMN owner_until",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 20",
		"DROP INDEX " + d.prefix + "batch_deps_dep_idx",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 19",
		"DROP INDEX " + d.prefix + "batch_jobs_job_idx, " + d.prefix + "batches_callback_idx",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 18",
		"ALTER TABLE " + d.prefix + "queues DROP COLUMN key_fair, DROP COLUMN key_weights",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 17",
		"ALTER TABLE " + d.prefix + "queues DROP COLUMN key_rate, DROP COLUMN key_rate_period_us",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 16",
		"DROP TABLE " + d.prefix + "key_slots",
		"ALTER TABLE " + d.prefix + "queues DROP COLUMN key_max_running, DROP COLUMN key_order",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 15",
	}
	for _, tbl := range tbls {
		undo = append(undo, "ALTER TABLE "+tbl+" DROP COLUMN lkey")
	}
	for _, q := range undo {
		if _, err := d.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if v, _, err := d.SchemaVersion(ctx); err != nil || v != 14 {
		t.Fatalf("version %d, %v; want 14", v, err)
	}
	return tbls
}

// TestMigrateKeysBesideHeldLock: a transaction holds a lock on the
// segment tables (as pg_dump does) through migration 15's attempts to
// alter them. Reads of the tables keep completing meanwhile (each
// attempt waits in the lock queue, where they would queue behind it, for
// a moment only), the migration fails naming the held
// lock and leaves the prefix at version 14, and it succeeds once the lock
// is gone.
func TestMigrateKeysBesideHeldLock(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	tbls := undoKeys(t, d)
	hold, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	for _, tbl := range tbls {
		if _, err := hold.Exec(ctx, "SELECT count(*) FROM "+tbl); err != nil {
			t.Fatal(err)
		}
	}
	saved := convertLockFor
	convertLockFor = 2 * time.Second
	defer func() { convertLockFor = saved }()
	migrated := make(chan error, 1)
	go func() {
		_, err := d.MigrateTo(ctx, 15)
		migrated <- err
	}()
	inserts := 0
	for {
		select {
		case err = <-migrated:
		default:
			ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, ierr := d.pool.Exec(ictx, "SELECT count(*) FROM "+tbls[inserts%len(tbls)])
			cancel()
			if ierr != nil {
				t.Fatalf("read %d while the migration tried its locks: %v", inserts, ierr)
			}
			inserts++
			continue
		}
		break
	}
	if err == nil || !strings.Contains(err.Error(), "held a lock the migration needs") {
		t.Fatalf("migration beside a held lock: %v", err)
	}
	if v, _, err := d.SchemaVersion(ctx); err != nil || v != 14 || inserts == 0 {
		t.Fatalf("after the refused migration: version %d (%v), %d reads", v, err, inserts)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatalf("migration after the lock was released: %v", err)
	}
	if v, latest, err := d.SchemaVersion(ctx); err != nil || v != latest {
		t.Fatalf("version %d, %v; want %d", v, err, latest)
	}
}

// TestKeySlotsAnalyzed: a maintenance round analyzes the key slots once
// they fill a page, and again once they doubled, so that the generic
// plans of the keyed claim's statements are made with their statistics
// (a plan made on a table of a few rows reads a queue's every slot for
// each slot a claim takes).
func TestKeySlotsAnalyzed(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	tbl := d.prefix + "key_slots"
	fill := func(from, to int) {
		t.Helper()
		if _, err := d.pool.Exec(ctx, "INSERT INTO "+tbl+" (queue, lkey, n) "+
			"SELECT 'q', 'k' || i, 0 FROM generate_series($1::int, $2::int) AS i", from, to-1); err != nil {
			t.Fatal(err)
		}
	}
	tuples := func() float64 {
		t.Helper()
		var n float64
		if err := d.pool.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", tbl).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	round := func() {
		t.Helper()
		s.lastMaint = time.Time{}
		if _, err := s.maintain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fill(0, 300)
	round()
	if n := tuples(); n != 300 {
		t.Fatalf("key slots: %v tuples in the statistics after a round, want 300", n)
	}
	fill(300, 2000)
	round()
	if n := tuples(); n != 2000 {
		t.Fatalf("key slots: %v tuples in the statistics after they grew, want 2000", n)
	}
}

// TestKeyWalkWindow: the walk that takes its keys from a window of the
// key indexes examines exactly the keys the walk that probes the indexes
// key by key does, in the same order and with the same room: over two
// ready segments holding jobs of the same keys, shallow and deep keys
// mixed, keys whose slot is held, from the start, from a cursor, resuming
// a cursor's turn, wrapping around, and with windows that end before the
// walk does (it goes on probing past them).
func TestKeyWalkWindow(t *testing.T) {
	ctx := context.Background()
	d, s := openSeg(t)
	s.tune.grace = 0
	const q = "walkwin"
	if err := d.SetQueueLimits(ctx, q, driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	var groups [][]driver.InsertParams
	for k := 0; k < 60; k++ {
		n := 1 + k%3
		if k%17 == 0 {
			n = 25 // deep
		}
		groups = append(groups, keyedJobs(q, fmt.Sprintf("k%03d", k), n))
	}
	insertJobs(t, d, groups[:35]...)
	if err := s.rotate(ctx, phReady); err != nil {
		t.Fatal(err)
	}
	s.invalidate()
	insertJobs(t, d, groups[35:]...)
	insertJobs(t, d, keyedJobs(q, "k001", 2), keyedJobs(q, "k034", 1), keyedJobs(q, "k017", 3))
	// Some keys' slots held by running attempts.
	if _, err := d.ClaimLimited(ctx, driver.ClaimParams{Queue: q, Limit: 9, Lease: time.Hour, Worker: "w"}); err != nil {
		t.Fatal(err)
	}
	v, err := s.viewNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.live[phReady]) < 2 {
		t.Fatalf("live ready segments %v, want two", v.live[phReady])
	}
	stmt := s.stmt(&d.q.SegKeyWalk, v, v.live[phReady])
	type result struct {
		keys        []string
		room, rated []bool
	}
	walk := func(cursor string, budget, want int, again bool, win int) (r result, held, entries int) {
		t.Helper()
		// In a transaction rolled back: the slots a walk makes stay out
		// of the next walk's view, so every walk reads the same slots.
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := tx.QueryRow(ctx, stmt, q, cursor, budget, want, 1, 0, int64(0), again, win).
			Scan(&r.keys, &r.room, &r.rated, &held, &entries); err != nil {
			t.Fatalf("walk from %q, window %d: %v", cursor, win, err)
		}
		return r, held, entries
	}
	sawRoom, sawHeld, sawWrap := false, false, false
	for _, cursor := range []string{"", "k010", "k017", "k034", "k058", "zzz"} {
		for _, again := range []bool{false, true} {
			for _, bw := range [][2]int{{300, 100}, {40, 12}, {7, 3}} {
				want, _, _ := walk(cursor, bw[0], bw[1], again, 0)
				for i, k := range want.keys {
					sawRoom = sawRoom || want.room[i]
					sawHeld = sawHeld || !want.room[i]
					sawWrap = sawWrap || (cursor != "" && k < cursor)
				}
				for _, win := range []int{1, 2, 5, 13, 64, 4096} {
					got, held, entries := walk(cursor, bw[0], bw[1], again, win)
					if !slices.Equal(got.keys, want.keys) || !slices.Equal(got.room, want.room) || !slices.Equal(got.rated, want.rated) {
						t.Fatalf("walk from %q (again %v, budget %d, want %d) with a window of %d:\n%v %v\nwithout one:\n%v %v",
							cursor, again, bw[0], bw[1], win, got.keys, got.room, want.keys, want.room)
					}
					if held == 0 && cursor < "k059" || held > entries || entries > win {
						t.Fatalf("walk from %q with a window of %d: the window held %d keys in %d entries", cursor, win, held, entries)
					}
				}
			}
		}
	}
	if !sawRoom || !sawHeld || !sawWrap {
		t.Fatalf("the walks saw keys with room %v, keys held %v, a wrap-around %v: want all three", sawRoom, sawHeld, sawWrap)
	}
}

// A window that found deep keys turns the window off for the queue's next
// deepWalks walks; a short window at the end of the keys, or shallow keys,
// leave it on.
func TestKeyWindowDeep(t *testing.T) {
	var k keyStates
	if w := k.window("q", 100); w != 332 {
		t.Fatalf("window for 100 jobs: %d entries, want 332", w)
	}
	k.sawWindow("q", 10, 1)   // near the end of the keys: too few entries to tell
	k.sawWindow("q", 332, 90) // shallow
	if w := k.window("q", 100); w == 0 {
		t.Fatal("window off after shallow keys and a short window")
	}
	k.sawWindow("q", 332, 12) // 27 entries a key: deep
	for i := 0; i < deepWalks; i++ {
		if w := k.window("q", 100); w != 0 {
			t.Fatalf("walk %d after deep keys: a window of %d, want none", i, w)
		}
	}
	if w := k.window("q", 5000); w != windowMax {
		t.Fatalf("window after %d walks without: %d entries, want %d", deepWalks, w, windowMax)
	}
	if w := k.window("other", 100); w != 332 {
		t.Fatalf("another queue's window: %d, want 332", w)
	}
}
