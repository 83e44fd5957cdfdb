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
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			o := Options{DSN: dsn, Workload: "steady", Workers: 4, Producers: 2, Rate: 100, Duration: time.Minute, Every: 500 * time.Millisecond, HoldXmin: true, Timeout: time.Minute}
			rs, err := RunAll(ctx, o)
			if err == nil || !errors.Is(err, context.DeadlineExceeded) {
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
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", holdAppName+" "+prefix).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d sessions of the failed hold left open (%v)", n, err)
	}
}
