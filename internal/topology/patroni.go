package topology

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PatroniOptions configures StartPatroni; zero fields take the defaults.
type PatroniOptions struct {
	// Nodes is how many Patroni nodes to run (default 3; at least 2).
	Nodes int
	// TTL, LoopWait and RetryTimeout are Patroni's leader key TTL, loop
	// interval and DCS retry timeout, in seconds (defaults 10, 1 and 4:
	// a lost primary is replaced within about TTL seconds).
	TTL, LoopWait, RetryTimeout int
	// StartTimeout bounds the start of the whole cluster (default 90s).
	StartTimeout time.Duration
}

func (o *PatroniOptions) defaults() {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 2 {
		o.Nodes = 2
	}
	if o.TTL == 0 {
		o.TTL = 10
	}
	if o.LoopWait == 0 {
		o.LoopWait = 1
	}
	if o.RetryTimeout == 0 {
		o.RetryTimeout = 4
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
}

// PatroniNode is one Patroni-managed PostgreSQL server of a cluster.
type PatroniNode struct {
	// Name is the node's Patroni member name ("node1").
	Name string
	// PGPort is the port PostgreSQL listens on (127.0.0.1).
	PGPort int
	// REST is the base URL of the node's Patroni REST API.
	REST string
	// DataDir is the node's PostgreSQL data directory.
	DataDir string

	proc *Proc
}

// Patroni is a running cluster: one etcd and Patroni nodes with
// synchronous replication (synchronous_mode: true), all on loopback.
type Patroni struct {
	// Scope is the cluster's name in the DCS.
	Scope string
	// Nodes are the cluster's nodes, in start order.
	Nodes []*PatroniNode

	opts PatroniOptions
	dir  string
	etcd *Proc
}

// NeedPatroni ends tb unless Patroni and etcd are installed.
func NeedPatroni(tb testing.TB) {
	tb.Helper()
	Need(tb, "patroni", "/usr/bin/patroni")
	Need(tb, "etcd-server", "/usr/bin/etcd")
	if _, err := PostgresBin(); err != nil {
		Need(tb, "postgresql", "/usr/lib/postgresql/15/bin/postgres")
	}
}

// StartPatroniT starts a cluster for tb (see StartPatroni), stops it in
// tb's cleanup, and ends tb when it cannot start.
func StartPatroniT(tb testing.TB, opts PatroniOptions) *Patroni {
	tb.Helper()
	NeedPatroni(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := StartPatroni(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// StartPatroni starts etcd and opts.Nodes Patroni nodes, and returns once
// a leader accepts writes, every other node streams from it with one of
// them the synchronous standby, and the database "test" exists. On an
// error it stops whatever it started.
func StartPatroni(ctx context.Context, opts PatroniOptions) (c *Patroni, err error) {
	opts.defaults()
	bin, err := PostgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := TempDir("conveyor-patroni-", "postgres")
	if err != nil {
		return nil, err
	}
	c = &Patroni{Scope: "conveyor", opts: opts, dir: dir}
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	clientPort, err := FreePort()
	if err != nil {
		return c, err
	}
	peerPort, err := FreePort()
	if err != nil {
		return c, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	c.etcd, err = Start("etcd", "postgres", filepath.Join(dir, "etcd.log"), exec.Command("/usr/bin/etcd",
		"--name", "etcd0", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcd0="+peer, "--initial-cluster-state", "new",
		"--enable-v2=true"))
	if err != nil {
		return c, err
	}
	if err := WaitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", clientPort), 20*time.Second); err != nil {
		return c, fmt.Errorf("%w\n%s", err, c.etcd.Tail(20))
	}

	for i := 1; i <= opts.Nodes; i++ {
		pgPort, err := FreePort()
		if err != nil {
			return c, err
		}
		restPort, err := FreePort()
		if err != nil {
			return c, err
		}
		n := &PatroniNode{
			Name:    fmt.Sprintf("node%d", i),
			PGPort:  pgPort,
			REST:    fmt.Sprintf("http://127.0.0.1:%d", restPort),
			DataDir: filepath.Join(dir, fmt.Sprintf("node%d", i), "data"),
		}
		nodeDir := filepath.Dir(n.DataDir)
		if err := os.MkdirAll(nodeDir, 0o700); err != nil {
			return c, err
		}
		if cred, err := Credential("postgres"); err == nil && os.Geteuid() == 0 {
			_ = os.Chown(nodeDir, int(cred.Uid), int(cred.Gid))
		}
		cfgFile := filepath.Join(nodeDir, "patroni.yml")
		if err := os.WriteFile(cfgFile, []byte(c.nodeConfig(n, clientPort, restPort, bin)), 0o644); err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
		if err := c.startNode(n); err != nil {
			return c, err
		}
		if i == 1 {
			// Let the first node bootstrap the cluster alone; the others
			// then clone it.
			if _, err := c.waitLeader(ctx, ""); err != nil {
				return c, err
			}
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return c, err
	}
	conn, err := c.connect(ctx, "postgres")
	if err != nil {
		return c, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE test"); err != nil {
		return c, fmt.Errorf("topology: patroni: create database test: %w", err)
	}
	return c, nil
}

// nodeConfig is the YAML configuration of node n (JSON is YAML).
func (c *Patroni) nodeConfig(n *PatroniNode, etcdPort, restPort int, bin string) string {
	hba := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication all 127.0.0.1/32 trust",
	}
	cfg := map[string]any{
		"scope": c.Scope,
		"name":  n.Name,
		"log":   map[string]any{"level": "INFO"},
		"restapi": map[string]any{
			"listen":          fmt.Sprintf("127.0.0.1:%d", restPort),
			"connect_address": fmt.Sprintf("127.0.0.1:%d", restPort),
		},
		"etcd3": map[string]any{"hosts": fmt.Sprintf("127.0.0.1:%d", etcdPort)},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     c.opts.TTL,
				"loop_wait":               c.opts.LoopWait,
				"retry_timeout":           c.opts.RetryTimeout,
				"maximum_lag_on_failover": 16 << 20,
				"synchronous_mode":        true,
				// A primary whose postmaster died is replaced by the
				// synchronous standby at once rather than restarted in
				// place.
				"primary_start_timeout": 0,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						"wal_level":       "replica",
						"hot_standby":     "on",
						"wal_log_hints":   "on",
						"max_connections": 200,
						"max_wal_senders": 10,
						"fsync":           "off",
					},
				},
			},
			"initdb": []any{map[string]any{"encoding": "UTF8"}, map[string]any{"auth": "trust"}},
		},
		"postgresql": map[string]any{
			"listen":          fmt.Sprintf("127.0.0.1:%d", n.PGPort),
			"connect_address": fmt.Sprintf("127.0.0.1:%d", n.PGPort),
			"data_dir":        n.DataDir,
			"bin_dir":         bin,
			"pgpass":          filepath.Join(filepath.Dir(n.DataDir), "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": "postgres", "password": "postgres"},
				"replication": map[string]any{"username": "replicator", "password": "replicator"},
				"rewind":      map[string]any{"username": "postgres", "password": "postgres"},
			},
			"parameters": map[string]any{
				"unix_socket_directories": filepath.Dir(n.DataDir),
			},
			"pg_hba": hba,
		},
		"tags": map[string]any{"nofailover": false, "noloadbalance": false, "clonefrom": false, "nosync": false},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	return string(b)
}

