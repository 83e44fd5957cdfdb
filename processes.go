package conveyor

import (
	"context"
	"time"
)

// ProcessKind says what kind of process a ProcessInfo is.
type ProcessKind string

const (
	// ProcessKindClient is a started Client working queues in its own
	// process.
	ProcessKindClient ProcessKind = "client"
	// ProcessKindHTTP is a worker of the HTTP worker protocol (package
	// web), registered by the handler that serves its claims.
	ProcessKindHTTP ProcessKind = "http"
)

// ProcessInfo is a process working queues, as Client.Processes lists it.
//
// A started client registers itself at Start and refreshes its row every
// 5s; the row counts as alive for 30s after each refresh, and Stop
// deletes it. A process that died without stopping is listed as not
// Alive until the maintenance leader deletes its row, 15 minutes after it
// expired.
type ProcessInfo struct {
	// ID is the process's worker id, as JobInfo.AttemptedBy shows it for
	// the jobs it claimed ("http:" and the worker's name for HTTP
	// workers).
	ID string
	// Kind is ProcessKindClient or ProcessKindHTTP.
	Kind ProcessKind
	// Host is the host name of a client, or the address an HTTP worker
	// connected from.
	Host string
	// PID is the process id of a client; 0 for an HTTP worker.
	PID int
	// Version is the conveyor version the process was built with
	// ("(devel)" for a build from a work tree; "" when unknown).
	Version string
	// Queues maps each queue the process works to its concurrency
	// (QueueConfig.MaxWorkers); an HTTP worker's queues are those it
	// claimed from recently, with concurrency 0 (unknown).
	Queues map[string]int
	// StartedAt is when the process registered first, HeartbeatAt when
	// it last refreshed its row, ExpiresAt when the row stops counting as
	// alive unless refreshed again; all by the database's clock.
	StartedAt, HeartbeatAt, ExpiresAt time.Time
	// Alive is whether ExpiresAt is still ahead of the database's clock.
	Alive bool
	// Self is set on the row of the client Processes was called on.
	Self bool
}

// Processes lists the processes working queues on this database (started
// clients, and HTTP workers seen by a web handler), alive ones first,
// then by kind and id. Processes that stopped gracefully are not listed;
// those that died are listed with Alive false until their row is pruned.
func (c *Client[TTx]) Processes(ctx context.Context) ([]ProcessInfo, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	rows, err := c.drv.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ProcessInfo, len(rows))
	for i, r := range rows {
		out[i] = ProcessInfo{
			ID: r.ID, Kind: ProcessKind(r.Kind), Host: r.Host, PID: r.PID, Version: r.Version, Queues: r.Queues,
			StartedAt: r.StartedAt, HeartbeatAt: r.HeartbeatAt, ExpiresAt: r.ExpiresAt, Alive: r.Alive,
			Self: r.ID == c.eng.ID(),
		}
	}
	return out, nil
}
