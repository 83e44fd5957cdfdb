package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/conveyorq/conveyor/cmd/conveyor/internal/bench"
)

// bench with no --db runs on a temporary SQLite database, prints one table,
// the contention and the settings once, and writes the report.
func TestBenchTableAndReport(t *testing.T) {
	t.Setenv("CONVEYOR_DB", "")
	report := filepath.Join(t.TempDir(), "r.html")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "--workload", "claims", "--jobs", "100", "--workers", "2", "--report", report}, nil, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errOut.String())
	}
	s := out.String()
	for _, want := range []string{"temporary SQLite", "strategy", "pessimistic", "optimistic", "random", "conveyor", "rounds/job",
		"contention inside the database", "busy_retries=", "settings:", "synchronous", "cores", "report: " + report} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, "settings:") != 1 {
		t.Errorf("settings printed %d times", strings.Count(s, "settings:"))
	}
	html, err := os.ReadFile(report)
	if err != nil || !bytes.Contains(html, []byte("<svg")) {
		t.Fatalf("report: %v, %d bytes", err, len(html))
	}
}

func TestBenchJSON(t *testing.T) {
	t.Setenv("CONVEYOR_DB", "")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "--workload", "sweep", "--counts", "1,3", "--jobs", "20", "--interval", "1ms", "--json"}, nil, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	sc := bufio.NewScanner(&out)
	n := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", n, err, sc.Text())
		}
		for _, f := range []string{"workload", "backend", "workers", "jobs", "seconds", "jobs_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "lost", "duplicates", "reorder_max", "reorder_p99", "waits"} {
			if _, ok := m[f]; !ok {
				t.Errorf("line %d lacks %q", n, f)
			}
		}
		n++
	}
	if n != 2 {
		t.Fatalf("%d JSON lines, want one per run (2)", n)
	}
}

func TestBenchBadFlags(t *testing.T) {
	t.Setenv("CONVEYOR_DB", "")
	for _, args := range [][]string{
		{"bench", "--counts", "1,x"},
		{"bench", "--workload", "nope"},
		{"bench", "--workload", "claims", "--strategies", "nope"},
		{"bench", "extra"},
		{"bench", "--workload", "steady", "--window", "10"},
		{"bench", "--workload", "claims", "--window", "1s"},
		{"bench", "--workload", "steady", "--rate", "-1"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, nil, &out, &errOut); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// The steady workload with a held snapshot, on every reachable backend:
// windows reported with the backend's gauges, no job lost or run twice,
// and the held transaction released at the end of its time, not at the
// end of the run (on PostgreSQL: no session of it left). How many of the
// offered jobs the producers enqueued, and how many completed within the
// windows, is the machine's speed, the bench's figures to read, not a
// test's to assert: a race-instrumented run on a loaded two-core machine
// enqueued 43 of 800.
func TestBenchSteadyHoldXmin(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			report := filepath.Join(t.TempDir(), "steady.html")
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"bench", "--db", dsn, "--workload", "steady", "--rate", "200", "--duration", "3s",
				"--window", "1s", "--recovery", "1s", "--hold-xmin", "--json", "--report", report}, nil, &out, &errOut)
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, out.String(), errOut.String())
			}
			var r bench.Result
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("not one JSON object: %v\n%s", err, out.String())
			}
			f := r.Steady
			if r.Workload != "steady" || r.Backend != b.name || f == nil {
				t.Fatalf("result: %+v", r)
			}
			if r.Lost != 0 || r.Duplicates != 0 || r.Jobs != f.Enqueued || f.Offered != 800 || f.Enqueued+f.Shortfall != 800 || f.Enqueued == 0 {
				t.Errorf("jobs %d lost %d duplicates %d; offered %d enqueued %d short %d", r.Jobs, r.Lost, r.Duplicates, f.Offered, f.Enqueued, f.Shortfall)
			}
			if len(f.Windows) != 4 {
				t.Fatalf("%d windows, want 4", len(f.Windows))
			}
			h := f.Hold
			// The jobs table the hold read first: on PostgreSQL the
			// segments' registry and its tables.
			jobsTable := "jobs"
			if b.name == "postgres" {
				jobsTable = "segments"
			}
			// Released at 3s (--duration), before the run ended (the
			// load and its drain), after which the run releases it
			// anyway.
			if h == nil || !h.Released || h.ReleaseError != "" || !slices.Contains(h.Tables, jobsTable) || h.EndS < 2.9 || h.EndS >= f.LoadS+f.DrainS {
				t.Fatalf("hold: %+v (load %.2fs, drain %.2fs)", h, f.LoadS, f.DrainS)
			}
			var done int64
			for i, w := range f.Windows {
				done += w.Completed
				// Held through the first three windows; the fourth counts
				// as held when the rollback came late into it (a loaded
				// machine), by the workload's own rule.
				wantHeld := i < 3 || h.EndS-w.StartS > 0.05*(w.EndS-w.StartS)
				if w.Offered != 200 || w.Held != wantHeld || w.Gauges.Error != "" || w.Gauges.MachineCPUShare == nil || w.Gauges.ClientCPUShare == nil {
					t.Errorf("window %d: %+v", i, w)
				}
				g := w.Gauges
				var missing bool
				switch b.name {
				case "postgres":
					missing = g.DeadTuples == nil || g.TotalBytes == nil || g.IndexBytes == nil || g.XminAge == nil || g.Tables["segments"].Dead == nil || g.DBCPUShare == nil
				case "mysql":
					missing = g.HistoryLength == nil || g.TotalBytes == nil || g.DBCPUShare == nil
				case "sqlite":
					missing = g.WALBytes == nil || g.WALFrames == nil || g.Pages == nil || g.TotalBytes == nil || g.DBCPUShare != nil
				}
				if missing {
					t.Errorf("window %d: gauges of %s missing: %+v", i, b.name, g)
				}
			}
			if done > f.Enqueued {
				t.Errorf("windows' completions %d, enqueued %d", done, f.Enqueued)
			}
			// Jobs enqueued in windows 1 and 2 were written after the
			// WAL was read at the end of window 0, while the snapshot
			// was held: no checkpoint could pass it.
			if b.name == "sqlite" && f.Windows[1].Enqueued+f.Windows[2].Enqueued > 0 && *f.Windows[2].Gauges.WALFrames <= *f.Windows[0].Gauges.WALFrames {
				t.Errorf("WAL did not grow while the snapshot was held: %d then %d frames", *f.Windows[0].Gauges.WALFrames, *f.Windows[2].Gauges.WALFrames)
			}
			if b.name == "postgres" {
				db, err := sql.Open("pgx", dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				var n int
				if err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", h.Session).Scan(&n); err != nil || n != 0 {
					t.Errorf("%d held sessions left (%v)", n, err)
				}
			}
			html, err := os.ReadFile(report)
			if err != nil || bytes.Count(html, []byte("<svg")) < 5 || !bytes.Contains(html, []byte("snapshot held")) {
				t.Errorf("report: %v, %d bytes", err, len(html))
			}
		})
	}
}

