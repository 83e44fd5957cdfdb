package torture

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// supervisor runs the processes of one phase: it starts them, restarts
// those that die (as systemd or Kubernetes would) and keeps the record of
// every fault it applied and every death.
type supervisor struct {
	exe  string
	pre  []string // arguments before the worker flags
	env  []string
	dir  string
	logf func(string, ...any)

	restartDelay time.Duration

	mu      sync.Mutex
	slots   map[string]*slot
	events  []Event
	deaths  map[int]time.Time
	closing bool
	wg      sync.WaitGroup
}

// slot is one supervised process and its successive incarnations.
type slot struct {
	name, role string
	args       []string
	inc        int
	cmd        *exec.Cmd
	pid        int
	alive      bool
	exited     chan struct{}
	// planned is set by a fault or a stop just before it signals the
	// process, so that its death is not reported as an unexpected exit.
	planned string
	stopped bool // do not restart
	exits   []string
}

func newSupervisor(exe string, pre, env []string, dir string, logf func(string, ...any)) *supervisor {
	return &supervisor{exe: exe, pre: pre, env: env, dir: dir, logf: logf,
		restartDelay: 500 * time.Millisecond, slots: map[string]*slot{}, deaths: map[int]time.Time{}}
}

// start launches a new slot and waits until its first incarnation is ready.
func (s *supervisor) start(ctx context.Context, name, role string, args []string) error {
	sl := &slot{name: name, role: role, args: args}
	s.mu.Lock()
	s.slots[name] = sl
	s.mu.Unlock()
	return s.launch(ctx, sl)
}

