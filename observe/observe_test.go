package observe_test

import (
	"os"
	"strings"
	"testing"
)

// TestLibraryRequiresNoObservabilityCode: the reason this module exists.
// The library's go.mod and go.sum name neither Prometheus nor
// OpenTelemetry, so its users download neither.
func TestLibraryRequiresNoObservabilityCode(t *testing.T) {
	for _, f := range []string{"../go.mod", "../go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, dep := range []string{"github.com/prometheus/", "go.opentelemetry.io/"} {
			if strings.Contains(string(b), dep) {
				t.Errorf("%s mentions %s: the library must not depend on it (it belongs in observe/go.mod)", f, dep)
			}
		}
	}
}
