package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// blkioRoot is where the cgroup v1 blkio hierarchy is mounted.
const blkioRoot = "/sys/fs/cgroup/blkio"

// The cpudisk fault's write throttle: a slow disk that still keeps up. At
// 100 jobs/s the run's processes write about 3.5 MiB/s in 30 requests a
// second (WAL appends written back by the fsyncs of checkpoints, measured
// unthrottled on a two-core machine), so the disk is not saturated on
// average, but every checkpoint's fsync takes a good part of a second.
// (At 2 MiB/s it is saturated, its queue grows and so does every write's
// latency, without bound.) Reads are not throttled: SQLite's reads mostly
// hit the page cache.
const (
	diskWriteBPS  = 8 << 20
	diskWriteIOPS = 100
)

// blkioThrottle is a blkio cgroup the run created, with write limits on
// the block device that holds the SQLite file. Only the run's own worker
// and producer processes join it (each as the first thing it does, see
// --blkio-cgroup), never a database server nor anything the run did not
// start.
type blkioThrottle struct {
	dir    string // the cgroup's directory
	device string // "MAJ:MIN" of the throttled disk
}

// newBlkioThrottle creates the cgroup name under the blkio hierarchy and
// limits its writes to the disk holding file. The error says why that
// cannot be done; nothing is left behind then.
func newBlkioThrottle(name, file string) (*blkioThrottle, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("creating a blkio cgroup needs root")
	}
	if _, err := os.Stat(filepath.Join(blkioRoot, "blkio.throttle.write_bps_device")); err != nil {
		return nil, fmt.Errorf("no cgroup v1 blkio hierarchy with throttling at %s", blkioRoot)
	}
	dev, err := blockDevice(filepath.Dir(file))
	if err != nil {
		return nil, err
	}
	t := &blkioThrottle{dir: filepath.Join(blkioRoot, name), device: dev}
	if err := os.Mkdir(t.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the blkio cgroup: %w", err)
	}
	if err := t.limit(diskWriteBPS, diskWriteIOPS); err != nil {
		_ = os.Remove(t.dir)
		return nil, err
	}
	return t, nil
}

