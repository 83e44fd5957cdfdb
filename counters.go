package conveyor

// Counters are one client's process counters: what this process has done
// since the client was made (New or connect.Open), for its own workers and
// for the remote workers it serves (RemoteWorkers), not totals for the
// queue (those are Stats.Queues). They only grow; subtract two readings to
// measure an interval. The JSON keys are the snake_case names in the tags.
type Counters struct {
	// ClaimRounds counts claim statements issued, one per round of a
	// queue's fetcher, whether or not it claimed anything.
	ClaimRounds int64 `json:"claim_rounds"`
	// Claimed counts jobs claimed, that is attempts handed to this
	// process's workers.
	Claimed int64 `json:"claimed"`
	// ClaimedAtInsert counts the jobs of Claimed that this process's own
	// Enqueue calls claimed as they wrote them, for its idle workers of
	// their queue (see "Claims at insert" in docs/design.md).
	ClaimedAtInsert int64 `json:"claimed_at_insert"`
	// OutcomeRounds counts the statements that wrote attempt outcomes,
	// each carrying a batch of them (Completed per OutcomeRounds is the
	// outcomes per commit).
	OutcomeRounds int64 `json:"outcome_rounds"`
	// InsertRounds counts the transactions of the group commit of
	// Enqueue calls, each carrying the jobs of the calls it gathered.
	InsertRounds int64 `json:"insert_rounds"`
	// Completed counts attempts whose success was written.
	Completed int64 `json:"completed"`
	// FailedAttempts counts attempts whose handler returned an error,
	// panicked or timed out (including JobCancel).
	FailedAttempts int64 `json:"failed_attempts"`
	// Snoozed counts attempts whose handler returned JobSnooze.
	Snoozed int64 `json:"snoozed"`
	// StaleAcksRefused counts outcomes the database refused because the
	// attempt no longer owned the job (its fence token was outdated): the
	// job had been rescued, released, cancelled or discarded meanwhile.
	StaleAcksRefused int64 `json:"stale_acks_refused"`
	// LeasesLost counts running attempts whose lease renewal found the job
	// owned by another claim; their handlers' contexts were cancelled.
	LeasesLost int64 `json:"leases_lost"`
	// LeaseDeadlines counts attempts stopped because their lease could not
	// be renewed in time: handlers cancelled when a fifth of the lease was
	// left, and claimed jobs given back before they started.
	LeaseDeadlines int64 `json:"lease_deadlines"`
	// Released counts attempts given back, claimable again without the
	// attempt counted: at Stop, and after a lease deadline.
	Released int64 `json:"released"`
	// Rescued counts jobs with an expired lease that this process, as the
	// leader, made retryable or discarded.
	Rescued int64 `json:"rescued"`
	// Promoted counts scheduled and retryable jobs that this process, as
	// the leader, made available once due.
	Promoted int64 `json:"promoted"`
	// Pruned counts finished jobs this process, as the leader, deleted
	// past their retention.
	Pruned int64 `json:"pruned"`
	// DBErrors counts database errors the engine absorbed and retried
	// (claims, heartbeats, completions, leader election, maintenance).
	DBErrors int64 `json:"db_errors"`
	// Driver holds the backend's own counters of retries and conflicts it
	// absorbed, by name; it is never nil. The names depend on the backend:
	//
	//   - SQLite: busy_retries (statements retried after SQLITE_BUSY or
	//     SQLITE_LOCKED), starved_writes (writes that waited for another
	//     process's lock longer than 20ms, to which other processes'
	//     writes then yielded), lock_timeouts (operations that gave up
	//     after retrying).
	//   - PostgreSQL: deadlock_retries, lock_timeouts and
	//     serialization_retries (statements retried after a deadlock, a
	//     lock timeout or a serialization failure), listen_reconnects
	//     (LISTEN connections re-established), server_drops (times the
	//     driver dropped its connections to a server that was gone or
	//     read-only, as in a failover), notify_lost (wake-up
	//     notifications that could not be sent, twice, after their jobs
	//     were committed: other processes found those jobs at their next
	//     poll).
	//   - MySQL/MariaDB: deadlock_retries (error 1213), lock_timeouts
	//     (error 1205), claim_conflicts (optimistic claims that lost the
	//     head of the queue to another claimer and picked again).
	Driver map[string]int64 `json:"driver"`
}

// Map returns every counter in one flat map under its JSON name, the
// driver's counters included (a driver counter named like an engine
// counter would replace it; none is). It suits logging and diffing
// readings.
func (c Counters) Map() map[string]int64 {
	out := map[string]int64{
		"claim_rounds":       c.ClaimRounds,
		"claimed":            c.Claimed,
		"claimed_at_insert":  c.ClaimedAtInsert,
		"outcome_rounds":     c.OutcomeRounds,
		"insert_rounds":      c.InsertRounds,
		"completed":          c.Completed,
		"failed_attempts":    c.FailedAttempts,
		"snoozed":            c.Snoozed,
		"stale_acks_refused": c.StaleAcksRefused,
		"leases_lost":        c.LeasesLost,
		"lease_deadlines":    c.LeaseDeadlines,
		"released":           c.Released,
		"rescued":            c.Rescued,
		"promoted":           c.Promoted,
		"pruned":             c.Pruned,
		"db_errors":          c.DBErrors,
	}
	for k, v := range c.Driver {
		out[k] = v
	}
	return out
}

// Counters returns this process's counters (see Counters).
func (c *Client[TTx]) Counters() Counters {
	m := c.eng.Metrics()
	out := Counters{
		ClaimRounds:      m.ClaimRounds.Load(),
		Claimed:          m.Claimed.Load(),
		ClaimedAtInsert:  m.ClaimedAtInsert.Load(),
		OutcomeRounds:    m.OutcomeRounds.Load(),
		InsertRounds:     m.InsertRounds.Load(),
		Completed:        m.Completed.Load(),
		FailedAttempts:   m.Failed.Load(),
		Snoozed:          m.Snoozed.Load(),
		StaleAcksRefused: m.StaleAcksRefused.Load(),
		LeasesLost:       m.LeasesLost.Load(),
		LeaseDeadlines:   m.LeaseDeadlines.Load(),
		Released:         m.Released.Load(),
		Rescued:          m.Rescued.Load(),
		Promoted:         m.Promoted.Load(),
		Pruned:           m.Pruned.Load(),
		DBErrors:         m.DBErrors.Load(),
		Driver:           map[string]int64{},
	}
	for k, v := range c.drv.Counters() {
		out.Driver[k] = v
	}
	return out
}
