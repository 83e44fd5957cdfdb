-- conveyor schema for MySQL / MariaDB, version 17: Prune keeps a fired
-- batch while a batch that waits for it (a workflow's later step, a
-- batch_deps row naming it) is kept: without its row the waiting batch
-- would no longer see the step it waits for, and fire before that step
-- finished. batch_deps' primary key starts with batch_id; dep_idx finds
-- the batches waiting for a batch in one probe. It costs inserting and
-- pruning a workflow's batch one more index entry per dependency; no
-- claim or acknowledgement writes to batch_deps. Idempotent on re-run:
-- DDL auto-commits, and the driver treats "duplicate key name" as done.
ALTER TABLE `{p}batch_deps` ADD INDEX `dep_idx` (`dep_batch_id`)
