package conveyor

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// UniqueOpts make a job unique: while a job with the same key holds it, an
// enqueue of another is not inserted and returns the holder's id instead
// (EnqueueResult.Duplicate says so). The key is always the kind, plus
// whatever the fields below add. The database enforces it with a unique
// index: concurrent enqueues from any number of processes, inside or
// outside transactions, yield one job; a transaction that rolls back frees
// the key; a job frees it when it leaves the states in States.
type UniqueOpts struct {
	// ByArgs adds the arguments to the key: all of them (compared as
	// JSON with object keys sorted), or only the top-level fields named
	// in ArgsFields.
	ByArgs bool
	// ArgsFields restricts ByArgs to these top-level fields of the
	// arguments, which must then be a JSON object; a field missing from
	// the arguments counts as null. Setting it implies ByArgs.
	ArgsFields []string
	// ByQueue adds the queue to the key.
	ByQueue bool
	// ByPeriod adds a window of time to the key: at most one job per
	// window, the windows being the multiples of ByPeriod since the Unix
	// epoch that contain the job's due time (RunAt, else now plus Delay,
	// by this process's clock). Zero means no window.
	ByPeriod time.Duration
	// States are the states in which an existing job counts as a
	// duplicate. Default (nil): the unfinished ones (available,
	// scheduled, running, retryable), so that a finished job frees its
	// key. It must include every unfinished state, and may add
	// JobStateCompleted, JobStateDiscarded and JobStateCancelled (a
	// finished job holds its key until it is pruned, after
	// Config.CompletedRetention or DiscardedRetention).
	States []JobState
}

// EnqueueResult is the outcome of one job of EnqueueMany or
// EnqueueManyTx.
type EnqueueResult struct {
	// ID is the job's id: the new job's, or for a duplicate the id of the
	// job holding its unique key.
	ID int64
	// Duplicate is set when the job was unique and its key was held, so
	// nothing was inserted.
	Duplicate bool
}

// uniqueKey returns the key and keep bits of a unique job of kind on
// queue with encoded args due at due.
func uniqueKey(kind, queue string, args json.RawMessage, due time.Time, u *UniqueOpts) ([]byte, int, error) {
	keep := 0
	if u.States != nil {
		for _, st := range []JobState{JobStateAvailable, JobStateScheduled, JobStateRunning, JobStateRetryable} {
			if !slices.Contains(u.States, st) {
				return nil, 0, fmt.Errorf("%w: unique states %v lack %s: a unique job always holds its key until it finishes", ErrInvalidOpts, u.States, st)
			}
		}
		for _, st := range u.States {
			switch st {
			case JobStateAvailable, JobStateScheduled, JobStateRunning, JobStateRetryable:
			case JobStateCompleted:
				keep |= driver.KeepCompleted
			case JobStateDiscarded:
				keep |= driver.KeepDiscarded
			case JobStateCancelled:
				keep |= driver.KeepCancelled
			default:
				return nil, 0, fmt.Errorf("%w: unique states: %w", ErrInvalidOpts, unknownState(string(st)))
			}
		}
	}
	if u.ByPeriod < 0 {
		return nil, 0, fmt.Errorf("%w: unique period %v is negative", ErrInvalidOpts, u.ByPeriod)
	}
	var b bytes.Buffer
	b.WriteString("conveyor/unique/v1\x00k:")
	b.WriteString(kind)
	if u.ByQueue {
		b.WriteString("\x00q:")
		b.WriteString(queue)
	}
	if u.ByArgs || len(u.ArgsFields) > 0 {
		canon, err := canonicalArgs(args, u.ArgsFields)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: unique by args of kind %q: %v", ErrInvalidOpts, kind, err)
		}
		b.WriteString("\x00a:")
		b.Write(canon)
	}
	if u.ByPeriod > 0 {
		b.WriteString("\x00p:")
		b.WriteString(strconv.FormatInt(int64(u.ByPeriod), 10))
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(due.UnixNano()/int64(u.ByPeriod), 10))
	}
	sum := sha256.Sum256(b.Bytes())
	return sum[:], keep, nil
}

// canonicalArgs is args re-encoded with object keys sorted (numbers kept
// as written), or only the named top-level fields of an object.
func canonicalArgs(args json.RawMessage, fields []string) ([]byte, error) {
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if len(fields) > 0 {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("ArgsFields %v need arguments that are a JSON object", fields)
		}
		picked := make(map[string]any, len(fields))
		for _, f := range fields {
			picked[f] = obj[f] // nil (null) when missing
		}
		v = picked
	}
	return json.Marshal(v)
}
