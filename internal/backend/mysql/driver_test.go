package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// open opens a driver on a fresh prefix; tweak may adjust it before use.
func open(t *testing.T, prefix string, opts driver.Options, tweak func(*Driver)) *Driver {
	t.Helper()
	opts.Prefix = prefix
	d, err := Open(context.Background(), testdb.MySQL(t), opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if tweak != nil {
		tweak(d)
	}
	return d
}

// migrated opens, migrates and registers cleanup.
func migrated(t *testing.T, opts driver.Options, tweak func(*Driver)) *Driver {
	t.Helper()
	d := open(t, testdb.Prefix(), opts, tweak)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := d.DropAll(context.Background()); err != nil {
			t.Errorf("drop: %v", err)
		}
		d.Close()
	})
	return d
}

// variants are the code paths the server can take: the automatic choice
// (SKIP LOCKED and JSON_TABLE on MariaDB 10.6+ / MySQL 8), the optimistic
// claim, and the UNION ALL batch sources used on servers without
// JSON_TABLE.
var variants = []struct {
	name  string
	opts  driver.Options
	tweak func(*Driver)
}{
	{"auto", driver.Options{}, nil},
	{"optimistic", driver.Options{ClaimStrategy: "optimistic"}, nil},
	{"optimistic-union", driver.Options{ClaimStrategy: "optimistic"}, func(d *Driver) { d.jsonTable = false }},
}

func TestDriverSuite(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			drivertest.Run(t, testdb.Prefix, func(t *testing.T, prefix string) driver.Driver {
				return open(t, prefix, v.opts, v.tweak)
			})
		})
	}
}

// TestThunderingHerd reproduces the classic failure of naive MySQL queues:
// 10 concurrent claimers, 4,000 jobs that all become available at the same
// moment, claimed and completed to the end. No error may surface (deadlocks
// and lock waits are absorbed by the driver), no job may be handed out
// twice and none may be lost.
func TestThunderingHerd(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			const n, claimers = 4000, 10
			in := make([]driver.InsertParams, n)
			for i := range in {
				in[i] = driver.InsertParams{Queue: "herd", Kind: "k", Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
					Priority: i % 3, MaxAttempts: 5, RunAt: time.Now().Add(time.Hour)}
			}
			ids, err := d.Insert(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if st := statsFor(t, d, "herd"); st.Counts[driver.StateScheduled] != n {
				t.Fatalf("want %d scheduled, got %v", n, st.Counts)
			}

			var (
				mu      sync.Mutex
				seen    = make(map[int64]int, n)
				done    atomic.Int64
				errs    = make(chan error, claimers)
				start   = make(chan struct{})
				wg      sync.WaitGroup
				applied atomic.Int64
			)
			for w := 0; w < claimers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					idle := 0
					for done.Load() < n {
						rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "herd", Limit: 25, Lease: time.Minute, Worker: fmt.Sprintf("w%d", w)})
						if err != nil {
							errs <- fmt.Errorf("claim: %w", err)
							return
						}
						if len(rows) == 0 {
							if idle++; idle > 2000 {
								errs <- errors.New("claimer starved")
								return
							}
							time.Sleep(time.Millisecond)
							continue
						}
						idle = 0
						out := make([]driver.Outcome, len(rows))
						mu.Lock()
						for i, r := range rows {
							seen[r.ID]++
							out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
						}
						mu.Unlock()
						got, err := d.Complete(ctx, out)
						if err != nil {
							errs <- fmt.Errorf("complete: %w", err)
							return
						}
						if len(got) != len(out) {
							errs <- fmt.Errorf("complete applied %d of %d freshly claimed jobs", len(got), len(out))
							return
						}
						applied.Add(int64(len(got)))
						done.Add(int64(len(rows)))
					}
				}()
			}
			// Everything becomes due at once, then promoted in one go while
			// the claimers are already polling.
			if _, err := d.DB().ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET scheduled_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"); err != nil {
				t.Fatal(err)
			}
			close(start)
			promoted, err := d.Promote(ctx, 2*n)
			if err != nil {
				t.Fatal(err)
			}
			if promoted["herd"] != n {
				t.Fatalf("promoted %v, want %d", promoted, n)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				return
			}
			dups := 0
			for _, c := range seen {
				if c != 1 {
					dups++
				}
			}
			lost := 0
			for _, id := range ids {
				if seen[id] == 0 {
					lost++
				}
			}
			if dups != 0 || lost != 0 || len(seen) != n || applied.Load() != n {
				t.Fatalf("duplicates %d, lost %d, distinct %d, applied %d; want 0, 0, %d, %d", dups, lost, len(seen), applied.Load(), n, n)
			}
			st := statsFor(t, d, "herd")
			if st.Counts[driver.StateCompleted] != n {
				t.Fatalf("final counts %v, want %d completed", st.Counts, n)
			}
			t.Logf("%s: counters %v", d.claimMethod, d.Counters())
		})
	}
}

func statsFor(t *testing.T, d *Driver, queue string) driver.QueueStats {
	t.Helper()
	st, err := d.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Queue == queue {
			return s
		}
	}
	return driver.QueueStats{}
}

