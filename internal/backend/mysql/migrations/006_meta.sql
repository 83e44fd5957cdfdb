-- conveyor schema for MySQL / MariaDB, version 6: job metadata. meta is a
-- JSON object of string keys and values given at enqueue
-- (EnqueueOpts.Metadata), for what travels with a job outside its
-- arguments: a trace context, a tenant. NULL, the common case, is stored
-- off the row's data; no index reads it. LONGTEXT like args (MySQL's JSON
-- type is an alias of LONGTEXT on MariaDB and would re-encode the text on
-- MySQL). Idempotent on re-run: DDL auto-commits, and the driver treats
-- "duplicate column" as done.
ALTER TABLE `{p}jobs` ADD COLUMN `meta` LONGTEXT NULL
