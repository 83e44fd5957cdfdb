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
DROP TABLE IF EXISTS {p}jobs, {p}unique_keys, {p}job_results, {p}batches, {p}batch_jobs, {p}batch_deps, {p}segments, {p}leader, {p}queues, {p}limit_slots, {p}key_slots, {p}schedules, {p}processes, {p}schema_migrations

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

-- name: notify_queues_async
-- A wake-up of each queue of $1 whose earliest run-at in $2 (NULL: a job
-- due at once) has come by the database's clock, as a transaction of its own, sent after the commit of the
-- write whose jobs it announces, and committed without waiting for its
-- WAL to reach disk. PostgreSQL serializes the commits of every
-- transaction that notified, server-wide, under one lock held from
-- before the commit record is written until the commit ends (so across
-- the WAL flush of a synchronous commit): writes that notified in their
-- own transaction committed one at a time, each waiting for the flush of
-- the one before, however many connections wrote at once. This
-- transaction writes nothing but its notifications and holds that lock
-- only while its commit record is written. A crash that loses it loses
-- nothing but the wake-up: listeners reconnect and claim anyway.
WITH a AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
SELECT pg_notify('{p}wake', w.q) FROM a, unnest($1::text[], $2::timestamptz[]) AS w(q, at)
 WHERE w.at IS NULL OR w.at <= now()

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

-- name: touch_schedule
-- $1 name: a started process that has the schedule says it still does,
-- so that prune_schedules keeps the row; a schedule with no row gets
-- none (its first slot records it).
UPDATE {p}schedules SET updated_at = now() WHERE name = $1

