package conveyor_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/web"
)

// commitCutter is a TCP proxy in front of a database server that, once
// armed with a pattern, passes on the client's next write that contains
// it, then cuts that connection: the server runs (and commits) what it
// was sent, and the client never hears so. Armed with a marker as well,
// it cuts only the connection that sent the marker first (the call's
// own, where its arguments went), at its next write with the pattern: a
// COMMIT of another transaction of the client (on a loaded machine one
// can come in between) is passed on.
type commitCutter struct {
	ln      net.Listener
	target  string
	commit  []byte // the COMMIT message's bytes in the client's protocol
	armedAt atomic.Pointer[arming]
	conns   atomic.Int64  // connections accepted, numbering them
	ended   chan struct{} // a connection that was cut has ended on the server's side
	wg      sync.WaitGroup
}

// newCommitCutter proxies dsn's server and returns dsn through the proxy.
func newCommitCutter(t *testing.T, dsn string) (*commitCutter, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, target: u.Host, ended: make(chan struct{}, 8)}
	if u.Scheme == "mysql" {
		p.commit = []byte("\x03COMMIT") // COM_QUERY "COMMIT" (go-sql-driver)
	} else {
		p.commit = []byte("Q\x00\x00\x00\x0bcommit\x00") // simple query "commit" (pgx)
	}
	u.Host = ln.Addr().String()
	if u.Scheme != "mysql" {
		// The proxy reads the protocol: no TLS through it, whatever the
		// DSN given asks for (pgx's default, prefer, would encrypt).
		q := u.Query()
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p, u.String()
}

// pgCancel begins a PostgreSQL cancel request.
var pgCancel = []byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e}

// arming is what the proxy is armed with (see commitCutter): owner is
// the number of the connection that sent the marker first (0: none yet).
type arming struct {
	marker, pattern []byte
	owner           atomic.Int64
}

// arm makes the proxy cut the next connection that sends pattern; with a
// marker, the first connection that sends the marker, when it then sends
// pattern.
func (p *commitCutter) arm(marker, pattern []byte) {
	p.armedAt.Store(&arming{marker: marker, pattern: pattern})
}

// armed reports whether the cut is still to come.
func (p *commitCutter) armed() bool { return p.armedAt.Load() != nil }

