package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// enqueueKeyed enqueues one job of the rig's queue per key of keys, in
// order, and returns their ids and the key of each id.
func (r *limitRig) enqueueKeyed(keys []string) ([]int64, map[int64]string) {
	r.t.Helper()
	ids := make([]int64, len(keys))
	keyOf := make(map[int64]string, len(keys))
	for i, k := range keys {
		id, err := r.a.Enqueue(context.Background(), limited{N: i}, &conveyor.EnqueueOpts{Queue: r.queue, Key: k})
		if err != nil {
			r.t.Fatal(err)
		}
		ids[i] = id
		keyOf[id] = k
	}
	return ids, keyOf
}

// The limit per key holds across processes and protocols: two in-process
// clients and an HTTP worker (11 workers in all) never run more than
// KeyMaxRunning jobs of one key at once, by the executions recorded
// outside the queue, reach it, run jobs without a key beside them, and
// run every job exactly once.
func TestKeyLimitAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const perKey = 2
		r := newLimitRig(t, dsn, conveyor.QueueLimits{KeyMaxRunning: perKey}, 40*time.Millisecond)
		var keys []string
		for i := 0; i < 12; i++ {
			keys = append(keys, "acme", "globex", "initech", "")
		}
		ids, keyOf := r.enqueueKeyed(keys)
		r.start()
		xs := r.waitAll(ids, 2*time.Minute)
		byKey := map[string][]execution{}
		for _, x := range xs {
			byKey[keyOf[x.id]] = append(byKey[keyOf[x.id]], x)
		}
		reached := false
		for _, k := range []string{"acme", "globex", "initech"} {
			p := peak(byKey[k], time.Time{})
			if p > perKey {
				t.Fatalf("%d jobs of key %s ran at once, over KeyMaxRunning %d", p, k, perKey)
			}
			reached = reached || p == perKey
		}
		if !reached {
			t.Fatalf("no key ever ran %d jobs at once with 11 workers and a backlog", perKey)
		}
		if p := peak(byKey[""], time.Time{}); p <= perKey {
			t.Logf("jobs without a key peaked at %d at once", p)
		}
		if j := jobState(t, r.a, ids[0]); j.Key != "acme" {
			t.Fatalf("job %d has key %q, want acme", ids[0], j.Key)
		}
	})
}

// Ordered keys hold across processes and protocols, and a failing job
// holds only its own key: 20 keys of 5 jobs each run one at a time per
// key in enqueue order, while the first job of a 21st key fails at every
// attempt and none of that key's later jobs starts.
func TestOrderedKeysWithPoisonedKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		r := newLimitRig(t, dsn, conveyor.QueueLimits{Ordered: true}, 5*time.Millisecond)
		var keys []string
		for j := 0; j < 5; j++ {
			keys = append(keys, "poison")
			for k := 0; k < 20; k++ {
				keys = append(keys, fmt.Sprintf("tenant-%02d", k))
			}
		}
		ids, keyOf := r.enqueueKeyed(keys)
		var healthy []int64
		poison := []int64{}
		for i, id := range ids {
			if keys[i] == "poison" {
				poison = append(poison, id)
			} else {
				healthy = append(healthy, id)
			}
		}
		r.failIf = func(id int64) bool { return keyOf[id] == "poison" }
		r.start()
		waitFor(t, "every healthy job completed", 2*time.Minute, func() bool {
			for _, id := range healthy {
				if jobState(t, r.a, id).State != conveyor.JobStateCompleted {
					return false
				}
			}
			return true
		})
		// Let the poisoned head fail a few more times.
		waitFor(t, "the poisoned head retried", time.Minute, func() bool {
			return jobState(t, r.a, poison[0]).Attempt >= 3
		})
		xs := r.log.snapshot()
		byKey := map[string][]execution{}
		for _, x := range xs {
			byKey[keyOf[x.id]] = append(byKey[keyOf[x.id]], x)
		}
		checkKeyOrder(t, byKey)
		for k, runs := range byKey {
			if k != "poison" && len(runs) != 5 {
				t.Fatalf("key %s ran %d times, want its 5 jobs once each", k, len(runs))
			}
		}
		for _, x := range byKey["poison"] {
			if x.id != poison[0] {
				t.Fatalf("job %d of the poisoned key ran while its first job waits for a retry", x.id)
			}
		}
		for _, id := range poison[1:] {
			if st := jobState(t, r.a, id).State; st != conveyor.JobStateAvailable {
				t.Fatalf("job %d of the poisoned key is %s, want available (held by its key)", id, st)
			}
		}
		st, err := r.a.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range st.Queues {
			if q.Queue == r.queue && (q.LimitUse == nil || q.LimitUse.KeyHeld < 1) {
				t.Fatalf("stats of %s: %+v, want the poisoned key's jobs counted as held by their key", r.queue, q.LimitUse)
			}
		}
	})
}

