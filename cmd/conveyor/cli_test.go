package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/cmd/conveyor/internal/torture"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
)

// cli runs the command in-process, bounded in time, with stdin as its
// standard input, and returns what it printed.
func cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	err = run(ctx, args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

// mustCLI runs the command and fails the test on an error.
func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := cli(t, "", args...)
	if err != nil {
		t.Fatalf("%q: %v\n%s", args, err, errOut)
	}
	return out
}

// oneLineErr fails the test unless err is a one-line error containing want.
func oneLineErr(t *testing.T, args []string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%q: no error, want %q", args, want)
	case strings.Contains(err.Error(), "\n"):
		t.Errorf("%q: error on several lines:\n%v", args, err)
	case !strings.Contains(err.Error(), want):
		t.Errorf("%q: error %q lacks %q", args, err, want)
	}
}

// inEmptyDir makes the test run in an empty directory with no
// $CONVEYOR_DB, and fails it if anything (./conveyor.db first of all) is
// left there.
func inEmptyDir(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("CONVEYOR_DB", "")
	t.Cleanup(func() {
		if es, _ := os.ReadDir(dir); len(es) > 0 {
			t.Errorf("files written to the working directory: %v", es)
		}
	})
}

// backends are the databases the tests run on: a SQLite file in a
// temporary directory always, PostgreSQL and MariaDB when reachable.
var backends = []struct {
	name string
	dsn  func(testing.TB) string
}{
	{"sqlite", func(tb testing.TB) string { return filepath.Join(tb.TempDir(), "q.db") }},
	{"postgres", testdb.Postgres},
	{"mysql", testdb.MySQL},
}

// freshPrefix returns a fresh table prefix whose tables are dropped when
// the test ends.
func freshPrefix(t *testing.T, dsn string) string {
	p := testdb.Prefix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: p})
		if err != nil {
			t.Errorf("dropping the tables under %s: %v", p, err)
			return
		}
		defer c.Close()
		if err := lab.DropTables(ctx, c); err != nil {
			t.Errorf("dropping the tables under %s: %v", p, err)
		}
	})
	return p
}

// jobState returns a job's state as job --json prints it.
func jobState(t *testing.T, args ...string) conveyor.JobState {
	t.Helper()
	var j struct{ State conveyor.JobState }
	if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"job", "--json"}, args...)...)), &j); err != nil {
		t.Fatal(err)
	}
	return j.State
}

// --db and --prefix work before and after the command, on every backend,
// and the default ./conveyor.db is never touched.
func TestGlobalFlagsEitherPosition(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			inEmptyDir(t)
			p := freshPrefix(t, dsn)
			mustCLI(t, "migrate", "--db", dsn, "--prefix", p)
			id := strings.TrimSpace(mustCLI(t, "--db", dsn, "--prefix", p, "enqueue", "--kind", "k", "--allow-unknown-kinds"))
			id2 := strings.TrimSpace(mustCLI(t, "--prefix", p, "enqueue", "--db", dsn, "--kind", "k", "--allow-unknown-kinds"))
			if out := mustCLI(t, "cancel", id, "--db", dsn, "--prefix", p); !strings.Contains(out, "is now "+string(conveyor.JobStateCancelled)) {
				t.Fatalf("cancel: %s", out)
			}
			mustCLI(t, "--db", dsn, "discard", "--prefix", p, id2)
			if s := jobState(t, id, "--db", dsn, "--prefix", p); s != conveyor.JobStateCancelled {
				t.Errorf("job %s is %s, want cancelled", id, s)
			}
			if s := jobState(t, "--db", dsn, "--prefix", p, id2); s != conveyor.JobStateDiscarded {
				t.Errorf("job %s is %s, want discarded", id2, s)
			}
			var st struct{ Backend string }
			if err := json.Unmarshal([]byte(mustCLI(t, "stats", "--json", "--prefix", p, "--db", dsn)), &st); err != nil || st.Backend != b.name {
				t.Errorf("stats backend %q (%v), want %s", st.Backend, err, b.name)
			}
			// The same flag on both sides must agree.
			mustCLI(t, "--db", dsn, "jobs", "--db", dsn, "--prefix", p)
			_, _, err := cli(t, "", "--db", dsn, "jobs", "--db", "other.db", "--prefix", p)
			oneLineErr(t, []string{"--db", dsn, "jobs", "--db", "other.db"}, err, "given twice")

			// bench: --db before and after the command is the same.
			for _, args := range [][]string{
				{"bench", "--db", dsn, "--jobs", "200", "--workers", "4", "--json"},
				{"--db", dsn, "bench", "--jobs", "200", "--workers", "4", "--json"},
			} {
				var r struct{ Backend string }
				out := mustCLI(t, args...)
				if err := json.Unmarshal([]byte(out), &r); err != nil || r.Backend != b.name {
					t.Errorf("%q: ran on %q (%v), want %s:\n%s", args, r.Backend, err, b.name, out)
				}
			}
		})
	}
}

// demo runs on the --db database, after the command too.
func TestDemoDB(t *testing.T) {
	inEmptyDir(t)
	dsn := filepath.Join(t.TempDir(), "demo.db")
	out := mustCLI(t, "demo", "--jobs", "200", "--workers", "4", "--db", dsn)
	if !strings.Contains(out, "throw-away tables in sqlite") || !strings.Contains(out, "0 lost, 0 duplicates") {
		t.Errorf("demo output:\n%s", out)
	}
	if _, err := os.Stat(dsn); err != nil {
		t.Errorf("demo did not use --db: %v", err)
	}
}

