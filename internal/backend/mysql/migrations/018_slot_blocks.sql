-- conveyor schema for MySQL / MariaDB, version 18: blocks of concurrency
-- slots leased to a process (driver.SlotLeaser, blocks.go). A concurrency
-- slot (type 'c' of limit_slots, version 10) is free, held by an attempt
-- (job_id, fence), or leased to an owner, never two of these: owner is the
-- process's worker id, the string its claims store in jobs.attempted_by
-- (TEXT like that column, so that every worker id a claim stores can own
-- a block), and leased_until the lease's expiry by the database's clock;
-- both are NULL on a slot no owner holds, and on every other type of
-- slot. slot_lease_idx serves the rescue's read of the expired leases, a
-- range of the few owned slots (the NULLs of the others sort before it);
-- only LeaseSlots and the rescue write it, never a claim or an outcome.
-- Both changes are online: the columns are appended, NULL (instant on
-- MariaDB 10.3+ and MySQL 8.0.12+, in place before), and the index is
-- built beside concurrent writes. Idempotent on re-run: the driver
-- treats "duplicate column" and "duplicate key name" as done.
ALTER TABLE `{p}limit_slots` ADD COLUMN `owner` TEXT NULL, ADD COLUMN `leased_until` DATETIME(6) NULL
-- split
ALTER TABLE `{p}limit_slots` ADD INDEX `slot_lease_idx` (`leased_until`)
