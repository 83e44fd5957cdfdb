package topology_test

import (
	"context"
	"testing"
	"time"

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
	start = time.Now()
	if err := g.RestartNode(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitSize(ctx, 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("node 2 rejoined in %v", time.Since(start))
}