// startNode starts n's Patroni (which starts its PostgreSQL).
func (c *Patroni) startNode(n *PatroniNode) error {
	cmd := exec.Command("/usr/bin/patroni", filepath.Join(filepath.Dir(n.DataDir), "patroni.yml"))
	cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(n.DataDir))
	p, err := Start("patroni "+n.Name, "postgres", filepath.Join(filepath.Dir(n.DataDir), "patroni.log"), cmd)
	if err != nil {
		return err
	}
	n.proc = p
	return nil
}

// DSN returns a multi-host URL of every node with
// target_session_attrs=read-write: a client connects to whichever node
// is the primary.
func (c *Patroni) DSN(database string) string {
	hosts := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.PGPort)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?target_session_attrs=read-write&sslmode=disable&connect_timeout=3", strings.Join(hosts, ","), database)
}

// NodeDSN returns the URL of one node alone.
func (n *PatroniNode) NodeDSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=3", n.PGPort, database)
}

// RESTEndpoints returns every node's REST API base URL.
func (c *Patroni) RESTEndpoints() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.REST
	}
	return out
}

// DataDirs returns every node's data directory, in the order of
// RESTEndpoints.
func (c *Patroni) DataDirs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.DataDir
	}
	return out
}

// connect connects to the current primary's database.
func (c *Patroni) connect(ctx context.Context, database string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, c.DSN(database))
	if err != nil {
		return nil, fmt.Errorf("topology: patroni: connect to the primary: %w", err)
	}
	return conn, nil
}

// PatroniMember is a node as Patroni's GET /cluster reports it.
type PatroniMember struct {
	Name  string `json:"name"`
	Role  string `json:"role"`  // leader, sync_standby, replica
	State string `json:"state"` // running, streaming, stopped, ...
	Port  int    `json:"port"`
	Lag   any    `json:"lag"`
}

