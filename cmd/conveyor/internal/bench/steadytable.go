package bench

import (
	"fmt"
	"math"
	"strconv"
)

// windowColumn is one column of the windows table: its heading and the
// cell of a window (nil: the row is a gauges-only row, before or after).
type windowColumn struct {
	head  string
	job   func(w *Window) string
	gauge func(g *Gauges) *float64
	unit  func(float64) string
	text  func(g *Gauges) string
}

func pf(v float64) *float64 { return &v }

func pi(v *int64) *float64 {
	if v == nil {
		return nil
	}
	return pf(float64(*v))
}

func mb(v *int64) *float64 {
	if v == nil {
		return nil
	}
	return pf(float64(*v) / (1 << 20))
}

func pct100(v *float64) *float64 {
	if v == nil {
		return nil
	}
	return pf(100 * *v)
}

// jobsTable is the jobs table's own figure from a gauge, if read.
func jobsTable(g *Gauges, f func(TableGauge) *int64) *float64 {
	t, ok := g.Tables["jobs"]
	if !ok {
		return nil
	}
	return pi(f(t))
}

func fmtInt(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func fmt1(v float64) string   { return strconv.FormatFloat(v, 'f', 1, 64) }
func fmtSec(v float64) string {
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}
func fmtMS(v float64) string {
	switch {
	case v >= 100:
		return fmtInt(v)
	case v >= 10:
		return fmt1(v)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

var windowColumns = []windowColumn{
	{head: "offered/s", job: func(w *Window) string { return fmtInt(w.OfferedPerS) }},
	{head: "enqueued/s", job: func(w *Window) string { return fmtInt(w.EnqueuedPerS) }},
	{head: "completed/s", job: func(w *Window) string { return fmtInt(w.CompletedPerS) }},
	{head: "pick-up p50 ms", job: func(w *Window) string { return fmtMS(w.P50ms) }},
	{head: "p99 ms", job: func(w *Window) string { return fmtMS(w.P99ms) }},
	{head: "max ms", job: func(w *Window) string { return fmtMS(w.Maxms) }},
	{head: "enqueue lag p99 ms", job: func(w *Window) string { return fmtMS(w.LagP99ms) }},
	{head: "backlog", job: func(w *Window) string { return fmt.Sprint(w.Backlog) }},
	{head: "dead tuples", gauge: func(g *Gauges) *float64 { return pi(g.DeadTuples) }, unit: fmtInt},
	{head: "jobs dead", gauge: func(g *Gauges) *float64 { return jobsTable(g, func(t TableGauge) *int64 { return t.Dead }) }, unit: fmtInt},
	{head: "jobs live", gauge: func(g *Gauges) *float64 { return jobsTable(g, func(t TableGauge) *int64 { return t.Live }) }, unit: fmtInt},
	{head: "vacuums", gauge: func(g *Gauges) *float64 { return pi(g.Vacuums) }, unit: fmtInt},
	{head: "history length", gauge: func(g *Gauges) *float64 { return pi(g.HistoryLength) }, unit: fmtInt},
	{head: "heap MB", gauge: func(g *Gauges) *float64 { return mb(g.TableBytes) }, unit: fmt1},
	{head: "index MB", gauge: func(g *Gauges) *float64 { return mb(g.IndexBytes) }, unit: fmt1},
	{head: "total MB", gauge: func(g *Gauges) *float64 { return mb(g.TotalBytes) }, unit: fmt1},
	{head: "WAL MB", gauge: func(g *Gauges) *float64 { return mb(g.WALBytes) }, unit: fmt1},
	{head: "WAL frames not checkpointed", gauge: func(g *Gauges) *float64 {
		if g.WALFrames == nil || g.WALBackfilled == nil {
			return nil
		}
		return pf(float64(*g.WALFrames - *g.WALBackfilled))
	}, unit: fmtInt},
	{head: "free pages", gauge: func(g *Gauges) *float64 { return pi(g.FreePages) }, unit: fmtInt},
	{head: "xmin age", gauge: func(g *Gauges) *float64 { return pi(g.XminAge) }, unit: fmtInt},
	{head: "xmin holder", text: func(g *Gauges) string { return g.XminHolder }},
	{head: "oldest xact s", gauge: func(g *Gauges) *float64 { return g.OldestXactS }, unit: fmtInt},
	{head: "db CPU %", gauge: func(g *Gauges) *float64 { return pct100(g.DBCPUShare) }, unit: fmt1},
	{head: "bench CPU %", gauge: func(g *Gauges) *float64 { return pct100(g.ClientCPUShare) }, unit: fmt1},
	{head: "machine CPU %", gauge: func(g *Gauges) *float64 { return pct100(g.MachineCPUShare) }, unit: fmt1},
}

// WindowTable returns a steady run's windows as a table: a heading row,
// then "before" (gauges before the load), one row per window ("*" marks
// the windows the held transaction was open in) and "after" (gauges once
// every job completed). Gauge columns the backend has no figure for are
// left out; "-" is a figure not read.
func WindowTable(f *SteadyFigures) (head []string, rows [][]string) {
	all := make([]*Gauges, 0, len(f.Windows)+2)
	if f.Before != nil {
		all = append(all, f.Before)
	}
	for i := range f.Windows {
		all = append(all, &f.Windows[i].Gauges)
	}
	if f.After != nil {
		all = append(all, f.After)
	}
	var cols []windowColumn
	for _, c := range windowColumns {
		if c.text != nil {
			for _, g := range all {
				if c.text(g) != "" {
					cols = append(cols, c)
					break
				}
			}
			continue
		}
		if c.gauge == nil {
			cols = append(cols, c)
			continue
		}
		for _, g := range all {
			if c.gauge(g) != nil {
				cols = append(cols, c)
				break
			}
		}
	}
	head = []string{"window s", "held"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	row := func(name, held string, w *Window, g *Gauges) []string {
		r := []string{name, held}
		for _, c := range cols {
			switch {
			case c.job != nil && w != nil:
				r = append(r, c.job(w))
			case c.text != nil && g != nil && c.text(g) != "":
				r = append(r, c.text(g))
			case c.gauge != nil && g != nil && c.gauge(g) != nil:
				r = append(r, c.unit(*c.gauge(g)))
			default:
				r = append(r, "-")
			}
		}
		return r
	}
	if f.Before != nil {
		rows = append(rows, row("before", "", nil, f.Before))
	}
	for i := range f.Windows {
		w := &f.Windows[i]
		held := ""
		if w.Held {
			held = "*"
		}
		rows = append(rows, row(fmtSec(w.StartS)+"-"+fmtSec(w.EndS), held, w, &w.Gauges))
	}
	if f.After != nil {
		rows = append(rows, row(fmt.Sprintf("after (+%s s)", fmt1(f.DrainS)), "", nil, f.After))
	}
	return head, rows
}
