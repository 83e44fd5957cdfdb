// Command conveyor manages and measures a conveyor job queue: migrate the
// schema, enqueue and inspect jobs, retry, cancel or discard them, print
// queue statistics, serve the dashboard and the HTTP API, and run the
// demo, the bench and the torture suite.
//
// This file holds the dispatch and the flag handling every command shares;
// each command has a file of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

const usage = `conveyor: a durable job queue in your database

usage: conveyor COMMAND [flags]

--db DSN, --prefix P and --connect-timeout D go before or after the
command. --db is a SQLite path (default $CONVEYOR_DB, else ./conveyor.db),
postgres://... or mysql://user:pass@host:port/db; --prefix is the table
prefix (default conveyor_); --connect-timeout bounds reaching a PostgreSQL
or MySQL server (default 10s, 0 for none). Only migrate creates a SQLite
database.

commands:
  migrate                 create the database (SQLite) and apply the schema migrations
  enqueue --kind K [--args JSON|@FILE|-] [--queue Q] [--priority N] [--delay D] [--max-attempts N] [--key KEY]
        [--allow-unknown-kinds]
                          refuses a kind no job of which has completed on the database, unless --allow-unknown-kinds;
                          --key is the job's limit key (a tenant, an account) for the queue's per-key limits
  jobs [--state S] [--queue Q] [--kind K] [--limit N] [--after ID] [--json]
  job ID [--json]         inspect one job, its key, with every attempt's error
  batch ID [--json]       inspect one batch: its jobs' states and results, its callback
  retry ID | cancel ID | discard ID
  stats [--json]          per queue: counts by state, age of the oldest available job, paused since,
                          limits and their use (keys running, keys at their rate), what holds its jobs (held: key)
  schedules [--json]      the periodic schedules: latest slot and job, next slot
  pause QUEUE [--allow-unknown-queue] | resume QUEUE
                          stop and restart claims of a queue in every process (running jobs finish)
  limits [--json] | limits set QUEUE [--max-running N] [--rate N --per DURATION] [--key-max-running N]
        [--ordered[=false]] [--ordered-move-on[=false]] [--key-rate N --key-rate-period DURATION] [--fair[=false]]
        | limits weights QUEUE [KEY=WEIGHT ...] [--clear] | limits clear QUEUE
                          the limited queues, their use and what holds them; set or clear a queue's limits
                          (jobs running at once, jobs started per window, jobs running at once per key,
                          each key's jobs one at a time in order, jobs started per window per key, keys
                          served in turns) for every process; weights: a key's share of a fair queue's turns
  serve [--listen ADDR] [--token-file F] [--read-only-token-file F] [--basic-auth-file F] [--insecure-loopback-dev]
        [--unknown-kinds warn|refuse|allow] [--metrics=false]
                          the dashboard, the HTTP/JSON API (worker protocol included) and /metrics for
                          Prometheus; refuses to start without credentials
  demo [flags]            enqueue and work no-op jobs on throw-away tables
  bench [flags]           measure throughput, latency, ordering and duplicates
  torture [flags]         inject faults into real worker processes, check nothing is lost

'conveyor COMMAND --help' prints a command's flags.
`

// Help texts of --db: the queue commands default to ./conveyor.db, the
// commands that work on throw-away tables to a temporary SQLite file.
const (
	dbHelp        = "database `DSN`: a SQLite path, postgres://... or mysql://user:pass@host:port/db (default $CONVEYOR_DB, else ./conveyor.db)"
	dbHelpScratch = "database `DSN` to work on throw-away tables in: a SQLite path, postgres://... or mysql://... (default $CONVEYOR_DB, else a temporary SQLite file)"
)

// commands maps each command to the function that runs it on the
// arguments after its name.
var commands = map[string]func(*env, []string) error{
	"migrate":   migrateCmd,
	"enqueue":   enqueueCmd,
	"jobs":      jobsCmd,
	"job":       jobCmd,
	"batch":     batchCmd,
	"retry":     func(e *env, args []string) error { return adminCmd(e, "retry", args) },
	"cancel":    func(e *env, args []string) error { return adminCmd(e, "cancel", args) },
	"discard":   func(e *env, args []string) error { return adminCmd(e, "discard", args) },
	"stats":     statsCmd,
	"pause":     func(e *env, args []string) error { return pauseCmd(e, "pause", args) },
	"resume":    func(e *env, args []string) error { return pauseCmd(e, "resume", args) },
	"limits":    limitsCmd,
	"schedules": schedulesCmd,
	"demo":      demoCmd,
	"bench":     benchCmd,
	"torture":   tortureCmd,
	"serve":     serveCmd,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conveyor:", err)
		os.Exit(1)
	}
}