// The torture command passes --db from either side, never $CONVEYOR_DB,
// and restarts a database server only with --restart-server.
func TestTortureOptions(t *testing.T) {
	inEmptyDir(t)
	var got torture.Options
	tortureRun = func(_ context.Context, o torture.Options) ([]torture.Row, error) {
		got = o
		return nil, nil
	}
	t.Cleanup(func() { tortureRun = torture.Run })
	pg := "postgres://postgres@127.0.0.1:5432/test"
	my := "mysql://root@127.0.0.1:3306/test"
	t.Setenv("CONVEYOR_DB", pg)
	for _, c := range []struct {
		args      []string
		dsn       string
		noRestart bool
	}{
		{[]string{"torture", "--db", pg}, pg, true},
		{[]string{"--db", pg, "torture"}, pg, true},
		{[]string{"torture", "--db", my, "--no-restart"}, my, true},
		{[]string{"--db", my, "torture", "--restart-server"}, my, false},
		{[]string{"torture", "--restart-server", "--db", pg}, pg, false},
		{[]string{"torture"}, "", false}, // a temporary SQLite file: its restart fault restarts no server
		{[]string{"torture", "--db", "x.db"}, "x.db", false},
	} {
		got = torture.Options{}
		mustCLI(t, c.args...)
		if got.DSN != c.dsn || got.NoRestart != c.noRestart {
			t.Errorf("%q: DSN %q NoRestart %v, want %q %v", c.args, got.DSN, got.NoRestart, c.dsn, c.noRestart)
		}
	}
}

