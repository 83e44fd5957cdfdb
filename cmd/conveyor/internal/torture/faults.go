package torture

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// fault is one kind of fault: how to set up its phase, how to inject it
// and what to check beyond the common checks.
type fault struct {
	name string
	doc  string
	// restarts is set for the fault that restarts the database server.
	restarts bool
	// patroni is set for the faults that act on the Patroni cluster of
	// Options.Patroni (skipped without one).
	patroni bool
	// cluster is set for faults that need Options.Cluster.
	cluster bool
	// whole is set for faults that last the whole phase: they start at
	// once, without a warm-up, and have no recovery time.
	whole bool
	// exclusive is set for faults that load the whole machine: no other
	// phase of this process runs at the same time, so that a phase run
	// alongside (the tests run PostgreSQL and MySQL side by side) is not
	// starved by them and blamed for it.
	exclusive bool
	applies   func(backend string) string // "" if it applies, else why not
	prepare   func(ctx context.Context, p *phase) error
	inject    func(ctx context.Context, p *phase) error
	// stop, if set, ends a whole-phase fault once the queue is drained,
	// before the workers are stopped.
	stop  func(ctx context.Context, p *phase)
	check func(ctx context.Context, p *phase, rs *records, fd *Findings, in *Input)
}

// leaderTTL is the engine's maintenance leadership TTL: when the leader
// dies, nobody rescues or promotes for up to this long.
const leaderTTL = 15 * time.Second

func always(string) string { return "" }

func servers(backend string) string {
	if backend == "sqlite" {
		return "SQLite has no server connections"
	}
	return ""
}

var faults = []*fault{
	{
		name:    "kill",
		doc:     "kill -9 of a worker process in the middle of jobs: its jobs are rescued after the lease and completed by others",
		applies: always,
		inject:  injectKill,
		check:   checkKill,
	},
	{
		name:    "pause",
		doc:     "SIGSTOP of a worker past its lease while others claim its jobs, then SIGCONT: its late acknowledgements are refused",
		applies: always,
		inject:  injectPause,
		check:   checkPause,
	},
	{
		name:     "restart",
		doc:      "the database restarted under load (PostgreSQL immediate restart, MariaDB kill -9 and start, SQLite: the writing process killed mid-transaction)",
		restarts: true,
		applies:  always,
		inject:   injectRestart,
		check:    checkReconnect,
	},
	patroniFault("switchover",
		"Patroni switches the primary over to the synchronous standby under load (synchronous_mode; the DSN names every node with target_session_attrs=read-write): a pause, then work flows on the new primary, LISTEN comes back, nothing acknowledged is lost; runs only against the cluster of Options.Patroni",
		EventSwitchover),
	patroniFault("failover",
		"kill -9 of the primary's postmaster of a Patroni cluster under load, and Patroni promotes the synchronous standby: same checks as switchover",
		EventFailover),
	{
		name:    "node-kill",
		doc:     "kill -9 of one node of a multi-primary cluster (MariaDB Galera) under load, then its restart and rejoin: the other nodes' processes go on, the dead node's jobs are rescued after their lease",
		cluster: true,
		applies: func(b string) string {
			if b != "mysql" {
				return "a Galera cluster is MariaDB's"
			}
			return ""
		},
		inject: injectNodeKill,
		check:  checkNodeKill,
	},
	{
		name:    "connkill",
		doc:     "the server kills the workers' connections under load (pg_terminate_backend, KILL CONNECTION)",
		applies: servers,
		inject:  injectConnKill,
		check:   checkReconnect,
	},
	skewFault("skew+5m", 5*time.Minute),
	skewFault("skew-5m", -5*time.Minute),
	{
		name:    "poison",
		doc:     "poison jobs (panic, os.Exit, never return): each is discarded after its maximum attempts while the rest flows",
		applies: always,
		inject:  injectPoison,
		check:   checkPoison,
	},
	{
		name:      "cpu",
		doc:       "every core saturated for the whole phase by a competing process (two busy threads per core, at the workers' priority): no lease lost, nothing rescued, and no duplicate execution is excused by it",
		whole:     true,
		exclusive: true,
		applies:   always,
		inject:    startBurner,
		stop:      stopBurner,
		check:     checkCPU,
	},
	{
		name:      "cpudisk",
		doc:       "cpu, and the writes of the run's own processes throttled by a blkio cgroup of the run (SQLite only; skipped with the reason where it cannot be applied): same checks",
		whole:     true,
		exclusive: true,
		applies: func(b string) string {
			if b != "sqlite" {
				return "would throttle the database server's own process"
			}
			return ""
		},
		prepare: prepareDiskThrottle,
		inject:  injectCPUDisk,
		stop:    stopCPUDisk,
		check:   checkCPUDisk,
	},
	{
		name:    "smallpool",
		doc:     "a connection pool smaller than the worker concurrency, with handlers that use conveyor's connections for most of the lease: heartbeats and claims get through, no lease expires",
		whole:   true,
		applies: always,
		prepare: prepareSmallPool,
		inject:  func(context.Context, *phase) error { return nil },
		check:   checkSmallPool,
	},
	{
		name:    "txrollback",
		doc:     "transactional enqueues rolled back at random under concurrency: exactly the committed jobs exist",
		whole:   true,
		applies: always,
		prepare: func(_ context.Context, p *phase) error {
			p.producerRole = "txproducer"
			p.p1Args = append(p.p1Args, "--rollback", "0.4", "--goroutines", "4")
			return nil
		},
		inject: func(context.Context, *phase) error { return nil },
		check:  checkTx,
	},
}

