-- conveyor schema for MySQL / MariaDB, version 3: queue settings shared by
-- every process. A queue with paused_at set is paused: no claim takes its
-- jobs until it is resumed. A queue without a row is not paused.
CREATE TABLE IF NOT EXISTS `{p}queues` (
  `name` VARCHAR(128) NOT NULL,
  `paused_at` DATETIME(6) NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
