// Package web serves a conveyor client over HTTP: a JSON API (enqueue,
// inspect, retry, cancel, discard, queue statistics, pause and resume,
// and the worker protocol that lets a program in any language claim,
// heartbeat and acknowledge jobs, fenced like an in-process worker) and
// a dashboard rendered on the server, with its assets embedded.
//
// The handler is closed by default: New refuses Options without
// credentials (bearer tokens or basic-auth users, each admin or
// read-only) unless Options.InsecureLoopbackDev says otherwise. Every
// state change goes through Go's cross-origin protection
// (http.CrossOriginProtection); request bodies are capped; request time
// is bounded; every request is logged with log/slog. See docs/web.md for
// the API and the security decisions.
//
// Mount it in an existing server:
//
//	h, err := web.New(client, web.Options{
//		Tokens:   []web.Token{{Value: os.Getenv("CONVEYOR_ADMIN_TOKEN"), Role: web.RoleAdmin}},
//		BasePath: "/conveyor",
//	})
//	if err != nil { ... }
//	mux.Handle("/conveyor/", h)
//
// or run `conveyor serve --db DSN --token-file F`.
package web

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// Role is what a credential may do: RoleAdmin changes state, RoleReadOnly
// only reads.
type Role string

const (
	// RoleAdmin may read and change everything: enqueue, retry, cancel,
	// discard, pause, resume, and the worker protocol (claim, heartbeat,
	// complete, fail, release).
	RoleAdmin Role = "admin"
	// RoleReadOnly may read jobs, queues and the dashboard; every state
	// change answers 403.
	RoleReadOnly Role = "read-only"
)

func (r Role) valid() bool { return r == RoleAdmin || r == RoleReadOnly }

// Token is a bearer token (sent as "Authorization: Bearer VALUE", or typed
// into the dashboard's login form) and its role.
type Token struct {
	// Value is the secret; at least 16 bytes.
	Value string
	// Role is RoleAdmin or RoleReadOnly.
	Role Role
}

// User is a basic-auth user (sent as "Authorization: Basic ...", or typed
// into the dashboard's login form) and its role.
type User struct {
	// Name is the user name; it may not contain ':'.
	Name string
	// Password is the password; at least 8 bytes.
	Password string
	// Role is RoleAdmin or RoleReadOnly.
	Role Role
}

// Options configure the handler. Credentials are required: at least one
// Token or User, unless InsecureLoopbackDev is set.
type Options struct {
	// Tokens are the accepted bearer tokens.
	Tokens []Token
	// Users are the accepted basic-auth users.
	Users []User
	// InsecureLoopbackDev, with no Tokens and no Users, serves every
	// request from a loopback address as admin without authentication,
	// and refuses (403) requests from any other address, and (421)
	// requests whose Host header is not localhost or a loopback address,
	// which a page of another site could send through DNS rebinding. It
	// is for development on one's own machine only; `conveyor serve` also
	// refuses to listen on a non-loopback address with it.
	InsecureLoopbackDev bool
	// BasePath is the path the handler is mounted under, such as
	// "/conveyor" (no trailing slash); "" mounts it at the root. The
	// handler expects the full path (do not strip the prefix) and uses
	// it for its links and its session cookie.
	BasePath string
	// MaxBodyBytes caps request bodies; beyond it the answer is 413.
	// Default 1 MiB.
	MaxBodyBytes int64
	// RequestTimeout bounds the time each request may take (its context
	// ends then). Default 30s. A long-polling claim may take its wait on
	// top of it.
	RequestTimeout time.Duration
	// MaxClaimWait caps the wait_ms of a long-polling claim. Default 30s.
	MaxClaimWait time.Duration
	// SessionTTL is how long a dashboard login lasts. Default 12h.
	SessionTTL time.Duration
	// SessionKey signs the ids in the dashboard's session cookies
	// (HMAC-SHA256); at least 32 bytes. Default: random at New. Sessions
	// themselves are kept in the handler's memory: a session is valid
	// only on the handler that opened it, and ends at logout (on the
	// server: the old cookie is refused from then on), after SessionTTL,
	// or when the process ends, whatever the key. Behind a load
	// balancer, send a browser to the same process each time (sticky
	// sessions) or use tokens or basic auth.
	SessionKey []byte
	// SecureCookie marks the session cookie Secure even on plain HTTP
	// requests (set it behind a TLS-terminating proxy). It is always
	// Secure on a TLS request.
	SecureCookie bool
	// TrustedOrigins are other origins (such as "https://admin.example")
	// whose browsers may send state changes; by default only same-origin
	// requests may (http.CrossOriginProtection).
	TrustedOrigins []string
	// SampleInterval is the spacing of the throughput samples the
	// dashboard charts. Default 5s. Samples are taken while someone
	// looks (a request for statistics), never in the background.
	SampleInterval time.Duration
	// StatsMaxAge is how long one reading of the queues' statistics is
	// shared by every request before the next one reads again. Default
	// 1s. A reading (Client.Overview: the unfinished jobs and those
	// finished in the last 5 minutes, through their indexes) is also
	// shared for at least ten times as long as it took, so that a large
	// backlog costs the database at most a tenth of one connection's
	// time; below 1ms, every request reads.
	StatsMaxAge time.Duration
	// Logger receives the access log (one line per request at Info; the
	// dashboard's live refreshes, its script's periodic reads, at Debug)
	// and internal errors. Default slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is served at GET BasePath+"/metrics" to any
	// credential (read-only included), as the API is: a Prometheus
	// handler, for example (`conveyor serve` mounts one).
	Metrics http.Handler
}

