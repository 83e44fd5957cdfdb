-- conveyor schema for MySQL / MariaDB, version 8: the dashboard's job
-- lists (ListJobs: one filter by state, queue or kind, in id order, paged
-- by id) read one index range each instead of walking the primary key
-- past every job that does not match. InnoDB maintains a secondary index
-- only when its columns change: the state index costs every insert, claim
-- and acknowledgement, the queue and kind indexes only inserts and
-- deletes. See docs/web.md. Idempotent on re-run: DDL auto-commits, and
-- the driver treats "duplicate key name" as done.
ALTER TABLE `{p}jobs` ADD INDEX `state_list_idx` (`state`, `id`)
-- split
ALTER TABLE `{p}jobs` ADD INDEX `queue_list_idx` (`queue`, `id`)
-- split
ALTER TABLE `{p}jobs` ADD INDEX `kind_list_idx` (`kind`, `id`)
