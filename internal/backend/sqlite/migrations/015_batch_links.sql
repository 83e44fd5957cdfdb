-- Version 15: a job's batch. GetJob reports the batch a job is a member
-- of and, for a callback, the batch it closes. batch_jobs' primary key
-- starts with batch_id, and batches has no index on callback_id, so both
-- lookups would scan; batch_jobs_job finds a member's batch and
-- batches_callback a callback's, one probe each. batches_callback holds
-- only fired batches (callback_id set once, when the callback is
-- inserted). They cost inserting and pruning a batch one more index entry
-- each; no claim or acknowledgement writes to these tables.
CREATE INDEX {p}batch_jobs_job ON {p}batch_jobs (job_id)
-- split
CREATE INDEX {p}batches_callback ON {p}batches (callback_id) WHERE callback_id IS NOT NULL
