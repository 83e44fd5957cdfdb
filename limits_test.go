package conveyor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/web"
)

type limited struct {
	N int `json:"n"`
}

func (limited) Kind() string { return "limited" }

// execution is one run of a job, as the test saw it: its start and end by
// this process's clock, taken inside the handler (after the claim that
// took a slot, before the statement that frees it).
type execution struct {
	id         int64
	start, end time.Time
	by         string
	failed     bool // the attempt failed (limitRig.failIf)
	attempt    int  // the job's attempt number, where the test records it
}

// executions is the test's log of executions, kept outside the queue.
type executions struct {
	mu  sync.Mutex
	all []execution
}

func (x *executions) add(e execution) {
	x.mu.Lock()
	x.all = append(x.all, e)
	x.mu.Unlock()
}

func (x *executions) snapshot() []execution {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.all)
}

// peak is the most executions of xs running at one instant at or after
// from: an execution runs from its start to its end, and one that ends at
// the instant another starts does not overlap it.
func peak(xs []execution, from time.Time) int {
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, x := range xs {
		if x.end.Before(from) {
			continue
		}
		evs = append(evs, ev{x.start, 1}, ev{x.end, -1})
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // ends before starts at the same instant
	})
	n, top := 0, 0
	for _, e := range evs {
		n += e.d
		if n > top {
			top = n
		}
	}
	return top
}

