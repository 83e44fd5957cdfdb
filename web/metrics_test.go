package web

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestMetricsHandler: Options.Metrics is served at BasePath/metrics to any
// credential, read-only included, and to nobody without one.
func TestMetricsHandler(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write([]byte("conveyor_test_metric 1\n"))
	})
	e := newEnv(t, filepath.Join(t.TempDir(), "q.db"), func(o *Options) { o.Metrics, o.BasePath = metrics, "/q" })
	e.must(http.StatusUnauthorized, req{method: "GET", path: "/q/metrics"})
	for _, auth := range []string{roToken, adminToken, "basic"} {
		if res := e.must(http.StatusOK, req{method: "GET", path: "/q/metrics", auth: auth}); !strings.Contains(string(res.body), "conveyor_test_metric 1") {
			t.Errorf("%s: body %q", auth, res.body)
		}
	}
	// Without Metrics there is no such page.
	e2 := newEnv(t, filepath.Join(t.TempDir(), "q.db"), nil)
	e2.must(http.StatusNotFound, req{method: "GET", path: "/metrics", auth: roToken})
}
