package sqlite

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIntentFileOfAnotherUser: the side file is created by whichever
// process opens the database first, with mode 0644; a process of another
// user (one that shares the database through its group, say) must still
// take part: read locks need a descriptor open for reading only.
func TestIntentFileOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to open the file as another user")
	}
	g, _, _ := gateAndOther(t)
	for _, p := range []string{filepath.Dir(filepath.Dir(g.file)), filepath.Dir(g.file)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(g.file+intentSuffix, 0o644); err != nil {
		t.Fatal(err)
	}
	// The file system uid is per thread: open the file as nobody on this
	// thread only.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Setfsuid(65534); err != nil {
		t.Fatal(err)
	}
	side, err := openIntentFile(g.file)
	unix.Setfsuid(0)
	if err != nil {
		t.Fatalf("another user cannot use the side file: %v", err)
	}
	defer side.close()
	g.leaseBegin(true)
	defer g.leaseEnd(true)
	if !side.othersPending(leaseByte) {
		t.Fatal("another user's process does not see a pending heartbeat")
	}
	if err := side.announce(); err != nil {
		t.Fatalf("another user's process cannot announce a heartbeat: %v", err)
	}
	if !g.side.othersPending(leaseByte) {
		t.Fatal("a heartbeat announced by another user's process is not seen")
	}
}
