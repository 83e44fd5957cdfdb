-- conveyor schema for MySQL / MariaDB, version 13: key limits. A job may
-- carry a limit key (lkey, NULL for none; utf8mb4_bin like every text
-- column here). akey_queue is the queue of an available job that has a
-- key and NULL otherwise (the emulated partial index, as avail_queue in
-- version 1): key_idx serves a claim's walk of a queue's distinct keys
-- (a loose scan of its prefix) and an Ordered key's head (the primary
-- key ends every secondary index, so (akey_queue, lkey) is ordered by
-- id); key_prio_idx a key's next jobs by priority then id. Jobs without
-- a key keep akey_queue NULL in every state, so their state changes never
-- touch these indexes. A queue's key limits live beside its other
-- limits: key_max_running (jobs of one key running at once, NULL for
-- none) and key_order (0 or NULL: none, 1: ordered, a failed job keeps
-- its key's slot until it succeeds or ends, 2: ordered, moving on past a
-- failed job). The slots that enforce them are rows of limit_slots
-- (version 10) of type 'k', one per key and unit of the limit (lkey, n),
-- made by claims when first needed: free (job_id NULL), held by a running
-- attempt (job_id, fence), or kept for an ordered key's job waiting for
-- its retry (job_id set, fence NULL). Idempotent on re-run: the driver
-- treats "duplicate column" and "duplicate key name" as done.
ALTER TABLE `{p}jobs` ADD COLUMN `lkey` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
-- split
ALTER TABLE `{p}jobs` ADD COLUMN `akey_queue` VARCHAR(128) AS (IF(`state` = 'available' AND `lkey` IS NOT NULL, `queue`, NULL)) STORED
-- split
ALTER TABLE `{p}jobs` ADD INDEX `key_idx` (`akey_queue`, `lkey`)
-- split
ALTER TABLE `{p}jobs` ADD INDEX `key_prio_idx` (`akey_queue`, `lkey`, `priority`, `id`)
-- split
ALTER TABLE `{p}queues` ADD COLUMN `key_max_running` INT NULL, ADD COLUMN `key_order` INT NULL