// TestInsertIDsInOrder checks that the ids returned for a multi-row INSERT
// are the rows' ids, in order, also while other inserts run concurrently.
func TestInsertIDsInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 10; round++ {
				size := 1 + (g*37+round*11)%300
				in := make([]driver.InsertParams, size)
				for i := range in {
					in[i] = driver.InsertParams{Queue: "ids", Kind: fmt.Sprintf("g%d-r%d-i%d", g, round, i), Args: json.RawMessage(`{}`), MaxAttempts: 1}
				}
				ids, err := d.Insert(ctx, in)
				if err != nil {
					errs <- err
					return
				}
				for i, id := range ids {
					j, err := d.GetJob(ctx, id)
					if err != nil {
						errs <- err
						return
					}
					if j.Kind != in[i].Kind {
						errs <- fmt.Errorf("id %d (position %d) holds job %q, want %q", id, i, j.Kind, in[i].Kind)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestInsertTimesAndStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	runAt := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.FixedZone("x", 3*3600))
	ids, err := d.Insert(ctx, []driver.InsertParams{
		{Queue: "t", Kind: "k", Args: json.RawMessage(`{"s":"é😀"}`), MaxAttempts: 1, RunAt: runAt, TimeoutMS: 1500, Priority: -2},
		{Queue: "t", Kind: "k", Args: json.RawMessage(`[1, 2]`), MaxAttempts: 1, Delay: -time.Hour},
		{Queue: "t", Kind: "k", Args: json.RawMessage(`null`), MaxAttempts: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	j0, err := d.GetJob(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if j0.State != driver.StateScheduled || !j0.ScheduledAt.Equal(runAt.Truncate(time.Microsecond)) || j0.ScheduledAt.Location() != time.UTC {
		t.Fatalf("run-at job: state %s scheduled %v, want scheduled at %v UTC", j0.State, j0.ScheduledAt, runAt.Truncate(time.Microsecond))
	}
	if string(j0.Args) != `{"s":"é😀"}` || j0.TimeoutMS != 1500 || j0.Priority != -2 || j0.Attempt != 0 || len(j0.Errors) != 0 {
		t.Fatalf("round trip: %+v", j0)
	}
	j1, _ := d.GetJob(ctx, ids[1])
	if j1.State != driver.StateAvailable || time.Since(j1.ScheduledAt) < 50*time.Minute {
		t.Fatalf("negative delay: %+v", j1)
	}
	j2, _ := d.GetJob(ctx, ids[2])
	if j2.State != driver.StateAvailable || !j2.ScheduledAt.Equal(j2.CreatedAt) {
		t.Fatalf("immediate job: state %s scheduled %v created %v", j2.State, j2.ScheduledAt, j2.CreatedAt)
	}
	if d := time.Since(j2.CreatedAt); d < -time.Minute || d > time.Minute {
		t.Fatalf("created_at %v is not the database's UTC now (test clock %v)", j2.CreatedAt, time.Now().UTC())
	}
}

func TestMaxArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	limit := d.Capabilities().MaxArgsBytes
	if limit <= 0 || limit >= d.maxPacket {
		t.Fatalf("MaxArgsBytes %d, max_allowed_packet %d", limit, d.maxPacket)
	}
	big := func(n int) json.RawMessage {
		return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`)
	}
	_, err := d.Insert(ctx, []driver.InsertParams{{Queue: "m", Kind: "k", Args: big(limit + 1), MaxAttempts: 1}})
	if err == nil || !strings.Contains(err.Error(), "max_allowed_packet") {
		t.Fatalf("oversized args: err %v, want a clear max_allowed_packet error", err)
	}
	// The largest accepted args go through, alone and in a batch split
	// across statements.
	in := []driver.InsertParams{
		{Queue: "m", Kind: "k", Args: big(limit), MaxAttempts: 1},
		{Queue: "m", Kind: "k", Args: big(limit / 2), MaxAttempts: 1},
		{Queue: "m", Kind: "k", Args: big(limit / 2), MaxAttempts: 1},
	}
	ids, err := d.Insert(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		j, err := d.GetJob(ctx, id)
		if err != nil || len(j.Args) != len(in[i].Args) {
			t.Fatalf("job %d: %d bytes of args, want %d (err %v)", i, len(j.Args), len(in[i].Args), err)
		}
	}
	if n, err := d.BulkInsert(ctx, in); err != nil || n != 3 {
		t.Fatalf("bulk insert of large args: %d %v", n, err)
	}
}

func TestInsertTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	if _, err := d.InsertTx(ctx, "not a tx", []driver.InsertParams{{Queue: "x", Kind: "k", MaxAttempts: 1}}); !errors.Is(err, driver.ErrTxType) || !strings.Contains(err.Error(), "string") {
		t.Fatalf("wrong tx type: %v", err)
	}
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{{Queue: "x", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 1}, {Queue: "x", Kind: "k2", Args: json.RawMessage(`{}`), MaxAttempts: 1}})
	if err != nil || len(ids) != 2 {
		t.Fatalf("insert tx: %v %v", ids, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetJob(ctx, ids[0]); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("rolled back insert is visible: %v", err)
	}
	tx, _ = d.DB().BeginTx(ctx, nil)
	ids, err = d.InsertTx(ctx, tx, []driver.InsertParams{{Queue: "x", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 1}, {Queue: "x", Kind: "k2", Args: json.RawMessage(`{}`), MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if j, err := d.GetJob(ctx, ids[1]); err != nil || j.Kind != "k2" {
		t.Fatalf("committed insert: %+v %v", j, err)
	}
}

// TestCompleteBatch exercises the batched fenced UPDATE: error appends,
// partial application, duplicates and a batch larger than one bucket.
func TestCompleteBatch(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := migrated(t, v.opts, v.tweak)
			const n = maxBucket + 400 // more than one statement's worth
			in := make([]driver.InsertParams, n)
			for i := range in {
				in[i] = driver.InsertParams{Queue: "c", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5}
			}
			if _, err := d.Insert(ctx, in); err != nil {
				t.Fatal(err)
			}
			var rows []*driver.JobRow
			for len(rows) < n {
				r, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 500, Lease: time.Minute, Worker: `w"1`})
				if err != nil || len(r) == 0 {
					t.Fatalf("claim: %d %v", len(r), err)
				}
				rows = append(rows, r...)
			}
			// Heartbeat everything, plus one stale lease.
			leases := make([]driver.Lease, 0, n+1)
			for _, r := range rows {
				leases = append(leases, driver.Lease{ID: r.ID, Fence: r.Fence})
			}
			owned, err := d.Heartbeat(ctx, append(leases, driver.Lease{ID: rows[0].ID, Fence: 9}), time.Hour)
			if err != nil || len(owned) != n {
				t.Fatalf("heartbeat owned %d of %d: %v", len(owned), n, err)
			}
			j, _ := d.GetJob(ctx, rows[0].ID)
			if time.Until(j.LeaseExpiresAt) < 50*time.Minute {
				t.Fatalf("lease not extended: %v", j.LeaseExpiresAt)
			}
			at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
			out := make([]driver.Outcome, n)
			for i, r := range rows {
				out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateRetryable,
					Err: &driver.AttemptError{Attempt: r.Attempt, At: at, Error: fmt.Sprintf(`boom "%d" 😀`, i), Trace: "line1\nline2"}}
			}
			// One error far beyond what a packet allows is cut, not fatal.
			out[n-1].Err.Trace = strings.Repeat("t", d.maxPacket)
			applied, err := d.Complete(ctx, out)
			if err != nil || len(applied) != n {
				t.Fatalf("complete applied %d of %d: %v", len(applied), n, err)
			}
			if j, err := d.GetJob(ctx, out[n-1].ID); err != nil || len(j.Errors) != 1 || !strings.HasSuffix(j.Errors[0].Trace, "[truncated]") || len(j.Errors[0].Trace) >= d.maxPacket/8 {
				t.Fatalf("huge trace: err %v", err)
			}
			// Second attempt of half, failing again; the other half stale.
			if _, err := d.DB().ExecContext(ctx, "UPDATE `"+d.prefix+"jobs` SET state = 'available', scheduled_at = UTC_TIMESTAMP(6)"); err != nil {
				t.Fatal(err)
			}
			var again []*driver.JobRow
			for len(again) < n {
				r, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: 500, Lease: time.Minute, Worker: "w2"})
				if err != nil || len(r) == 0 {
					t.Fatalf("reclaim: %d %v", len(r), err)
				}
				again = append(again, r...)
			}
			var mixed []driver.Outcome
			want := map[int64]bool{}
			for i, r := range again {
				if r.Attempt != 2 || len(r.Errors) != 1 {
					t.Fatalf("reclaimed row %+v", r)
				}
				o := driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: 2, State: driver.StateDiscarded, Err: &driver.AttemptError{Attempt: 2, At: at, Error: "again"}}
				if i%2 == 1 {
					o.Fence, o.Attempt = r.Fence-1, 1 // stale: the first claim's fence
				} else {
					want[r.ID] = true
				}
				mixed = append(mixed, o, o) // duplicates too
			}
			applied, err = d.Complete(ctx, mixed)
			if err != nil {
				t.Fatal(err)
			}
			if len(applied) != len(want) {
				t.Fatalf("applied %d, want %d", len(applied), len(want))
			}
			for _, id := range applied {
				if !want[id] {
					t.Fatalf("stale outcome %d reported applied", id)
				}
			}
			j, _ = d.GetJob(ctx, again[0].ID)
			if j.State != driver.StateDiscarded || len(j.Errors) != 2 || j.Errors[0].Error != `boom "`+fmt.Sprint(indexOf(rows, j.ID))+`" 😀` ||
				j.Errors[0].Trace != "line1\nline2" || !j.Errors[0].At.Equal(at) || j.Errors[1].Error != "again" || j.FinalizedAt.IsZero() {
				t.Fatalf("discarded job: %+v", j)
			}
			j, _ = d.GetJob(ctx, again[1].ID)
			if j.State != driver.StateRunning || len(j.Errors) != 1 {
				t.Fatalf("stale outcome changed the job: %+v", j)
			}
			if n, err := d.Release(ctx, []driver.Lease{{ID: again[1].ID, Fence: again[1].Fence}, {ID: again[0].ID, Fence: again[0].Fence}}); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
		})
	}
}