-- name: prune_schedules
-- $1 age in microseconds: rows that no process recorded or touched for
-- that long (the database's clock).
DELETE FROM {p}schedules WHERE updated_at < now() - $1::bigint * interval '1 microsecond'

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

-- name: get_result
-- $1 job id, $2 the job's fence: a result of an earlier completion of a
-- job retried since is not its result.
SELECT result::text FROM {p}job_results WHERE job_id = $1 AND fence = $2

-- name: prune_results
-- $1 age in microseconds, $2 limit.
DELETE FROM {p}job_results
 WHERE job_id IN (SELECT job_id FROM {p}job_results
                   WHERE stored_at < now() - $1::bigint * interval '1 microsecond' LIMIT $2)

-- name: insert_batch
INSERT INTO {p}batches (callback) VALUES ($1) RETURNING id

-- name: insert_batch_jobs
INSERT INTO {p}batch_jobs (batch_id, job_id) SELECT $1, unnest($2::bigint[])

-- name: insert_batch_deps
INSERT INTO {p}batch_deps (batch_id, dep_batch_id) SELECT $1, unnest($2::bigint[])

-- name: fire_batch
-- $1 batch id, $2 callback job id: only while no callback is recorded.
UPDATE {p}batches SET callback_id = $2, fired_at = now() WHERE id = $1 AND callback_id IS NULL

-- name: prune_batches
-- $1 the batches seg_prunable_batches found, and their member and
-- dependency rows, in one statement. A fired batch whose callback has
-- finished stays so (only a retry by hand brings a job back), so the ids
-- read are deleted as read.
WITH b AS (
    DELETE FROM {p}batches WHERE id = ANY($1::bigint[])
    RETURNING id
),
bj AS (DELETE FROM {p}batch_jobs m USING b WHERE m.batch_id = b.id)
DELETE FROM {p}batch_deps d USING b WHERE d.batch_id = b.id

-- name: get_batch
-- The batch, and the batches it waits for whose callback is not
-- enqueued yet, read before its members: a batch that fires in between
-- is then listed twice (waited for, and its callback a member), never
-- left out.
SELECT id, callback, callback_id, created_at, fired_at,
       ARRAY(SELECT d.dep_batch_id FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
              WHERE d.batch_id = $1 AND p.callback_id IS NULL)
  FROM {p}batches WHERE id = $1

-- name: job_batch
-- $1 job id: the batch it is a member of and the batch whose callback it
-- is, 0 for none; one probe each of the indexes of migration 18. A
-- callback is a member of the batches that wait for its batch (a
-- workflow's later steps, which list it among their jobs): found by
-- batch_deps_dep_idx (migration 19) from the batch it closes.
SELECT coalesce(least((SELECT min(batch_id) FROM {p}batch_jobs WHERE job_id = $1),
                      (SELECT min(d.batch_id) FROM {p}batches p JOIN {p}batch_deps d ON d.dep_batch_id = p.id
                        WHERE p.callback_id = $1)), 0),
       coalesce((SELECT min(id) FROM {p}batches WHERE callback_id = $1), 0)

-- name: awaiting_dependencies
-- The callbacks of the open batches (not enqueued yet: jobs waiting for
-- their dependencies), counted by the callback's queue; the predicate is
-- batches_open_idx's, whose entries are the open batches only.
SELECT callback::json->>'Queue', count(*)
  FROM {p}batches
 WHERE callback_id IS NULL
 GROUP BY 1

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

-- name: set_queue_limits
-- $1 queue, $2 max running, $3 rate, $4 rate period in microseconds (0:
-- none), $5 the most running per key and $6 the key order (0: none, 1:
-- ordered, 2: ordered, moving on; see migration 15), $7 the most starts
-- per key in a window of $8 microseconds (0: none; see migration 16), $9
-- whether the queue is fair (see migration 17; its key weights stay).
-- Key slots, and the rate slots of keys, are made by the claims that need
-- them; the ones a change leaves unused are deleted by Rescue's sweep. Upserts the queue's limit columns only (its pause stays), makes
-- the missing slots (concurrency 0..$2-1, rate 0..$3-1), deletes the free
-- concurrency slots at or above $2 (held ones, and those leased to a
-- process in a block, stay until their attempt ends or their owner gives
-- them back: rescue deletes them once free) and the rate slots at or above $3
-- whose start has left the window of $4, or that never admitted one (all
-- of them when $3 is 0). Claims ignore the rate slots at or above $3: a
-- lowered rate counts the starts of its first $3, so that up to the old
-- rate may start in the window of the change, and the slots beyond it
-- that stay, within the window, count again if the rate is raised within
-- it (no window holds more starts than the highest rate in force during
-- it). It wakes the queue's
-- fetchers in every process. One statement: one transaction. The rows it
-- inserts and deletes are disjoint. It locks every concurrency slot at or
-- above $2, held or not, until it commits: an attempt holding one cannot
-- free it meanwhile, so a claim that read the old limits and locks such a
-- slot freed later sees the new limits in the snapshot that saw it free
-- (limit_lock), and one that locked it first makes this wait for it.
-- The free ones among them are deleted (del reads lk, which is so locked
-- first).
WITH lk AS MATERIALIZED (
    SELECT n FROM {p}limit_slots
     WHERE queue = $1 AND type = 'c' AND lkey = '' AND n >= $2::int
     ORDER BY n
     FOR UPDATE
),
up AS (
    INSERT INTO {p}queues (name, max_running, rate, rate_period_us, key_max_running, key_order,
                           key_rate, key_rate_period_us, key_fair, updated_at)
    VALUES ($1, nullif($2::int, 0), nullif($3::int, 0), CASE WHEN $3::int > 0 THEN $4::bigint END,
            nullif($5::int, 0), nullif($6::int, 0),
            nullif($7::int, 0), CASE WHEN $7::int > 0 THEN $8::bigint END, nullif($9::boolean, false), now())
    ON CONFLICT (name) DO UPDATE
       SET max_running = excluded.max_running, rate = excluded.rate,
           rate_period_us = excluded.rate_period_us, key_max_running = excluded.key_max_running,
           key_order = excluded.key_order, key_rate = excluded.key_rate,
           key_rate_period_us = excluded.key_rate_period_us, key_fair = excluded.key_fair,
           updated_at = excluded.updated_at
    RETURNING name
),
mk AS (
    INSERT INTO {p}limit_slots (queue, type, lkey, n)
    SELECT $1, 'c', '', g FROM generate_series(0, $2::int - 1) AS g
    UNION ALL
    SELECT $1, 'r', '', g FROM generate_series(0, $3::int - 1) AS g
    ON CONFLICT DO NOTHING
),
del AS (
    DELETE FROM {p}limit_slots s
     WHERE s.queue = $1 AND s.lkey = ''
       AND ((s.type = 'c' AND s.n IN (SELECT n FROM lk) AND s.job_id IS NULL AND s.owner IS NULL)
            OR (s.type = 'r' AND s.n >= $3::int
                AND ($3::int = 0 OR s.used_at IS NULL
                     OR s.used_at <= now() - $4::bigint * interval '1 microsecond')))
)
SELECT pg_notify('{p}wake', name) FROM up

-- name: queue_limits
-- Every queue with a limit.
SELECT name, coalesce(max_running, 0), coalesce(rate, 0), coalesce(rate_period_us, 0),
       coalesce(key_max_running, 0), coalesce(key_order, 0),
       coalesce(key_rate, 0), coalesce(key_rate_period_us, 0), coalesce(key_fair, false)
  FROM {p}queues
 WHERE max_running IS NOT NULL OR rate IS NOT NULL OR key_max_running IS NOT NULL OR key_rate IS NOT NULL
    OR key_fair IS NOT NULL

-- name: limit_usage
-- Every limited queue's limits, its concurrency slots held by attempts
-- or leased to processes in blocks, its starts
-- within the last period and, when they fill the rate, the microseconds
-- until the oldest of them leaves the window; by the database's clock.
-- Then the key limits, the keys with a slot held or kept, the rate per
-- key and the keys whose window is full: as many rate slots stamped
-- within the period as the rate (KeyHeld reads the ready segments:
-- seg_key_held), and whether the queue is fair.
SELECT q.name, coalesce(q.max_running, 0), coalesce(q.rate, 0), coalesce(q.rate_period_us, 0),
       (SELECT count(*) FROM {p}limit_slots c
         WHERE c.queue = q.name AND c.type = 'c' AND c.lkey = '' AND (c.job_id IS NOT NULL OR c.owner IS NOT NULL)),
       coalesce(r.started, 0),
       CASE WHEN r.started >= q.rate
            THEN greatest(0, (extract(epoch FROM r.oldest + q.rate_period_us * interval '1 microsecond' - now())
                              * 1000000)::bigint)
            ELSE 0 END,
       coalesce(q.key_max_running, 0), coalesce(q.key_order, 0),
       (SELECT count(DISTINCT k.lkey) FROM {p}key_slots k WHERE k.queue = q.name AND k.job_id IS NOT NULL),
       coalesce(q.key_rate, 0), coalesce(q.key_rate_period_us, 0),
       (SELECT count(*) FROM (
           SELECT 1 FROM {p}key_slots k
            WHERE k.queue = q.name AND k.n < 0 AND k.n >= -q.key_rate
              AND k.used_at > now() - q.key_rate_period_us * interval '1 microsecond'
            GROUP BY k.lkey HAVING count(*) >= q.key_rate) f),
       coalesce(q.key_fair, false)
  FROM {p}queues q
  LEFT JOIN LATERAL (
      SELECT count(*) AS started, min(s.used_at) AS oldest FROM {p}limit_slots s
       WHERE s.queue = q.name AND s.type = 'r' AND s.lkey = '' AND s.n < q.rate
         AND s.used_at > now() - q.rate_period_us * interval '1 microsecond'
  ) r ON true
 WHERE q.max_running IS NOT NULL OR q.rate IS NOT NULL OR q.key_max_running IS NOT NULL
    OR q.key_rate IS NOT NULL OR q.key_fair IS NOT NULL

-- name: limit_begin
-- The first statement of a limited claim's transaction, which commits
-- without waiting for the WAL flush, as seg_claim does (the slots it
-- takes are lost with the claim in a crash, never without it): $1
-- queue, $2 how many, $3 whether the claimer holds a block of the
-- queue's concurrency slots (ClaimParams.Blocked: then no concurrency
-- slot is locked, and the rate slots are sought for $2 jobs). It reads the queue's limits and pause (no row:
-- none, not paused) and, under those limits, locks slots as limit_lock
-- does, in the same round trip. The columns: the limits, the pause,
-- whether a concurrency slot at or above the limit is held (then no
-- concurrency slot is locked: see ClaimLimited), and the concurrency
-- and rate slots locked. The limits are read in the statement's
-- snapshot, before the slots are locked: limit_take checks them again
-- in a later one. The last columns: the key limits, the rate per key,
-- whether the queue is fair and its key weights ('' for none).
WITH l AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS async,
           coalesce(max_running, 0) AS mr, coalesce(rate, 0) AS rt,
           coalesce(rate_period_us, 0) AS per, paused_at IS NOT NULL AS paused,
           coalesce(key_max_running, 0) AS kmr, coalesce(key_order, 0) AS kord,
           coalesce(key_rate, 0) AS krt, coalesce(key_rate_period_us, 0) AS kper,
           coalesce(key_fair, false) AS fair, coalesce(key_weights, '') AS weights
      FROM {p}queues WHERE name = $1
),
hi AS MATERIALIZED (
    SELECT l.mr > 0 AND NOT l.paused AND NOT $3::boolean
           AND EXISTS (SELECT 1 FROM {p}limit_slots
                        WHERE queue = $1 AND type = 'c' AND lkey = '' AND n >= l.mr
                          AND (job_id IS NOT NULL OR owner IS NOT NULL)) AS held
      FROM l
),
c AS MATERIALIZED (
    SELECT n FROM {p}limit_slots
     WHERE queue = $1 AND type = 'c' AND lkey = '' AND n < (SELECT mr FROM l) AND job_id IS NULL AND owner IS NULL
       AND NOT (SELECT paused FROM l) AND NOT (SELECT held FROM hi) AND NOT $3::boolean
     ORDER BY n
     LIMIT $2
     FOR UPDATE SKIP LOCKED
),
r AS MATERIALIZED (
    SELECT n FROM {p}limit_slots
     WHERE queue = $1 AND type = 'r' AND lkey = '' AND n < (SELECT rt FROM l)
       AND (used_at IS NULL OR used_at <= now() - (SELECT per FROM l) * interval '1 microsecond')
       AND NOT (SELECT paused FROM l)
     ORDER BY n
     LIMIT CASE WHEN (SELECT mr FROM l) > 0 AND NOT $3::boolean THEN (SELECT count(*) FROM c) ELSE $2 END
     FOR UPDATE SKIP LOCKED
)
SELECT l.async, l.mr, l.rt, l.per, l.paused, (SELECT held FROM hi),
       ARRAY(SELECT n FROM c ORDER BY n), ARRAY(SELECT n FROM r ORDER BY n), l.kmr, l.kord, l.krt, l.kper,
       l.fair, l.weights
  FROM l

