package conveyor

import (
	"fmt"
	"strings"
)

// JobState is the state of a job, as stored in the database and printed in
// JSON ("available", "scheduled", ...). The constants below are every
// state there is; JobStates lists them in lifecycle order.
type JobState string

// Job states. A job starts available (or scheduled, when it is due later),
// is running while an attempt holds its lease, and ends completed,
// discarded or cancelled; a failed attempt leaves it retryable until its
// backoff ends.
const (
	// JobStateAvailable: due and waiting for a worker.
	JobStateAvailable JobState = "available"
	// JobStateScheduled: enqueued to run later (EnqueueOpts.RunAt or Delay).
	JobStateScheduled JobState = "scheduled"
	// JobStateRunning: an attempt holds the job's lease.
	JobStateRunning JobState = "running"
	// JobStateRetryable: an attempt failed; the job runs again once its
	// backoff ends.
	JobStateRetryable JobState = "retryable"
	// JobStateCompleted: an attempt succeeded. Final.
	JobStateCompleted JobState = "completed"
	// JobStateDiscarded: every attempt failed, or an admin discarded it.
	// Final.
	JobStateDiscarded JobState = "discarded"
	// JobStateCancelled: cancelled by an admin or by a handler returning
	// JobCancel. Final.
	JobStateCancelled JobState = "cancelled"
)

// JobStates returns every job state in lifecycle order. The slice is new
// at each call; the caller may change it.
func JobStates() []JobState {
	return []JobState{
		JobStateAvailable, JobStateScheduled, JobStateRunning, JobStateRetryable,
		JobStateCompleted, JobStateDiscarded, JobStateCancelled,
	}
}

// ParseJobState returns the state named s. For any other string it returns
// an error that names s and lists the valid states.
func ParseJobState(s string) (JobState, error) {
	st := JobState(s)
	if !st.valid() {
		return "", unknownState(s)
	}
	return st, nil
}

func (s JobState) valid() bool {
	for _, x := range JobStates() {
		if s == x {
			return true
		}
	}
	return false
}

func unknownState(s string) error {
	names := make([]string, 0, 7)
	for _, x := range JobStates() {
		names = append(names, string(x))
	}
	return fmt.Errorf("conveyor: unknown job state %q (valid states: %s)", s, strings.Join(names, ", "))
}
