package promconveyor_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/conveyortest/sqlitetest"
	"github.com/conveyorq/conveyor/observe/promconveyor"
)

type job struct {
	Do string `json:"do"`
}

func (job) Kind() string { return "job" }

type other struct{}

func (other) Kind() string { return "other" }

// EnqueueOpts puts every other job in queue "side".
func (other) EnqueueOpts() conveyor.EnqueueOpts { return conveyor.EnqueueOpts{Queue: "side"} }

// value returns the value of the metric name with exactly the labels
// given (a counter's or gauge's value, a histogram's count).
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return read(m)
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func read(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// TestMetrics runs real jobs on SQLite through the middleware and reads
// every kind of metric back from a registry, and over HTTP with promhttp.
func TestMetrics(t *testing.T) {
	ctx := context.Background()
	m := promconveyor.New(promconveyor.Options{})
	cfg := &conveyor.Config{
		Queues:            map[string]conveyor.QueueConfig{"default": {MaxWorkers: 4}, "side": {MaxWorkers: 2}},
		WorkMiddleware:    []conveyor.WorkMiddleware{m.WorkMiddleware},
		EnqueueMiddleware: []conveyor.EnqueueMiddleware{m.EnqueueMiddleware},
		PollMax:           20 * time.Millisecond,
		PromoteInterval:   10 * time.Millisecond,
		Backoff:           func(int) time.Duration { return time.Millisecond },
	}
	db := sqlitetest.Open(t, cfg)
	c := db.Client
	err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[job]) error {
		switch j.Args.Do {
		case "fail":
			return errors.New("boom")
		case "cancel":
			return conveyor.JobCancel(errors.New("no"))
		case "panic":
			panic("oops")
		case "snooze":
			if j.Attempt == 1 && j.ScheduledAt.Before(j.CreatedAt.Add(time.Millisecond)) {
				return conveyor.JobSnooze(time.Millisecond)
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[other]) error { return nil })); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m, promconveyor.NewClientCollector(c, promconveyor.ClientOptions{StatsEvery: -1}))

	items := []conveyor.EnqueueItem{
		{Args: job{"ok"}}, {Args: job{"ok"}}, {Args: job{"ok"}},
		{Args: job{"fail"}, Opts: &conveyor.EnqueueOpts{MaxAttempts: 2}},
		{Args: job{"cancel"}},
		{Args: job{"panic"}, Opts: &conveyor.EnqueueOpts{MaxAttempts: 1}},
		{Args: job{"snooze"}},
		{Args: other{}},
	}
	if _, err := c.EnqueueMany(ctx, items); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, job{"ok"}, &conveyor.EnqueueOpts{Queue: "bad queue"}); !errors.Is(err, conveyor.ErrInvalidOpts) {
		t.Fatalf("enqueue in a bad queue: %v", err)
	}
	// Before any work: depth by state from the database.
	if v := value(t, reg, "conveyor_queue_jobs", map[string]string{"queue": "default", "state": "available"}); v != 7 {
		t.Fatalf("available in default before start: %v, want 7", v)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		busy := int64(0)
		for _, q := range st.Queues {
			busy += q.Counts[conveyor.JobStateAvailable] + q.Counts[conveyor.JobStateRunning] + q.Counts[conveyor.JobStateRetryable] + q.Counts[conveyor.JobStateScheduled]
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs did not finish: %+v", st.Queues)
		}
		time.Sleep(10 * time.Millisecond)
	}

	def := func(kind string) map[string]string { return map[string]string{"queue": "default", "kind": kind} }
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"conveyor_jobs_enqueued_total", def("job"), 7},
		{"conveyor_jobs_enqueued_total", map[string]string{"queue": "side", "kind": "other"}, 1},
		{"conveyor_enqueue_errors_total", map[string]string{"queue": "bad queue", "kind": "job"}, 1},
		// ok x3, fail x2, cancel, panic, snooze x2
		{"conveyor_jobs_started_total", def("job"), 9},
		{"conveyor_jobs_completed_total", def("job"), 4},
		{"conveyor_jobs_failed_total", def("job"), 4}, // fail x2, cancel, panic
		{"conveyor_jobs_discarded_total", def("job"), 2},
		{"conveyor_jobs_cancelled_total", def("job"), 1},
		{"conveyor_jobs_snoozed_total", def("job"), 1},
		{"conveyor_job_pickup_latency_seconds", def("job"), 9},
		{"conveyor_job_run_seconds", def("job"), 9},
		{"conveyor_jobs_completed_total", map[string]string{"queue": "side", "kind": "other"}, 1},
		// The client's counters and the database's depth.
		{"conveyor_client_completed_total", nil, 5},
		{"conveyor_client_failed_attempts_total", nil, 4},
		{"conveyor_client_snoozed_total", nil, 1},
		{"conveyor_client_stale_acks_refused_total", nil, 0},
		{"conveyor_client_leases_lost_total", nil, 0},
		{"conveyor_client_db_errors_total", nil, 0},
		{"conveyor_client_driver_total", map[string]string{"counter": "busy_retries"}, 0},
		{"conveyor_queue_jobs", map[string]string{"queue": "default", "state": "completed"}, 4},
		{"conveyor_queue_jobs", map[string]string{"queue": "default", "state": "discarded"}, 2},
		{"conveyor_queue_jobs", map[string]string{"queue": "default", "state": "cancelled"}, 1},
		{"conveyor_queue_jobs", map[string]string{"queue": "side", "state": "completed"}, 1},
		{"conveyor_queue_paused", map[string]string{"queue": "side"}, 0},
		{"conveyor_queue_stats_up", nil, 1},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	// Exposed with promhttp, as an application serves it.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`conveyor_jobs_completed_total{kind="job",queue="default"} 4`,
		`conveyor_job_run_seconds_count{kind="job",queue="default"} 9`,
		`conveyor_queue_jobs{queue="default",state="discarded"} 2`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("scrape lacks %q", line)
		}
	}
}