// Unknown flags and stray arguments fail on one line, print no usage and
// write nothing.
func TestBadArguments(t *testing.T) {
	inEmptyDir(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--bogus"}, "migrate: flag provided but not defined: --bogus (run 'conveyor migrate --help' for usage)"},
		{[]string{"migrate", "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "extra"}, `stats: unexpected argument "extra"`},
		{[]string{"stats", "--json=maybe"}, "invalid boolean value"},
		{[]string{"jobs", "extra"}, `unexpected argument "extra"`},
		{[]string{"jobs", "--limit", "x"}, `invalid value "x" for flag --limit`},
		{[]string{"jobs", "--state", "running,done"}, `unknown job state "done" (valid states: available, scheduled, running, retryable, completed, discarded, cancelled)`},
		{[]string{"job"}, "job id required"},
		{[]string{"batch"}, "batch id required"},
		{[]string{"batch", "x1"}, `"x1" is not a batch id`},
		{[]string{"job", "1", "2"}, `unexpected argument "2" after the job id`},
		{[]string{"cancel", "1", "2"}, `cancel: unexpected argument "2" after the job id`},
		{[]string{"retry", "x"}, `"x" is not a job id`},
		{[]string{"discard", "--", "-1"}, `"-1" is not a job id`},
		{[]string{"enqueue"}, "--kind is required"},
		{[]string{"enqueue", "--kind", "k", "extra"}, `unexpected argument "extra"`},
		{[]string{"enqueue", "--kind", "k", "--args", "{nope"}, "--args is not valid JSON"},
		{[]string{"enqueue", "--kind", "k", "--args", "[1,2]"}, "enqueue: --args must be a JSON object ({...}), not an array"},
		{[]string{"enqueue", "--kind", "k", "--args", `"x"`}, "--args must be a JSON object ({...}), not a string"},
		{[]string{"enqueue", "--kind", "k", "--args", "null"}, "--args must be a JSON object ({...}), not null"},
		{[]string{"enqueue", "--kind", "k", "--max-attempts", "0"}, "enqueue: --max-attempts 0: must be 1 or more"},
		{[]string{"enqueue", "--kind", "k", "--max-attempts", "-3"}, "--max-attempts -3: must be 1 or more"},
		{[]string{"enqueue", "--kind", "k", "--priority", "5000"}, "--priority 5000: must be -1000 to 1000"},
		{[]string{"enqueue", "--kind", "k", "--delay", "-1s"}, "--delay -1s: must not be negative"},
		{[]string{"enqueue", "--kind", "k", "--key", ""}, "enqueue: --key is empty"},
		{[]string{"enqueue", "--kind", "k", "--key", strings.Repeat("k", 256)}, "enqueue: --key is 256 bytes: at most 255"},
		{[]string{"enqueue", "--kind", "k", "--key", "a\x00b"}, `enqueue: --key "a\x00b": must be UTF-8 without NUL characters`},
		{[]string{"enqueue", "--kind", "k", "--key", "a\xffb"}, "must be UTF-8 without NUL characters"},
		{[]string{"jobs", "--limit", "0"}, "jobs: --limit 0: must be 1 or more"},
		{[]string{"jobs", "--limit", "-1"}, "jobs: --limit -1: must be 1 or more"},
		{[]string{"jobs", "--after", "-1"}, "jobs: --after -1: must be a job id"},
		{[]string{"jobs", "--queue", "bad q"}, `jobs: --queue "bad q": invalid queue name: must match`},
		{[]string{"jobs", "--queue", ".hidden"}, `jobs: --queue ".hidden": invalid queue name`},
		{[]string{"jobs", "--kind", "bad kind"}, `jobs: --kind "bad kind": invalid kind name: must match`},
		{[]string{"pause", "bad queue!"}, `pause queue "bad queue!": invalid queue name`},
		{[]string{"resume", "bad queue!"}, `resume queue "bad queue!": invalid queue name`},
		{[]string{"--bogus", "jobs"}, "flag provided but not defined: --bogus (run 'conveyor --help' for usage)"},
		{[]string{"nope"}, `unknown command "nope" (run 'conveyor --help' for usage)`},
		{[]string{"help", "jobs", "extra"}, `unexpected argument "extra"`},
		{[]string{"--db", "a.db", "jobs", "--db", "b.db"}, `given twice, as "a.db" and "b.db"`},
		{[]string{"bench", "extra"}, `unexpected argument "extra"`},
		{[]string{"bench", "--prefix", "p_"}, "--prefix does not apply"},
		{[]string{"--prefix", "p_", "demo"}, "--prefix does not apply"},
		{[]string{"demo", "--jobs", "x"}, `invalid value "x" for flag --jobs`},
		{[]string{"stats", "--json=maybe"}, `invalid boolean value "maybe" for --json`},
		{[]string{"enqueue", "--kind"}, "flag needs an argument: --kind"},
		{[]string{"jobs", "--connect-timeout", "-1s"}, "--connect-timeout: must not be negative"},
		{[]string{"jobs", "--connect-timeout", "soon"}, "--connect-timeout: not a duration"},
		{[]string{"--connect-timeout", "1s", "jobs", "--connect-timeout", "2s"}, "given twice, as 1s and 2s"},
		{[]string{"bench", "--connect-timeout", "1s"}, "--connect-timeout does not apply to bench"},
		{[]string{"torture", "--prefix", "p_"}, "--prefix does not apply"},
		{[]string{"torture", "--restart-server", "--no-restart"}, "contradict"},
		{[]string{"torture", "extra"}, `unexpected argument "extra"`},
	} {
		out, errOut, err := cli(t, "", c.args...)
		oneLineErr(t, c.args, err, c.want)
		if out != "" || errOut != "" {
			t.Errorf("%q printed %q and %q", c.args, out, errOut)
		}
	}
}

// --help prints the usage on stdout and succeeds.
func TestHelp(t *testing.T) {
	inEmptyDir(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "usage: conveyor COMMAND"},
		{[]string{"-h"}, "usage: conveyor COMMAND"},
		{[]string{"help"}, "usage: conveyor COMMAND"},
		{[]string{"help", "jobs"}, "usage: conveyor jobs"},
		{[]string{"migrate", "--help"}, "usage: conveyor migrate"},
		{[]string{"enqueue", "--help"}, "@FILE"},
		{[]string{"jobs", "--help"}, "-state"},
		{[]string{"job", "--help"}, "usage: conveyor job ID"},
		{[]string{"cancel", "-h"}, "usage: conveyor cancel ID"},
		{[]string{"stats", "--help"}, "--db DSN"},
		{[]string{"stats", "--help"}, "--connect-timeout duration"},
		{[]string{"demo", "--help"}, "usage: conveyor demo"},
		{[]string{"bench", "--help"}, "-workload"},
		{[]string{"--db", "x.db", "torture", "--help"}, "-restart-server"},
		{[]string{"serve", "--help"}, "-insecure-loopback-dev"},
		{[]string{"--help"}, "serve [--listen ADDR]"},
		{[]string{"enqueue", "--help"}, "--key key"},
		{[]string{"limits", "--help"}, "--key-max-running"},
		{[]string{"limits", "--help"}, "--ordered-move-on"},
		{[]string{"limits", "--help"}, "--fair"},
		{[]string{"limits", "--help"}, "limits weights QUEUE [KEY=WEIGHT ...]"},
		{[]string{"--help"}, "limits weights QUEUE"},
		{[]string{"--help"}, "[--key KEY]"},
	} {
		out, errOut, err := cli(t, "", c.args...)
		if err != nil || errOut != "" || !strings.Contains(out, c.want) {
			t.Errorf("%q: err %v, stderr %q, stdout lacks %q:\n%s", c.args, err, errOut, c.want, out)
		}
	}
	// Every command's flags are listed with two dashes, as the usage and
	// the errors write them.
	single := regexp.MustCompile(`(?m)^\s+-[a-z]`)
	for name := range commands {
		out := mustCLI(t, name, "--help")
		if l := single.FindString(out); l != "" || !strings.Contains(out, "  --db ") {
			t.Errorf("%s --help lists a flag with one dash (%q):\n%s", name, l, out)
		}
	}
}

// Only migrate creates a SQLite database; the other commands name the
// missing file, and every command names a database without the schema.
func TestNoDatabaseNoSchema(t *testing.T) {
	cmds := [][]string{{"jobs"}, {"job", "1"}, {"stats"}, {"retry", "1"}, {"cancel", "1"}, {"discard", "1"}, {"enqueue", "--kind", "k"}}
	t.Run("missing", func(t *testing.T) {
		dir := t.TempDir()
		for _, dsn := range []string{filepath.Join(dir, "x.db"), "sqlite:" + filepath.Join(dir, "x.db")} {
			for _, c := range cmds {
				args := append(slices.Clone(c), "--db", dsn)
				_, _, err := cli(t, "", args...)
				oneLineErr(t, args, err, "no database at "+filepath.Join(dir, "x.db")+" (run conveyor migrate first)")
			}
		}
		if es, _ := os.ReadDir(dir); len(es) > 0 {
			t.Errorf("files created: %v", es)
		}
	})
	t.Run("default", func(t *testing.T) {
		inEmptyDir(t)
		_, _, err := cli(t, "", "jobs")
		oneLineErr(t, []string{"jobs"}, err, "no database at ./conveyor.db (run conveyor migrate first)")
	})
	for _, b := range backends {
		t.Run("unmigrated-"+b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			p := "conveyor_"
			if b.name == "sqlite" {
				if err := os.WriteFile(dsn, nil, 0o644); err != nil { // an empty SQLite database
					t.Fatal(err)
				}
			} else {
				p = freshPrefix(t, dsn)
			}
			for _, c := range cmds {
				args := append(slices.Clone(c), "--db", dsn, "--prefix", p)
				_, _, err := cli(t, "", args...)
				oneLineErr(t, args, err, "database has no conveyor schema under prefix "+p+": run conveyor migrate")
			}
		})
	}
}

