package topology_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
)

// myConn opens one connection to the node's server, closed at the end of
// the test.
func myConn(t *testing.T, ctx context.Context, n *topology.MariaDBNode) *sql.Conn {
	t.Helper()
	db, err := sql.Open("mysql", n.SQLDSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("%s: connect: %v", n.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// myExec runs statements on c, or fails t.
func myExec(t *testing.T, ctx context.Context, c *sql.Conn, name string, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := c.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %s: %v", name, s, err)
		}
	}
}

// myCaughtUp waits until the replica has applied everything the primary
// has written so far.
func myCaughtUp(t *testing.T, ctx context.Context, primary, replica *sql.Conn) {
	t.Helper()
	var pos string
	if err := primary.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var r int
	if err := replica.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 30)", pos).Scan(&r); err != nil || r != 0 {
		t.Fatalf("replica did not reach %s: %d %v", pos, r, err)
	}
}

// TestMySQLFenceAcrossFailover loses a claim in a failover of MariaDB
// replication and claims the job again on the promoted replica: the first
// worker's acknowledgements must be refused there. With fence = fence + 1
// both claims carry the same token. With fence epochs the lost claim came
// with the old primary's first epoch row, which the replica never
// received either: the replica takes the same epoch number, and the
// server bits of the floor keep the two claims apart.
func TestMySQLFenceAcrossFailover(t *testing.T) {
	needRoot(t)
	topology.Need(t, "mariadb-server", topology.MariaDBTools...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	start := func(name string, id int) *topology.MariaDBNode {
		dir, err := topology.TempDir("conveyor-fence-my-", "mysql")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		n, err := topology.StartMariaDB(ctx, name, dir, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		return n
	}
	a, b := start("primary", 1), start("replica", 2)
	ac, bc := myConn(t, ctx, a), myConn(t, ctx, b)
	myExec(t, ctx, bc, b.Name,
		"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT="+itoa(a.Port)+", MASTER_USER='root', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
		"START SLAVE")
	myExec(t, ctx, ac, a.Name, "CREATE DATABASE test CHARACTER SET utf8mb4")

	prefix := testdb.Prefix()
	ca := openFenceClient(t, ctx, a.DSN("test"), prefix)
	id, err := ca.Enqueue(ctx, fenceJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	myCaughtUp(t, ctx, ac, bc)
	myExec(t, ctx, bc, b.Name, "STOP SLAVE")

	// The claim the failover loses: the primary dies right after it.
	lost := claimOne(t, ctx, ca, id, "lost")
	a.Kill()
	myExec(t, ctx, bc, b.Name, "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")

	cb := openFenceClient(t, ctx, b.DSN("test"), prefix)
	won := claimOne(t, ctx, cb, id, "second")
	t.Logf("fences: lost %d, new primary %d", lost.Fence, won.Fence)
	checkStaleAcksRefused(t, ctx, b.DSN("test"), prefix, cb, id, lost, won)
}