func indexOf(rows []*driver.JobRow, id int64) int {
	for i, r := range rows {
		if r.ID == id {
			return i
		}
	}
	return -1
}

func TestRescueErrorAndTimes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	ids, err := d.Insert(ctx, []driver.InsertParams{{Queue: "r", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 3}})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "r", Limit: 1, Lease: time.Millisecond, Worker: `host "a"`})
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	if d := rows[0].LeaseExpiresAt.Sub(rows[0].AttemptedAt); d != time.Millisecond {
		t.Fatalf("lease %v after attempt, want 1ms", d)
	}
	stored, _ := d.GetJob(ctx, ids[0])
	if !stored.AttemptedAt.Equal(rows[0].AttemptedAt) || !stored.LeaseExpiresAt.Equal(rows[0].LeaseExpiresAt) || stored.AttemptedBy != `host "a"` {
		t.Fatalf("claimed row %+v differs from stored %+v", rows[0], stored)
	}
	time.Sleep(20 * time.Millisecond)
	n, err := d.Rescue(ctx, 10)
	if err != nil || n["r"] != 1 {
		t.Fatalf("rescue %v %v", n, err)
	}
	j, _ := d.GetJob(ctx, ids[0])
	if len(j.Errors) != 1 || j.Errors[0].Error != `lease expired: host "a" stopped heartbeating` || j.Errors[0].Attempt != 1 ||
		j.Errors[0].At.Before(rows[0].LeaseExpiresAt) || j.State != driver.StateAvailable || !j.LeaseExpiresAt.IsZero() {
		t.Fatalf("rescued job %+v", j)
	}
}

func TestMigrateConcurrentAndTooNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prefix := testdb.Prefix()
	var wg sync.WaitGroup
	total := atomic.Int64{}
	errs := make(chan error, 4)
	ds := make([]*Driver, 4)
	for i := range ds {
		ds[i] = open(t, prefix, driver.Options{}, nil)
		defer ds[i].Close()
	}
	defer ds[0].DropAll(ctx)
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := d.Migrate(ctx)
			if err != nil {
				errs <- err
			}
			total.Add(int64(len(v)))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total.Load() != int64(len(ds[0].migs)) {
		t.Fatalf("migrations applied %d times in total, want %d", total.Load(), len(ds[0].migs))
	}
	if _, err := ds[0].DB().ExecContext(ctx, "INSERT INTO `"+prefix+"schema_migrations` VALUES (999, UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	_, err := ds[0].Migrate(ctx)
	if !errors.Is(err, driver.ErrSchemaTooNew) || !strings.Contains(err.Error(), "999") {
		t.Fatalf("migrate on newer schema: %v", err)
	}
	if cur, latest, err := ds[0].SchemaVersion(ctx); err != nil || cur != 999 || latest != len(ds[0].migs) {
		t.Fatalf("schema version %d/%d %v", cur, latest, err)
	}
	fresh := open(t, testdb.Prefix(), driver.Options{}, nil)
	defer fresh.Close()
	if cur, _, err := fresh.SchemaVersion(ctx); err != nil || cur != 0 {
		t.Fatalf("unmigrated schema version %d %v", cur, err)
	}
}

func TestServerInfoAndSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migrated(t, driver.Options{}, nil)
	info, err := d.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"backend", "server_version", "innodb_flush_log_at_trx_commit", "sync_binlog", "transaction_isolation", "claim_method"} {
		if info[k] == "" {
			t.Errorf("ServerInfo lacks %q: %v", k, info)
		}
	}
	if info["transaction_isolation"] != "READ-COMMITTED" || info["claim_method"] != d.claimMethod {
		t.Errorf("ServerInfo %v", info)
	}
	var tz, mode string
	if err := d.DB().QueryRowContext(ctx, "SELECT @@session.time_zone, @@session.sql_mode").Scan(&tz, &mode); err != nil {
		t.Fatal(err)
	}
	if tz != "+00:00" || mode != sqlMode {
		t.Errorf("session time_zone %q sql_mode %q", tz, mode)
	}
	c := d.Capabilities()
	if c.Listen || c.MaxArgsBytes == 0 {
		t.Errorf("capabilities %+v", c)
	}
	if l, err := d.Listen(ctx); l != nil || err != nil {
		t.Errorf("Listen = %v, %v; want nil, nil", l, err)
	}
	for _, k := range []string{"deadlock_retries", "lock_timeouts"} {
		if _, ok := d.Counters()[k]; !ok {
			t.Errorf("Counters lacks %q", k)
		}
	}
}