// client is what the handler needs of a *conveyor.Client[TTx], whatever
// its transaction type.
type client interface {
	EnqueueMany(ctx context.Context, items []conveyor.EnqueueItem) ([]conveyor.EnqueueResult, error)
	Job(ctx context.Context, id int64) (*conveyor.JobInfo, error)
	Batch(ctx context.Context, id int64) (*conveyor.Batch, error)
	EnqueueBatch(ctx context.Context, jobs []conveyor.EnqueueItem, callback conveyor.EnqueueItem) (int64, []int64, error)
	EnqueueWorkflow(ctx context.Context, jobs []conveyor.WorkflowJob, opts *conveyor.WorkflowOpts) (*conveyor.Workflow, error)
	Jobs(ctx context.Context, f conveyor.JobFilter) ([]*conveyor.JobInfo, error)
	Retry(ctx context.Context, id int64) (*conveyor.JobInfo, error)
	Cancel(ctx context.Context, id int64) (*conveyor.JobInfo, error)
	Discard(ctx context.Context, id int64) (*conveyor.JobInfo, error)
	Overview(ctx context.Context, since time.Time) (*conveyor.Stats, error)
	PauseQueue(ctx context.Context, queue string) error
	ResumeQueue(ctx context.Context, queue string) error
	SetQueueLimits(ctx context.Context, queue string, l conveyor.QueueLimits) error
	QueueLimits(ctx context.Context) (map[string]conveyor.QueueLimits, error)
	SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error
	KeyWeights(ctx context.Context) (map[string]map[string]int, error)
	Schedules(ctx context.Context) ([]conveyor.ScheduleInfo, error)
	Processes(ctx context.Context) ([]conveyor.ProcessInfo, error)
	Config() conveyor.Config
	Backend() string
}

// Handler is the API and the dashboard; it is an http.Handler. Build it
// with New. Its worker protocol runs on the client's engine
// (conveyor.RemoteWorkers): long-polling claims are woken by the client's
// listener on PostgreSQL, as its own workers are. Nothing runs in the
// background.
type Handler struct {
	c       client
	rw      *conveyor.RemoteWorkers
	opts    Options
	creds   *credentials
	root    http.Handler
	tmpl    templates
	static  http.Handler
	routes  []route
	stats   *statsCache
	started time.Time
	// closing ends with Close: waiting claims answer at once.
	closing context.Context
	close   context.CancelFunc
	// sessions are the dashboard's logins; throttle slows down failed
	// logins (auth.go, throttle.go).
	sessions *sessions
	throttle *loginThrottle
}

//go:embed assets
var assets embed.FS

