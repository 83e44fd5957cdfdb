-- Version 16: a queue's concurrency limit (max_running) is held by
-- counting its running jobs inside the limited claim's write transaction,
-- no longer by concurrency slot rows. jobs_running holds the running jobs
-- only, by queue, so the count reads the queue's running jobs' entries and
-- nothing else. Its entry is written when a claim sets a job running and
-- deleted when the attempt ends; heartbeats, which change only the lease,
-- do not touch it.
CREATE INDEX {p}jobs_running ON {p}jobs (queue)
    WHERE state = 'running'
-- split
-- The concurrency slots ('c') are no longer read: the running jobs they
-- were held for are counted instead. Deleting them also leaves a process
-- of an earlier version, still running beside this one, no free slot to
-- claim into, so it cannot take a limited queue past its limit.
DELETE FROM {p}limit_slots WHERE type = 'c'