func TestParseDSN(t *testing.T) {
	cfg, err := parseDSN("mysql://u%40x:p%3Aw%2Fd@db.example:3307/app?timeout=5s&parseTime=false&tls=skip-verify&wait_timeout=100")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "u@x" || cfg.Passwd != "p:w/d" || cfg.Addr != "db.example:3307" || cfg.DBName != "app" || cfg.Net != "tcp" {
		t.Fatalf("cfg %+v", cfg)
	}
	if !cfg.ParseTime || cfg.Loc.String() != "UTC" || cfg.InterpolateParams || !cfg.ClientFoundRows || cfg.Timeout != 5*time.Second || cfg.TLSConfig != "skip-verify" {
		t.Fatalf("forced settings not applied: %+v", cfg)
	}
	if cfg.Params["wait_timeout"] != "100" || cfg.Params["time_zone"] != "'+00:00'" || !strings.Contains(cfg.Params["sql_mode"], "STRICT_ALL_TABLES") {
		t.Fatalf("params %v", cfg.Params)
	}
	cfg, err = parseDSN("mysql://root@localhost/test?socket=/run/mysqld/mysqld.sock")
	if err != nil || cfg.Net != "unix" || cfg.Addr != "/run/mysqld/mysqld.sock" {
		t.Fatalf("socket DSN: %+v %v", cfg, err)
	}
	cfg, err = parseDSN("mysql://root@localhost/test")
	if err != nil || cfg.Addr != "localhost:3306" {
		t.Fatalf("default port: %+v %v", cfg, err)
	}
	for _, bad := range []string{"postgres://x@y/z", "mysql://root@localhost", "::"} {
		if _, err := parseDSN(bad); err == nil {
			t.Errorf("parseDSN(%q) accepted", bad)
		}
	}
	if _, err := Open(context.Background(), "mysql://root@127.0.0.1:1/x", driver.Options{Prefix: "Bad-"}); err == nil {
		t.Error("bad prefix accepted")
	}
}

func TestVersionParse(t *testing.T) {
	for _, c := range []struct {
		s       string
		a, b, p int
		less    bool
	}{
		{"10.11.19-MariaDB-0+deb12u1", 10, 6, 0, false},
		{"10.5.2-MariaDB", 10, 6, 0, true},
		{"8.0.36", 8, 0, 1, false},
		{"8.0.0-dmr", 8, 0, 1, true},
		{"5.7.44-log", 8, 0, 1, true},
	} {
		if got := parseVersion(c.s).less(c.a, c.b, c.p); got != c.less {
			t.Errorf("%s < %d.%d.%d = %v", c.s, c.a, c.b, c.p, got)
		}
	}
}

// frontRead pretends that d's last claim of queue from the front of the
// queue began now and took took: claims resume from the cursor until
// frontAfter has passed, however long the test's steps take.
func frontRead(d *Driver, queue string, took time.Duration) {
	cur := d.claimCursor(queue)
	cur.mu.Lock()
	// A read that slow makes the reads due by time probes (probes), whose
	// interval follows the last probe's time: as slow, or the front would
	// be due again frontEvery after this, and a machine slow enough to
	// take that long between two claims would read it.
	cur.scanned, cur.took, cur.probeTook = time.Now(), took, took
	cur.mu.Unlock()
}

// TestClaimCursorFindsJobsBehindIt: claims resume after the last claimed
// key, also once the queue is drained; a job that becomes available
// before that key behind this process's back (here a higher priority one
// inserted by another process) is claimed once the front of the queue is
// due to be read again, and nothing is handed out twice.
func TestClaimCursorFindsJobsBehindIt(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{ClaimStrategy: "skip-locked"}, nil)
	other := open(t, d.prefix, driver.Options{ClaimStrategy: "skip-locked"}, nil)
	defer other.Close()
	job := func(prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "c", Kind: "k", Args: json.RawMessage(`{}`), Priority: prio, MaxAttempts: 1}
	}
	backlog := make([]driver.InsertParams, 250)
	for i := range backlog {
		backlog[i] = job(5)
	}
	if _, err := d.Insert(ctx, backlog); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	claim := func(limit int) []*driver.JobRow {
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: limit, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if seen[r.ID] {
				t.Fatalf("job %d claimed twice", r.ID)
			}
			seen[r.ID] = true
		}
		return rows
	}
	if got := claim(100); len(got) != 100 {
		t.Fatalf("first claim: %d rows", len(got))
	}
	urgent, err := other.Insert(ctx, []driver.InsertParams{job(0)})
	if err != nil {
		t.Fatal(err)
	}
	// Resumed: the next 100 of the backlog, past the urgent job.
	frontRead(d, "c", time.Hour)
	if got := claim(100); len(got) != 100 || seen[urgent[0]] {
		t.Fatalf("resumed claim: %d rows, urgent claimed %v", len(got), seen[urgent[0]])
	}
	// 50 left after the cursor: the claims come back short from the cursor
	// and do not read the queue from the front again yet.
	if got := claim(100); len(got) != 50 || seen[urgent[0]] {
		t.Fatalf("short resumed claim: %d rows (want 50), urgent claimed %v", len(got), seen[urgent[0]])
	}
	if got := claim(100); len(got) != 0 {
		t.Fatalf("drained queue: claimed %d rows", len(got))
	}
	// While reading the front is cheap, it is due frontEvery after the
	// last read: the claim then reads from the front itself.
	cur := d.claimCursor("c")
	cur.mu.Lock()
	cur.took, cur.scanned = 0, time.Now().Add(-frontEvery)
	cur.mu.Unlock()
	if got := claim(100); len(got) != 1 || got[0].ID != urgent[0] {
		t.Fatalf("claim from the front: %d rows, urgent claimed %v", len(got), seen[urgent[0]])
	}
	// A read of the front that took a second (purge held back) makes the
	// next one due only probeShare seconds later, and a probe apart from
	// the claims: the claim that finds it due starts the probe and resumes
	// after its cursor, and the claims after the probe take the job it
	// found behind the cursor by id.
	urgent2, err := other.Insert(ctx, []driver.InsertParams{job(0), job(1)})
	if err != nil {
		t.Fatal(err)
	}
	cur.mu.Lock()
	cur.took, cur.probeTook, cur.scanned = time.Second, time.Second, time.Now().Add(-time.Second)
	cur.mu.Unlock()
	if got := claim(100); len(got) != 0 {
		t.Fatalf("claim before the front is due: %d rows", len(got))
	}
	cur.mu.Lock()
	cur.scanned = time.Now().Add(-cur.frontAfter())
	cur.mu.Unlock()
	more, err := other.Insert(ctx, []driver.InsertParams{job(5)})
	if err != nil {
		t.Fatal(err)
	}
	if got := claim(1); len(got) != 1 || got[0].ID != more[0] {
		t.Fatalf("claim that starts the probe: %v, want job %d resumed after the cursor", got, more[0])
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur.mu.Lock()
		probing, took := cur.probing, cur.probeTook
		cur.mu.Unlock()
		if !probing && took != time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the probe did not end")
		}
		time.Sleep(time.Millisecond)
	}
	// Both found, taken by id in claim order, one claim at a time.
	if got := claim(1); len(got) != 1 || got[0].ID != urgent2[0] {
		t.Fatalf("first claim after the probe: %v, want job %d", got, urgent2[0])
	}
	if got := claim(100); len(got) != 1 || got[0].ID != urgent2[1] {
		t.Fatalf("second claim after the probe: %v, want job %d", got, urgent2[1])
	}
	if got := claim(100); len(got) != 0 {
		t.Fatalf("drained queue: claimed %d rows", len(got))
	}
	if len(seen) != 254 {
		t.Fatalf("claimed %d distinct jobs, want 254", len(seen))
	}
}