// atPeak describes the executions of xs running at the first instant the
// most of them ran at once (peak with from zero), times from the first
// start: what a failure names, so that an overlap can be traced.
func atPeak(xs []execution) string {
	if len(xs) == 0 {
		return "no executions"
	}
	first := xs[0].start
	for _, x := range xs {
		if x.start.Before(first) {
			first = x.start
		}
	}
	top, at := 0, time.Time{}
	for _, x := range xs {
		n := 0
		for _, y := range xs {
			if !y.start.After(x.start) && y.end.After(x.start) {
				n++
			}
		}
		if n > top {
			top, at = n, x.start
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d running at +%v:", top, at.Sub(first).Round(time.Millisecond))
	for _, y := range xs {
		if !y.start.After(at) && y.end.After(at) {
			fmt.Fprintf(&b, " [job %d attempt %d by %q +%v..+%v]", y.id, y.attempt, y.by,
				y.start.Sub(first).Round(time.Millisecond), y.end.Sub(first).Round(time.Millisecond))
		}
	}
	return b.String()
}

// limitRig is three clients on one database working one limited queue:
// two started in-process clients, and an HTTP worker claiming through
// package web's handler, served by a third client that works no queue.
type limitRig struct {
	t      *testing.T
	a, b   *conveyor.Client[any]
	served *conveyor.Client[any]
	srv    *httptest.Server
	queue  string
	log    executions
	run    time.Duration // how long each execution takes
	// runFor, when set before start, is how long the executions of the
	// job it is given take instead of run.
	runFor  func(id int64) time.Duration
	httpWG  sync.WaitGroup
	stopped chan struct{}
	// failIf, when set before start, fails every attempt of the jobs it
	// picks (recorded as failed executions) instead of completing them.
	failIf func(id int64) bool
}

const rigToken = "limits-test-token-0123456789"

// newLimitRig opens the three clients with queue limited by l (set
// before they start), runs each in-process client with 4 workers and the
// HTTP worker with 3 claimers (leases of 10 s: they do not renew them),
// every execution taking run.
func newLimitRig(t *testing.T, dsn string, l conveyor.QueueLimits, run time.Duration) *limitRig {
	t.Helper()
	ctx := context.Background()
	prefix := testdb.Prefix()
	r := &limitRig{t: t, queue: "lim", run: run, stopped: make(chan struct{})}
	cfg := func() *conveyor.Config {
		c := fast(prefix)
		c.Queues = map[string]conveyor.QueueConfig{r.queue: {MaxWorkers: 4}}
		return c
	}
	r.a = openDropped(t, dsn, cfg())
	r.b = open(t, dsn, cfg())
	scfg := fast(prefix)
	scfg.Queues, scfg.NoQueues = nil, true
	r.served = open(t, dsn, scfg)
	if err := r.a.SetQueueLimits(ctx, r.queue, l); err != nil {
		t.Fatalf("SetQueueLimits: %v", err)
	}
	for name, c := range map[string]*conveyor.Client[any]{"a": r.a, "b": r.b} {
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[limited]) error {
			start := time.Now()
			time.Sleep(r.runOf(j.ID))
			if r.failIf != nil && r.failIf(j.ID) {
				r.log.add(execution{id: j.ID, start: start, end: time.Now(), by: name, failed: true})
				return errors.New("poisoned")
			}
			r.log.add(execution{id: j.ID, start: start, end: time.Now(), by: name})
			return nil
		})); err != nil {
			t.Fatal(err)
		}
	}
	h, err := web.New(r.served, web.Options{Tokens: []web.Token{{Value: rigToken, Role: web.RoleAdmin}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(h)
	t.Cleanup(func() {
		close(r.stopped)
		r.httpWG.Wait()
		r.srv.Close()
		h.Close()
	})
	return r
}

// start starts the two in-process clients and the HTTP worker's claimers.
func (r *limitRig) start() {
	r.t.Helper()
	for _, c := range []*conveyor.Client[any]{r.a, r.b} {
		if err := c.Start(context.Background()); err != nil {
			r.t.Fatal(err)
		}
	}
	for i := range 3 {
		r.httpWG.Add(1)
		go func() {
			defer r.httpWG.Done()
			r.httpWorker(fmt.Sprintf("http-%d", i))
		}()
	}
}

// post sends a JSON request to the HTTP worker protocol and decodes the
// answer into out (when not nil); it returns the status.
func (r *limitRig) post(path string, body, out any) (int, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", r.srv.URL+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+rigToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := r.srv.Client().Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if out != nil && res.StatusCode == http.StatusOK {
		err = json.NewDecoder(res.Body).Decode(out)
	}
	return res.StatusCode, err
}

// httpWorker claims one job at a time (waiting up to 500ms), runs it as
// the in-process workers do and completes it, until the rig stops.
func (r *limitRig) httpWorker(name string) {
	for {
		select {
		case <-r.stopped:
			return
		default:
		}
		var got struct {
			Jobs []struct {
				ID    int64 `json:"id"`
				Fence int64 `json:"fence"`
			} `json:"jobs"`
		}
		status, err := r.post("/api/v1/claim", map[string]any{"queue": r.queue, "limit": 1, "wait_ms": 500, "worker": name, "lease_ms": 10000}, &got)
		if err != nil || status != http.StatusOK {
			r.t.Errorf("HTTP claim: %d %v", status, err)
			return
		}
		for _, j := range got.Jobs {
			start := time.Now()
			time.Sleep(r.runOf(j.ID))
			if r.failIf != nil && r.failIf(j.ID) {
				r.log.add(execution{id: j.ID, start: start, end: time.Now(), by: name, failed: true})
				status, err := r.post(fmt.Sprintf("/api/v1/jobs/%d/fail", j.ID), map[string]any{"fence": j.Fence, "error": "poisoned", "retry_in_ms": 10}, nil)
				if err != nil || status != http.StatusOK {
					r.t.Errorf("HTTP fail of job %d: %d %v", j.ID, status, err)
					return
				}
				continue
			}
			r.log.add(execution{id: j.ID, start: start, end: time.Now(), by: name})
			status, err := r.post(fmt.Sprintf("/api/v1/jobs/%d/complete", j.ID), map[string]any{"fence": j.Fence}, nil)
			if err != nil || status != http.StatusOK {
				r.t.Errorf("HTTP complete of job %d: %d %v", j.ID, status, err)
				return
			}
		}
	}
}

// runOf is how long an execution of job id takes.
func (r *limitRig) runOf(id int64) time.Duration {
	if r.runFor != nil {
		return r.runFor(id)
	}
	return r.run
}

// enqueue enqueues n jobs of the limited queue and returns their ids.
func (r *limitRig) enqueue(n int) []int64 {
	r.t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		id, err := r.a.Enqueue(context.Background(), limited{N: i}, &conveyor.EnqueueOpts{Queue: r.queue})
		if err != nil {
			r.t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

// waitAll waits until every job of ids is completed, then checks that
// each was executed exactly once.
func (r *limitRig) waitAll(ids []int64, d time.Duration) []execution {
	r.t.Helper()
	waitFor(r.t, "every job completed", d, func() bool {
		for _, id := range ids {
			if jobState(r.t, r.a, id).State != conveyor.JobStateCompleted {
				return false
			}
		}
		return true
	})
	xs := r.log.snapshot()
	runs := map[int64]int{}
	for _, x := range xs {
		runs[x.id]++
	}
	for _, id := range ids {
		if runs[id] != 1 {
			r.t.Fatalf("job %d executed %d times, want once", id, runs[id])
		}
	}
	if len(runs) != len(ids) {
		r.t.Fatalf("%d jobs executed, want %d", len(runs), len(ids))
	}
	return xs
}

// The concurrency limit holds across processes and protocols: two
// in-process clients and an HTTP worker (11 workers in all) never run
// more than MaxRunning jobs of the queue at once, reach it, and run every
// job exactly once.
func TestLimitMaxRunningAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const max, n = 5, 40
		r := newLimitRig(t, dsn, conveyor.QueueLimits{MaxRunning: max}, 50*time.Millisecond)
		ids := r.enqueue(n)
		// The first max+2 jobs run for 2 s, so that the limit binds
		// however slowly a loaded machine claims: with 50 ms jobs alone,
		// a 3-node Galera cluster on two busy cores claimed too slowly
		// for 5 to overlap.
		r.runFor = func(id int64) time.Duration {
			if id <= ids[max+1] {
				return 2 * time.Second
			}
			return r.run
		}
		r.start()
		xs := r.waitAll(ids, time.Minute)
		if p := peak(xs, time.Time{}); p > max {
			t.Fatalf("%d jobs ran at once, over MaxRunning %d; %s", p, max, atPeak(xs))
		} else if p < max {
			t.Fatalf("at most %d jobs ran at once with 11 workers and a backlog: the limit of %d was never reached", p, max)
		}
		by := map[string]int{}
		for _, x := range xs {
			by[x.by[:1]]++
		}
		t.Logf("executions by client: %v", by)
	})
}

