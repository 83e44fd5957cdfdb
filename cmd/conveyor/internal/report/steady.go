package report

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// The steady workload's charts: its windows over time, the held
// transaction's period shaded.

// holdShade is the fill of the period the snapshot was held.
var holdShade = color.NRGBA{R: 255, G: 170, B: 60, A: 55}

// series is one line of a chart over time.
type series struct {
	name string
	pts  plotter.XYs
}

// gaugePoints returns a gauge's points over time: before the load, at
// each window's end, and after the drain; absent readings are skipped.
func gaugePoints(f *bench.SteadyFigures, val func(*bench.Gauges) *float64) plotter.XYs {
	var pts plotter.XYs
	add := func(x float64, g *bench.Gauges) {
		if g == nil {
			return
		}
		if v := val(g); v != nil && !math.IsNaN(*v) && !math.IsInf(*v, 0) {
			pts = append(pts, plotter.XY{X: x, Y: *v})
		}
	}
	if f.Before != nil {
		add(math.Min(0, f.Before.AtS), f.Before)
	}
	for i := range f.Windows {
		add(f.Windows[i].EndS, &f.Windows[i].Gauges)
	}
	if f.After != nil {
		add(f.LoadS+f.DrainS, f.After)
	}
	return pts
}

// windowPoints returns a window figure at each window's middle.
func windowPoints(f *bench.SteadyFigures, val func(*bench.Window) float64) plotter.XYs {
	pts := make(plotter.XYs, len(f.Windows))
	for i := range f.Windows {
		w := &f.Windows[i]
		pts[i] = plotter.XY{X: (w.StartS + w.EndS) / 2, Y: val(w)}
	}
	return pts
}

// timeChart draws series over time with the hold shaded; logY draws the
// y axis on a log scale (values at or below zero are raised to floor).
func timeChart(f *bench.SteadyFigures, title, y string, ss []series, logY bool, floor float64) (*plot.Plot, error) {
	var nonEmpty []series
	top, bottom := 0.0, math.Inf(1)
	for _, s := range ss {
		if len(s.pts) == 0 {
			continue
		}
		for i := range s.pts {
			if logY && s.pts[i].Y < floor {
				s.pts[i].Y = floor
			}
			top = math.Max(top, s.pts[i].Y)
			bottom = math.Min(bottom, s.pts[i].Y)
		}
		nonEmpty = append(nonEmpty, s)
	}
	if len(nonEmpty) == 0 {
		return nil, nil
	}
	p := newPlot(title, "seconds since the load began", y)
	var y0, y1 float64
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		y0, y1 = bottom/1.5, math.Max(top, bottom*10)*6
	} else {
		y0, y1 = 0, math.Max(top, 1)*1.35
	}
	p.Y.Min, p.Y.Max = y0, y1
	x0 := 0.0
	if f.Before != nil {
		x0 = math.Min(0, f.Before.AtS)
	}
	p.X.Min, p.X.Max = x0, math.Max(f.LoadS+f.DrainS, f.LoadS)*1.02
	if h := f.Hold; h != nil && h.EndS > h.StartS {
		poly, err := plotter.NewPolygon(plotter.XYs{{X: math.Max(x0, h.StartS), Y: y0}, {X: h.EndS, Y: y0}, {X: h.EndS, Y: y1}, {X: math.Max(x0, h.StartS), Y: y1}})
		if err != nil {
			return nil, err
		}
		poly.Color = holdShade
		poly.LineStyle.Width = 0
		p.Add(poly)
		p.Legend.Add("snapshot held", poly)
	}
	for i, s := range nonEmpty {
		l, pt, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		pt.Color = plotutil.Color(i)
		pt.Shape = plotutil.Shape(i)
		p.Add(l, pt)
		p.Legend.Add(s.name, l, pt)
	}
	return p, nil
}

func i64f(v *int64) *float64 {
	if v == nil {
		return nil
	}
	x := float64(*v)
	return &x
}

func mbf(v *int64) *float64 {
	if v == nil {
		return nil
	}
	x := float64(*v) / (1 << 20)
	return &x
}

func pctf(v *float64) *float64 {
	if v == nil {
		return nil
	}
	x := 100 * *v
	return &x
}

