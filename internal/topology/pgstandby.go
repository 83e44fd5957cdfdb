package topology

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PostgresNode is a private PostgreSQL server on a loopback port, run as
// the postgres system user from a data directory of its own: a primary
// made by StartPostgresPrimary or a streaming standby made by
// StartPostgresStandby. Stop (or Kill) it on every exit path.
type PostgresNode struct {
	// Name is what the node is in messages.
	Name string
	// Port is its loopback port.
	Port int
	// Data is its data directory.
	Data string
	// Proc is the postmaster.
	Proc *Proc

	bin string
	dir string
	env []string
}

// DSN returns a DSN for database db on the node as user postgres.
func (n *PostgresNode) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, db)
}

// Stop shuts the node down at once (SIGQUIT to the postmaster, then
// SIGKILL) and waits for it.
func (n *PostgresNode) Stop() {
	if n.Proc == nil {
		return
	}
	_ = n.Proc.Signal(syscall.SIGQUIT) //: immediate shutdown, children included
	n.Proc.Stop(5 * time.Second)
}

// Kill kills the node's processes at once (kill -9 of the process group),
// as a crash of its machine would: nothing more reaches its WAL.
func (n *PostgresNode) Kill() {
	if n.Proc != nil {
		n.Proc.Kill()
	}
}

// runAsOwner runs a command as owner (when the caller is root), killed
// with its parent, and returns its error with the last lines of its
// output.
func runAsOwner(ctx context.Context, owner, dir string, env []string, name string, args ...string) error {
	c := exec.CommandContext(ctx, name, args...)
	c.Dir = dir
	c.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}, env...)
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if owner != "" && os.Geteuid() == 0 {
		cred, err := Credential(owner)
		if err != nil {
			return err
		}
		c.SysProcAttr.Credential = cred
	}
	out, err := c.CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		lines = lines[max(0, len(lines)-8):]
		return fmt.Errorf("topology: %s: %v: %s", filepath.Base(name), err, strings.Join(lines, "\n"))
	}
	return nil
}

// StartPostgresPrimary makes a fresh cluster under dir (owned by the
// postgres user; see TempDir), with trust authentication for local and
// replication connections on loopback, and starts it on a free port with
// env added to its environment (a Clock's Env, say). It waits until the
// server accepts connections, bounded by ctx and a minute.
func StartPostgresPrimary(ctx context.Context, name, dir string, env []string) (*PostgresNode, error) {
	bin, err := PostgresBin()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := runAsOwner(ctx, "postgres", dir, nil, filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
		return nil, err
	}
	n := &PostgresNode{Name: name, Data: data, bin: bin, dir: dir, env: env}
	return n, n.start(ctx)
}

// StartPostgresStandby makes a streaming standby of primary under dir
// (pg_basebackup -R: its primary_conninfo names the primary) and starts
// it on a free port with env added to its environment. It waits until
// the standby accepts connections.
func StartPostgresStandby(ctx context.Context, name string, primary *PostgresNode, dir string, env []string) (*PostgresNode, error) {
	data := filepath.Join(dir, "data")
	if err := runAsOwner(ctx, "postgres", dir, nil, filepath.Join(primary.bin, "pg_basebackup"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", "postgres", "-D", data, "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
		return nil, err
	}
	n := &PostgresNode{Name: name, Data: data, bin: primary.bin, dir: dir, env: env}
	return n, n.start(ctx)
}

func (n *PostgresNode) start(ctx context.Context) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	n.Port = port
	cmd := exec.Command(filepath.Join(n.bin, "postgres"), "-D", n.Data, "-p", strconv.Itoa(port), "-k", n.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=50", "-c", "shared_buffers=16MB",
		"-c", "wal_level=replica", "-c", "max_wal_senders=4", "-c", "hot_standby=on")
	cmd.Dir = n.dir
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}, n.env...)
	p, err := Start(n.Name, "postgres", filepath.Join(n.dir, "server.log"), cmd)
	if err != nil {
		return err
	}
	n.Proc = p
	if err := WaitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", port), time.Minute); err != nil {
		err = fmt.Errorf("%w\n%s", err, p.Tail(10))
		n.Stop()
		return err
	}
	if err := n.waitReady(ctx, time.Minute); err != nil {
		err = fmt.Errorf("%w\n%s", err, p.Tail(10))
		n.Stop()
		return err
	}
	return nil
}

// waitReady waits until the node accepts connections (pg_isready exits
// 0), bounded by ctx and timeout. The postmaster listens before its
// startup ends, and until then refuses every connection with "the
// database system is starting up": on a loaded machine a pg_basebackup
// sent as soon as the port answered failed that way.
func (n *PostgresNode) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c := exec.CommandContext(ctx, filepath.Join(n.bin, "pg_isready"), "-q", "-h", "127.0.0.1",
			"-p", strconv.Itoa(n.Port), "-U", "postgres", "-d", "postgres", "-t", "5")
		err := c.Run()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topology: %s on port %d not ready after %v: pg_isready: %w", n.Name, n.Port, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Promote promotes a standby with pg_ctl promote and waits for it to
// finish (-w, bounded by ctx and a minute).
func (n *PostgresNode) Promote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return runAsOwner(ctx, "postgres", n.dir, nil, filepath.Join(n.bin, "pg_ctl"), "promote", "-D", n.Data, "-w", "-t", "60")
}
