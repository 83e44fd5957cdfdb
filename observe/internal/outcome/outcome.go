// Package outcome names what an attempt's result made of its job, for
// the metrics and tracing middleware of this module.
package outcome

import (
	"fmt"

	"github.com/conveyorq/conveyor"
)

// Of returns the outcome label of an attempt of job that returned err:
// "completed", "snoozed", "cancelled", "discarded" (failed on its last
// attempt) or "failed" (failed, to be retried).
func Of(job *conveyor.JobInfo, err error) string {
	switch conveyor.OutcomeState(job, err) {
	case conveyor.JobStateCompleted:
		return "completed"
	case conveyor.JobStateScheduled:
		return "snoozed"
	case conveyor.JobStateCancelled:
		return "cancelled"
	case conveyor.JobStateDiscarded:
		return "discarded"
	}
	return "failed"
}

// Panicked turns a recovered panic value into the error the client
// records for it, so that middleware that re-panic can classify the
// attempt first.
func Panicked(r any) error { return fmt.Errorf("panic: %v", r) }