func (p *commitCutter) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		var cut atomic.Bool
		id := p.conns.Add(1)
		p.wg.Add(2)
		go func() { // server to client
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			if cut.Load() {
				// Until the server closes its side, which it does
				// after the COMMIT, having read the end of the stream.
				_, _ = io.Copy(io.Discard, s)
				p.ended <- struct{}{}
			}
			c.Close()
			s.Close()
		}()
		go func() { // client to server, watching for COMMIT
			defer p.wg.Done()
			defer s.(*net.TCPConn).CloseWrite()
			buf := make([]byte, 1<<20)
			var tail []byte
			first := true
			for {
				n, err := c.Read(buf)
				if first && n >= 8 && bytes.Equal(buf[:8], pgCancel) {
					// pgx cancels the statement of a connection it lost:
					// the server is to run what it was sent.
					c.Close()
					return
				}
				first = false
				if n > 0 {
					seen := append(tail, buf[:n]...)
					a := p.armedAt.Load()
					if a != nil && a.marker != nil && bytes.Contains(seen, a.marker) {
						a.owner.CompareAndSwap(0, id)
					}
					if a != nil && (a.marker == nil || a.owner.Load() == id) && bytes.Contains(seen, a.pattern) && p.armedAt.CompareAndSwap(a, nil) {
						// The client's side goes first: once the server
						// has what was sent, its answer could otherwise
						// reach the client before the cut (on a loaded
						// machine this goroutine may wait that long
						// between the two). The server reads what was
						// sent, then the end of the stream.
						cut.Store(true)
						c.Close()
						_, _ = s.Write(buf[:n])
						return
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						c.Close()
						return
					}
					tail = append(tail[:0], seen[max(0, len(seen)-64):]...)
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestEnqueueCommitLostSaysJobsMayExist: the connection of an enqueue is
// lost right after its commit was sent (its COMMIT, or the statement that
// commits on its own): Enqueue through the group-commit writer, of a
// plain job and of a unique one, EnqueueBulk, EnqueueBatch and
// EnqueueWorkflow. The jobs are written; the caller cannot know, and its
// error must say they may exist rather than that none was inserted, or
// read as a plain failure.
func TestEnqueueCommitLostSaysJobsMayExist(t *testing.T) {
	for _, b := range backends {
		if b.name != "postgres" && b.name != "mysql" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dsn := b.dsn(t)
			cut, via := newCommitCutter(t, dsn)
			c := openDropped(t, via, fast(testdb.Prefix()))
			calls := []struct {
				name    string
				marker  []byte // the call's arguments: its connection (nil: any)
				pattern []byte // what the proxy cuts after
				jobs    int
				call    func() error
			}{
				// A plain job goes through the group-commit writer, in
				// one statement committing on its own: cut once its
				// arguments are sent.
				{"enqueue", nil, []byte("cut-me"), 1, func() error {
					_, err := c.Enqueue(ctx, tagged{"cut-me"}, nil)
					return err
				}},
				// Unique jobs, through the writer in a transaction.
				{"unique", []byte("cut-unique"), cut.commit, 1, func() error {
					_, err := c.Enqueue(ctx, tagged{"cut-unique"}, &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}})
					return err
				}},
				{"bulk", []byte("cut-bulk-1"), cut.commit, 2, func() error {
					_, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: tagged{"cut-bulk-1"}}, {Args: tagged{"cut-bulk-2"}}})
					return err
				}},
				{"batch", []byte("cut-batch-m1"), cut.commit, 1, func() error {
					_, _, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: tagged{"cut-batch-m1"}}}, conveyor.EnqueueItem{Args: tagged{"cb"}})
					return err
				}},
				{"workflow", []byte("cut-wf-w1"), cut.commit, 1, func() error {
					_, err := c.EnqueueWorkflow(ctx, []conveyor.WorkflowJob{{Name: "a", Args: tagged{"cut-wf-w1"}}, {Name: "b", Args: tagged{"w2"}, DependsOn: []string{"a"}}}, nil)
					return err
				}},
			}
			total := 0
			for _, call := range calls {
				cut.arm(call.marker, call.pattern)
				err := call.call()
				if cut.armed() {
					t.Fatalf("%s: no COMMIT went through the proxy (error %v)", call.name, err)
				}
				select {
				case <-cut.ended:
				case <-ctx.Done():
					t.Fatalf("%s: the server kept the cut connection open", call.name)
				}
				total += call.jobs
				if n := totalJobs(t, c); n != int64(total) {
					t.Fatalf("%s: %d jobs after the cut commit, want %d (the commit went through)", call.name, n, total)
				}
				if !errors.Is(err, conveyor.ErrUnconfirmed) || !strings.Contains(err.Error(), "may exist") {
					t.Errorf("%s: the commit's answer was lost, the jobs exist; got error %v, want ErrUnconfirmed saying they may exist", call.name, err)
				}
			}
		})
	}
}

// TestHTTPEnqueueCommitLostSaysJobsMayExist: an enqueue over the HTTP API
// whose commit lost its answer (as in TestEnqueueCommitLostSaysJobsMayExist)
// is answered with an error saying the jobs may exist, not "internal
// error", which a client would take for a failure and send again.
func TestHTTPEnqueueCommitLostSaysJobsMayExist(t *testing.T) {
	for _, b := range backends {
		if b.name != "postgres" && b.name != "mysql" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cut, via := newCommitCutter(t, b.dsn(t))
			c := openDropped(t, via, fast(testdb.Prefix()))
			h, err := web.New(c, web.Options{InsecureLoopbackDev: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			for _, call := range []struct {
				name, path, body string
				marker, pattern  []byte
			}{
				{"one", "/api/v1/jobs", `{"kind":"tagged","args":{"tag":"cut-me-http"}}`, nil, []byte("cut-me-http")},
				{"batch", "/api/v1/jobs/batch", `{"jobs":[{"kind":"tagged","args":{"tag":"cut-http-u"},"unique":{"by_args":true}}]}`, []byte("cut-http-u"), cut.commit},
			} {
				cut.arm(call.marker, call.pattern)
				r := httptest.NewRequestWithContext(ctx, "POST", "http://localhost"+call.path, strings.NewReader(call.body))
				r.Header.Set("Content-Type", "application/json")
				r.RemoteAddr = "127.0.0.1:1234"
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if cut.armed() {
					t.Fatalf("%s: nothing was cut: %d %s", call.name, w.Code, w.Body)
				}
				<-cut.ended
				if w.Code < 500 || !strings.Contains(w.Body.String(), "may or may not exist") {
					t.Errorf("%s: the commit's answer was lost: got %d %s, want a 5xx saying the jobs may exist", call.name, w.Code, w.Body)
				}
			}
		})
	}
}