// limit sets the write limits (0: none) and reads them back.
func (t *blkioThrottle) limit(bps, iops int) error {
	for file, v := range map[string]int{"blkio.throttle.write_bps_device": bps, "blkio.throttle.write_iops_device": iops} {
		path := filepath.Join(t.dir, file)
		if err := os.WriteFile(path, []byte(fmt.Sprintf("%s %d\n", t.device, v)), 0); err != nil {
			return fmt.Errorf("setting %s on %s: %w", file, t.device, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		want := fmt.Sprintf("%s %d", t.device, v)
		if got := strings.TrimSpace(string(b)); v != 0 && !strings.Contains(got, want) {
			return fmt.Errorf("%s reads %q after writing %q", file, got, want)
		}
	}
	return nil
}

// describe says what is throttled.
func (t *blkioThrottle) describe() string {
	return fmt.Sprintf("writes of the run's processes to disk %s throttled to %d KiB/s and %d IOPS (blkio cgroup %s)",
		t.device, diskWriteBPS>>10, diskWriteIOPS, t.dir)
}

// members counts the processes in the cgroup.
func (t *blkioThrottle) members() (int, error) {
	b, err := os.ReadFile(filepath.Join(t.dir, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	return len(strings.Fields(string(b))), nil
}

// served returns how many write requests and bytes went through the
// throttle to its disk.
func (t *blkioThrottle) served() (ios, bytes int64, err error) {
	ios, err = t.stat("blkio.throttle.io_serviced")
	if err == nil {
		bytes, err = t.stat("blkio.throttle.io_service_bytes")
	}
	return ios, bytes, err
}

// stat reads the "MAJ:MIN Write N" line of a blkio statistics file.
func (t *blkioThrottle) stat(file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(t.dir, file))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == t.device && f[1] == "Write" {
			return strconv.ParseInt(f[2], 10, 64)
		}
	}
	return 0, nil
}

// remove lifts the limits (if that was not done yet) and deletes the
// cgroup once its processes are gone (the phase's processes have all been
// killed by then); it waits a few seconds for the last of them to exit.
func (t *blkioThrottle) remove() error {
	_ = t.limit(0, 0) // lets any write still queued go at once
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(t.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			n, _ := t.members()
			return fmt.Errorf("removing blkio cgroup %s (%d processes left in it): %w", t.dir, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// joinCgroup moves process pid (all its threads) into the cgroup dir.
func joinCgroup(dir string, pid int) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)+"\n"), 0); err != nil {
		return fmt.Errorf("joining cgroup %s: %w", dir, err)
	}
	return nil
}

// blockDevice returns "MAJ:MIN" of the disk (not the partition) holding
// dir, or why there is none (tmpfs, overlay and network file systems have
// no block device to throttle).
func blockDevice(dir string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return "", err
	}
	dev := fmt.Sprintf("%d:%d", devMajor(st.Dev), devMinor(st.Dev))
	sys := filepath.Join("/sys/dev/block", dev)
	if _, err := os.Stat(sys); err != nil {
		return "", fmt.Errorf("%s is on device %s, which is not a block device (tmpfs, overlay or network file system?)", dir, dev)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err != nil {
		return dev, nil
	}
	// A partition: the throttle is set on its disk, the parent in sysfs.
	real, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(real), "dev"))
	if err != nil {
		return "", fmt.Errorf("the disk of partition %s: %w", dev, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// devMajor and devMinor decode a Linux dev_t.
func devMajor(d uint64) uint64 { return (d>>8)&0xfff | (d>>32)&^0xfff }
func devMinor(d uint64) uint64 { return d&0xff | (d>>12)&^0xff }

// prepareDiskThrottle sets up the cpudisk fault's throttle before the
// phase's processes start, and has them join it. It fails with the reason
// (which makes the phase skipped) when the throttle cannot be applied.
func prepareDiskThrottle(_ context.Context, p *phase) error {
	name := fmt.Sprintf("conveyor-torture-%d-%s", os.Getpid(), strings.TrimSuffix(p.prefix, "_"))
	t, err := newBlkioThrottle(name, p.dsn)
	if err != nil {
		return fmt.Errorf("skipped: cannot throttle the disk: %v", err)
	}
	p.throttle = t
	p.cleanups = append(p.cleanups, func() {
		if err := t.remove(); err != nil {
			p.fail("%v", err)
		}
	})
	flag := []string{"--blkio-cgroup", t.dir}
	p.workerArgs = append(p.workerArgs, flag...)
	p.producerArgs = append(p.producerArgs, flag...)
	return nil
}

// injectCPUDisk starts the burner of the cpudisk fault and records how
// many of the run's processes the throttle holds.
func injectCPUDisk(ctx context.Context, p *phase) error {
	n, err := p.throttle.members()
	if err != nil {
		return err
	}
	if want := len(p.sup.pids("")); n != want {
		return fmt.Errorf("the blkio cgroup holds %d processes, the run has %d", n, want)
	}
	p.injected = append(p.injected, fmt.Sprintf("%s, %d processes", p.throttle.describe(), n))
	return startBurner(ctx, p)
}

// stopCPUDisk stops the burner, reads what went through the throttle and
// lifts its limits, so that the workers' shutdown (and a SIGKILL, which
// waits for a process's queued writes) does not wait for the slow disk.
// The cgroup itself is removed once the processes are gone.
func stopCPUDisk(ctx context.Context, p *phase) {
	stopBurner(ctx, p)
	ios, bytes, err := p.throttle.served()
	if err != nil {
		p.fail("reading the throttle's statistics: %v", err)
	}
	p.diskIOs, p.diskBytes = ios, bytes
	if err := p.throttle.limit(0, 0); err != nil {
		p.fail("lifting the disk throttle: %v", err)
	}
}

// checkCPUDisk is checkCPU, and says how much the processes wrote
// through the throttle. With SQLite's default synchronous=NORMAL only
// checkpoints write to the disk (the WAL is appended in the page cache and
// fsynced before each checkpoint): a light load that never checkpointed
// never waited for the slow disk, which the notes say.
func checkCPUDisk(ctx context.Context, p *phase, rs *records, fd *Findings, in *Input) {
	checkCPU(ctx, p, rs, fd, in)
	p.injected = append(p.injected, fmt.Sprintf("%d write requests (%.1f MiB) went through the throttle", p.diskIOs, float64(p.diskBytes)/(1<<20)))
	if p.diskIOs == 0 {
		p.note("no write reached the throttled disk (no WAL checkpoint in the phase): the slow disk was never waited for, only the CPU was contended")
	}
}
