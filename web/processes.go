package web

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
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
	StartedAt   jsonTime       `json:"started_at"`
	HeartbeatAt jsonTime       `json:"heartbeat_at"`
	ExpiresAt   jsonTime       `json:"expires_at"`
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
	ReadAt jsonTime `json:"read_at"`
}

func toProcessesJSON(rd *reading) processesJSON {
	out := processesJSON{Processes: make([]processJSON, 0, len(rd.Processes)), ReadAt: jsonTime(rd.At)}
	for _, p := range rd.Processes {
		x := processJSON{
			ID: p.ID, Kind: string(p.Kind), Host: p.Host, Version: stringOrNull(p.Version), Queues: p.Queues,
			StartedAt: jsonTime(p.StartedAt), HeartbeatAt: jsonTime(p.HeartbeatAt), ExpiresAt: jsonTime(p.ExpiresAt),
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

// Registration of HTTP workers in the processes table.
const (
	// httpWorkerInterval is the most often one HTTP worker's row is
	// written: the first request of the worker after it passed refreshes
	// it.
	httpWorkerInterval = 5 * time.Second
	// httpWorkerTTL is how long an HTTP worker's row stays alive after a
	// refresh, and how long a queue counts as worked by it after its
	// last claim there (or heartbeat of a job of it).
	httpWorkerTTL = 30 * time.Second
	// heldJobTTL forgets a claimed job that was neither heartbeated nor
	// acknowledged for longer than the longest lease (1h).
	heldJobTTL = maxLease + time.Minute
)

// httpWorkers keeps, in memory, the HTTP workers this handler serves and
// writes each one's row in the processes table (kind "http") at most once
// per httpWorkerInterval, from the request that finds the row due: a
// claim (before its claim statement, and at each retry of a long poll,
// so a worker waiting on an empty queue stays alive) or a heartbeat of a
// job this handler handed out (so a worker busy with long jobs, which
// does not claim, stays alive too). A worker's queues are those it
// claimed from, or heartbeated a job of, within httpWorkerTTL. The
// protocol has no goodbye: a stopped worker's row expires.
type httpWorkers struct {
	drv driver.Driver
	log *slog.Logger

	mu        sync.Mutex
	workers   map[string]*httpWorker // by process id
	jobs      map[int64]heldJob      // jobs handed out, by id
	lastSweep time.Time
}

// httpWorker is one HTTP worker as this handler saw it.
type httpWorker struct {
	host    string
	queues  map[string]time.Time // when last claimed from or heartbeated a job of
	written time.Time            // when its row was last written (or tried)
	writing bool
}

// heldJob is a job handed out by a claim, until its outcome.
type heldJob struct {
	worker, queue string
	at            time.Time
}

func newHTTPWorkers(drv driver.Driver, log *slog.Logger) *httpWorkers {
	return &httpWorkers{drv: drv, log: log, workers: map[string]*httpWorker{}, jobs: map[int64]heldJob{}}
}

// processID is the processes table's id of the HTTP worker of a claim:
// its attempted_by ("http:" and its name); an unnamed worker is listed
// by the host it connects from (its attempted_by also has the port,
// which changes with every connection).
func processID(name, remoteAddr string) string {
	if name != "" {
		return "http:" + name
	}
	return "http:" + remoteHost(remoteAddr)
}

// remoteHost is the host part of a remote address.
func remoteHost(remoteAddr string) string {
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}

// claiming records that worker id (at host) claims from queue, and
// writes its row if due.
func (hw *httpWorkers) claiming(ctx context.Context, id, host, queue string) {
	now := time.Now()
	hw.mu.Lock()
	w := hw.workers[id]
	if w == nil {
		w = &httpWorker{queues: map[string]time.Time{}}
		hw.workers[id] = w
	}
	w.host = host
	w.queues[queue] = now
	hw.mu.Unlock()
	hw.refresh(ctx, id)
}

// claimed records the jobs a claim handed to worker id.
func (hw *httpWorkers) claimed(id string, rows []*driver.JobRow) {
	now := time.Now()
	hw.mu.Lock()
	defer hw.mu.Unlock()
	for _, r := range rows {
		hw.jobs[r.ID] = heldJob{worker: id, queue: r.Queue, at: now}
	}
}

// beat records a renewed lease of job: its worker still works its queue.
func (hw *httpWorkers) beat(ctx context.Context, job int64) {
	now := time.Now()
	hw.mu.Lock()
	j, ok := hw.jobs[job]
	w := hw.workers[j.worker]
	if !ok || w == nil {
		hw.mu.Unlock()
		return // handed out by another handler, or forgotten
	}
	j.at = now
	hw.jobs[job] = j
	w.queues[j.queue] = now
	hw.mu.Unlock()
	hw.refresh(ctx, j.worker)
}

// done forgets a job whose attempt ended (an outcome, a release, or a
// refusal: it is no longer held under the fence the worker knows).
func (hw *httpWorkers) done(job int64) {
	hw.mu.Lock()
	delete(hw.jobs, job)
	hw.mu.Unlock()
}

// refresh writes worker id's row when httpWorkerInterval passed since
// the last write and no other request is writing it. A failed write is
// logged and tried again a second later; it never fails the request.
func (hw *httpWorkers) refresh(ctx context.Context, id string) {
	now := time.Now()
	hw.mu.Lock()
	hw.sweep(now)
	w := hw.workers[id]
	if w == nil || w.writing || now.Sub(w.written) < httpWorkerInterval {
		hw.mu.Unlock()
		return
	}
	w.writing = true
	row := driver.ProcessRow{ID: id, Kind: driver.ProcessHTTP, Host: w.host, Queues: map[string]int{}}
	for q, at := range w.queues {
		if now.Sub(at) <= httpWorkerTTL {
			row.Queues[q] = 0
		} else {
			delete(w.queues, q)
		}
	}
	hw.mu.Unlock()

	// Not cut short by the worker going away: the row says it was here.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	err := hw.drv.RegisterProcess(wctx, row, httpWorkerTTL)
	cancel()

	hw.mu.Lock()
	w.writing = false
	w.written = now
	if err != nil {
		w.written = now.Add(time.Second - httpWorkerInterval)
	}
	hw.mu.Unlock()
	if err != nil {
		hw.log.Error("conveyor web: registering an HTTP worker in the processes table", "worker", id, "err", err)
	}
}

// sweep forgets workers silent for longer than their row lives and jobs
// held longer than any lease, at most once per httpWorkerTTL. hw.mu is
// held.
func (hw *httpWorkers) sweep(now time.Time) {
	if now.Sub(hw.lastSweep) < httpWorkerTTL {
		return
	}
	hw.lastSweep = now
	for id, j := range hw.jobs {
		if now.Sub(j.at) > heldJobTTL {
			delete(hw.jobs, id)
		}
	}
	for id, w := range hw.workers {
		if !w.writing && now.Sub(w.written) > httpWorkerTTL && now.Sub(latest(w.queues)) > httpWorkerTTL {
			delete(hw.workers, id)
		}
	}
}

// latest is the latest of the times in m (zero when empty).
func latest(m map[string]time.Time) time.Time {
	var t time.Time
	for _, x := range m {
		if x.After(t) {
			t = x
		}
	}
	return t
}
