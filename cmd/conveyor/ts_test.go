package main

// The TypeScript client (clients/typescript) against a real `conveyor
// serve`, on every reachable backend: a TypeScript worker drains jobs Go
// enqueued (their metadata included), a Go worker runs jobs the TypeScript
// client enqueued, metadata the TypeScript client enqueued is what
// `conveyor job --json` prints, job keys and key limits go both ways, a
// rate per key holds each key (when the database stores it), and a stale
// worker's acknowledgements are refused with 409 (the scenarios are in
// clients/typescript/test/server.test.ts; this test sets them up and
// checks the database afterwards); and, once, the worker's lease safety
// against a fake server (clients/typescript/test/lease.test.ts, no
// database). Locally it skips, saying why, when Node.js 20+ and npm are
// absent or npm cannot install the package's one development dependency;
// with CI=true it fails instead. Everything listens on 127.0.0.1 and every
// step is bounded in time.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/web"
)

const tsToken = "ts-client-admin-token-0123456789"

// nodeTools returns node and npm, or skips (fails with CI=true).
func nodeTools(t *testing.T) (node, npm string) {
	t.Helper()
	missing := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s, and CI=true requires the TypeScript client's tests: .ci/run installs nodejs and npm", why)
		}
		t.Skipf("%s: install Node.js 20 or later and npm (apt-get install nodejs npm) to run the TypeScript client's tests", why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node not installed")
	}
	npm, err = exec.LookPath("npm")
	if err != nil {
		missing("npm not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		missing(fmt.Sprintf("node --version: %v", err))
	}
	m := regexp.MustCompile(`^v(\d+)\.`).FindStringSubmatch(strings.TrimSpace(string(v)))
	if m == nil {
		missing(fmt.Sprintf("node --version printed %q", v))
	}
	if major, _ := strconv.Atoi(m[1]); major < 20 {
		missing(fmt.Sprintf("node %s is older than 20", strings.TrimSpace(string(v))))
	}
	return node, npm
}

// buildTS installs the package's development dependency (npm ci, from the
// committed lockfile) and compiles it with tsc.
func buildTS(t *testing.T, npm, dir string) {
	t.Helper()
	for _, step := range [][]string{
		{"ci", "--no-audit", "--no-fund", "--prefer-offline"},
		{"run", "build"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, npm, step...)
		cmd.Dir = dir
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			msg := fmt.Sprintf("npm %s in %s: %v\n%s", strings.Join(step, " "), dir, err, out)
			if step[0] == "ci" && os.Getenv("CI") != "true" {
				t.Skipf("cannot install the TypeScript client's dev dependency (registry unreachable?), skipping: %s", msg)
			}
			t.Fatal(msg)
		}
	}
}

// goEcho is the kind the Go worker runs for the TypeScript client.
type goEcho struct {
	N    int    `json:"n"`
	From string `json:"from"`
}

func (goEcho) Kind() string { return "go_echo" }

