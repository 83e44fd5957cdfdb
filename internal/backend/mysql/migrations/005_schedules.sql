-- conveyor schema for MySQL / MariaDB, version 5: the periodic schedules,
-- as the processes running them last recorded them. A slot's job is made
-- exactly once by its unique key; this table only remembers each
-- schedule's latest slot (so that a slot missed while nothing ran can be
-- told from one that ran) and its next one, for listing.
CREATE TABLE IF NOT EXISTS `{p}schedules` (
  `name` VARCHAR(128) NOT NULL,
  `spec` TEXT NOT NULL,
  `last_slot` DATETIME(6) NULL,
  `last_job` BIGINT NULL,
  `next_slot` DATETIME(6) NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
