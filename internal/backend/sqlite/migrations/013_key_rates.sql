-- Version 13: rates per key. A queue may limit how many jobs of one key
-- start within a window (key_rate starts per key_rate_period_us
-- microseconds; NULL for none). The rate is held by rows of key_slots with
-- a negative n (-1 .. -key_rate), made by the claims that need them: a
-- rate slot's job_id and fence stay NULL, and its used_at is the database
-- time (unix microseconds) of the last start it admitted (0 when it has
-- admitted none). A slot admits a start when its stamp is at least a
-- period old. The statements that free key slots match held rows only
-- (job_id set), so they never touch a rate slot; Rescue deletes those
-- stamped more than max(period, a minute) ago, those beyond their queue's
-- key_rate and those of a queue without one.
ALTER TABLE {p}queues ADD COLUMN key_rate INTEGER
-- split
ALTER TABLE {p}queues ADD COLUMN key_rate_period_us INTEGER
