//go:build !linux

package sqlite

import "errors"

// intentFile is the cross-process half of the gate. It needs
// open-file-description locks, which only Linux has; elsewhere the gate
// orders the writes of one process only.
type intentFile struct{}

func openIntentFile(string) (*intentFile, error) {
	return nil, errors.New("cross-process lease priority needs Linux (open file description locks)")
}

func (*intentFile) announce() error          { return nil }
func (*intentFile) withdraw() error          { return nil }
func (*intentFile) othersPending(int64) bool { return false }
func (*intentFile) starve() error            { return nil }
func (*intentFile) unstarve() error          { return nil }
func (*intentFile) close() error             { return nil }
