-- Version 8: the dashboard's job lists (ListJobs) filtered by queue or by
-- kind, in id order, paged by id, read one index range each instead of
-- walking the primary key past every job that does not match: a page
-- costs about its rows whatever the table's size. Each index costs every
-- insert, and every claim and acknowledgement (a state change is never a
-- HOT update), one more index entry. There is no (state, id) index: a
-- state filter walks the primary key in id order, which is fast for the
-- common states, and its entry per state change would cost the hot path
-- a third index; see docs/web.md for the measured cost. Built in the
-- migration's transaction, which blocks writes to the jobs table while it
-- runs (about a second per million jobs per index).
CREATE INDEX {p}jobs_queue_list_idx ON {p}jobs (queue, id)
-- split
CREATE INDEX {p}jobs_kind_list_idx ON {p}jobs (kind, id)