// errHelp is returned after --help printed a usage: the run succeeded.
var errHelp = errors.New("help printed")

// run runs the command line args (without the program name) and returns
// its error as main prints it after "conveyor: ": on one line, without the
// library's own "conveyor: " prefixes, and without the password of the
// database's DSN.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr}
	err := e.dispatch(args)
	if errors.Is(err, errHelp) {
		return nil
	}
	return connect.RedactError(trimPrefixes(oneLine(err)), e.queueDSN())
}

// libPrefix matches the prefixes the library's errors start with,
// "conveyor: " and "conveyor/BACKEND: ", at the start of a message or of a
// wrapped part.
var libPrefix = regexp.MustCompile(`(^|: )conveyor(/[a-z]+)?: `)

// trimPrefixes drops the library's "conveyor: " prefixes from err's
// message, which main prints after its own "conveyor: ", and shortens
// "conveyor/postgres: " to "postgres: ", so that no line says "conveyor:
// conveyor/postgres: ...". errors.Is and errors.As see err as before.
func trimPrefixes(err error) error {
	if err == nil {
		return nil
	}
	msg := libPrefix.ReplaceAllStringFunc(err.Error(), func(m string) string {
		lead, rest, _ := strings.Cut(m, "conveyor")
		if strings.HasPrefix(rest, "/") {
			return lead + rest[1:]
		}
		return lead
	})
	if msg == err.Error() {
		return err
	}
	return lineError{msg: msg, err: err}
}

// env is what a command runs with: the context, the global flags and the
// standard streams.
type env struct {
	ctx            context.Context
	db, prefix     setOnce
	connectTimeout durationOnce
	stdin          io.Reader
	stdout, stderr io.Writer
}

func (e *env) dispatch(args []string) error {
	g := flag.NewFlagSet("conveyor", flag.ContinueOnError)
	g.SetOutput(io.Discard)
	g.Usage = func() {}
	e.globalFlags(g, dbHelp)
	if err := g.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(e.stdout, usage)
			return errHelp
		}
		return fmt.Errorf("%s (run 'conveyor --help' for usage)", flagError(err))
	}
	if g.NArg() == 0 {
		fmt.Fprint(e.stderr, usage)
		return errors.New("no command given")
	}
	name, rest := g.Arg(0), g.Args()[1:]
	if name == "help" { // "help" or "help COMMAND"
		if len(rest) == 0 {
			fmt.Fprint(e.stdout, usage)
			return nil
		}
		if len(rest) > 1 {
			return fmt.Errorf("help: unexpected argument %q (run 'conveyor --help' for usage)", rest[1])
		}
		name, rest = rest[0], []string{"--help"}
	}
	cmd, ok := commands[name]
	if !ok {
		return fmt.Errorf("unknown command %q (run 'conveyor --help' for usage)", name)
	}
	return cmd(e, rest)
}

func (e *env) globalFlags(f *flag.FlagSet, db string) {
	f.Var(&e.db, "db", db)
	f.Var(&e.prefix, "prefix", "table `prefix` (default conveyor_)")
	f.Var(&e.connectTimeout, "connect-timeout", "give up reaching a PostgreSQL or MySQL server after this `duration` (default 10s; 0 for no bound)")
}

// connectOptions returns the connection options of the queue commands:
// the connect timeout of --connect-timeout.
func (e *env) connectOptions() connect.Options {
	o := connect.Options{}
	if e.connectTimeout.set {
		o.ConnectTimeout = e.connectTimeout.val
		if o.ConnectTimeout == 0 {
			o.ConnectTimeout = -1 // connect's "no bound"
		}
	}
	return o
}

// durationOnce is a duration flag that, as setOnce, may be given before
// and after the command with the same value. Negative durations are
// refused.
type durationOnce struct {
	val time.Duration
	set bool
}

// String returns the value ("" when unset).
func (d *durationOnce) String() string {
	if d == nil || !d.set {
		return ""
	}
	return d.val.String()
}

// Set parses v, refusing a negative duration or a second, different one.
func (d *durationOnce) Set(v string) error {
	x, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return errors.New("not a duration (such as 10s or 1m)")
	case x < 0:
		return errors.New("must not be negative (0 for no bound)")
	case d.set && d.val != x:
		return fmt.Errorf("given twice, as %v and %v", d.val, x)
	}
	d.val, d.set = x, true
	return nil
}

