-- Version 9: queue limits. A queues row holds a queue's limits beside its
-- pause: max_running (the most jobs running at once), rate jobs started
-- per rate_period_us microseconds; NULL means no such limit. A limit is
-- kept in rows of limit_slots, one per unit of the limit: a concurrency
-- slot (type 'c') is held by the attempt that claimed it (job_id, fence)
-- until a statement ends that attempt; a rate slot (type 'r') records the
-- last start it admitted (used_at, by the database's clock, in unix
-- microseconds). lkey is reserved for per-key limits and is '' for now.
-- Claims of a queue without limits never read or write these rows; the
-- statements that end an attempt free its slot through limit_slots_job.
ALTER TABLE {p}queues ADD COLUMN max_running INTEGER
-- split
ALTER TABLE {p}queues ADD COLUMN rate INTEGER
-- split
ALTER TABLE {p}queues ADD COLUMN rate_period_us INTEGER
-- split
CREATE TABLE {p}limit_slots (
    queue   TEXT    NOT NULL,
    type    TEXT    NOT NULL CHECK (type IN ('c', 'r')),
    lkey    TEXT    NOT NULL DEFAULT '',
    n       INTEGER NOT NULL,
    job_id  INTEGER,
    fence   INTEGER,
    used_at INTEGER,
    PRIMARY KEY (queue, type, lkey, n)
) WITHOUT ROWID
-- split
CREATE INDEX {p}limit_slots_job ON {p}limit_slots (job_id)
