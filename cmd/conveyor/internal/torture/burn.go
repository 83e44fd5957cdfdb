package torture

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// roleBurn is the role of the CPU burner, the competing process of the cpu
// faults.
const roleBurn = "burn"

// burnSlot is the supervisor slot of the CPU burner.
const burnSlot = "b1"

// burnSlack is how long past the end the phase can take (its load and its
// longest drain) the burner lives before it exits by itself: it never
// outlives the run, even if the orchestrator cannot stop it.
const burnSlack = time.Minute

// minBusy is the share of the machine's CPU time that must have been busy
// while the burner ran for a cpu fault to count as in effect.
const minBusy = 0.9

// runBurner keeps w.threads goroutines spinning, with GOMAXPROCS set to
// match, so that each has an OS thread of its own and every core is kept
// at 100%, until ctx ends (SIGTERM) or w.until passes. It inherits the
// priority of the orchestrator, like the workers.
func runBurner(ctx context.Context, w *workerFlags, stdout io.Writer) error {
	n := w.threads
	if n <= 0 {
		n = 2 * runtime.NumCPU()
	}
	runtime.GOMAXPROCS(n)
	var stop atomic.Bool
	var sink atomic.Uint64
	for i := 0; i < n; i++ {
		go spin(&stop, &sink)
	}
	fmt.Fprintln(stdout, "ready")
	t := time.NewTimer(time.Until(w.until))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	stop.Store(true)
	return nil
}

// spin keeps one thread busy computing until stop is set. It does not
// allocate, so the burner costs the machine CPU time only.
func spin(stop *atomic.Bool, sink *atomic.Uint64) {
	x := uint64(1)
	for !stop.Load() {
		for i := 0; i < 1<<16; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		sink.Store(x)
	}
}

// burnState is what a cpu fault keeps about its burner during the phase.
type burnState struct {
	pid, threads int
	start        time.Time
	cpu0         cpuTimes
	burner0      uint64 // the burner's CPU ticks at start
	nice         string // the burner's and the workers' nice values

	// Measured when the burner is stopped.
	alive     bool
	busy      float64 // share of the machine's CPU time that was busy
	burnCores float64 // cores the burner got, on average
	seconds   float64
}

// startBurner starts the CPU burner (the inject step of the cpu faults):
// twice as many busy threads as the machine has CPUs, at the workers'
// priority, until stopBurner or, at the latest, the end of the phase plus
// burnSlack. The burner is no fault event: it kills, pauses and cuts off
// nobody, so it explains no duplicate execution or failed attempt.
func startBurner(ctx context.Context, p *phase) error {
	threads := 2 * runtime.NumCPU()
	until := time.Now().Add(p.budget + p.drainTimeout + burnSlack)
	cpu0, err := readCPUTimes()
	if err != nil {
		return fmt.Errorf("reading /proc/stat: %w", err)
	}
	args := []string{"--threads", strconv.Itoa(threads), "--until", until.Format(time.RFC3339Nano)}
	if err := p.sup.start(ctx, burnSlot, roleBurn, args); err != nil {
		return err
	}
	b := &burnState{pid: p.sup.current(burnSlot), threads: threads, start: time.Now(), cpu0: cpu0}
	b.burner0, _, _ = procStat(b.pid)
	b.nice = niceValues(p, b.pid)
	p.burn = b
	return nil
}

// niceValues describes the nice values of the burner and the workers.
func niceValues(p *phase, burner int) string {
	_, bn, err := procStat(burner)
	if err != nil {
		return "burner nice unknown"
	}
	var ws []string
	for pid := range p.sup.pids("worker") {
		if _, n, err := procStat(pid); err == nil && !slices.Contains(ws, strconv.Itoa(n)) {
			ws = append(ws, strconv.Itoa(n))
		}
	}
	slices.Sort(ws)
	return fmt.Sprintf("burner nice %d, workers nice %s", bn, strings.Join(ws, ","))
}

// stopBurner measures how busy the machine was and stops the burner (the
// stop step of the cpu faults, once the queue is drained).
func stopBurner(_ context.Context, p *phase) {
	b := p.burn
	if b == nil {
		return
	}
	b.alive = p.sup.current(burnSlot) == b.pid
	if cpu1, err := readCPUTimes(); err == nil && cpu1.total > b.cpu0.total {
		b.busy = float64(cpu1.busy-b.cpu0.busy) / float64(cpu1.total-b.cpu0.total)
	}
	b.seconds = time.Since(b.start).Seconds()
	if t, _, err := procStat(b.pid); err == nil && b.alive && b.seconds > 0 {
		b.burnCores = float64(t-b.burner0) / clockTicks / b.seconds
	}
	p.sup.stopRole(roleBurn, 10*time.Second)
}

// checkCPU checks a cpu fault: the burner ran all along and kept the cores
// busy, and no live worker lost a lease. Duplicate executions are left to
// the common checks, where nothing explains them: the burner is no fault
// event.
func checkCPU(_ context.Context, p *phase, rs *records, _ *Findings, in *Input) {
	b := p.burn
	if b == nil {
		p.fail("the CPU burner never started")
		return
	}
	p.injected = append(p.injected, fmt.Sprintf("CPU burner %s (pid %d, %d busy threads for %d CPUs; %s) for %.0fs, load and drain: cores %.1f%% busy, the burner got %.2f cores",
		burnSlot, b.pid, b.threads, runtime.NumCPU(), b.nice, b.seconds, 100*b.busy, b.burnCores))
	if !b.alive {
		p.fail("the CPU burner died before the queue was drained: the fault was not in effect all along")
	}
	if b.busy < minBusy {
		p.fail("the cores were busy %.1f%% of the time, under %.0f%%: the fault was not in effect", 100*b.busy, 100*minBusy)
	}
	checkNoRescue(p, rs, "while every core was busy")
	med, n := pickupLatency(in.Execs, p.loadStart, p.loadEnd)
	p.note("pick-up median %.0fms over %d jobs; db errors %d", float64(med.Microseconds())/1000, n, rs.sumCounter("db_errors"))
}

// checkNoRescue fails the phase when a live worker lost a lease or a job
// was rescued: in the faults that use it every worker process stays alive
// and connected, so a lease may expire only if a heartbeat came too late.
func checkNoRescue(p *phase, rs *records, while string) {
	if n := rs.sumCounter("leases_lost"); n > 0 {
		p.fail("%d leases lost %s: %s", n, while, rs.counterBy("leases_lost"))
	}
	if n := rs.sumCounter("rescued"); n > 0 {
		p.fail("%d jobs rescued %s, with every worker process alive: a heartbeat came too late", n, while)
	}
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// cpuTimes are the machine's CPU times from /proc/stat, in clock ticks:
// busy (everything but idle and iowait) and total.
type cpuTimes struct{ busy, total uint64 }

func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(first)
	if len(f) < 6 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("unexpected /proc/stat line %q", first)
	}
	var t cpuTimes
	// user nice system idle iowait irq softirq steal (guest time is
	// already counted in user and nice).
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, err
		}
		t.total += v
		if i != 3 && i != 4 {
			t.busy += v
		}
	}
	return t, nil
}

// procStat returns the CPU time (user and system, in clock ticks) and the
// nice value of process pid.
func procStat(pid int) (ticks uint64, nice int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// are counted from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime 15, nice 19.
	if len(f) < 17 {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	nice, err3 := strconv.Atoi(f[16])
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return ut + st, nice, nil
}
