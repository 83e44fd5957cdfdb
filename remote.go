package conveyor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"

	"github.com/conveyorq/conveyor/internal/engine"
)

// ErrLeaseLost is returned by RemoteWorkers for a renewal or an outcome
// whose job is no longer held under the fence it names: its lease
// expired and it was rescued, or it was released, cancelled, discarded or
// finished. The remote worker must stop working the job and not retry
// the call; nothing was written. An outcome refused because the same
// outcome of the same attempt was written by an earlier call (sent again
// after its answer was lost) returns it too: CompleteRecorded,
// FailRecorded and SnoozeRecorded tell that case apart.
var ErrLeaseLost = engine.ErrLeaseLost

// ErrInvalidClaim wraps the errors of a RemoteClaim, a lease or a remote
// failure that RemoteWorkers refuses: it names the field and its bounds.
var ErrInvalidClaim = errors.New("conveyor: invalid remote worker request")

// Bounds of RemoteWorkers' requests.
const (
	// MaxRemoteClaim is the most jobs one RemoteWorkers.Claim takes.
	MaxRemoteClaim = 1000
	// MinRemoteLease and MaxRemoteLease bound the lease of remote
	// workers' jobs.
	MinRemoteLease, MaxRemoteLease = time.Second, time.Hour
	// MaxRemoteWorkerName is the longest RemoteClaim.Worker, in bytes.
	MaxRemoteWorkerName = 200
	// MaxRemoteError and MaxRemoteTrace bound the stored error and stack
	// trace of a remote failure; longer ones are cut and marked
	// "[truncated]".
	MaxRemoteError, MaxRemoteTrace = 64 << 10, 256 << 10
	// MaxSnooze is the longest snooze and the longest RetryIn.
	MaxSnooze = 30 * 24 * time.Hour
)

// RemoteWorkers works jobs on behalf of workers that run in other
// processes and reach this client through a protocol of the
// application's; package web's HTTP worker protocol is built on it. The
// client's engine claims, renews and settles their jobs exactly as it
// does its own workers': the same fenced driver calls, the same outcome
// decision (retry with the kind's backoff, discard after the last
// attempt, cancel), the same batching of outcomes into one statement per
// batch, the same listener waking waiting claims, and the processes table
// (remote workers are listed with kind "http"). The client need not be
// started; the maintenance (promotion of due jobs, rescue of expired
// leases, pruning) still needs a started client somewhere on the
// database, such as `conveyor serve` with --maintenance. Every call is
// fenced: a renewal or an outcome of an attempt that no longer owns its
// job returns ErrLeaseLost and writes nothing.
type RemoteWorkers struct {
	eng *engine.Engine
	cfg Config
}

// RemoteWorkers returns the client's remote workers API.
func (c *Client[TTx]) RemoteWorkers() *RemoteWorkers {
	return &RemoteWorkers{eng: c.eng, cfg: c.cfg}
}

// RemoteClaim is one claim of a remote worker.
type RemoteClaim struct {
	// Queue to claim from; "" is "default".
	Queue string
	// Limit is the most jobs claimed, 1 (when 0) to MaxRemoteClaim.
	Limit int
	// Lease is how long the jobs are held unless renewed: the client's
	// Config.Lease when 0, else MinRemoteLease to MaxRemoteLease.
	Lease time.Duration
	// Wait, when positive, waits up to that long for a job when the
	// queue has none: the claim is made again 50ms after an empty one,
	// doubling to 1s, and at once when this client enqueues into the
	// queue, retries a job of it or resumes it, or (on PostgreSQL) any
	// process does. After Wait it returns no jobs.
	Wait time.Duration
	// Worker names the worker, at most MaxRemoteWorkerName printable
	// characters. Its jobs record Protocol + ":" + Worker in attempted_by
	// (Protocol + ":" + Addr when Worker is ""), and the processes table
	// lists it as Protocol + ":" + Worker (or the host of Addr).
	Worker string
	// Addr is the worker's network address (host:port, at most
	// MaxRemoteWorkerName printable characters), Protocol the name of the
	// protocol it uses ("http" when "").
	Addr, Protocol string
}

// ClaimedJob is a job claimed for a remote worker: the job and the
// fence token its renewals and outcome must send back.
type ClaimedJob struct {
	*JobInfo
	// Fence identifies this claim of the job.
	Fence int64
}

