package report

import (
	"bytes"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

func fake(workload string, workers int) *bench.Result {
	r := &bench.Result{
		Workload: workload, Backend: "postgres", Workers: workers, Jobs: 1000, Seconds: 1,
		JobsPerS: 100 * float64(workers), P50ms: 1, P95ms: 2, P99ms: 3, Maxms: 9,
		ReorderMax: 12, ReorderP99: 5, ReorderHist: [5]int64{900, 90, 10, 0, 0},
		Waits: map[string]any{
			"events":    map[string]bench.WaitEvent{"CPU": {Count: 6, Share: 0.6}, "Lock/tuple": {Count: 4, Share: 0.4}},
			"deadlocks": int64(0),
		},
		Settings: map[string]string{"backend": "postgres", "server_version": "15", "cores": "2"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1000; i++ {
		r.Latencies = append(r.Latencies, time.Duration(rng.ExpFloat64()*float64(time.Millisecond)))
	}
	return r
}

// A page is self-contained: inline SVG charts, no script, nothing fetched
// (the only URLs are SVG namespace names), no NaN coordinates.
func checkPage(t *testing.T, html string, charts int) {
	t.Helper()
	if n := strings.Count(html, "<svg"); n != charts {
		t.Errorf("%d charts, want %d", n, charts)
	}
	for _, bad := range []string{"<script", "<link", "<img", "@import", "NaN", "Inf", "<?xml"} {
		if strings.Contains(html, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	for _, u := range regexp.MustCompile(`https?://[^"' )]+`).FindAllString(html, -1) {
		if u != "http://www.w3.org/2000/svg" && u != "http://www.w3.org/1999/xlink" {
			t.Errorf("page refers to %s", u)
		}
	}
	if !strings.Contains(html, "Liberation Sans',Arial") {
		t.Error("chart text has no font fallback")
	}
}

func TestSweepReport(t *testing.T) {
	var rs []*bench.Result
	for _, w := range []int{1, 10, 100} {
		r := fake("sweep", w)
		r.Of = "latency"
		rs = append(rs, r)
	}
	rs[1].Settings["pool"] = "8" // a setting only one run has
	var buf bytes.Buffer
	if err := Write(&buf, rs); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	// throughput, latency, three histograms, reordering
	checkPage(t, html, 6)
	for _, want := range []string{"Throughput against workers", "Enqueue-to-start latency against workers", "Jobs by displacement", "Lock/tuple 40.0%", "8 (10 workers)"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestClaimsAndIsolationReports(t *testing.T) {
	var claims []*bench.Result
	for _, s := range []string{"conveyor", "pessimistic", "random"} {
		r := fake("claims", 10)
		r.Strategy = s
		r.Claims = &bench.ClaimFigures{Deadlocks: 3, Collisions: 40, Rounds: 1040, RoundsPerJob: 1.04}
		claims = append(claims, r)
	}
	claims[0].Latencies = nil         // no histogram for a run without samples
	claims[0].Claims.RoundsPerJob = 0 // conveyor: no rounds figure
	var buf bytes.Buffer
	if err := Write(&buf, claims); err != nil {
		t.Fatal(err)
	}
	checkPage(t, buf.String(), 2+2+1)

	var iso []*bench.Result
	for _, ph := range []string{"cold-idle", "cold-under-hot", "hot"} {
		r := fake("isolation", 100)
		r.Phase = ph
		iso = append(iso, r)
	}
	buf.Reset()
	if err := Write(&buf, iso); err != nil {
		t.Fatal(err)
	}
	checkPage(t, buf.String(), 1+3+1)
	if err := Write(&buf, nil); err == nil {
		t.Error("an empty report was written")
	}
}