-- name: limit_lock
-- $1 queue, $2 max running, $3 rate, $4 how many, $5 rate period in
-- microseconds, $6 whether a concurrency slot at or above $2 may be
-- held (see ClaimLimited). The first column: such a slot is held, and
-- then (unless $6) no concurrency slot is locked. Then up to $4 free
-- concurrency slots below $2 and, of the rate slots below $3 whose last
-- start has left the window, as many as concurrency slots were locked
-- (or $4 without a concurrency limit), each locked FOR UPDATE SKIP
-- LOCKED: concurrent claimers never wait for each other and never take
-- the same slot. The second column: the queue's limits are still $2, $3
-- and $5 in the statement's snapshot. A slot is locked only if it was
-- free in that snapshot, so a claim that read the limits before a lowered
-- MaxRunning committed, and locks a slot at or above it freed since, sees
-- the change here and must not use the slots (a claim reading the new
-- limit meanwhile counts that slot as free).
WITH hi AS MATERIALIZED (
    SELECT $2::int > 0 AND EXISTS (SELECT 1 FROM {p}limit_slots
                    WHERE queue = $1 AND type = 'c' AND lkey = '' AND n >= $2::int
                      AND (job_id IS NOT NULL OR owner IS NOT NULL)) AS held
),
c AS MATERIALIZED (
    SELECT n FROM {p}limit_slots
     WHERE queue = $1 AND type = 'c' AND lkey = '' AND n < $2::int AND job_id IS NULL AND owner IS NULL
       AND ($6::boolean OR NOT (SELECT held FROM hi))
     ORDER BY n
     LIMIT $4
     FOR UPDATE SKIP LOCKED
),
r AS MATERIALIZED (
    SELECT n FROM {p}limit_slots
     WHERE queue = $1 AND type = 'r' AND lkey = '' AND n < $3::int
       AND (used_at IS NULL OR used_at <= now() - $5::bigint * interval '1 microsecond')
     ORDER BY n
     LIMIT CASE WHEN $2::int > 0 THEN (SELECT count(*) FROM c) ELSE $4 END
     FOR UPDATE SKIP LOCKED
)
SELECT (SELECT held FROM hi),
       coalesce((SELECT coalesce(max_running, 0) = $2::int AND coalesce(rate, 0) = $3::int
                        AND coalesce(rate_period_us, 0) = $5::bigint
                   FROM {p}queues WHERE name = $1), false),
       ARRAY(SELECT n FROM c ORDER BY n), ARRAY(SELECT n FROM r ORDER BY n)