// Failing attempts made by a worker, for the JSON test.
type failArgs struct{}

func (failArgs) Kind() string { return "fail" }

var rfc3339Micro = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

// jobs --json and job --json print snake_case keys, UTC RFC 3339 times
// with microseconds, null for what is absent and milliseconds; stats
// --json has no process counters.
func TestJSONShape(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	// Job 1 has a timeout and one failed attempt; job 2 neither.
	c, err := connect.Open(ctx, dsn, &conveyor.Config{AllowUnregisteredKinds: true, Backoff: func(int) time.Duration { return time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[failArgs]) error { return errors.New("boom") }))
	id, err := c.Enqueue(ctx, failArgs{}, &conveyor.EnqueueOpts{Timeout: 1500 * time.Millisecond, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(j.Errors) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()
	mustCLI(t, "enqueue", "--db", dsn, "--kind", "other", "--args", `{"n":1}`, "--allow-unknown-kinds")

	keys := []string{"id", "queue", "kind", "state", "args", "priority", "attempt", "max_attempts", "timeout_ms",
		"created_at", "scheduled_at", "attempted_at", "attempted_by", "lease_expires_at", "finalized_at", "errors", "metadata", "key", "result"}
	check := func(what string, j map[string]any) {
		t.Helper()
		var got []string
		for k := range j {
			got = append(got, k)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(keys))
		if !slices.Equal(got, want) {
			t.Errorf("%s: keys %v, want %v", what, got, want)
		}
		for _, k := range []string{"created_at", "scheduled_at", "attempted_at", "lease_expires_at", "finalized_at"} {
			if s, ok := j[k].(string); ok && !rfc3339Micro.MatchString(s) {
				t.Errorf("%s: %s = %q, not RFC 3339 UTC with microseconds", what, k, s)
			}
		}
		if j["created_at"] == nil || j["scheduled_at"] == nil || j["finalized_at"] != nil || j["lease_expires_at"] != nil {
			t.Errorf("%s: times %v %v %v %v", what, j["created_at"], j["scheduled_at"], j["finalized_at"], j["lease_expires_at"])
		}
	}
	var one map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "job", "1", "--json", "--db", dsn)), &one); err != nil {
		t.Fatal(err)
	}
	check("job 1", one)
	if one["timeout_ms"] != 1500.0 || one["state"] != string(conveyor.JobStateRetryable) || one["attempted_at"] == nil || one["attempted_by"] == nil {
		t.Errorf("job 1: %v", one)
	}
	errs, _ := one["errors"].([]any)
	if len(errs) != 1 {
		t.Fatalf("job 1 errors: %v", one["errors"])
	}
	e0 := errs[0].(map[string]any)
	if e0["attempt"] != 1.0 || e0["error"] != "boom" || e0["trace"] != nil || !rfc3339Micro.MatchString(e0["at"].(string)) || len(e0) != 4 {
		t.Errorf("job 1 error: %v", e0)
	}

	var list []map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "jobs", "--json", "--db", dsn)), &list); err != nil || len(list) != 2 {
		t.Fatalf("jobs --json: %v, %d jobs", err, len(list))
	}
	check("jobs[0]", list[0])
	check("jobs[1]", list[1])
	two := list[1]
	if two["timeout_ms"] != nil || two["attempted_at"] != nil || two["attempted_by"] != nil || two["args"].(map[string]any)["n"] != 1.0 {
		t.Errorf("job 2: %v", two)
	}
	if e, ok := two["errors"].([]any); !ok || len(e) != 0 {
		t.Errorf("job 2 errors: %v, want []", two["errors"])
	}

	var st map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "stats", "--json", "--db", dsn)), &st); err != nil {
		t.Fatal(err)
	}
	if _, ok := st["counters"]; ok || st["backend"] != "sqlite" {
		t.Errorf("stats --json: %v", st)
	}
	for _, q := range st["queues"].([]any) {
		q := q.(map[string]any)
		if _, ok := q["oldest_available_ms"]; !ok || len(q) != 8 { // queue, counts, oldest_available_ms, paused_at, limits, limit_use, held, awaiting_dependencies
			t.Errorf("stats queue: %v", q)
		}
	}
	if out := mustCLI(t, "stats", "--db", dsn); strings.Contains(out, "counter") {
		t.Errorf("stats prints counters:\n%s", out)
	}
}

