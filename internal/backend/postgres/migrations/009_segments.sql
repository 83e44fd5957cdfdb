-- Version 9: the registry of segment tables (docs/postgres-storage.md).
-- Empty, it changes nothing: the jobs stay in the one table {p}jobs
-- until Migrate converts the prefix, once every migration is applied.
-- Once converted, every process on the prefix reads this table: each row is one segment table of a phase
-- (ready, running, waiting, done, dead), its incarnation (the last value
-- of its sequence <tbl>_inc, advanced by every reclaim) and its status:
-- current (new rows go there), sealed (read, drained by the maintenance
-- leader), drained (no live rows, waiting for its lock to be free to be
-- truncated) or free (truncated, ready to become current again).
CREATE TABLE {p}segments (
    tbl       text        PRIMARY KEY,
    phase     text        NOT NULL
        CONSTRAINT {p}segments_phase_check CHECK (phase IN ('ready', 'running', 'waiting', 'done', 'dead')),
    status    text        NOT NULL
        CONSTRAINT {p}segments_status_check CHECK (status IN ('current', 'sealed', 'drained', 'free')),
    inc       bigint      NOT NULL,
    ord       bigint      NOT NULL,
    sealed_at timestamptz
)
-- split
-- Numbers the segment tables of the prefix ({p}<phase>_<n>).
CREATE SEQUENCE {p}segments_n OWNED BY {p}segments.ord
