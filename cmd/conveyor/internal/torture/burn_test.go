package torture

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestBurnerExitsByItself runs the CPU burner with a deadline 1.5s away
// and nobody to stop it: it must keep every core busy (all its spinning
// threads runnable at once, and the machine's CPU time busy) and exit by
// itself, successfully, at its deadline. How much CPU time the burner gets
// and how soon after its deadline it exits depend on what else the machine
// runs: they are logged, not asserted (a burner still alive 10s after its
// deadline fails, as one that would never exit).
func TestBurnerExitsByItself(t *testing.T) {
	if testing.Short() {
		t.Skip("loads every core for a second")
	}
	dir := t.TempDir()
	until := time.Now().Add(1500 * time.Millisecond)
	threads := 2 * runtime.NumCPU()
	cmd := exec.Command(os.Args[0], "--role", roleBurn, "--proc", "b1.0", "--record", filepath.Join(dir, "b1.0.jsonl"),
		"--threads", strconv.Itoa(threads), "--until", until.Format(time.RFC3339Nano))
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Every spinning thread runnable at once: seen in the thread states,
	// whatever share of the cores the machine's other processes leave
	// the burner (a runnable thread waiting for a core is "R" too).
	spinning := 0
	for spinning < threads && time.Now().Before(until.Add(-500*time.Millisecond)) {
		n, err := runnableThreads(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		spinning = max(spinning, n)
		time.Sleep(time.Millisecond)
	}
	if spinning < threads {
		t.Errorf("at most %d of the burner's threads runnable at once, want its %d spinning ones", spinning, threads)
	}
	// How busy the machine is while the burner runs (other processes
	// may take their share of it, the burner fills the rest).
	cpu0, err := readCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(until.Add(-100 * time.Millisecond)))
	cpu1, err := readCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("burner: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("the burner outlived its deadline by 10s")
	}
	late := time.Since(until)
	busy := float64(cpu1.busy-cpu0.busy) / float64(cpu1.total-cpu0.total)
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	t.Logf("%d threads runnable at once; cores %.1f%% busy while it ran; exited %v after its deadline (under -race a process sleeps 1s at exit); %v of CPU time",
		spinning, 100*busy, late.Round(time.Millisecond), used.Round(time.Millisecond))
	// Other processes only make the machine busier.
	if busy < minBusy {
		t.Errorf("cores %.1f%% busy while the burner ran, want %.0f%%", 100*busy, 100*minBusy)
	}
	if strings.TrimSpace(out.String()) != "ready" {
		t.Errorf("burner said %q, want ready", out.String())
	}
}

// TestCheckerCPUFaultExplainsNothing runs the cpu fault's burner under a
// supervisor, as a phase does, and checks that what the fault leaves in
// the checker's input excuses nothing: a rescue of a live worker's attempt
// and a failed attempt during the burn are both unexplained duplicates, and
// their overlap is a violation.
func TestCheckerCPUFaultExplainsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("loads every core for a moment")
	}
	dir := t.TempDir()
	p := &phase{o: &Options{Lease: 2 * time.Second}, budget: time.Second, drainTimeout: time.Second}
	p.sup = newSupervisor(os.Args[0], nil, []string{workerEnv + "=1"}, dir, t.Logf)
	defer p.sup.close()
	start := time.Now()
	if err := startBurner(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	stopBurner(context.Background(), p)
	if !p.burn.alive || p.burn.busy <= 0 {
		t.Fatalf("burner alive %v, cores busy %.2f", p.burn.alive, p.burn.busy)
	}
	p.sup.close()
	events, deaths := p.sup.snapshot()
	for _, ev := range events {
		if ev.PID == 0 || ev.Kind != EventStop {
			t.Errorf("the cpu fault recorded %+v", ev)
		}
	}

	// Workers 100 and 200 stayed alive all along.
	sec := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	tok := func(id int64) string { return "p1.0:" + strconv.FormatInt(id, 10) }
	in := &Input{Lease: 2 * time.Second, Acked: map[int64]string{1: tok(1), 2: tok(2)}, Events: events, Deaths: deaths,
		Jobs: map[int64]*FinalJob{
			1: {ID: 1, Kind: KindWork, State: "completed", Attempt: 2, Token: tok(1), Errors: []AttemptErr{expired(1)}},
			2: {ID: 2, Kind: KindWork, State: "completed", Attempt: 2, Token: tok(2), Errors: []AttemptErr{{Attempt: 1, Error: "database is locked"}}},
		},
		Execs: []Exec{
			{Job: 1, Attempt: 1, Kind: KindWork, Proc: "w1.0", PID: 100, Start: sec(0.05), End: sec(0.35), Outcome: OutcomeOK},
			{Job: 1, Attempt: 2, Kind: KindWork, Proc: "w2.0", PID: 200, Start: sec(0.2), End: sec(0.3), Outcome: OutcomeOK},
			{Job: 2, Attempt: 1, Kind: KindWork, Proc: "w1.0", PID: 100, Start: sec(0.1), End: sec(0.15), Outcome: OutcomeError},
			{Job: 2, Attempt: 2, Kind: KindWork, Proc: "w2.0", PID: 200, Start: sec(0.25), End: sec(0.3), Outcome: OutcomeOK},
		}}
	f := Check(in)
	if len(f.DuplicateCauses) != 0 || len(f.Unexplained) != 2 {
		t.Fatalf("explained %v, unexplained %v", f.DuplicateCauses, f.Unexplained)
	}
	assertFailure(t, f, "premature rescue")
	assertFailure(t, f, "failed: database is locked")
	assertFailure(t, f, "1 overlapping executions")
}

