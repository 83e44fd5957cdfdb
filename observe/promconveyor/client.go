package promconveyor

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conveyorq/conveyor"
)

// Client is what ClientCollector reads: any *conveyor.Client[TTx].
type Client interface {
	Counters() conveyor.Counters
	Stats(ctx context.Context) (*conveyor.Stats, error)
}

// ClientOptions configure a ClientCollector. Zero fields take the
// defaults.
type ClientOptions struct {
	// Namespace prefixes every metric name; default "conveyor".
	Namespace string
	// ConstLabels are added to every metric.
	ConstLabels prometheus.Labels
	// StatsEvery is the most often Client.Stats is sampled: a scrape
	// within StatsEvery of the last sample is served that sample. Stats
	// counts the jobs table by queue and state, so its cost grows with
	// the table; several Prometheus servers scraping every few seconds
	// would run it as often. Default 15s; negative samples on every
	// scrape.
	StatsEvery time.Duration
	// StatsTimeout bounds one sample; default 5s. A sample that fails or
	// times out leaves the previous one (and conveyor_queue_stats_up 0)
	// and counts conveyor_queue_stats_errors_total.
	StatsTimeout time.Duration
	// NoStats leaves out the queue metrics (only this process's counters
	// are exported): for processes that share a database whose queue
	// metrics another process exports.
	NoStats bool
}

// ClientCollector exports a client's process counters and its database's
// queue depth; see the package documentation for what is sampled when.
type ClientCollector struct {
	c    Client
	o    ClientOptions
	now  func() time.Time
	desc map[string]*prometheus.Desc // engine counters by Counters.Map name

	driver, depth, oldest, paused, up, statsErrs, sampleAge *prometheus.Desc

	mu        sync.Mutex
	sample    *conveyor.Stats
	sampledAt time.Time
	ok        bool
	errors    float64
}

// counterHelp documents the engine counters (conveyor.Counters) exported
// as <namespace>_client_<name>_total.
var counterHelp = map[string]string{
	"claim_rounds":       "Claim statements this process issued, whether or not they claimed anything.",
	"claimed":            "Jobs this process claimed (attempts handed to its workers).",
	"claimed_at_insert":  "Jobs among those claimed that this process's own inserts claimed for its idle workers.",
	"outcome_rounds":     "Statements this process issued to write attempt outcomes, each a batch.",
	"insert_rounds":      "Transactions of this process's group commit of Enqueue calls.",
	"completed":          "Attempts whose success this process wrote.",
	"failed_attempts":    "Attempts that failed in this process (error, panic, timeout, JobCancel).",
	"snoozed":            "Attempts snoozed in this process.",
	"stale_acks_refused": "Outcomes the database refused because the attempt no longer owned the job (fence token outdated).",
	"leases_lost":        "Running attempts whose lease renewal found the job owned by another claim.",
	"lease_deadlines":    "Attempts stopped because their lease could not be renewed in time.",
	"released":           "Attempts given back without being counted (Stop, lease deadlines).",
	"rescued":            "Jobs with an expired lease this process rescued as the leader.",
	"promoted":           "Scheduled and retryable jobs this process made available as the leader.",
	"pruned":             "Finished jobs this process deleted past their retention as the leader.",
	"db_errors":          "Database errors the engine absorbed and retried.",
}