// --args reads a file after @, and standard input for - and @-: args
// larger than one command-line argument can hold.
func TestEnqueueArgsFromFileAndStdin(t *testing.T) {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	big, _ := json.Marshal(map[string]string{"pad": strings.Repeat("x", 300<<10)})
	file := filepath.Join(dir, "args.json")
	if err := os.WriteFile(file, append(big, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"a": 1,}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		stdin string
		want  string // error; "" for success
	}{
		{[]string{"--args", "@" + file}, "", ""},
		{[]string{"--args", "-"}, string(big), ""},
		{[]string{"--args", "@-"}, string(big), ""},
		{[]string{"--args", "@" + bad}, "", "enqueue: --args: " + bad + " is not valid JSON: invalid character '}'"},
		{[]string{"--args", "@" + filepath.Join(dir, "none.json")}, "", filepath.Join(dir, "none.json") + ": no such file"},
		{[]string{"--args", "-"}, "{", "standard input is not valid JSON"},
	} {
		args := append([]string{"enqueue", "--db", dsn, "--kind", "k", "--allow-unknown-kinds"}, c.args...)
		out, _, err := cli(t, c.stdin, args...)
		if c.want != "" {
			oneLineErr(t, c.args, err, c.want)
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		var j struct{ Args json.RawMessage }
		if err := json.Unmarshal([]byte(mustCLI(t, "job", strings.TrimSpace(out), "--json", "--db", dsn)), &j); err != nil || !bytes.Equal(j.Args, big) {
			t.Errorf("%q: args of %d bytes stored as %d bytes (%v)", c.args, len(big), len(j.Args), err)
		}
	}
	var list []any
	if err := json.Unmarshal([]byte(mustCLI(t, "jobs", "--json", "--db", dsn)), &list); err != nil || len(list) != 3 {
		t.Errorf("%d jobs (%v), want 3: a failed enqueue enqueued", len(list), err)
	}
}

// A multi-line connection error (pgx tries TLS, then plain) is printed on
// one line, each attempt once.
func TestUnreachableServerOneLine(t *testing.T) {
	for _, dsn := range []string{
		"postgres://postgres@127.0.0.1:1/test?connect_timeout=3",
		"mysql://root@127.0.0.1:1/test",
	} {
		start := time.Now()
		_, errOut, err := cli(t, "", "jobs", "--db", dsn)
		oneLineErr(t, []string{dsn}, err, "127.0.0.1:1")
		if err != nil && strings.Count(err.Error(), "connection refused") > 1 {
			t.Errorf("%s: repeated lines kept: %v", dsn, err)
		}
		// main prints "conveyor: " before the error: the library's own
		// prefix would double it ("conveyor: conveyor/postgres: ...").
		if err != nil && (strings.Contains(err.Error(), "conveyor/") || strings.HasPrefix(err.Error(), "conveyor:")) {
			t.Errorf("%s: the error repeats conveyor's prefix: %v", dsn, err)
		}
		if errOut != "" || time.Since(start) > 20*time.Second {
			t.Errorf("%s: stderr %q after %v", dsn, errOut, time.Since(start))
		}
	}
}

func TestOneLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"open: failed to connect:\n\t1.2.3.4: refused\n\t1.2.3.4: refused\n", "open: failed to connect: 1.2.3.4: refused"},
		{"a\nb\n\na", "a; b"},
	} {
		err := oneLine(errors.New(c.in))
		if err.Error() != c.want {
			t.Errorf("oneLine(%q) = %q, want %q", c.in, err, c.want)
		}
	}
	wrapped := oneLine(errors.Join(torture.ErrViolations, errors.New("x")))
	if !errors.Is(wrapped, torture.ErrViolations) || strings.Contains(wrapped.Error(), "\n") {
		t.Errorf("oneLine lost the error chain or kept a newline: %v", wrapped)
	}
}

// The README's bench example writes nothing to the working directory and
// prints one table (JSON lines with --json).
func TestBenchDefaultIsTemporary(t *testing.T) {
	inEmptyDir(t)
	out := mustCLI(t, "bench", "--jobs", "100", "--workers", "2", "--json")
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r struct{ Backend string }
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Backend != "sqlite" {
			t.Errorf("line %q: %v", sc.Text(), err)
		}
	}
}

