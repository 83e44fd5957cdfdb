package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPU shares of the steady workload come from /proc: the machine's
// jiffies (/proc/stat) and those of the database server's processes and
// of the bench's own (/proc/<pid>/stat). The server's are read only when
// it runs on this machine (a loopback or Unix-socket DSN whose server
// process is found in /proc); otherwise the share is unavailable and
// said so.

// cpuTimes is one reading of the jiffies counted.
type cpuTimes struct {
	total, idle int64 // machine, all cores
	server      int64 // the database server's processes; -1 unknown
	self        int64 // this process
}

// cpuReader reads cpuTimes; server lists the server's process ids at the
// time of each reading (nil when unavailable).
type cpuReader struct {
	server func() []int
	// cumulative: the first listed pid is the parent of the others and
	// reaps them, so its children's time (cutime, cstime) counts too
	// (PostgreSQL's postmaster and its short-lived backends).
	cumulative bool
	source     string
}

// procStat returns a process's utime+stime and cutime+cstime (jiffies)
// and its parent pid.
func procStat(pid int) (own, children int64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command may hold spaces and parentheses: fields follow the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("bench: /proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("bench: /proc/%d/stat: unexpected format", pid)
	}
	num := func(n int) int64 { v, _ := strconv.ParseInt(f[n-3], 10, 64); return v }
	return num(14) + num(15), num(16) + num(17), int(num(4)), nil
}

// procComm returns a process's command name.
func procComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// machineTimes returns the machine's total and idle (idle + iowait)
// jiffies over all cores.
func machineTimes() (total, idle int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("bench: /proc/stat: unexpected format")
	}
	for i := 1; i < len(f) && i <= 8; i++ { // user..steal; guest is within user
		v, _ := strconv.ParseInt(f[i], 10, 64)
		total += v
		if i == 4 || i == 5 {
			idle += v
		}
	}
	return total, idle, nil
}

// children lists the processes whose parent is ppid.
func children(ppid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, _, pp, err := procStat(pid); err == nil && pp == ppid {
			out = append(out, pid)
		}
	}
	return out
}

// byComm lists the processes named one of names.
func byComm(names ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c := procComm(pid)
		for _, n := range names {
			if c == n {
				out = append(out, pid)
			}
		}
	}
	return out
}

// localHost reports whether host names this machine: a loopback address,
// localhost, or a Unix socket directory.
func localHost(host string) bool {
	if host == "" || strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// pgServerCPU returns the reader of a PostgreSQL server's processes: the
// postmaster (the parent of the backend whose pid is given) and its
// children, found again at each reading.
func pgServerCPU(host string, backendPid int) cpuReader {
	if !localHost(host) {
		return cpuReader{source: "unavailable: the server is not on loopback"}
	}
	_, _, pm, err := procStat(backendPid)
	if err != nil || procComm(backendPid) != "postgres" || procComm(pm) != "postgres" {
		return cpuReader{source: fmt.Sprintf("unavailable: backend pid %d is not a postgres process of this machine", backendPid)}
	}
	return cpuReader{
		server:     func() []int { return append([]int{pm}, children(pm)...) },
		cumulative: true,
		source:     fmt.Sprintf("/proc: postmaster %d and its children (every server process)", pm),
	}
}

// myServerCPU returns the reader of a MySQL/MariaDB server: the process
// whose pid its pid file holds, else the one mariadbd or mysqld process of
// this machine.
func myServerCPU(host, pidFile string) cpuReader {
	if !localHost(host) {
		return cpuReader{source: "unavailable: the server is not on loopback"}
	}
	pid := 0
	if b, err := os.ReadFile(filepath.Clean(pidFile)); err == nil && pidFile != "" {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if c := procComm(pid); pid == 0 || (c != "mariadbd" && c != "mysqld") {
		ps := byComm("mariadbd", "mysqld")
		if len(ps) != 1 {
			return cpuReader{source: fmt.Sprintf("unavailable: %d mariadbd/mysqld processes on this machine", len(ps))}
		}
		pid = ps[0]
	}
	return cpuReader{
		server: func() []int { return []int{pid} },
		source: fmt.Sprintf("/proc: %s %d (all its threads)", procComm(pid), pid),
	}
}

// read takes one reading.
func (c cpuReader) read() cpuTimes {
	t := cpuTimes{server: -1}
	t.total, t.idle, _ = machineTimes()
	if own, _, _, err := procStat(os.Getpid()); err == nil {
		t.self = own
	}
	if c.server == nil {
		return t
	}
	t.server = 0
	for i, pid := range c.server() {
		own, ch, _, err := procStat(pid)
		if err != nil {
			continue // ended between the listing and the reading
		}
		t.server += own
		if i == 0 && c.cumulative {
			t.server += ch
		}
	}
	return t
}

// cpuShares returns the shares of the machine's CPU (all cores) used
// between two readings by the server, this process and everything.
func cpuShares(a, b cpuTimes) (server, self, busy *float64) {
	d := float64(b.total - a.total)
	if d < 50 { // under half a second of one core's ticks: too coarse to say
		return nil, nil, nil
	}
	f := func(v int64) *float64 { x := max(0, float64(v)/d); return &x }
	if a.server >= 0 && b.server >= 0 {
		server = f(b.server - a.server)
	}
	return server, f(b.self - a.self), f((b.total - a.total) - (b.idle - a.idle))
}
