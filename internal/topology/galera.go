package topology

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// Galera executables and the provider library; NeedGalera checks them.
const (
	mariadbd        = "/usr/sbin/mariadbd"
	mariadbInstall  = "/usr/bin/mariadb-install-db"
	galeraProvider  = "/usr/lib/galera/libgalera_smm.so"
	galeraSSTScript = "wsrep_sst_rsync"
)

// GaleraStartTimeout bounds the start of a whole cluster: a fresh 3-node
// cluster on loopback starts in about 10 s (two rsync state transfers).
const GaleraStartTimeout = 2 * time.Minute

// NeedGalera ends tb (skip, or fail when strict) unless MariaDB's server,
// the Galera provider and rsync (for state transfers) are installed.
func NeedGalera(tb testing.TB) {
	tb.Helper()
	Need(tb, "mariadb-server", mariadbd, mariadbInstall)
	Need(tb, "galera-4", galeraProvider)
	Need(tb, "rsync", "rsync")
	Need(tb, "mariadb-server", galeraSSTScript)
	if os.Geteuid() != 0 {
		testdb.Missing(tb, "root, to run the Galera nodes as the mysql system user")
	}
}

// GaleraNode is one mariadbd of a Galera cluster.
type GaleraNode struct {
	// Index is the node's number, 1 to N.
	Index int
	// Port is the node's SQL port on 127.0.0.1.
	Port int
	// Dir holds the node's data directory, configuration, socket and log.
	Dir string

	cfg  string
	proc atomic.Pointer[Proc]
}

// Proc returns the node's running mariadbd (nil before the start).
func (n *GaleraNode) Proc() *Proc { return n.proc.Load() }

// Galera is a MariaDB Galera cluster on loopback where every node takes
// writes. Start it with StartGalera; Stop it on every exit path.
type Galera struct {
	// Nodes are the cluster's nodes, Nodes[0] being node 1, the one
	// that bootstrapped the cluster.
	Nodes []*GaleraNode

	dir  string
	next atomic.Uint64
	// mu serializes RestartNode and Stop, so that a node is never
	// started after (or while) Stop stops the others; stopped is set by
	// Stop, under mu.
	mu      sync.Mutex
	stopped bool
}

