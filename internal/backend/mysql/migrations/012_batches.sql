-- conveyor schema for MySQL / MariaDB, version 12: batches. A batch row
-- keeps its callback job (the encoded InsertParams, not yet a job) until
-- every member has finished; the maintenance leader then inserts the
-- callback and records its id (callback_id) in one transaction whose
-- UPDATE changes the row only while callback_id is NULL, so the callback
-- is enqueued exactly once. Members are rows of batch_jobs, written once
-- when the batch is inserted; no statement that finishes a job writes to
-- a batch, so finishing a member costs nothing more. open_idx lists the
-- batches still waiting (callback_id NULL) by id; batch_deps holds the
-- earlier batches a batch waits for (a workflow's steps), each finished
-- once its callback was enqueued and has finished; fired_idx lets Prune
-- delete the batches fired longer ago than the completed jobs'
-- retention, with their member rows.
CREATE TABLE IF NOT EXISTS `{p}batches` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `callback` LONGTEXT NOT NULL,
  `callback_id` BIGINT NULL,
  `created_at` DATETIME(6) NOT NULL,
  `fired_at` DATETIME(6) NULL,
  PRIMARY KEY (`id`),
  KEY `open_idx` (`callback_id`, `id`),
  KEY `fired_idx` (`fired_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
-- split
CREATE TABLE IF NOT EXISTS `{p}batch_jobs` (
  `batch_id` BIGINT NOT NULL,
  `job_id` BIGINT NOT NULL,
  PRIMARY KEY (`batch_id`, `job_id`)
) ENGINE=InnoDB

-- split
CREATE TABLE IF NOT EXISTS `{p}batch_deps` (
  `batch_id` BIGINT NOT NULL,
  `dep_batch_id` BIGINT NOT NULL,
  PRIMARY KEY (`batch_id`, `dep_batch_id`)
) ENGINE=InnoDB
