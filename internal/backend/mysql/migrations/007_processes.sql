-- Placeholder: version 7 is the processes table, added on branch procs
-- (its 007_processes.sql). This file only keeps the versions numbered
-- 1..n on a branch without it; when merging, take procs' file.
SELECT 1