// The rate holds across processes and protocols: no window of RatePeriod
// holds more than Rate starts (plus one, for the clocks read outside the
// database), and every job runs.
func TestLimitRateAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const rate, period, n = 10, 500 * time.Millisecond, 30
		r := newLimitRig(t, dsn, conveyor.QueueLimits{Rate: rate, RatePeriod: period}, time.Millisecond)
		ids := r.enqueue(n)
		r.start()
		xs := r.waitAll(ids, time.Minute)
		// By the database's clock, which holds the rate (attempted_at is
		// the clock value the claim stamps on the rate slot): the bound,
		// plus one.
		dbStarts := make([]time.Time, len(xs))
		for i, x := range xs {
			dbStarts[i] = jobState(t, r.a, x.id).AttemptedAt
		}
		if k, at := maxInWindow(dbStarts, period); k > rate+1 {
			t.Errorf("%d claims within %v by the database's clock from %v, want at most %d (Rate %d, plus one)", k, period, at.Format("15:04:05.000"), rate+1, rate)
		}
		// By the handlers' own clock reads, taken after the claim came
		// back, some milliseconds later (more under load, and not the
		// same for every claim). Starts recorded within a window shorter
		// than the period by the spread of those delays were claimed
		// within one period by the database: the bound, plus one.
		starts := make([]time.Time, len(xs))
		lo, hi := time.Duration(1<<62), time.Duration(-1<<62)
		for i, x := range xs {
			starts[i] = x.start
			d := x.start.Sub(dbStarts[i])
			lo, hi = min(lo, d), max(hi, d)
		}
		if window, ok := handlerWindow(t, period, hi-lo); ok {
			if k, at := maxInWindow(starts, window); k > rate+1 {
				t.Errorf("%d starts within %v from %v, want at most %d (Rate %d, plus one; a window of %v less the %v spread of the delays from claim to start)", k, window, at.Format("15:04:05.000"), rate+1, rate, period, hi-lo)
			}
		}
		if t.Failed() {
			for _, x := range xs {
				t.Logf("job %d by %s: started %s, claimed %s by the database", x.id, x.by, x.start.Format("05.000"), jobState(t, r.a, x.id).AttemptedAt.Local().Format("05.000"))
			}
		}
	})
}

