-- conveyor schema for MySQL / MariaDB, version 16: a job's batch. GetJob
-- reports the batch a job is a member of and, for a callback, the batch
-- it closes. batch_jobs' primary key starts with batch_id, so finding a
-- member's batch would scan it; job_idx makes it one probe. A callback's
-- batch needs no new index: open_idx (version 12) starts with
-- callback_id. The index costs inserting and pruning a batch one more
-- entry per member; no claim or acknowledgement writes to batch_jobs.
-- Idempotent on re-run: DDL auto-commits, and the driver treats
-- "duplicate key name" as done.
ALTER TABLE `{p}batch_jobs` ADD INDEX `job_idx` (`job_id`)
