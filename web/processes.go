package web

import (
	"net/http"
)

// processJSON is one process in the API.
type processJSON struct {
	// ID is the worker id its jobs show in attempted_by.
	ID string `json:"id"`
	// Kind is "client" (a started conveyor client) or "http" (an HTTP
	// worker).
	Kind string `json:"kind"`
	Host string `json:"host"`
	// PID is null for HTTP workers.
	PID *int `json:"pid"`
	// Version is null when unknown.
	Version *string `json:"version"`
	// Queues maps each queue the process works to its concurrency (0
	// when unknown, as for HTTP workers).
	Queues      map[string]int `json:"queues"`
	StartedAt   JSONTime       `json:"started_at"`
	HeartbeatAt JSONTime       `json:"heartbeat_at"`
	ExpiresAt   JSONTime       `json:"expires_at"`
	// Alive is false for a process whose row expired (it died without
	// stopping); such rows are listed until the maintenance leader
	// prunes them.
	Alive bool `json:"alive"`
	// Self marks the client this handler serves.
	Self bool `json:"self"`
}

// processesJSON is the answer of GET /api/v1/processes.
type processesJSON struct {
	Processes []processJSON `json:"processes"`
	// ReadAt is when the list was read (shared with the queues' counts
	// for StatsMaxAge).
	ReadAt JSONTime `json:"read_at"`
}

func toProcessesJSON(rd *reading) processesJSON {
	out := processesJSON{Processes: make([]processJSON, 0, len(rd.Processes)), ReadAt: JSONTime(rd.At)}
	for _, p := range rd.Processes {
		x := processJSON{
			ID: p.ID, Kind: string(p.Kind), Host: p.Host, Version: stringOrNull(p.Version), Queues: p.Queues,
			StartedAt: JSONTime(p.StartedAt), HeartbeatAt: JSONTime(p.HeartbeatAt), ExpiresAt: JSONTime(p.ExpiresAt),
			Alive: p.Alive, Self: p.Self,
		}
		if p.PID != 0 {
			x.PID = ptr(p.PID)
		}
		if x.Queues == nil {
			x.Queues = map[string]int{}
		}
		out.Processes = append(out.Processes, x)
	}
	return out
}

// apiProcesses lists the processes working queues: alive ones first, then
// those that died without stopping.
func (h *Handler) apiProcesses(w http.ResponseWriter, r *http.Request, _ principal) {
	rd, err := h.stats.get(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toProcessesJSON(rd))
}
