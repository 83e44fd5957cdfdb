package topology

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// FakeTimeLib returns the path of libfaketimeMT (Debian package
// faketime), or ends tb (skip, or fail when strict) when it is missing.
func FakeTimeLib(tb testing.TB) string {
	tb.Helper()
	libs, _ := filepath.Glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
	if len(libs) == 0 {
		testdb.Missing(tb, "libfaketimeMT (Debian package faketime: apt-get install faketime)")
		return ""
	}
	return libs[0]
}

// Clock is a wall clock offset for a server run under libfaketime: the
// environment that applies it, and (for a clock made with NewClock) a
// file through which the offset can be changed while the server runs.
type Clock struct {
	// Env is added to the server's environment.
	Env  []string
	file string
}

// FixedClock returns a clock offset from the real one by offset for the
// whole life of the server. Only the wall clock is offset: the servers'
// timeouts use the monotonic clock, which must not jump.
func FixedClock(lib string, offset time.Duration) *Clock {
	return &Clock{Env: []string{
		"LD_PRELOAD=" + lib,
		fmt.Sprintf("FAKETIME=%+d", int(offset.Seconds())),
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"FAKETIME_DONT_RESET=1",
	}}
}

// NewClock returns a clock offset by offset that Set can move while the
// server runs (libfaketime reads the offset from a world-readable file
// in dir on every clock call).
func NewClock(lib, dir string, offset time.Duration) (*Clock, error) {
	c := &Clock{file: filepath.Join(dir, "faketime")}
	if err := c.Set(offset); err != nil {
		return nil, err
	}
	c.Env = []string{
		"LD_PRELOAD=" + lib,
		"FAKETIME_TIMESTAMP_FILE=" + c.file,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"FAKETIME_DONT_RESET=1",
	}
	return c, nil
}

// Set moves the clock to offset from the real one. It fails for a clock
// made with FixedClock.
func (c *Clock) Set(offset time.Duration) error {
	if c.file == "" {
		return errors.New("topology: a fixed clock cannot be moved")
	}
	tmp := c.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%+d\n", int(offset.Seconds()))), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.file)
}