// TestBlkioThrottle creates the cpudisk fault's throttle on the temporary
// directory's disk, has a child process join it and write 4 MiB with
// direct I/O, and checks that the writes went through the throttle at its
// rate and that the cgroup is removed. Skipped, with the reason, where the
// throttle cannot be applied; under CI (testdb.Strict) that fails.
func TestBlkioThrottle(t *testing.T) {
	if testing.Short() {
		t.Skip("writes through a throttle for half a second")
	}
	dir := t.TempDir()
	th, err := newBlkioThrottle("conveyor-torture-test-"+strconv.Itoa(os.Getpid()), filepath.Join(dir, "torture.db"))
	if err != nil {
		testdb.Missing(t, "the cpudisk fault's disk throttle (root and a cgroup v1 blkio hierarchy): %v", err)
	}
	defer func() {
		if err := th.remove(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(th.dir); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", th.dir, err)
		}
	}()
	t.Log(th.describe())
	const requests, size = 64, 64 << 10
	start := time.Now()
	script := `echo $$ > "$1/cgroup.procs" && exec dd if=/dev/zero of="$2" bs=` + strconv.Itoa(size) + ` count=` + strconv.Itoa(requests) + ` oflag=direct status=none`
	if out, err := exec.Command("sh", "-c", script, "sh", th.dir, filepath.Join(dir, "probe")).CombinedOutput(); err != nil {
		t.Fatalf("writing through the throttle: %v: %s", err, out)
	}
	took := time.Since(start)
	ios, bytes, err := th.served()
	if err != nil {
		t.Fatal(err)
	}
	want := max(time.Duration(requests*size)*time.Second/diskWriteBPS, requests*time.Second/diskWriteIOPS)
	t.Logf("%d KiB in %v (%v at the throttle's rate): %d writes, %d bytes through the throttle", requests*size>>10, took.Round(time.Millisecond), want, ios, bytes)
	if ios < requests || bytes < requests*size {
		t.Errorf("%d writes and %d bytes went through the throttle, want at least %d and %d", ios, bytes, requests, requests*size)
	}
	// The throttle lets a short burst through at once: half the time.
	if took < want/2 {
		t.Errorf("written in %v: not throttled", took)
	}
}

// runnableThreads counts the threads of process pid in state R (running,
// or runnable and waiting for a core).
func runnableThreads(pid int) (int, error) {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, d.Name()))
		if err != nil {
			continue // the thread ended
		}
		// The command name is in parentheses and may hold spaces: the
		// state is the first field after the last ')'.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 0 && f[0] == "R" {
				n++
			}
		}
	}
	return n, nil
}
