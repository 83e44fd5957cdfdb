// Package report renders bench results as one self-contained HTML page:
// tables of the figures and charts drawn with gonum.org/v1/plot as inline
// SVG, so the page needs no network access and no script to be viewed.
// Charts: throughput and latency against worker count (from a sweep),
// enqueue-to-start latency histograms, reordering histograms, and the
// workload's own comparison (claim strategies, cold queue with and without
// hot load). It is used by the conveyor command only; the library does not
// depend on it.
package report

import (
	"bytes"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// Chart sizes.
const (
	wideW, wideH   = 7 * vg.Inch, 3.6 * vg.Inch
	smallW, smallH = 4.6 * vg.Inch, 2.8 * vg.Inch
	histBins       = 40
)

var sansOnce sync.Once

// useSans makes gonum/plot lay charts out in Liberation Sans (its default
// is the serif variant), which the SVG names with sans-serif fallbacks.
func useSans() {
	sansOnce.Do(func() { plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"} })
}

// WriteFile writes the report of rs to path.
func WriteFile(path string, rs []*bench.Result) error {
	var buf bytes.Buffer
	if err := Write(&buf, rs); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// Write writes the HTML report of rs (the runs of one bench invocation)
// to w.
func Write(w io.Writer, rs []*bench.Result) error {
	if len(rs) == 0 {
		return fmt.Errorf("report: no results")
	}
	useSans()
	pg := page{
		Title:     title(rs),
		Generated: time.Now().Format(time.RFC1123),
		Backend:   rs[0].Backend,
		Server:    rs[0].Settings["server_version"],
	}
	var err error
	add := func(sec *section, name string, f func() (*plot.Plot, error), wd, ht vg.Length) {
		if err != nil {
			return
		}
		p, perr := f()
		if perr != nil {
			err = fmt.Errorf("report: %s: %w", name, perr)
			return
		}
		if p == nil {
			return
		}
		svg, serr := render(p, wd, ht)
		if serr != nil {
			err = fmt.Errorf("report: %s: %w", name, serr)
			return
		}
		sec.Charts = append(sec.Charts, svg)
	}

	// Headline charts of the workload.
	head := section{Title: "Overview"}
	switch rs[0].Workload {
	case "sweep":
		head.Note = "Each point is one run on fresh tables; the x axis is logarithmic."
		if rs[0].Of == "latency" {
			head.Note += " In the latency workload jobs arrive at a fixed rate, so its throughput is that rate: the latency is the figure to read."
		}
		add(&head, "throughput", func() (*plot.Plot, error) { return throughputChart(rs) }, wideW, wideH)
		add(&head, "latency", func() (*plot.Plot, error) { return latencyChart(rs) }, wideW, wideH)
	case "claims":
		head.Note = "The same drain claimed by conveyor and by the classic strategies, implemented in raw SQL on a table of the bench's own. Deadlocks, lock timeouts and duplicate executions are in the table above."
		add(&head, "claims", func() (*plot.Plot, error) { return claimsChart(rs) }, wideW, wideH)
		add(&head, "rounds", func() (*plot.Plot, error) { return roundsChart(rs) }, wideW, wideH)
	case "isolation":
		head.Note = "Pick-up latency of the cold queue, alone and while the hot queue is kept saturated."
		add(&head, "isolation", func() (*plot.Plot, error) { return isolationChart(rs) }, wideW, wideH)
	case "steady":
		if r := rs[0]; r.Steady != nil {
			head.Title = "Over time"
			head.Note = steadyNote(r)
			for _, f := range steadyCharts(r) {
				add(&head, "steady", f, wideW, wideH)
			}
			head.Head, head.Rows = bench.WindowTable(r.Steady)
		}
	}
	if len(head.Charts) > 0 || len(head.Head) > 0 {
		pg.Sections = append(pg.Sections, head)
	}

	lat := section{Title: "Enqueue-to-start latency", Note: "Time from the enqueue's commit to the handler's start, per job. Bins span 0 to the p99.9; slower samples are counted in the legend, not drawn.", Grid: true}
	for _, r := range rs {
		add(&lat, "latency histogram", func() (*plot.Plot, error) { return latencyHist(r) }, smallW, smallH)
	}
	if len(lat.Charts) > 0 {
		pg.Sections = append(pg.Sections, lat)
	}
	reo := section{Title: "Reordering", Note: "For each job, the distance between its enqueue rank and its start rank, bucketed."}
	add(&reo, "reorder histogram", func() (*plot.Plot, error) { return reorderChart(rs) }, wideW, wideH)
	pg.Sections = append(pg.Sections, reo)
	if err != nil {
		return err
	}

	pg.Columns, pg.Rows = table(rs)
	pg.Waits = waitRows(rs)
	pg.Settings = SettingRows(rs)
	return pageTmpl.Execute(w, pg)
}

func title(rs []*bench.Result) string {
	t := "conveyor bench: " + rs[0].Workload
	if rs[0].Of != "" {
		t += " of " + rs[0].Of
	}
	return t + " on " + rs[0].Backend
}

// render draws p as an inline SVG element.
func render(p *plot.Plot, w, h vg.Length) (template.HTML, error) {
	c := vgsvg.New(w, h)
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return "", err
	}
	s := buf.String()
	// Inline in HTML: no XML prolog; and a fallback for the font the
	// chart was laid out with, which the viewer may not have.
	if i := strings.Index(s, "<svg"); i > 0 {
		s = s[i:]
	}
	s = strings.ReplaceAll(s, "font-family:Liberation Sans;", "font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")
	return template.HTML(s), nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	return p
}

// headroom leaves room above the data for the legend.
func headroom(p *plot.Plot, top float64) {
	if top > 0 {
		p.Y.Max = top * 1.35
	}
}

// workerTicks labels the worker counts on a logarithmic axis.
type workerTicks []float64

// Ticks returns a tick at each worker count.
func (t workerTicks) Ticks(min, max float64) []plot.Tick {
	out := make([]plot.Tick, 0, len(t))
	for _, v := range t {
		out = append(out, plot.Tick{Value: v, Label: fmt.Sprint(v)})
	}
	return out
}

func sweepXs(rs []*bench.Result) workerTicks {
	xs := make(workerTicks, 0, len(rs))
	for _, r := range rs {
		xs = append(xs, float64(r.Workers))
	}
	return xs
}

func lines(p *plot.Plot, rs []*bench.Result, series []string, val func(*bench.Result, int) float64) error {
	for i, name := range series {
		pts := make(plotter.XYs, len(rs))
		for j, r := range rs {
			pts[j].X, pts[j].Y = float64(r.Workers), val(r, i)
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		s.Color = plotutil.Color(i)
		s.Shape = plotutil.Shape(i)
		p.Add(l, s)
		p.Legend.Add(name, l, s)
	}
	return nil
}

func logWorkers(p *plot.Plot, rs []*bench.Result) {
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sweepXs(rs)
	p.X.Min = math.Max(0.7, float64(rs[0].Workers)*0.7)
	p.X.Max = float64(rs[len(rs)-1].Workers) * 1.3
}

func throughputChart(rs []*bench.Result) (*plot.Plot, error) {
	p := newPlot("Throughput against workers", "workers", "completed jobs/s")
	if err := lines(p, rs, []string{"completed jobs/s"}, func(r *bench.Result, _ int) float64 { return r.JobsPerS }); err != nil {
		return nil, err
	}
	p.Legend = plot.NewLegend() // one series: the title says it
	logWorkers(p, rs)
	p.Y.Min = 0
	top := 0.0
	for _, r := range rs {
		top = math.Max(top, r.JobsPerS)
	}
	p.Y.Max = top * 1.15
	return p, nil
}

func latencyChart(rs []*bench.Result) (*plot.Plot, error) {
	p := newPlot("Enqueue-to-start latency against workers", "workers", "ms")
	err := lines(p, rs, []string{"p50", "p95", "p99"}, func(r *bench.Result, i int) float64 {
		return [3]float64{r.P50ms, r.P95ms, r.P99ms}[i]
	})
	if err != nil {
		return nil, err
	}
	logWorkers(p, rs)
	p.Y.Min = 0
	top := 0.0
	for _, r := range rs {
		top = math.Max(top, r.P99ms)
	}
	headroom(p, top)
	return p, nil
}

func runName(r *bench.Result) string {
	switch {
	case r.Strategy != "":
		return r.Strategy
	case r.Phase != "":
		return r.Phase
	case r.Of != "":
		return fmt.Sprintf("%d workers", r.Workers)
	}
	return r.Workload
}

func names(rs []*bench.Result) []string {
	n := make([]string, len(rs))
	for i, r := range rs {
		n[i] = runName(r)
	}
	return n
}

// bars draws one bar group per series over the runs.
func bars(p *plot.Plot, rs []*bench.Result, series []string, val func(*bench.Result, int) float64) error {
	w := vg.Points(min(40, 120/float64(len(series))))
	top := 0.0
	for i, name := range series {
		vs := make(plotter.Values, len(rs))
		for j, r := range rs {
			vs[j] = val(r, i)
			top = math.Max(top, vs[j])
		}
		b, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		if len(series) > 1 {
			p.Legend.Add(name, b)
		}
	}
	p.NominalX(names(rs)...)
	p.Y.Min = 0
	if len(series) > 1 {
		headroom(p, top)
	} else if top > 0 {
		p.Y.Max = top * 1.1
	}
	return nil
}

func claimsChart(rs []*bench.Result) (*plot.Plot, error) {
	p := newPlot("Drain throughput by claim strategy", "", "jobs/s")
	return p, bars(p, rs, []string{"jobs/s"}, func(r *bench.Result, _ int) float64 { return r.JobsPerS })
}

// roundsChart draws claim rounds per job of the raw-SQL strategies
// (conveyor's claim has no such figure: its fetcher claims batches).
func roundsChart(rs []*bench.Result) (*plot.Plot, error) {
	var raw []*bench.Result
	for _, r := range rs {
		if r.Claims != nil && r.Claims.RoundsPerJob > 0 {
			raw = append(raw, r)
		}
	}
	if len(raw) == 0 {
		return nil, nil
	}
	p := newPlot("Claim rounds per job (1 = no collisions)", "", "rounds per claimed job")
	return p, bars(p, raw, []string{"rounds/job"}, func(r *bench.Result, _ int) float64 { return r.Claims.RoundsPerJob })
}

func isolationChart(rs []*bench.Result) (*plot.Plot, error) {
	var cold []*bench.Result
	for _, r := range rs {
		if strings.HasPrefix(r.Phase, "cold") {
			cold = append(cold, r)
		}
	}
	if len(cold) == 0 {
		return nil, nil
	}
	p := newPlot("Cold queue pick-up latency", "", "ms")
	return p, bars(p, cold, []string{"p50", "p95", "p99"}, func(r *bench.Result, i int) float64 {
		return [3]float64{r.P50ms, r.P95ms, r.P99ms}[i]
	})
}

func latencyHist(r *bench.Result) (*plot.Plot, error) {
	if len(r.Latencies) < 2 {
		return nil, nil
	}
	ms := make([]float64, len(r.Latencies))
	for i, d := range r.Latencies {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	sort.Float64s(ms)
	hi := ms[int(math.Ceil(0.999*float64(len(ms))))-1]
	if hi <= 0 {
		hi = ms[len(ms)-1]
	}
	if hi <= 0 {
		hi = 1
	}
	var vs plotter.Values
	over := 0
	for _, v := range ms {
		if v > hi {
			over++
			continue
		}
		vs = append(vs, v)
	}
	t := runName(r)
	if r.Workload != "sweep" && r.Workload != t {
		t = r.Workload + " " + t
	}
	p := newPlot(t, "ms", "jobs")
	h, err := plotter.NewHist(vs, histBins)
	if err != nil {
		return nil, err
	}
	h.FillColor = plotutil.Color(0)
	h.LineStyle.Width = vg.Points(0.3)
	h.LineStyle.Color = color.White
	p.Add(h)
	top := 0.0
	for _, b := range h.Bins {
		top = math.Max(top, b.Weight)
	}
	headroom(p, top)
	p.Legend.Add(fmt.Sprintf("p50 %.2f  p99 %.2f  max %.2f ms", r.P50ms, r.P99ms, r.Maxms), h)
	if over > 0 {
		p.Legend.Add(fmt.Sprintf("%d slower samples not drawn", over))
	}
	p.X.Min = 0
	return p, nil
}

var reorderBuckets = []string{"0", "1-9", "10-99", "100-999", "1000+"}

// logCountTicks labels an axis of log10(count+1) values with counts.
type logCountTicks struct{}

// Ticks returns ticks at 0, 1, 10, 100... jobs.
func (logCountTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for _, v := range []float64{0, 1, 10, 100, 1000, 10000, 100000, 1000000, 10000000} {
		y := math.Log10(v + 1)
		if y > max*1.0001 {
			break
		}
		out = append(out, plot.Tick{Value: y, Label: fmt.Sprint(v)})
	}
	return out
}

func reorderChart(rs []*bench.Result) (*plot.Plot, error) {
	p := newPlot("Jobs by displacement from enqueue order", "places displaced", "jobs (log scale)")
	n := len(rs)
	w := vg.Points(min(16, 72/float64(n))) // a group fits its category
	top := 0.0
	for i, r := range rs {
		vs := make(plotter.Values, len(reorderBuckets))
		for b, c := range r.ReorderHist {
			vs[b] = math.Log10(float64(c) + 1)
			top = math.Max(top, vs[b])
		}
		bc, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return nil, err
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		bc.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(bc)
		p.Legend.Add(fmt.Sprintf("%s (max %d, p99 %d)", runName(r), r.ReorderMax, r.ReorderP99), bc)
	}
	p.NominalX(reorderBuckets...)
	p.Y.Tick.Marker = logCountTicks{}
	p.Y.Min = 0
	p.Y.Max = math.Max(1, top) * 1.1
	p.Y.Max += 0.18 * float64(n+1) // room for the legend
	return p, nil
}

type section struct {
	Title  string
	Note   string
	Grid   bool
	Charts []template.HTML
	// Head and Rows are a table under the charts (steady's windows).
	Head []string
	Rows [][]string
}

type page struct {
	Title, Generated, Backend, Server string
	Sections                          []section
	Columns                           []string
	Rows                              [][]string
	Waits                             [][]string
	Settings                          [][]string
}

func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

// table returns the results as rows of the main figures.
func table(rs []*bench.Result) ([]string, [][]string) {
	cols := []string{"run", "workers", "jobs", "seconds", "jobs/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "lost", "duplicates", "reorder max", "reorder p99", "reorder 0/1-9/10-99/100-999/1000+"}
	claims := rs[0].Workload == "claims"
	iso := rs[0].Workload == "isolation"
	if claims {
		cols = append(cols, "deadlocks", "lock timeouts", "dup by deadlock", "collisions", "rounds/job")
	}
	if iso {
		cols = append(cols, "call p50 ms", "call p99 ms", "hot jobs/s", "hot backlog min")
	}
	var rows [][]string
	for _, r := range rs {
		h := r.ReorderHist
		row := []string{runName(r), fmt.Sprint(r.Workers), fmt.Sprint(r.Jobs), f2(r.Seconds), fmt.Sprintf("%.0f", r.JobsPerS),
			f2(r.P50ms), f2(r.P95ms), f2(r.P99ms), f2(r.Maxms), fmt.Sprint(r.Lost), fmt.Sprint(r.Duplicates),
			fmt.Sprint(r.ReorderMax), fmt.Sprint(r.ReorderP99), fmt.Sprintf("%d/%d/%d/%d/%d", h[0], h[1], h[2], h[3], h[4])}
		if claims {
			c := r.Claims
			if c == nil {
				c = &bench.ClaimFigures{}
			}
			rounds := "-"
			if c.RoundsPerJob > 0 {
				rounds = f2(c.RoundsPerJob)
			}
			row = append(row, fmt.Sprint(c.Deadlocks), fmt.Sprint(c.LockTimeouts), fmt.Sprint(c.DeadlockDuplicates), fmt.Sprint(c.Collisions), rounds)
		}
		if iso {
			hot, backlog := "-", "-"
			if r.HotJobsPerS > 0 {
				hot = fmt.Sprintf("%.0f", r.HotJobsPerS)
			}
			if r.HotBacklogMin != nil {
				backlog = fmt.Sprint(*r.HotBacklogMin)
			}
			row = append(row, f2(r.CallP50ms), f2(r.CallP99ms), hot, backlog)
		}
		rows = append(rows, row)
	}
	return cols, rows
}

func waitRows(rs []*bench.Result) [][]string {
	var rows [][]string
	for _, r := range rs {
		var evs []string
		for _, e := range bench.TopWaits(r, 6) {
			evs = append(evs, fmt.Sprintf("%s %.1f%% (%d)", e.Event, 100*e.Share, e.Count))
		}
		rows = append(rows, []string{runName(r), strings.Join(evs, ", "), strings.Join(bench.WaitCounters(r), " ")})
	}
	return rows
}

// SettingRows lists each setting of the runs once, as [name, value]
// sorted by name; a setting that differs between runs (or is missing from
// some) lists each run's value.
func SettingRows(rs []*bench.Result) [][]string {
	keys := map[string]bool{}
	for _, r := range rs {
		for k := range r.Settings {
			keys[k] = true
		}
	}
	ks := make([]string, 0, len(keys))
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var rows [][]string
	for _, k := range ks {
		var order []string
		who := map[string][]string{}
		n := 0
		for _, r := range rs {
			v, ok := r.Settings[k]
			if !ok {
				continue
			}
			n++
			if _, seen := who[v]; !seen {
				order = append(order, v)
			}
			who[v] = append(who[v], runName(r))
		}
		val := order[0]
		if len(order) > 1 || n < len(rs) {
			var parts []string
			for _, v := range order {
				parts = append(parts, fmt.Sprintf("%s (%s)", v, strings.Join(who[v], ", ")))
			}
			val = strings.Join(parts, "; ")
		}
		rows = append(rows, []string{k, val})
	}
	return rows
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: Arial, Helvetica, sans-serif; margin: 24px; color: #222; max-width: 1150px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.meta, p.note { color: #555; font-size: 13px; margin: 4px 0 10px; }
.charts svg { display: block; margin: 8px 0; max-width: 100%; height: auto; }
.grid { display: flex; flex-wrap: wrap; gap: 4px 16px; }
.grid svg { display: block; max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
.scroll { overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
table.kv td { text-align: left; white-space: normal; }
table.waits td { text-align: left; white-space: normal; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">{{.Backend}} {{.Server}} · generated {{.Generated}}</p>
<h2>Results</h2>
<div class="scroll"><table>
<tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></div>
{{range .Sections}}<h2>{{.Title}}</h2>
{{if .Note}}<p class="note">{{.Note}}</p>{{end}}
<div class="{{if .Grid}}grid{{else}}charts{{end}}">
{{range .Charts}}{{.}}
{{end}}</div>
{{if .Head}}<div class="scroll"><table>
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></div>{{end}}
{{end}}
<h2>Contention inside the database</h2>
<table class="waits">
<tr><th>run</th><th>wait events (share of active-session samples)</th><th>counters</th></tr>
{{range .Waits}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
<h2>Settings</h2>
<table class="kv">
{{range .Settings}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
</body>
</html>
`))
