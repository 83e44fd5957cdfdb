-- conveyor schema for MySQL / MariaDB, version 11: job results. A
-- completion that carries a result (the JSON value a handler set) stores
-- it here, in the transaction of the fenced statement that completes the
-- job and only if that statement changed the job; completions without
-- one write nothing here. fence is the completing attempt's: a result is
-- the job's only while the job's fence is still that one, so a job
-- retried by hand and completed again without a result shows none, and
-- one completed again with a result replaces the row. stored_at lets
-- Prune drop results as old as the completed jobs it deletes. LONGTEXT
-- rather than JSON: MariaDB's JSON is LONGTEXT, and the result is stored
-- as the handler encoded it, already checked.
CREATE TABLE IF NOT EXISTS `{p}job_results` (
  `job_id` BIGINT NOT NULL,
  `fence` BIGINT NOT NULL,
  `result` LONGTEXT NOT NULL,
  `stored_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`job_id`),
  KEY `job_results_stored_idx` (`stored_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
