package topology_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// pgExec runs sql on the node, or fails t.
func pgExec(t *testing.T, ctx context.Context, n *topology.PostgresNode, sql string, args ...any) {
	t.Helper()
	c, err := pgx.Connect(ctx, n.DSN("postgres"))
	if err != nil {
		t.Fatalf("%s: connect: %v", n.Name, err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %s: %v", n.Name, sql, err)
	}
}

// pgWait waits (bounded by ctx) until query, run on the node, returns
// true.
func pgWait(t *testing.T, ctx context.Context, n *topology.PostgresNode, what, query string, args ...any) {
	t.Helper()
	c, err := pgx.Connect(ctx, n.DSN("postgres"))
	if err != nil {
		t.Fatalf("%s: connect: %v", n.Name, err)
	}
	defer c.Close(context.Background())
	for {
		var ok bool
		err := c.QueryRow(ctx, query, args...).Scan(&ok)
		if err == nil && ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %s: %v (last error %v)", n.Name, what, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestPostgresFenceAcrossFailover loses a claim in a failover and claims
// the job again on the promoted standby, whose clock is behind the old
// primary's: the first worker's acknowledgements must be refused there.
//
// The old primary's clock ran an hour fast when the job was first claimed
// and released (its fence, a clock reading, replicated), then was set
// right; the standby's clock is ten minutes slow. A fence made of the
// clock alone (greatest(fence + 1, clock)) is then fence + 1 on both
// primaries: the lost claim and the new one carry the same token, and the
// lost worker's completion would complete the new attempt. The WAL
// timeline in the fence's high bits (a promotion starts a new one) keeps
// them apart whatever the clocks say.
func TestPostgresFenceAcrossFailover(t *testing.T) {
	needRoot(t)
	if _, err := topology.PostgresBin(); err != nil {
		testdb.Missing(t, "%v", err)
	}
	lib := topology.FakeTimeLib(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dirA, err := topology.TempDir("conveyor-fence-pg-a-", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dirA) })
	clockA, err := topology.NewClock(lib, dirA, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, err := topology.StartPostgresPrimary(ctx, "primary", dirA, clockA.Env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	dirB, err := topology.TempDir("conveyor-fence-pg-b-", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dirB) })
	b, err := topology.StartPostgresStandby(ctx, "standby", a, dirB, topology.FixedClock(lib, -10*time.Minute).Env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)

	prefix := testdb.Prefix()
	ca := openFenceClient(t, ctx, a.DSN("postgres"), prefix)
	id, err := ca.Enqueue(ctx, fenceJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Claimed and released while the primary's clock runs an hour fast.
	early := claimOne(t, ctx, ca, id, "early")
	if err := ca.RemoteWorkers().Release(ctx, id, early.Fence); err != nil {
		t.Fatal(err)
	}
	if err := clockA.Set(0); err != nil {
		t.Fatal(err)
	}
	pgWait(t, ctx, a, "clock set right", "SELECT abs(extract(epoch FROM clock_timestamp()) - $1::float8) < 60", float64(time.Now().UnixMicro())/1e6)

	// The standby replays everything so far, then loses its primary.
	var lsn string
	c, err := pgx.Connect(ctx, a.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	c.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pgWait(t, ctx, b, "replay the enqueue", "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
	closed, err := topology.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pgExec(t, ctx, b, fmt.Sprintf("ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=%d user=postgres connect_timeout=1'", closed))
	pgExec(t, ctx, b, "SELECT pg_reload_conf()")
	pgWait(t, ctx, a, "standby gone", "SELECT count(*) = 0 FROM pg_stat_replication")
	pgWait(t, ctx, b, "wal receiver gone", "SELECT count(*) = 0 FROM pg_stat_wal_receiver WHERE status = 'streaming'")

	// The claim the failover loses: the primary dies right after it.
	lost := claimOne(t, ctx, ca, id, "lost")
	a.Kill()
	if err := b.Promote(ctx); err != nil {
		t.Fatalf("promote: %v\n%s", err, b.Proc.Tail(10))
	}

	cb := openFenceClient(t, ctx, b.DSN("postgres"), prefix)
	won := claimOne(t, ctx, cb, id, "second")
	t.Logf("fences: released %d, lost %d, new primary %d", early.Fence, lost.Fence, won.Fence)
	checkStaleAcksRefused(t, ctx, b.DSN("postgres"), prefix, cb, id, lost, won)
}
