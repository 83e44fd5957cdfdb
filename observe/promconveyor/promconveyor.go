// Package promconveyor exports a conveyor client's work to Prometheus.
//
// Two collectors, because they see different things:
//
//   - Metrics (New) is middleware: Config.EnqueueMiddleware and
//     Config.WorkMiddleware record, per queue and kind, the jobs this
//     process enqueued, the attempts it started and how they ended
//     (completed, failed, discarded, cancelled, snoozed), the pick-up
//     latency (start minus the job's due time) and the run time. They are
//     recorded as each enqueue and attempt happen.
//   - ClientCollector (NewClientCollector) reads the client's public API
//     when scraped: Client.Counters (this process's counters: stale
//     acknowledgements refused, leases lost, database errors, the
//     backend's retries...) on every scrape, and Client.Stats (queue
//     depth by state, oldest available job, pauses: a GROUP BY over the
//     jobs table) at most once per ClientOptions.StatsEvery, with a
//     timeout; scrapes in between are served the cached sample.
//
// A process that enqueues and works registers both:
//
//	m := promconveyor.New(promconveyor.Options{})
//	cfg := &conveyor.Config{
//		WorkMiddleware:    []conveyor.WorkMiddleware{m.WorkMiddleware},
//		EnqueueMiddleware: []conveyor.EnqueueMiddleware{m.EnqueueMiddleware},
//	}
//	client, err := connect.Open(ctx, dsn, cfg)
//	...
//	prometheus.MustRegister(m, promconveyor.NewClientCollector(client, promconveyor.ClientOptions{}))
//	http.Handle("/metrics", promhttp.Handler())
//
// The package is in the module github.com/conveyorq/conveyor/observe, so
// that the library's own go.mod requires no Prometheus code.
package promconveyor

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/observe/internal/outcome"
)

// Options configure Metrics. Zero fields take the defaults.
type Options struct {
	// Namespace prefixes every metric name; default "conveyor".
	Namespace string
	// ConstLabels are added to every metric (say the service's name).
	ConstLabels prometheus.Labels
	// PickupBuckets are the pick-up latency histogram's buckets in
	// seconds; default 1ms to about 1 minute, exponential.
	PickupBuckets []float64
	// RunBuckets are the run time histogram's buckets in seconds; default
	// 1ms to about 5 minutes, exponential.
	RunBuckets []float64
}

// Metrics records enqueues and attempts as middleware; it is a
// prometheus.Collector of its metrics. Safe for concurrent use, and for
// several clients (their series add up).
type Metrics struct {
	enqueued, enqueueErrors       *prometheus.CounterVec
	started, completed, failed    *prometheus.CounterVec
	discarded, cancelled, snoozed *prometheus.CounterVec
	pickup, run                   *prometheus.HistogramVec
	all                           []prometheus.Collector
}

// New returns the middleware's metrics, not yet registered.
func New(o Options) *Metrics {
	if o.Namespace == "" {
		o.Namespace = "conveyor"
	}
	if o.PickupBuckets == nil {
		o.PickupBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 13) // 1ms .. ~60s
	}
	if o.RunBuckets == nil {
		o.RunBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 15) // 1ms .. ~6min
	}
	labels := []string{"queue", "kind"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels}, labels)
	}
	m := &Metrics{
		enqueued:      counter("jobs_enqueued_total", "Jobs this process enqueued (committed; a unique job's duplicate included), by queue and kind."),
		enqueueErrors: counter("enqueue_errors_total", "Jobs of enqueue calls of this process that returned an error (refused, or not known to be committed)."),
		started:       counter("jobs_started_total", "Attempts this process started."),
		completed:     counter("jobs_completed_total", "Attempts of this process whose handler succeeded."),
		failed:        counter("jobs_failed_total", "Attempts of this process that failed (error, panic, timeout), including those that discarded or cancelled the job."),
		discarded:     counter("jobs_discarded_total", "Attempts of this process that failed on the job's last attempt, discarding it."),
		cancelled:     counter("jobs_cancelled_total", "Attempts of this process whose handler cancelled the job (conveyor.JobCancel)."),
		snoozed:       counter("jobs_snoozed_total", "Attempts of this process whose handler snoozed the job (conveyor.JobSnooze)."),
		pickup: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Name: "job_pickup_latency_seconds",
			Help:        "Time from a job's due time (scheduled_at, the database's clock) to the start of its attempt in this process.",
			ConstLabels: o.ConstLabels, Buckets: o.PickupBuckets}, labels),
		run: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Name: "job_run_seconds",
			Help:        "Run time of attempts in this process, middleware inside this one and handler included.",
			ConstLabels: o.ConstLabels, Buckets: o.RunBuckets}, labels),
	}
	m.all = []prometheus.Collector{m.enqueued, m.enqueueErrors, m.started, m.completed, m.failed, m.discarded, m.cancelled, m.snoozed, m.pickup, m.run}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// WorkMiddleware records one attempt: started, its pick-up latency, its
