package torture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Record line types. Every process of a run (workers, producers and the
// orchestrator itself) appends JSON lines to a file of its own, outside the
// queue's tables.
const (
	lineHello    = "hello"    // the process is up (pid, role)
	lineStart    = "start"    // a handler began an execution
	lineEnd      = "end"      // a handler returned (out, err)
	lineEnq      = "enq"      // an enqueue was acknowledged (job, tok; for a unique job its key, the duplicate flag and when the call began)
	lineRollback = "rb"       // a transactional enqueue was rolled back (tok)
	lineAmbig    = "amb"      // an enqueue's outcome is unknown (error at commit)
	lineApplied  = "applied"  // a worker saw the row completed at the attempt it ran
	lineCounters = "counters" // the client's Counters(), written every 500ms and at exit
	lineBye      = "bye"      // the process stopped gracefully
	lineReady    = "ready"    // a worker process started its client (and its periodic job)
	lineSlowBeat = "slowbeat" // the engine reported a lease renewal slower than its interval (lab.OnSlowRenewal; At: when its answer was applied, Took: how long it took)
	lineLate     = "late"     // the engine reported a claim slower than its interval (lab.OnLateClaim; At: when it came back, B: when it was sent, Dl: its jobs' cut-off deadline, IDs and Atts: its attempts)
	lineBatch    = "bat"      // a batch's enqueue was acknowledged (Bat: its id, IDs: its jobs' ids)
	lineBatchCB  = "cb"       // a batch's callback read its batch (Job, Att: the callback; Bat: the batch; C: the counts of its jobs' states)
)

// line is one record line; T says which fields are set. Times are Unix
// nanoseconds of the writing process's clock (every process of a run is on
// the same machine and the same clock).
type line struct {
	T    string           `json:"t"`
	Proc string           `json:"proc,omitempty"`
	Role string           `json:"role,omitempty"`
	PID  int              `json:"pid,omitempty"`
	At   int64            `json:"at"`
	Job  int64            `json:"job,omitempty"`
	Att  int              `json:"att,omitempty"`
	Kind string           `json:"kind,omitempty"`
	Enq  int64            `json:"enq,omitempty"`
	Out  string           `json:"out,omitempty"`
	Err  string           `json:"err,omitempty"`
	Tok  string           `json:"tok,omitempty"`
	C    map[string]int64 `json:"c,omitempty"`
	// U is a unique job's key (see uniqueKeyOf), Dup whether the enqueue
	// was told it was a duplicate (Job is then the holder's id), and B
	// when the enqueue call (or its transaction) began.
	U   string `json:"u,omitempty"`
	Dup bool   `json:"dup,omitempty"`
	B   int64  `json:"b,omitempty"`
	// Sch is a periodic job's ScheduledAt as its handler saw it.
	Sch int64 `json:"sch,omitempty"`
	// Took is how long a slow lease renewal took, in nanoseconds.
	Took int64 `json:"took,omitempty"`
	// Cl is the attempt's AttemptedAt as the handler saw it (the
	// database's clock at the claim).
	Cl int64 `json:"cl,omitempty"`
	// Bat is a batch's id and IDs its jobs' ids.
	Bat int64   `json:"bat,omitempty"`
	IDs []int64 `json:"ids,omitempty"`
	// Cut, on an end line, is when the handler's context ended, if it
	// ended before the handler returned.
	Cut int64 `json:"cut,omitempty"`
	// Dl, on a late line, is when the engine cuts the claimed
	// attempts off unless a renewal gets through; Atts their attempt
	// numbers, beside their ids in IDs.
	Dl   int64 `json:"dl,omitempty"`
	Atts []int `json:"atts,omitempty"`
}

// recorder appends lines to one file. Each line is one write(2) on an
// O_APPEND descriptor, unbuffered: a line is in the kernel before the
// recorded event has any effect on the queue (a handler records its end
// before it returns, a producer records an enqueue only after the commit),
// so a process killed with SIGKILL loses no line it wrote. Lines are not
// fsynced: the record survives process deaths, not machine crashes.
type recorder struct {
	mu   sync.Mutex
	f    *os.File
	proc string
	pid  int
	err  error
}

func newRecorder(path, proc string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f, proc: proc, pid: os.Getpid()}, nil
}

func (r *recorder) write(l line) {
	l.Proc, l.PID = r.proc, r.pid
	if l.At == 0 {
		l.At = time.Now().UnixNano()
	}
	b, err := json.Marshal(l)
	if err != nil {
		r.setErr(err)
		return
	}
	b = append(b, '\n')
	if _, err := r.f.Write(b); err != nil {
		r.setErr(err)
	}
}

