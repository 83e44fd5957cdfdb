package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// ValidQueueName and ValidKindName are the rules enqueue applies: a name
// they accept is enqueued, a name they refuse is refused by enqueue too,
// and their error is ErrInvalidOpts (a kind's ErrUnknownKind as well) with
// a message the caller wraps with where the name came from.
func TestValidNames(t *testing.T) {
	long := strings.Repeat("q", 128)
	for _, tc := range []struct {
		name        string
		queue, kind bool // valid as a queue name, as a kind name
	}{
		{"default", true, true},
		{"a.b:c-d_e", true, true},
		{"0", true, true},
		{long, true, true},
		{long + "q", false, false},
		{"svc/report.v2", false, true},
		{"", false, false},
		{"-dash", false, false},
		{".hidden", false, false},
		{"/slash", false, false},
		{"bad q", false, false},
		{"<x>", false, false},
		{"é", false, false},
		{"a\x00", false, false},
	} {
		qerr, kerr := conveyor.ValidQueueName(tc.name), conveyor.ValidKindName(tc.name)
		if (qerr == nil) != tc.queue {
			t.Errorf("ValidQueueName(%q) = %v, want valid %v", tc.name, qerr, tc.queue)
		}
		if (kerr == nil) != tc.kind {
			t.Errorf("ValidKindName(%q) = %v, want valid %v", tc.name, kerr, tc.kind)
		}
		if qerr != nil {
			if !errors.Is(qerr, conveyor.ErrInvalidOpts) || errors.Is(qerr, conveyor.ErrUnknownKind) {
				t.Errorf("ValidQueueName(%q) = %v: want ErrInvalidOpts only", tc.name, qerr)
			}
			if !strings.HasPrefix(qerr.Error(), "invalid queue name: must match ^") {
				t.Errorf("ValidQueueName(%q) = %q", tc.name, qerr)
			}
		}
		if kerr != nil {
			if !errors.Is(kerr, conveyor.ErrInvalidOpts) || !errors.Is(kerr, conveyor.ErrUnknownKind) {
				t.Errorf("ValidKindName(%q) = %v: want ErrInvalidOpts and ErrUnknownKind", tc.name, kerr)
			}
			if !strings.HasPrefix(kerr.Error(), "invalid kind name: must match ^") {
				t.Errorf("ValidKindName(%q) = %q", tc.name, kerr)
			}
		}
	}
	err := fmt.Errorf("queue %q: %w", "bad q", conveyor.ValidQueueName("bad q"))
	if !errors.Is(err, conveyor.ErrInvalidOpts) {
		t.Errorf("wrapped: %v is not ErrInvalidOpts", err)
	}
}

// Enqueue agrees with ValidQueueName and ValidKindName, and keeps its own
// messages.
func TestEnqueueAgreesWithValidNames(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	for _, q := range []string{"a.b:c-d_e", "bad q", "svc/x", strings.Repeat("q", 129)} {
		_, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: "k", JSON: []byte(`{}`)}, &conveyor.EnqueueOpts{Queue: q})
		if (err == nil) != (conveyor.ValidQueueName(q) == nil) {
			t.Errorf("Enqueue in queue %q: %v; ValidQueueName: %v", q, err, conveyor.ValidQueueName(q))
		}
		if err != nil && (!errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), fmt.Sprintf("queue name %q: must match", q))) {
			t.Errorf("Enqueue in queue %q: %v", q, err)
		}
	}
	for _, k := range []string{"svc/report.v2", "bad kind", "<x>"} {
		_, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: k, JSON: []byte(`{}`)}, nil)
		if (err == nil) != (conveyor.ValidKindName(k) == nil) {
			t.Errorf("Enqueue of kind %q: %v; ValidKindName: %v", k, err, conveyor.ValidKindName(k))
		}
		if err != nil && (!errors.Is(err, conveyor.ErrUnknownKind) || !strings.Contains(err.Error(), fmt.Sprintf("kind name %q: must match", k))) {
			t.Errorf("Enqueue of kind %q: %v", k, err)
		}
	}
}
