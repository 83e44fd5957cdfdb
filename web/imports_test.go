package web

import (
	"os/exec"
	"strings"
	"testing"
)

// goList runs go list with args in this package's directory.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// Package web is built on conveyor's public API: it imports package
// conveyor and the standard library, no internal package, and reaches
// conveyor's internals only through package conveyor itself (the worker
// protocol runs on conveyor.RemoteWorkers, the client's engine).
func TestWebImportsNoInternalPackage(t *testing.T) {
	const mod = "github.com/conveyorq/conveyor"
	for _, imp := range goList(t, "-f", `{{join .Imports "\n"}}`, ".") {
		if strings.HasPrefix(imp, mod+"/internal/") || (strings.HasPrefix(imp, mod+"/") && imp != mod) {
			t.Errorf("package web imports %s: it may import %s and the standard library only", imp, mod)
		} else if imp != mod && strings.Contains(strings.Split(imp, "/")[0], ".") {
			t.Errorf("package web imports %s: it may import %s and the standard library only", imp, mod)
		}
	}
	internal := func(pkg string) map[string]bool {
		m := map[string]bool{}
		for _, d := range goList(t, "-deps", pkg) {
			if strings.HasPrefix(d, mod+"/internal/") {
				m[d] = true
			}
		}
		return m
	}
	viaRoot := internal(mod)
	for d := range internal(".") {
		if !viaRoot[d] {
			t.Errorf("package web depends on %s, which package conveyor does not: it is reached around the public API", d)
		}
	}
}