// TestClaimCursorBehindThisProcess: a job this process makes available
// before its claim cursor (a higher priority or past run_at inserted, a
// released attempt, a promoted job) is claimed by the next claim, without
// waiting for the cursor's time to be up.
func TestClaimCursorBehindThisProcess(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{ClaimStrategy: "skip-locked"}, nil)
	job := func(prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "c", Kind: "k", Args: json.RawMessage(`{}`), Priority: prio, MaxAttempts: 1}
	}
	claim := func(limit int) []*driver.JobRow {
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "c", Limit: limit, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	only := func(what string, id int64) *driver.JobRow {
		t.Helper()
		frontRead(d, "c", time.Hour) // only this process's own marks make it read the front
		got := claim(10)
		if len(got) != 1 || got[0].ID != id {
			t.Fatalf("%s: claimed %d rows, want job %d alone", what, len(got), id)
		}
		return got[0]
	}
	backlog := make([]driver.InsertParams, 10)
	for i := range backlog {
		backlog[i] = job(5)
	}
	if _, err := d.Insert(ctx, backlog); err != nil {
		t.Fatal(err)
	}
	if got := claim(5); len(got) != 5 {
		t.Fatalf("first claim: %d rows", len(got))
	}
	if got := claim(10); len(got) != 5 {
		t.Fatalf("resumed claim: %d rows", len(got))
	}
	if got := claim(10); len(got) != 0 {
		t.Fatalf("drained queue: claimed %d rows", len(got))
	}
	// The cursor now sits on the last job of the backlog.
	urgent, err := d.Insert(ctx, []driver.InsertParams{job(0)})
	if err != nil {
		t.Fatal(err)
	}
	u := only("higher priority", urgent[0])
	past := job(5)
	past.RunAt = time.Now().Add(-time.Hour)
	early, err := d.Insert(ctx, []driver.InsertParams{past})
	if err != nil {
		t.Fatal(err)
	}
	only("past run_at", early[0])
	if n, err := d.Release(ctx, []driver.Lease{{ID: u.ID, Fence: u.Fence}}); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	only("released", u.ID)
	// Inserted ahead of the cursor, scheduled: the claim that reads the
	// front finds it not yet available, then promoting it moves the
	// cursor back to it.
	soon := job(1)
	soon.Delay = 20 * time.Millisecond
	later, err := d.Insert(ctx, []driver.InsertParams{soon})
	if err != nil {
		t.Fatal(err)
	}
	if got := claim(10); len(got) != 0 {
		t.Fatalf("claimed %d rows before the scheduled job is due", len(got))
	}
	for {
		n, err := d.Promote(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if n["c"] == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond) // until the database's clock passes run_at
	}
	only("promoted", later[0])
}

