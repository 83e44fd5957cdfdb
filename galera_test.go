package conveyor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/internal/topology"
	"github.com/conveyorq/conveyor/lab"
)

// galeraSQL opens a plain database/sql handle on node i, closed at the
// end of the test.
func galeraSQL(t *testing.T, g *topology.Galera, i int) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", g.Nodes[i-1].Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The tests of this file run on a 3-node MariaDB Galera cluster where
// every node takes writes: the one the conformance suite shares
// (galeraDSN), or, for the node kill, one of their own.

// sharedGalera returns the conformance suite's cluster, starting it if
// needed.
func sharedGalera(t *testing.T) *topology.Galera {
	t.Helper()
	galeraDSN(t)
	return galera.Load()
}

// galeraRecord records, outside the queue, which client executed which
// job (by the job's own number, its argument).
type galeraRecord struct {
	mu   sync.Mutex
	runs map[int][]int // job number -> clients that ran it, in order
	ids  map[int]int64 // job number -> id the worker saw
}

func (r *galeraRecord) add(n, client int, id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil {
		r.runs, r.ids = map[int][]int{}, map[int]int64{}
	}
	r.runs[n] = append(r.runs[n], client)
	r.ids[n] = id
}

func (r *galeraRecord) snapshot() (map[int][]int, map[int]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	runs, ids := map[int][]int{}, map[int]int64{}
	for k, v := range r.runs {
		runs[k] = append([]int(nil), v...)
	}
	for k, v := range r.ids {
		ids[k] = v
	}
	return runs, ids
}

// galeraClient opens a migrated client on node dsn, with a worker that
// records its runs as client number i; its cleanup stops and closes it
// (tolerating a stop error when tolerate is set, for a client whose node
// was killed).
func galeraClient(t *testing.T, dsn string, cfg *conveyor.Config, i int, rec *galeraRecord, work time.Duration, tolerate bool, hook func()) *conveyor.Client[any] {
	t.Helper()
	ctx := context.Background()
	c, err := connect.Open(ctx, dsn, cfg)
	if err != nil {
		t.Fatalf("open client %d: %v", i, err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		c.Close()
		t.Fatalf("migrate client %d: %v", i, err)
	}
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
		if work > 0 {
			time.Sleep(work)
		}
		if hook != nil {
			hook()
		}
		rec.add(j.Args.N, i, j.ID)
		return nil
	}))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(sctx); err != nil && !tolerate {
			t.Errorf("stop client %d: %v", i, err)
		}
		if err := c.Close(); err != nil && !tolerate {
			t.Errorf("close client %d: %v", i, err)
		}
	})
	return c
}

// enqueueNumbered enqueues jobs first..first+n-1 through c in batches of
// batch (multi-row inserts) and returns number -> id, checking that every
// id returned is the job that was enqueued with that number.
func enqueueNumbered(t *testing.T, c *conveyor.Client[any], first, n, batch int) map[int]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[int]int64{}
	for off := 0; off < n; off += batch {
		var items []conveyor.EnqueueItem
		for k := off; k < min(off+batch, n); k++ {
			items = append(items, conveyor.EnqueueItem{Args: noop{first + k}})
		}
		res, err := c.EnqueueMany(ctx, items)
		if err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		for k, r := range res {
			out[first+off+k] = r.ID
		}
	}
	// The ids returned are the rows inserted: read each back.
	for num, id := range out {
		j, err := c.Job(ctx, id)
		if err != nil {
			t.Fatalf("job %d (enqueued as number %d): %v", id, num, err)
		}
		var a noop
		if err := json.Unmarshal(j.EncodedArgs, &a); err != nil || a.N != num {
			t.Fatalf("enqueue returned id %d for job number %d, but job %d is number %d (%s)", id, num, id, a.N, j.EncodedArgs)
		}
	}
	return out
}

func galeraConfig(prefix string) *conveyor.Config {
	cfg := fast(prefix)
	cfg.Queues = map[string]conveyor.QueueConfig{"default": {MaxWorkers: 8}}
	cfg.ClaimBatch = 4
	return cfg
}