// Claim claims up to p.Limit available jobs of p.Queue for a remote
// worker. The claim is not cut short when ctx ends (a claim cut off
// half way may have committed); jobs claimed after ctx ended are released
// at once, so they do not wait for their lease to expire, and ctx's
// error is returned.
func (r *RemoteWorkers) Claim(ctx context.Context, p RemoteClaim) ([]*ClaimedJob, error) {
	if p.Queue == "" {
		p.Queue = "default"
	}
	if p.Limit == 0 {
		p.Limit = 1
	}
	if p.Protocol == "" {
		p.Protocol = "http"
	}
	lease, err := r.lease(p.Lease)
	switch {
	case err != nil:
		return nil, err
	case p.Limit < 1 || p.Limit > MaxRemoteClaim:
		return nil, fmt.Errorf("%w: limit %d: must be 1 to %d", ErrInvalidClaim, p.Limit, MaxRemoteClaim)
	case p.Wait < 0:
		return nil, fmt.Errorf("%w: wait %v: must not be negative", ErrInvalidClaim, p.Wait)
	case !printable(p.Worker, MaxRemoteWorkerName):
		return nil, fmt.Errorf("%w: worker name: at most %d printable characters", ErrInvalidClaim, MaxRemoteWorkerName)
	case !printable(p.Addr, MaxRemoteWorkerName):
		return nil, fmt.Errorf("%w: address: at most %d printable characters", ErrInvalidClaim, MaxRemoteWorkerName)
	case !validName(p.Protocol, false):
		return nil, fmt.Errorf("%w: protocol %q: must match %s", ErrInvalidClaim, p.Protocol, nameRE)
	case !validName(p.Queue, false):
		return nil, fmt.Errorf("%w: queue name %q: must match %s", ErrInvalidClaim, p.Queue, nameRE)
	}
	host := p.Addr
	if h, _, err := net.SplitHostPort(p.Addr); err == nil {
		host = h
	}
	worker, process := p.Protocol+":"+p.Worker, p.Protocol+":"+p.Worker
	if p.Worker == "" {
		worker, process = p.Protocol+":"+p.Addr, p.Protocol+":"+host
	}
	rows, err := r.eng.ClaimRemote(ctx, engine.RemoteClaim{
		Queue: p.Queue, Limit: p.Limit, Lease: lease, Wait: p.Wait,
		Worker: worker, Process: process, Host: host,
	})
	if err != nil {
		return nil, err
	}
	out := make([]*ClaimedJob, len(rows))
	for i, row := range rows {
		out[i] = &ClaimedJob{JobInfo: jobInfo(row), Fence: row.Fence}
	}
	return out, nil
}

// lease checks a remote lease: the client's Lease when 0.
func (r *RemoteWorkers) lease(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return r.cfg.Lease, nil
	}
	if d < MinRemoteLease || d > MaxRemoteLease {
		return 0, fmt.Errorf("%w: lease %v: must be %v to %v", ErrInvalidClaim, d, MinRemoteLease, MaxRemoteLease)
	}
	return d, nil
}

// Renew renews the lease of job id, claimed under fence, for another
// lease (the client's Config.Lease when 0). It returns ErrLeaseLost when
// the claim no longer owns the job.
func (r *RemoteWorkers) Renew(ctx context.Context, id, fence int64, lease time.Duration) error {
	d, err := r.lease(lease)
	if err != nil {
		return err
	}
	return r.eng.RenewRemote(ctx, id, fence, d)
}

// Complete records the success of job id's attempt claimed under fence,
// with the attempt's result when result is not empty nor JSON null: JSON, checked as
// SetResult checks it (an error wrapping ErrInvalidResult, and nothing
// written, otherwise), stored only if the completion is applied. It waits
// until the outcome is written, batched with the client's other outcomes;
// if ctx ends first it returns ctx's error, and the outcome may still be
// written: a Complete sent again then returns ErrLeaseLost, and
// CompleteRecorded tells whether the first one was applied.
func (r *RemoteWorkers) Complete(ctx context.Context, id, fence int64, result json.RawMessage) error {
	var res json.RawMessage
	if len(result) > 0 {
		var err error
		if res, err = checkResult(result); err != nil {
			return fmt.Errorf("job %d: result: %w", id, err)
		}
	}
	return r.eng.CompleteRemote(ctx, id, fence, res)
}

// RemoteFailure is a remote worker's failed attempt.
type RemoteFailure struct {
	// Error is the worker's error message; "" records that none was
	// given. Trace is its stack trace, if any. Both are stored with the
	// attempt: made valid UTF-8, without NUL, cut at MaxRemoteError and
	// MaxRemoteTrace bytes.
	Error, Trace string
	// Cancel ends the job as cancelled, without retry.
	Cancel bool
	// RetryIn, when positive (at most MaxSnooze), replaces the kind's
	// backoff before the next attempt.
	RetryIn time.Duration
}