// StartGalera starts an n-node Galera cluster (n >= 1) in temporary
// directories: it bootstraps node 1, joins the others one at a time (each
// by an rsync state transfer), waits until every node is Synced in a
// cluster of n, and creates the database test. Everything is bounded by
// GaleraStartTimeout; on error, what was started is stopped.
func StartGalera(ctx context.Context, n int) (_ *Galera, err error) {
	if n < 1 {
		return nil, fmt.Errorf("topology: a Galera cluster needs at least one node, not %d", n)
	}
	ctx, cancel := context.WithTimeout(ctx, GaleraStartTimeout)
	defer cancel()
	dir, err := TempDir("conveyor-galera-", "mysql")
	if err != nil {
		return nil, err
	}
	g := &Galera{dir: dir}
	defer func() {
		if err != nil {
			g.Stop()
		}
	}()
	// Every port first, so that the cluster address names them all.
	type ports struct{ sql, gcomm, ist, sst int }
	ps := make([]ports, n)
	seen := map[int]bool{}
	for i := range ps {
		for _, p := range []*int{&ps[i].sql, &ps[i].gcomm, &ps[i].ist, &ps[i].sst} {
			for {
				if *p, err = FreePort(); err != nil {
					return nil, err
				}
				if !seen[*p] {
					seen[*p] = true
					break
				}
			}
		}
	}
	var addrs []string
	for _, p := range ps {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p.gcomm))
	}
	for i, p := range ps {
		nd := &GaleraNode{Index: i + 1, Port: p.sql, Dir: filepath.Join(dir, fmt.Sprintf("node%d", i+1))}
		g.Nodes = append(g.Nodes, nd)
		if err := os.Mkdir(nd.Dir, 0o755); err != nil {
			return nil, err
		}
		if err := chownMySQL(nd.Dir); err != nil {
			return nil, err
		}
		nd.cfg = filepath.Join(nd.Dir, "my.cnf")
		if err := os.WriteFile(nd.cfg, []byte(galeraConfig(nd, p.gcomm, p.ist, p.sst, addrs)), 0o644); err != nil {
			return nil, err
		}
		if err := runAsMySQL(ctx, nd.Dir, mariadbInstall, "--defaults-file="+nd.cfg,
			"--auth-root-authentication-method=normal", "--skip-test-db"); err != nil {
			return nil, fmt.Errorf("topology: galera node %d: %w", i+1, err)
		}
	}
	for _, nd := range g.Nodes {
		if err := g.startNode(ctx, nd, nd.Index == 1); err != nil {
			return nil, err
		}
		// Join one at a time: each joiner takes a state transfer from a
		// synced donor.
		if err := g.waitSynced(ctx, nd.Index, nd.Index); err != nil {
			return nil, err
		}
	}
	db, err := g.open(1, "mysql")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4"); err != nil {
		return nil, fmt.Errorf("topology: galera: create database test: %w", err)
	}
	// DDL is replicated before it returns (TOI), but make sure every node
	// has it before handing out DSNs.
	for i := range g.Nodes {
		if err := g.waitDatabase(ctx, i+1); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// galeraConfig is the defaults file of one node: nothing of the
// machine's /etc/mysql is read.
func galeraConfig(nd *GaleraNode, gcomm, ist, sst int, addrs []string) string {
	opts := strings.Join([]string{
		fmt.Sprintf("gmcast.listen_addr=tcp://127.0.0.1:%d", gcomm),
		fmt.Sprintf("ist.recv_addr=127.0.0.1:%d", ist),
		"gcache.size=128M",
		// Notice a dead node in a few seconds rather than the default
		// 5-15 s: the cost of a node kill for the surviving nodes'
		// writes is the time to evict it.
		"evs.keepalive_period=PT0.5S",
		"evs.inactive_check_period=PT0.5S",
		"evs.suspect_timeout=PT2S",
		"evs.inactive_timeout=PT4S",
		"evs.install_timeout=PT4S",
	}, ";")
	return strings.Join([]string{
		"[mysqld]",
		"datadir=" + filepath.Join(nd.Dir, "data"),
		// A tmpdir of its own: servers and bootstraps sharing /tmp
		// collide on their temporary tables' names.
		"tmpdir=" + nd.Dir,
		"port=" + strconv.Itoa(nd.Port),
		"bind-address=127.0.0.1",
		"socket=" + filepath.Join(nd.Dir, "sock"),
		"pid-file=" + filepath.Join(nd.Dir, "pid"),
		"log-error=" + filepath.Join(nd.Dir, "error.log"),
		"skip-name-resolve",
		"max-connections=300",
		"innodb-buffer-pool-size=64M",
		"innodb-log-file-size=48M",
		"innodb-flush-log-at-trx-commit=2",
		"performance-schema=OFF",
		"character-set-server=utf8mb4",
		"binlog-format=ROW",
		"default-storage-engine=InnoDB",
		"innodb-autoinc-lock-mode=2",
		"wsrep-on=ON",
		"wsrep-provider=" + galeraProvider,
		"wsrep-cluster-name=conveyor",
		"wsrep-cluster-address=gcomm://" + strings.Join(addrs, ","),
		fmt.Sprintf("wsrep-node-name=node%d", nd.Index),
		"wsrep-node-address=127.0.0.1",
		fmt.Sprintf("wsrep-node-incoming-address=127.0.0.1:%d", nd.Port),
		"wsrep-sst-method=rsync",
		fmt.Sprintf("wsrep-sst-receive-address=127.0.0.1:%d", sst),
		`wsrep-provider-options="` + opts + `"`,
		"wsrep-slave-threads=2",
		"",
	}, "\n")
}

func (g *Galera) startNode(ctx context.Context, nd *GaleraNode, bootstrap bool, extra ...string) error {
	args := []string{"--defaults-file=" + nd.cfg}
	if bootstrap {
		args = append(args, "--wsrep-new-cluster")
	}
	args = append(args, extra...)
	cmd := exec.Command(mariadbd, args...)
	cmd.Dir = nd.Dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	p, err := Start(fmt.Sprintf("galera node %d", nd.Index), "mysql", filepath.Join(nd.Dir, "stdout.log"), cmd)
	if err != nil {
		return err
	}
	nd.proc.Store(p)
	return nil
}

// waitSynced waits until node i is Synced in a primary component of at
// least size nodes.
func (g *Galera) waitSynced(ctx context.Context, i, size int) error {
	nd := g.Nodes[i-1]
	var last error
	for {
		last = g.synced(ctx, i, size)
		if last == nil {
			return nil
		}
		select {
		case <-nd.Proc().Exited():
			return fmt.Errorf("topology: galera node %d exited while starting: %s", i, g.errorLog(nd, 15))
		case <-ctx.Done():
			return fmt.Errorf("topology: galera node %d not synced: %v (%w); log: %s", i, last, ctx.Err(), g.errorLog(nd, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (g *Galera) synced(ctx context.Context, i, size int) error {
	db, err := g.open(i, "mysql")
	if err != nil {
		return err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	status := map[string]string{}
	rows, err := db.QueryContext(qctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_size','wsrep_local_state_comment','wsrep_cluster_status','wsrep_ready')")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return err
		}
		status[k] = v
	}
	if err := rows.Err(); err != nil {
		return err
	}
	n, _ := strconv.Atoi(status["wsrep_cluster_size"])
	if status["wsrep_local_state_comment"] != "Synced" || status["wsrep_cluster_status"] != "Primary" ||
		status["wsrep_ready"] != "ON" || n < size {
		return fmt.Errorf("state %q, cluster %q, ready %q, size %d (want Synced, Primary, ON, %d)",
			status["wsrep_local_state_comment"], status["wsrep_cluster_status"], status["wsrep_ready"], n, size)
	}
	return nil
}

func (g *Galera) waitDatabase(ctx context.Context, i int) error {
	for {
		db, err := g.open(i, "test")
		if err == nil {
			err = db.PingContext(ctx)
			db.Close()
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topology: galera node %d: database test: %v (%w)", i, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (g *Galera) open(i int, database string) (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", g.Nodes[i-1].Port), database
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 2*time.Second, 5*time.Second, 5*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

func (g *Galera) errorLog(nd *GaleraNode, n int) string {
	b, err := os.ReadFile(filepath.Join(nd.Dir, "error.log"))
	if err != nil {
		return nd.Proc().Tail(n)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// DSN returns conveyor's DSN of node i (1 to N), database test.
func (g *Galera) DSN(i int) string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/test", g.Nodes[i-1].Port)
}

// DSNs returns every node's DSN, node 1 first.
func (g *Galera) DSNs() []string {
	var out []string
	for i := range g.Nodes {
		out = append(out, g.DSN(i+1))
	}
	return out
}

// NextDSN returns the DSN of the next node, round robin over the
// cluster: callers that open one client each spread over the nodes.
func (g *Galera) NextDSN() string {
	i := g.next.Add(1) - 1
	return g.DSN(int(i%uint64(len(g.Nodes))) + 1)
}

// Pid returns the PID of node i's mariadbd, or 0 when it is not running.
func (g *Galera) Pid(i int) int {
	p := g.Nodes[i-1].Proc()
	if p == nil {
		return 0
	}
	select {
	case <-p.Exited():
		return 0
	default:
	}
	return p.Pid()
}

// KillNode kills node i's mariadbd with SIGKILL and waits for it to exit:
// its clients lose their connections, the other nodes evict it from the
// cluster after the evs timeouts (a few seconds) and go on.
func (g *Galera) KillNode(i int) {
	if p := g.Nodes[i-1].Proc(); p != nil {
		p.Kill()
	}
}

// RestartNode starts node i again after KillNode, as the packaged
// service does after a crash: it first recovers the node's last committed
// position from InnoDB (mariadbd --wsrep-recover; a killed node's
// grastate.dat does not have it), then starts it at that position, so
// that it rejoins by an incremental state transfer from a donor's gcache
// (a full rsync one when the gcache no longer has what it missed), and
// waits until it is Synced. The whole is bounded by GaleraStartTimeout.
// It fails once Stop has been called.
func (g *Galera) RestartNode(ctx context.Context, i int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return fmt.Errorf("topology: galera node %d: cluster stopped", i)
	}
	nd := g.Nodes[i-1]
	if g.Pid(i) != 0 {
		return fmt.Errorf("topology: galera node %d is running", i)
	}
	ctx, cancel := context.WithTimeout(ctx, GaleraStartTimeout)
	defer cancel()
	pos, err := g.recoverPosition(ctx, nd)
	if err != nil {
		return err
	}
	if err := g.startNode(ctx, nd, false, "--wsrep-start-position="+pos); err != nil {
		return err
	}
	return g.waitSynced(ctx, i, 1)
}

// recoverPosition runs mariadbd --wsrep-recover on a stopped node and
// returns the position it reports (cluster UUID:seqno).
func (g *Galera) recoverPosition(ctx context.Context, nd *GaleraNode) (string, error) {
	logFile := filepath.Join(nd.Dir, "recover.log")
	_ = os.Remove(logFile)
	if err := runAsMySQL(ctx, nd.Dir, mariadbd, "--defaults-file="+nd.cfg, "--wsrep-recover", "--log-error="+logFile); err != nil {
		return "", fmt.Errorf("topology: galera node %d: recover position: %w", nd.Index, err)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		return "", fmt.Errorf("topology: galera node %d: recover position: %w", nd.Index, err)
	}
	const mark = "WSREP: Recovered position: "
	for _, line := range strings.Split(string(b), "\n") {
		if _, pos, ok := strings.Cut(line, mark); ok {
			return strings.TrimSpace(pos), nil
		}
	}
	return "", fmt.Errorf("topology: galera node %d: mariadbd --wsrep-recover reported no position: %s", nd.Index, b)
}

// WaitSize waits until every running node is Synced in a cluster of
// size nodes, up to timeout: after KillNode, the survivors' view
// shrinks; after RestartNode, it grows back.
func (g *Galera) WaitSize(ctx context.Context, size int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i := range g.Nodes {
		if g.Pid(i+1) == 0 {
			continue
		}
		for {
			err := g.synced(ctx, i+1, size)
			if err == nil {
				if n := g.size(ctx, i+1); n == size {
					break
				} else {
					err = fmt.Errorf("cluster size %d", n)
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("topology: galera node %d: not in a cluster of %d: %v (%w)", i+1, size, err, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func (g *Galera) size(ctx context.Context, i int) int {
	db, err := g.open(i, "mysql")
	if err != nil {
		return -1
	}
	defer db.Close()
	var k string
	var n int
	if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'").Scan(&k, &n); err != nil {
		return -1
	}
	return n
}

// Stop stops every node and removes the cluster's directories. It may
// be called more than once. It waits for a RestartNode under way to end
// and makes later ones fail, so no node outlives it.
func (g *Galera) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	var wg sync.WaitGroup
	for _, nd := range g.Nodes {
		if p := nd.Proc(); p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.Stop(10 * time.Second) }()
		}
	}
	wg.Wait()
	if g.dir != "" {
		os.RemoveAll(g.dir)
	}
}

func chownMySQL(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	cred, err := Credential("mysql")
	if err != nil {
		return err
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// runAsMySQL runs a command to completion as the mysql user, bounded by
// ctx.
func runAsMySQL(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	if os.Geteuid() == 0 {
		cred, err := Credential("mysql")
		if err != nil {
			return err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		s := strings.TrimSpace(string(out))
		if len(s) > 2000 {
			s = s[len(s)-2000:]
		}
		return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, s)
	}
	return nil
}