// A bad key is refused at enqueue, naming what was wrong, and nothing is
// enqueued; a bad combination of key limits is refused naming the field.
func TestKeyInput(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	for _, bad := range []string{strings.Repeat("k", conveyor.MaxKeyBytes+1), "a\x00b", "\xff"} {
		_, err := c.Enqueue(ctx, limited{}, &conveyor.EnqueueOpts{Key: bad})
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), "key") {
			t.Fatalf("key %q: %v, want ErrInvalidOpts naming the key", bad, err)
		}
	}
	if n := totalJobs(t, c); n != 0 {
		t.Fatalf("%d jobs stored after refused enqueues", n)
	}
	for _, l := range []conveyor.QueueLimits{
		{KeyMaxRunning: -1}, {KeyMaxRunning: 100001}, {Ordered: true, KeyMaxRunning: 2}, {OrderedMoveOn: true},
	} {
		err := c.SetQueueLimits(ctx, "q", l)
		if !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Fatalf("limits %+v: %v, want ErrInvalidOpts", l, err)
		}
	}
	for _, bad := range []struct {
		l     conveyor.QueueLimits
		field string
	}{
		{conveyor.QueueLimits{KeyRate: -1, KeyRatePeriod: time.Hour}, "KeyRate "},
		{conveyor.QueueLimits{KeyRate: 100001, KeyRatePeriod: time.Hour}, "KeyRate "},
		{conveyor.QueueLimits{KeyRate: 1}, "KeyRatePeriod"},
		{conveyor.QueueLimits{KeyRate: 1, KeyRatePeriod: time.Microsecond}, "KeyRatePeriod"},
		{conveyor.QueueLimits{KeyRate: 1, KeyRatePeriod: 31 * 24 * time.Hour}, "KeyRatePeriod"},
		{conveyor.QueueLimits{KeyRatePeriod: time.Second}, "KeyRatePeriod"},
	} {
		err := c.SetQueueLimits(ctx, "q", bad.l)
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), bad.field) {
			t.Fatalf("limits %+v: %v, want ErrInvalidOpts naming %s", bad.l, err, bad.field)
		}
	}
	got, err := c.QueueLimits(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("limits after refused changes: %v, %v", got, err)
	}
}

type keyedBlock struct {
	Name string `json:"name"`
}

func (keyedBlock) Kind() string { return "keyed_block" }

