package main

// A queue's limits held across processes and protocols with a real
// `conveyor serve`: the command is built and run as a subprocess on one
// database prefix, two in-process clients (the library) work the queue,
// and an HTTP worker written here claims, runs and completes jobs through
// the serve process's worker protocol. The test records every execution's
// start and end itself, outside the queue, and checks MaxRunning on those
// records and Rate on the jobs' attempted_at (the database's clock).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// limitedJob is the kind of the limited queues' jobs.
type limitedJob struct {
	N int `json:"n"`
}

func (limitedJob) Kind() string { return "serve_limited" }

const serveLimitsToken = "serve-limits-admin-token-0123456789"

// buildConveyor builds the command into a temporary directory, with -race
// when the test binary has it, and returns the executable's path.
func buildConveyor(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	exe := filepath.Join(t.TempDir(), "conveyor")
	args := []string{"build", "-o", exe}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return exe
}

// serveProcess starts `exe serve` with args as a subprocess listening on
// a free loopback port and returns its base URL. It is stopped (SIGTERM,
// then killed after 10s) when ctx ends or the test ends, whichever comes
// first; the cleanup waits for it and fails the test if it did not exit
// cleanly. Its standard error is logged if the test failed.
func serveProcess(t *testing.T, ctx context.Context, exe string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, exe, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "CONVEYOR_DB=")
	pr, pw := io.Pipe()
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = pw, &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting %s serve: %v", exe, err)
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		done <- err
	}()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if !stopped {
			select {
			case err := <-done:
				// Wait reports the cancel itself; what matters is that
				// serve, sent SIGTERM, exited 0 (killed after WaitDelay,
				// it did not stop in time).
				if ps := cmd.ProcessState; ps == nil || !ps.Success() {
					t.Errorf("conveyor serve (pid %d) did not exit cleanly on SIGTERM: %v (%v)", cmd.Process.Pid, err, ps)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("conveyor serve (pid %d) did not exit", cmd.Process.Pid)
			}
		}
		if t.Failed() {
			l := stderr.String()
			if len(l) > 8000 {
				l = "...\n" + l[len(l)-8000:]
			}
			t.Logf("conveyor serve's log:\n%s", l)
		}
	})
	line := make(chan string, 1)
	go func() {
		br := bufio.NewReader(pr)
		l, _ := br.ReadString('\n')
		line <- l
		io.Copy(io.Discard, br)
	}()
	select {
	case l := <-line:
		u := regexp.MustCompile(`http://\S+/`).FindString(l)
		if u == "" {
			cancel()
			stopped = true
			t.Fatalf("conveyor serve printed %q, no URL (%v):\n%s", l, <-done, stderr.String())
		}
		return strings.TrimSuffix(u, "/")
	case <-time.After(time.Minute):
		t.Fatalf("conveyor serve printed nothing in a minute:\n%s", stderr.String())
	case <-ctx.Done():
		t.Fatalf("conveyor serve: %v before it printed its URL:\n%s", ctx.Err(), stderr.String())
	}
	return ""
}

// serveExecution is one run of a job as the test saw it: start and end by
// this process's clock, read in the handler (after the claim that took
// the slot, before the outcome that frees it).
type serveExecution struct {
	id         int64
	start, end time.Time
	by         string // "a" or "b" (in-process clients) or "http"
}

// serveExecutions is the test's record of executions, outside the queue.
type serveExecutions struct {
	mu  sync.Mutex
	all []serveExecution
}

func (x *serveExecutions) add(e serveExecution) {
	x.mu.Lock()
	x.all = append(x.all, e)
	x.mu.Unlock()
}

func (x *serveExecutions) snapshot() []serveExecution {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.all)
}

// work takes 20-40ms, as every job of the test does.
func work() { time.Sleep(time.Duration(20+rand.IntN(21)) * time.Millisecond) }

// mostAtOnce is the most executions of xs in progress at one instant; one
// ending at the instant another starts does not overlap it.
func mostAtOnce(xs []serveExecution) int {
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, x := range xs {
		evs = append(evs, ev{x.start, 1}, ev{x.end, -1})
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d
	})
	n, top := 0, 0
	for _, e := range evs {
		n += e.d
		top = max(top, n)
	}
	return top
}

