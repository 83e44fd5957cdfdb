package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/lab"
	"github.com/conveyorq/conveyor/web"
)

// The dashboard workload loads o.Jobs jobs in mixed states into fresh
// tables and times every page and API call the dashboard makes, served
// by package web on a loopback port: one Result per page (Phase names
// it) with the p50 and max of DashboardRepeats requests.

// DashboardRepeats is how many times the dashboard workload requests
// each page.
const DashboardRepeats = 5

// The loaded table, by id modulo 100: 80% completed, 3% discarded, 1%
// cancelled, 2% retryable, 3% scheduled, 1% running, 10% available. The
// finished jobs finished an hour before the load, but for 0.35% of all
// jobs (id modulo 10,000 below 35, all completed) finished at the load:
// a table of history with about 3,500 jobs finished in the dashboard's
// 5-minute window, the part its overview reads of the finished jobs. By
// position: queues default (60%), mail (30%), reports (10%) and rare
// (one job in 10,000); kinds bench (80%), report (20%) and rare_kind
// (one in 10,000); arguments {"seq": i, "user": "user-<i mod 1000>"}.
const dashboardStatesSQL = `UPDATE {p}jobs SET
  state = CASE WHEN id % 100 < 80 THEN 'completed' WHEN id % 100 < 83 THEN 'discarded'
               WHEN id % 100 < 84 THEN 'cancelled' WHEN id % 100 < 86 THEN 'retryable'
               WHEN id % 100 < 89 THEN 'scheduled' ELSE 'running' END,
  attempt = 1, fence = 1, attempted_at = ?{ts}, attempted_by = 'bench',
  finalized_at = CASE WHEN id % 10000 < 35 THEN ?{ts} WHEN id % 100 < 84 THEN ?{ts} END,
  scheduled_at = CASE WHEN id % 100 BETWEEN 84 AND 88 THEN ?{ts} ELSE scheduled_at END,
  lease_expires_at = CASE WHEN id % 100 = 89 THEN ?{ts} END
WHERE id % 100 < 90`

// dashboardJob returns the queue and the arguments of the i-th loaded job.
func dashboardJob(i int) conveyor.EnqueueItem {
	queue, kind := "default", "bench"
	switch {
	case i%10000 == 5000:
		queue = "rare"
	case i%10 == 9:
		queue = "reports"
	case i%10 >= 6:
		queue = "mail"
	}
	switch {
	case i%10000 == 2500:
		kind = "rare_kind"
	case i%5 == 0:
		kind = "report"
	}
	args := fmt.Sprintf(`{"seq":%d,"user":"user-%d"}`, i, i%1000)
	return conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: kind, JSON: json.RawMessage(args)},
		Opts: &conveyor.EnqueueOpts{Queue: queue}}
}

// dashboardPage is one request the dashboard makes.
type dashboardPage struct {
	name string
	path string // under the handler's root; {id} is replaced by a job id
	// follow: an API list whose next_after is followed: the request
	// timed is page 2 onwards, starting over at page 2 after the last.
	follow bool
}

// dashboardPages are the timed requests: the pages a browser loads and
// the API calls their scripts poll.
var dashboardPages = []dashboardPage{
	{name: "queues page", path: "/"},
	{name: "api queues (poll)", path: "/api/v1/queues"},
	{name: "api series (poll)", path: "/api/v1/series"},
	{name: "jobs page", path: "/jobs"},
	{name: "jobs state=available", path: "/api/v1/jobs?state=available"},
	{name: "jobs state=running", path: "/api/v1/jobs?state=running"},
	{name: "jobs state=discarded", path: "/api/v1/jobs?state=discarded"},
	{name: "jobs state=cancelled", path: "/api/v1/jobs?state=cancelled"},
	{name: "jobs state=retryable,scheduled", path: "/api/v1/jobs?state=retryable,scheduled"},
	{name: "jobs queue=mail", path: "/api/v1/jobs?queue=mail"},
	{name: "jobs queue=rare", path: "/api/v1/jobs?queue=rare"},
	{name: "jobs kind=rare_kind", path: "/api/v1/jobs?kind=rare_kind"},
	{name: "jobs state=cancelled&queue=reports", path: "/api/v1/jobs?state=cancelled&queue=reports"},
	{name: "jobs q=user-777", path: "/api/v1/jobs?q=user-777"},
	{name: "jobs page 2+ (all)", path: "/api/v1/jobs", follow: true},
	{name: "jobs page 2+ state=running", path: "/api/v1/jobs?state=running", follow: true},
	{name: "jobs page 2+ queue=rare", path: "/api/v1/jobs?queue=rare", follow: true},
	{name: "jobs filtered page (html)", path: "/jobs?state=discarded&queue=mail"},
	{name: "job page", path: "/jobs/{id}"},
	{name: "api job (poll)", path: "/api/v1/jobs/{id}"},
}