// setOnce is a string flag that may be given both before and after the
// command, but then with the same value.
type setOnce struct {
	val string
	set bool
}

// String returns the value.
func (s *setOnce) String() string {
	if s == nil {
		return ""
	}
	return s.val
}

// Set records v, refusing a second, different value.
func (s *setOnce) Set(v string) error {
	if s.set && s.val != v {
		return fmt.Errorf("given twice, as %q and %q", s.val, v)
	}
	s.val, s.set = v, true
	return nil
}

// cmdFlags are one command's flags (the global ones included) and what
// its --help prints.
type cmdFlags struct {
	*flag.FlagSet
	synopsis string
	about    string // printed between the synopsis and the flags
}

// flags returns a command's flag set, with --db (described by db) and
// --prefix. Parse errors are returned, not printed.
func (e *env) flags(name, synopsis, db string) *cmdFlags {
	f := flag.NewFlagSet(name, flag.ContinueOnError)
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	e.globalFlags(f, db)
	return &cmdFlags{FlagSet: f, synopsis: synopsis}
}

// parse parses args, flags and positional arguments in any order ("--"
// ends the flags), and returns the positional ones. --help prints the
// usage on stdout and returns errHelp.
func (e *env) parse(f *cmdFlags, args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(e.stdout, "usage: conveyor %s\n\n", f.synopsis)
				if f.about != "" {
					fmt.Fprintf(e.stdout, "%s\n\n", f.about)
				}
				fmt.Fprintln(e.stdout, "flags:")
				printFlags(e.stdout, f.FlagSet)
				return nil, errHelp
			}
			return nil, usageError(f.Name(), flagError(err))
		}
		rest := f.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// printFlags prints f's flags as flag.PrintDefaults does, but with the
// double dash the usage, the errors and the README use (--db, not -db).
func printFlags(w io.Writer, f *flag.FlagSet) {
	f.VisitAll(func(fl *flag.Flag) {
		name, usage := flag.UnquoteUsage(fl)
		line := "  --" + fl.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch def := fl.DefValue; {
		case def == "" || def == "0" || def == "false" || def == "0s":
		case fmt.Sprintf("%T", fl.Value) == "*flag.stringValue":
			line += fmt.Sprintf(" (default %q)", def)
		default:
			line += fmt.Sprintf(" (default %v)", def)
		}
		fmt.Fprintln(w, line)
	})
}

// flagNameRE matches a flag's name as package flag writes it in its
// errors: one dash.
var flagNameRE = regexp.MustCompile(`(defined: |argument: |for flag |for )-([A-Za-z][A-Za-z0-9_-]*)`)

// flagError returns a parse error of package flag with the flag's name
// written with two dashes, as everywhere else ("flag provided but not
// defined: --bogus", "invalid value "x" for flag --limit: ...").
func flagError(err error) string {
	return flagNameRE.ReplaceAllString(err.Error(), "${1}--${2}")
}

// usageError is a command's one-line error that points at its --help.
func usageError(cmd, msg string) error {
	return fmt.Errorf("%s: %s (run 'conveyor %s --help' for usage)", cmd, msg, cmd)
}

// noArgs refuses positional arguments.
// parseNoArgs parses the flags of a command that takes no positional
// argument; a scratch command (bench, demo, torture), which works on
// throw-away tables, also refuses --prefix.
func (e *env) parseNoArgs(f *cmdFlags, args []string, scratch bool) error {
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	if err := noArgs(f.Name(), pos); err != nil {
		return err
	}
	if scratch {
		return e.noPrefix(f.Name())
	}
	return nil
}

func noArgs(cmd string, pos []string) error {
	if len(pos) > 0 {
		return usageError(cmd, fmt.Sprintf("unexpected argument %q", pos[0]))
	}
	return nil
}

// parseID returns the one positional argument, a job id (a batch id for
// the batch command).
func parseID(cmd string, pos []string) (int64, error) {
	what := "job id"
	if cmd == "batch" {
		what = "batch id"
	}
	switch len(pos) {
	case 0:
		return 0, usageError(cmd, what+" required")
	case 1:
	default:
		return 0, usageError(cmd, fmt.Sprintf("unexpected argument %q after the %s", pos[1], what))
	}
	id, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError(cmd, fmt.Sprintf("%q is not a %s", pos[0], what))
	}
	return id, nil
}