// handlerWindow is the window in which the handlers' own starts of a
// rate of period are checked: the period less the spread of the delays
// from claim to start, within which starts were claimed within one
// period by the database. When the spread leaves less than a quarter of
// the period (a machine loaded enough to delay some starts by most of a
// period), starts that close say nothing of the claims, and the check is
// left to the database's clock: ok is false, and the test says so.
func handlerWindow(t *testing.T, period, spread time.Duration) (time.Duration, bool) {
	w := period - spread
	if w < period/4 {
		t.Logf("the delays from claim to start spread over %v of the %v period: the rate is checked by the database's clock only", spread, period)
		return 0, false
	}
	return w, true
}

// maxInWindow is the most of ts within any window of d (from one of
// them, inclusive, to d later, exclusive) and where that window starts.
func maxInWindow(ts []time.Time, d time.Duration) (int, time.Time) {
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

// A limit lowered while the clients run takes effect: once the jobs
// running at the change have finished and a second has passed, no more
// than the new limit run at once.
func TestLimitLoweredWhileRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const n = 40
		r := newLimitRig(t, dsn, conveyor.QueueLimits{MaxRunning: 5}, 100*time.Millisecond)
		ids := r.enqueue(n)
		r.start()
		waitFor(t, "a few jobs done", 30*time.Second, func() bool { return len(r.log.snapshot()) >= 5 })
		changed := time.Now()
		if err := r.b.SetQueueLimits(context.Background(), r.queue, conveyor.QueueLimits{MaxRunning: 2}); err != nil {
			t.Fatal(err)
		}
		xs := r.waitAll(ids, time.Minute)
		var settled time.Time // when the last job started before the change ended
		for _, x := range xs {
			if x.start.Before(changed) && x.end.After(settled) {
				settled = x.end
			}
		}
		from := settled.Add(time.Second)
		var after []execution
		for _, x := range xs {
			if x.end.After(from) {
				after = append(after, x)
			}
		}
		if len(after) < 4 {
			t.Fatalf("only %d executions after the change settled: the test proves nothing", len(after))
		}
		if p := peak(after, from); p > 2 {
			t.Fatalf("%d jobs ran at once a second after the limit was lowered to 2", p)
		}
	})
}

// SetQueueLimits refuses bad input with ErrInvalidOpts naming what was
// wrong, and changes nothing; QueueLimits lists the limits set, and the
// zero QueueLimits removes them.
func TestSetQueueLimitsInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		for _, tc := range []struct {
			queue string
			l     conveyor.QueueLimits
			names string
		}{
			{"q", conveyor.QueueLimits{MaxRunning: -1}, "MaxRunning"},
			{"q", conveyor.QueueLimits{MaxRunning: 100001}, "MaxRunning"},
			{"q", conveyor.QueueLimits{Rate: -1, RatePeriod: time.Second}, "Rate"},
			{"q", conveyor.QueueLimits{Rate: 100001, RatePeriod: time.Second}, "Rate"},
			{"q", conveyor.QueueLimits{Rate: 5}, "RatePeriod"},
			{"q", conveyor.QueueLimits{Rate: 5, RatePeriod: time.Microsecond}, "RatePeriod"},
			{"q", conveyor.QueueLimits{Rate: 5, RatePeriod: 31 * 24 * time.Hour}, "RatePeriod"},
			{"q", conveyor.QueueLimits{RatePeriod: time.Second}, "RatePeriod"},
			{"q", conveyor.QueueLimits{MaxRunning: 2, RatePeriod: time.Second}, "without a Rate"},
			{"bad queue!", conveyor.QueueLimits{MaxRunning: 1}, "bad queue!"},
			{"", conveyor.QueueLimits{MaxRunning: 1}, "queue name"},
		} {
			err := c.SetQueueLimits(ctx, tc.queue, tc.l)
			if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), tc.names) {
				t.Errorf("SetQueueLimits(%q, %+v): %v, want ErrInvalidOpts naming %s", tc.queue, tc.l, err, tc.names)
			}
		}
		got, err := c.QueueLimits(ctx)
		if err != nil || len(got) != 0 {
			t.Fatalf("after refused limits: %v %v, want none", got, err)
		}
		want := conveyor.QueueLimits{MaxRunning: 3, Rate: 7, RatePeriod: 2 * time.Second}
		if err := c.SetQueueLimits(ctx, "q", want); err != nil {
			t.Fatal(err)
		}
		if got, err := c.QueueLimits(ctx); err != nil || len(got) != 1 || got["q"] != want {
			t.Fatalf("QueueLimits: %v %v, want q: %+v", got, err, want)
		}
		if err := c.SetQueueLimits(ctx, "q", conveyor.QueueLimits{}); err != nil {
			t.Fatal(err)
		}
		if got, err := c.QueueLimits(ctx); err != nil || len(got) != 0 {
			t.Fatalf("QueueLimits after removing them: %v %v, want none", got, err)
		}
	})
}

