package mysql

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/drivertest"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
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