// queueDSN is the database of the queue commands: --db, else
// $CONVEYOR_DB, else ./conveyor.db.
func (e *env) queueDSN() string {
	if e.db.set {
		return e.db.val
	}
	if d := os.Getenv("CONVEYOR_DB"); d != "" {
		return d
	}
	return "./conveyor.db"
}

// scratchDB returns the database of the commands that work on throw-away
// tables: --db, else $CONVEYOR_DB, else a new temporary SQLite file
// (temp true), which cleanup removes. cleanup is never nil.
func (e *env) scratchDB() (dsn string, temp bool, cleanup func(), err error) {
	dsn = os.Getenv("CONVEYOR_DB")
	if e.db.set {
		dsn = e.db.val
	}
	if dsn != "" {
		return dsn, false, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "conveyor-bench-")
	if err != nil {
		return "", false, nil, err
	}
	return filepath.Join(dir, "bench.db"), true, func() { os.RemoveAll(dir) }, nil
}

// noPrefix refuses --prefix for the commands that make their own, and
// --connect-timeout, which only the queue commands take.
func (e *env) noPrefix(cmd string) error {
	if e.prefix.set {
		return usageError(cmd, "--prefix does not apply: "+cmd+" works on throw-away tables under a fresh prefix")
	}
	if e.connectTimeout.set {
		return usageError(cmd, "--connect-timeout does not apply to "+cmd+" (it opens with the default, 10s)")
	}
	return nil
}

// open opens the queue's database. Only migrate (create) may create a
// SQLite file; for the other commands the file must exist and hold the
// schema under the prefix.
func (e *env) open(create bool) (*conveyor.Client[any], error) {
	return e.openWith(create, &conveyor.Config{})
}

// openWith is open with a configuration of the command's own (the table
// prefix is set from --prefix).
func (e *env) openWith(create bool, cfg *conveyor.Config) (*conveyor.Client[any], error) {
	dsn := e.queueDSN()
	if p := sqliteFile(dsn); p != "" && !create {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no database at %s (run conveyor migrate first)", p)
		}
	}
	cfg.TablePrefix = e.prefix.val
	c, err := connect.OpenWith(e.ctx, dsn, cfg, e.connectOptions())
	if err != nil || create {
		return c, err
	}
	if err := checkSchema(e.ctx, c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkSchema explains on one line a database that lacks conveyor's
// tables under the client's prefix, or has older ones. (EnqueueMany checks
// the schema before anything else and inserts nothing when given no jobs.)
func checkSchema(ctx context.Context, c *conveyor.Client[any]) error {
	_, err := c.EnqueueMany(ctx, nil)
	if !errors.Is(err, conveyor.ErrSchemaOutdated) {
		return err
	}
	p := c.Config().TablePrefix
	if strings.Contains(err.Error(), "at version 0,") {
		return fmt.Errorf("database has no conveyor schema under prefix %s: run conveyor migrate", p)
	}
	return fmt.Errorf("database schema under prefix %s is older than this conveyor: run conveyor migrate", p)
}

// backendOf names the backend a DSN selects ("" for a scheme conveyor
// does not know), as connect.Open does.
func backendOf(s string) string {
	b, _ := connect.Backend(s)
	return b
}

// sqliteFile returns the file a SQLite DSN names, as connect.Open reads
// it, or "" for any other DSN (or one it refuses, which opening then
// reports).
func sqliteFile(dsn string) string {
	p, err := connect.SQLiteFile(dsn)
	if err != nil {
		return ""
	}
	return p
}

// oneLine returns err with its message on one line: each distinct line of
// a multi-line message (pgx puts every connection attempt on a line of its
// own) is kept once, joined with "; ".
func oneLine(err error) error {
	if err == nil || !strings.Contains(err.Error(), "\n") {
		return err
	}
	var b strings.Builder
	seen := map[string]bool{}
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || seen[l] {
			continue
		}
		seen[l] = true
		switch {
		case b.Len() == 0:
		case strings.HasSuffix(b.String(), ":"):
			b.WriteString(" ")
		default:
			b.WriteString("; ")
		}
		b.WriteString(l)
	}
	return lineError{msg: b.String(), err: err}
}

// lineError is an error whose message was put on one line.
type lineError struct {
	msg string
	err error
}

// Error returns the one-line message.
func (e lineError) Error() string { return e.msg }

// Unwrap returns the original error.
func (e lineError) Unwrap() error { return e.err }
