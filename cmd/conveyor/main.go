// Command conveyor manages and measures a conveyor job queue: migrate the
// schema, enqueue and inspect jobs, retry, cancel or discard them, print
// queue statistics, and run the demo and the bench.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
)

const usage = `conveyor: a durable job queue in your database

usage: conveyor [--db DSN] [--prefix P] COMMAND [flags]

--db is a SQLite path (default ./conveyor.db, or $CONVEYOR_DB),
postgres://... or mysql://user:pass@host:port/db.

commands:
  migrate                 apply the schema migrations
  enqueue --kind K --args JSON [--queue Q] [--priority N] [--delay D] [--max-attempts N]
  jobs [--state S] [--queue Q] [--kind K] [--limit N] [--after ID] [--json]
  job ID [--json]         inspect one job, with every attempt's error
  retry ID | cancel ID | discard ID
  stats [--json]          per queue: counts by state, age of the oldest available job
  demo                    enqueue and work no-op jobs on a temporary SQLite database
  bench [flags]           measure throughput, latency, ordering and duplicates
                          (conveyor bench --help)
  torture [flags]         inject faults into real worker processes, check nothing is lost (--help)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conveyor:", strings.TrimPrefix(err.Error(), "conveyor: "))
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := flag.NewFlagSet("conveyor", flag.ContinueOnError)
	g.SetOutput(stderr)
	g.Usage = func() { fmt.Fprint(stderr, usage) }
	def := os.Getenv("CONVEYOR_DB")
	if def == "" {
		def = "./conveyor.db"
	}
	dsn := g.String("db", def, "database DSN")
	prefix := g.String("prefix", "", "table prefix (default conveyor_)")
	if err := g.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if g.NArg() == 0 {
		g.Usage()
		return errors.New("no command given")
	}
	cmd, rest := g.Arg(0), g.Args()[1:]
	cfg := &conveyor.Config{TablePrefix: *prefix}
	switch cmd {
	case "demo":
		return demo(ctx, rest, stdout, stderr)
	case "bench":
		// With no --db and no $CONVEYOR_DB the bench runs on a temporary
		// SQLite database, never on the user's ./conveyor.db.
		benchDSN := ""
		g.Visit(func(f *flag.Flag) {
			if f.Name == "db" {
				benchDSN = *dsn
			}
		})
		if benchDSN == "" {
			benchDSN = os.Getenv("CONVEYOR_DB")
		}
		return benchCmd(ctx, rest, benchDSN, stdout, stderr)
	case "torture":
		return tortureCmd(ctx, rest, g, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	openClient := func() (*conveyor.Client, error) { return conveyor.Open(ctx, *dsn, cfg) }
	switch cmd {
	case "migrate":
		return migrate(ctx, openClient, stdout)
	case "enqueue":
		return enqueue(ctx, openClient, rest, stdout, stderr)
	case "jobs":
		return jobs(ctx, openClient, rest, stdout, stderr)
	case "job":
		return showJob(ctx, openClient, rest, stdout, stderr)
	case "retry", "cancel", "discard":
		return adminCmd(ctx, openClient, cmd, rest, stdout)
	case "stats":
		return stats(ctx, openClient, rest, stdout, stderr)
	default:
		g.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
}

func migrate(ctx context.Context, open func() (*conveyor.Client, error), stdout io.Writer) error {
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	applied, err := c.Migrate(ctx)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "schema is up to date")
		return nil
	}
	fmt.Fprintf(stdout, "applied migrations %v\n", applied)
	return nil
}

func enqueue(ctx context.Context, open func() (*conveyor.Client, error), args []string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	f.SetOutput(stderr)
	kind := f.String("kind", "", "job kind (required)")
	js := f.String("args", "{}", "job arguments as JSON")
	queue := f.String("queue", "", "queue (default \"default\")")
	prio := f.Int("priority", 0, "priority: smaller runs first")
	delay := f.Duration("delay", 0, "run after this delay (e.g. 30s)")
	attempts := f.Int("max-attempts", 0, "maximum attempts (default 25)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *kind == "" {
		return errors.New("enqueue: --kind is required")
	}
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	id, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: *kind, JSON: json.RawMessage(*js)},
		&conveyor.EnqueueOpts{Queue: *queue, Priority: *prio, Delay: *delay, MaxAttempts: *attempts})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id)
	return nil
}

func jobs(ctx context.Context, open func() (*conveyor.Client, error), args []string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("jobs", flag.ContinueOnError)
	f.SetOutput(stderr)
	state := f.String("state", "", "comma-separated states")
	queue := f.String("queue", "", "queue")
	kind := f.String("kind", "", "kind")
	limit := f.Int("limit", 50, "maximum jobs listed")
	after := f.Int64("after", 0, "list jobs with ids after this one")
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.Parse(args); err != nil {
		return err
	}
	var states []string
	if *state != "" {
		states = strings.Split(*state, ",")
	}
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	list, err := c.Jobs(ctx, conveyor.JobFilter{States: states, Queue: *queue, Kind: *kind, Limit: *limit, AfterID: *after})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(list)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tQUEUE\tKIND\tSTATE\tATTEMPT\tPRIORITY\tSCHEDULED\tLAST ERROR")
	for _, j := range list {
		last := ""
		if n := len(j.Errors); n > 0 {
			last = firstLine(j.Errors[n-1].Error, 60)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", j.ID, j.Queue, j.Kind, j.State, j.Attempt, j.MaxAttempts, j.Priority, j.ScheduledAt.Local().Format(time.DateTime), last)
	}
	return w.Flush()
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

func parseID(args []string, what string) (int64, []string, error) {
	if len(args) == 0 {
		return 0, nil, fmt.Errorf("%s: job id required", what)
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, nil, fmt.Errorf("%s: %q is not a job id", what, args[0])
	}
	return id, args[1:], nil
}

func showJob(ctx context.Context, open func() (*conveyor.Client, error), args []string, stdout, stderr io.Writer) error {
	id, rest, err := parseID(args, "job")
	if err != nil {
		return err
	}
	f := flag.NewFlagSet("job", flag.ContinueOnError)
	f.SetOutput(stderr)
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.Parse(rest); err != nil {
		return err
	}
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	j, err := c.Job(ctx, id)
	if err != nil {
		return fmt.Errorf("job %d: %w", id, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(j)
	}
	t := func(x time.Time) string {
		if x.IsZero() {
			return "-"
		}
		return x.Local().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(stdout, "id:           %d\nqueue:        %s\nkind:         %s\nstate:        %s\nattempt:      %d of %d\npriority:     %d\nargs:         %s\ncreated:      %s\nscheduled:    %s\nattempted:    %s by %s\nlease until:  %s\nfinalized:    %s\n",
		j.ID, j.Queue, j.Kind, j.State, j.Attempt, j.MaxAttempts, j.Priority, j.Args, t(j.CreatedAt), t(j.ScheduledAt), t(j.AttemptedAt), j.AttemptedBy, t(j.LeaseExpiresAt), t(j.FinalizedAt))
	for _, e := range j.Errors {
		fmt.Fprintf(stdout, "error (attempt %d at %s): %s\n", e.Attempt, t(e.At), e.Error)
		if e.Trace != "" {
			fmt.Fprintf(stdout, "  %s\n", strings.ReplaceAll(strings.TrimSpace(e.Trace), "\n", "\n  "))
		}
	}
	return nil
}

func adminCmd(ctx context.Context, open func() (*conveyor.Client, error), cmd string, args []string, stdout io.Writer) error {
	id, _, err := parseID(args, cmd)
	if err != nil {
		return err
	}
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	var j *conveyor.JobInfo
	switch cmd {
	case "retry":
		j, err = c.Retry(ctx, id)
	case "cancel":
		j, err = c.Cancel(ctx, id)
	case "discard":
		j, err = c.Discard(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	fmt.Fprintf(stdout, "job %d is now %s\n", j.ID, j.State)
	return nil
}

func stats(ctx context.Context, open func() (*conveyor.Client, error), args []string, stdout, stderr io.Writer) error {
	f := flag.NewFlagSet("stats", flag.ContinueOnError)
	f.SetOutput(stderr)
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.Parse(args); err != nil {
		return err
	}
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.Stats(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		type q struct {
			Queue           string           `json:"queue"`
			Counts          map[string]int64 `json:"counts"`
			OldestAvailable float64          `json:"oldest_available_s"`
		}
		out := struct {
			Backend  string           `json:"backend"`
			Queues   []q              `json:"queues"`
			Counters map[string]int64 `json:"counters"`
		}{Backend: c.Backend(), Queues: []q{}, Counters: s.Counters}
		for _, x := range s.Queues {
			out.Queues = append(out.Queues, q{x.Queue, x.Counts, x.OldestAvailable.Seconds()})
		}
		return json.NewEncoder(stdout).Encode(out)
	}
	states := []string{"available", "scheduled", "running", "retryable", "completed", "discarded", "cancelled"}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "QUEUE\t%s\tOLDEST AVAILABLE\n", strings.ToUpper(strings.Join(states, "\t")))
	sort.Slice(s.Queues, func(i, j int) bool { return s.Queues[i].Queue < s.Queues[j].Queue })
	for _, x := range s.Queues {
		fmt.Fprintf(w, "%s", x.Queue)
		for _, st := range states {
			fmt.Fprintf(w, "\t%d", x.Counts[st])
		}
		fmt.Fprintf(w, "\t%s\n", x.OldestAvailable.Round(time.Millisecond))
	}
	if len(s.Queues) == 0 {
		fmt.Fprintln(w, "(no jobs)")
	}
	return w.Flush()
}
