package engine

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// processConfig registers every 5ms with a 1s TTL and prunes rows gone
// for an hour.
func processConfig() Config {
	cfg := testConfig(10 * time.Second)
	cfg.Queues = map[string]int{"q": 4, "r": 2}
	cfg.ProcessInterval, cfg.ProcessTTL, cfg.ProcessPruneAge = 5*time.Millisecond, time.Second, time.Hour
	cfg.Version = "v9.9.9"
	return cfg
}

// A started engine registers itself (id, host, pid, version, queues with
// their concurrency) and keeps refreshing its row; Stop removes the row
// after the last refresh, so nothing registers it again.
func TestProcessRegisteredRefreshedAndRemoved(t *testing.T) {
	d := &fakeDriver{}
	e := startEngine(t, d, processConfig(), nil)
	waitFor(t, "three registrations", func() bool { return d.count("register") >= 3 })
	for _, c := range d.callsOf("register") {
		p := c.procs[0]
		host, _ := os.Hostname()
		if p.ID != e.ID() || p.Kind != driver.ProcessClient || p.Host != host || p.PID != os.Getpid() || p.Version != "v9.9.9" ||
			len(p.Queues) != 2 || p.Queues["q"] != 4 || p.Queues["r"] != 2 || c.dur != time.Second {
			t.Fatalf("registered %+v with ttl %v; want this engine's id, host, pid, version and queues q:4 r:2, ttl 1s", p, c.dur)
		}
	}
	if n := d.count("unregister"); n != 0 {
		t.Fatalf("removed %d times while running", n)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := d.allCalls()
	last := -1
	for i, c := range calls {
		if c.op == "register" || c.op == "unregister" {
			last = i
		}
	}
	if last < 0 || calls[last].op != "unregister" || calls[last].who != e.ID() {
		t.Fatalf("the last process call after Stop was %+v, want the removal of %s", calls[last], e.ID())
	}
	if n := d.count("unregister"); n != 1 {
		t.Fatalf("removed %d times, want 1", n)
	}
}

// A failed registration is retried (sooner than the interval would), and
// does not stop the engine.
func TestProcessRegistrationRetried(t *testing.T) {
	d := &fakeDriver{}
	var fails atomic.Int64
	d.registerProcess = func() error {
		if fails.Add(1) <= 3 {
			return errors.New("database down")
		}
		return nil
	}
	cfg := processConfig()
	cfg.ProcessInterval = time.Hour // only retries can make a second call
	startEngine(t, d, cfg, nil)
	waitFor(t, "a registration after three failures", func() bool { return d.count("register") >= 4 })
}

// Without a ProcessInterval nothing is registered or removed.
func TestProcessNotRegisteredWithoutInterval(t *testing.T) {
	d := &fakeDriver{}
	e := startEngine(t, d, testConfig(10*time.Second), nil)
	waitFor(t, "a claim", func() bool { return d.count("claim") >= 1 })
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := d.count("register") + d.count("unregister"); n != 0 {
		t.Fatalf("%d process calls without a ProcessInterval", n)
	}
}

// The leader prunes long-gone processes with the prune, at the configured
// age.
func TestProcessPrunedByLeader(t *testing.T) {
	d := &fakeDriver{}
	d.tryLead = func() (bool, error) { return true, nil }
	cfg := maintenanceConfig(time.Hour, time.Millisecond)
	cfg.ProcessPruneAge = 15 * time.Minute
	startEngine(t, d, cfg, nil)
	waitFor(t, "two process prunes", func() bool { return d.count("pruneprocesses") >= 2 })
	for _, c := range d.callsOf("pruneprocesses") {
		if c.dur != 15*time.Minute {
			t.Fatalf("pruned processes older than %v, want 15m", c.dur)
		}
	}
}