// ListJobsTx reads in the application's transaction whatever its
// connection's parseTime and loc: conveyor's times are UTC.
func TestListJobsTxOnTheApplicationsConnection(t *testing.T) {
	d := migrated(t, driver.Options{}, nil)
	ctx := context.Background()
	ids, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 3}})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := d.ClaimJob(ctx, ids[0], time.Minute, "w")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := d.GetJob(ctx, ids[0])
	base, err := URLConfig(testdb.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	// An application session in another time zone.
	base.Params = map[string]string{"time_zone": "'+05:00'"}
	for _, c := range []struct {
		name      string
		parseTime bool
		loc       *time.Location
	}{{"text", false, time.UTC}, {"parseTime local", true, time.FixedZone("X", 5*3600)}} {
		app := base.Clone()
		app.ParseTime, app.Loc = c.parseTime, c.loc
		conn, err := gomysql.NewConnector(app)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		defer db.Close()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.ListJobsTx(ctx, tx, driver.JobFilter{})
		tx.Rollback()
		if err != nil || len(got) != 1 {
			t.Fatalf("%s: %d jobs %v", c.name, len(got), err)
		}
		j := got[0]
		if !j.ScheduledAt.Equal(want.ScheduledAt) || !j.CreatedAt.Equal(want.CreatedAt) || !j.AttemptedAt.Equal(claimed.AttemptedAt) ||
			!j.LeaseExpiresAt.Equal(want.LeaseExpiresAt) || !j.FinalizedAt.IsZero() || j.State != driver.StateRunning || j.AttemptedBy != "w" {
			t.Fatalf("%s: read %+v, want %+v", c.name, j, want)
		}
	}
}