// A job of another key starts at once while the queue's claims are held
// back by a full key: the enqueue wakes them. With polls an hour apart,
// only that wake-up can start it before the running job of the full key
// is let go.
func TestKeyEnqueueWakesHeldClaims(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.PollMin, cfg.PollMax, cfg.ListenPoll = time.Hour, time.Hour, time.Hour
		cfg.Queues = map[string]conveyor.QueueConfig{"kw": {MaxWorkers: 4}}
		c := openDropped(t, dsn, cfg)
		if err := c.SetQueueLimits(ctx, "kw", conveyor.QueueLimits{KeyMaxRunning: 1}); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		started := make(chan string, 10)
		if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[keyedBlock]) error {
			started <- j.Args.Name
			if j.Args.Name == "a1" {
				<-release
			}
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"a1", "a2"} {
			if _, err := c.Enqueue(ctx, keyedBlock{Name: n}, &conveyor.EnqueueOpts{Queue: "kw", Key: "a"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer close(release)
		if got := <-started; got != "a1" {
			t.Fatalf("first start %s, want a1", got)
		}
		// Let the fetcher's claims come back held by key a's limit.
		waitFor(t, "the queue held by its key", 30*time.Second, func() bool {
			st, err := c.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range st.Queues {
				if q.Queue == "kw" {
					return q.Held == conveyor.HeldByKey
				}
			}
			return false
		})
		if _, err := c.Enqueue(ctx, keyedBlock{Name: "b1"}, &conveyor.EnqueueOpts{Queue: "kw", Key: "b"}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-started:
			if got != "b1" {
				t.Fatalf("started %s while a1 runs, want b1", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the job of key b did not start while key a's job ran: the enqueue did not wake the held claims")
		}
	})
}

// The rate per key holds across processes and protocols: two in-process
// clients and an HTTP worker never start more than KeyRate jobs of one
// key within any window of KeyRatePeriod (plus one, for the clocks read
// outside the database), while the keys go on beside each other, and
// every job runs exactly once.
func TestKeyRateAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		const rate, period, perKey = 2, 500 * time.Millisecond, 6
		r := newLimitRig(t, dsn, conveyor.QueueLimits{KeyRate: rate, KeyRatePeriod: period}, time.Millisecond)
		var keys []string
		for i := 0; i < perKey; i++ {
			keys = append(keys, "acme", "globex", "initech", "umbrella")
		}
		ids, keyOf := r.enqueueKeyed(keys)
		r.start()
		xs := r.waitAll(ids, 2*time.Minute)
		// By the database's clock, which holds the rate (attempted_at is
		// the clock value the claim stamps on the key's rate slot), and
		// by the handlers' own clock reads, in a window shortened by the
		// spread of the delays from claim to start (see
		// TestLimitRateAcrossClients): the bound, plus one.
		dbStarts, starts := map[string][]time.Time{}, map[string][]time.Time{}
		lo, hi := time.Duration(1<<62), time.Duration(-1<<62)
		for _, x := range xs {
			at := jobState(t, r.a, x.id).AttemptedAt
			k := keyOf[x.id]
			dbStarts[k] = append(dbStarts[k], at)
			starts[k] = append(starts[k], x.start)
			d := x.start.Sub(at)
			lo, hi = min(lo, d), max(hi, d)
		}
		window, byHandlers := handlerWindow(t, period, hi-lo)
		for _, k := range []string{"acme", "globex", "initech", "umbrella"} {
			if len(dbStarts[k]) != perKey {
				t.Fatalf("key %s started %d jobs, want %d", k, len(dbStarts[k]), perKey)
			}
			if n, at := maxInWindow(dbStarts[k], period); n > rate+1 {
				t.Errorf("key %s: %d claims within %v by the database's clock from %v, want at most %d (KeyRate %d, plus one)", k, n, period, at.Format("15:04:05.000"), rate+1, rate)
			}
			if n, at := maxInWindow(starts[k], window); byHandlers && n > rate+1 {
				t.Errorf("key %s: %d starts within %v from %v, want at most %d (KeyRate %d, plus one; a window of %v less the %v spread of the delays from claim to start)", k, n, window, at.Format("15:04:05.000"), rate+1, rate, period, hi-lo)
			}
		}
		if t.Failed() {
			for _, x := range xs {
				t.Logf("job %d of key %s by %s: started %s", x.id, keyOf[x.id], x.by, x.start.Format("05.000"))
			}
		}
	})
}

