-- Version 2: a fence token per job that only grows. Every claim sets
-- fence = fence + 1 and every acknowledgement (complete, heartbeat,
-- release) is fenced by it. The attempt counter is given back by a
-- graceful release, so it cannot serve as the fence: a later claim would
-- carry the same number as the released attempt. Jobs running while the
-- schema is upgraded keep their attempt as their fence.
ALTER TABLE {p}jobs ADD COLUMN fence INTEGER NOT NULL DEFAULT 0
-- split
UPDATE {p}jobs SET fence = attempt WHERE state = 'running'