// TestPauseResume: pause and resume a queue from the command on every
// backend; stats shows the pause in both shapes; a missing or stray
// argument is one clear line.
func TestPauseResume(t *testing.T) {
	inEmptyDir(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			mustCLI(t, append([]string{"enqueue", "--kind", "k", "--queue", "mail", "--allow-unknown-kinds"}, db...)...)
			out := mustCLI(t, append([]string{"pause", "mail"}, db...)...)
			if !strings.Contains(out, "queue mail is paused") {
				t.Errorf("pause printed %q", out)
			}
			var s struct {
				Queues []struct {
					Queue    string     `json:"queue"`
					PausedAt *time.Time `json:"paused_at"`
				} `json:"queues"`
			}
			if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"stats", "--json"}, db...)...)), &s); err != nil {
				t.Fatal(err)
			}
			if len(s.Queues) != 1 || s.Queues[0].Queue != "mail" || s.Queues[0].PausedAt == nil {
				t.Errorf("stats --json while paused: %+v", s.Queues)
			}
			if out := mustCLI(t, append([]string{"stats"}, db...)...); !strings.Contains(out, "PAUSED SINCE") || !regexp.MustCompile(`mail .* \d{4}-\d\d-\d\dT`).MatchString(out) {
				t.Errorf("stats while paused:\n%s", out)
			}
			if out := mustCLI(t, append([]string{"pause", "mail"}, db...)...); !strings.Contains(out, "queue mail was already paused, since ") {
				t.Errorf("pause of a paused queue printed %q", out)
			}
			_, _, err := cli(t, "", append([]string{"resume", "mial"}, db...)...)
			oneLineErr(t, []string{"resume", "mial"}, err, `resume: queue "mial" is unknown and not paused: nothing to resume (paused queues: mail)`)
			mustCLI(t, append([]string{"resume", "mail"}, db...)...)
			if out := mustCLI(t, append([]string{"resume", "mail"}, db...)...); out != "queue mail is not paused: nothing changed\n" {
				t.Errorf("resume of a queue not paused printed %q", out)
			}
			// A queue may be paused before its first job, on request.
			if out := mustCLI(t, append([]string{"pause", "--allow-unknown-queue", "later"}, db...)...); !strings.Contains(out, "queue later is paused, before its first use") {
				t.Errorf("pause --allow-unknown-queue printed %q", out)
			}
			mustCLI(t, append([]string{"resume", "later"}, db...)...)
			s.Queues = nil
			if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"stats", "--json"}, db...)...)), &s); err != nil {
				t.Fatal(err)
			}
			if len(s.Queues) != 1 || s.Queues[0].PausedAt != nil {
				t.Errorf("stats --json after resume: %+v", s.Queues)
			}
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"pause"}, "queue name required"},
				{[]string{"resume", "a", "b"}, `unexpected argument "b"`},
				{[]string{"pause", "bad queue"}, `pause queue "bad queue": invalid queue name`},
				{[]string{"pause", "mial"}, `pause: queue "mial" is unknown: it has no job, no live process works it and it is not paused`},
				{[]string{"resume", "mial"}, `resume: queue "mial" is unknown and not paused: nothing to resume (no queue is paused)`},
			} {
				args := append(tc.args, db...)
				_, _, err := cli(t, "", args...)
				oneLineErr(t, args, err, tc.want)
			}
		})
	}
}

// ownSchedule is a Schedule of the test's own: AddPeriodic refuses
// Every under a second but does not check an application's schedule, so
// the test runs 100ms slots through it to be quick.
type ownSchedule struct{ conveyor.Schedule }

// TestSchedules: the schedules a client recorded are listed by the
// command, in both shapes, on every backend.
func TestSchedules(t *testing.T) {
	inEmptyDir(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			if out := mustCLI(t, append([]string{"schedules"}, db...)...); !strings.Contains(out, "no schedules recorded") {
				t.Errorf("schedules on an empty database:\n%s", out)
			}
			c, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: p, AllowUnregisteredKinds: true, Queues: map[string]conveyor.QueueConfig{"none": {}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.AddPeriodic(conveyor.PeriodicJob{Name: "nightly", Schedule: ownSchedule{conveyor.Every(100 * time.Millisecond)}, Args: conveyor.RawArgs{KindName: "report"}}); err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				ss, err := c.Schedules(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(ss) == 1 && ss[0].LastJobID != 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no slot recorded within 30s: %+v", ss)
				}
				time.Sleep(20 * time.Millisecond)
			}
			c.Stop(ctx)
			c.Close()
			var got []struct {
				Name      string     `json:"name"`
				Spec      string     `json:"spec"`
				LastSlot  *time.Time `json:"last_slot"`
				LastJobID *int64     `json:"last_job_id"`
				NextSlot  *time.Time `json:"next_slot"`
			}
			if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"schedules", "--json"}, db...)...)), &got); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Name != "nightly" || got[0].Spec != "every 100ms" || got[0].LastSlot == nil || got[0].LastJobID == nil ||
				got[0].NextSlot == nil || !got[0].NextSlot.After(*got[0].LastSlot) {
				t.Fatalf("schedules --json: %+v", got)
			}
			if out := mustCLI(t, append([]string{"schedules"}, db...)...); !strings.Contains(out, "nightly") || !strings.Contains(out, "every 100ms") {
				t.Errorf("schedules:\n%s", out)
			}
		})
	}
}

// A server that accepts connections and never answers fails the command
// after --connect-timeout (and the default applies without it: the
// command's own context here is far longer), with one line naming the
// server and the timeout.
func TestConnectTimeoutCommand(t *testing.T) {
	inEmptyDir(t)
	addr := testdb.SilentServer(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"jobs", "--db", "postgres://postgres@" + addr + "/test", "--connect-timeout", "500ms"}, addr + " did not answer within 500ms (connect timeout)"},
		{[]string{"--connect-timeout", "500ms", "stats", "--db", "mysql://root@" + addr + "/test"}, addr + " did not answer within 500ms (connect timeout)"},
		{[]string{"migrate", "--db", "mysql://root@" + addr + "/test", "--connect-timeout", "500ms"}, addr + " did not answer within 500ms (connect timeout)"},
		{[]string{"enqueue", "--kind", "k", "--db", "postgres://postgres@" + addr + "/test"}, addr + " did not answer within 10s (connect timeout)"},
	} {
		_, _, err := cli(t, "", c.args...)
		oneLineErr(t, c.args, err, c.want)
	}
}

