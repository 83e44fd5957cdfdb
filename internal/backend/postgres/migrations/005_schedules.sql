-- Version 5: the periodic schedules, as the processes running them last
-- recorded them. A slot's job is made exactly once by its unique key; this
-- table only remembers each schedule's latest slot (so that a slot missed
-- while nothing ran can be told from one that ran) and its next one, for
-- listing.
CREATE TABLE {p}schedules (
    name       varchar(128) PRIMARY KEY,
    spec       text        NOT NULL,
    last_slot  timestamptz,
    last_job   bigint,
    next_slot  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
)