// FaultNames lists the faults in the order a run applies them, with what
// each one does.
func FaultNames() [][2]string {
	out := make([][2]string, len(faults))
	for i, f := range faults {
		out[i] = [2]string{f.name, f.doc}
	}
	return out
}

func selectFaults(names []string) ([]*fault, error) {
	if len(names) == 0 {
		return faults, nil
	}
	var out []*fault
	for _, n := range names {
		var found *fault
		for _, f := range faults {
			if f.name == strings.TrimSpace(n) {
				found = f
			}
		}
		if found == nil {
			var all []string
			for _, f := range faults {
				all = append(all, f.name)
			}
			return nil, fmt.Errorf("torture: unknown fault %q (faults: %s)", n, strings.Join(all, ", "))
		}
		out = append(out, found)
	}
	return out, nil
}

func injectKill(ctx context.Context, p *phase) error {
	victim := p.pickWorker(ctx, false)
	if victim == "" {
		return fmt.Errorf("no live worker to kill")
	}
	pid, err := p.sup.kill(victim, EventKill)
	if err != nil {
		return err
	}
	p.injected = append(p.injected, fmt.Sprintf("kill -9 %s (pid %d)", victim, pid))
	p.faultEnd = time.Now()
	// A long phase also kills the maintenance leader: rescues wait for its
	// leadership to expire.
	if p.budget >= 30*time.Second {
		sleepUntil(ctx, p.loadStart.Add(p.budget/2))
		if l := p.pickWorker(ctx, true); l != "" {
			pid, err := p.sup.kill(l, EventKill)
			if err != nil {
				return err
			}
			p.injected = append(p.injected, fmt.Sprintf("kill -9 of the leader %s (pid %d)", l, pid))
			p.faultEnd = time.Now()
			p.drainTimeout += leaderTTL
		}
	}
	return nil
}

func checkKill(_ context.Context, p *phase, _ *records, _ *Findings, in *Input) {
	n, _, worst, unrescued := rescueLatency(in, EventKill)
	p.injected = append(p.injected, fmt.Sprintf("%d executions cut short, each started again within %.1fs", n, worst.Seconds()))
	if unrescued > 0 {
		p.fail("%d executions cut short by the kill never ran again", unrescued)
	}
}

func injectPause(ctx context.Context, p *phase) error {
	victim := p.pickWorker(ctx, false)
	if victim == "" {
		return fmt.Errorf("no live non-leader worker to pause")
	}
	d := 2*p.o.Lease + time.Second
	pid, err := p.sup.pause(ctx, victim, d)
	p.faultEnd = time.Now()
	p.injected = append(p.injected, fmt.Sprintf("SIGSTOP %s (pid %d) for %v (lease %v), then SIGCONT", victim, pid, d, p.o.Lease))
	return err
}

