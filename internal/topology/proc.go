// Package topology starts the database topologies conveyor's tests run
// against beside the single loopback servers: PgBouncer in front of
// PostgreSQL, a Patroni-managed PostgreSQL cluster with etcd, and a
// MariaDB Galera cluster. Everything runs from Debian's packages, on
// loopback ports, in temporary directories, started by the tests
// themselves (never through systemd) and stopped on every exit path: each
// process runs in its own process group, which Stop kills, and every
// start is bounded in time.
//
// A test that needs a tool that is missing calls Need, which skips the
// test with the package to install, or fails it where tests are strict
// (CI=true or CONVEYOR_REQUIRE_BACKENDS; see internal/testdb).
package topology

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// Need ends tb (skip, or fail when strict) unless every named executable
// is present; pkg names the Debian package that provides them.
func Need(tb testing.TB, pkg string, executables ...string) {
	tb.Helper()
	for _, e := range executables {
		if _, err := os.Stat(e); err == nil {
			continue
		}
		if _, err := exec.LookPath(e); err == nil {
			continue
		}
		testdb.Missing(tb, "%s (Debian package %s: apt-get install %s)", e, pkg, pkg)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitTCP waits until something accepts TCP connections at addr, up to
// timeout or until ctx ends.
func WaitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topology: nothing accepts connections at %s after %v: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Credential returns the credential of the named system user (postgres,
// mysql), for servers that refuse to run as root.
func Credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("topology: user %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// TempDir makes a temporary directory owned by the named system user
// ("" keeps the current one). The caller removes it.
func TempDir(pattern, owner string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if owner != "" && os.Geteuid() == 0 {
		cred, err := Credential(owner)
		if err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// Proc is a process started by Start: it runs in a process group of its
// own, with its output in a log file.
type Proc struct {
	// Name is what the process is in messages ("pgbouncer", "galera node 2").
	Name string
	// Log is the file that holds the process's standard output and error.
	Log string

	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
	err  error
}

// Start starts cmd in a process group of its own, as the named system
// user when owner is not "" and the caller is root, with its output
// appended to logFile.
func Start(name, owner, logFile string, cmd *exec.Cmd) (*Proc, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if owner != "" && os.Geteuid() == 0 {
		cred, err := Credential(owner)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
		_ = os.Chown(logFile, int(cred.Uid), int(cred.Gid))
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("topology: start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process's PID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited returns a channel closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// Signal sends sig to the process's whole group.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("topology: %s has exited", p.Name)
	default:
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Stop ends the process group: SIGTERM, then SIGKILL after grace. It
// waits for the process to exit and may be called more than once.
func (p *Proc) Stop(grace time.Duration) {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
}

// Kill sends SIGKILL to the process's group and waits for it to exit.
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Tail returns the last n lines of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PostgresBin returns the directory of the installed PostgreSQL server
// binaries (initdb, postgres, pg_ctl, pg_basebackup), newest version first.
func PostgresBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) == 0 {
		return "", errors.New("topology: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (Debian package postgresql)")
	}
	best, bestV := "", -1
	for _, m := range matches {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
		if v > bestV {
			best, bestV = filepath.Dir(m), v
		}
	}
	return best, nil
}
