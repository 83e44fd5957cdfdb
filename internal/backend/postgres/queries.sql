-- Queries of the PostgreSQL backend that name no segment table (the
-- statements of the jobs' tables are in segments.sql). Each block is
-- headed by "-- name: X"; {p} is the table prefix. Durations are passed
-- as bigint microseconds and every timestamp comes from the server's
-- clock (now(), the start of the transaction). Batch columns
-- ($n::bigint[], $n::text[], ...) arrive as array literals in
-- text-format parameters (see arrays.go) and are expanded with unnest,
-- so a batch of any size is one statement.

-- name: migrate_lock
-- Serialises concurrent migrators of one prefix until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended('conveyor-migrate:' || $1::text, 0))

-- name: create_migrations
CREATE TABLE IF NOT EXISTS {p}schema_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: current_version
SELECT coalesce(max(version), 0) FROM {p}schema_migrations

-- name: record_version
INSERT INTO {p}schema_migrations (version) VALUES ($1)

-- name: drop_all
DROP TABLE IF EXISTS {p}jobs, {p}unique_keys, {p}segments, {p}leader, {p}queues, {p}schedules, {p}processes, {p}schema_migrations

-- name: server_info
SELECT current_setting('server_version'),
       current_setting('synchronous_commit'),
       current_setting('fsync'),
       current_setting('full_page_writes'),
       current_setting('wal_level'),
       current_setting('wal_sync_method'),
       current_setting('commit_delay'),
       current_setting('max_connections'),
       current_setting('shared_buffers')

-- name: bulk_now
SELECT now()

-- name: notify_queues
SELECT pg_notify('{p}wake', q) FROM unnest($1::text[]) AS q

-- name: try_lead
INSERT INTO {p}leader AS l (name, leader_id, expires_at)
VALUES ('maintenance', $1, now() + $2::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE
SET leader_id = EXCLUDED.leader_id, expires_at = EXCLUDED.expires_at
WHERE l.leader_id = EXCLUDED.leader_id OR l.expires_at < now()
RETURNING l.leader_id

-- name: listen
LISTEN {p}wake

-- name: pause_queue
-- $1 queue, $2 true to pause or false to resume. Pausing keeps the first
-- pause's time; resuming wakes the queue's fetchers in every process.
WITH up AS (
    INSERT INTO {p}queues (name, paused_at, updated_at)
    VALUES ($1, CASE WHEN $2::boolean THEN now() END, now())
    ON CONFLICT (name) DO UPDATE
       SET paused_at = CASE WHEN $2::boolean
                            THEN coalesce({p}queues.paused_at, excluded.paused_at) END,
           updated_at = excluded.updated_at
    RETURNING name
)
SELECT pg_notify('{p}wake', name) FROM up WHERE NOT $2::boolean

-- name: paused_queues
SELECT name, paused_at FROM {p}queues WHERE paused_at IS NOT NULL

-- name: record_schedule
-- $1 name, $2 spec, $3 last slot, $4 last job, $5 next slot. The slots
-- only move forward (SET reads the stored row's values).
INSERT INTO {p}schedules AS s (name, spec, last_slot, last_job, next_slot, updated_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (name) DO UPDATE
   SET spec = excluded.spec,
       last_job = CASE WHEN s.last_slot IS NULL OR excluded.last_slot >= s.last_slot
                       THEN excluded.last_job ELSE s.last_job END,
       next_slot = CASE WHEN s.last_slot IS NULL OR excluded.last_slot >= s.last_slot
                        THEN excluded.next_slot ELSE s.next_slot END,
       last_slot = greatest(s.last_slot, excluded.last_slot),
       updated_at = excluded.updated_at

-- name: schedules
SELECT name, spec, last_slot, last_job, next_slot, updated_at FROM {p}schedules ORDER BY name

-- name: register_process
-- $1 id, $2 kind, $3 host, $4 pid (NULL when unknown), $5 version,
-- $6 queues (JSON), $7 ttl in microseconds. started_at is kept while the
-- row is alive; a row that had expired starts anew.
INSERT INTO {p}processes AS p (id, kind, host, pid, version, queues, started_at, heartbeat_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, now(), now(), now() + $7::bigint * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE
   SET kind = excluded.kind, host = excluded.host, pid = excluded.pid,
       version = excluded.version, queues = excluded.queues,
       started_at = CASE WHEN p.expires_at < now() THEN excluded.started_at ELSE p.started_at END,
       heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at

-- name: remove_process
DELETE FROM {p}processes WHERE id = $1

-- name: processes
-- Alive first, then by kind and id; alive by the database's clock.
SELECT id, kind, host, pid, version, queues::text, started_at, heartbeat_at, expires_at, expires_at > now() AS alive
  FROM {p}processes
 ORDER BY alive DESC, kind, id

-- name: prune_processes
-- $1 age in microseconds.
DELETE FROM {p}processes WHERE expires_at < now() - $1::bigint * interval '1 microsecond'

-- name: backend_pid
-- The server process of the connection: probePooler compares it across
-- two client connections to find a transaction pooler.
SELECT pg_backend_pid()

-- name: probe_begin
-- probePooler's transaction on its second connection (refused by a
-- pooler in statement mode).
BEGIN

-- name: probe_rollback
ROLLBACK

-- name: session_plan_mode
-- Generic plans for a connection through a pooler in session mode, which
-- refuses plan_cache_mode as a startup parameter (see planGeneric).
SET plan_cache_mode = force_generic_plan
