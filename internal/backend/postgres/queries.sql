-- Queries of the PostgreSQL backend. Each block is headed by "-- name: X";
-- {p} is the table prefix. Durations are passed as bigint microseconds and
-- every timestamp comes from the server's clock (now(), the start of the
-- transaction). Batch columns ($n::bigint[], $n::text[], ...) arrive as
-- array literals in text-format parameters (see arrays.go) and are expanded
-- with unnest, so a batch of any size is one statement.

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

-- name: insert
-- Ids are drawn from the sequence in input order (WITH ORDINALITY) and
-- returned in that order. One pg_notify per distinct queue that received a
-- job that is available now, in the same statement and transaction.
-- $9 is the metadata; a batch without any passes an empty array, which
-- unnest pads with NULLs, so plain jobs cost nothing more.
WITH input AS MATERIALIZED (
    SELECT nextval('{p}jobs_id_seq') AS id,
           i.ord, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.timeout_ms,
           coalesce(i.run_at, now() + i.delay_us * interval '1 microsecond') AS sched, i.meta
    FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[], $8::bigint[],
                $9::jsonb[])
         WITH ORDINALITY AS i(queue, kind, args, priority, max_attempts, timeout_ms, run_at, delay_us, meta, ord)
),
ins AS (
    INSERT INTO {p}jobs (id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at, meta)
    SELECT id, queue, kind, args,
           CASE WHEN sched > now() THEN 'scheduled' ELSE 'available' END,
           priority, max_attempts, timeout_ms, sched, meta
    FROM input
),
woke AS (
    SELECT pg_notify('{p}wake', d.queue)
    FROM (SELECT DISTINCT queue FROM input WHERE sched <= now()) d
)
SELECT i.id FROM input i CROSS JOIN (SELECT count(*) FROM woke) w ORDER BY i.ord

-- name: insert_unique
-- insert, for jobs with a unique key ($10, hex) and keep bits ($11), given
-- in key order: inserted in that order (ORDER BY ord), so that concurrent
-- inserters of overlapping keys wait for each other in the same order and
-- cannot deadlock. A row whose key is held by a stored job (or one being
-- inserted by a transaction that then commits: the partial unique index
-- makes this insert wait for it) is skipped by ON CONFLICT DO NOTHING; the
-- result says which rows went in. Only inserted rows notify.
WITH input AS MATERIALIZED (
    SELECT nextval('{p}jobs_id_seq') AS id,
           i.ord, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.timeout_ms,
           coalesce(i.run_at, now() + i.delay_us * interval '1 microsecond') AS sched,
           i.meta, decode(i.ukey, 'hex') AS ukey, i.keep
    FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[], $8::bigint[],
                $9::jsonb[], $10::text[], $11::int[])
         WITH ORDINALITY AS i(queue, kind, args, priority, max_attempts, timeout_ms, run_at, delay_us, meta, ukey, keep, ord)
),
ins AS (
    INSERT INTO {p}jobs (id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at,
                         unique_key, unique_keep, meta)
    SELECT id, queue, kind, args,
           CASE WHEN sched > now() THEN 'scheduled' ELSE 'available' END,
           priority, max_attempts, timeout_ms, sched, ukey, keep, meta
    FROM input
    ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at <= now() AS due
),
woke AS (
    SELECT pg_notify('{p}wake', d.queue)
    FROM (SELECT DISTINCT queue FROM ins WHERE due) d
)
SELECT i.id, ins.id IS NOT NULL
FROM input i LEFT JOIN ins ON ins.id = i.id CROSS JOIN (SELECT count(*) FROM woke) w
ORDER BY i.ord

