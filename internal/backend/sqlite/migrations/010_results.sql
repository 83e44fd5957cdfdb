-- Version 10: job results. A completion that carries a result (the JSON
-- value a handler set) stores it here, in the transaction of the fenced
-- statement that completed the job and only for the jobs that statement
-- changed; completions without one write nothing here. stored_at (unix
-- microseconds, the database's clock) lets Prune drop results as old as
-- the completed jobs it deletes. fence is the completing attempt's: a
-- result is the job's only while the job's fence is still that one, so a
-- job retried by hand and completed again without a result shows none,
-- and one completed again with a result replaces the row.
CREATE TABLE {p}job_results (
    job_id    INTEGER PRIMARY KEY,
    fence     INTEGER NOT NULL,
    result    TEXT    NOT NULL,
    stored_at INTEGER NOT NULL
)
-- split
CREATE INDEX {p}job_results_stored ON {p}job_results (stored_at)