func (r *recorder) setErr(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

func (r *recorder) close() error {
	r.mu.Lock()
	err := r.err
	r.mu.Unlock()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// records is everything read back from a run's record files.
type records struct {
	execs      []Exec
	acked      map[int64]string    // id -> token
	ackedAt    map[int64]time.Time // id -> when the enqueue was acknowledged
	ackedKind  map[int64]string    // id -> kind
	rolledBack map[string]bool
	ambiguous  int
	applied    map[int64][]int     // job -> attempts seen completed
	appliedAt  map[int64]time.Time // job -> when a worker first saw it completed
	// told: what every committed enqueue of a unique job was told;
	// toldRolledBack counts those told in transactions rolled back, and
	// dupRolledBack those of them told they were duplicates.
	told                          []Told
	toldRolledBack, dupRolledBack int
	// failedTx counts the jobs of transactions rolled back because an
	// enqueue in them failed (a deadlock, a lost connection), and
	// failedTxErr is one of those errors.
	failedTx    int
	failedTxErr string
	// ready: when each worker incarnation (proc) had started its client.
	ready map[string]time.Time
	// counters: the last counters line of each process incarnation
	// (proc name -> counters), and which incarnations said goodbye.
	counters map[string]map[string]int64
	bye      map[string]bool
	pids     map[string]int // proc -> pid
	bad      int            // unparsable lines (a write cut by a kill)
	// slowBeats: the slow lease renewals each process logged; lateClaims
	// its late claims.
	slowBeats  map[int][]Renewal
	lateClaims map[int][]LateClaim
	// batches: the batches enqueued; batchSeen: what their callbacks read.
	batches   []BatchRec
	batchSeen []BatchSeen
}

// readRecords parses every *.jsonl file in dir.
func readRecords(dir string) (*records, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	rs := &records{
		acked: map[int64]string{}, ackedAt: map[int64]time.Time{}, ackedKind: map[int64]string{}, rolledBack: map[string]bool{}, applied: map[int64][]int{},
		appliedAt: map[int64]time.Time{}, ready: map[string]time.Time{},
		counters: map[string]map[string]int64{}, bye: map[string]bool{}, pids: map[string]int{},
		slowBeats: map[int][]Renewal{}, lateClaims: map[int][]LateClaim{},
	}
	type key struct {
		proc     string
		job      int64
		att      int
		startSeq int
	}
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		// Executions of one process are matched start-to-end by (job,
		// attempt); a process runs one attempt of a job at most once.
		open := map[[2]int64]int{} // (job, attempt) -> index in execs
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				rs.bad++
				continue
			}
			switch l.T {
			case lineHello:
				rs.pids[l.Proc] = l.PID
			case lineStart:
				open[[2]int64{l.Job, int64(l.Att)}] = len(rs.execs)
				e := Exec{Job: l.Job, Attempt: l.Att, Kind: l.Kind, Proc: l.Proc, PID: l.PID, Start: time.Unix(0, l.At)}
				if l.Enq != 0 {
					e.Enqueued = time.Unix(0, l.Enq)
				}
				if l.Sch != 0 {
					e.Scheduled = time.Unix(0, l.Sch)
				}
				if l.Cl != 0 {
					e.Claimed = time.Unix(0, l.Cl)
				}
				rs.execs = append(rs.execs, e)
			case lineEnd:
				k := [2]int64{l.Job, int64(l.Att)}
				i, ok := open[k]
				if !ok {
					rs.bad++
					continue
				}
				delete(open, k)
				rs.execs[i].End = time.Unix(0, l.At)
				if l.Cut != 0 {
					rs.execs[i].Cancelled = time.Unix(0, l.Cut)
				}
				rs.execs[i].Outcome = l.Out
				rs.execs[i].Err = l.Err
			case lineEnq:
				if l.U != "" {
					rs.told = append(rs.told, Told{Tok: l.Tok, Key: l.U, ID: l.Job, Dup: l.Dup, Proc: l.Proc,
						Begin: time.Unix(0, l.B), At: time.Unix(0, l.At)})
				}
				if !l.Dup { // a duplicate inserted nothing: the id is the holder's
					rs.acked[l.Job] = l.Tok
					rs.ackedAt[l.Job] = time.Unix(0, l.At)
					rs.ackedKind[l.Job] = l.Kind
				}
			case lineRollback:
				rs.rolledBack[l.Tok] = true
				if l.Err != "" {
					rs.failedTx++
					rs.failedTxErr = l.Err
				}
				if l.U != "" {
					rs.toldRolledBack++
					if l.Dup {
						rs.dupRolledBack++
					}
				}
			case lineReady:
				rs.ready[l.Proc] = time.Unix(0, l.At)
			case lineAmbig:
				rs.ambiguous++
			case lineApplied:
				rs.applied[l.Job] = append(rs.applied[l.Job], l.Att)
				if t, ok := rs.appliedAt[l.Job]; !ok || time.Unix(0, l.At).Before(t) {
					rs.appliedAt[l.Job] = time.Unix(0, l.At)
				}
			case lineCounters:
				rs.counters[l.Proc] = l.C
			case lineBye:
				rs.bye[l.Proc] = true
			case lineBatch:
				rs.batches = append(rs.batches, BatchRec{ID: l.Bat, Jobs: l.IDs, At: time.Unix(0, l.At)})
			case lineBatchCB:
				rs.batchSeen = append(rs.batchSeen, BatchSeen{Job: l.Job, Attempt: l.Att, Batch: l.Bat, Counts: l.C})
			case lineSlowBeat:
				done := time.Unix(0, l.At)
				rs.slowBeats[l.PID] = append(rs.slowBeats[l.PID], Renewal{Sent: done.Add(-time.Duration(l.Took)), Done: done})
			case lineLate:
				lc := LateClaim{Sent: time.Unix(0, l.B), Back: time.Unix(0, l.At), Deadline: time.Unix(0, l.Dl)}
				for i, id := range l.IDs {
					if i < len(l.Atts) {
						lc.Jobs = append(lc.Jobs, JobAttempt{ID: id, Attempt: l.Atts[i]})
					}
				}
				rs.lateClaims[l.PID] = append(rs.lateClaims[l.PID], lc)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	return rs, nil
}

// sumCounter adds a counter over every process incarnation.
func (rs *records) sumCounter(name string) int64 {
	var n int64
	for _, c := range rs.counters {
		n += c[name]
	}
	return n
}

// counterBy returns a counter per process incarnation, for the ones where
// it is not zero, as "w1.0=3 w2.1=1".
func (rs *records) counterBy(name string) string {
	var parts []string
	for p, c := range rs.counters {
		if c[name] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", p, c[name]))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
