-- Version 7: the processes working queues, each as it last registered
-- itself: started clients (kind 'client') every few seconds, HTTP workers
-- (kind 'http') through the web handler serving their claims. A row
-- counts as alive while expires_at is ahead of now(); a graceful stop
-- deletes it, the maintenance leader deletes rows long expired. queues is
-- a JSON object of queue name to concurrency. A small table written once
-- per process every few seconds, never by a claim; no index beyond the
-- key (every read lists it whole).
CREATE TABLE {p}processes (
    id           text        PRIMARY KEY,
    kind         text        NOT NULL,
    host         text        NOT NULL,
    pid          integer,
    version      text        NOT NULL,
    queues       jsonb       NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
)
