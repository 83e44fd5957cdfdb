-- Version 13: job results. A completion that carries a result (the JSON
-- value a handler set) stores it here, in the statement that completes
-- the job (seg_complete, seg_complete_done) and only for the jobs that
-- statement moved; completions without one write nothing here. fence is
-- the completing attempt's: a result is the job's only while the job's
-- fence is still that one, so a job retried by hand and completed again
-- without a result shows none, and one completed again with a result
-- replaces the row. stored_at lets Prune drop results as old as the
-- completed jobs retention lets go.
CREATE TABLE {p}job_results (
    job_id    bigint      PRIMARY KEY,
    fence     bigint      NOT NULL,
    result    json        NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {p}job_results_stored_idx ON {p}job_results (stored_at)
