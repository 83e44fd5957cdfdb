package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/conveyorq/conveyor"
)

// Unknown kinds. A client with workers refuses to enqueue a kind it has no
// worker for (conveyor.ErrUnknownKind); the command and serve have no
// workers, and the processes that do publish their queues, not their
// kinds. So they go by what the database shows: a kind is known when a
// job of it has completed there, which only a worker that handles it (an
// in-process client or an HTTP worker) can have done. Completed jobs are
// kept for Config.CompletedRetention (24h by default), so a kind that is
// new, or runs less often than that, is unknown too: enqueue it with
// --allow-unknown-kinds. A job of a kind no worker handles would fail
// every attempt with "unknown job kind" and be retried for hours before it
// is discarded.

// Modes of the unknown-kind check.
const (
	// kindsRefuse refuses an enqueue of an unknown kind with
	// conveyor.ErrUnknownKind (the API's 400).
	kindsRefuse = "refuse"
	// kindsWarn enqueues it and logs a warning (at most once per kind per
	// kindWarnEvery).
	kindsWarn = "warn"
	// kindsAllow enqueues any valid kind, as a client without workers
	// does.
	kindsAllow = "allow"
)

// kindWarnEvery spaces the warnings about one kind.
const kindWarnEvery = 10 * time.Minute

// maxKindMemo bounds the kinds kindCheck remembers.
const maxKindMemo = 10000

// kindCheck is the enqueue middleware of the unknown-kind check. Its
// client is set once opened (the middleware is part of the client's
// configuration), before any enqueue.
type kindCheck struct {
	mode   string
	hint   string       // kindsRefuse: how to enqueue such a kind anyway
	log    *slog.Logger // kindsWarn
	client *conveyor.Client[any]

	mu     sync.Mutex
	known  map[string]bool      // kinds found known: they stay known
	warned map[string]time.Time // kindsWarn: when each kind was last warned about
}

// newKindCheck returns a check in mode (kindsRefuse, kindsWarn or
// kindsAllow); hint ends a refusal, log takes the warnings.
func newKindCheck(mode, hint string, log *slog.Logger) *kindCheck {
	return &kindCheck{mode: mode, hint: hint, log: log, known: map[string]bool{}, warned: map[string]time.Time{}}
}

// kindKnown reports whether a job of kind has completed on c's database
// (one row of the kind's index range).
func kindKnown(ctx context.Context, c *conveyor.Client[any], kind string) (bool, error) {
	jobs, err := c.Jobs(ctx, conveyor.JobFilter{Kind: kind, States: []conveyor.JobState{conveyor.JobStateCompleted}, Limit: 1})
	return len(jobs) > 0, err
}

// Middleware checks every kind of an enqueue call before it goes on.
func (k *kindCheck) Middleware(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
	if k.mode == kindsAllow {
		return next(ctx, items)
	}
	seen := map[string]bool{}
	for _, it := range items {
		if it.Args == nil {
			continue
		}
		kind := it.Args.Kind()
		// A kind that breaks the library's rule is left to the library,
		// which refuses it with its own message.
		if seen[kind] || conveyor.ValidKindName(kind) != nil {
			continue
		}
		seen[kind] = true
		if err := k.check(ctx, kind, queueOf(it.Opts)); err != nil {
			return err
		}
	}
	return next(ctx, items)
}

// check refuses or warns about kind when it is unknown.
func (k *kindCheck) check(ctx context.Context, kind, queue string) error {
	k.mu.Lock()
	known := k.known[kind]
	last, warned := k.warned[kind]
	k.mu.Unlock()
	if known || k.mode == kindsWarn && warned && time.Since(last) < kindWarnEvery {
		return nil
	}
	ok, err := kindKnown(ctx, k.client, kind)
	if err != nil {
		return fmt.Errorf("checking kind %q: %w", kind, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if ok {
		if len(k.known) < maxKindMemo {
			k.known[kind] = true
		}
		return nil
	}
	if k.mode == kindsRefuse {
		return unknownKind(kind, k.hint)
	}
	if len(k.warned) >= maxKindMemo {
		clear(k.warned)
	}
	k.warned[kind] = time.Now()
	k.log.Warn("enqueued a kind no worker is known to handle: no job of it has completed on this database; if no worker handles it, its jobs fail every attempt and are discarded after their last", "kind", kind, "queue", queue)
	return nil
}

// queueOf is the queue an enqueue's options name, for a message.
func queueOf(o *conveyor.EnqueueOpts) string {
	if o == nil || o.Queue == "" {
		return conveyor.DefaultQueue
	}
	return o.Queue
}

// unknownKind is the refusal of kind, ended by hint.
func unknownKind(kind, hint string) error {
	return fmt.Errorf("%w %q: no job of this kind has completed on this database, so no worker is known to handle it (a typo? %s)", conveyor.ErrUnknownKind, kind, hint)
}
