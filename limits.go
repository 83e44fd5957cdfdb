package conveyor

import (
	"context"
	"fmt"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// QueueLimits are a queue's flow limits. They are kept in the database,
// beside the queue's pause, and every process claiming from the queue is
// held to them: in-process workers and HTTP workers alike, whichever
// process runs them. A change reaches every process within a second; no
// process needs a restart. The zero value means no limit.
//
// docs/flow-control.md says how each limit is held without a shared
// counter row, and what it costs.
type QueueLimits struct {
	// MaxRunning is the most jobs of the queue running at once across
	// every process, 0 to 100000; 0 means no limit. A job run by a
	// started client's workers counts while its handler runs: the client
	// leases a block of the queue's slots for its process and passes a
	// slot from each finished handler to its next job without a write. A
	// job handed to an HTTP worker counts from the claim that hands it
	// out until its attempt ends (its outcome is written, it is released,
	// rescued, or cancelled or discarded by hand). Jobs over the limit
	// wait in the queue: they are not failed and spend no attempt. A
	// lowered limit lets running jobs finish and starts no job until
	// fewer than the new limit run.
	MaxRunning int `json:"max_running,omitempty"`
	// Rate is the most jobs of the queue started in any window of
	// RatePeriod, by the database's clock, 0 to 100000; 0 means no limit.
	// Every start counts, whatever the attempt's outcome. Jobs over the
	// rate wait, as over MaxRunning; a process waits for the window to
	// have room rather than polling for it.
	Rate int `json:"rate,omitempty"`
	// RatePeriod is Rate's window, 1ms to 30 days; set when Rate is
	// set, and only then.
	RatePeriod time.Duration `json:"rate_period_ns,omitempty"`
	// KeyMaxRunning is the most jobs with the same key (EnqueueOpts.Key)
	// running at once across every process, 0 to 100000; 0 means no
	// limit per key. Jobs without a key are not held by it. Held and
	// freed as MaxRunning is; each key has its own slots.
	KeyMaxRunning int `json:"key_max_running,omitempty"`
	// Ordered makes the jobs of each key start one at a time, in the
	// order they were enqueued, among the key's due jobs (a job enqueued
	// for later takes its turn when it is due; priority orders keys'
	// turns, not jobs within a key). It implies a KeyMaxRunning of 1
	// (KeyMaxRunning must be 0 or 1). A job that failed and waits for
	// its retry, or was snoozed, holds its key: no later job of the key
	// starts until it completes, is discarded or is cancelled, while
	// every other key goes on. Jobs without a key are not ordered.
	Ordered bool `json:"ordered,omitempty"`
	// OrderedMoveOn, with Ordered, lets a key's next job start while a
	// failed job of the key waits for its retry; the failed job takes
	// the key's next turn once it is due again (it is the key's oldest).
	OrderedMoveOn bool `json:"ordered_move_on,omitempty"`
	// KeyRate is the most jobs with the same key started in any window
	// of KeyRatePeriod, by the database's clock, 0 to 100000; 0 means no
	// rate per key. Every start counts, whatever the attempt's outcome;
	// jobs without a key are not held by it. Jobs over their key's rate
	// wait, as over Rate, while other keys go on.
	KeyRate int `json:"key_rate,omitempty"`
	// KeyRatePeriod is KeyRate's window, 1ms to 30 days; set when
	// KeyRate is set, and only then.
	KeyRatePeriod time.Duration `json:"key_rate_period_ns,omitempty"`
	// Fair serves the queue's keys in turns, so that a key with 100,000
	// waiting jobs does not delay a key with 10: each claim walks the
	// keys of the due jobs in rotation and takes at most a key's weight
	// (SetKeyWeights; 1 for a key not weighed) of its jobs per turn,
	// within the key's other limits. A claim with room left once every
	// key had its turn gives the keys that have more further turns, in
	// proportion to their weights, so a lone key still fills a claim.
	// Jobs without a key are claimed after the keyed ones. Fair holds no
	// job back: it orders what each claim takes, it does not limit it.
	Fair bool `json:"fair,omitempty"`
}

// Bounds of key weights (SetKeyWeights).
const (
	// MaxKeyWeights is the most keys of one queue that may be weighed.
	MaxKeyWeights = driver.MaxKeyWeights
	// MaxKeyWeight is the largest weight of a key.
	MaxKeyWeight = driver.MaxKeyWeight
)

// Bounds of QueueLimits.
const (
	maxLimitSlots = 100000
	maxRatePeriod = 30 * 24 * time.Hour
)

// IsZero reports whether l limits nothing.
func (l QueueLimits) IsZero() bool { return driver.QueueLimits(l).IsZero() }

// check refuses limits that make no sense, naming the field.
func (l QueueLimits) check(queue string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: limits of queue %q: %s", ErrInvalidOpts, queue, fmt.Sprintf(format, args...))
	}
	if l.MaxRunning < 0 || l.MaxRunning > maxLimitSlots {
		return bad("MaxRunning %d is out of range (0 for none, at most %d)", l.MaxRunning, maxLimitSlots)
	}
	if msg := rateProblem("", l.Rate, l.RatePeriod); msg != "" {
		return bad("%s", msg)
	}
	switch {
	case l.KeyMaxRunning < 0 || l.KeyMaxRunning > maxLimitSlots:
		return bad("KeyMaxRunning %d is out of range (0 for none, at most %d)", l.KeyMaxRunning, maxLimitSlots)
	case l.Ordered && l.KeyMaxRunning > 1:
		return bad("KeyMaxRunning %d with Ordered (an ordered key runs one job at a time: 0 or 1)", l.KeyMaxRunning)
	case l.OrderedMoveOn && !l.Ordered:
		return bad("OrderedMoveOn is set without Ordered")
	}
	if msg := rateProblem("Key", l.KeyRate, l.KeyRatePeriod); msg != "" {
		return bad("%s", msg)
	}
	return nil
}

