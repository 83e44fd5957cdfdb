package mysql

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
	gomysql "github.com/go-sql-driver/mysql"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if galeraCluster != nil {
		galeraCluster.Stop()
	}
	os.Exit(code)
}

// One 3-node Galera cluster for the package's tests, started by the
// first that needs it and stopped by TestMain.
var (
	galeraOnce    sync.Once
	galeraCluster *topology.Galera
	galeraErr     error
)

func galera(t *testing.T) *topology.Galera {
	t.Helper()
	topology.NeedGalera(t)
	galeraOnce.Do(func() { galeraCluster, galeraErr = topology.StartGalera(context.Background(), 3) })
	if galeraErr != nil {
		t.Fatalf("galera: %v", galeraErr)
	}
	return galeraCluster
}

// TestDriverSuiteGalera runs the driver suite against a 3-node Galera
// cluster, each driver a test opens on the next node: the driver takes
// its Galera paths (ids returned by the inserts, causal admin reads, the
// migration lock row) and its writes through different nodes conflict
// at certification instead of waiting for each other's locks.
func TestDriverSuiteGalera(t *testing.T) {
	g := galera(t)
	drivertest.Run(t, testdb.Prefix, func(t *testing.T, prefix string) driver.Driver {
		t.Helper()
		d, err := Open(context.Background(), g.NextDSN(), driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		if !d.galera || !d.returning {
			t.Fatalf("opened on a Galera node: galera %v, returning %v; want both", d.galera, d.returning)
		}
		return d
	})
}

// TestTryLeadAcrossNodes: drivers on the three nodes take a free
// maintenance leadership at the same moment, round after round. Each
// node's upsert sees only its own node's row; certification lets one
// commit and the others retry (error 1213) and read the winner: exactly
// one leads each round.
func TestTryLeadAcrossNodes(t *testing.T) {
	g := galera(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var ds []*Driver
	for i := 1; i <= 3; i++ {
		d, err := Open(ctx, g.DSN(i), driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, err := d.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	defer func() {
		if err := ds[0].DropAll(ctx); err != nil {
			t.Error(err)
		}
	}()
	for round := 0; round < 20; round++ {
		if _, err := ds[0].db.ExecContext(ctx, "DELETE FROM `"+prefix+"leader`"); err != nil {
			t.Fatal(err)
		}
		// Every node applies the delete before the round: a node that
		// still had last round's row would find its lease unexpired,
		// change nothing, then read no leader once the delete arrived.
		for _, d := range ds {
			var n int
			if err := d.db.QueryRowContext(ctx, d.q.CausalRead+" SELECT COUNT(*) FROM `"+prefix+"leader`").Scan(&n); err != nil || n != 0 {
				t.Fatalf("round %d: leader rows after the delete: %d, %v", round, n, err)
			}
		}
		leads := make([]bool, len(ds))
		errs := make([]error, len(ds))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				leads[i], errs[i] = d.TryLead(ctx, fmt.Sprintf("r%d-node%d", round, i+1), time.Minute)
			}()
		}
		close(start)
		wg.Wait()
		n := 0
		for i := range ds {
			if errs[i] != nil {
				t.Fatalf("round %d: node %d: %v", round, i+1, errs[i])
			}
			if leads[i] {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d leaders (%v), want exactly one", round, n, leads)
		}
	}
	var retries int64
	for _, d := range ds {
		retries += d.Counters()["deadlock_retries"]
	}
	t.Logf("certification conflicts retried: %d", retries)
}

// TestGaleraInsertRowPerStatement: on a Galera node without RETURNING
// (forced here), Insert writes each row as a statement of its own, in one
// transaction. A batch whose second row the server refuses commits
// nothing, and its error says so; a good batch gets distinct ids.
func TestGaleraInsertRowPerStatement(t *testing.T) {
	g := galera(t)
	ctx := context.Background()
	d, err := Open(ctx, g.DSN(1), driver.Options{Prefix: testdb.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.DropAll(ctx); err != nil {
			t.Error(err)
		}
	}()
	d.returning = false
	job := func(queue string, priority int) driver.InsertParams {
		return driver.InsertParams{Queue: queue, Kind: "k", Args: []byte(`{}`), Priority: priority, MaxAttempts: 1}
	}
	ids, err := d.Insert(ctx, []driver.InsertParams{job("good", 0), job("good", 0), job("good", 0)})
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
		t.Fatalf("ids %v, want distinct", ids)
	}
	// The priority column is an INT: strict mode refuses 1<<40.
	_, err = d.Insert(ctx, []driver.InsertParams{job("bad", 0), job("bad", 1<<40), job("bad", 0)})
	if err == nil {
		t.Fatal("insert of an out-of-range priority succeeded")
	}
	var n int
	if err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+d.prefix+"jobs` WHERE queue = 'bad'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("failed insert left %d of its rows committed (error %v, not committed: %v); want none", n, err, driver.IsNotCommitted(err))
	}
	if !driver.IsNotCommitted(err) {
		t.Fatalf("failed insert that committed nothing: %v, not marked NotCommitted", err)
	}
}

// TestRefusedOnGalera: which commit errors mark a write NotCommitted. On
// Galera, 1180 and 1047 may come after the cluster committed the write
// set; a certification failure (1213) and a broken connection found
// before sending are refusals everywhere.
func TestRefusedOnGalera(t *testing.T) {
	bad := errors.New("lost")
	for _, c := range []struct {
		err           error
		single, multi bool // NotCommitted on a single server, on Galera
	}{
		{&gomysql.MySQLError{Number: 1180, Message: "error during commit"}, true, false},
		{&gomysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node"}, true, false},
		{&gomysql.MySQLError{Number: 1213, Message: "deadlock"}, true, true},
		{&gomysql.MySQLError{Number: 1062, Message: "duplicate"}, true, true},
		{fmt.Errorf("wrapped: %w", sqldriver.ErrBadConn), true, true},
		{bad, false, false},
	} {
		for _, galera := range []bool{false, true} {
			want := c.single
			if galera {
				want = c.multi
			}
			d := &Driver{galera: galera}
			if got := driver.IsNotCommitted(d.refused(c.err)); got != want {
				t.Errorf("galera %v: %v: NotCommitted %v, want %v", galera, c.err, got, want)
			}
		}
	}
}

// TestGaleraMigrationLockLost: a migrator whose lock row another
// migrator took through another node (as after its lease expired during
// a long DDL) learns it at its next renewal, which ends the context its
// migration statements run under, and cannot record a version.
func TestGaleraMigrationLockLost(t *testing.T) {
	g := galera(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var ds []*Driver
	for i := 1; i <= 2; i++ {
		d, err := Open(ctx, g.DSN(i), driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	defer func() {
		if err := ds[0].DropAll(ctx); err != nil {
			t.Error(err)
		}
	}()
	if _, err := ds[0].db.ExecContext(ctx, ds[0].q.MigrationsTable); err != nil {
		t.Fatal(err)
	}
	l, err := ds[0].lockMigrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.unlock()
	// Through node 2, once it has applied the lock row's write set.
	res, err := ds[1].db.ExecContext(ctx, "SET STATEMENT wsrep_sync_wait = 2 FOR UPDATE `"+prefix+"migration_lock` SET holder = 'other', expires_at = UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("taking the lock row through node 2: %d rows, %v; want 1", n, err)
	}
	select {
	case <-l.ctx.Done():
	case <-time.After(4 * migrationLockRenew):
		t.Fatal("the migration lock's context did not end after another migrator took the lock")
	}
	if cause := context.Cause(l.ctx); !errors.Is(cause, errMigrationLockLost) {
		t.Fatalf("lock context ended with %v, want %v", cause, errMigrationLockLost)
	}
	if err := l.record(ctx, 1); !errors.Is(err, errMigrationLockLost) {
		t.Fatalf("record after losing the lock: %v, want %v", err, errMigrationLockLost)
	}
	var n int
	if err := ds[0].db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+prefix+"schema_migrations`").Scan(&n); err != nil || n != 0 {
		t.Fatalf("versions recorded: %d, %v; want none", n, err)
	}
}

// TestGaleraAckThroughOtherNode: jobs claimed through node 1 are
// heartbeated and completed at once through node 2, which may not have
// applied the claims yet. The acknowledgements wait for it (causal_ack):
// none is refused while its lease is valid; nor is the cancel through
// node 2 of a job just enqueued through node 1.
func TestGaleraAckThroughOtherNode(t *testing.T) {
	g := galera(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var ds []*Driver
	for i := 1; i <= 2; i++ {
		d, err := Open(ctx, g.DSN(i), driver.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	if _, err := ds[0].Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ds[0].DropAll(ctx); err != nil {
			t.Error(err)
		}
	}()
	const rounds, batch = 100, 8
	jobs := make([]driver.InsertParams, batch)
	for i := range jobs {
		jobs[i] = driver.InsertParams{Queue: "q", Kind: "k", Args: []byte(`{}`), MaxAttempts: 1}
	}
	for round := 0; round < rounds; round++ {
		if _, err := ds[0].Insert(ctx, jobs); err != nil {
			t.Fatal(err)
		}
		claimed, err := ds[0].Claim(ctx, driver.ClaimParams{Queue: "q", Limit: batch, Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) != batch {
			t.Fatalf("round %d: claimed %d jobs, want %d", round, len(claimed), batch)
		}
		var leases []driver.Lease
		var outcomes []driver.Outcome
		for _, j := range claimed {
			leases = append(leases, driver.Lease{ID: j.ID, Fence: j.Fence})
			outcomes = append(outcomes, driver.Outcome{ID: j.ID, Fence: j.Fence, Attempt: j.Attempt, State: "completed"})
		}
		// Half the rounds heartbeat first, half complete straight away.
		if round%2 == 0 {
			owned, err := ds[1].Heartbeat(ctx, leases, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(owned) != batch {
				t.Fatalf("round %d: heartbeat through node 2 kept %d of %d valid leases", round, len(owned), batch)
			}
		}
		done, err := ds[1].Complete(ctx, outcomes)
		if err != nil {
			t.Fatal(err)
		}
		if len(done) != batch {
			t.Fatalf("round %d: completion through node 2 applied %d of %d outcomes of valid leases", round, len(done), batch)
		}
	}
	// A job enqueued through node 1 is cancelled at once through node 2.
	for round := 0; round < rounds; round++ {
		ids, err := ds[0].Insert(ctx, jobs[:1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ds[1].Cancel(ctx, ids[0]); err != nil {
			t.Fatalf("round %d: cancel through node 2 of a job just enqueued: %v", round, err)
		}
	}
}
