package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/web"
)

// The HTTP workloads serve package web's handler in this process on a
// loopback listener, with a bearer token, and drive it with Go HTTP
// clients. http-enqueue and http-drain also run the same work in process,
// on fresh tables of the same backend in the same run, so that the two
// figures can be compared (Result.Phase "in-process" and "http").

// httpToken is the admin token of the bench's handler (loopback only).
const httpToken = "conveyor-bench-admin-token-0123456789"

// HTTPBatch is the jobs per request of http-enqueue (and per
// EnqueueMany call of its in-process run).
const HTTPBatch = 100

// webServer is the handler served on 127.0.0.1 and a client for it.
type webServer struct {
	base string
	h    *web.Handler
	srv  *http.Server
	hc   *http.Client
	done chan error
}

// startWeb serves web.New(c, opts) (plus the bench's token) on a loopback
// port; conns is how many client connections are kept open.
func startWeb(c *conveyor.Client[any], opts web.Options, conns int) (*webServer, error) {
	opts.Tokens = append(opts.Tokens, web.Token{Value: httpToken, Role: web.RoleAdmin})
	if opts.Logger == nil {
		// The access log is formatted (one line per request, as serve
		// does) but written nowhere: a terminal would measure itself.
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h, err := web.New(c, opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Close()
		return nil, err
	}
	s := &webServer{base: "http://" + ln.Addr().String(), h: h, done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	s.hc = &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		MaxIdleConns: conns + 8, MaxIdleConnsPerHost: conns + 8, IdleConnTimeout: time.Minute,
	}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// close stops the server and the handler.
func (s *webServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	s.hc.CloseIdleConnections()
	return errors.Join(err, s.h.Close())
}

// do sends a request with the token; a JSON body when body is not nil.
// It decodes a JSON answer into out when out is not nil, and returns the
// answer's size. A status other than want is an error.
func (s *webServer) do(ctx context.Context, method, path string, body, out any, want int) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+httpToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := s.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return len(b), err
	}
	if res.StatusCode != want {
		return len(b), fmt.Errorf("bench: %s %s: %d %s", method, path, res.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return len(b), fmt.Errorf("bench: %s %s: %w", method, path, err)
		}
	}
	return len(b), nil
}

