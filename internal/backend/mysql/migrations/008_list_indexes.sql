-- conveyor schema for MySQL / MariaDB, version 8: the dashboard's job
-- lists (ListJobs) filtered by queue or by kind, in id order, paged by
-- id, read one index range each instead of walking the primary key past
-- every job that does not match. InnoDB maintains a secondary index only
-- when its columns change: these cost inserts and deletes, not claims or
-- acknowledgements. There is no (state, id) index, which every state
-- change would pay for; a state filter walks the primary key in id order.
-- See docs/web.md. Idempotent on re-run: DDL auto-commits, and the driver
-- treats "duplicate key name" as done.
ALTER TABLE `{p}jobs` ADD INDEX `queue_list_idx` (`queue`, `id`)
-- split
ALTER TABLE `{p}jobs` ADD INDEX `kind_list_idx` (`kind`, `id`)