// steadyCharts returns the charts of a steady run.
func steadyCharts(r *bench.Result) []func() (*plot.Plot, error) {
	f := r.Steady
	return []func() (*plot.Plot, error){
		func() (*plot.Plot, error) {
			return timeChart(f, "Throughput per window", "jobs/s", []series{
				{"offered", windowPoints(f, func(w *bench.Window) float64 { return w.OfferedPerS })},
				{"enqueued", windowPoints(f, func(w *bench.Window) float64 { return w.EnqueuedPerS })},
				{"completed", windowPoints(f, func(w *bench.Window) float64 { return w.CompletedPerS })},
			}, false, 0)
		},
		func() (*plot.Plot, error) {
			return timeChart(f, "Pick-up latency per window (log scale)", "ms", []series{
				{"p50", windowPoints(f, func(w *bench.Window) float64 { return w.P50ms })},
				{"p99", windowPoints(f, func(w *bench.Window) float64 { return w.P99ms })},
				{"max", windowPoints(f, func(w *bench.Window) float64 { return w.Maxms })},
			}, true, 0.01)
		},
		func() (*plot.Plot, error) {
			switch r.Backend {
			case "postgres":
				return timeChart(f, "Dead tuples of the run's tables", "tuples", []series{
					{"dead tuples (all tables)", gaugePoints(f, func(g *bench.Gauges) *float64 { return i64f(g.DeadTuples) })},
					{"live tuples (all tables)", gaugePoints(f, func(g *bench.Gauges) *float64 { return i64f(g.LiveTuples) })},
				}, false, 0)
			case "mysql":
				return timeChart(f, "InnoDB history list length (server-wide)", "undo logs not purged", []series{
					{"history list length", gaugePoints(f, func(g *bench.Gauges) *float64 { return i64f(g.HistoryLength) })},
				}, false, 0)
			}
			return timeChart(f, "WAL frames a checkpoint has yet to copy", "frames", []series{
				{"frames not checkpointed", gaugePoints(f, func(g *bench.Gauges) *float64 {
					if g.WALFrames == nil || g.WALBackfilled == nil {
						return nil
					}
					x := float64(*g.WALFrames - *g.WALBackfilled)
					return &x
				})},
			}, false, 0)
		},
		func() (*plot.Plot, error) {
			return timeChart(f, "Sizes", "MB", []series{
				{"total", gaugePoints(f, func(g *bench.Gauges) *float64 { return mbf(g.TotalBytes) })},
				{"heap / data", gaugePoints(f, func(g *bench.Gauges) *float64 { return mbf(g.TableBytes) })},
				{"indexes", gaugePoints(f, func(g *bench.Gauges) *float64 { return mbf(g.IndexBytes) })},
				{"WAL file", gaugePoints(f, func(g *bench.Gauges) *float64 { return mbf(g.WALBytes) })},
			}, false, 0)
		},
		func() (*plot.Plot, error) {
			return timeChart(f, "CPU share of the machine (all cores) per window", "%", []series{
				{"database server", gaugePoints(f, func(g *bench.Gauges) *float64 { return pctf(g.DBCPUShare) })},
				{"bench process", gaugePoints(f, func(g *bench.Gauges) *float64 { return pctf(g.ClientCPUShare) })},
				{"whole machine", gaugePoints(f, func(g *bench.Gauges) *float64 { return pctf(g.MachineCPUShare) })},
			}, false, 0)
		},
	}
}

// steadyNote explains the steady charts.
func steadyNote(r *bench.Result) string {
	f := r.Steady
	n := fmt.Sprintf("%.0f jobs/s offered for %.0f s by %d producers to %d workers, reported per %.0f s window; gauges are read at each window's end. %d offered, %d enqueued, %d short.",
		f.Rate, f.LoadS, r.Producers, r.Workers, f.WindowS, f.Offered, f.Enqueued, f.Shortfall)
	if h := f.Hold; h != nil {
		n += fmt.Sprintf(" Shaded: the snapshot held (%s, then count(*) of each of the run's tables) from %.1f s to %.1f s.", h.Statement, h.StartS, h.EndS)
	}
	n += " CPU: " + f.CPUSource + "."
	for _, x := range f.Notes {
		n += " Note: " + x + "."
	}
	return n
}
