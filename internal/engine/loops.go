package engine

import (
	"context"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// heartbeatLoop renews the leases of every attempt this process holds with
// one statement per interval, and cancels attempts whose lease was lost.
func (e *Engine) heartbeatLoop(ctx context.Context) {
	lastOK := time.Now()
	var leases []driver.Lease
	for sleep(ctx, e.cfg.HeartbeatInterval) {
		leases = leases[:0]
		for _, f := range e.fetchers {
			leases = f.snapshot(leases)
		}
		if len(leases) == 0 {
			lastOK = time.Now()
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatInterval)
		owned, err := e.drv.Heartbeat(hctx, leases, e.cfg.Lease)
		cancel()
		asked := make(map[int64]int, len(leases))
		for _, l := range leases {
			asked[l.ID] = l.Attempt
		}
		if err != nil {
			e.metrics.DBErrors.Add(1)
			e.logf("conveyor: heartbeat for %d jobs failed: %v", len(leases), err)
			if time.Since(lastOK) < e.cfg.Lease {
				continue
			}
			// No heartbeat got through for a whole lease: others may
			// rescue these jobs now, so stop working on them.
			owned = nil
		} else {
			lastOK = time.Now()
		}
		own := make(map[int64]bool, len(owned))
		for _, id := range owned {
			own[id] = true
		}
		for _, f := range e.fetchers {
			e.metrics.LeasesLost.Add(int64(f.loseLeases(asked, own)))
		}
	}
}

// maintenanceLoop runs promotion, rescue and pruning while this process
// holds leadership; every process competes for it.
func (e *Engine) maintenanceLoop(ctx context.Context) {
	const batch = 1000
	leadTTL := 15 * time.Second
	var leader bool
	var lastLead, lastRescue, lastPrune time.Time
	errs := 0
	for sleep(ctx, e.cfg.PromoteInterval) {
		now := time.Now()
		if now.Sub(lastLead) >= leadTTL/3 || !leader {
			ok, err := e.drv.TryLead(ctx, e.id, leadTTL)
			if err != nil && ctx.Err() != nil {
				return
			}
			if err != nil {
				errs++
				e.metrics.DBErrors.Add(1)
				e.logf("conveyor: leader election failed: %v", err)
				sleep(ctx, errBackoff(errs))
				continue
			}
			errs = 0
			leader, lastLead = ok, now
		}
		if !leader {
			continue
		}
		e.drainLoop(ctx, "promote", batch, &e.metrics.Promoted, e.drv.Promote)
		if now.Sub(lastRescue) >= e.cfg.RescueInterval {
			lastRescue = now
			e.drainLoop(ctx, "rescue", batch, &e.metrics.Rescued, e.drv.Rescue)
		}
		if now.Sub(lastPrune) >= e.cfg.PruneInterval {
			lastPrune = now
			for {
				n, err := e.drv.Prune(ctx, e.cfg.CompletedRetention, e.cfg.DiscardedRetention, batch)
				if err != nil {
					if ctx.Err() == nil {
						e.logf("conveyor: prune failed: %v", err)
					}
					break
				}
				e.metrics.Pruned.Add(n)
				if n < batch {
					break
				}
			}
		}
	}
}

type counter interface{ Add(int64) int64 }

func (e *Engine) drainLoop(ctx context.Context, what string, batch int, m counter, f func(context.Context, int) (map[string]int, error)) {
	for ctx.Err() == nil {
		counts, err := f(ctx, batch)
		if err != nil {
			if ctx.Err() == nil {
				e.metrics.DBErrors.Add(1)
				e.logf("conveyor: %s failed: %v", what, err)
			}
			return
		}
		total := 0
		for _, n := range counts {
			total += n
		}
		m.Add(int64(total))
		e.wakeAll(counts)
		if total < batch {
			return
		}
	}
}

// listenLoop holds this process's one notification connection and wakes
// the fetcher of each queue named in a notification.
func (e *Engine) listenLoop(ctx context.Context) {
	if !e.drv.Capabilities().Listen {
		return
	}
	for try := 1; ctx.Err() == nil; try++ {
		l, err := e.drv.Listen(ctx)
		if err != nil {
			e.logf("conveyor: listen failed (polling meanwhile): %v", err)
			sleep(ctx, errBackoff(try))
			continue
		}
		try = 0
		for {
			q, err := l.Wait(ctx)
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				e.logf("conveyor: listener: %v", err)
				sleep(ctx, errBackoff(1))
				e.wake("")
				continue
			}
			e.wake(q)
		}
		l.Close()
	}
}