// Stats and Overview report a limited queue's limits, their use and why
// its available jobs wait; a remote claim of a queue at its limit gets
// nothing, and the slot freed by an outcome lets the next one start.
func TestLimitStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.Queues, cfg.NoQueues = nil, true
		c := openDropped(t, dsn, cfg)
		rw := c.RemoteWorkers()
		if err := c.SetQueueLimits(ctx, "conc", conveyor.QueueLimits{MaxRunning: 1}); err != nil {
			t.Fatal(err)
		}
		if err := c.SetQueueLimits(ctx, "rated", conveyor.QueueLimits{Rate: 1, RatePeriod: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := c.SetQueueLimits(ctx, "empty", conveyor.QueueLimits{MaxRunning: 9}); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"conc", "conc", "rated", "rated"} {
			if _, err := c.Enqueue(ctx, limited{}, &conveyor.EnqueueOpts{Queue: q}); err != nil {
				t.Fatal(err)
			}
		}
		claim := func(q string) []*conveyor.ClaimedJob {
			t.Helper()
			jobs, err := rw.Claim(ctx, conveyor.RemoteClaim{Queue: q, Limit: 2, Worker: "w"})
			if err != nil {
				t.Fatal(err)
			}
			return jobs
		}
		conc, rated := claim("conc"), claim("rated")
		if len(conc) != 1 || len(rated) != 1 {
			t.Fatalf("claimed %d of conc (MaxRunning 1) and %d of rated (Rate 1), want 1 each", len(conc), len(rated))
		}
		if again := claim("conc"); len(again) != 0 {
			t.Fatalf("claimed %d more of conc at its limit", len(again))
		}
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ov, err := c.Overview(ctx, time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for what, s := range map[string]*conveyor.Stats{"Stats": st, "Overview": ov} {
			qs := map[string]conveyor.QueueStats{}
			for _, q := range s.Queues {
				qs[q.Queue] = q
			}
			q := qs["conc"]
			if q.Limits == nil || *q.Limits != (conveyor.QueueLimits{MaxRunning: 1}) || q.LimitUse == nil || q.LimitUse.Running != 1 || q.Held != conveyor.HeldByConcurrency {
				t.Errorf("%s of conc: limits %v use %v held %q", what, q.Limits, q.LimitUse, q.Held)
			}
			q = qs["rated"]
			if q.Limits == nil || q.Limits.Rate != 1 || q.LimitUse == nil || q.LimitUse.Started != 1 || q.LimitUse.NextStart <= 0 || q.Held != conveyor.HeldByRate {
				t.Errorf("%s of rated: limits %v use %v held %q", what, q.Limits, q.LimitUse, q.Held)
			}
			q, ok := qs["empty"]
			if !ok || q.Limits == nil || q.Limits.MaxRunning != 9 || q.Held != "" {
				t.Errorf("%s of a limited queue without jobs: listed %v, %+v", what, ok, q)
			}
		}
		if err := rw.Complete(ctx, conc[0].ID, conc[0].Fence, nil); err != nil {
			t.Fatal(err)
		}
		if next := claim("conc"); len(next) != 1 {
			t.Fatalf("claimed %d of conc after its running job completed, want 1", len(next))
		}
	})
}

