package torture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PatroniCluster names the Patroni cluster behind the run's DSN (a
// multi-host postgres:// URL with target_session_attrs=read-write), for
// the switchover and failover faults.
type PatroniCluster struct {
	// REST are the base URLs of every node's Patroni REST API
	// ("http://127.0.0.1:8008"), on loopback hosts (Run refuses others).
	REST []string
	// DataDirs are the nodes' PostgreSQL data directories, in the order
	// of REST: the failover fault kills the postmaster that the
	// primary's postmaster.pid names.
	DataDirs []string
}

// Fault event kinds of a Patroni cluster (PID 0: every process was cut
// off from the primary): like a restart, either may lose a claim that
// committed asynchronously on the old primary (see claimLost).
const (
	// EventSwitchover: Patroni switched the primary over to the
	// synchronous standby.
	EventSwitchover = "primary switched over"
	// EventFailover: the primary's postmaster was killed and Patroni
	// promoted the synchronous standby.
	EventFailover = "primary failed over"
)

// patroniFaultTimeout bounds a switchover or failover, from the request
// to a new primary that accepts writes through the DSN.
const patroniFaultTimeout = 90 * time.Second

// checkREST refuses a REST URL that is not an http(s) URL on a loopback
// host, as checkLoopback refuses a database elsewhere: the switchover
// fault POSTs /switchover to these URLs.
func (c *PatroniCluster) checkREST() error {
	for _, r := range c.REST {
		u, err := url.Parse(r)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("torture: Patroni REST API URL %q: want http://host:port", r)
		}
		if !loopbackHost(u.Hostname()) {
			return fmt.Errorf("torture: Patroni REST API URL %q: the cluster must be on a loopback address (127.0.0.1, ::1 or localhost): the suite switches its primary over and kills it", r)
		}
	}
	return nil
}

// patroniMember is a node as GET /cluster reports it.
type patroniMember struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	State string `json:"state"`
	Lag   any    `json:"lag"`
	// APIURL is the member's REST API ("http://127.0.0.1:8008/patroni").
	APIURL string `json:"api_url"`
}

// members asks the REST APIs, in turn, for the cluster's members.
func (c *PatroniCluster) members(ctx context.Context) ([]patroniMember, int, error) {
	var last error = errors.New("no REST endpoint")
	for i, r := range c.REST {
		var out struct {
			Members []patroniMember `json:"members"`
		}
		if err := restCall(ctx, http.MethodGet, r+"/cluster", nil, &out); err != nil {
			last = err
			continue
		}
		return out.Members, i, nil
	}
	return nil, -1, fmt.Errorf("patroni cluster state: %w", last)
}

// leader returns the running leader's name and the index of its node in
// REST and DataDirs, and a synchronous standby's name ("" when none
// streams).
func (c *PatroniCluster) leader(ctx context.Context) (leader string, idx int, sync string, err error) {
	ms, _, err := c.members(ctx)
	if err != nil {
		return "", -1, "", err
	}
	for _, m := range ms {
		switch {
		case m.Role == "leader" && m.State == "running":
			leader = m.Name
		case m.Role == "sync_standby" && (m.State == "streaming" || m.State == "running"):
			if _, numeric := m.Lag.(float64); numeric || m.State == "streaming" {
				sync = m.Name
			}
		}
	}
	if leader == "" {
		return "", -1, sync, fmt.Errorf("patroni: no running leader in %+v", ms)
	}
	for _, m := range ms {
		if m.Name != leader {
			continue
		}
		for i, r := range c.REST {
			if strings.HasPrefix(m.APIURL, strings.TrimRight(r, "/")+"/") {
				return leader, i, sync, nil
			}
		}
	}
	return leader, -1, sync, fmt.Errorf("patroni: the leader %s's REST API is none of %v", leader, c.REST)
}

// waitSync waits until the cluster has a running leader and a streaming
// synchronous standby (the previous fault's old primary may still be
// rejoining), and returns their names.
func (c *PatroniCluster) waitSync(ctx context.Context) (leader string, idx int, sync string, err error) {
	deadline := time.Now().Add(patroniFaultTimeout)
	for {
		leader, idx, sync, err = c.leader(ctx)
		if err == nil && sync != "" && idx >= 0 {
			return leader, idx, sync, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("leader %s without a streaming synchronous standby", leader)
			}
			return "", -1, "", fmt.Errorf("patroni: cluster not ready for a fault after %v: %w", patroniFaultTimeout, err)
		}
		sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
		if ctx.Err() != nil {
			return "", -1, "", ctx.Err()
		}
	}
}