// staticClient serves fixed counters and counts Stats calls.
type staticClient struct {
	calls int
	fail  bool
}

func (s *staticClient) Counters() conveyor.Counters {
	return conveyor.Counters{Driver: map[string]int64{}}
}

func (s *staticClient) Stats(ctx context.Context) (*conveyor.Stats, error) {
	s.calls++
	if s.fail {
		return nil, errors.New("database down")
	}
	return &conveyor.Stats{Queues: []conveyor.QueueStats{{Queue: "q", Counts: map[conveyor.JobState]int64{conveyor.JobStateAvailable: int64(s.calls)}}}}, nil
}

// TestStatsSampling: Stats runs at most once per StatsEvery; a failed
// sample keeps the last one and says so.
func TestStatsSampling(t *testing.T) {
	sc := &staticClient{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promconveyor.NewClientCollector(sc, promconveyor.ClientOptions{StatsEvery: time.Hour}))
	for range 3 {
		if v := value(t, reg, "conveyor_queue_jobs", map[string]string{"queue": "q", "state": "available"}); v != 1 {
			t.Fatalf("depth %v, want the first sample's 1", v)
		}
	}
	if sc.calls != 1 {
		t.Fatalf("Stats called %d times for 3 scrapes within StatsEvery, want 1", sc.calls)
	}
	sc2 := &staticClient{}
	reg2 := prometheus.NewPedanticRegistry()
	reg2.MustRegister(promconveyor.NewClientCollector(sc2, promconveyor.ClientOptions{StatsEvery: -1}))
	value(t, reg2, "conveyor_queue_jobs", map[string]string{"queue": "q", "state": "available"})
	sc2.fail = true
	if v := value(t, reg2, "conveyor_queue_jobs", map[string]string{"queue": "q", "state": "available"}); v != 1 {
		t.Fatalf("after a failed sample: depth %v, want the last good sample's 1", v)
	}
	if up, errs := value(t, reg2, "conveyor_queue_stats_up", nil), value(t, reg2, "conveyor_queue_stats_errors_total", nil); up != 0 || errs != 3 {
		t.Fatalf("up %v errors %v, want 0 and 3 (three failed scrapes)", up, errs)
	}
}
