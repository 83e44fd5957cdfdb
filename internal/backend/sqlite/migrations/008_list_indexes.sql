-- Version 8: the dashboard's job lists (ListJobs) filtered by queue or by
-- kind, in id order, paged by id, read one index range each instead of
-- walking the table past every job that does not match: a page costs
-- about its rows whatever the table's size. They cost inserts and deletes
-- only (an UPDATE touches only the indexes of the columns it changes, and
-- no claim or acknowledgement changes queue or kind). There is no index
-- on (state, id) here: SQLite's planner, without ANALYZE statistics,
-- prefers it to the rowid and to the partial indexes in the claim's
-- acknowledgements and in maintenance (complete, heartbeat, release,
-- rescue, promote, prune all filter on state), so it would slow the hot
-- path; a state filter walks the table in id order. See docs/web.md.
CREATE INDEX {p}jobs_queue_list ON {p}jobs (queue, id)
-- split
CREATE INDEX {p}jobs_kind_list ON {p}jobs (kind, id)