func TestTypeScriptClient(t *testing.T) {
	node, npm := nodeTools(t)
	dir, err := filepath.Abs(filepath.Join("..", "..", "clients", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	buildTS(t, npm, dir)
	t.Run("lease", func(t *testing.T) { runNodeTests(t, node, dir, "lease.test.js", nil, 0) })
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			db := []string{"--db", dsn}
			prefix := ""
			if b.name != "sqlite" {
				prefix = freshPrefix(t, dsn)
				db = append(db, "--prefix", prefix)
			}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			tokens := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(tokens, []byte(tsToken+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			base := serve(t, append(db, "--token-file", tokens)...)
			runTS(t, node, dir, dsn, prefix, base)
		})
	}
}

// runTS enqueues jobs for the TypeScript worker, starts a Go worker for
// the jobs the TypeScript client enqueues, runs the package's tests
// against the server at base, then checks in the database that every job
// ran exactly once, on the side it was meant for.
func runTS(t *testing.T, node, dir, dsn, prefix, base string) {
	const drainQueue, goQueue, n = "ts-drain", "go-drain", 100
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := connect.Open(ctx, dsn, &conveyor.Config{
		TablePrefix: prefix,
		// ts_echo is worked by the TypeScript worker, not here.
		AllowUnregisteredKinds: true,
		Queues:                 map[string]conveyor.QueueConfig{goQueue: {MaxWorkers: 4}},
		PollMin:                10 * time.Millisecond, PollMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	ran := map[int64]int{}
	err = conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[goEcho]) error {
		if j.Args.From != "ts" {
			return conveyor.JobCancel(fmt.Errorf("args %+v not from the TypeScript client", j.Args))
		}
		mu.Lock()
		ran[j.ID]++
		mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := c.Stop(sctx); err != nil {
			t.Errorf("stopping the Go worker: %v", err)
		}
	}()

	items := make([]conveyor.EnqueueItem, n)
	for i := range items {
		items[i] = conveyor.EnqueueItem{
			Args: conveyor.RawArgs{KindName: "ts_echo", JSON: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))},
			Opts: &conveyor.EnqueueOpts{Queue: drainQueue, Metadata: map[string]string{"from": "go", "n": strconv.Itoa(i)}},
		}
	}
	rs, err := c.EnqueueMany(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	want := map[int64]bool{}
	for i, r := range rs {
		ids[i] = strconv.FormatInt(r.ID, 10)
		want[r.ID] = true
	}

	results := t.TempDir()
	runNodeTests(t, node, dir, "server.test.js", []string{
		"CONVEYOR_URL=" + base,
		"CONVEYOR_TOKEN=" + tsToken,
		"CONVEYOR_TS_DRAIN_QUEUE=" + drainQueue,
		"CONVEYOR_TS_DRAIN_IDS=" + strings.Join(ids, ","),
		"CONVEYOR_TS_GO_QUEUE=" + goQueue,
		"CONVEYOR_TS_GO_KIND=" + goEcho{}.Kind(),
		"CONVEYOR_TS_RESULTS=" + results,
	}, 0)

	// The TypeScript worker ran each of Go's jobs once, and the database
	// says so: completed at the first attempt, by an HTTP worker.
	var drained []int64
	readJSON(t, filepath.Join(results, "drained.json"), &drained)
	seen := map[int64]int{}
	for _, id := range drained {
		seen[id]++
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("job %d ran %d times in the TypeScript worker, want 1", id, seen[id])
		}
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != conveyor.JobStateCompleted || j.Attempt != 1 || !strings.HasPrefix(j.AttemptedBy, "http:ts-") {
			t.Errorf("job %d: %s at attempt %d by %q, want completed at attempt 1 by http:ts-...", id, j.State, j.Attempt, j.AttemptedBy)
		}
	}
	if len(drained) != n {
		t.Errorf("the TypeScript worker ran %d jobs, want %d", len(drained), n)
	}

	// The metadata the TypeScript client enqueued (and one job's, enqueued
	// through the API by hand) is what `conveyor job --json` prints.
	var meta map[string]map[string]string
	readJSON(t, filepath.Join(results, "metadata.json"), &meta)
	if len(meta) != 5 {
		t.Errorf("the TypeScript metadata test wrote %d jobs, want 5", len(meta))
	}
	db := []string{"--db", dsn}
	if prefix != "" {
		db = append(db, "--prefix", prefix)
	}
	for id, want := range meta {
		var j web.JobJSON
		if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"job", "--json", id}, db...)...)), &j); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(j.Metadata, want) {
			t.Errorf("job --json %s: metadata %v, want %v as the TypeScript client enqueued it", id, j.Metadata, want)
		}
	}

	// The Go worker ran each job the TypeScript client enqueued once.
	var enqueued []int64
	readJSON(t, filepath.Join(results, "enqueued.json"), &enqueued)
	if len(enqueued) != 50 {
		t.Errorf("the TypeScript client enqueued %d jobs, want 50", len(enqueued))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range enqueued {
		if ran[id] != 1 {
			t.Errorf("job %d enqueued by TypeScript ran %d times in the Go worker, want 1", id, ran[id])
		}
	}
	if len(ran) != len(enqueued) {
		t.Errorf("the Go worker ran %d jobs, want the %d the TypeScript client enqueued", len(ran), len(enqueued))
	}
}

// runNodeTests runs one compiled test file of the package (dist/test/file)
// with node's test runner and env added to the environment, bounded in
// time, and fails unless every test in it passed but the skipped ones it
// expects.
func runNodeTests(t *testing.T, node, dir, file string, env []string, skipped int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-timeout=60000", filepath.Join("dist", "test", file))
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %s (%s): %v\n%s", file, time.Since(start).Round(time.Millisecond), err, out)
	}
	summary := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$`).FindAllStringSubmatch(string(out), -1) {
		summary[m[1]], _ = strconv.Atoi(m[2])
	}
	if summary["tests"] == 0 || summary["skipped"] != skipped || summary["pass"]+skipped != summary["tests"] {
		t.Fatalf("node --test %s: not every test passed, or not %d skipped (%v):\n%s", file, skipped, summary, out)
	}
	t.Logf("node --test %s: %d passed, %d skipped in %s", file, summary["pass"], skipped, time.Since(start).Round(time.Millisecond))
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the TypeScript tests wrote no results: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
