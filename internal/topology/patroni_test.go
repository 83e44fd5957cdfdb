package topology

import (
	"context"
	"testing"
	"time"
)

// TestPatroniCluster starts a cluster, switches its primary over, kills
// the new primary's postmaster, and checks that a writable leader with a
// synchronous standby follows each fault.
func TestPatroniCluster(t *testing.T) {
	c := StartPatroniT(t, PatroniOptions{})
	ctx := context.Background()
	first, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old, nw, err := c.Switchover(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if old.Name != first.Name || nw.Name == old.Name {
		t.Fatalf("switchover: %s -> %s, want a new leader after %s", old.Name, nw.Name, first.Name)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	old, nw, err = c.KillPrimary(ctx, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nw.Name == old.Name {
		t.Fatalf("failover kept %s", old.Name)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
}
