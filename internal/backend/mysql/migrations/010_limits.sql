-- conveyor schema for MySQL / MariaDB, version 10: queue limits. A
-- queue's row in {p}queues (beside its pause) holds its limits, NULL for
-- none: max_running (jobs running at once), rate and rate_period_us
-- (starts per window, the window in microseconds). limit_slots holds the
-- slots that enforce them, one row per unit of a limit, so that
-- concurrent claimers lock different rows (SKIP LOCKED) instead of
-- queueing on one counter row: type 'c' is a concurrency slot, held by
-- one attempt (job_id, fence) from its claim to the statement that ends
-- it; type 'r' is a rate slot, used_at the database's time of the last
-- start it admitted. lkey is reserved for limits per key ('' for now).
-- The job_id index serves the freeing of an attempt's slot by every
-- statement that ends an attempt; for jobs of unlimited queues it is one
-- probe of an index that holds only the limited queues' running jobs.
-- Idempotent on re-run: the driver treats "duplicate column" as done.
ALTER TABLE `{p}queues` ADD COLUMN `max_running` INT NULL, ADD COLUMN `rate` INT NULL, ADD COLUMN `rate_period_us` BIGINT NULL
-- split
CREATE TABLE IF NOT EXISTS `{p}limit_slots` (
  `queue` VARCHAR(128) NOT NULL,
  `type` CHAR(1) NOT NULL,
  `lkey` VARCHAR(255) NOT NULL DEFAULT '',
  `n` INT NOT NULL,
  `job_id` BIGINT NULL,
  `fence` BIGINT NULL,
  `used_at` DATETIME(6) NULL,
  PRIMARY KEY (`queue`, `type`, `lkey`, `n`),
  KEY `slot_job_idx` (`job_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