// NewClientCollector returns a collector of c's counters and queue stats.
func NewClientCollector(c Client, o ClientOptions) *ClientCollector {
	if o.Namespace == "" {
		o.Namespace = "conveyor"
	}
	if o.StatsEvery == 0 {
		o.StatsEvery = 15 * time.Second
	}
	if o.StatsTimeout <= 0 {
		o.StatsTimeout = 5 * time.Second
	}
	name := func(s string) string { return prometheus.BuildFQName(o.Namespace, "", s) }
	cc := &ClientCollector{c: c, o: o, now: time.Now, desc: map[string]*prometheus.Desc{}}
	for k, help := range counterHelp {
		cc.desc[k] = prometheus.NewDesc(name("client_"+k+"_total"), help, nil, o.ConstLabels)
	}
	cc.driver = prometheus.NewDesc(name("client_driver_total"),
		"The backend's own counters of retries and conflicts it absorbed (SQLite busy_retries, PostgreSQL deadlock_retries, MySQL claim_conflicts...), by name.",
		[]string{"counter"}, o.ConstLabels)
	cc.depth = prometheus.NewDesc(name("queue_jobs"), "Jobs in the database by queue and state (sampled; see conveyor_queue_stats_age_seconds).", []string{"queue", "state"}, o.ConstLabels)
	cc.oldest = prometheus.NewDesc(name("queue_oldest_available_seconds"), "Age of the queue's oldest available job, 0 when none waits (sampled).", []string{"queue"}, o.ConstLabels)
	cc.paused = prometheus.NewDesc(name("queue_paused"), "1 when the queue is paused (sampled).", []string{"queue"}, o.ConstLabels)
	cc.up = prometheus.NewDesc(name("queue_stats_up"), "1 when the latest sample of the queue stats succeeded.", nil, o.ConstLabels)
	cc.statsErrs = prometheus.NewDesc(name("queue_stats_errors_total"), "Samples of the queue stats that failed or timed out.", nil, o.ConstLabels)
	cc.sampleAge = prometheus.NewDesc(name("queue_stats_age_seconds"), "Age of the queue stats sample served.", nil, o.ConstLabels)
	return cc
}

// Describe implements prometheus.Collector.
func (cc *ClientCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range cc.desc {
		ch <- d
	}
	ch <- cc.driver
	if !cc.o.NoStats {
		for _, d := range []*prometheus.Desc{cc.depth, cc.oldest, cc.paused, cc.up, cc.statsErrs, cc.sampleAge} {
			ch <- d
		}
	}
}

// Collect implements prometheus.Collector: the counters now, the queue
// stats from a sample at most StatsEvery old.
func (cc *ClientCollector) Collect(ch chan<- prometheus.Metric) {
	counters := cc.c.Counters()
	for k, v := range counters.Map() {
		if d, ok := cc.desc[k]; ok {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
		}
	}
	names := make([]string, 0, len(counters.Driver))
	for k := range counters.Driver {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ch <- prometheus.MustNewConstMetric(cc.driver, prometheus.CounterValue, float64(counters.Driver[k]), k)
	}
	if cc.o.NoStats {
		return
	}
	st, at, ok, errs := cc.stats()
	up := 0.0
	if ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(cc.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(cc.statsErrs, prometheus.CounterValue, errs)
	if st == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(cc.sampleAge, prometheus.GaugeValue, cc.now().Sub(at).Seconds())
	for _, q := range st.Queues {
		for state, n := range q.Counts {
			ch <- prometheus.MustNewConstMetric(cc.depth, prometheus.GaugeValue, float64(n), q.Queue, string(state))
		}
		ch <- prometheus.MustNewConstMetric(cc.oldest, prometheus.GaugeValue, q.OldestAvailable.Seconds(), q.Queue)
		p := 0.0
		if !q.PausedAt.IsZero() {
			p = 1
		}
		ch <- prometheus.MustNewConstMetric(cc.paused, prometheus.GaugeValue, p, q.Queue)
	}
}

// stats returns the sample to serve, sampling again when the last is
// StatsEvery old. One sample runs at a time; concurrent scrapes wait for
// it (bounded by StatsTimeout).
func (cc *ClientCollector) stats() (*conveyor.Stats, time.Time, bool, float64) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.sample == nil || cc.o.StatsEvery < 0 || cc.now().Sub(cc.sampledAt) >= cc.o.StatsEvery {
		ctx, cancel := context.WithTimeout(context.Background(), cc.o.StatsTimeout)
		st, err := cc.c.Stats(ctx)
		cancel()
		if err != nil {
			cc.ok = false
			cc.errors++
		} else {
			cc.sample, cc.sampledAt, cc.ok = st, cc.now(), true
		}
	}
	return cc.sample, cc.sampledAt, cc.ok, cc.errors
}
