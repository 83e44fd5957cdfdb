-- Version 3: queue settings shared by every process. A queue with
-- paused_at set is paused: no claim takes its jobs until it is resumed.
-- A queue without a row is not paused.
CREATE TABLE {p}queues (
    name       varchar(128) PRIMARY KEY,
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
)
