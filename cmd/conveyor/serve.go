package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/observe/promconveyor"
	"github.com/conveyorq/conveyor/web"
)

const serveAbout = `Serves the dashboard (/) and the HTTP/JSON API (/api/v1, described at
/api/v1/openapi.json) until interrupted. Credentials are required:
--token-file (admin bearer tokens, one per line), --read-only-token-file,
--basic-auth-file (lines USER:PASSWORD[:admin|read-only], admin by
default); '#' starts a comment line. Without any, serve refuses to start
unless --insecure-loopback-dev, which serves everyone on a loopback
address as admin and refuses any other listen address.

With --maintenance (the default) serve also runs conveyor's maintenance
(promoting due scheduled and retryable jobs, rescuing expired leases,
pruning) when no other process does, as HTTP workers need; it works
no queue (its client is opened with conveyor.Config.NoQueues).

--unknown-kinds decides what the API's enqueue does with a kind no job of
which has completed on the database (so no worker is known to handle it;
the first job of a new kind is one): warn (the default) enqueues it and
logs a warning, at most once per kind every 10 minutes; refuse answers 400
(unknown job kind); allow says nothing.

With --metrics (the default) serve answers GET /metrics in Prometheus'
text format, to the same credentials as the API (read-only included):
the queues' depth by state, oldest available job and pauses (sampled at
most every 15s), serve's own counters (maintenance, database errors), the
jobs enqueued through the API by queue and kind, and the Go runtime's.`