-- name: unique_holders
-- $1 unique keys (hex): the jobs holding them (the predicate is the
-- index's).
SELECT encode(unique_key, 'hex'), id FROM {p}jobs
 WHERE unique_key = ANY (ARRAY(SELECT decode(k, 'hex') FROM unnest($1::text[]) AS k))
   AND unique_key IS NOT NULL
   AND (state IN ('available', 'scheduled', 'running', 'retryable')
        OR (state = 'completed' AND (unique_keep & 1) <> 0)
        OR (state = 'discarded' AND (unique_keep & 2) <> 0)
        OR (state = 'cancelled' AND (unique_keep & 4) <> 0))

-- name: job_unique_key
SELECT unique_key FROM {p}jobs WHERE id = $1

-- name: bulk_now
SELECT now()

-- name: notify_queues
SELECT pg_notify('{p}wake', q) FROM unnest($1::text[]) AS q

-- name: claim
-- SKIP LOCKED: claimers never wait for each other and never deadlock;
-- concurrent claimers lock disjoint rows.
--
-- The claim commits without waiting for its WAL to reach disk (async:
-- synchronous_commit off for this statement's transaction only), which
-- takes an fsync off every pick-up. A crash of the server may then lose a
-- claim whose worker already runs the job; the job is claimed again, as
-- after any crash, and the fence makes that safe: it is the database
-- clock in microseconds (or one more than the last fence, if that is
-- larger), so the new claim's fence differs from the lost one's even
-- though the lost one never reached the table, and the first worker's
-- acknowledgements are refused. Every acknowledgement (complete,
-- heartbeat, release) commits synchronously, and its flush carries any
-- earlier claim of its job with it.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
picked AS (
    SELECT id
    FROM {p}jobs
    WHERE state = 'available' AND queue = $1
      AND NOT EXISTS (SELECT 1 FROM {p}queues
                       WHERE name = $1 AND paused_at IS NOT NULL)
    ORDER BY priority, scheduled_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {p}jobs j
SET state = 'running',
    attempt = j.attempt + 1,
    fence = greatest(j.fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
    attempted_at = now(),
    lease_expires_at = now() + $3::bigint * interval '1 microsecond',
    attempted_by = $4
FROM picked, async
WHERE j.id = picked.id
RETURNING j.id, j.kind, j.args, j.priority, j.attempt, j.max_attempts, j.timeout_ms,
          j.scheduled_at, j.created_at, j.attempted_at, j.lease_expires_at, j.errors, j.fence, j.meta

-- name: claim_job
-- One job by id, as claim claims it (with the same fence; this one
-- commits synchronously), whatever its queue or schedule, if it is
-- neither running nor finished. A row a claim has locked is waited for
-- and then re-checked: once that claim commits it is running, and nothing
-- changes here.
UPDATE {p}jobs
SET state = 'running',
    attempt = attempt + 1,
    fence = greatest(fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
    attempted_at = now(),
    lease_expires_at = now() + $2::bigint * interval '1 microsecond',
    attempted_by = $3
WHERE id = $1 AND state IN ('available', 'scheduled', 'retryable')
RETURNING id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
          scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
          attempted_by, errors, fence, meta

-- name: complete
-- One statement for the whole batch, fenced by the claim's fence token and
-- state. err is '' or one AttemptError as JSON. A snooze (state
-- scheduled) gives the attempt back and runs again after retry_us.
UPDATE {p}jobs j
SET state = o.state,
    scheduled_at = CASE WHEN o.state IN ('retryable', 'scheduled')
                        THEN now() + o.retry_us * interval '1 microsecond'
                        ELSE j.scheduled_at END,
    finalized_at = CASE WHEN o.state IN ('retryable', 'scheduled') THEN NULL ELSE now() END,
    attempt = CASE WHEN o.state = 'scheduled' THEN j.attempt - 1 ELSE j.attempt END,
    lease_expires_at = NULL,
    errors = CASE WHEN o.err = '' THEN j.errors
                  ELSE j.errors || jsonb_build_array(o.err::jsonb) END
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])
     AS o(id, fence, state, retry_us, err)
WHERE j.id = o.id AND j.fence = o.fence AND j.state = 'running'
RETURNING j.id

-- name: heartbeat
-- The lease runs from the statement's own clock (clock_timestamp), not the
-- start of its transaction, so time spent waiting for a row lock does not
-- shorten it.
UPDATE {p}jobs j
SET lease_expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
FROM unnest($1::bigint[], $2::bigint[]) AS l(id, fence)
WHERE j.id = l.id AND j.fence = l.fence AND j.state = 'running'
RETURNING j.id

-- name: release
-- Returns the number released per queue and wakes those queues. The
-- attempt is given back; the fence is not.
WITH u AS (
    UPDATE {p}jobs j
    SET state = 'available',
        attempt = j.attempt - 1,
        lease_expires_at = NULL,
        attempted_by = NULL
    FROM unnest($1::bigint[], $2::bigint[]) AS l(id, fence)
    WHERE j.id = l.id AND j.fence = l.fence AND j.state = 'running'
    RETURNING j.queue
),
q AS (SELECT queue, count(*) AS n FROM u GROUP BY queue),
woke AS (SELECT pg_notify('{p}wake', queue) FROM q)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w

-- name: rescue
-- FOR UPDATE re-reads each candidate's latest committed version and
-- re-checks the WHERE clause on it, and SKIP LOCKED passes over rows a
-- heartbeat is renewing right now: a lease renewed by a transaction that
-- committed after this statement's snapshot is not rescued.
WITH picked AS (
    SELECT id
    FROM {p}jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
u AS (
    UPDATE {p}jobs j
    SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'discarded' ELSE 'available' END,
        finalized_at = CASE WHEN j.attempt >= j.max_attempts THEN now() ELSE NULL END,
        lease_expires_at = NULL,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt,
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'error', 'lease expired: ' || coalesce(j.attempted_by, '') || ' stopped heartbeating'))
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.queue, j.state
),
q AS (
    SELECT queue, count(*) AS n, bool_or(state = 'available') AS wake
    FROM u GROUP BY queue
),
woke AS (SELECT pg_notify('{p}wake', queue) FROM q WHERE wake)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w

-- name: promote
WITH picked AS (
    SELECT id
    FROM {p}jobs
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
u AS (
    UPDATE {p}jobs j
    SET state = 'available'
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.queue
),
q AS (SELECT queue, count(*) AS n FROM u GROUP BY queue),
woke AS (SELECT pg_notify('{p}wake', queue) FROM q)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w

-- name: prune
-- $1/$2: completed/discarded ages in microseconds, negative = keep;
-- $3: the smaller non-negative age (index range); $4: limit.
WITH d AS (
    SELECT id
    FROM {p}jobs
    WHERE finalized_at IS NOT NULL
      AND finalized_at < now() - $3::bigint * interval '1 microsecond'
      AND ((state = 'completed' AND $1::bigint >= 0
            AND finalized_at < now() - $1::bigint * interval '1 microsecond')
        OR (state IN ('discarded', 'cancelled') AND $2::bigint >= 0
            AND finalized_at < now() - $2::bigint * interval '1 microsecond'))
    ORDER BY finalized_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {p}jobs j USING d WHERE j.id = d.id

-- name: try_lead
INSERT INTO {p}leader AS l (name, leader_id, expires_at)
VALUES ('maintenance', $1, now() + $2::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE
SET leader_id = EXCLUDED.leader_id, expires_at = EXCLUDED.expires_at
WHERE l.leader_id = EXCLUDED.leader_id OR l.expires_at < now()
RETURNING l.leader_id

-- name: listen
LISTEN {p}wake

-- name: get_job
SELECT id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
       scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
       attempted_by, errors, fence, meta
FROM {p}jobs
WHERE id = $1

-- name: list_jobs
-- $1 after id, $2 limit; the WHERE gets the filters below that apply, each
-- numbered from $3 on. A filter is a plain predicate (no "$n = '' OR"):
-- with one the planner walks the matching list index of migration 8 in
-- id order, and a cached generic plan cannot lose it.
SELECT id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
       scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
       attempted_by, errors, fence, meta
FROM {p}jobs
WHERE id > $1{where}
ORDER BY id
LIMIT $2

-- name: list_jobs_desc
-- list_jobs newest first: the same index walked backwards.
SELECT id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
       scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
       attempted_by, errors, fence, meta
FROM {p}jobs
WHERE id > $1{where}
ORDER BY id DESC
LIMIT $2

-- name: list_jobs_before
 AND id < ${n}

-- name: list_jobs_state
 AND state = ${n}

-- name: list_jobs_states
 AND state = ANY(${n}::text[])

-- name: list_jobs_queue
 AND queue = ${n}

-- name: list_jobs_kind
 AND kind = ${n}

-- name: retry
-- Also wakes the job's queue.
WITH u AS (
    UPDATE {p}jobs
    SET state = 'available',
        scheduled_at = now(),
        finalized_at = NULL,
        lease_expires_at = NULL,
        max_attempts = greatest(max_attempts, attempt + 1)
    WHERE id = $1 AND state IN ('discarded', 'cancelled', 'retryable', 'scheduled', 'completed')
    RETURNING id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
              scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
              attempted_by, errors, fence, meta
),
woke AS (SELECT pg_notify('{p}wake', queue) FROM u)
SELECT u.* FROM u CROSS JOIN (SELECT count(*) FROM woke) w

-- name: finish
-- Cancel or discard a job that has not finished ($2 is the new state).
-- When the job was running, every process is told ('!cancel' on the wake
-- channel, which no queue name can be): each renews its leases at once,
-- and the one running the job finds it gone and stops its handler. (The
-- EXISTS reads the row as it was before this statement's update.)
WITH u AS (
    UPDATE {p}jobs
    SET state = $2::text,
        finalized_at = now(),
        lease_expires_at = NULL
    WHERE id = $1 AND state IN ('available', 'scheduled', 'retryable', 'running')
    RETURNING id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
              scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
              attempted_by, errors, fence, meta
),
woke AS (
    SELECT pg_notify('{p}wake', '!cancel') FROM u
    WHERE EXISTS (SELECT 1 FROM {p}jobs o WHERE o.id = $1 AND o.state = 'running')
)
SELECT u.* FROM u CROSS JOIN (SELECT count(*) FROM woke) w

-- name: stats
-- Per queue and state: the count and, for available, the age in
-- microseconds of the oldest scheduled_at.
SELECT queue, state, count(*),
       CASE WHEN state = 'available'
            THEN greatest(0, (extract(epoch FROM now() - min(scheduled_at)) * 1000000)::bigint)
            ELSE 0 END
FROM {p}jobs
GROUP BY queue, state
ORDER BY queue, state

-- name: overview
-- $1 finishedSince. Stats at a bounded cost: each arm's WHERE is exactly
-- one partial index's predicate (jobs_claim_idx, jobs_due_idx,
-- jobs_lease_idx, jobs_finalized_idx), so each reads only its own states'
-- index entries; the finished states count only the jobs finalized at or
-- after $1. Columns: queue, state, count, and for available the age in
-- microseconds of the oldest scheduled_at (plan_test.go checks the plan).
SELECT queue, 'available', count(*),
       greatest(0, (extract(epoch FROM now() - min(scheduled_at)) * 1000000)::bigint)
  FROM {p}jobs WHERE state = 'available' GROUP BY queue
UNION ALL
SELECT queue, state, count(*), 0
  FROM {p}jobs WHERE state IN ('scheduled', 'retryable') GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*), 0
  FROM {p}jobs WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT queue, state, count(*), 0
  FROM {p}jobs WHERE finalized_at IS NOT NULL AND finalized_at >= $1
                 AND state IN ('completed', 'discarded', 'cancelled')
 GROUP BY queue, state

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
