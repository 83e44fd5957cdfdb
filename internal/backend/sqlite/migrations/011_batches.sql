-- Version 11: batches. A batch row keeps its callback job (the encoded
-- InsertParams, not yet a job) until every member has finished; the
-- maintenance leader then inserts the callback and records its id
-- (callback_id) in one transaction that changes the row only while
-- callback_id is NULL, so the callback is enqueued exactly once. Members
-- are rows of batch_jobs, written once when the batch is inserted; no
-- statement that finishes a job writes to a batch, so finishing a member
-- costs nothing more. batches_open lists the batches still waiting;
-- batches_fired lets Prune delete the batches fired longer ago than the
-- completed jobs' retention, with their member rows.
CREATE TABLE {p}batches (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    callback    TEXT    NOT NULL,
    callback_id INTEGER,
    created_at  INTEGER NOT NULL,
    fired_at    INTEGER
)
-- split
CREATE INDEX {p}batches_open ON {p}batches (id) WHERE callback_id IS NULL
-- split
CREATE INDEX {p}batches_fired ON {p}batches (fired_at) WHERE fired_at IS NOT NULL
-- split
CREATE TABLE {p}batch_jobs (
    batch_id INTEGER NOT NULL,
    job_id   INTEGER NOT NULL,
    PRIMARY KEY (batch_id, job_id)
) WITHOUT ROWID

-- split
-- A batch that waits for other batches (a workflow's step after steps):
-- each has finished once its callback was enqueued and has finished.
CREATE TABLE {p}batch_deps (
    batch_id     INTEGER NOT NULL,
    dep_batch_id INTEGER NOT NULL,
    PRIMARY KEY (batch_id, dep_batch_id)
) WITHOUT ROWID