// dashboard runs the dashboard workload.
func dashboard(ctx context.Context, o Options) ([]*Result, error) {
	t0 := time.Now()
	// The states are set by one UPDATE of a table that holds every job.
	// On PostgreSQL, whose jobs live in segment tables, the jobs are
	// loaded into the one table of a fresh prefix as a release before
	// the segment tables left it, given their states there, and
	// converted by Migrate when the dashboard's client opens the prefix:
	// the path of a database upgraded from an earlier version.
	convert := backendOf(o.DSN) == "postgres"
	if convert {
		if !o.Keep || o.Config.TablePrefix == "" {
			o.Keep, o.Config.TablePrefix = true, freshPrefix("bench")
		}
		if err := dashboardLoadTable(ctx, o, t0); err != nil {
			return nil, err
		}
	}
	c, err := httpClient(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	backend := c.Backend()
	if !convert {
		if err := dashboardFill(ctx, c, o, t0); err != nil {
			return nil, err
		}
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "\r%s: loaded %d jobs in mixed states in %.1fs\n", o.label, o.Jobs, time.Since(t0).Seconds())
	}
	// Every request reads the statistics afresh (no sharing between the
	// repeats): what one refresh costs.
	s, err := startWeb(c, web.Options{StatsMaxAge: time.Nanosecond}, 2)
	if err != nil {
		return nil, err
	}
	var rs []*Result
	var derr error
	middle := int64(o.Jobs/2/100*100 + 81) // a discarded job near the middle
	w := startWaits(ctx, o.DSN, backend)
	for _, p := range dashboardPages {
		r, err := timePage(ctx, s, p, middle, o.Timeout)
		if err != nil {
			derr = fmt.Errorf("bench: dashboard: %s: %w", p.name, err)
			break
		}
		r.Workload, r.Backend, r.Jobs = o.Workload, backend, int64(o.Jobs)
		rs = append(rs, r)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%s: %-36s p50 %8.1f ms  max %8.1f ms\n", o.label, p.name, r.P50ms, r.Maxms)
		}
	}
	w.stop()
	derr = errors.Join(derr, s.close())
	var last Result
	cerr := closeClient(ctx, c, o, &last)
	waits := w.finish(ctx, last.Counters)
	for _, r := range rs {
		r.Settings, r.Counters, r.Waits = last.Settings, last.Counters, waits
		o.emit(r)
	}
	return rs, errors.Join(derr, cerr)
}

// dashboardTableVersion is the last PostgreSQL migration before the
// segment tables: a prefix migrated up to it keeps its jobs in one table.
const dashboardTableVersion = 9

// dashboardTableSQL inserts $1 jobs into the one table, job i (from 0)
// as dashboardJob(i) with id i+1.
const dashboardTableSQL = `INSERT INTO {p}jobs (id, queue, kind, args)
SELECT i + 1,
       CASE WHEN i % 10000 = 5000 THEN 'rare' WHEN i % 10 = 9 THEN 'reports' WHEN i % 10 >= 6 THEN 'mail' ELSE 'default' END,
       CASE WHEN i % 10000 = 2500 THEN 'rare_kind' WHEN i % 5 = 0 THEN 'report' ELSE 'bench' END,
       format('{"seq":%s,"user":"user-%s"}', i, i % 1000)::json
FROM generate_series(0, $1::bigint - 1) AS i`

// dashboardLoadTable migrates the PostgreSQL prefix of o.Config up to
// dashboardTableVersion (its jobs in one table, as an earlier release
// left them), fills that table with o.Jobs dashboard jobs
// (dashboardTableSQL) and gives them their states (dashboardStates).
func dashboardLoadTable(ctx context.Context, o Options, t0 time.Time) error {
	cfg := benchConfig(o, nil)
	cfg.Queues, cfg.NoQueues = nil, true
	c, err := connect.OpenWith(ctx, o.DSN, &cfg, o.Connect)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := lab.MigrateTo(ctx, c, dashboardTableVersion); err != nil {
		return err
	}
	db, _, err := openRaw(ctx, o.DSN, 1, "")
	if err != nil {
		return err
	}
	defer db.Close()
	prefix := c.Config().TablePrefix
	if _, err := db.ExecContext(ctx, strings.ReplaceAll(dashboardTableSQL, "{p}", prefix), o.Jobs); err != nil {
		return fmt.Errorf("bench: dashboard: loading the jobs: %w", err)
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "\r%s: loaded %d/%d jobs  %.1fs   ", o.label, o.Jobs, o.Jobs, time.Since(t0).Seconds())
	}
	return dashboardStates(ctx, o, prefix)
}

