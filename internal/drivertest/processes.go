package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// processes runs the suite's tests of the process registry: register,
// refresh, expire, prune, remove.
func processes(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("Processes", func(t *testing.T) {
		d := s.setup(t)
		list := func() map[string]driver.ProcessRow {
			t.Helper()
			ps, err := d.Processes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]driver.ProcessRow{}
			seenGone := false
			for _, p := range ps {
				if p.Alive && seenGone {
					t.Fatalf("alive process %q listed after a gone one: %+v", p.ID, ps)
				}
				seenGone = seenGone || !p.Alive
				out[p.ID] = p
			}
			return out
		}
		reg := func(p driver.ProcessRow, ttl time.Duration) {
			t.Helper()
			if err := d.RegisterProcess(ctx, p, ttl); err != nil {
				t.Fatal(err)
			}
		}
		if ps := list(); len(ps) != 0 {
			t.Fatalf("fresh table lists %+v", ps)
		}
		a := driver.ProcessRow{ID: "host-a/41/ab", Kind: driver.ProcessClient, Host: "host-a", PID: 41, Version: "v1.2.3", Queues: map[string]int{"q1": 5, "q2": 1}}
		b := driver.ProcessRow{ID: "http:mailer-1", Kind: driver.ProcessHTTP, Host: "127.0.0.1:5000"}
		reg(a, time.Minute)
		reg(b, time.Minute)
		ps := list()
		ga, gb := ps[a.ID], ps[b.ID]
		if len(ps) != 2 || !ga.Alive || ga.Kind != a.Kind || ga.Host != a.Host || ga.PID != 41 || ga.Version != a.Version ||
			len(ga.Queues) != 2 || ga.Queues["q1"] != 5 || ga.Queues["q2"] != 1 {
			t.Fatalf("process a listed as %+v", ga)
		}
		if ga.StartedAt.IsZero() || ga.HeartbeatAt.Before(ga.StartedAt) || !ga.ExpiresAt.After(ga.HeartbeatAt) || ga.ExpiresAt.Sub(ga.HeartbeatAt) > time.Minute+time.Millisecond {
			t.Fatalf("process a times: started %v heartbeat %v expires %v (ttl 1m)", ga.StartedAt, ga.HeartbeatAt, ga.ExpiresAt)
		}
		if !gb.Alive || gb.Kind != driver.ProcessHTTP || gb.PID != 0 || gb.Version != "" || gb.Queues == nil || len(gb.Queues) != 0 {
			t.Fatalf("process b listed as %+v", gb)
		}
		// A refresh moves the heartbeat and replaces the queues, keeping
		// the start.
		time.Sleep(20 * time.Millisecond)
		a.Queues = map[string]int{"q3": 7}
		reg(a, time.Minute)
		ga2 := list()[a.ID]
		if !ga2.StartedAt.Equal(ga.StartedAt) || !ga2.HeartbeatAt.After(ga.HeartbeatAt) || len(ga2.Queues) != 1 || ga2.Queues["q3"] != 7 {
			t.Fatalf("refreshed a: %+v, before %+v", ga2, ga)
		}
		// A process whose ttl passed is listed as gone, after the alive
		// ones; registering again starts it anew.
		c := driver.ProcessRow{ID: "host-c/7/cd", Kind: driver.ProcessClient, Host: "host-c", PID: 7, Queues: map[string]int{"q1": 1}}
		reg(c, 100*time.Millisecond)
		first := list()[c.ID]
		if !first.Alive {
			t.Fatalf("process c not alive just after registering with a 100ms ttl: %+v", first)
		}
		deadline := time.Now().Add(10 * time.Second)
		for list()[c.ID].Alive {
			if time.Now().After(deadline) {
				t.Fatal("process c still alive 10s after its 100ms ttl")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if ps := list(); !ps[a.ID].Alive || !ps[b.ID].Alive {
			t.Fatalf("a or b gone with c: %+v", ps)
		}
		reg(c, time.Minute)
		again := list()[c.ID]
		if !again.Alive || !again.StartedAt.After(first.HeartbeatAt) {
			t.Fatalf("c registered again after expiring: %+v, first %+v; want alive and started anew", again, first)
		}
		// Pruning removes only rows expired longer ago than the age.
		reg(c, time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		if n, err := d.PruneProcesses(ctx, time.Hour); err != nil || n != 0 {
			t.Fatalf("prune with 1h age deleted %d (%v), want 0", n, err)
		}
		if n, err := d.PruneProcesses(ctx, 0); err != nil || n != 1 {
			t.Fatalf("prune with age 0 deleted %d (%v), want 1 (c)", n, err)
		}
		if ps := list(); len(ps) != 2 || !ps[a.ID].Alive || !ps[b.ID].Alive {
			t.Fatalf("after prune: %+v", ps)
		}
		// A graceful stop removes the row; removing twice is no error.
		for range 2 {
			if err := d.RemoveProcess(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
		}
		if ps := list(); len(ps) != 1 || ps[b.ID].ID != b.ID {
			t.Fatalf("after removing a: %+v", ps)
		}
	})
}