func checkPause(_ context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	var pid int
	for _, ev := range in.Events {
		if ev.Kind == EventPause {
			pid = ev.PID
		}
	}
	var proc string
	for pr, id := range rs.pids {
		if id == pid {
			proc = pr
		}
	}
	refused := rs.counters[proc]["stale_acks_refused"]
	p.injected = append(p.injected, fmt.Sprintf("%d late successful executions, paused process refused %d stale acks, %d overlaps past the lease",
		fd.LateAcks, refused, fd.OverlapsExplained))
	if fd.DuplicateCauses["lease expired: "+EventPause] == 0 {
		p.note("no job of the paused process was claimed by another (none in flight?)")
	}
}

func injectRestart(ctx context.Context, p *phase) error {
	if p.backend == "sqlite" {
		return killSQLiteWriters(ctx, p, 3)
	}
	t0 := time.Now()
	desc, err := restartServer(ctx, p.adm)
	t1 := time.Now()
	p.sup.addEvent(Event{Kind: EventDBRestart, Start: t0, End: t1})
	p.faultEnd = t1
	p.injected = append(p.injected, fmt.Sprintf("%s, accepting connections again after %.1fs", desc, t1.Sub(t0).Seconds()))
	return err
}

// killSQLiteWriters kills, n times, whichever of the phase's processes
// holds SQLite's write lock, that is, is inside a write transaction.
func killSQLiteWriters(ctx context.Context, p *phase, n int) error {
	killed := 0
	var who []string
	for k := 0; k < n && ctx.Err() == nil; k++ {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			pid, err := sqliteWriter(p.dsn)
			if err != nil {
				return err
			}
			if pid != 0 && p.sup.pids("")[pid] != "" {
				name, err := p.sup.killPID(pid, EventWriterKill)
				if err == nil {
					killed++
					who = append(who, name)
					break
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
		p.faultEnd = time.Now()
		if k+1 < n {
			sleepUntil(ctx, time.Now().Add(time.Second))
		}
	}
	p.injected = append(p.injected, fmt.Sprintf("kill -9 of the process holding the write lock, %d times (%s)", killed, strings.Join(who, ", ")))
	if killed == 0 {
		return fmt.Errorf("never caught a process inside a write transaction")
	}
	return nil
}

func injectConnKill(ctx context.Context, p *phase) error {
	_, port, err := hostPort(p.dsn)
	if err != nil {
		return err
	}
	start := time.Now()
	total, rounds := 0, 3
	for r := 0; r < rounds; r++ {
		ports := map[int]bool{}
		for pid := range p.sup.pids("") {
			ps, err := clientPorts(pid, port)
			if err != nil {
				continue
			}
			for k := range ps {
				ports[k] = true
			}
		}
		n, err := p.adm.killConnections(ctx, ports)
		if err != nil {
			return err
		}
		total += n
		if r+1 < rounds {
			sleepUntil(ctx, time.Now().Add(700*time.Millisecond))
		}
	}
	p.faultEnd = time.Now()
	p.sup.addEvent(Event{Kind: EventConnKill, Start: start, End: p.faultEnd})
	how := map[string]string{"postgres": "pg_terminate_backend", "mysql": "KILL CONNECTION"}[p.backend]
	p.injected = append(p.injected, fmt.Sprintf("%s of %d worker and producer connections in %d rounds", how, total, rounds))
	return nil
}

// checkReconnect checks that work flows again after a database fault and,
// on PostgreSQL, that the notification listener came back: workers poll
// only every 5s there, so a quick pick-up means LISTEN works again.
func checkReconnect(ctx context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	if p.backend == "sqlite" {
		if s, err := p.adm.integrity(ctx); err != nil || s != "ok" {
			p.fail("integrity check after the kills: %q %v", s, err)
		} else {
			p.note("integrity_check ok")
		}
	}
	from := p.faultEnd.Add(p.o.Lease + time.Second)
	med, n := pickupLatency(in.Execs, from, p.loadEnd)
	if n == 0 {
		p.fail("no job enqueued after the fault was picked up")
		return
	}
	p.note("pick-up median %.0fms over %d jobs enqueued after the fault", float64(med.Microseconds())/1000, n)
	if p.backend == "postgres" && med > time.Second {
		p.fail("the notification listener did not come back: pick-up median %v (fallback poll 5s)", med)
	}
}

func skewFault(name string, workerSkew time.Duration) *fault {
	return &fault{
		name: name,
		doc: fmt.Sprintf("worker clocks %+v from the database's (the database runs under libfaketime at %+v): no premature rescue, no late one",
			workerSkew, -workerSkew),
		whole: true,
		applies: func(b string) string {
			if b == "sqlite" {
				return "out of scope: SQLite's clock is the process's own clock"
			}
			return ""
		},
		prepare: func(ctx context.Context, p *phase) error {
			// libfaketime cannot skew a Go program (the runtime reads
			// the clock through the vDSO, not libc), so the workers keep
			// the real clock and a private server gets the opposite skew.
			s, err := startPrivate(ctx, p.backend, -workerSkew)
			if err != nil {
				return fmt.Errorf("skipped: private %s server under libfaketime: %v", p.backend, err)
			}
			p.private, p.dsn = s, s.dsn
			if workerSkew > 0 && p.tick > 0 {
				// A slot is due by the clock of the process that
				// enqueues it: with the database's clock behind, its
				// job would wait that long (5 minutes) to be due.
				p.tick = 0
				p.note("periodic job not run: its slots are due by the workers' clock, %v ahead of the database's", workerSkew)
			}
			p.producerArgs = append(p.producerArgs, "--long-every", "32", "--long-ms", fmt.Sprint((3 * p.o.Lease).Milliseconds()))
			// A long job enqueued at the end of the load runs that long
			// in the drain.
			p.drainTimeout += 3 * p.o.Lease
			return nil
		},
		inject: func(ctx context.Context, p *phase) error {
			off, err := p.adm.clockOffset(ctx)
			if err != nil {
				return err
			}
			p.dbOffset = off
			p.injected = append(p.injected, fmt.Sprintf("worker clocks %+.1fs from a private database's", -off.Seconds()))
			if d := -off - workerSkew; d > 5*time.Second || d < -5*time.Second {
				p.fail("clock skew not in effect: measured %v, wanted %v", -off, workerSkew)
			}
			sleepUntil(ctx, p.loadStart.Add(p.budget/2))
			victim := p.pickWorker(ctx, false)
			if victim == "" {
				return fmt.Errorf("no live non-leader worker to kill")
			}
			if _, err := p.sup.kill(victim, EventKill); err != nil {
				return err
			}
			p.injected = append(p.injected, "kill -9 "+victim)
			return nil
		},
		check: func(_ context.Context, p *phase, rs *records, fd *Findings, in *Input) {
			n, best, worst, unrescued := rescueLatency(in, EventKill)
			bound := p.o.Lease + max(p.o.Lease/8, 50*time.Millisecond) + 2*time.Second
			p.injected = append(p.injected, fmt.Sprintf("%d executions cut short, started again %.1fs to %.1fs after the kill (allowed %.1fs to %.1fs)",
				n, best.Seconds(), worst.Seconds(), (p.o.Lease/2).Seconds(), bound.Seconds()))
			if worst > bound {
				p.fail("late rescue: %v after the kill (lease %v)", worst, p.o.Lease)
			}
			// The last renewal was at most one heartbeat interval
			// (Lease/5) before the kill, so no lease ends sooner than
			// about 4/5 of a lease after it.
			if n > unrescued && best < p.o.Lease/2 {
				p.fail("premature rescue: %v after the kill (lease %v)", best, p.o.Lease)
			}
			if unrescued > 0 {
				p.fail("%d executions cut short never ran again", unrescued)
			}
			if l := rs.sumCounter("leases_lost"); l > 0 {
				p.fail("live workers lost %d leases (premature rescue): %s", l, rs.counterBy("leases_lost"))
			}
			var long int
			for _, e := range in.Execs {
				if e.Outcome == OutcomeOK && e.End.Sub(e.Start) > 2*p.o.Lease {
					long++
				}
			}
			p.note("%d jobs ran longer than two leases on heartbeats alone", long)
		},
	}
}

// poisonCounts is how many jobs of each poison kind the poison fault
// enqueues.
var poisonCounts = map[string]int{KindPanic: 3, KindExit: 2, KindHang: 2}

const poisonAttempts = 3

func injectPoison(ctx context.Context, p *phase) error {
	p.expectExits = true
	// Each attempt of a poison job may cost up to a lease (and the
	// handler's timeout) before it is rescued, plus one leadership TTL
	// when an exit job killed the leader.
	p.drainTimeout = max(45*time.Second, poisonAttempts*(p.o.Lease+2*time.Second)+leaderTTL)
	if slices.Contains(p.o.PoisonKinds, KindExit) {
		// Exit jobs get a worker process of their own: were they claimed
		// with a hanging job, their exit would end it too.
		if err := p.sup.start(ctx, "x1", "worker", append(slices.Clone(p.workerArgs), "--queue", QueueExit, "--workers", "4")); err != nil {
			return err
		}
		// The poison starts once that process is ready: its start is
		// not the poison, and on a machine whose cores are saturated it
		// costs the other workers seconds of CPU.
		p.faultStart = time.Now()
	}
	var parts []string
	for _, kind := range p.o.PoisonKinds {
		n, ok := poisonCounts[kind]
		if !ok {
			return fmt.Errorf("unknown poison kind %q (panic, exit, hang)", kind)
		}
		if p.budget < 20*time.Second {
			// A short phase: an exit job costs up to one leadership TTL
			// per attempt when it kills the leader.
			n = min(n, map[string]int{KindPanic: 2, KindExit: 1, KindHang: 1}[kind])
		}
		p.poison[kind] = true
		for i := 0; i < n; i++ {
			tok := fmt.Sprintf("orchestrator:%s:%d", kind, i)
			b, _ := json.Marshal(payload{Tok: tok, Enq: time.Now().UnixNano()})
			// Ahead of every ordinary job: each attempt takes a worker
			// first (the worst case for the rest of the queue), and the
			// attempts end within the drain however deep a backlog a
			// saturated machine has left behind the producers.
			opts := &conveyor.EnqueueOpts{Queue: Queue, MaxAttempts: poisonAttempts, Priority: -1}
			switch kind {
			case KindHang:
				opts.Timeout = time.Second
			case KindExit:
				opts.Queue = QueueExit
			}
			id, err := p.client.Enqueue(ctx, conveyor.RawArgs{KindName: kind, JSON: b}, opts)
			if err != nil {
				return err
			}
			p.rec.write(line{T: lineEnq, Job: id, Tok: tok, Kind: kind})
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, kind))
	}
	p.injected = append(p.injected, fmt.Sprintf("%s jobs (max %d attempts; exit jobs on a queue and a process of their own)", strings.Join(parts, ", "), poisonAttempts))
	return nil
}

func checkPoison(_ context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	var ids []int64
	for id, j := range in.Jobs {
		if p.poison[j.Kind] {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	for _, id := range ids {
		j := in.Jobs[id]
		if j.State == "discarded" && (j.Attempt != poisonAttempts || len(j.Errors) < poisonAttempts) {
			p.fail("poison %s job %d discarded after %d attempts with %d errors, want %d", j.Kind, id, j.Attempt, len(j.Errors), poisonAttempts)
		}
		if j.State != "discarded" {
			p.note("poison %s job %d is %s at attempt %d", j.Kind, id, j.State, j.Attempt)
		}
	}
	for _, e := range p.sup.unexpectedExits() {
		if !strings.HasPrefix(e, "x1.") || !strings.Contains(e, "exit status 3") {
			p.fail("process exited by itself: %s", e)
		}
	}
	// The rest keeps flowing: ordinary jobs complete at half the rate
	// they were asked for or better while the poison jobs fail. Two
	// things bound that rate on a machine whose cores other work
	// saturates, and the check measures against the lower: the rate the
	// producers managed to enqueue at in the same seconds, and the rate
	// the same workers completed ordinary jobs at before the poison came
	// (the warm-up, from its second second: the first fills the
	// pipeline). A queue that poison jobs stall still fails: it completes
	// less than half of what it did, or of what was enqueued, without them.
	ordinary := func(from, to time.Time) float64 {
		n := 0
		for _, e := range in.Execs {
			if e.Outcome == OutcomeOK && !p.poison[e.Kind] && e.End.After(from) && e.End.Before(to) {
				n++
			}
		}
		return float64(n) / to.Sub(from).Seconds()
	}
	acked := 0
	for id, at := range in.AckedAt {
		if j := in.Jobs[id]; j != nil && !p.poison[j.Kind] && at.After(p.faultStart) && at.Before(p.loadEnd) {
			acked++
		}
	}
	rate := ordinary(p.faultStart, p.loadEnd)
	offered := float64(acked) / p.loadEnd.Sub(p.faultStart).Seconds()
	before := ordinary(p.loadStart.Add(time.Second), p.faultStart)
	p.note("ordinary jobs completed at %.0f/s while poisoned (enqueued at %.0f/s, asked for %.0f/s; completed at %.0f/s before the poison)", rate, offered, p.o.Rate, before)
	if rate < 0.5*min(p.o.Rate, offered, before) {
		p.fail("the rest of the queue did not keep flowing: %.0f jobs/s, enqueued %.0f/s, %.0f/s before the poison", rate, offered, before)
	}
}

// The smallpool fault's handlers use conveyor's connections back to back
// for between these fractions of the workers' lease.
const (
	smallPoolMinLease = 0.5
	smallPoolMaxLease = 0.9
)

// smallPoolLoad is the share of the handler slots the smallpool fault's
// enqueue rate keeps busy: under 1, so that no backlog builds up and the
// queue drains within about one job's length whatever the lease.
const smallPoolLoad = 0.75

func prepareSmallPool(_ context.Context, p *phase) error {
	// By default one connection: claims, heartbeats, completions,
	// maintenance and every handler share it (on SQLite it is the read
	// pool; writes always share the one write connection).
	pool := p.o.SmallPool
	conc := max(2*p.o.Concurrency, 32)
	lo := time.Duration(smallPoolMinLease * float64(p.o.Lease))
	hi := time.Duration(smallPoolMaxLease * float64(p.o.Lease))
	slots := float64(p.o.Workers * conc)
	p.rate = min(p.o.Rate, smallPoolLoad*slots/((lo+hi)/2).Seconds())
	p.workerArgs = append(p.workerArgs, "--pool", fmt.Sprint(pool), "--workers", fmt.Sprint(conc))
	p.producerArgs = append(p.producerArgs, "--dbwork", "--min-ms", fmt.Sprint(lo.Milliseconds()), "--max-ms", fmt.Sprint(hi.Milliseconds()))
	p.injected = append(p.injected, fmt.Sprintf("PoolSize %d, %d concurrent handlers per process each using conveyor's connections back to back for %v-%v (%.0f%%-%.0f%% of the %v lease), %.1f jobs/s (%.0f%% of the handler slots)",
		pool, conc, lo, hi, 100*smallPoolMinLease, 100*smallPoolMaxLease, p.o.Lease, p.rate, 100*smallPoolLoad))
	return nil
}

func checkSmallPool(_ context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	checkNoRescue(p, rs, "while the pool was starved")
	var held []time.Duration
	for _, e := range in.Execs {
		if e.Kind == KindDBWork && e.Outcome == OutcomeOK {
			held = append(held, e.End.Sub(e.Start))
		}
	}
	if len(held) > 0 {
		slices.Sort(held)
		p.note("dbwork handlers held conveyor's connections %.2fs to %.2fs (median %.2fs) over %d executions",
			held[0].Seconds(), held[len(held)-1].Seconds(), held[len(held)/2].Seconds(), len(held))
	}
	med, n := pickupLatency(in.Execs, p.loadStart, p.loadEnd)
	p.note("pick-up median %.0fms over %d jobs; db errors %d", float64(med.Microseconds())/1000, n, rs.sumCounter("db_errors"))
}

func checkTx(_ context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	committed := 0
	for _, tok := range rs.acked {
		if strings.HasPrefix(tok, "p1.") {
			committed++
		}
	}
	p.injected = append(p.injected, fmt.Sprintf("%d jobs committed, %d rolled back, %d with an unknown outcome, 4 concurrent transactions; unique jobs of the same keys enqueued inside them and by a plain producer",
		committed, len(rs.rolledBack), rs.ambiguous))
	if rs.failedTx > 0 {
		p.note("%d of the rolled-back jobs were in transactions whose enqueue failed, as: %s", rs.failedTx, firstLine(rs.failedTxErr))
	}
}

// nodeKillVictim is the node the node-kill fault kills: the second, which
// neither the orchestrator's client nor a producer uses.
const nodeKillVictim = 1

// injectNodeKill kills one node of the cluster, waits until the others
// have evicted it, leaves it down for a lease and a second (so that the
// leases its processes held expire and are rescued elsewhere), then
// restarts it when the cluster can.
func injectNodeKill(ctx context.Context, p *phase) error {
	c := p.o.Cluster
	var on []string
	pids := map[int]string{}
	for name, node := range p.nodeOf {
		if node == nodeKillVictim {
			on = append(on, name)
			if pid := p.sup.current(name); pid != 0 {
				pids[pid] = name
			}
		}
	}
	sort.Strings(on)
	// Kill it with jobs in flight on it, when that happens within 3s.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		open := p.inFlight()
		n := 0
		for _, name := range on {
			n += open[name]
		}
		if n > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l := p.leader(ctx); l != "" && p.nodeOf[l] == nodeKillVictim {
		// Rescues wait for the dead node's leader's leadership to expire.
		p.drainTimeout += leaderTTL
	}
	t0 := time.Now()
	if err := c.Kill(nodeKillVictim); err != nil {
		return fmt.Errorf("killing node %d: %w", nodeKillVictim+1, err)
	}
	err := c.Evicted(ctx)
	t1 := time.Now()
	// Until the survivors evict the dead node, no node commits: every
	// process's writes (renewals too) wait.
	p.sup.addEvent(Event{Kind: EventClusterStall, Start: t0, End: t1})
	if err != nil {
		return fmt.Errorf("the nodes left did not evict node %d: %w", nodeKillVictim+1, err)
	}
	p.nodeStallEnd = t1
	sleepUntil(ctx, t1.Add(p.o.Lease+time.Second))
	desc := "left down"
	if c.Restart != nil {
		t2 := time.Now()
		if err := c.Restart(ctx, nodeKillVictim); err != nil {
			return fmt.Errorf("restarting node %d: %w", nodeKillVictim+1, err)
		}
		desc = fmt.Sprintf("restarted, rejoined in %.1fs", time.Since(t2).Seconds())
	}
	p.faultEnd = time.Now()
	for pid := range pids {
		p.sup.addEvent(Event{Kind: EventNodeKill, PID: pid, Start: t0, End: p.faultEnd})
	}
	p.injected = append(p.injected, fmt.Sprintf("kill -9 of node %d of %d (processes on it: %s); the others took writes again after %.1fs; %s",
		nodeKillVictim+1, len(c.DSNs), strings.Join(on, ", "), t1.Sub(t0).Seconds(), desc))
	return nil
}

// checkNodeKill checks that the processes on the other nodes completed
// jobs while the killed node was down (after its eviction), and that work
// flows again after the node came back.
func checkNodeKill(ctx context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	checkReconnect(ctx, p, rs, fd, in)
	if p.nodeStallEnd.IsZero() {
		return
	}
	survivors := 0
	for _, e := range in.Execs {
		name, _, _ := strings.Cut(e.Proc, ".")
		node, ok := p.nodeOf[name]
		if ok && node != nodeKillVictim && e.Outcome != "" && e.End.After(p.nodeStallEnd) && e.End.Before(p.faultEnd) {
			survivors++
		}
	}
	if survivors == 0 {
		p.fail("no process on the nodes left completed a job while node %d was down", nodeKillVictim+1)
		return
	}
	p.note("%d executions on the nodes left while node %d was down; %d duplicate executions (%v)",
		survivors, nodeKillVictim+1, fd.Duplicates, fd.DuplicateCauses)
}