// mostInWindow is the most of ts within any window of d (from one of
// them, inclusive, to d later, exclusive), and where that window starts.
func mostInWindow(ts []time.Time, d time.Duration) (int, time.Time) {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	top, at := 0, time.Time{}
	for i, s := range ts {
		j := i
		for j < len(ts) && ts[j].Sub(s) < d {
			j++
		}
		if j-i > top {
			top, at = j-i, s
		}
	}
	return top, at
}

// httpLimitsWorker is an HTTP worker of the protocol (docs/web.md) against
// a serve process: claimers each claim one job at a time with a wait, run
// it, heartbeat it while it runs (its lease is far longer than a job, so
// the heartbeat only proves the fence), and complete it.
type httpLimitsWorker struct {
	t      *testing.T
	base   string
	client *http.Client
	log    *serveExecutions
}

// post sends body as JSON to path under the API and decodes a 200 answer
// into out (when not nil); it returns the status, and the body otherwise.
func (w *httpLimitsWorker) post(ctx context.Context, path string, body, out any) (int, string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, "", err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", w.base+"/api/v1"+path, bytes.NewReader(b))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+serveLimitsToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := w.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || out == nil {
		msg, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(msg), nil
	}
	return res.StatusCode, "", json.NewDecoder(res.Body).Decode(out)
}

// claimer works queue until ctx ends or stop is closed; errors fail the
// test (and stop this claimer).
func (w *httpLimitsWorker) claimer(ctx context.Context, stop <-chan struct{}, queue, name string) {
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		var got struct {
			Jobs []struct {
				ID    int64 `json:"id"`
				Kind  string
				Fence json.RawMessage `json:"fence"`
			} `json:"jobs"`
		}
		st, msg, err := w.post(ctx, "/claim", map[string]any{"queue": queue, "limit": 1, "wait_ms": 300, "lease_ms": 30000, "worker": name}, &got)
		if ctx.Err() != nil {
			return
		}
		if err != nil || st != http.StatusOK {
			w.t.Errorf("HTTP claim of %s: %d %s %v", queue, st, msg, err)
			return
		}
		for _, j := range got.Jobs {
			if j.Kind != (limitedJob{}).Kind() {
				w.t.Errorf("HTTP claim of %s: job %d of kind %q", queue, j.ID, j.Kind)
			}
			start := time.Now()
			if st, msg, err := w.post(ctx, fmt.Sprintf("/jobs/%d/heartbeat", j.ID), map[string]any{"fence": j.Fence, "lease_ms": 30000}, nil); err != nil || st != http.StatusOK {
				w.t.Errorf("HTTP heartbeat of job %d: %d %s %v", j.ID, st, msg, err)
				return
			}
			work()
			w.log.add(serveExecution{id: j.ID, start: start, end: time.Now(), by: "http"})
			if st, msg, err := w.post(ctx, fmt.Sprintf("/jobs/%d/complete", j.ID), map[string]any{"fence": j.Fence}, nil); err != nil || st != http.StatusOK {
				w.t.Errorf("HTTP complete of job %d: %d %s %v", j.ID, st, msg, err)
				return
			}
		}
	}
}

// TestLimitsAcrossServeAndClients: on every backend, a queue's
// MaxRunning and Rate hold across two in-process clients and an HTTP
// worker claiming through a `conveyor serve` subprocess, all on one
// database prefix; every job runs exactly once.
func TestLimitsAcrossServeAndClients(t *testing.T) {
	exe := buildConveyor(t) // in the package's directory
	inEmptyDir(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			prefix := freshPrefix(t, dsn)
			testServeLimits(t, exe, dsn, prefix)
		})
	}
}

