package torture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitReady waits until the server of dsn accepts a connection and a
// query, up to timeout.
func waitReady(ctx context.Context, dsn string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = ping(ctx, dsn)
		if last == nil {
			return nil
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("server not accepting connections after %v: %w", timeout, last)
}

func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	switch backendOf(dsn) {
	case "postgres":
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	case "mysql":
		db, err := openSQL(dsn, false)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "SELECT 1")
		return err
	}
	return nil
}

// restartServer restarts the loopback server of dsn under load:
// PostgreSQL with an immediate-mode restart of its cluster (pg_ctlcluster),
// MariaDB/MySQL killed with SIGKILL and started again as it was. It
// returns once the server accepts connections again, and always tries to
// start the server again if it stopped it.
func restartServer(ctx context.Context, a *admin) (desc string, err error) {
	switch a.backend {
	case "postgres":
		return restartPostgres(ctx, a)
	case "mysql":
		return restartMySQL(ctx, a)
	}
	return "", errors.New("no server to restart")
}

func restartPostgres(ctx context.Context, a *admin) (string, error) {
	var port int
	var dataDir string
	if err := a.pg.QueryRow(ctx, "SELECT current_setting('port')::int, current_setting('data_directory')").Scan(&port, &dataDir); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "pg_lsclusters", "-h").Output()
	if err != nil {
		return "", fmt.Errorf("pg_lsclusters: %w", err)
	}
	var ver, cluster string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 6 && f[2] == strconv.Itoa(port) && f[5] == dataDir {
			ver, cluster = f[0], f[1]
		}
	}
	if ver == "" {
		return "", fmt.Errorf("no local cluster on port %d with data directory %s (pg_lsclusters)", port, dataDir)
	}
	// Restart always ends with the cluster started: if restart fails
	// half-way, start it.
	cmd := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", ver, cluster, "restart", "-m", "immediate")
	b, rerr := cmd.CombinedOutput()
	if rerr != nil {
		_ = exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", ver, cluster, "start").Run()
	}
	if err := waitReady(context.WithoutCancel(ctx), a.dsn, 120*time.Second); err != nil {
		return "", err
	}
	if rerr != nil {
		return "", fmt.Errorf("pg_ctlcluster restart: %v: %s", rerr, b)
	}
	return fmt.Sprintf("pg_ctlcluster %s %s restart -m immediate", ver, cluster), nil
}

func restartMySQL(ctx context.Context, a *admin) (string, error) {
	var pidFile string
	if err := a.db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
		return "", err
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return "", fmt.Errorf("server pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("server pid file %s: %w", pidFile, err)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", fmt.Errorf("server process %d: %w", pid, err)
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", err
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")[1:]
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	// From here on the server must come back whatever happens.
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// --pidfile: other servers of the same executable may run beside this
	// one (a Galera cluster, a skewed private server); matched by --exec
	// alone, start-stop-daemon would take any of them for this one and
	// start nothing.
	start := append([]string{"--start", "--oknodo", "--background", "--pidfile", pidFile, "--exec", exe}, "--")
	start = append(start, args...)
	var serr error
	for i := 0; i < 3; i++ {
		out, err := exec.Command("start-stop-daemon", start...).CombinedOutput()
		if err == nil {
			serr = nil
			break
		}
		serr = fmt.Errorf("start-stop-daemon: %v: %s", err, out)
		time.Sleep(time.Second)
	}
	if err := waitReady(context.WithoutCancel(ctx), a.dsn, 120*time.Second); err != nil {
		return "", errors.Join(serr, err)
	}
	return fmt.Sprintf("kill -9 %s (pid %d), start-stop-daemon --start", filepath.Base(exe), pid), nil
}

// privateServer is a throw-away database server on a free loopback port,
// run under libfaketime so that its clock is skewed from the workers'.
type privateServer struct {
	backend string
	dsn     string
	dir     string
	cmd     *exec.Cmd
	done    chan struct{}
	offset  time.Duration
}

// skewTools finds what a skewed private server needs, or says what is
// missing.
func skewTools(backend string) (lib string, err error) {
	libs, _ := filepath.Glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
	if len(libs) == 0 {
		return "", errors.New("libfaketime not installed (apt-get install -y faketime)")
	}
	if os.Geteuid() != 0 {
		return "", errors.New("needs root to run a private server as its system user")
	}
	switch backend {
	case "postgres":
		if _, err := postgresBin(); err != nil {
			return "", err
		}
		if _, err := user.Lookup("postgres"); err != nil {
			return "", errors.New("no postgres system user")
		}
	case "mysql":
		for _, p := range []string{"/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"} {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%s not found", p)
			}
		}
		if _, err := user.Lookup("mysql"); err != nil {
			return "", errors.New("no mysql system user")
		}
	default:
		return "", errors.New("no server")
	}
	return libs[0], nil
}

