package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// TestREADMEShowsThisProgram keeps the README's first Go block and this
// program the same text, so that the program the README shows is the one
// that compiles (with the module) and runs (below).
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	block, _, ok = strings.Cut(block, "```\n")
	if !ok {
		t.Fatal("README.md's first ```go block is not closed")
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	// The file's package comment is not in the README.
	_, prog, ok := strings.Cut(string(src), "\npackage main\n")
	if !ok {
		t.Fatal("main.go has no package clause")
	}
	prog = "package main\n" + prog
	if block != prog {
		t.Errorf("README.md's first Go block differs from examples/quickstart/main.go (without its package comment); make them the same.\nREADME:\n%s\nmain.go:\n%s", block, prog)
	}
}

// TestQuickStartRuns runs the program as a user would, in an empty
// directory: it must say that its job ran and return (main exits the
// test binary through log.Fatal on any failure, which fails the test).
func TestQuickStartRuns(t *testing.T) {
	t.Chdir(t.TempDir())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		out <- b
	}()
	func() {
		defer func() { os.Stdout = stdout; w.Close() }()
		main()
	}()
	got := <-out
	for _, want := range []string{"sending to a@example.com\n", "job 1 ran\n"} {
		if !bytes.Contains(got, []byte(want)) {
			t.Errorf("output %q does not contain %q", got, want)
		}
	}
}