// replicating reports whether a standby member streams from the leader
// (Patroni 3.0 reports a streaming standby "running" with a numeric lag;
// later versions "streaming").
func (m PatroniMember) replicating() bool {
	if m.State == "streaming" {
		return true
	}
	_, numeric := m.Lag.(float64)
	return m.State == "running" && numeric
}

// Members returns the cluster's members as any reachable node's REST
// API reports them.
func (c *Patroni) Members(ctx context.Context) ([]PatroniMember, error) {
	return PatroniMembers(ctx, c.RESTEndpoints())
}

// PatroniMembers asks the REST APIs at rest, in turn, for the cluster's
// members (GET /cluster), and returns the first answer.
func PatroniMembers(ctx context.Context, rest []string) ([]PatroniMember, error) {
	var last error = errors.New("no REST endpoint")
	for _, r := range rest {
		var out struct {
			Members []PatroniMember `json:"members"`
		}
		if err := restJSON(ctx, http.MethodGet, r+"/cluster", nil, &out); err != nil {
			last = err
			continue
		}
		return out.Members, nil
	}
	return nil, fmt.Errorf("topology: patroni: cluster state: %w", last)
}

// restJSON sends a request with a JSON body (nil: none) and decodes a
// JSON answer into out (nil: ignored), within 5 seconds.
func restJSON(ctx context.Context, method, url string, body, out any) error {
	// Patroni answers POST /switchover only once the switchover is done,
	// which takes seconds on a busy machine; a read answers at once.
	timeout := 5 * time.Second
	if method == http.MethodPost {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// Leader returns the node that holds the leader key and runs as primary,
// or an error when there is none at the moment.
func (c *Patroni) Leader(ctx context.Context) (*PatroniNode, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return c.node(m.Name)
		}
	}
	return nil, errors.New("topology: patroni: no running leader")
}

func (c *Patroni) node(name string) (*PatroniNode, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("topology: patroni: no node %q", name)
}