// A rate raised by another process reaches a process whose fetcher waits
// for the old window to have room: the held job starts within about the
// second the documentation promises for a change, not when the window of
// the old rate (an hour here) opens. On PostgreSQL the change's
// notification wakes the fetcher; the other backends have only the
// process's read of the limits every second to see it.
func TestLimitRateRaisedElsewhereWakesHeldFetcher(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		cfg := func() *conveyor.Config {
			c := fast(prefix)
			c.Queues = map[string]conveyor.QueueConfig{"rr": {MaxWorkers: 2}}
			return c
		}
		var ran sync.Map
		work := conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[limited]) error {
			ran.Store(j.ID, true)
			return nil
		})
		// The first client fills the window and stops: the second's
		// fetcher then has no attempt of its own whose end would wake it.
		first := openDropped(t, dsn, cfg())
		a := open(t, dsn, cfg())
		other := fast(prefix)
		other.Queues, other.NoQueues = nil, true
		b := open(t, dsn, other)
		for _, c := range []*conveyor.Client[any]{first, a} {
			if err := conveyor.AddWorker(c, work); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.SetQueueLimits(ctx, "rr", conveyor.QueueLimits{Rate: 1, RatePeriod: time.Hour}); err != nil {
			t.Fatal(err)
		}
		enqueue := func() int64 {
			id, err := b.Enqueue(ctx, limited{}, &conveyor.EnqueueOpts{Queue: "rr"})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		one := enqueue()
		if err := first.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the first job completed", 30*time.Second, func() bool {
			return jobState(t, b, one).State == conveyor.JobStateCompleted
		})
		if err := first.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		two := enqueue()
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Its first claim finds the window full for an hour.
		waitFor(t, "a claim held back by the rate", 30*time.Second, func() bool { return a.Counters().ClaimRounds > 0 })
		if _, ok := ran.Load(two); ok {
			t.Fatal("the second job ran with the window full")
		}
		if err := b.SetQueueLimits(ctx, "rr", conveyor.QueueLimits{Rate: 2, RatePeriod: time.Hour}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the held job run once the rate was raised elsewhere", 15*time.Second, func() bool {
			_, ok := ran.Load(two)
			return ok
		})
	})
}

// A client that sets a MaxRunning on a queue it works, jobs coming at
// once: the jobs it claims before it holds a block of the queue's slots
// (each with a slot of its own, or counted) and those it claims under the
// block never run more than the limit at once together.
func TestLimitSetByTheWorkingClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const max, n = 4, 30
		cfg := fast(testdb.Prefix())
		cfg.Queues = map[string]conveyor.QueueConfig{"lim": {MaxWorkers: 8}}
		c := openDropped(t, dsn, cfg)
		var log executions
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[limited]) error {
			start := time.Now()
			d := 200 * time.Millisecond
			if j.Args.N > 0 && j.Args.N < max {
				d = 2 * time.Second // claimed first, still running once a block is held
			}
			// A handler cut off (its lease lost on a saturated machine)
			// ends there: the job may then run again elsewhere, and an
			// execution that slept on would overlap it in the record
			// although the queue ran it no more.
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
			log.add(execution{id: j.ID, start: start, end: time.Now(), attempt: j.Attempt, by: fmt.Sprintf("n=%d", j.Args.N)})
			return ctx.Err()
		})); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // the limits read once, without any
		if err := c.SetQueueLimits(ctx, "lim", conveyor.QueueLimits{MaxRunning: max}); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := c.Enqueue(ctx, limited{N: i}, &conveyor.EnqueueOpts{Queue: "lim"}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "every job", time.Minute, func() bool {
			ran := map[int64]bool{}
			for _, x := range log.snapshot() {
				ran[x.id] = true
			}
			return len(ran) == n
		})
		if p := peak(log.snapshot(), time.Time{}); p > max {
			t.Fatalf("%d jobs ran at once under a MaxRunning of %d set by the client working the queue; %s; counters %+v", p, max, atPeak(log.snapshot()), c.Counters())
		} else if p < 2 {
			t.Fatalf("at most %d job ran at once with 8 workers and a backlog", p)
		}
	})
}