// run time and its outcome (from the error the rest of the chain
// returned, as conveyor.OutcomeState decides; a panic is a failure and
// goes on up). Put it first in Config.WorkMiddleware to time the whole
// chain.
func (m *Metrics) WorkMiddleware(ctx context.Context, job *conveyor.JobInfo, next func(context.Context) error) (err error) {
	start := time.Now()
	m.started.WithLabelValues(job.Queue, job.Kind).Inc()
	if !job.ScheduledAt.IsZero() {
		// The due time comes from the database's clock; a clock ahead of
		// this process's would make it negative.
		m.pickup.WithLabelValues(job.Queue, job.Kind).Observe(max(start.Sub(job.ScheduledAt), 0).Seconds())
	}
	panicked := true
	defer func() {
		if panicked {
			r := recover()
			m.record(job, outcome.Panicked(r), start)
			panic(r)
		}
	}()
	err = next(ctx)
	panicked = false
	m.record(job, err, start)
	return err
}

func (m *Metrics) record(job *conveyor.JobInfo, err error, start time.Time) {
	q, k := job.Queue, job.Kind
	m.run.WithLabelValues(q, k).Observe(time.Since(start).Seconds())
	switch outcome.Of(job, err) {
	case "completed":
		m.completed.WithLabelValues(q, k).Inc()
	case "snoozed":
		m.snoozed.WithLabelValues(q, k).Inc()
	case "cancelled":
		m.failed.WithLabelValues(q, k).Inc()
		m.cancelled.WithLabelValues(q, k).Inc()
	case "discarded":
		m.failed.WithLabelValues(q, k).Inc()
		m.discarded.WithLabelValues(q, k).Inc()
	default:
		m.failed.WithLabelValues(q, k).Inc()
	}
}

// EnqueueMiddleware counts the jobs of each enqueue call once the rest of
// the chain returned: enqueued when it succeeded, enqueue errors when not.
// The queue is the items' option, else the one the arguments declare,
// else "default" (what the client applies); put it last in
// Config.EnqueueMiddleware to see the items as they are inserted.
func (m *Metrics) EnqueueMiddleware(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
	err := next(ctx, items)
	c := m.enqueued
	if err != nil {
		c = m.enqueueErrors
	}
	for _, it := range items {
		if it.Args == nil {
			continue
		}
		c.WithLabelValues(queueOf(it), it.Args.Kind()).Inc()
	}
	return err
}

// queueOf is the queue the client enqueues it in.
func queueOf(it conveyor.EnqueueItem) string {
	if it.Opts != nil && it.Opts.Queue != "" {
		return it.Opts.Queue
	}
	if d, ok := it.Args.(conveyor.JobArgsWithEnqueueOpts); ok {
		if q := d.EnqueueOpts().Queue; q != "" {
			return q
		}
	}
	return conveyor.DefaultQueue
}