// serveCmd serves the dashboard and the HTTP API.
func serveCmd(e *env, args []string) error {
	f := e.flags("serve", "serve [--listen ADDR] [--token-file F] [--read-only-token-file F] [--basic-auth-file F] [--insecure-loopback-dev] [--unknown-kinds warn|refuse|allow] [--metrics=false] [--log-level debug|info|warn|error]", dbHelp)
	f.about = serveAbout
	listen := f.String("listen", "127.0.0.1:8080", "`address` to listen on")
	tokenFile := f.String("token-file", "", "`file` of admin bearer tokens, one per line")
	roFile := f.String("read-only-token-file", "", "`file` of read-only bearer tokens, one per line")
	basicFile := f.String("basic-auth-file", "", "`file` of USER:PASSWORD[:ROLE] lines")
	insecure := f.Bool("insecure-loopback-dev", false, "serve without authentication, on a loopback address only (development)")
	basePath := f.String("base-path", "", "serve under this `path` (such as /conveyor) behind a proxy")
	secureCookie := f.Bool("secure-cookie", false, "mark the session cookie Secure (behind a TLS-terminating proxy)")
	maintenance := f.Bool("maintenance", true, "take part in maintenance: promote due jobs, rescue expired leases, prune")
	maxBody := f.Int64("max-body-bytes", 1<<20, "largest request body accepted")
	sample := f.Duration("sample-interval", 5*time.Second, "spacing of the dashboard's throughput samples (taken while someone looks)")
	unknownKinds := f.String("unknown-kinds", kindsWarn, "what the API's enqueue does with a kind no job of which has completed on the database: warn, refuse or allow")
	metrics := f.Bool("metrics", true, "serve Prometheus metrics at /metrics, behind the API's credentials")
	logLevel := f.String("log-level", "info", "least level logged: debug (adds the dashboard's live refreshes to the access log), info, warn or error")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError("serve", fmt.Sprintf("--log-level %q: debug, info, warn or error", *logLevel))
	}
	switch *unknownKinds {
	case kindsWarn, kindsRefuse, kindsAllow:
	default:
		return usageError("serve", fmt.Sprintf("--unknown-kinds %q: warn, refuse or allow", *unknownKinds))
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	opts := web.Options{InsecureLoopbackDev: *insecure, BasePath: *basePath, SecureCookie: *secureCookie, MaxBodyBytes: *maxBody,
		SampleInterval: *sample,
		Logger:         logger}
	var err error
	for _, tf := range []struct {
		file string
		role web.Role
	}{{*tokenFile, web.RoleAdmin}, {*roFile, web.RoleReadOnly}} {
		if tf.file == "" {
			continue
		}
		lines, err := readLines(tf.file)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if len(lines) == 0 {
			return fmt.Errorf("serve: %s holds no token", tf.file)
		}
		for _, l := range lines {
			opts.Tokens = append(opts.Tokens, web.Token{Value: l, Role: tf.role})
		}
	}
	if *basicFile != "" {
		if opts.Users, err = readUsers(*basicFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	hasCreds := len(opts.Tokens) > 0 || len(opts.Users) > 0
	switch {
	case !hasCreds && !*insecure:
		return usageError("serve", "no credentials: give --token-file, --read-only-token-file or --basic-auth-file (or, for development on loopback only, --insecure-loopback-dev)")
	case hasCreds && *insecure:
		return usageError("serve", "--insecure-loopback-dev serves without authentication: it cannot be combined with credential files")
	case *insecure:
		if err := loopbackOnly(*listen); err != nil {
			return usageError("serve", err.Error())
		}
	}
	// The client works no queue: started (with --maintenance) it only
	// takes part in the leader's maintenance, which HTTP workers rely on.
	cfg := &conveyor.Config{NoQueues: true}
	kinds := newKindCheck(*unknownKinds, "this server refuses kinds no worker is known to handle: --unknown-kinds refuse", logger)
	cfg.EnqueueMiddleware = append(cfg.EnqueueMiddleware, kinds.Middleware)
	var m *promconveyor.Metrics
	if *metrics {
		m = promconveyor.New(promconveyor.Options{})
		cfg.EnqueueMiddleware = append(cfg.EnqueueMiddleware, m.EnqueueMiddleware)
	}
	c, err := e.openWith(false, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	kinds.client = c
	if *metrics {
		reg := prometheus.NewRegistry()
		reg.MustRegister(m, promconveyor.NewClientCollector(c, promconveyor.ClientOptions{}),
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opts.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelError)})
	}
	h, err := web.New(c, opts)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer h.Close()
	if *maintenance {
		if err := c.Start(e.ctx); err != nil {
			return fmt.Errorf("serve: starting maintenance: %w", err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      2 * time.Minute, // above the handler's 30s + 30s long-poll bound
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(e.ctx) },
	}
	auth := "credentials required"
	if *insecure {
		auth = "NO AUTHENTICATION (--insecure-loopback-dev): loopback only"
	}
	fmt.Fprintf(e.stdout, "conveyor serve: http://%s%s/ on %s (%s)\n", ln.Addr(), *basePath, c.Backend(), auth)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-e.ctx.Done():
	}
	// The long-polling claims answer at once with no jobs, rather than
	// holding Shutdown until its bound and then losing their connections.
	h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(e.stdout, "conveyor serve: stopped")
	return nil
}

// loopbackOnly refuses a listen address that is not on the loopback
// interface (an empty host listens on every interface).
func loopbackOnly(listen string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--insecure-loopback-dev serves without authentication and listens on loopback only (127.0.0.1, ::1 or localhost), not %q", listen)
}

// readLines returns a file's lines that are neither blank nor comments,
// trimmed.
func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// readUsers reads USER:PASSWORD[:ROLE] lines. The role is the last field
// only when it names one, so a password may contain ':'.
func readUsers(path string) ([]web.User, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%s holds no user", path)
	}
	var out []web.User
	for i, l := range lines {
		name, rest, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("%s: line %d is not USER:PASSWORD[:ROLE]", path, i+1)
		}
		u := web.User{Name: name, Password: rest, Role: web.RoleAdmin}
		if j := strings.LastIndex(rest, ":"); j >= 0 {
			if r := web.Role(rest[j+1:]); r == web.RoleAdmin || r == web.RoleReadOnly {
				u.Password, u.Role = rest[:j], r
			}
		}
		out = append(out, u)
	}
	return out, nil
}
