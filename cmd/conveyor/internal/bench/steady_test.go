package bench

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/conveyorq/conveyor/internal/testdb"
)

func TestLikePrefix(t *testing.T) {
	for in, want := range map[string]string{"bench1a2b3c_": `bench1a2b3c\_%`, `a%b\`: `a\%b\\%`} {
		if got := likePrefix(in); got != want {
			t.Errorf("likePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// A steady run stopped by its context mid-hold still ends the held
// transaction: afterwards nothing holds a snapshot of the database.
func TestSteadyCancelReleasesHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(testing.TB) string
	}{
		{"sqlite", func(tb testing.TB) string { return sqliteDSNForTest(tb.(*testing.T)) }},
		{"postgres", testdb.Postgres},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn(t)
			// The run is stopped 700ms into its held load, however long
			// its setup took (migrations on a busy machine took over
			// the 1.5s a fixed deadline once gave the whole run); the
			// deadline only bounds a run that never reaches the hold.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			o := Options{DSN: dsn, Workload: "steady", Workers: 4, Producers: 2, Rate: 100, Duration: time.Minute, Every: 500 * time.Millisecond, HoldXmin: true, Timeout: time.Minute}
			o.held = func() { time.AfterFunc(700*time.Millisecond, cancel) }
			rs, err := RunAll(ctx, o)
			if err == nil || !errors.Is(err, context.Canceled) {
				t.Fatalf("want the context's error, got %v", err)
			}
			if len(rs) != 1 || rs[0].Steady == nil || rs[0].Steady.Hold == nil || !rs[0].Steady.Hold.Released {
				t.Fatalf("results %+v", rs)
			}
			switch tc.name {
			case "postgres":
				db, err := sql.Open("pgx", dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				var n int
				if err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", rs[0].Steady.Hold.Session).Scan(&n); err != nil || n != 0 {
					t.Errorf("%d held sessions left (%v)", n, err)
				}
			case "sqlite":
				// A full checkpoint completes only if no reader holds a
				// snapshot older than the WAL's end.
				db, err := sql.Open("sqlite", sqliteDSN(dsn, "_pragma=busy_timeout(2000)"))
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				var busy, log, done int
				if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done); err != nil || busy != 0 {
					t.Errorf("checkpoint: busy %d log %d checkpointed %d (%v)", busy, log, done, err)
				}
			}
		})
	}
}

// A hold that fails after its connection is open (here: the prefix has no
// tables) closes that connection: no session of it is left behind, still
// holding whatever it had begun.
func TestHoldSnapshotFailureClosesConnection(t *testing.T) {
	dsn := testdb.Postgres(t)
	prefix := "nosuchprefix" + time.Now().Format("150405000000") + "_"
	h, err := holdSnapshot(context.Background(), dsn, "postgres", prefix, time.Minute)
	if err == nil || h != nil {
		t.Fatalf("holdSnapshot on a prefix with no tables: %v, %v", h, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// A closed connection's server process ends shortly after it reads
	// the client's goodbye: wait for that (a session left open stays).
	var n int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err = db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", holdAppName+" "+prefix).Scan(&n)
		if err != nil || n == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || n != 0 {
		t.Errorf("%d sessions of the failed hold still open after 15s (%v)", n, err)
	}
}

// The windows' offered counts are the jobs whose due time i/Rate falls in
// each window, exactly: 100 jobs/s over 1.1s windows is 110 per window
// (floating point once made it 111 then 109), and the load's offered
// count is every job due before its end, a fraction of a job included.
func TestSteadyOfferedPerWindow(t *testing.T) {
	for _, tc := range []struct {
		rate        float64
		every, load time.Duration
		offered     int64
		per         []int64
	}{
		{100, 1100 * time.Millisecond, 4400 * time.Millisecond, 440, []int64{110, 110, 110, 110}},
		{100, 700 * time.Millisecond, 4900 * time.Millisecond, 490, []int64{70, 70, 70, 70, 70, 70, 70}},
		// Due at 0, 1/3, 2/3, 1, 4/3: five jobs in 1.5s.
		{3, time.Second, 1500 * time.Millisecond, 5, []int64{3, 2}},
	} {
		if got := jobsDueBefore(tc.load, tc.rate); got != tc.offered {
			t.Errorf("rate %v load %v: %d jobs due, want %d", tc.rate, tc.load, got, tc.offered)
		}
		nw := len(tc.per)
		t0 := time.Now()
		bounds := make([]time.Time, nw+1)
		for i := range bounds {
			bounds[i] = t0.Add(min(tc.load, time.Duration(i)*tc.every))
		}
		fig := &SteadyFigures{Rate: tc.rate, WindowS: tc.every.Seconds(), Offered: tc.offered, Windows: make([]Window, nw)}
		fillWindows(fig, NewRecorder(), t0, 0, bounds, -1)
		for i, w := range fig.Windows {
			if w.Offered != tc.per[i] {
				t.Errorf("rate %v window %v: window %d offered %d, want %d", tc.rate, tc.every, i, w.Offered, tc.per[i])
			}
		}
	}
}

// A held transaction's Recount counts the rows it counted when it began,
// whatever was committed since, until it is released; on MySQL the
// figures name its connection, whose transaction information_schema
// shows open.
func TestHoldRecountSeesItsSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(testing.TB) string
	}{
		{"sqlite", func(tb testing.TB) string { return sqliteDSNForTest(tb.(*testing.T)) }},
		{"mysql", testdb.MySQL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := tc.dsn(t)
			db, backend, err := openRaw(ctx, dsn, 2, "")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			prefix := "holdrecount" + time.Now().Format("150405000000") + "_"
			table := prefix + "t"
			if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id INTEGER PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			defer db.ExecContext(ctx, "DROP TABLE "+table)
			if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES (1), (2)"); err != nil {
				t.Fatal(err)
			}
			h, err := HoldSnapshot(ctx, dsn, backend, prefix, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Release()
			if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES (3), (4), (5)"); err != nil {
				t.Fatal(err)
			}
			f := h.Figures()
			if n, err := h.Recount(ctx); err != nil || n != 2 || f.Rows != 2 {
				t.Fatalf("recount %d (%v), %d rows at the start: want 2 and 2", n, err, f.Rows)
			}
			if backend == "mysql" {
				var open int
				if err := db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?", f.Thread).Scan(&open); err != nil || f.Thread == 0 || open != 1 {
					t.Errorf("thread %d: %d transactions in innodb_trx (%v), want 1", f.Thread, open, err)
				}
			}
			if !h.Release().Released {
				t.Fatal("not released")
			}
			if n, err := h.Recount(ctx); err == nil {
				t.Errorf("recount after the release: %d rows, no error", n)
			}
		})
	}
}