// TestGaleraWorkersOnEveryNode: workers on all three nodes claim one
// queue at once, each node's claims locking rows only on that node, so
// that the same job is claimed on two nodes and one commit fails
// certification: every job is executed exactly once (executions recorded
// outside the queue), none is lost, and every id an enqueue returned
// names the job it enqueued.
func TestGaleraWorkersOnEveryNode(t *testing.T) {
	g := sharedGalera(t)
	ctx := context.Background()
	prefix := testdb.Prefix()
	var rec galeraRecord
	var clients []*conveyor.Client[any]
	for i := 1; i <= 3; i++ {
		clients = append(clients, galeraClient(t, g.DSN(i), galeraConfig(prefix), i, &rec, 0, false, nil))
	}
	t.Cleanup(func() { dropPrefix(t, g.DSN(1), prefix) })
	const perNode = 300
	ids := map[int]int64{}
	for i, c := range clients {
		for k, v := range enqueueNumbered(t, c, i*perNode, perNode, 25) {
			ids[k] = v
		}
	}
	for _, c := range clients {
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const n = 3 * perNode
	waitFor(t, "all jobs completed", 2*time.Minute, func() bool {
		st, err := clients[0].Stats(ctx)
		return err == nil && len(st.Queues) == 1 && st.Queues[0].Counts[conveyor.JobStateCompleted] == n
	})
	runs, seen := rec.snapshot()
	if len(runs) != n {
		t.Fatalf("%d distinct jobs executed, want %d", len(runs), n)
	}
	by := map[int]int{}
	for num, who := range runs {
		if len(who) != 1 {
			t.Fatalf("job number %d executed %d times (by clients %v)", num, len(who), who)
		}
		if seen[num] != ids[num] {
			t.Fatalf("job number %d ran as job %d, its enqueue returned %d", num, seen[num], ids[num])
		}
		by[who[0]]++
	}
	var conflicts int64
	for _, c := range clients {
		conflicts += c.Counters().Driver["deadlock_retries"]
	}
	t.Logf("executions by client (node): %v; certification conflicts retried: %d", by, conflicts)
}

// dropPrefix drops prefix's tables through a client of its own.
func dropPrefix(t *testing.T, dsn, prefix string) {
	c, err := connect.Open(context.Background(), dsn, &conveyor.Config{TablePrefix: prefix})
	if err != nil {
		t.Errorf("drop: %v", err)
		return
	}
	defer c.Close()
	if err := lab.DropTables(context.Background(), c); err != nil {
		t.Errorf("drop: %v", err)
	}
}

// TestGaleraConcurrentMigrations: migrators on the three nodes migrate
// one fresh schema at the same moment (GET_LOCK would not serialise them:
// it is local to a node). Each succeeds, the schema is complete and
// recorded once per version on every node, and the lock row is released.
func TestGaleraConcurrentMigrations(t *testing.T) {
	g := sharedGalera(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := 0; round < 3; round++ {
		prefix := testdb.Prefix()
		var clients []*conveyor.Client[any]
		for i := 1; i <= 3; i++ {
			c, err := connect.Open(ctx, g.DSN(i), &conveyor.Config{TablePrefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			clients = append(clients, c)
		}
		applied := make([][]int, 3)
		errs := make([]error, 3)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				applied[i], errs[i] = c.Migrate(ctx)
			}()
		}
		close(start)
		wg.Wait()
		total := 0
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: migrator on node %d: %v", round, i+1, err)
			}
			total += len(applied[i])
		}
		for i, c := range clients {
			// Complete on every node: nothing is left to apply.
			if again, err := c.Migrate(ctx); err != nil || len(again) != 0 {
				t.Fatalf("round %d: node %d: migrating again applied %v, %v; want nothing", round, i+1, again, err)
			}
			// The schema works on every node.
			if _, err := c.Enqueue(ctx, noop{i}, nil); err != nil {
				t.Fatalf("round %d: enqueue on node %d: %v", round, i+1, err)
			}
		}
		db := galeraSQL(t, g, 1)
		var versions, latest, locks int
		if err := db.QueryRowContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*), MAX(version) FROM `"+prefix+"schema_migrations`").Scan(&versions, &latest); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM `"+prefix+"migration_lock`").Scan(&locks); err != nil {
			t.Fatal(err)
		}
		if versions != latest || total != latest || locks != 0 {
			t.Fatalf("round %d: %d versions recorded up to %d, the migrators applied %d in all (%v); %d lock rows left (want 0)", round, versions, latest, total, applied, locks)
		}
		if err := lab.DropTables(ctx, clients[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGaleraUniqueAcrossNodes: the same unique job enqueued at the same
// moment through the three nodes (where no node's index sees the others'
// uncommitted rows; certification refuses all but one) keeps one job, and
// every caller is told its id.
func TestGaleraUniqueAcrossNodes(t *testing.T) {
	g := sharedGalera(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := testdb.Prefix()
	var clients []*conveyor.Client[any]
	for i := 1; i <= 3; i++ {
		c, err := connect.Open(ctx, g.DSN(i), fast(prefix))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	defer func() {
		if err := lab.DropTables(context.Background(), clients[0]); err != nil {
			t.Error(err)
		}
	}()
	opts := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true, ArgsFields: []string{"customer", "item"}}}
	const keys, perNode = 20, 3
	for k := 0; k < keys; k++ {
		customer := fmt.Sprintf("c%d", k)
		var wg sync.WaitGroup
		start := make(chan struct{})
		ids := make([]int64, 3*perNode)
		errs := make([]error, 3*perNode)
		for g := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ids[g], errs[g] = clients[g%3].Enqueue(ctx, order{Customer: customer, Item: "tea", Note: strings.Repeat("x", g)}, opts)
			}()
		}
		close(start)
		wg.Wait()
		for g, err := range errs {
			if err != nil {
				t.Fatalf("key %d: enqueue %d on node %d: %v", k, g, g%3+1, err)
			}
			if ids[g] != ids[0] {
				t.Fatalf("key %d: callers told different ids: %v", k, ids)
			}
		}
	}
	js, err := clients[1].Jobs(ctx, conveyor.JobFilter{Kind: "order", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, j := range js {
		var o order
		_ = json.Unmarshal(j.EncodedArgs, &o)
		seen[o.Customer]++
	}
	if len(js) != keys {
		t.Fatalf("%d jobs for %d keys: %v", len(js), keys, seen)
	}
	for c, n := range seen {
		if n != 1 {
			t.Fatalf("key %s: %d jobs", c, n)
		}
	}
}

// TestGaleraNodeKilled: one node's mariadbd is killed (SIGKILL) while
// workers on all three nodes drain a queue. The clients of the other two
// nodes go on; the jobs the dead node's client had claimed are rescued
// when their lease expires and run again; nothing is lost, and a job runs
// twice only when its first run was the dead node's client's, whose
// completion could not land. Enqueues after the kill return the right ids
// (the cluster's auto_increment_increment changed from 3 to 2). The node
// then rejoins (incremental state transfer) and its client works again.
func TestGaleraNodeKilled(t *testing.T) {
	topology.NeedGalera(t)
	ctx := context.Background()
	g, err := topology.StartGalera(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	prefix := testdb.Prefix()
	const victim = 2
	var rec galeraRecord
	// The dead node's client is in the middle of jobs when its node dies:
	// once it has run victimRuns jobs, its handlers wait for the kill
	// before they return. Counted on its own side, not from the others'
	// progress: on a loaded machine the survivors could otherwise drain
	// the queue before the victim is told to hold a job.
	const victimRuns = 20
	var hold atomic.Bool
	hold.Store(true)
	var ran, held atomic.Int64
	killedCh := make(chan struct{})
	holdJobs := func() {
		if hold.Load() && ran.Add(1) > victimRuns {
			held.Add(1)
			<-killedCh
		}
	}
	var clients []*conveyor.Client[any]
	for i := 1; i <= 3; i++ {
		var hook func()
		if i == victim {
			hook = holdJobs
		}
		cfg := galeraConfig(prefix)
		// Longer than the cluster's stall while it evicts the dead node
		// (no node commits, renewals included: about 2-4s with the
		// harness's evs timeouts), so that no live client's lease
		// expires in it: a job that ran twice must then have run first
		// on the dead node's client.
		cfg.Lease = 8 * time.Second
		clients = append(clients, galeraClient(t, g.DSN(i), cfg, i, &rec, 5*time.Millisecond, i == victim, hook))
	}
	const n = 1200
	enqueueNumbered(t, clients[0], 0, n, 50)
	for _, c := range clients {
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Completions landing through the survivors, counted on their side.
	completed := func() int64 { return clients[0].Counters().Completed + clients[2].Counters().Completed }
	waitFor(t, "the dead node's client in the middle of jobs", 2*time.Minute, func() bool { return held.Load() > 0 })
	g.KillNode(victim)
	killed := time.Now()
	hold.Store(false)
	close(killedCh)
	atKill := completed()
	runsAtKill, _ := rec.snapshot()
	t.Logf("node %d killed after %d of %d jobs ran", victim, len(runsAtKill), n)
	var resumed time.Duration
	waitFor(t, "the survivors completing jobs", time.Minute, func() bool {
		if completed() > atKill+10 {
			resumed = time.Since(killed)
			return true
		}
		return false
	})

	// The survivors go on, enqueues through them return the right ids
	// (the step is now 2), and every job completes.
	more := enqueueNumbered(t, clients[0], n, 100, 20)
	for k, v := range enqueueNumbered(t, clients[2], n+100, 100, 20) {
		more[k] = v
	}
	total := n + len(more)
	waitFor(t, "every job completed", 2*time.Minute, func() bool {
		st, err := clients[0].Stats(ctx)
		return err == nil && len(st.Queues) == 1 && st.Queues[0].Counts[conveyor.JobStateCompleted] == int64(total)
	})
	t.Logf("after the kill: the survivors completed jobs again after %v; all %d jobs completed %v after the kill", resumed, total, time.Since(killed))

	runs, _ := rec.snapshot()
	if len(runs) != total {
		t.Fatalf("%d distinct jobs executed, want %d", len(runs), total)
	}
	twice := 0
	for num, who := range runs {
		if len(who) == 1 {
			continue
		}
		twice++
		// Only the dead node's client's runs may be followed by another.
		for _, c := range who[:len(who)-1] {
			if c != victim {
				t.Fatalf("job number %d executed by clients %v: a run by a live node's client was repeated", num, who)
			}
		}
	}
	// The jobs held across the kill were run by the dead node's client,
	// whose completions could not land: each was rescued and ran again.
	if twice == 0 {
		t.Fatalf("no job ran again, yet the dead node's client was running %d when its node died", held.Load())
	}
	t.Logf("%d jobs ran again after the dead node's client had run them (%d were held across the kill)", twice, held.Load())

	// The node comes back; its client reconnects and works again.
	if err := g.RestartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitSize(ctx, 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	var back map[int]int64
	waitFor(t, "an enqueue through the rejoined node", time.Minute, func() bool {
		items := []conveyor.EnqueueItem{{Args: noop{total}}, {Args: noop{total + 1}}}
		res, err := clients[victim-1].EnqueueMany(ctx, items)
		if err != nil {
			return false
		}
		back = map[int]int64{total: res[0].ID, total + 1: res[1].ID}
		return true
	})
	waitFor(t, "the jobs enqueued through the rejoined node completed", time.Minute, func() bool {
		for _, id := range back {
			j, err := clients[victim-1].Job(ctx, id)
			if err != nil || j.State != conveyor.JobStateCompleted {
				return false
			}
		}
		return true
	})
}
