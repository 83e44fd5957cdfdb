-- Version 16: rates per key (driver.QueueLimits.KeyRate, KeyRatePeriod).
-- A queue's key_rate (the most starts per key in any window) and
-- key_rate_period_us (that window, in microseconds); NULL means none.
-- The rate slots are rows of {p}key_slots with a negative n (-1 ..
-- -key_rate per key), job_id and fence always NULL, used_at the database
-- time of the start each last admitted ('epoch' when made: open). Adding
-- nullable columns without a default rewrites nothing.
ALTER TABLE {p}queues
    ADD COLUMN key_rate           integer,
    ADD COLUMN key_rate_period_us bigint