// launch starts the next incarnation of sl and waits for "ready".
func (s *supervisor) launch(ctx context.Context, sl *slot) error {
	s.mu.Lock()
	if s.closing || sl.stopped {
		s.mu.Unlock()
		return nil
	}
	proc := fmt.Sprintf("%s.%d", sl.name, sl.inc)
	sl.inc++
	s.mu.Unlock()
	args := append(append([]string{}, s.pre...), "--role", sl.role, "--proc", proc,
		"--record", filepath.Join(s.dir, proc+".jsonl"))
	args = append(args, sl.args...)
	cmd := exec.Command(s.exe, args...)
	cmd.Env = append(os.Environ(), s.env...)
	logFile, err := os.Create(filepath.Join(s.dir, proc+".log"))
	if err != nil {
		return err
	}
	cmd.Stderr = logFile
	// The child says "ready" on stdout. An os.Pipe rather than
	// StdoutPipe: Wait must not race with the reader.
	out, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return err
	}
	cmd.Stdout = w
	// The children die with the orchestrator, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	w.Close()
	if err != nil {
		out.Close()
		logFile.Close()
		return fmt.Errorf("starting %s: %w", proc, err)
	}
	ready := make(chan struct{})
	exited := make(chan struct{})
	s.mu.Lock()
	sl.cmd, sl.pid, sl.alive, sl.exited, sl.planned = cmd, cmd.Process.Pid, true, exited, ""
	s.mu.Unlock()
	go func() {
		defer out.Close()
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				once.Do(func() { close(ready) })
			}
		}
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := cmd.Wait()
		logFile.Close()
		at := time.Now()
		s.mu.Lock()
		sl.alive = false
		s.deaths[cmd.Process.Pid] = at
		planned := sl.planned
		if planned == "" {
			s.events = append(s.events, Event{Kind: EventExit, PID: cmd.Process.Pid, Start: at, End: at})
			sl.exits = append(sl.exits, fmt.Sprintf("%s: %v", proc, err))
		}
		restart := !s.closing && !sl.stopped
		s.mu.Unlock()
		close(exited)
		if restart {
			time.Sleep(s.restartDelay)
			if err := s.launch(context.Background(), sl); err != nil {
				s.logf("restarting %s: %v", sl.name, err)
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("%s exited before it was ready (see %s)", proc, filepath.Join(s.dir, proc+".log"))
	case <-time.After(90 * time.Second):
		return fmt.Errorf("%s not ready after 90s", proc)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// current returns the live pid of a slot (0 if it is not running).
func (s *supervisor) current(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.slots[name]
	if sl == nil || !sl.alive {
		return 0
	}
	return sl.pid
}

// names returns the slots of a role, sorted.
func (s *supervisor) names(role string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n, sl := range s.slots {
		if role == "" || sl.role == role {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// pids returns the live pids of every slot (of a role, if given).
func (s *supervisor) pids(role string) map[int]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]string{}
	for n, sl := range s.slots {
		if sl.alive && (role == "" || sl.role == role) {
			out[sl.pid] = n
		}
	}
	return out
}

// kill sends SIGKILL to a slot's process as fault kind and records it;
// the supervisor restarts it after its restart delay.
func (s *supervisor) kill(name, kind string) (int, error) {
	s.mu.Lock()
	sl := s.slots[name]
	if sl == nil || !sl.alive {
		s.mu.Unlock()
		return 0, fmt.Errorf("%s is not running", name)
	}
	sl.planned = kind
	pid := sl.pid
	at := time.Now()
	s.events = append(s.events, Event{Kind: kind, PID: pid, Start: at, End: at})
	s.mu.Unlock()
	return pid, syscall.Kill(pid, syscall.SIGKILL)
}

// killPID is kill for the slot running pid.
func (s *supervisor) killPID(pid int, kind string) (string, error) {
	name := s.pids("")[pid]
	if name == "" {
		return "", fmt.Errorf("pid %d is not one of ours", pid)
	}
	_, err := s.kill(name, kind)
	return name, err
}

// pause stops a slot's process with SIGSTOP for d, then resumes it, and
// records the pause. It always resumes the process.
func (s *supervisor) pause(ctx context.Context, name string, d time.Duration) (int, error) {
	pid := s.current(name)
	if pid == 0 {
		return 0, fmt.Errorf("%s is not running", name)
	}
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return pid, err
	}
	defer func() {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		s.mu.Lock()
		s.events = append(s.events, Event{Kind: EventPause, PID: pid, Start: start, End: time.Now()})
		s.mu.Unlock()
	}()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return pid, nil
}

// addEvent records a fault that the supervisor did not apply itself
// (database-side faults).
func (s *supervisor) addEvent(ev Event) {
	s.mu.Lock()
	s.events = append(s.events, ev)
	s.mu.Unlock()
}

// stopRole asks every process of a role to stop (SIGTERM), waits up to
// timeout, then kills what is left. Stopped slots are not restarted.
func (s *supervisor) stopRole(role string, timeout time.Duration) {
	s.mu.Lock()
	var waits []chan struct{}
	var victims []*slot
	now := time.Now()
	for _, sl := range s.slots {
		if sl.role != role {
			continue
		}
		sl.stopped = true
		if sl.alive {
			sl.planned = EventStop
			s.events = append(s.events, Event{Kind: EventStop, PID: sl.pid, Start: now, End: now})
			_ = syscall.Kill(sl.pid, syscall.SIGCONT)
			_ = syscall.Kill(sl.pid, syscall.SIGTERM)
			waits = append(waits, sl.exited)
			victims = append(victims, sl)
		}
	}
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for i, w := range waits {
		select {
		case <-w:
		case <-time.After(time.Until(deadline)):
			s.mu.Lock()
			if victims[i].alive {
				_ = syscall.Kill(victims[i].pid, syscall.SIGKILL)
			}
			s.mu.Unlock()
			<-w
		}
	}
}

// close kills every process still running and waits for them.
func (s *supervisor) close() {
	s.mu.Lock()
	s.closing = true
	for _, sl := range s.slots {
		sl.stopped = true
		if sl.alive {
			sl.planned = EventStop
			_ = syscall.Kill(sl.pid, syscall.SIGCONT)
			_ = syscall.Kill(sl.pid, syscall.SIGKILL)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// snapshot returns the events and deaths so far.
func (s *supervisor) snapshot() ([]Event, map[int]time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := append([]Event{}, s.events...)
	d := make(map[int]time.Time, len(s.deaths))
	for k, v := range s.deaths {
		d[k] = v
	}
	return ev, d
}

// unexpectedExits lists processes that exited on their own, by slot.
func (s *supervisor) unexpectedExits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sl := range s.slots {
		out = append(out, sl.exits...)
	}
	sort.Strings(out)
	return out
}

// scanLogs looks for data races and fatal errors in the processes'
// standard error.
func scanLogs(dir string) []string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, marker := range []string{"WARNING: DATA RACE", "fatal error:", "panic: "} {
			if i := strings.Index(string(b), marker); i >= 0 {
				out = append(out, fmt.Sprintf("%s: %s", filepath.Base(f), firstLine(string(b[i:]))))
			}
		}
	}
	return out
}
