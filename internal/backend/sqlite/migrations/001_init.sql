-- Initial schema. Times are INTEGER unix microseconds (UTC) computed from
-- the database's clock; errors is a JSON array of AttemptError objects.
CREATE TABLE {p}jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL CHECK (length(queue) BETWEEN 1 AND 128),
    kind             TEXT    NOT NULL CHECK (length(kind) <= 128),
    args             TEXT    NOT NULL DEFAULT '{}',
    state            TEXT    NOT NULL DEFAULT 'available'
                     CHECK (state IN ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 25,
    timeout_ms       INTEGER NOT NULL DEFAULT 0,
    scheduled_at     INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    attempted_at     INTEGER,
    finalized_at     INTEGER,
    lease_expires_at INTEGER,
    attempted_by     TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]'
)
-- split
-- Claims: the due jobs of one queue in claim order.
CREATE INDEX {p}jobs_claim ON {p}jobs (queue, priority, scheduled_at, id)
    WHERE state = 'available'
-- split
-- Promote: scheduled and retryable jobs by due time.
CREATE INDEX {p}jobs_due ON {p}jobs (scheduled_at)
    WHERE state IN ('scheduled', 'retryable')
-- split
-- Rescue: running jobs by lease expiry.
CREATE INDEX {p}jobs_lease ON {p}jobs (lease_expires_at)
    WHERE state = 'running'
-- split
-- Prune: finished jobs by finalization time.
CREATE INDEX {p}jobs_finalized ON {p}jobs (finalized_at)
    WHERE state IN ('completed', 'discarded', 'cancelled')
-- split
CREATE TABLE {p}leader (
    name       TEXT    PRIMARY KEY,
    leader_id  TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
)
