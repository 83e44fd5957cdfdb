package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

func fakeSteady() *bench.Result {
	r := fake("steady", 100)
	r.Producers = 8
	i := func(v int64) *int64 { return &v }
	f := func(v float64) *float64 { return &v }
	s := &bench.SteadyFigures{Rate: 1000, WindowS: 30, LoadS: 90, Offered: 90000, Enqueued: 90000, DrainS: 0.2,
		Hold:        &bench.HoldFigures{Statement: "BEGIN ISOLATION LEVEL REPEATABLE READ", Tables: []string{"jobs"}, StartS: -0.05, EndS: 60, Released: true},
		GaugeSource: "test", CPUSource: "test", Notes: []string{"<b>escaped</b>"},
		Before: &bench.Gauges{AtS: -0.3, DeadTuples: i(0), TotalBytes: i(1 << 20)},
		After:  &bench.Gauges{AtS: 90.2, DeadTuples: i(500), TotalBytes: i(9 << 20)},
	}
	for k := 0; k < 3; k++ {
		s.Windows = append(s.Windows, bench.Window{StartS: float64(30 * k), EndS: float64(30 * (k + 1)), Held: k < 2, Offered: 30000,
			OfferedPerS: 1000, EnqueuedPerS: 1000, CompletedPerS: 990, P50ms: 0, P99ms: 40, Maxms: 90,
			Gauges: bench.Gauges{AtS: float64(30 * (k + 1)), DeadTuples: i(int64(60000 * (k + 1))), LiveTuples: i(100), TotalBytes: i(int64(k+2) << 20),
				TableBytes: i(1 << 20), IndexBytes: i(1 << 19), XminAge: i(3), DBCPUShare: f(0.4), ClientCPUShare: f(0.3), MachineCPUShare: f(0.9)}})
	}
	r.Steady = s
	return r
}

// A steady run's page has its five charts over time (plus the latency
// and reordering histograms), its windows table, and escapes what it
// prints.
func TestSteadyReport(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, []*bench.Result{fakeSteady()}); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	checkPage(t, html, 7)
	for _, want := range []string{"Over time", "snapshot held", "dead tuples", "pick-up p50 ms", "&lt;b&gt;escaped&lt;/b&gt;", "0-30", "after ("} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(html, "<b>escaped") {
		t.Error("a note was not escaped")
	}
}
