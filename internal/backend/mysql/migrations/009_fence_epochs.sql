-- conveyor schema for MySQL / MariaDB, version 9: fence epochs, so that a
-- job's fence never repeats across a change of primary. A claim sets
-- fence = GREATEST(fence + 1, floor) where the floor is
--
--     epoch * 2^36 + (server & 65535) * 2^20
--
-- taken from the row of this table with the largest epoch, and only when
-- that row is the current server's (server: @@server_id, or 0 for every
-- node of a Galera cluster, which is one logical primary). When it is not
-- (a new primary, or a failback to a former one), the driver first inserts
-- the next epoch for this server, then claims. Why that is enough is
-- written beside fence_floor in queries.sql.
--
-- Rows are few (one per change of primary) and never updated. Nothing is
-- inserted here: the first claim after the upgrade inserts epoch 1, whose
-- floor (2^36 and up) is above every fence of the former layout (a count
-- of claims), so running jobs keep their fences and new claims only grow.
CREATE TABLE IF NOT EXISTS `{p}fence_epochs` (
  `epoch` BIGINT NOT NULL,
  `server` BIGINT NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`epoch`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