// Stats and QueueLimits report a queue's rate per key: the limits as set,
// the keys whose window is full and their jobs held, and the queue held
// by its keys once only jobs of those keys are available; a remote claim
// takes one job per key and the job without a key, then nothing.
func TestKeyRateStats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		cfg := fast(testdb.Prefix())
		cfg.Queues, cfg.NoQueues = nil, true
		c := openDropped(t, dsn, cfg)
		want := conveyor.QueueLimits{KeyRate: 1, KeyRatePeriod: time.Hour}
		if err := c.SetQueueLimits(ctx, "kr", want); err != nil {
			t.Fatal(err)
		}
		if got, err := c.QueueLimits(ctx); err != nil || got["kr"] != want {
			t.Fatalf("QueueLimits: %v, %v; want kr: %+v", got, err, want)
		}
		for _, k := range []string{"a", "a", "a", "b", ""} {
			if _, err := c.Enqueue(ctx, limited{}, &conveyor.EnqueueOpts{Queue: "kr", Key: k}); err != nil {
				t.Fatal(err)
			}
		}
		rw := c.RemoteWorkers()
		jobs, err := rw.Claim(ctx, conveyor.RemoteClaim{Queue: "kr", Limit: 10, Worker: "w"})
		if err != nil || len(jobs) != 3 {
			t.Fatalf("claimed %d (%v), want one of each key and the job without one", len(jobs), err)
		}
		if again, err := rw.Claim(ctx, conveyor.RemoteClaim{Queue: "kr", Limit: 10, Worker: "w"}); err != nil || len(again) != 0 {
			t.Fatalf("claimed %d more (%v) with every key's window full", len(again), err)
		}
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range st.Queues {
			if q.Queue != "kr" {
				continue
			}
			if q.Limits == nil || *q.Limits != want || q.LimitUse == nil || q.LimitUse.KeysRated != 2 || q.LimitUse.KeyHeld != 2 || q.Held != conveyor.HeldByKey {
				t.Fatalf("stats of kr: limits %v use %+v held %q; want 2 keys rated, 2 jobs held, held by key", q.Limits, q.LimitUse, q.Held)
			}
			return
		}
		t.Fatal("kr not in the stats")
	})
}

// tenantJob takes its limit key from its own field.
type tenantJob struct {
	Tenant string `json:"tenant"`
}

func (tenantJob) Kind() string { return "tenant_job" }

// LimitKey is the job's tenant.
func (j tenantJob) LimitKey() string { return j.Tenant }

// declaredKey declares a key for its kind and takes one from its field.
type declaredKey struct {
	Tenant string `json:"tenant"`
}

func (declaredKey) Kind() string { return "declared_key" }

func (declaredKey) EnqueueOpts() conveyor.EnqueueOpts { return conveyor.EnqueueOpts{Key: "kind-wide"} }

// LimitKey is the job's tenant.
func (j declaredKey) LimitKey() string { return j.Tenant }

// Arguments that give their key (JobArgsWithKey) key their jobs on every
// enqueue path; a key given by the call wins, the arguments' key wins
// over one the kind declares, an empty one gives none, and a bad one is
// refused naming the key, storing nothing.
func TestKeyFromArguments(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	keyOf := func(id int64) string { t.Helper(); return jobState(t, c, id).Key }

	id, err := c.Enqueue(ctx, tenantJob{"acme"}, nil)
	if err != nil || keyOf(id) != "acme" {
		t.Fatalf("Enqueue: key %q, %v; want acme", keyOf(id), err)
	}
	if id, err = c.Enqueue(ctx, tenantJob{"acme"}, &conveyor.EnqueueOpts{Key: "given"}); err != nil || keyOf(id) != "given" {
		t.Fatalf("Enqueue with the call's key: %q, %v; want given", keyOf(id), err)
	}
	if id, err = c.Enqueue(ctx, tenantJob{}, nil); err != nil || keyOf(id) != "" {
		t.Fatalf("Enqueue with an empty tenant: %q, %v; want no key", keyOf(id), err)
	}
	if id, err = c.Enqueue(ctx, declaredKey{"globex"}, nil); err != nil || keyOf(id) != "globex" {
		t.Fatalf("arguments' key over the declared one: %q, %v; want globex", keyOf(id), err)
	}
	if id, err = c.Enqueue(ctx, declaredKey{}, nil); err != nil || keyOf(id) != "kind-wide" {
		t.Fatalf("declared key when the arguments give none: %q, %v; want kind-wide", keyOf(id), err)
	}
	res, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: tenantJob{"a1"}}, {Args: tenantJob{"a2"}}})
	if err != nil || keyOf(res[0].ID) != "a1" || keyOf(res[1].ID) != "a2" {
		t.Fatalf("EnqueueMany: %v", err)
	}
	if _, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: tenantJob{"bulk"}}}); err != nil {
		t.Fatal(err)
	}
	_, members, err := c.EnqueueBatch(ctx, []conveyor.EnqueueItem{{Args: tenantJob{"m"}}}, conveyor.EnqueueItem{Args: tenantJob{"cb"}})
	if err != nil || keyOf(members[0]) != "m" {
		t.Fatalf("EnqueueBatch member: %v", err)
	}
	keys := map[string]int{}
	for after := int64(0); ; {
		js, err := c.Jobs(ctx, conveyor.JobFilter{Limit: 100, AfterID: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range js {
			keys[j.Key]++
		}
		if len(js) < 100 {
			break
		}
		after = js[len(js)-1].ID
	}
	if keys["bulk"] != 1 {
		t.Fatalf("EnqueueBulk: keys %v, want one job of key bulk", keys)
	}
	before := totalJobs(t, c)
	for _, bad := range []string{strings.Repeat("k", conveyor.MaxKeyBytes+1), "a\x00b"} {
		_, err := c.Enqueue(ctx, tenantJob{bad}, nil)
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), "key") {
			t.Fatalf("key %q from the arguments: %v, want ErrInvalidOpts naming the key", bad, err)
		}
	}
	if n := totalJobs(t, c); n != before {
		t.Fatalf("%d jobs stored after refused enqueues, want %d", n, before)
	}
}

