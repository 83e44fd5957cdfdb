-- Version 12: queue limits. A queue's row in
-- {p}queues, beside its pause, holds its limits: max_running (the most
-- attempts running at once), rate and rate_period_us (the most starts in
-- any window of that many microseconds); NULL means no limit.
ALTER TABLE {p}queues
    ADD COLUMN max_running    integer,
    ADD COLUMN rate           integer,
    ADD COLUMN rate_period_us bigint
-- split
-- The slots of limited queues: a limit of N is N rows, each locked by one
-- claimer at a time (FOR UPDATE SKIP LOCKED), never one counter row
-- every claimer must lock. type 'c': a concurrency slot, held by the
-- attempt (job_id, fence) that took it until the attempt ends; type 'r':
-- a rate slot, used_at the start it last recorded (the database's
-- clock). lkey is reserved for limits per key ('' for now). No index
-- on job_id, and room on each page (fillfactor 50): taking and freeing a
-- slot then changes no indexed column and stays a HOT update on the
-- table's few pages (segments.sql says why).
CREATE TABLE {p}limit_slots (
    queue   varchar(128) NOT NULL,
    type    char(1)      NOT NULL CONSTRAINT {p}limit_slots_type_check CHECK (type IN ('c', 'r')),
    lkey    varchar(255) NOT NULL DEFAULT '',
    n       integer      NOT NULL,
    job_id  bigint,
    fence   bigint,
    used_at timestamptz,
    PRIMARY KEY (queue, type, lkey, n)
) WITH (fillfactor = 50)
