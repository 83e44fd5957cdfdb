-- Version 3: queue settings shared by every process. A queue with
-- paused_at set is paused: no claim takes its jobs until it is resumed.
-- A queue without a row is not paused.
CREATE TABLE {p}queues (
    name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    paused_at  INTEGER,
    updated_at INTEGER NOT NULL
)