func testServeLimits(t *testing.T, exe, dsn, prefix string) {
	const (
		runQ, rateQ      = "lim-running", "lim-rate"
		maxRunning, nRun = 5, 150
		rate, period     = 10, 500 * time.Millisecond
		nRate            = 40
		httpClaimers     = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	db := []string{"--db", dsn, "--prefix", prefix}
	mustCLI(t, append([]string{"migrate"}, db...)...)

	var log serveExecutions
	cfg := func() *conveyor.Config {
		return &conveyor.Config{
			TablePrefix: prefix,
			Queues:      map[string]conveyor.QueueConfig{runQ: {MaxWorkers: 4}, rateQ: {MaxWorkers: 4}},
			PollMin:     10 * time.Millisecond, PollMax: 100 * time.Millisecond,
		}
	}
	open := func(name string) *conveyor.Client[any] {
		c, err := connect.Open(ctx, dsn, cfg())
		if err != nil {
			t.Fatalf("opening client %s: %v", name, err)
		}
		t.Cleanup(func() { c.Close() })
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[limitedJob]) error {
			start := time.Now()
			work()
			log.add(serveExecution{id: j.ID, start: start, end: time.Now(), by: name})
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := open("a")
	// Both queues are limited before any process works them: which
	// queues are limited is cached in each process for up to a second.
	if err := a.SetQueueLimits(ctx, runQ, conveyor.QueueLimits{MaxRunning: maxRunning}); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, append([]string{"limits", "set", rateQ, "--rate", fmt.Sprint(rate), "--per", period.String(), "--allow-unknown-queue"}, db...)...)
	got, err := a.QueueLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got[runQ] != (conveyor.QueueLimits{MaxRunning: maxRunning}) || got[rateQ] != (conveyor.QueueLimits{Rate: rate, RatePeriod: period}) {
		t.Fatalf("limits read back: %+v", got)
	}
	b := open("b")

	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(serveLimitsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := serveProcess(t, ctx, exe, append(db, "--token-file", tokens, "--unknown-kinds", "allow")...)

	// Stopped in this order on every path (deferred, so before the
	// cleanups stop serve and drop the tables): the HTTP claimers, then
	// the clients. The clients start once the HTTP worker runs a job
	// (startClients): a process re-takes the slots its own jobs free at
	// once, while serve learns of them at its next poll, so clients
	// started first can keep all 5 slots on a loaded machine and leave
	// the HTTP worker none.
	startClients := func() {
		for _, c := range []*conveyor.Client[any]{a, b} {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			// A cleanup registered after serve's: it runs before serve
			// stops, and after the deferred stop of the claimers.
			t.Cleanup(func() {
				sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer scancel()
				if err := c.Stop(sctx); err != nil {
					t.Errorf("stopping a client: %v", err)
				}
			})
		}
	}
	w := &httpLimitsWorker{t: t, base: base, client: &http.Client{Timeout: 30 * time.Second}, log: &log}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	startClaimers := func(queue string) {
		for i := range httpClaimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.claimer(ctx, stop, queue, fmt.Sprintf("go-limits-%d", i))
			}()
		}
	}

	enqueue := func(queue string, n int) []int64 {
		t.Helper()
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: limitedJob{N: i}, Opts: &conveyor.EnqueueOpts{Queue: queue}}
		}
		rs, err := a.EnqueueMany(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, n)
		for i, r := range rs {
			ids[i] = r.ID
		}
		return ids
	}
	// waitAll waits until every job of ids is completed by the database,
	// then checks that each completed at its first attempt and, by the
	// test's records, was executed exactly once; it returns the jobs.
	waitAll := func(ids []int64) []*conveyor.JobInfo {
		t.Helper()
		for {
			done := 0
			for _, id := range ids {
				j, err := a.Job(ctx, id)
				if err != nil {
					t.Fatalf("job %d: %v", id, err)
				}
				if j.State == conveyor.JobStateCompleted {
					done++
				}
			}
			if done == len(ids) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%d of %d jobs completed before the deadline: %v", done, len(ids), ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
		jobs := make([]*conveyor.JobInfo, len(ids))
		for i, id := range ids {
			j, err := a.Job(ctx, id)
			if err != nil {
				t.Fatalf("job %d: %v", id, err)
			}
			if j.State != conveyor.JobStateCompleted || j.Attempt != 1 {
				t.Errorf("job %d: %s at attempt %d, want completed at attempt 1", id, j.State, j.Attempt)
			}
			jobs[i] = j
		}
		runs := map[int64]int{}
		for _, x := range log.snapshot() {
			runs[x.id]++
		}
		for _, id := range ids {
			if runs[id] != 1 {
				t.Errorf("job %d was executed %d times, want once", id, runs[id])
			}
		}
		return jobs
	}
	byKind := func(ids []int64) map[string]int {
		want := map[int64]bool{}
		for _, id := range ids {
			want[id] = true
		}
		by := map[string]int{}
		for _, x := range log.snapshot() {
			if want[x.id] {
				by[x.by]++
			}
		}
		return by
	}

	// MaxRunning: 150 jobs, 11 workers (4 in each client, 3 HTTP
	// claimers), at most 5 running at once.
	runIDs := enqueue(runQ, nRun)
	startClaimers(runQ)
	for started := false; !started; {
		for _, x := range log.snapshot() {
			started = started || x.by == "http"
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the HTTP worker ran no job before the deadline: %v", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	startClients()
	jobs := waitAll(runIDs)
	var xs []serveExecution
	inRun := map[int64]bool{}
	for _, id := range runIDs {
		inRun[id] = true
	}
	for _, x := range log.snapshot() {
		if inRun[x.id] {
			xs = append(xs, x)
		}
	}
	if len(xs) != nRun {
		t.Errorf("%d executions of the %d jobs", len(xs), nRun)
	}
	p := mostAtOnce(xs)
	by := byKind(runIDs)
	httpByDB := 0
	for _, j := range jobs {
		if strings.HasPrefix(j.AttemptedBy, "http:") {
			httpByDB++
		}
	}
	t.Logf("MaxRunning %d: peak %d at once; executions by worker: %v; attempted by an HTTP worker per the database: %d", maxRunning, p, by, httpByDB)
	if p > maxRunning {
		t.Errorf("%d jobs ran at once, over MaxRunning %d", p, maxRunning)
	} else if p < maxRunning {
		t.Errorf("at most %d jobs ran at once with 11 workers and a backlog: MaxRunning %d was never reached", p, maxRunning)
	}
	if by["http"] == 0 || by["a"]+by["b"] == 0 {
		t.Errorf("executions by worker %v: want some by the HTTP worker and some in process", by)
	}
	if httpByDB != by["http"] {
		t.Errorf("the database says %d jobs were attempted by an HTTP worker, the HTTP worker ran %d", httpByDB, by["http"])
	}
	if t.Failed() {
		return
	}

	// Rate: 40 jobs, at most 10 claimed in any 500ms by the database's
	// clock (attempted_at, the value each claim stamps on its rate slot).
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	rateIDs := enqueue(rateQ, nRate)
	startClaimers(rateQ)
	jobs = waitAll(rateIDs)
	starts := make([]time.Time, len(jobs))
	for i, j := range jobs {
		starts[i] = j.AttemptedAt
	}
	k, at := mostInWindow(starts, period)
	first, last := slices.MinFunc(starts, time.Time.Compare), slices.MaxFunc(starts, time.Time.Compare)
	t.Logf("Rate %d per %v: at most %d claims in a window of it; %d claims over %v; executions by worker: %v", rate, period, k, len(starts), last.Sub(first).Round(time.Millisecond), byKind(rateIDs))
	if k > rate {
		t.Errorf("%d claims within %v by the database's clock from %s, over Rate %d", k, period, at.Format("15:04:05.000000"), rate)
	}
	if k < rate {
		t.Errorf("at most %d claims within %v with 11 workers and a backlog: Rate %d was never reached", k, period, rate)
	}
	if t.Failed() {
		for _, j := range jobs {
			t.Logf("job %d attempted at %s by %s", j.ID, j.AttemptedAt.Format("15:04:05.000000"), j.AttemptedBy)
		}
	}
	// And `conveyor job --json` shows the same clock value.
	var j struct {
		State       conveyor.JobState `json:"state"`
		AttemptedAt time.Time         `json:"attempted_at"`
	}
	out := mustCLI(t, append([]string{"job", "--json", fmt.Sprint(rateIDs[0])}, db...)...)
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("job --json: %v\n%s", err, out)
	}
	if j.State != conveyor.JobStateCompleted || !j.AttemptedAt.Equal(jobs[0].AttemptedAt.Truncate(time.Microsecond)) {
		t.Errorf("job --json %d: %s attempted at %v, want completed attempted at %v", rateIDs[0], j.State, j.AttemptedAt, jobs[0].AttemptedAt)
	}
}