// The HTTP workloads, on a temporary SQLite database at small sizes:
// every dashboard page answers, and the HTTP runs report beside the
// in-process ones with nothing lost.
func TestBenchHTTPWorkloads(t *testing.T) {
	t.Setenv("CONVEYOR_DB", "")
	for _, c := range []struct {
		workload string
		want     []string
	}{
		{"dashboard", []string{"queues page", "jobs state=available", "jobs queue=rare", "jobs q=user-777", "jobs page 2+ state=running", "job page", "api job (poll)", "p50 ms"}},
		{"http-enqueue", []string{"in-process", "http", "vs in-process"}},
		{"http-drain", []string{"in-process", "http", "vs in-process"}},
	} {
		t.Run(c.workload, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"bench", "--workload", c.workload, "--jobs", "400", "--workers", "8", "--producers", "2", "--timeout", "1m"}, nil, &out, &errOut)
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, out.String(), errOut.String())
			}
			for _, want := range c.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "--workload", "http-drain", "--jobs", "300", "--json"}, nil, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var phases []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r struct {
			Workload, Phase string
			Jobs, Lost      int64
			JobsPerS        float64 `json:"jobs_per_s"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("not JSON: %v: %s", err, sc.Text())
		}
		if r.Workload != "http-drain" || r.Jobs != 300 || r.Lost != 0 || r.JobsPerS <= 0 {
			t.Errorf("run %+v", r)
		}
		phases = append(phases, r.Phase)
	}
	if strings.Join(phases, ",") != "in-process,http" {
		t.Errorf("phases %v, want in-process then http", phases)
	}
}

// TestSharesText: the fair-weights phase's starts by key, heaviest
// first.
func TestSharesText(t *testing.T) {
	got := sharesText(map[string]int64{"light": 294, "heavy": 1000}, map[string]int{"heavy": 3, "light": 1})
	if want := "heavy 1000 (weight 3) : light 294 (weight 1)"; got != want {
		t.Errorf("sharesText = %q, want %q", got, want)
	}
}
