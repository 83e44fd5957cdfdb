package sqlite

import (
	"os"

	"golang.org/x/sys/unix"
)

// intentFile is the cross-process half of the gate (see gate): a side file
// next to the database, "<database>-conveyor-lease", on which a process
// holds a read lock while one of its lease renewals is pending (and, on a
// second byte, while one of its ordinary writes is starved). Locks are
// open-file-description locks (F_OFD_*): they belong to this process's
// descriptor, conflict with every other descriptor of any process, are
// never taken for writing, and the kernel drops them when the process
// dies, so a killed process never leaves one behind.
type intentFile struct {
	f *os.File
}

// openIntentFile opens (creating it if missing) the side file of the
// database at path. It returns nil and the reason when that cannot be done
// (a read-only directory, say); the gate then orders this process only.
func openIntentFile(path string) (*intentFile, error) {
	// Read locks, the only ones taken, need a descriptor open for
	// reading only: a process of another user than the one that created
	// the file (sharing the database through its group, say) opens it
	// too.
	f, err := os.OpenFile(path+intentSuffix, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &intentFile{f: f}, nil
}

func (i *intentFile) lock(typ int16, at int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: at, Len: 1}
	return unix.FcntlFlock(i.f.Fd(), unix.F_OFD_SETLK, &lk)
}

// announce marks a lease renewal of this process as pending.
func (i *intentFile) announce() error { return i.lock(unix.F_RDLCK, leaseByte) }

// withdraw ends what announce marked.
func (i *intentFile) withdraw() error { return i.lock(unix.F_UNLCK, leaseByte) }

// starve marks an ordinary write of this process as starved.
func (i *intentFile) starve() error { return i.lock(unix.F_RDLCK, starvedByte) }

// unstarve ends what starve marked.
func (i *intentFile) unstarve() error { return i.lock(unix.F_UNLCK, starvedByte) }

// othersPending reports whether another process (or another descriptor of
// this one) holds a read lock on byte at: a lease renewal pending on the
// database (leaseByte) or a starved ordinary write (starvedByte).
func (i *intentFile) othersPending(at int64) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: at, Len: 1}
	if err := unix.FcntlFlock(i.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false
	}
	return lk.Type != unix.F_UNLCK
}

func (i *intentFile) close() error { return i.f.Close() }
