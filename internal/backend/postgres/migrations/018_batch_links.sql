-- Version 18: a job's batch. GetJob reports the batch a job is a member
-- of and, for a callback, the batch it closes. batch_jobs' primary key
-- starts with batch_id, and batches has no index on callback_id, so both
-- lookups would scan; batch_jobs_job_idx finds a member's batch and
-- batches_callback_idx a callback's, one probe each.
-- batches_callback_idx holds only fired batches (callback_id set once,
-- when the callback is inserted). They cost inserting and pruning a batch
-- one more index entry each; no claim or acknowledgement writes to these
-- tables. Each ends with the id the lookup takes the lowest of, so
-- that the planner reads it from the index's one range rather than
-- walking a primary key in id order for a match. Built in the
-- migration's transaction, which blocks writes to the two tables
-- (inserting and firing batches) while it runs.
CREATE INDEX {p}batch_jobs_job_idx ON {p}batch_jobs (job_id, batch_id)
-- split
CREATE INDEX {p}batches_callback_idx ON {p}batches (callback_id, id) WHERE callback_id IS NOT NULL
