package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// libraryInternal is the import path prefix of the library's internal
// packages. The command's own (cmd/conveyor/internal/...) are not under it.
const libraryInternal = "github.com/conveyorq/conveyor/internal/"

// testOnlyInternal are the library's internal packages the command's tests
// may import: internal/testdb finds the databases they run on and
// internal/topology starts the topologies (PgBouncer, Patroni, Galera)
// some of them run on. Non-test
// code may import none: the command, the bench and the torture suite use
// the library's public API, package connect (clients from DSNs, DSN
// helpers) and package lab (the hooks only tests and the lab may use).
var testOnlyInternal = []string{libraryInternal + "testdb", libraryInternal + "topology"}

// importViolations reads the output of `go list -f` with importsFormat
// and returns one line per import of the library's internal packages
// that the rules above forbid.
func importViolations(listing string) []string {
	var bad []string
	for _, l := range strings.Split(strings.TrimSpace(listing), "\n") {
		fields := strings.Split(l, "|")
		if len(fields) != 4 {
			bad = append(bad, fmt.Sprintf("unreadable line of go list: %q", l))
			continue
		}
		pkg := fields[0]
		for i, kind := range []string{"imports", "test imports", "external test imports"} {
			for _, imp := range strings.Fields(fields[i+1]) {
				if !strings.HasPrefix(imp, libraryInternal) {
					continue
				}
				if i > 0 && slices.Contains(testOnlyInternal, imp) {
					continue
				}
				bad = append(bad, fmt.Sprintf("%s %s %s", pkg, kind, imp))
			}
		}
	}
	return bad
}

// importsFormat is the `go list -f` template importViolations reads.
const importsFormat = `{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}}|{{join .XTestImports " "}}`

// TestNoLibraryInternalImports: no package of the command's module
// imports the library's internal packages (internal/backend/..., the
// engine, the seam, the DSN parser...), in its code or its tests, but
// internal/testdb in tests. What the lab needs beyond the public API is in
// package lab.
func TestNoLibraryInternalImports(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "list", "-f", importsFormat, "./...")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	if !strings.Contains(string(out), "github.com/conveyorq/conveyor/cmd/conveyor/internal/torture|") {
		t.Fatalf("go list did not list the torture package:\n%s", out)
	}
	if bad := importViolations(string(out)); len(bad) > 0 {
		t.Fatalf("the command's module imports the library's internal packages (use the public API, connect or lab):\n%s", strings.Join(bad, "\n"))
	}
}

// TestImportViolationsFound: the rules catch a backend, the engine or
// the seam imported by code or tests, and testdb imported by code; they
// let testdb in tests and the command's own internal packages through.
func TestImportViolationsFound(t *testing.T) {
	listing := strings.Join([]string{
		"github.com/conveyorq/conveyor/cmd/conveyor|github.com/conveyorq/conveyor/connect github.com/conveyorq/conveyor/cmd/conveyor/internal/bench|github.com/conveyorq/conveyor/internal/testdb github.com/conveyorq/conveyor/lab|",
		"a|github.com/conveyorq/conveyor/internal/backend/sqlite||",
		"b|fmt|github.com/conveyorq/conveyor/internal/engine|",
		"c|||github.com/conveyorq/conveyor/internal/seam",
		"d|github.com/conveyorq/conveyor/internal/testdb||",
	}, "\n")
	want := []string{
		"a imports github.com/conveyorq/conveyor/internal/backend/sqlite",
		"b test imports github.com/conveyorq/conveyor/internal/engine",
		"c external test imports github.com/conveyorq/conveyor/internal/seam",
		"d imports github.com/conveyorq/conveyor/internal/testdb",
	}
	if got := importViolations(listing); !slices.Equal(got, want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