// rateProblem says what is wrong with a rate and its period, the fields
// named kind+"Rate" and kind+"RatePeriod" (the queue's rate and the rate
// per key are bounded alike), or "" when nothing is.
func rateProblem(kind string, rate int, period time.Duration) string {
	switch {
	case rate < 0 || rate > maxLimitSlots:
		return fmt.Sprintf("%sRate %d is out of range (0 for none, at most %d)", kind, rate, maxLimitSlots)
	case rate > 0 && (period < time.Millisecond || period > maxRatePeriod):
		return fmt.Sprintf("%sRatePeriod %v is out of range (1ms to %v) for a %sRate of %d", kind, period, maxRatePeriod, kind, rate)
	case rate == 0 && period != 0:
		return fmt.Sprintf("%sRatePeriod %v is set without a %sRate", kind, period, kind)
	}
	return ""
}

// SetQueueLimits sets queue's limits for every process on the database;
// the zero QueueLimits removes them. The queue need not exist yet. A bad
// queue name or a value out of range is refused with ErrInvalidOpts,
// naming the field, and nothing is changed. The queue's pause is left as
// it is. This process claims the queue under the new limits at once:
// SetQueueLimits returns after its claims of the queue begun under the
// old ones have returned (enqueues claiming their own jobs for idle
// workers included), so that none of them takes a job after it
// without the new limits (a job claimed before it returned may still
// reach its handler a moment after; other processes follow within a
// second, see docs/flow-control.md).
func (c *Client[TTx]) SetQueueLimits(ctx context.Context, queue string, l QueueLimits) error {
	if ValidQueueName(queue) != nil {
		return queueNameError{op: "set limits of", queue: queue}
	}
	if err := l.check(queue); err != nil {
		return err
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	if err := c.drv.SetQueueLimits(ctx, queue, driver.QueueLimits(l)); err != nil {
		return err
	}
	if err := c.eng.LimitsChanged(ctx, queue, driver.QueueLimits(l)); err != nil {
		return fmt.Errorf("conveyor: the limits of queue %q are set, but this process's claims under the old ones were still running when waiting for them ended: %w", queue, err)
	}
	return nil
}

// SetKeyWeights replaces the key weights of queue for every process on
// the database; nil or empty removes them. Under the queue's Fair limit a
// key of weight 3 takes up to 3 jobs per turn where a key of weight 1 (a
// key not weighed) takes 1, so that over a busy period it starts about 3
// times as many. At most MaxKeyWeights keys, weights 1 to MaxKeyWeight;
// a bad key or weight is refused with ErrInvalidOpts, naming it, and
// nothing is changed. Weights may be set before the queue is Fair (they
// wait for it) and SetQueueLimits leaves them as they are. The first
// claim that begins after SetKeyWeights returns uses them.
func (c *Client[TTx]) SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error {
	if ValidQueueName(queue) != nil {
		return queueNameError{op: "set key weights of", queue: queue}
	}
	if err := driver.CheckKeyWeights(weights); err != nil {
		return fmt.Errorf("%w: key weights of queue %q: %v", ErrInvalidOpts, queue, err)
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	return c.drv.SetKeyWeights(ctx, queue, weights)
}

// KeyWeights returns the key weights of every queue of the database that
// has some (SetKeyWeights).
func (c *Client[TTx]) KeyWeights(ctx context.Context) (map[string]map[string]int, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	return c.drv.KeyWeights(ctx)
}

// QueueLimits returns the limits of every limited queue of the database.
func (c *Client[TTx]) QueueLimits(ctx context.Context) (map[string]QueueLimits, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	got, err := c.drv.QueueLimits(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]QueueLimits, len(got))
	for q, l := range got {
		out[q] = QueueLimits(l)
	}
	return out, nil
}

// Why a queue's available jobs wait (QueueStats.Held).
const (
	// HeldByConcurrency: the queue's MaxRunning jobs are running.
	HeldByConcurrency = "concurrency"
	// HeldByRate: the queue's rate window is full.
	HeldByRate = "rate"
	// HeldByPause: the queue is paused.
	HeldByPause = "paused"
	// HeldByKey: every available job's key is at its KeyMaxRunning (or,
	// Ordered, waits for an earlier job of the key, or has used its
	// KeyRate's window).
	HeldByKey = "key"
)

// LimitUse is how much of a limited queue's limits is in use.
type LimitUse struct {
	// Running is the number of the queue's concurrency slots in use:
	// held by HTTP workers' jobs, or leased to processes in blocks (a
	// process keeps the slots it used since its last renewal of its
	// leases, busy or not; on SQLite, which counts jobs instead of
	// holding slots for them, the slots leased in blocks and the running
	// jobs no block holds).
	Running int `json:"running"`
	// Started is the number of jobs started within the last RatePeriod.
	Started int `json:"started"`
	// NextStart, when Started has reached Rate, is how long until the
	// window has room again; 0 otherwise.
	NextStart time.Duration `json:"next_start_ns,omitempty"`
	// KeysRunning is the number of keys holding at least one of their
	// slots (KeyMaxRunning, Ordered).
	KeysRunning int `json:"keys_running,omitempty"`
	// KeyHeld is the number of due available jobs that wait because
	// their key has no slot free for them, or (KeyRate) no room left in
	// its window.
	KeyHeld int64 `json:"key_held,omitempty"`
	// KeysRated is the number of keys whose KeyRate window is full.
	KeysRated int `json:"keys_rated,omitempty"`
}