// Fail records the failure of job id's attempt claimed under fence and
// returns the job's new state: retryable, discarded (that was its last
// attempt) or cancelled, decided as for an error of a worker of this
// client (the kind's WorkerOpts.Backoff applies).
func (r *RemoteWorkers) Fail(ctx context.Context, id, fence int64, f RemoteFailure) (JobState, error) {
	if f.RetryIn < 0 || f.RetryIn > MaxSnooze {
		return "", fmt.Errorf("%w: retry in %v: must be 0 to %v", ErrInvalidClaim, f.RetryIn, MaxSnooze)
	}
	st, err := r.eng.FailRemote(ctx, id, fence, f.stored())
	return JobState(st), err
}

// stored is the failure as Fail stores it: its error (or a note that
// none was given) and trace cleaned and cut.
func (f RemoteFailure) stored() engine.RemoteFailure {
	msg := cleanText(f.Error, MaxRemoteError)
	if strings.TrimSpace(msg) == "" {
		msg = "failed (no error message given by the remote worker)"
	}
	return engine.RemoteFailure{Error: msg, Trace: cleanText(f.Trace, MaxRemoteTrace), Cancel: f.Cancel, RetryIn: f.RetryIn}
}

// CompleteRecorded reports whether job id's attempt claimed under fence
// already completed it: for a Complete that returned ErrLeaseLost when
// an earlier Complete of the same attempt (a request sent again after
// its answer was lost) may have been applied. True means that earlier
// completion is the job's outcome; false that the attempt lost the job
// some other way (ErrLeaseLost stands). It reads the job and writes
// nothing. A job pruned since reads as false.
func (r *RemoteWorkers) CompleteRecorded(ctx context.Context, id, fence int64) (bool, error) {
	_, ok, err := r.eng.RecordedRemote(ctx, id, fence, engine.RemoteCompleted, engine.RemoteFailure{})
	return ok, err
}

// FailRecorded is CompleteRecorded for Fail: whether job id's attempt
// claimed under fence already failed with f (the same error and trace,
// and the same cancel), and the state that failure left (retryable,
// discarded or cancelled, as Fail returned it). The job must be in that
// state still (a retryable job may since have become available), and
// its last recorded error must be f's for this attempt, which neither a
// rescue of the attempt nor a cancel or discard by hand records.
func (r *RemoteWorkers) FailRecorded(ctx context.Context, id, fence int64, f RemoteFailure) (JobState, bool, error) {
	st, ok, err := r.eng.RecordedRemote(ctx, id, fence, engine.RemoteFailed, f.stored())
	return JobState(st), ok, err
}

// SnoozeRecorded is CompleteRecorded for Snooze: whether job id's
// attempt claimed under fence was snoozed and the job is still
// scheduled (once it is due and available again, it cannot be told
// from a released one, and reads as false).
func (r *RemoteWorkers) SnoozeRecorded(ctx context.Context, id, fence int64) (bool, error) {
	_, ok, err := r.eng.RecordedRemote(ctx, id, fence, engine.RemoteSnoozed, engine.RemoteFailure{})
	return ok, err
}

// Snooze puts job id back to run again after d (0 to MaxSnooze) without
// counting its attempt claimed under fence: the job is scheduled, its
// attempt given back, its fence not.
func (r *RemoteWorkers) Snooze(ctx context.Context, id, fence int64, d time.Duration) error {
	if d < 0 || d > MaxSnooze {
		return fmt.Errorf("%w: snooze %v: must be 0 to %v", ErrInvalidClaim, d, MaxSnooze)
	}
	return r.eng.SnoozeRemote(ctx, id, fence, d)
}

// Release gives job id back, available again at once, without counting
// its attempt claimed under fence (a worker shutting down). Later calls
// under this fence return ErrLeaseLost.
func (r *RemoteWorkers) Release(ctx context.Context, id, fence int64) error {
	return r.eng.ReleaseRemote(ctx, id, fence)
}

// printable reports whether s is at most n bytes of printable characters.
func printable(s string, n int) bool {
	return len(s) <= n && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// cleanText makes a worker's text storable: valid UTF-8, no NUL (which
// databases refuse in JSON), at most n bytes.
func cleanText(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + " [truncated]"
	}
	return s
}
