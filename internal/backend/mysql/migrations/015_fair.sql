-- conveyor schema for MySQL / MariaDB, version 15: fair queues. A queue
-- whose claims serve its keys in turns (QueueLimits.Fair) has key_fair 1
-- beside its other limits (NULL for not fair). key_weights holds the
-- queue's key weights (SetKeyWeights) as a JSON object of key to weight,
-- keys sorted (NULL for none): per-key data, set apart from the limits,
-- which SetQueueLimits leaves alone. Fair uses no slots: it orders a
-- claim, it limits nothing. Idempotent on re-run: the driver treats
-- "duplicate column" as done.
ALTER TABLE `{p}queues` ADD COLUMN `key_fair` TINYINT NULL, ADD COLUMN `key_weights` TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
