-- Version 5: the periodic schedules, as the processes running them last
-- recorded them. A slot's job is made exactly once by its unique key; this
-- table only remembers each schedule's latest slot (so that a slot missed
-- while nothing ran can be told from one that ran) and its next one, for
-- listing. Times in microseconds since the Unix epoch.
CREATE TABLE {p}schedules (
    name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    spec       TEXT    NOT NULL,
    last_slot  INTEGER,
    last_job   INTEGER,
    next_slot  INTEGER,
    updated_at INTEGER NOT NULL
)