// A queue limited only per key claims ahead of its free workers while its
// handlers are short, each job claimed ahead holding its key's slot until
// a worker runs it. The jobs claimed ahead that no worker took when Stop
// began are released with their keys' slots: no job of the queue stays
// running and no key stays held, and another client then runs every job
// once, one at a time per key and in enqueue order.
func TestOrderedKeysClaimedAheadReleasedAtStop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		prefix := testdb.Prefix()
		const queue, keys, perKey = "ahead", 100, 10
		cfg := func(workers int) *conveyor.Config {
			c := fast(prefix)
			c.Queues = map[string]conveyor.QueueConfig{queue: {MaxWorkers: workers}}
			return c
		}
		a := openDropped(t, dsn, cfg(2))
		b := open(t, dsn, cfg(8))
		if err := a.SetQueueLimits(ctx, queue, conveyor.QueueLimits{Ordered: true}); err != nil {
			t.Fatal(err)
		}
		var log executions
		for name, c := range map[string]*conveyor.Client[any]{"a": a, "b": b} {
			if err := conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[limited]) error {
				start := time.Now()
				time.Sleep(200 * time.Microsecond) // short: its fetcher claims ahead
				log.add(execution{id: j.ID, start: start, end: time.Now(), by: name})
				return nil
			})); err != nil {
				t.Fatal(err)
			}
		}
		var items []conveyor.EnqueueItem
		for j := 0; j < perKey; j++ {
			for k := 0; k < keys; k++ {
				items = append(items, conveyor.EnqueueItem{Args: limited{N: j}, Opts: &conveyor.EnqueueOpts{Queue: queue, Key: fmt.Sprintf("k%03d", k)}})
			}
		}
		keyOf := map[int64]string{}
		for i := 0; i < len(items); i += 100 {
			rs, err := a.EnqueueMany(ctx, items[i:i+100])
			if err != nil {
				t.Fatal(err)
			}
			for n, r := range rs {
				keyOf[r.ID] = items[i+n].Opts.Key
			}
		}
		queueStats := func() conveyor.QueueStats {
			st, err := a.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range st.Queues {
				if q.Queue == queue {
					return q
				}
			}
			return conveyor.QueueStats{}
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Claimed ahead: more jobs running (claimed) than a's 2 workers.
		most := int64(0)
		waitFor(t, "more jobs claimed than a's 2 workers", time.Minute, func() bool {
			most = max(most, queueStats().Counts[conveyor.JobStateRunning])
			return most > 2 || len(log.snapshot()) == len(keyOf)
		})
		if most <= 2 {
			t.Fatalf("a drained the queue with at most %d jobs claimed at once: nothing was claimed ahead", most)
		}
		if err := a.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		ran := len(log.snapshot())
		q := queueStats()
		if n := q.Counts[conveyor.JobStateRunning]; n != 0 {
			t.Fatalf("%d jobs still running after the only started client stopped: claimed ahead and not released", n)
		}
		if q.LimitUse != nil && q.LimitUse.KeysRunning != 0 {
			t.Fatalf("%d keys hold a slot after the only started client stopped: a released job kept its key's slot", q.LimitUse.KeysRunning)
		}
		t.Logf("a ran %d of %d jobs before Stop, with up to %d claimed at once", ran, len(keyOf), most)
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every job ran", 2*time.Minute, func() bool { return len(log.snapshot()) >= len(keyOf) })
		time.Sleep(50 * time.Millisecond) // a job run twice would show now
		xs := log.snapshot()
		byKey := map[string][]execution{}
		seen := map[int64]bool{}
		for _, x := range xs {
			if seen[x.id] {
				t.Fatalf("job %d ran twice", x.id)
			}
			seen[x.id] = true
			byKey[keyOf[x.id]] = append(byKey[keyOf[x.id]], x)
		}
		if len(seen) != len(keyOf) {
			t.Fatalf("%d jobs ran, want %d", len(seen), len(keyOf))
		}
		checkKeyOrder(t, byKey)
	})
}