func postgresBin() (string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		return "", errors.New("PostgreSQL server binaries not found under /usr/lib/postgresql")
	}
	sort.Strings(bins)
	return filepath.Dir(bins[len(bins)-1]), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startPrivate starts a private PostgreSQL or MariaDB server whose clock
// is offset from the real one by offset (libfaketime), on a free loopback
// port, and waits until it accepts connections. stop must be called.
func startPrivate(ctx context.Context, backend string, offset time.Duration) (*privateServer, error) {
	lib, err := skewTools(backend)
	if err != nil {
		return nil, err
	}
	owner := map[string]string{"postgres": "postgres", "mysql": "mysql"}[backend]
	cred, err := credential(owner)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "conveyor-skew-")
	if err != nil {
		return nil, err
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &privateServer{backend: backend, dir: dir, done: make(chan struct{}), offset: offset}
	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) error {
		c := exec.CommandContext(ctx, name, args...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		c.Dir = dir
		c.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
		out, err := c.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", filepath.Base(name), err, lastLines(string(out), 5))
		}
		return nil
	}
	var server string
	var args []string
	switch backend {
	case "postgres":
		bin, _ := postgresBin()
		if err := run(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		server = filepath.Join(bin, "postgres")
		args = []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
			"-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB"}
		s.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	case "mysql":
		// --tmpdir: bootstraps running at once in the shared /tmp collide
		// on their temporary tables' names ("Unknown table
		// 'mysql.tmp_user_nopasswd,...'", seen 1 in 8 under load).
		if err := run("/usr/bin/mariadb-install-db", "--no-defaults", "--datadir="+data, "--tmpdir="+dir,
			"--auth-root-authentication-method=normal", "--skip-test-db"); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		server = "/usr/sbin/mariadbd"
		args = []string{"--no-defaults", "--datadir=" + data, "--tmpdir=" + dir, "--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
			"--skip-log-bin", "--innodb-buffer-pool-size=64M", "--skip-name-resolve", "--max-connections=300"}
		s.dsn = fmt.Sprintf("mysql://root@127.0.0.1:%d/test", port)
	}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	s.cmd = exec.Command(server, args...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	s.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C",
		"LD_PRELOAD=" + lib,
		fmt.Sprintf("FAKETIME=%+d", int(offset.Seconds())),
		// Offset the wall clock only: the servers' timeouts use the
		// monotonic clock, which must not jump.
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"FAKETIME_DONT_RESET=1"}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	if backend == "mysql" {
		// The database named in the DSN.
		root := fmt.Sprintf("mysql://root@127.0.0.1:%d/", port)
		err = waitReady(ctx, root+"mysql", 60*time.Second)
		if err == nil {
			var db *sql.DB
			if db, err = openSQL(root+"mysql", false); err == nil {
				_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4")
				db.Close()
			}
		}
	} else {
		err = waitReady(ctx, s.dsn, 60*time.Second)
	}
	if err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// stop kills the private server and removes its files.
func (s *privateServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		sig := syscall.SIGKILL
		if s.backend == "postgres" {
			sig = syscall.SIGQUIT // immediate shutdown, children included
		}
		_ = s.cmd.Process.Signal(sig)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}