// A DSN's password is never printed, whatever the typo: one that url.Parse
// refuses (it quotes the URL), one that lost its "://" and is taken for a
// SQLite path, one that the server refuses.
func TestDSNPasswordNotPrinted(t *testing.T) {
	inEmptyDir(t)
	for _, d := range []string{
		"mysql://root:Sekr3tPw@127.0.0.1:33o6/test",
		"mysql://root:Sek%r3tPw@127.0.0.1:3306/test",
		"mysql//root:Sekr3tPw@127.0.0.1:3306/test",
		"mysql:/root:Sekr3tPw@127.0.0.1:3306/test",
		"mysql://root:Sekr3tPw@127.0.0.1:1/test",
		"postgres://postgres:Sekr3tPw@127.0.0.1:1/test",
		"postgres//postgres:Sekr3tPw@127.0.0.1:1/test",
	} {
		for _, args := range [][]string{{"jobs", "--db", d}, {"migrate", "--db", d}} {
			out, errOut, err := cli(t, "", args...)
			if err == nil {
				t.Errorf("%q: no error", args)
				continue
			}
			if all := out + errOut + err.Error(); strings.Contains(all, "Sekr3tPw") || strings.Contains(all, "Sek%r3tPw") {
				t.Errorf("%q printed the password: %v", args, err)
			}
		}
	}
}

// An error names its operation and job once, without the library's
// prefixes ("cancel job 1", not "cancel: job 1: conveyor/sqlite: cancel
// job 1").
func TestErrorsSayItOnce(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			id := strings.TrimSpace(mustCLI(t, append([]string{"enqueue", "--kind", "k", "--allow-unknown-kinds"}, db...)...))
			mustCLI(t, append([]string{"cancel", id}, db...)...)
			for _, c := range []struct {
				args []string
				want string
			}{
				{[]string{"cancel", id}, "cancel job " + id + ": "},
				{[]string{"retry", "999999"}, "retry job 999999: job not found"},
				{[]string{"discard", "999999"}, "discard job 999999: job not found"},
				{[]string{"job", "999999"}, "job 999999: job not found"},
			} {
				args := append(c.args, db...)
				_, _, err := cli(t, "", args...)
				oneLineErr(t, args, err, c.want)
				if err == nil {
					continue
				}
				m := err.Error()
				op := regexp.MustCompile(`\b` + c.args[0] + `\b`)
				if strings.Contains(m, "conveyor") || strings.Count(m, "job "+c.args[1]) != 1 || c.args[0] != "job" && len(op.FindAllString(m, -1)) != 1 {
					t.Errorf("%q: %q repeats itself or conveyor's prefix", args, m)
				}
			}
		})
	}
}

// A queue that a live process works exists for pause even with no job.
func TestPauseQueueOfLiveProcess(t *testing.T) {
	ctx := context.Background()
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	c, err := connect.Open(ctx, dsn, &conveyor.Config{Queues: map[string]conveyor.QueueConfig{"busy": {}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) { // registration is the first step of Start's loops
		ps, err := c.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].Alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not register within 30s: %+v", ps)
		}
	}
	if out := mustCLI(t, "pause", "busy", "--db", dsn); !strings.Contains(out, "queue busy is paused in every process") {
		t.Errorf("pause of a queue a live process works printed %q", out)
	}
}

// enqueue refuses a kind no job of which has completed on the database
// (no worker is known to handle it: a typo, most likely), as a client
// with workers refuses a kind it has none for; --allow-unknown-kinds
// enqueues it, and a kind a worker completed is accepted.
func TestEnqueueUnknownKind(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p}
			mustCLI(t, append([]string{"migrate"}, db...)...)
			args := append([]string{"enqueue", "--kind", "sendmial"}, db...)
			_, _, err := cli(t, "", args...)
			oneLineErr(t, args, err, `unknown job kind "sendmial": no job of this kind has completed on this database, so no worker is known to handle it (a typo? enqueue it anyway with --allow-unknown-kinds)`)
			if !errors.Is(err, conveyor.ErrUnknownKind) {
				t.Errorf("%v is not ErrUnknownKind", err)
			}
			var list []any
			if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"jobs", "--json"}, db...)...)), &list); err != nil || len(list) != 0 {
				t.Fatalf("a refused enqueue enqueued: %v %v", list, err)
			}
			// A worker completes one job of kind "sendmail": the kind is
			// known from then on.
			id := strings.TrimSpace(mustCLI(t, append([]string{"enqueue", "--kind", "sendmail", "--allow-unknown-kinds"}, db...)...))
			c, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: p})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conveyor.AddWorker(c, conveyor.WorkFunc(func(context.Context, *conveyor.Job[sendmailArgs]) error { return nil }))
			if _, _, err := cli(t, "", args...); err == nil {
				t.Error("sendmial enqueued while sendmail is pending")
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); jobState(t, append([]string{id}, db...)...) != conveyor.JobStateCompleted; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("job not completed within a minute")
				}
			}
			c.Stop(ctx)
			if out := mustCLI(t, append([]string{"enqueue", "--kind", "sendmail"}, db...)...); strings.TrimSpace(out) == "" {
				t.Error("enqueue of a known kind printed no id")
			}
		})
	}
}

// sendmailArgs is the kind TestEnqueueUnknownKind's worker completes.
type sendmailArgs struct{}

func (sendmailArgs) Kind() string { return "sendmail" }