// checkKeyOrder fails t if two executions of one key of byKey overlapped
// or a key's jobs started out of enqueue (id) order.
func checkKeyOrder(t *testing.T, byKey map[string][]execution) {
	t.Helper()
	for k, runs := range byKey {
		if p := peak(runs, time.Time{}); p > 1 {
			t.Fatalf("%d jobs of ordered key %s ran at once; %s", p, k, atPeak(runs))
		}
		slices.SortFunc(runs, func(a, b execution) int { return a.start.Compare(b.start) })
		for i := 1; i < len(runs); i++ {
			if runs[i].id < runs[i-1].id {
				t.Fatalf("key %s ran job %d after job %d: out of enqueue order", k, runs[i].id, runs[i-1].id)
			}
		}
	}
}

// Jobs enqueued while the workers run, by processes that work the queue,
// keep the limits per key: four producers on the two in-process clients
// enqueue into a queue limited only per key (ordered; at most 2 per key)
// while those clients and an HTTP worker run it. By the executions
// recorded outside the queue, no key ran more jobs at once than its
// limit, an ordered key ran its jobs in enqueue order, and every job ran
// once. On SQLite, whose inserts check key slots, some jobs are claimed by
// their own insert (those of keys with room while workers idle).
func TestKeysEnqueuedWhileWorking(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits conveyor.QueueLimits
		max    int
	}{{"ordered", conveyor.QueueLimits{Ordered: true}, 1}, {"per-key-2", conveyor.QueueLimits{KeyMaxRunning: 2}, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, dsn string) {
				r := newLimitRig(t, dsn, tc.limits, 3*time.Millisecond)
				r.start()
				var (
					mu    sync.Mutex
					ids   []int64
					keyOf = map[int64]string{}
					wg    sync.WaitGroup
					errs  = make(chan error, 4)
				)
				for p := range 4 {
					c := r.a
					if p%2 == 1 {
						c = r.b
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range 60 {
							k := fmt.Sprintf("k%d", (i+p)%6)
							if i%10 == 9 {
								k = ""
							}
							id, err := c.Enqueue(context.Background(), limited{N: i}, &conveyor.EnqueueOpts{Queue: r.queue, Key: k})
							if err != nil {
								errs <- err
								return
							}
							mu.Lock()
							ids = append(ids, id)
							keyOf[id] = k
							mu.Unlock()
							time.Sleep(time.Duration(i%3) * time.Millisecond)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				xs := r.waitAll(ids, 2*time.Minute)
				byKey := map[string][]execution{}
				for _, x := range xs {
					if k := keyOf[x.id]; k != "" {
						byKey[k] = append(byKey[k], x)
					}
				}
				if tc.limits.Ordered {
					checkKeyOrder(t, byKey)
				}
				for k, runs := range byKey {
					if p := peak(runs, time.Time{}); p > tc.max {
						t.Fatalf("%d jobs of key %s ran at once, over the limit %d; %s", p, k, tc.max, atPeak(runs))
					}
				}
				if r.a.Backend() == "sqlite" {
					if n := r.a.Counters().ClaimedAtInsert + r.b.Counters().ClaimedAtInsert; n == 0 {
						t.Fatal("no job was claimed by its own insert")
					} else {
						t.Logf("%d of %d jobs claimed by their own insert", n, len(ids))
					}
				}
			})
		})
	}
}
