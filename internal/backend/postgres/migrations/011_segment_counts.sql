-- Version 11: the job counts of a sealed done or dead segment, recorded
-- once by the maintenance leader, so that Stats reads a few registry rows
-- instead of counting every finished job that retention keeps
-- (docs/postgres-storage.md, "Stats of finished segments"). counts is a
-- JSON array of {"queue", "state", "n"}, NULL while unknown: not yet
-- counted, or a by-hand retry took a job out of the segment since.
-- counts_inc is the incarnation they were recorded under: they hold only
-- while the segment is sealed under that same incarnation.
ALTER TABLE {p}segments ADD COLUMN counts jsonb, ADD COLUMN counts_inc bigint