// The first job of a fresh install is job 1 on every backend (PostgreSQL's
// conversion to the segment tables, which migrate runs on a fresh prefix
// too, once consumed an id), and a prefix converted with jobs in it goes
// on after its last id.
func TestFirstJobID(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			p := freshPrefix(t, dsn)
			db := []string{"--db", dsn, "--prefix", p, "--allow-unknown-kinds"}
			mustCLI(t, "migrate", "--db", dsn, "--prefix", p)
			for _, want := range []string{"1", "2"} {
				if id := strings.TrimSpace(mustCLI(t, append([]string{"enqueue", "--kind", "k"}, db...)...)); id != want {
					t.Errorf("job id %s, want %s", id, want)
				}
			}
		})
	}
	// A prefix an earlier version left at migration 9, its jobs in one
	// table: a command is told to migrate first, migrate converts it
	// (migrations 10 and 11, then the jobs into the segment tables), its
	// jobs are listed in their states, and new ones go on after its last
	// id.
	t.Run("postgres-earlier-version", func(t *testing.T) {
		ctx := context.Background()
		dsn := testdb.Postgres(t)
		p := freshPrefix(t, dsn)
		db := []string{"--db", dsn, "--prefix", p, "--allow-unknown-kinds"}
		c, err := connect.Open(ctx, dsn, &conveyor.Config{TablePrefix: p})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lab.MigrateTo(ctx, c, 9); err != nil {
			t.Fatal(err)
		}
		c.Close()
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "INSERT INTO "+p+"jobs (queue, kind, state, finalized_at) VALUES "+
			"('default', 'k', 'available', NULL), ('default', 'k', 'completed', now())"); err != nil {
			t.Fatal(err)
		}
		_, _, err = cli(t, "", append([]string{"enqueue", "--kind", "k"}, db...)...)
		if err == nil || !strings.Contains(err.Error(), "conveyor migrate") {
			t.Fatalf("enqueue on the prefix of an earlier version: %v; want an error asking for conveyor migrate", err)
		}
		if out := mustCLI(t, "migrate", "--db", dsn, "--prefix", p); !strings.Contains(out, "applied migrations [10 11 12 13 14 15 16 17 18 19 20]") {
			t.Fatalf("migrate: %q", out)
		}
		var list []map[string]any
		if err := json.Unmarshal([]byte(mustCLI(t, "jobs", "--json", "--db", dsn, "--prefix", p)), &list); err != nil || len(list) != 2 ||
			list[0]["state"] != "available" || list[1]["state"] != "completed" {
			t.Fatalf("jobs after the conversion: %v, %v", list, err)
		}
		if id := strings.TrimSpace(mustCLI(t, append([]string{"enqueue", "--kind", "k"}, db...)...)); id != "3" {
			t.Errorf("job id %s after the conversion, want 3", id)
		}
	})
}

// TestBatchCommand: `conveyor batch ID` prints a batch's jobs and
// callback, as text and as the API's JSON; an unknown batch is an error.
func TestBatchCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := filepath.Join(t.TempDir(), "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	c, err := connect.Open(ctx, dsn, &conveyor.Config{AllowUnregisteredKinds: true})
	if err != nil {
		t.Fatal(err)
	}
	bid, ids, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: conveyor.RawArgs{KindName: "part"}}},
		conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: "parts_done"}})
	if err != nil {
		t.Fatal(err)
	}
	wf, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{
		{Name: "a", Args: conveyor.RawArgs{KindName: "step"}},
		{Name: "b", Args: conveyor.RawArgs{KindName: "step"}, DependsOn: []string{"a"}},
		{Name: "c", Args: conveyor.RawArgs{KindName: "step"}, DependsOn: []string{"b"}},
	}, nil)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	// c's batch waits for b's, whose job is not enqueued yet.
	cb, bb := strconv.FormatInt(wf.BatchIDs["c"], 10), strconv.FormatInt(wf.BatchIDs["b"], 10)
	if out := mustCLI(t, "batch", cb, "--db", dsn); !strings.Contains(out, "\njobs:         0\nwaiting for:  batch "+bb+" (jobs not enqueued yet)\n") {
		t.Fatalf("batch of a workflow job waiting for another:\n%s", out)
	}
	var w map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "batch", cb, "--json", "--db", dsn)), &w); err != nil ||
		w["finished"] != false || !reflect.DeepEqual(w["waiting_for"], []any{float64(wf.BatchIDs["b"])}) {
		t.Fatalf("batch --json of a workflow job waiting for another: %v %v", w, err)
	}
	out := mustCLI(t, "batch", strconv.FormatInt(bid, 10), "--db", dsn)
	if !strings.Contains(out, "parts_done (waiting for every job to finish)") || !strings.Contains(out, "  "+strconv.FormatInt(ids[0], 10)+" available") {
		t.Fatalf("batch:\n%s", out)
	}
	var b map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "batch", strconv.FormatInt(bid, 10), "--json", "--db", dsn)), &b); err != nil ||
		b["finished"] != false || b["callback_id"] != nil || b["callback_kind"] != "parts_done" {
		t.Fatalf("batch --json: %v %v", b, err)
	}
	if _, _, err := cli(t, "", "batch", strconv.FormatInt(bid+100, 10), "--db", dsn); err == nil || !strings.Contains(err.Error(), "batch not found") {
		t.Fatalf("unknown batch: %v", err)
	}
	// A batch's job names its batch, in text and JSON.
	if out := mustCLI(t, "job", strconv.FormatInt(ids[0], 10), "--db", dsn); !strings.Contains(out, "\nbatch:        "+strconv.FormatInt(bid, 10)+"\n") {
		t.Fatalf("job of batch %d:\n%s", bid, out)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, "job", strconv.FormatInt(ids[0], 10), "--json", "--db", dsn)), &j); err != nil || j["batch_id"] != float64(bid) {
		t.Fatalf("job --json: batch_id %v, want %d (%v)", j["batch_id"], bid, err)
	}
}