// waitLeader waits (bounded by ctx) for a running leader other than
// not, that accepts writes.
func (c *Patroni) waitLeader(ctx context.Context, not string) (*PatroniNode, error) {
	var last error
	for {
		n, err := c.Leader(ctx)
		if err == nil && n.Name != not {
			if err = canWrite(ctx, n); err == nil {
				return n, nil
			}
		} else if err == nil {
			err = fmt.Errorf("topology: patroni: %s still leads", not)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("topology: patroni: no new leader: %w (%v)\n%s", ctx.Err(), last, c.tails())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// canWrite checks that n's server accepts connections and is not in
// recovery.
func canWrite(ctx context.Context, n *PatroniNode) error {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, n.NodeDSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var rec bool
	if err := conn.QueryRow(cctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
		return err
	}
	if rec {
		return fmt.Errorf("topology: patroni: %s is in recovery", n.Name)
	}
	return nil
}

// WaitHealthy waits, up to the start timeout, for a writable leader with
// a synchronous standby and every other running node streaming.
func (c *Patroni) WaitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	var last string
	for {
		ms, err := c.Members(ctx)
		if err == nil {
			leader, sync, streaming := "", 0, 0
			for _, m := range ms {
				switch {
				case m.Role == "leader" && m.State == "running":
					leader = m.Name
				case m.Role == "sync_standby" && m.replicating():
					sync++
					streaming++
				case m.replicating():
					streaming++
				}
			}
			live := c.liveNodes()
			if leader != "" && sync >= 1 && streaming >= live-1 && len(ms) >= live {
				n, _ := c.node(leader)
				if n != nil && canWrite(ctx, n) == nil {
					return nil
				}
			}
			last = fmt.Sprintf("%+v", ms)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topology: patroni: cluster not healthy: %w (members %s)\n%s", ctx.Err(), last, c.tails())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// liveNodes counts the nodes whose Patroni runs.
func (c *Patroni) liveNodes() int {
	live := 0
	for _, n := range c.Nodes {
		if n.proc == nil {
			continue
		}
		select {
		case <-n.proc.Exited():
		default:
			live++
		}
	}
	return live
}

// Switchover has Patroni hand the primary role to a synchronous standby
// (REST POST /switchover) and waits, up to timeout, until another node
// leads and accepts writes. It returns the old and the new leader.
func (c *Patroni) Switchover(ctx context.Context, timeout time.Duration) (old, new *PatroniNode, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	old, err = c.Leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := PatroniSwitchover(ctx, c.RESTEndpoints()); err != nil {
		return old, nil, err
	}
	new, err = c.waitLeader(ctx, old.Name)
	return old, new, err
}

// PatroniSwitchover asks the cluster behind the REST APIs at rest to
// switch its primary over to a synchronous standby (POST /switchover on
// the leader's node, naming the leader and the candidate), and returns
// once Patroni accepted (it then runs the switchover).
func PatroniSwitchover(ctx context.Context, rest []string) error {
	ms, err := PatroniMembers(ctx, rest)
	if err != nil {
		return err
	}
	leader, candidate := "", ""
	for _, m := range ms {
		switch m.Role {
		case "leader":
			leader = m.Name
		case "sync_standby":
			if candidate == "" {
				candidate = m.Name
			}
		}
	}
	if leader == "" || candidate == "" {
		return fmt.Errorf("topology: patroni: switchover: no leader or no synchronous standby in %+v", ms)
	}
	var last error
	for _, r := range rest {
		// Any node forwards nothing: ask each; the leader's accepts.
		err := restJSON(ctx, http.MethodPost, r+"/switchover", map[string]string{"leader": leader, "candidate": candidate}, nil)
		if err == nil {
			return nil
		}
		last = err
	}
	return fmt.Errorf("topology: patroni: switchover %s -> %s: %w", leader, candidate, last)
}

// KillPrimary kills the primary's postmaster with SIGKILL (its Patroni
// stays up and, with primary_start_timeout 0, hands the leader key to the
// synchronous standby), and waits, up to timeout, until another node
// leads and accepts writes, asking for the failover itself if Patroni
// has not made it by half the timeout. It returns the old and the new
// leader.
func (c *Patroni) KillPrimary(ctx context.Context, timeout time.Duration) (old, new *PatroniNode, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	old, err = c.Leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	sync, err := c.syncStandby(ctx)
	if err != nil {
		return old, nil, err
	}
	if err := KillPostmaster(old.DataDir); err != nil {
		return old, nil, err
	}
	// Patroni hands the key over only when it finds the synchronous
	// standby healthy through its REST API at once; on a starved machine
	// that check can time out, and Patroni then restarts PostgreSQL in
	// place and keeps the key. After half the timeout the failover it
	// would have made is asked for (POST /failover to the standby that
	// was synchronous when the postmaster was killed).
	half, cancelHalf := context.WithTimeout(ctx, timeout/2)
	new, err = c.waitLeader(half, old.Name)
	cancelHalf()
	if err == nil {
		return old, new, nil
	}
	if ferr := PatroniFailover(ctx, c.RESTEndpoints(), sync); ferr != nil {
		return old, nil, fmt.Errorf("%w; then %v", err, ferr)
	}
	new, err = c.waitLeader(ctx, old.Name)
	return old, new, err
}

// syncStandby returns the name of the cluster's synchronous standby.
func (c *Patroni) syncStandby(ctx context.Context) (string, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "sync_standby" {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("topology: patroni: no synchronous standby in %+v", ms)
}

// PatroniFailover asks the cluster behind the REST APIs at rest to fail
// over to candidate (POST /failover), trying each node until one accepts.
func PatroniFailover(ctx context.Context, rest []string, candidate string) error {
	var last error = errors.New("no REST endpoint")
	for _, r := range rest {
		err := restJSON(ctx, http.MethodPost, r+"/failover", map[string]string{"candidate": candidate}, nil)
		if err == nil {
			return nil
		}
		last = err
	}
	return fmt.Errorf("topology: patroni: failover to %s: %w", candidate, last)
}

// KillPostmaster sends SIGKILL to the postmaster whose PID the data
// directory's postmaster.pid names.
func KillPostmaster(dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("topology: kill postmaster: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		return fmt.Errorf("topology: kill postmaster: %s/postmaster.pid names no PID: %q", dataDir, line)
	}
	// A stale file may name a PID since reused: kill only a process whose
	// command line names this data directory.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(dataDir)) {
		return fmt.Errorf("topology: kill postmaster: PID %d of %s/postmaster.pid is not its postmaster", pid, dataDir)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("topology: kill postmaster %d: %w", pid, err)
	}
	return nil
}

// tails returns the end of every node's log, for error messages.
func (c *Patroni) tails() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		if n.proc != nil {
			fmt.Fprintf(&b, "--- %s:\n%s\n", n.Name, n.proc.Tail(15))
		}
	}
	return b.String()
}

// Stop stops every node (Patroni stops its PostgreSQL; the process group
// is killed after a grace), then etcd, and removes the cluster's
// directory. It may be called more than once.
func (c *Patroni) Stop() {
	for _, n := range c.Nodes {
		if n.proc != nil {
			n.proc.Stop(10 * time.Second)
		}
	}
	// A postmaster that outlived its Patroni (it runs in Patroni's
	// process group, so only one started by a later Patroni could).
	for _, n := range c.Nodes {
		_ = KillPostmaster(n.DataDir)
	}
	if c.etcd != nil {
		c.etcd.Stop(5 * time.Second)
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}
