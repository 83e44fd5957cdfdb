-- Version 18: a queue's concurrency slots leased to a process in blocks
-- (driver.SlotLeaser). A block is rows of limit_slots of a type of their
-- own, 'b', one per slot (n below the queue's max_running when taken),
-- with the process that holds it (owner: its worker id, the attempted_by
-- of the jobs it claims) and the lease's expiry (expires_at, by the
-- database's clock in unix microseconds, as a job's lease_expires_at).
-- A slot given back is deleted: a free slot is one without a row. What
-- counts against max_running is the slots leased in blocks and the
-- running jobs of the queue that no block's owner claimed.
--
-- A type of its own, not 'c': versions up to 15 claimed into a 'c' row
-- without a job (a block's) as into a free slot, and versions 16 and 17
-- delete every 'c' row of a queue whose limits they set; none of them
-- reads or deletes a 'b' row. The type's CHECK is part of the table, so
-- the table is made anew, the SQLite way (a new table, its rows copied,
-- the old one dropped, the new one renamed, its indexes made again), in
-- this migration's transaction. It holds the rate slots and nothing else
-- since migration 16 (and the 'c' rows a version up to 15 may have made
-- since), all of them kept; no job is touched.
CREATE TABLE {p}limit_slots_new (
    queue      TEXT    NOT NULL,
    type       TEXT    NOT NULL CHECK (type IN ('c', 'r', 'b')),
    lkey       TEXT    NOT NULL DEFAULT '',
    n          INTEGER NOT NULL,
    job_id     INTEGER,
    fence      INTEGER,
    used_at    INTEGER,
    owner      TEXT,
    expires_at INTEGER,
    PRIMARY KEY (queue, type, lkey, n)
) WITHOUT ROWID
-- split
INSERT INTO {p}limit_slots_new (queue, type, lkey, n, job_id, fence, used_at)
SELECT queue, type, lkey, n, job_id, fence, used_at FROM {p}limit_slots
-- split
DROP TABLE {p}limit_slots
-- split
ALTER TABLE {p}limit_slots_new RENAME TO {p}limit_slots
-- split
CREATE INDEX {p}limit_slots_job ON {p}limit_slots (job_id)
-- split
-- Rescue gives back the blocks whose lease expired: it reads their rows
-- by expiry, not the queues' rate slots (up to a rate's number each).
-- Written only when a block is taken, renewed or given back.
CREATE INDEX {p}limit_slots_blocks ON {p}limit_slots (expires_at)
    WHERE type = 'b'
-- split
-- The running jobs by queue and by the process that claimed them
-- (attempted_by), so that the count of a queue's running jobs that no
-- block's owner claimed, and whether an owner has a job of the queue
-- running, are read from index entries alone: the running jobs, less
-- those of the owners (one probe each). The index keeps its name, so
-- that the statements naming it (INDEXED BY) of this version and of the
-- one before read it alike. Its entry is written when a claim sets a job
-- running and deleted when the attempt ends, as before, and now carries
-- the worker id; heartbeats do not touch it. Made from the jobs running
-- now, which keep running.
DROP INDEX {p}jobs_running
-- split
CREATE INDEX {p}jobs_running ON {p}jobs (queue, attempted_by)
    WHERE state = 'running'
