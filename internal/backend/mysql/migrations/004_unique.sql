-- conveyor schema for MySQL / MariaDB, version 4: unique jobs. unique_key
-- is the digest of what makes a job unique (kind and the parts the enqueue
-- chose), NULL for other jobs. unique_keep says in which finished states
-- the job still holds its key (1 completed, 2 discarded, 4 cancelled); an
-- unfinished job always does. There are no partial indexes here: the
-- STORED generated column unique_live is the key while the job holds it
-- and NULL otherwise, and a unique index on it lets the database refuse a
-- second job with a held key (NULLs never collide). Each statement is
-- idempotent on re-run (duplicate column or index name is done).
ALTER TABLE `{p}jobs` ADD COLUMN `unique_key` VARBINARY(32) NULL
-- split
ALTER TABLE `{p}jobs` ADD COLUMN `unique_keep` TINYINT NOT NULL DEFAULT 0
-- split
ALTER TABLE `{p}jobs` ADD COLUMN `unique_live` VARBINARY(32) AS (IF(unique_key IS NOT NULL AND (state IN ('available', 'scheduled', 'running', 'retryable') OR (state = 'completed' AND (unique_keep & 1) <> 0) OR (state = 'discarded' AND (unique_keep & 2) <> 0) OR (state = 'cancelled' AND (unique_keep & 4) <> 0)), `unique_key`, NULL)) STORED
-- split
ALTER TABLE `{p}jobs` ADD UNIQUE INDEX `unique_idx` (`unique_live`)