// dashboardFill enqueues o.Jobs dashboard jobs through c and gives them
// their states (dashboardStates).
func dashboardFill(ctx context.Context, c *conveyor.Client[any], o Options, t0 time.Time) error {
	const chunk = 10000
	for off := 0; off < o.Jobs; off += chunk {
		items := make([]conveyor.EnqueueItem, min(chunk, o.Jobs-off))
		for i := range items {
			items[i] = dashboardJob(off + i)
		}
		if _, err := c.EnqueueBulk(ctx, items); err != nil {
			return err
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "\r%s: loaded %d/%d jobs  %.1fs   ", o.label, off+len(items), o.Jobs, time.Since(t0).Seconds())
		}
	}
	return dashboardStates(ctx, o, c.Config().TablePrefix)
}

// dashboardStates gives the loaded jobs their states (see
// dashboardStatesSQL) in one statement and refreshes the planner's
// statistics, as autovacuum and autoanalyze would have.
func dashboardStates(ctx context.Context, o Options, prefix string) error {
	db, backend, err := openRaw(ctx, o.DSN, 1, o.Connect.SQLiteSynchronous)
	if err != nil {
		return err
	}
	defer db.Close()
	q := strings.ReplaceAll(dashboardStatesSQL, "{p}", prefix)
	now := time.Now().UTC()
	args := []any{now, now, now.Add(-time.Hour), now.Add(time.Hour), now.Add(time.Hour)}
	var after []string
	switch backend {
	case "postgres":
		q = strings.ReplaceAll(q, "{ts}", "::timestamptz")
		for i := 1; strings.Contains(q, "?"); i++ {
			q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
		}
		after = []string{"VACUUM ANALYZE " + prefix + "jobs"}
	case "mysql":
		q = strings.ReplaceAll(strings.ReplaceAll(q, "{ts}", ""), "{p}", prefix)
		q = strings.ReplaceAll(q, prefix+"jobs", "`"+prefix+"jobs`")
		after = []string{"ANALYZE TABLE `" + prefix + "jobs`"}
	default:
		q = strings.ReplaceAll(q, "{ts}", "")
		for i, a := range args {
			args[i] = a.(time.Time).UnixMicro()
		}
		after = []string{"ANALYZE"}
	}
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("bench: dashboard: setting states: %w", err)
	}
	for _, a := range after {
		if _, err := db.ExecContext(ctx, a); err != nil {
			return fmt.Errorf("bench: dashboard: %s: %w", a, err)
		}
	}
	return nil
}

// timePage requests page p DashboardRepeats times and returns the p50
// and max in a Result (Phase is the page's name, Seconds the total).
func timePage(ctx context.Context, s *webServer, p dashboardPage, id int64, timeout time.Duration) (*Result, error) {
	path := strings.ReplaceAll(p.path, "{id}", strconv.FormatInt(id, 10))
	var times []time.Duration
	var after *int64
	// page2 sets after to the second page's: past the first page, or
	// past its last job when it is the only one (an empty second page,
	// which reads to the end of the table).
	page2 := func(ctx context.Context) error {
		var pg struct {
			Jobs []struct {
				ID int64 `json:"id"`
			} `json:"jobs"`
			NextAfter *int64 `json:"next_after"`
		}
		if _, err := s.do(ctx, "GET", path, nil, &pg, http.StatusOK); err != nil {
			return err
		}
		switch {
		case pg.NextAfter != nil:
			after = pg.NextAfter
		case len(pg.Jobs) > 0:
			after = &pg.Jobs[len(pg.Jobs)-1].ID
		default: // no job matches (a small table): time the first page
			after = new(int64)
		}
		return nil
	}
	for range DashboardRepeats {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		if p.follow && after == nil {
			if err := page2(rctx); err != nil {
				cancel()
				return nil, err
			}
		}
		u := path
		var pg struct {
			NextAfter *int64 `json:"next_after"`
		}
		var out any
		if p.follow {
			u = withAfter(path, *after)
			out = &pg
		}
		t0 := time.Now()
		_, err := s.do(rctx, "GET", u, nil, out, http.StatusOK)
		times = append(times, time.Since(t0))
		cancel()
		if err != nil {
			return nil, err
		}
		after = pg.NextAfter // nil after the last page: start over
	}
	slices.Sort(times)
	var total time.Duration
	for _, t := range times {
		total += t
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return &Result{Phase: p.name, Seconds: total.Seconds(), P50ms: ms(times[len(times)/2]), Maxms: ms(times[len(times)-1])}, nil
}

// withAfter sets the after= parameter of a list path.
func withAfter(path string, after int64) string {
	base, raw, _ := strings.Cut(path, "?")
	v, _ := url.ParseQuery(raw)
	v.Set("after", strconv.FormatInt(after, 10))
	return base + "?" + v.Encode()
}
