-- Version 15: key limits (driver.QueueLimits.KeyMaxRunning, Ordered). A
-- job's limit key is the lkey column of its row (NULL: no key), bytewise
-- ordered (COLLATE "C") so that the claim's walk of a queue's keys reads
-- an index in its own order. The segment tables get it through the
-- registry (new ones through seg_table), and the ready segments the
-- keyed claim's indexes (seg_index_ready). {p}jobs of a prefix not yet
-- converted is left alone: it never held a key (the conversion moves its
-- jobs without one), and an ALTER TABLE there would queue its lock behind
-- any transaction that holds the table (a pg_dump), stopping the
-- migration and every writer queued behind it.
DO $$
DECLARE
    r record;
BEGIN
    IF to_regclass('{p}segments') IS NOT NULL THEN
        FOR r IN SELECT tbl, phase FROM {p}segments ORDER BY ord LOOP
            IF to_regclass(r.tbl) IS NOT NULL THEN
                EXECUTE 'ALTER TABLE ' || r.tbl || ' ADD COLUMN IF NOT EXISTS lkey text COLLATE "C"';
                IF r.phase = 'ready' THEN
                    EXECUTE 'CREATE INDEX IF NOT EXISTS ' || r.tbl || '_key_idx ON ' || r.tbl
                         || ' (queue, lkey, priority, id) WHERE lkey IS NOT NULL';
                    EXECUTE 'CREATE INDEX IF NOT EXISTS ' || r.tbl || '_key_id_idx ON ' || r.tbl
                         || ' (queue, lkey, id) WHERE lkey IS NOT NULL';
                END IF;
            END IF;
        END LOOP;
    END IF;
END
$$
-- split
-- A queue's key limits: key_max_running (the most running jobs per key;
-- 1 when ordered) and key_order (NULL or 0: none, 1: ordered, a failed
-- job keeps its key's slot until it runs again, 2: ordered, moving on).
ALTER TABLE {p}queues
    ADD COLUMN key_max_running integer,
    ADD COLUMN key_order       integer
-- split
-- The slots of key limits: n = 0..key_max_running-1 per (queue, key),
-- made on demand by the claims that need them and deleted by Rescue's
-- sweep once free and unused for a while. A slot is free (job_id NULL),
-- held by a running attempt (job_id, fence), or kept for an ordered key's
-- job waiting for its retry (job_id set, fence NULL). used_at: the
-- database time of its last take (or its creation). As {p}limit_slots: no
-- index on job_id and room on each page, so that takes and frees stay
-- HOT updates.
CREATE TABLE {p}key_slots (
    queue   varchar(128) NOT NULL,
    lkey    text COLLATE "C" NOT NULL,
    n       integer      NOT NULL,
    job_id  bigint,
    fence   bigint,
    used_at timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, lkey, n)
) WITH (fillfactor = 50)