// waitNewPrimary waits until a node other than old leads and the DSN
// reaches a server that accepts writes, and returns the new leader's
// name.
func (c *PatroniCluster) waitNewPrimary(ctx context.Context, dsn, old string, deadline time.Time) (string, error) {
	var last error
	for {
		leader, _, _, err := c.leader(ctx)
		if err == nil && leader != old {
			if err = writable(ctx, dsn); err == nil {
				return leader, nil
			}
		} else if err == nil {
			err = fmt.Errorf("%s still leads", old)
		}
		last = err
		if time.Now().After(deadline) {
			return "", fmt.Errorf("patroni: no new primary after %v: %w", patroniFaultTimeout, last)
		}
		sleepUntil(ctx, time.Now().Add(50*time.Millisecond))
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
}

// writable connects through dsn and checks that the server is not in
// recovery.
func writable(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var rec bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
		return err
	}
	if rec {
		return errors.New("the DSN reached a server in recovery")
	}
	return nil
}

// switchover asks the leader's REST API to hand the primary role to the
// synchronous standby.
func (c *PatroniCluster) switchover(ctx context.Context, leader string, idx int, sync string) error {
	return restCall(ctx, http.MethodPost, c.REST[idx]+"/switchover", map[string]string{"leader": leader, "candidate": sync}, nil)
}

// killPrimary sends SIGKILL to the postmaster of node idx.
func (c *PatroniCluster) killPrimary(idx int) error {
	if idx < 0 || idx >= len(c.DataDirs) {
		return fmt.Errorf("patroni: no data directory for node %d", idx)
	}
	dir := c.DataDirs[idx]
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("patroni: kill the primary: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		return fmt.Errorf("patroni: %s/postmaster.pid names no PID: %q", dir, line)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
		return fmt.Errorf("patroni: PID %d of %s/postmaster.pid is not its postmaster", pid, dir)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// restCall sends a request with a JSON body (nil: none) and decodes the
// JSON answer into out (nil: ignored), within 5 seconds.
func restCall(ctx context.Context, method, url string, body, out any) error {
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

// patroniFault makes the switchover or the failover fault.
func patroniFault(name, doc, kind string) *fault {
	return &fault{
		name:    name,
		doc:     doc,
		patroni: true,
		applies: func(b string) string {
			if b != "postgres" {
				return "a Patroni cluster runs PostgreSQL"
			}
			return ""
		},
		inject: func(ctx context.Context, p *phase) error { return injectPatroni(ctx, p, kind) },
		check:  checkPatroni,
	}
}

// injectPatroni switches the primary over or kills it, once the cluster
// has a synchronous standby, and waits for a new primary that accepts
// writes through the DSN.
func injectPatroni(ctx context.Context, p *phase, kind string) error {
	c := p.o.Patroni
	leader, idx, sync, err := c.waitSync(ctx)
	if err != nil {
		return err
	}
	// The fault begins now, not when the phase called inject: waitSync
	// may have waited long for a synchronous standby, and the figures
	// checkPatroni notes count from here.
	t0 := time.Now()
	p.faultStart = t0
	deadline := t0.Add(patroniFaultTimeout)
	var how string
	if kind == EventSwitchover {
		err = c.switchover(ctx, leader, idx, sync)
		how = fmt.Sprintf("Patroni switchover %s -> %s (REST POST /switchover)", leader, sync)
	} else {
		err = c.killPrimary(idx)
		how = fmt.Sprintf("kill -9 of %s's postmaster", leader)
	}
	if err != nil {
		p.faultEnd = time.Now()
		return fmt.Errorf("%s: %w", how, err)
	}
	nw, err := c.waitNewPrimary(ctx, p.dsn, leader, deadline)
	t1 := time.Now()
	p.sup.addEvent(Event{Kind: kind, Start: t0, End: t1})
	p.faultEnd = t1
	p.injected = append(p.injected, fmt.Sprintf("%s; %s accepts writes through the DSN after %.1fs", how, nw, t1.Sub(t0).Seconds()))
	return err
}

// checkPatroni checks that work flows again and LISTEN came back (see
// checkReconnect), and notes the time from the fault to the first job
// completed on the new primary: the end of the first successful
// execution whose handler began once the new primary accepted writes
// (its completion is written within the completer's batching after it).
func checkPatroni(ctx context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	checkReconnect(ctx, p, rs, fd, in)
	var first time.Time
	for _, e := range in.Execs {
		if e.Outcome == OutcomeOK && !e.Start.Before(p.faultEnd) && (first.IsZero() || e.End.Before(first)) {
			first = e.End
		}
	}
	if first.IsZero() {
		p.fail("no job was completed on the new primary")
		return
	}
	p.note("fault to first completion on the new primary: %.2fs (new primary writable after %.2fs)",
		first.Sub(p.faultStart).Seconds(), p.faultEnd.Sub(p.faultStart).Seconds())
}

// clusterEvent reports whether ev is a fault of the whole database (a
// restart, a switchover, a failover) that may lose a claim committed
// asynchronously.
func clusterEvent(kind string) bool {
	return slices.Contains([]string{EventDBRestart, EventSwitchover, EventFailover}, kind)
}
