-- conveyor schema for MySQL / MariaDB, version 7: the processes working
-- queues, each as it last registered itself: started clients (kind
-- 'client') every few seconds, HTTP workers (kind 'http') through the web
-- handler serving their claims. A row counts as alive while expires_at is
-- ahead of UTC_TIMESTAMP(6); a graceful stop deletes it, the maintenance
-- leader deletes rows long expired. queues is a JSON object of queue name
-- to concurrency (LONGTEXT, as args). A small table written once per
-- process every few seconds, never by a claim; no index beyond the key.
CREATE TABLE IF NOT EXISTS `{p}processes` (
  `id` VARCHAR(255) NOT NULL,
  `kind` VARCHAR(16) NOT NULL,
  `host` VARCHAR(255) NOT NULL,
  `pid` INT NULL,
  `version` VARCHAR(255) NOT NULL,
  `queues` LONGTEXT NOT NULL,
  `started_at` DATETIME(6) NOT NULL,
  `heartbeat_at` DATETIME(6) NOT NULL,
  `expires_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