// New returns the handler for client c, or an error when opts configure
// no credentials (and InsecureLoopbackDev is not set) or are invalid.
func New[TTx any](c *conveyor.Client[TTx], opts Options) (*Handler, error) {
	if c == nil {
		return nil, errors.New("web: nil client")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	creds, err := newCredentials(o)
	if err != nil {
		return nil, err
	}
	h := &Handler{
		c: c, rw: c.RemoteWorkers(), opts: o, creds: creds, started: time.Now(),
		sessions: newSessions(), throttle: newLoginThrottle(),
	}
	h.closing, h.close = context.WithCancel(context.Background())
	h.stats = newStatsCache(c, o.StatsMaxAge, o.SampleInterval)
	if h.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	h.static = http.StripPrefix(o.BasePath+"/static/", http.FileServerFS(sub))
	cop := http.NewCrossOriginProtection()
	for _, origin := range o.TrustedOrigins {
		if err := cop.AddTrustedOrigin(origin); err != nil {
			return nil, fmt.Errorf("web: TrustedOrigins: %w", err)
		}
	}
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: state changes must come from the dashboard's own origin (or Options.TrustedOrigins); API clients send no Origin or Sec-Fetch-Site header")
	}))
	mux := http.NewServeMux()
	h.routes = h.routeTable()
	for _, rt := range h.routes {
		mux.Handle(rt.method+" "+o.BasePath+rt.path, h.guard(rt))
	}
	if o.Metrics != nil {
		mux.Handle("GET "+o.BasePath+"/metrics", h.guard(route{method: "GET", path: "/metrics", role: RoleReadOnly,
			fn: func(w http.ResponseWriter, r *http.Request, _ principal) { o.Metrics.ServeHTTP(w, r) }}))
	}
	// Anything else: 404 for the authenticated, 401 (the login) for
	// everyone else, so that nothing is learned without credentials.
	mux.Handle(o.BasePath+"/", h.guard(route{path: "/", role: RoleReadOnly, html: true, fn: h.notFound}))
	var inner http.Handler = cop.Handler(h.limits(mux))
	if creds.devLB {
		inner = loopbackHostOnly(inner)
	}
	h.root = h.accessLog(securityHeaders(inner))
	return h, nil
}

// ServeHTTP serves the API and the dashboard.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.root.ServeHTTP(w, r) }

func (o Options) withDefaults() (Options, error) {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.MaxClaimWait == 0 {
		o.MaxClaimWait = 30 * time.Second
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.SampleInterval == 0 {
		o.SampleInterval = 5 * time.Second
	}
	if o.StatsMaxAge == 0 {
		o.StatsMaxAge = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.MaxBodyBytes < 1024:
		return o, fmt.Errorf("web: MaxBodyBytes %d is below 1024", o.MaxBodyBytes)
	case o.RequestTimeout < 0 || o.MaxClaimWait < 0 || o.SessionTTL < 0 || o.SampleInterval < 0 || o.StatsMaxAge < 0:
		return o, errors.New("web: negative duration in Options")
	case o.BasePath != "" && (!strings.HasPrefix(o.BasePath, "/") || strings.HasSuffix(o.BasePath, "/") || strings.ContainsAny(o.BasePath, "{}?#% \"'<>")):
		return o, fmt.Errorf("web: BasePath %q must start with '/', not end with one, and hold no special characters", o.BasePath)
	case o.SessionKey != nil && len(o.SessionKey) < 32:
		return o, errors.New("web: SessionKey must be at least 32 bytes")
	}
	if o.SessionKey == nil {
		o.SessionKey = make([]byte, 32)
		if _, err := rand.Read(o.SessionKey); err != nil {
			return o, err
		}
	}
	return o, nil
}

// isLoopback reports whether a request's remote address is on the
// loopback interface.
func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackHostOnly refuses, with 421, requests whose Host header is not
// a loopback address or "localhost" (with or without a port). In
// InsecureLoopbackDev mode the remote address is always loopback, but a
// page of another site whose name was made to resolve to 127.0.0.1 (DNS
// rebinding) would reach the server from the user's own browser, with
// the other site's name in Host.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf("Host %q refused: this server runs without authentication (InsecureLoopbackDev) and answers only requests addressed to localhost, 127.0.0.1 or [::1]", r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names a loopback address or
// localhost, with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Close ends the long-polling claims waiting in this handler: they answer
// at once with no jobs, so that a server shutting down need not wait for
// them (call it before http.Server.Shutdown). Later claims do not wait.
// Close does not close the client.
func (h *Handler) Close() error {
	h.close()
	return nil
}