// httpClient opens a migrated client on fresh tables that works no queue
// (the handler claims through the driver) and has no worker, so it may
// enqueue any kind.
func httpClient(ctx context.Context, o Options) (*conveyor.Client[any], error) {
	cfg := benchConfig(o, nil)
	cfg.Queues, cfg.NoQueues = nil, true
	c, err := connect.OpenWith(ctx, o.DSN, &cfg, o.Connect)
	if err != nil {
		return nil, err
	}
	if _, err := c.Migrate(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// benchArgs are the arguments of job seq, as the bench worker reads them.
func benchArgs(mk func(int64) Job, seq int64) json.RawMessage {
	b, _ := json.Marshal(mk(seq))
	return b
}

// httpPair runs the in-process and the HTTP run of an HTTP workload.
func httpPair(ctx context.Context, o Options, inProc, overHTTP func(context.Context, Options) (*Result, error)) ([]*Result, error) {
	var rs []*Result
	for _, run := range []func(context.Context, Options) (*Result, error){inProc, overHTTP} {
		r, err := run(ctx, o)
		if r != nil {
			r.Workload = o.Workload
			o.emit(r)
			rs = append(rs, r)
		}
		if err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// httpEnqueue measures enqueues of o.Jobs jobs in batches of HTTPBatch by
// o.Producers concurrent callers: EnqueueMany in process, then POST
// /api/v1/jobs/batch, each on fresh tables.
func httpEnqueue(ctx context.Context, o Options) ([]*Result, error) {
	return httpPair(ctx, o, func(ctx context.Context, o Options) (*Result, error) {
		return enqueueRun(ctx, o, "in-process", func(c *conveyor.Client[any], _ *webServer) func(context.Context, []json.RawMessage) error {
			return func(ctx context.Context, batch []json.RawMessage) error {
				items := make([]conveyor.EnqueueItem, len(batch))
				for i, a := range batch {
					items[i] = conveyor.EnqueueItem{Args: conveyor.RawArgs{KindName: Job{}.Kind(), JSON: a}}
				}
				_, err := c.EnqueueMany(ctx, items)
				return err
			}
		})
	}, func(ctx context.Context, o Options) (*Result, error) {
		return enqueueRun(ctx, o, "http", func(_ *conveyor.Client[any], s *webServer) func(context.Context, []json.RawMessage) error {
			type one struct {
				Kind string          `json:"kind"`
				Args json.RawMessage `json:"args"`
			}
			return func(ctx context.Context, batch []json.RawMessage) error {
				body := struct {
					Jobs []one `json:"jobs"`
				}{make([]one, len(batch))}
				for i, a := range batch {
					body.Jobs[i] = one{Job{}.Kind(), a}
				}
				var out struct{ IDs []int64 }
				if _, err := s.do(ctx, "POST", "/api/v1/jobs/batch", body, &out, http.StatusCreated); err != nil {
					return err
				}
				if len(out.IDs) != len(batch) {
					return fmt.Errorf("bench: batch of %d answered %d ids", len(batch), len(out.IDs))
				}
				return nil
			}
		})
	})
}

// enqueueRun is one run of http-enqueue: producers call send with
// batches until o.Jobs jobs are enqueued; the table must then hold them
// all.
func enqueueRun(ctx context.Context, o Options, phase string, sender func(*conveyor.Client[any], *webServer) func(context.Context, []json.RawMessage) error) (*Result, error) {
	c, err := httpClient(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res := &Result{Phase: phase, Backend: c.Backend(), Producers: o.Producers}
	var s *webServer
	if phase == "http" {
		if s, err = startWeb(c, web.Options{}, o.Producers); err != nil {
			return nil, err
		}
	}
	send := sender(c, s)
	mk := jobMaker(o)
	w := startWaits(ctx, o.DSN, c.Backend())
	var next, done atomic.Int64
	stop := make(chan struct{})
	pw := progress(o.Progress, o.label+" "+phase, int64(o.Jobs), done.Load, stop)
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	t0 := time.Now()
	var wg sync.WaitGroup
	var once sync.Once
	var perr error
	for range o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := next.Add(HTTPBatch) - HTTPBatch
				n := min(int64(HTTPBatch), int64(o.Jobs)-first)
				if n <= 0 {
					return
				}
				batch := make([]json.RawMessage, n)
				for i := range batch {
					batch[i] = benchArgs(mk, first+int64(i))
				}
				if err := send(rctx, batch); err != nil {
					once.Do(func() { perr = err; cancel() })
					return
				}
				done.Add(n)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(stop)
	pw.Wait()
	w.stop()
	if s != nil {
		perr = errors.Join(perr, s.close())
	}
	res.Jobs, res.Seconds = done.Load(), elapsed.Seconds()
	res.JobsPerS = float64(res.Jobs) / elapsed.Seconds()
	if perr == nil {
		perr = checkCount(ctx, c, int64(o.Jobs))
	}
	cerr := closeClient(ctx, c, o, res)
	res.Waits = w.finish(ctx, res.Counters)
	return res, errors.Join(perr, cerr)
}

// checkCount checks that the tables hold exactly n available jobs.
func checkCount(ctx context.Context, c *conveyor.Client[any], n int64) error {
	st, err := c.Stats(ctx)
	if err != nil {
		return err
	}
	var got int64
	for _, q := range st.Queues {
		for _, k := range q.Counts {
			got += k
		}
	}
	if got != n {
		return fmt.Errorf("bench: %d jobs enqueued, %d in the table", n, got)
	}
	return nil
}

// httpDrain drains o.Jobs bulk-inserted jobs: the drain workload in
// process (o.Workers workers), then HTTP workers, each on fresh tables.
func httpDrain(ctx context.Context, o Options) ([]*Result, error) {
	return httpPair(ctx, o, func(ctx context.Context, o Options) (*Result, error) {
		o.Workload, o.label, o.Emit = "drain", o.label+" in-process", nil
		r, err := Run(ctx, o)
		if r != nil {
			r.Phase = "in-process"
		}
		return r, err
	}, drainHTTP)
}

// claimedJSON is the part of a claimed job an HTTP worker reads.
type claimedJSON struct {
	ID    int64           `json:"id"`
	Args  json.RawMessage `json:"args"`
	Fence int64           `json:"fence"`
}

// drainHTTP is http-drain's HTTP run: o.Producers HTTP workers each
// claim up to o.Workers/o.Producers jobs at once (so that at most
// o.Workers jobs are held, as in process), complete each with its own
// request, concurrently, and claim again, until a claim finds nothing.
func drainHTTP(ctx context.Context, o Options) (*Result, error) {
	c, err := httpClient(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res := &Result{Phase: "http", Backend: c.Backend(), Workers: o.Workers, Producers: o.Producers}
	rec := NewRecorder()
	mk := jobMaker(o)
	const chunk = 10000
	for off := 0; off < o.Jobs; off += chunk {
		n := min(chunk, o.Jobs-off)
		first := rec.Reserve(n)
		items := make([]conveyor.EnqueueItem, n)
		for i := range items {
			items[i] = conveyor.EnqueueItem{Args: mk(first + int64(i))}
		}
		t0 := time.Now()
		if _, err := c.EnqueueBulk(ctx, items); err != nil {
			return nil, err
		}
		t1 := time.Now()
		for i := range items {
			rec.Enqueued(first+int64(i), t0, t1)
		}
	}
	s, err := startWeb(c, web.Options{}, o.Workers+o.Producers)
	if err != nil {
		return nil, err
	}
	limit := max(1, min(1000, o.Workers/o.Producers))
	w := startWaits(ctx, o.DSN, c.Backend())
	var completed atomic.Int64
	stop := make(chan struct{})
	pw := progress(o.Progress, o.label+" http", int64(o.Jobs), completed.Load, stop)
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	t0 := time.Now()
	var wg sync.WaitGroup
	var once sync.Once
	var perr error
	fail := func(err error) { once.Do(func() { perr = err; cancel() }) }
	for p := range o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claim := map[string]any{"queue": conveyor.DefaultQueue, "limit": limit, "worker": "bench-" + strconv.Itoa(p)}
			for rctx.Err() == nil {
				var out struct {
					Jobs []claimedJSON `json:"jobs"`
				}
				if _, err := s.do(rctx, "POST", "/api/v1/claim", claim, &out, http.StatusOK); err != nil {
					fail(err)
					return
				}
				if len(out.Jobs) == 0 {
					return // nothing is available: every job is claimed
				}
				var jw sync.WaitGroup
				for _, j := range out.Jobs {
					jw.Add(1)
					go func() {
						defer jw.Done()
						var a Job
						if err := json.Unmarshal(j.Args, &a); err != nil {
							fail(fmt.Errorf("bench: job %d: %w", j.ID, err))
							return
						}
						rec.Started(a.Seq, time.Now())
						simulate(time.Duration(a.WorkUS)*time.Microsecond, a.Spin)
						if _, err := s.do(rctx, "POST", "/api/v1/jobs/"+strconv.FormatInt(j.ID, 10)+"/complete",
							map[string]int64{"fence": j.Fence}, nil, http.StatusOK); err != nil {
							fail(err)
							return
						}
						completed.Add(1)
					}()
				}
				jw.Wait()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(stop)
	pw.Wait()
	w.stop()
	perr = errors.Join(perr, s.close())
	if perr == nil && completed.Load() != int64(o.Jobs) {
		perr = fmt.Errorf("bench: %d of %d jobs completed over HTTP", completed.Load(), o.Jobs)
	}
	cerr := closeClient(ctx, c, o, res)
	res.Waits = w.finish(ctx, res.Counters)
	ferr := res.fill(rec.Summarize(), elapsed)
	if perr != nil || cerr != nil {
		return res, errors.Join(perr, cerr)
	}
	return res, ferr
}
