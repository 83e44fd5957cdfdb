-- Version 12: key limits. A job may carry a limit key (lkey: a tenant, an
-- account; NULL for none). A queue may limit how many jobs of one key run
-- at once (key_max_running) and run each key's jobs one at a time in
-- enqueue order (key_order: 0 or NULL none, 1 ordered, holding a key while
-- its failed job waits for its retry, 2 ordered moving on to the key's
-- next job meanwhile; key_max_running is then 1).
ALTER TABLE {p}jobs ADD COLUMN lkey TEXT
-- split
-- A claim of a key-limited queue: the distinct keys of its due jobs in
-- key order (one probe per key), and a key's next jobs by priority then
-- id. Jobs without a key are not in it, so they cost it nothing.
CREATE INDEX {p}jobs_key ON {p}jobs (queue, lkey, priority, id)
    WHERE state = 'available' AND lkey IS NOT NULL
-- split
-- An ordered key's head: its oldest due job by id.
CREATE INDEX {p}jobs_key_order ON {p}jobs (queue, lkey, id)
    WHERE state = 'available' AND lkey IS NOT NULL
-- split
ALTER TABLE {p}queues ADD COLUMN key_max_running INTEGER
-- split
ALTER TABLE {p}queues ADD COLUMN key_order INTEGER
-- split
-- One row per unit of a key's limit, made by the claims that need it: free
-- (job_id NULL), held by a running attempt (job_id, fence), or kept for an
-- ordered key's job waiting for its retry (job_id, fence NULL). used_at is
-- the database time (unix microseconds) of its last take or its creation;
-- Rescue deletes free rows unused for a minute. The statements that end
-- an attempt find its row by the job's queue and key, so there is no
-- index on job_id.
CREATE TABLE {p}key_slots (
    queue   TEXT    NOT NULL,
    lkey    TEXT    NOT NULL,
    n       INTEGER NOT NULL,
    job_id  INTEGER,
    fence   INTEGER,
    used_at INTEGER NOT NULL,
    PRIMARY KEY (queue, lkey, n)
) WITHOUT ROWID