// TestClaimCursorMovedBackDuringClaim: a job promoted while a resumed
// claim runs moves the cursor back to it, and the claim's end does not
// move the cursor past it again; a claim that began after keeps moving
// it forward.
func TestClaimCursorMovedBackDuringClaim(t *testing.T) {
	d := &Driver{q: queries{ClaimSelect: "front", ClaimSelectAfter: "after"}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(id int64, at time.Duration) *driver.JobRow {
		return &driver.JobRow{ID: id, Priority: 1, ScheduledAt: t0.Add(at)}
	}
	c := &claimCursor{}
	p := driver.ClaimParams{Queue: "q", Limit: 2}
	q, _, st := c.query(d, p)
	if q != "front" {
		t.Fatalf("first claim: %s, want front", q)
	}
	c.advance([]*driver.JobRow{key(1, 0), key(2, time.Second)}, 2, st, 0)
	q, _, st = c.query(d, p)
	if q != "after" || c.id != 2 {
		t.Fatalf("second claim: %s after job %d, want after job 2", q, c.id)
	}
	// While it runs, job 3, scheduled before job 2, is promoted.
	c.before(key(3, time.Second/2))
	c.advance([]*driver.JobRow{key(4, 2*time.Second), key(5, 3*time.Second)}, 2, st, 0)
	if !c.sched.Equal(t0.Add(time.Second/2)) || c.id != 2 {
		t.Fatalf("cursor at %v id %d, want before job 3 (%v id 2)", c.sched, c.id, t0.Add(time.Second/2))
	}
	q, _, st = c.query(d, p)
	c.advance([]*driver.JobRow{key(3, time.Second/2), key(6, 4*time.Second)}, 2, st, 0)
	if q != "after" || c.id != 6 {
		t.Fatalf("claim after the move back: %s, cursor at job %d, want after and job 6", q, c.id)
	}
}

// TestClaimCursorMovedBackBeforeItIsSet: a job promoted or rescued while
// the queue's first claim (or the first after a failed one) runs from
// the front, before the cursor holds a position, is claimed by the next
// claim: that claim reads the front again instead of resuming after the
// first claim's last job, which may be past the promoted one.
func TestClaimCursorMovedBackBeforeItIsSet(t *testing.T) {
	d := &Driver{q: queries{ClaimSelect: "front", ClaimSelectAfter: "after"}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(id int64, at time.Duration) *driver.JobRow {
		return &driver.JobRow{ID: id, Priority: 1, ScheduledAt: t0.Add(at)}
	}
	c := &claimCursor{}
	p := driver.ClaimParams{Queue: "q", Limit: 2}
	q, _, st := c.query(d, p)
	if q != "front" {
		t.Fatalf("first claim: %s, want front", q)
	}
	// While it runs, job 3, scheduled before the jobs it takes, is
	// promoted (committed after the claim's read).
	c.before(key(3, 0))
	c.advance([]*driver.JobRow{key(4, time.Second), key(5, 2*time.Second)}, 2, st, 0)
	if q, _, _ := c.query(d, p); q != "front" {
		t.Fatalf("claim after the promotion: %s after job %d, want front", q, c.id)
	}
}

// TestClaimCursorAfterAFailedClaim: the rows a failed claim had locked
// are available again, and a concurrent claim skipped them: when that
// claim ends after the failure, the next claim still reads the front
// instead of resuming past them.
func TestClaimCursorAfterAFailedClaim(t *testing.T) {
	d := &Driver{q: queries{ClaimSelect: "front", ClaimSelectAfter: "after"}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(id int64, at time.Duration) *driver.JobRow {
		return &driver.JobRow{ID: id, Priority: 1, ScheduledAt: t0.Add(at)}
	}
	c := &claimCursor{}
	p := driver.ClaimParams{Queue: "q", Limit: 2}
	_, _, st := c.query(d, p)
	c.advance([]*driver.JobRow{key(1, 0), key(2, time.Second)}, 2, st, 0)
	// Two claims resume after job 2: the first locks jobs 3 and 4, the
	// second skips them and takes 5 and 6; the first fails, then the
	// second ends.
	c.query(d, p) // the first
	_, _, st2 := c.query(d, p)
	c.failed()
	c.advance([]*driver.JobRow{key(5, 4*time.Second), key(6, 5*time.Second)}, 2, st2, 0)
	if q, _, _ := c.query(d, p); q != "front" {
		t.Fatalf("claim after the failed one: %s after job %d, want front", q, c.id)
	}
}

// TestClaimCursorInsertBeforeItIsSet: a job of a higher priority
// inserted by this process while the queue's first claim runs from the
// front, before the cursor holds a position, is claimed by the next
// claim: that claim reads the front again instead of resuming after the
// first claim's last job.
func TestClaimCursorInsertBeforeItIsSet(t *testing.T) {
	d := &Driver{q: queries{ClaimSelect: "front", ClaimSelectAfter: "after"}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(id int64, prio int) *driver.JobRow {
		return &driver.JobRow{ID: id, Priority: prio, ScheduledAt: t0}
	}
	c := d.claimCursor("q")
	p := driver.ClaimParams{Queue: "q", Limit: 2}
	_, _, st := c.query(d, p)
	d.behindInserted([]driver.InsertParams{{Queue: "q", Priority: 0}})
	c.advance([]*driver.JobRow{key(1, 5), key(2, 5)}, 2, st, 0)
	if q, _, _ := c.query(d, p); q != "front" {
		t.Fatalf("claim after the insert: %s after job %d, want front", q, c.id)
	}
}

// TestClaimByIDAfterCursorMovedBack: a job a probe found behind the
// cursor, which the cursor has since moved back before (a promotion),
// is both taken by id and met again by the read after the cursor, in
// one transaction whose own lock does not skip it: the claim takes it
// once, with the rest after it.
func TestClaimByIDAfterCursorMovedBack(t *testing.T) {
	ctx := context.Background()
	d := migrated(t, driver.Options{ClaimStrategy: "skip-locked"}, nil)
	other := open(t, d.prefix, driver.Options{ClaimStrategy: "skip-locked"}, nil)
	defer other.Close()
	job := func(prio int) driver.InsertParams {
		return driver.InsertParams{Queue: "m", Kind: "k", Args: json.RawMessage(`{}`), Priority: prio, MaxAttempts: 1}
	}
	ids, err := d.Insert(ctx, []driver.InsertParams{job(5), job(5), job(5)})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(limit int) []*driver.JobRow {
		t.Helper()
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "m", Limit: limit, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	if got := claim(1); len(got) != 1 || got[0].ID != ids[0] {
		t.Fatalf("first claim: %v", got)
	}
	x, err := other.Insert(ctx, []driver.InsertParams{job(0)})
	if err != nil {
		t.Fatal(err)
	}
	xr, err := d.GetJob(ctx, x[0])
	if err != nil {
		t.Fatal(err)
	}
	cur := d.claimCursor("m")
	cur.mu.Lock()
	// Reading the front is slow, none is due, and a probe found x.
	cur.took, cur.probeTook, cur.scanned = time.Second, time.Second, time.Now()
	cur.found = []*driver.JobRow{{ID: xr.ID, Priority: xr.Priority, ScheduledAt: xr.ScheduledAt}}
	cur.mu.Unlock()
	cur.before(xr) // promoted, say: the cursor moves back before x
	got := claim(100)
	var gotIDs []int64
	for _, r := range got {
		gotIDs = append(gotIDs, r.ID)
	}
	if want := []int64{x[0], ids[1], ids[2]}; !slices.Equal(gotIDs, want) {
		t.Fatalf("claimed %v, want %v", gotIDs, want)
	}
}

// TestClaimCursorRescuedAtIt: the job a cursor stands at (the last one
// claimed), rescued by this process and so available again with the same
// key, moves the cursor back before it: the next claim resumes at it even
// when no read of the front runs in the claim (reading the front is slow,
// and the read due is a probe apart from it).
func TestClaimCursorRescuedAtIt(t *testing.T) {
	d := &Driver{q: queries{ClaimSelect: "front", ClaimSelectAfter: "after"}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := &driver.JobRow{ID: 7, Priority: 1, ScheduledAt: t0}
	c := &claimCursor{}
	p := driver.ClaimParams{Queue: "q", Limit: 1}
	_, _, st := c.query(d, p)
	c.advance([]*driver.JobRow{j}, 1, st, time.Second)
	c.before(&driver.JobRow{ID: 7, Priority: 1, ScheduledAt: t0})
	c.mu.Lock()
	c.scanned = time.Time{}
	c.mu.Unlock()
	q, args, st := c.query(d, p)
	if q != "after" || !st.probe {
		t.Fatalf("claim: %s (probe %v), want after, with a probe started", q, st.probe)
	}
	if got := args[6]; got != int64(6) {
		t.Fatalf("claim resumes after job %v, want after job 6 (so that job 7 is read)", got)
	}
}
