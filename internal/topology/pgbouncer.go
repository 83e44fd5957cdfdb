package topology

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// PgBouncerBin is Debian's PgBouncer executable.
const PgBouncerBin = "/usr/sbin/pgbouncer"

// PgBouncerOptions configure a PgBouncer started by StartPgBouncer.
type PgBouncerOptions struct {
	// Mode is PgBouncer's pool_mode: "transaction" (default), "session"
	// or "statement".
	Mode string
	// Upstream is the PostgreSQL server behind PgBouncer, a postgres://
	// URL whose host, port, user and database the [databases] entry
	// copies. Default testdb.DefaultPostgres (or CONVEYOR_TEST_POSTGRES).
	Upstream string
	// PoolSize is default_pool_size. Default 20.
	PoolSize int
	// MaxClientConn is max_client_conn. Default 1000.
	MaxClientConn int
	// IgnoreStartupParameters is ignore_startup_parameters (a comma
	// separated list). Default none.
	IgnoreStartupParameters string
}

// PgBouncer is a running PgBouncer on a loopback port.
type PgBouncer struct {
	// Proc is the pgbouncer process.
	Proc *Proc
	// Addr is the host:port it listens on.
	Addr string
	// Mode is its pool_mode.
	Mode string

	dir      string
	upstream *url.URL
	once     sync.Once
}

// DSN returns the postgres:// URL of the upstream database through
// PgBouncer, with query (may be "") appended.
func (b *PgBouncer) DSN(query string) string {
	u := *b.upstream
	u.Host = b.Addr
	u.RawQuery = query
	return u.String()
}

// Stop stops PgBouncer and removes its directory. It may be called more
// than once.
func (b *PgBouncer) Stop() {
	b.once.Do(func() {
		b.Proc.Stop(5 * time.Second)
		os.RemoveAll(b.dir)
	})
}

// StartPgBouncer starts /usr/sbin/pgbouncer in a temporary directory as
// the postgres system user (PgBouncer refuses to run as root) with a
// generated configuration: listen_addr 127.0.0.1 on a free port, trust
// authentication, one database entry named as the upstream's database.
// It returns once PgBouncer accepts connections; on error nothing is left
// running. The caller stops it (Stop).
func StartPgBouncer(ctx context.Context, opts PgBouncerOptions) (*PgBouncer, error) {
	if opts.Mode == "" {
		opts.Mode = "transaction"
	}
	switch opts.Mode {
	case "transaction", "session", "statement":
	default:
		return nil, fmt.Errorf("topology: pgbouncer: pool mode %q is not transaction, session or statement", opts.Mode)
	}
	if opts.Upstream == "" {
		opts.Upstream = os.Getenv("CONVEYOR_TEST_POSTGRES")
		if opts.Upstream == "" {
			opts.Upstream = testdb.DefaultPostgres
		}
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 20
	}
	if opts.MaxClientConn <= 0 {
		opts.MaxClientConn = 1000
	}
	up, err := url.Parse(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("topology: pgbouncer: upstream %q: %w", opts.Upstream, err)
	}
	user := up.User.Username()
	if user == "" {
		user = "postgres"
	}
	db := strings.TrimPrefix(up.Path, "/")
	host, port := up.Hostname(), up.Port()
	if port == "" {
		port = "5432"
	}
	if _, err := os.Stat(PgBouncerBin); err != nil {
		return nil, fmt.Errorf("topology: pgbouncer: %s missing (Debian package pgbouncer): %w", PgBouncerBin, err)
	}
	p, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := TempDir("conveyor-pgbouncer-", "postgres")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = %d
ignore_startup_parameters = %s
pidfile = %s
`, db, host, port, db, user, p, filepath.Join(dir, "users.txt"), opts.Mode, opts.PoolSize,
		opts.MaxClientConn, opts.IgnoreStartupParameters, filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q \"\"\n", user)), 0o644); err != nil {
		return nil, err
	}
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	proc, err := Start("pgbouncer", "postgres", filepath.Join(dir, "pgbouncer.log"), exec.Command(PgBouncerBin, iniPath))
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-proc.Exited():
			cancel() // it died: stop waiting at once
		case <-wctx.Done():
		}
	}()
	if err := WaitTCP(wctx, addr, 15*time.Second); err != nil {
		tail := proc.Tail(20)
		proc.Stop(time.Second)
		return nil, fmt.Errorf("topology: pgbouncer did not start: %w\n%s", err, tail)
	}
	ok = true
	return &PgBouncer{Proc: proc, Addr: addr, Mode: opts.Mode, dir: dir, upstream: up}, nil
}

// PgBouncerT starts a PgBouncer for one test, stopped when the test
// ends. A test whose machine lacks pgbouncer is skipped (fails when
// strict; see Need), as is one without the PostgreSQL test server.
func PgBouncerT(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	Need(t, "pgbouncer", PgBouncerBin)
	if opts.Upstream == "" {
		opts.Upstream = testdb.Postgres(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := StartPgBouncer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// SharedPgBouncer is one PgBouncer shared by the tests of a test binary:
// started by the first test that asks for it, stopped by Stop at the end
// of TestMain.
type SharedPgBouncer struct {
	// Options configure the PgBouncer when it starts.
	Options PgBouncerOptions

	mu  sync.Mutex
	b   *PgBouncer
	err error
}

// Get returns the shared PgBouncer, starting it on first use. A test
// whose machine lacks pgbouncer is skipped (fails when strict), as is one
// without the PostgreSQL test server; a failed start fails every test
// that asks.
func (s *SharedPgBouncer) Get(t testing.TB) *PgBouncer {
	t.Helper()
	Need(t, "pgbouncer", PgBouncerBin)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b == nil && s.err == nil {
		opts := s.Options
		if opts.Upstream == "" {
			opts.Upstream = testdb.Postgres(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s.b, s.err = StartPgBouncer(ctx, opts)
		cancel()
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.b
}

// Stop stops the shared PgBouncer if it was started.
func (s *SharedPgBouncer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b != nil {
		s.b.Stop()
	}
}
