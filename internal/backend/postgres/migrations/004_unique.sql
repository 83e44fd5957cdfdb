-- Version 4: unique jobs. unique_key is the digest of what makes a job
-- unique (kind and the parts the enqueue chose), NULL for other jobs.
-- unique_keep says in which finished states the job still holds its key
-- (1 completed, 2 discarded, 4 cancelled); an unfinished job always does.
-- The partial unique index lets the database refuse a second job with a
-- held key (concurrent inserters of one key wait for each other's commit):
-- enqueues never read-then-insert. A job that leaves the states of its
-- key frees it without any statement touching the key.
ALTER TABLE {p}jobs ADD COLUMN unique_key bytea,
                    ADD COLUMN unique_keep smallint NOT NULL DEFAULT 0
-- split
CREATE UNIQUE INDEX {p}jobs_unique_idx ON {p}jobs (unique_key)
    WHERE unique_key IS NOT NULL AND (state IN ('available', 'scheduled', 'running', 'retryable') OR (state = 'completed' AND (unique_keep & 1) <> 0) OR (state = 'discarded' AND (unique_keep & 2) <> 0) OR (state = 'cancelled' AND (unique_keep & 4) <> 0))