-- name: limit_row_lock
-- A claim under a lowered concurrency limit, while slots at or above it
-- are still held, counts the held slots: one such claim at a time per
-- queue, on the queue's row (SKIP LOCKED: a claimer that finds it taken
-- claims nothing rather than wait).
SELECT true FROM {p}queues WHERE name = $1 FOR NO KEY UPDATE SKIP LOCKED

-- name: limit_held
-- The queue's concurrency slots held by attempts or leased in blocks, at
-- any number.
SELECT count(*) FROM {p}limit_slots
 WHERE queue = $1 AND type = 'c' AND lkey = '' AND (job_id IS NOT NULL OR owner IS NOT NULL)

-- name: limit_take
-- $1 queue; $2, $3, $4 the concurrency slots taken and the attempts
-- (job, fence) that hold them; $5 the rate slots that record a start,
-- stamped with the transaction's now(), the attempted_at of the claim;
-- $6, $7, $8 the limits the slots were locked under, $9, $10 the rate
-- per key the key's rate slots were locked under and $11, $12 the limit
-- per key and key order its key slots were (the key slots themselves are
-- stamped by key_take, in the same transaction before this: a
-- KeyMaxRunning lowered, or Ordered set, after the claim read them would
-- otherwise admit a key's jobs under the old limit). It checks that the
-- queue's limits are still those, read in this statement's snapshot,
-- taken after the slots were locked, and returns 1; if not (a lowered
-- MaxRunning committed meanwhile, and a slot at or above it freed since
-- may be among them), it fails (an integer cast of a text naming the
-- cause), so that the COMMIT sent with it does not run and the claim
-- runs again. A change committed later must lock the slots this claim
-- holds, and finds them held.
WITH c AS (
    UPDATE {p}limit_slots s SET job_id = t.id, fence = t.fence
      FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS t(n, id, fence)
     WHERE s.queue = $1 AND s.type = 'c' AND s.lkey = '' AND s.n = t.n
),
r AS (
    UPDATE {p}limit_slots s SET used_at = now()
     WHERE s.queue = $1 AND s.type = 'r' AND s.lkey = '' AND s.n = ANY ($5::int[])
)
SELECT (CASE WHEN coalesce((SELECT coalesce(max_running, 0) = $6::int AND coalesce(rate, 0) = $7::int
                                  AND coalesce(rate_period_us, 0) = $8::bigint
                                  AND coalesce(key_rate, 0) = $9::int AND coalesce(key_rate_period_us, 0) = $10::bigint
                                  AND coalesce(key_max_running, 0) = $11::int AND coalesce(key_order, 0) = $12::int
                             FROM {p}queues WHERE name = $1), false)
             THEN '1' ELSE 'conveyor: the queue''s limits changed' END)::int

-- name: limit_retry_in
-- $1 queue, $2 rate, $3 rate period in microseconds: the microseconds
-- until the oldest start recorded in the queue's rate slots leaves the
-- window (by the transaction's now(): after limit_take, it sees its
-- stamps); 0 when a slot never admitted a start: open, it was skipped
-- because another claim had it locked, and is open again once that
-- claim ends unless it took it.
SELECT CASE WHEN bool_or(used_at IS NULL) THEN 0
            ELSE coalesce((extract(epoch FROM min(used_at) + $3::bigint * interval '1 microsecond' - now()) * 1000000)::bigint, 0)
       END
  FROM {p}limit_slots
 WHERE queue = $1 AND type = 'r' AND lkey = '' AND n < $2::int

-- name: lease_limits
-- LeaseSlots' first read, in its transaction: $1 the queues, each with
-- its MaxRunning (0: none; a queue without a row has none).
SELECT q, coalesce((SELECT max_running FROM {p}queues WHERE name = q), 0)
  FROM unnest($1::text[]) AS q

-- name: lease_mine
-- The concurrency slots owner $1 holds of queues $2, locked until the
-- transaction ends (only Rescue's sweep, a lowered limit and this owner
-- write an owned slot), by queue and number.
SELECT queue, n FROM {p}limit_slots
 WHERE type = 'c' AND lkey = '' AND owner = $1 AND queue = ANY ($2::text[])
 ORDER BY queue, n
 FOR UPDATE

-- name: lease_take
-- Up to $3 free concurrency slots of queue $1 below its MaxRunning $2
-- (held by no attempt and leased to no owner), locked FOR UPDATE SKIP
-- LOCKED: owners and claims never wait for each other and never take the
-- same slot. None while a slot at or above $2 is held by an attempt or an
-- owner other than $4 (a lowered limit whose attempts have not ended:
-- $4's own are given back in this transaction).
SELECT n FROM {p}limit_slots
 WHERE queue = $1 AND type = 'c' AND lkey = '' AND n < $2::int AND job_id IS NULL AND owner IS NULL
   AND NOT EXISTS (SELECT 1 FROM {p}limit_slots
                    WHERE queue = $1 AND type = 'c' AND lkey = '' AND n >= $2::int
                      AND (job_id IS NOT NULL OR owner IS NOT NULL AND owner <> $4))
 ORDER BY n
 LIMIT $3
 FOR UPDATE SKIP LOCKED

-- name: lease_set
-- LeaseSlots' writes, sent with its COMMIT: $1 owner; the slots it keeps
-- or takes ($2 queues, $3 numbers), leased until $4 microseconds from now;
-- the slots it gives back ($5 queues, $6 numbers), which wake their
-- queues (a process held back by the limit may take them); then a check
-- that the MaxRunning of queues $7 are still $8 in this statement's
-- snapshot, taken after every slot was locked: if not (a limit changed
-- meanwhile: a slot taken may be at or above a lowered one), it fails (an
-- integer cast of a text naming the cause), so that the COMMIT sent with
-- it does not run, and LeaseSlots runs again under the new limits.
WITH k AS (
    UPDATE {p}limit_slots s SET owner = $1, owner_until = now() + $4::bigint * interval '1 microsecond'
      FROM unnest($2::text[], $3::int[]) AS t(queue, n)
     WHERE s.queue = t.queue AND s.type = 'c' AND s.lkey = '' AND s.n = t.n
),
g AS (
    UPDATE {p}limit_slots s SET owner = NULL, owner_until = NULL
      FROM unnest($5::text[], $6::int[]) AS t(queue, n)
     WHERE s.queue = t.queue AND s.type = 'c' AND s.lkey = '' AND s.n = t.n AND s.owner = $1
    RETURNING s.queue
),
w AS (SELECT pg_notify('{p}wake', q) FROM (SELECT DISTINCT queue AS q FROM g) x)
SELECT (CASE WHEN (SELECT count(*) FROM w) >= 0
              AND NOT EXISTS (SELECT 1 FROM unnest($7::text[], $8::int[]) AS r(q, mr)
                               WHERE coalesce((SELECT max_running FROM {p}queues WHERE name = r.q), 0) <> r.mr)
             THEN '1' ELSE 'conveyor: the queue''s limits changed' END)::int

-- name: lease_others
-- LeaseSlots' count, after its writes: for each of queues $2, the
-- concurrency slots held by attempts or leased to owners other than $1,
-- at any number (a lowered limit's included), from which Usable follows.
SELECT q, (SELECT count(*) FROM {p}limit_slots s
            WHERE s.queue = q AND s.type = 'c' AND s.lkey = ''
              AND (s.job_id IS NOT NULL OR s.owner IS NOT NULL AND s.owner <> $1))
  FROM unnest($2::text[]) AS q

-- name: key_lock
-- The keyed claim, in its transaction: the open slots of queue $1's keys
-- $2 (free ones below $3, and those kept for a job waiting for its retry
-- at any number: a lowered limit can leave one above $3, which admits
-- its job on its own row, counted against a free slot below), locked FOR
-- UPDATE SKIP LOCKED (claimers never wait for each other and never take
-- the same slot). A slot is locked only if it is open in its latest
-- version. The fourth column: the key's slots at or above $3 held or
-- kept (a lowered limit; no claim takes them again), each one slot fewer
-- for the key until it is freed (the kept ones among them that this
-- claim locked, the caller counts as it admits their jobs). Then, with a
-- rate per key ($4 starts in $5 microseconds), up to $6 open rate slots
-- of each key (n -1 .. -$4, stamped at least $5 ago), locked the same
-- way; their rows have a negative n, and 0 in the last two columns. Rate
-- slots beyond a lowered rate are ignored.
--
-- Each key's slots are read by a scan of their own (LATERAL): the slots
-- of the keys asked for only, whatever the queue's other keys hold and
-- whatever the statistics of a table whose slots are made as keys come
-- (a plan made while it was small would read every slot of the queue).
WITH c AS MATERIALIZED (
    SELECT k.lkey, x.n, x.kept,
           (SELECT count(*) FROM {p}key_slots h
             WHERE h.queue = $1 AND h.lkey = k.lkey AND h.n >= $3::int AND h.job_id IS NOT NULL) AS above
      FROM unnest($2::text[]) AS k(lkey)
     CROSS JOIN LATERAL (
        SELECT s.n, coalesce(s.job_id, 0) AS kept FROM {p}key_slots s
         WHERE s.queue = $1 AND s.lkey = k.lkey AND s.n >= 0
           AND (s.job_id IS NULL AND s.n < $3::int OR s.job_id IS NOT NULL AND s.fence IS NULL AND $3::int > 0)
         ORDER BY s.n
         FOR UPDATE OF s SKIP LOCKED
    ) x
),
r AS MATERIALIZED (
    SELECT k.lkey, x.n FROM unnest($2::text[]) AS k(lkey)
    CROSS JOIN LATERAL (
        SELECT s.n FROM {p}key_slots s
         WHERE $4::int > 0 AND s.queue = $1 AND s.lkey = k.lkey AND s.n < 0 AND s.n >= -$4::int
           AND s.used_at <= now() - $5::bigint * interval '1 microsecond'
         ORDER BY s.n DESC
         LIMIT $6
         FOR UPDATE OF s SKIP LOCKED
    ) x
)
SELECT lkey, n, kept, above FROM c
UNION ALL
SELECT lkey, n, 0, 0 FROM r
ORDER BY 1, 2

-- name: key_take
-- The key slots $2 (keys), $3 (numbers) taken by the attempts $4 (jobs),
-- $5 (fences) of queue $1, stamped with the claim's now(); and the rate
-- slots among them (a negative number; job and fence 0, left NULL),
-- stamped with it alone: the start each admitted. Each slot is found by
-- its primary key (LATERAL, LIMIT: a probe per slot, never a join that
-- reads every slot of the queue, as a plan made while the table was
-- small would) and updated by its ctid; key_lock locked it, so no other
-- transaction moves it meanwhile.
UPDATE {p}key_slots s
   SET job_id = CASE WHEN t.n >= 0 THEN t.id END, fence = CASE WHEN t.n >= 0 THEN t.fence END, used_at = now()
  FROM (SELECT t.*, x.c FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS t(lkey, n, id, fence)
         CROSS JOIN LATERAL (SELECT k.ctid AS c FROM {p}key_slots k
                              WHERE k.queue = $1 AND k.lkey = t.lkey AND k.n = t.n LIMIT 1) x) t
 WHERE s.ctid = t.c

-- name: key_rate_retry_in
-- $1 queue, $2 keys whose window held jobs back, $3 the rate per key, $4
-- its period in microseconds: the microseconds until the oldest start
-- within the window of any of them leaves it (by the transaction's now():
-- after key_take, it sees its stamps); 0 when none is within it.
SELECT coalesce((extract(epoch FROM min(used_at) + $4::bigint * interval '1 microsecond' - now()) * 1000000)::bigint, 0)
  FROM {p}key_slots
 WHERE queue = $1 AND lkey = ANY ($2::text[]) AND n < 0 AND n >= -$3::int
   AND used_at > now() - $4::bigint * interval '1 microsecond'

-- name: set_key_weights
-- $1 queue, $2 its key weights (driver.EncodeKeyWeights; NULL: none).
-- Upserts the queue's row touching key_weights alone: a row it makes has
-- no limits and no pause. Weights order claims, they admit no job: no
-- fetcher is woken.
INSERT INTO {p}queues (name, key_weights)
VALUES ($1, $2::text)
ON CONFLICT (name) DO UPDATE SET key_weights = excluded.key_weights

-- name: key_weights
-- Every queue with key weights.
SELECT name, key_weights FROM {p}queues WHERE key_weights IS NOT NULL
