-- Version 7: the processes working queues, each as it last registered
-- itself: started clients (kind 'client') every few seconds, HTTP workers
-- (kind 'http') through the web handler serving their claims. A row
-- counts as alive while expires_at is ahead of the database's clock; a
-- graceful stop deletes it, the maintenance leader deletes rows long
-- expired. queues is a JSON object of queue name to concurrency. Times in
-- microseconds since the Unix epoch. A small table written once per
-- process every few seconds (through the write gate, as every write),
-- never by a claim; no index beyond the key.
CREATE TABLE {p}processes (
    id           TEXT    PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    kind         TEXT    NOT NULL,
    host         TEXT    NOT NULL,
    pid          INTEGER,
    version      TEXT    NOT NULL,
    queues       TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
)
