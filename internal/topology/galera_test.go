package topology_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor/internal/topology"
)

// TestGaleraStartKillRestart starts a 3-node cluster, kills a node and
// brings it back: the harness the Galera tests stand on.
func TestGaleraStartKillRestart(t *testing.T) {
	topology.NeedGalera(t)
	ctx := context.Background()
	start := time.Now()
	g, err := topology.StartGalera(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	t.Logf("3-node cluster synced in %v", time.Since(start))
	for i := 1; i <= 3; i++ {
		if g.Pid(i) == 0 {
			t.Fatalf("node %d not running", i)
		}
	}
	start = time.Now()
	g.KillNode(2)
	if g.Pid(2) != 0 {
		t.Fatal("node 2 still running after KillNode")
	}
	if err := g.WaitSize(ctx, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("survivors in a cluster of 2 after %v", time.Since(start))
	// Written while node 2 is down: it must have it after rejoining.
	db1 := nodeDB(t, g, 1)
	if _, err := db1.Exec("CREATE TABLE missed (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db1.Exec("INSERT INTO missed VALUES (1), (2), (3)"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := g.RestartNode(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitSize(ctx, 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("node 2 rejoined in %v", time.Since(start))
	var n int
	if err := nodeDB(t, g, 2).QueryRow("SELECT COUNT(*) FROM missed").Scan(&n); err != nil || n != 3 {
		t.Fatalf("node 2 after rejoining: %d rows written while it was down, %v; want 3", n, err)
	}
	// After Stop, nothing starts a node again.
	g.Stop()
	if err := g.RestartNode(ctx, 2); err == nil || !strings.Contains(err.Error(), "cluster stopped") {
		t.Fatalf("RestartNode after Stop: %v; want the cluster-stopped refusal", err)
	}
	if g.Pid(2) != 0 {
		t.Fatal("node 2 running after Stop")
	}
}

// nodeDB opens node i's database test, closed at the end of the test.
func nodeDB(t *testing.T, g *topology.Galera, i int) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", g.Nodes[i-1].Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
