-- Queries of the SQLite backend.
--
-- Tokens, replaced when the driver loads this file:
--   {p}    the table prefix;
--   {now}  the "now" block below: the database's clock in unix
--          microseconds. SQLite evaluates 'now' once per sqlite3_step, so
--          every use within one statement sees the same instant (its
--          resolution is one millisecond);
--   {cols} the "job_columns" block: the column order scanJob expects;
--   {in_use} the "slots_in_use" block: how many of a queue's concurrency
--          slots are in use, for a statement that reads the queue's
--          queues row as q.
--
-- Batches travel as ONE JSON text parameter read with json_each, so a batch
-- of any size is one statement with a fixed text (no variable limit, one
-- cached plan).

-- name: now
CAST(ROUND(unixepoch('subsec') * 1000000) AS INTEGER)

-- name: job_columns
id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at,
attempted_by, errors, fence, meta, coalesce(lkey, '')

-- name: insert
-- ?1: [[queue, kind, args as a JSON string, priority, max_attempts,
--       timeout_ms, run_at_us or null, delay_us, meta as a JSON string or
--       null, limit key or null], ...]; the trailing nulls may be left out.
-- Ids are assigned explicitly as base + key + 1, where base is the largest
-- id ever used (AUTOINCREMENT's sqlite_sequence, or max(id)): within this
-- statement, run under the write lock, the id is a strictly increasing
-- function of the input position, so sorting the returned ids restores the
-- input order whatever order RETURNING or the insertion loop use (so no
-- ORDER BY is needed).
INSERT INTO {p}jobs (id, queue, kind, args, state, priority, max_attempts,
                     timeout_ms, scheduled_at, created_at, meta, lkey)
SELECT b.base + r.k + 1, r.queue, r.kind, r.args,
       CASE WHEN coalesce(r.run_at, n.now + r.delay) > n.now
            THEN 'scheduled' ELSE 'available' END,
       r.priority, r.max_attempts, r.timeout_ms,
       coalesce(r.run_at, n.now + r.delay), n.now, r.meta, r.lkey
FROM (SELECT {now} AS now) AS n,
     (SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = '{p}jobs'), 0),
                 coalesce((SELECT max(id) FROM {p}jobs), 0)) AS base) AS b,
     (SELECT key AS k,
             value ->> 0 AS queue, value ->> 1 AS kind, value ->> 2 AS args,
             value ->> 3 AS priority, value ->> 4 AS max_attempts,
             value ->> 5 AS timeout_ms, value ->> 6 AS run_at,
             value ->> 7 AS delay, value ->> 8 AS meta,
             value ->> 9 AS lkey
        FROM json_each(?1)) AS r
RETURNING id

-- name: insert_claim
-- insert, claiming the jobs ?2 flags as they are written
-- (driver.InsertClaimer). ?1: as for insert; ?2: one character per row of
-- ?1, '1' for a job to claim; ?3 the lease in microseconds; ?4 the worker.
-- A flagged job that is due now (by this statement's clock, as insert
-- tells available from scheduled) and whose queue is not paused is
-- written running, as claim would have left it: attempt 1, fence 1
-- (claim's fence + 1 from the column's default), attempted_at now,
-- leased to ?4 until now + ?3. Every other job is written as insert
-- writes it (attempt and fence at their defaults, 0). Ids are assigned
-- as insert assigns them, so sorting the returned rows by id restores
-- the input order. Returns each job's id, claim time (NULL: not
-- claimed), lease, fence, schedule and creation time.
INSERT INTO {p}jobs (id, queue, kind, args, state, priority, attempt, max_attempts,
                     timeout_ms, scheduled_at, created_at, attempted_at,
                     lease_expires_at, attempted_by, fence, meta, lkey)
SELECT c.id, c.queue, c.kind, c.args,
       CASE WHEN c.take THEN 'running'
            WHEN c.sched > c.now THEN 'scheduled' ELSE 'available' END,
       c.priority, c.take, c.max_attempts, c.timeout_ms, c.sched, c.now,
       CASE WHEN c.take THEN c.now END,
       CASE WHEN c.take THEN c.now + ?3 END,
       CASE WHEN c.take THEN ?4 END,
       c.take, c.meta, c.lkey
FROM (SELECT b.base + r.k + 1 AS id, r.queue, r.kind, r.args, r.priority,
             r.max_attempts, r.timeout_ms, n.now,
             coalesce(r.run_at, n.now + r.delay) AS sched, r.meta, r.lkey,
             substr(?2, r.k + 1, 1) = '1'
               AND coalesce(r.run_at, n.now + r.delay) <= n.now
               AND q.name IS NULL AS take
        FROM (SELECT {now} AS now) AS n,
             (SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = '{p}jobs'), 0),
                         coalesce((SELECT max(id) FROM {p}jobs), 0)) AS base) AS b,
             (SELECT key AS k,
                     value ->> 0 AS queue, value ->> 1 AS kind, value ->> 2 AS args,
                     value ->> 3 AS priority, value ->> 4 AS max_attempts,
                     value ->> 5 AS timeout_ms, value ->> 6 AS run_at,
                     value ->> 7 AS delay, value ->> 8 AS meta,
                     value ->> 9 AS lkey
                FROM json_each(?1)) AS r
             LEFT JOIN {p}queues AS q
                    ON q.name = r.queue AND q.paused_at IS NOT NULL) AS c
RETURNING id, attempted_at, lease_expires_at, fence, scheduled_at, created_at

-- name: bulk_insert
-- ?1: as for insert; ids are not needed, so SQLite assigns them.
INSERT INTO {p}jobs (queue, kind, args, state, priority, max_attempts,
                     timeout_ms, scheduled_at, created_at, meta, lkey)
SELECT r.queue, r.kind, r.args,
       CASE WHEN coalesce(r.run_at, n.now + r.delay) > n.now
            THEN 'scheduled' ELSE 'available' END,
       r.priority, r.max_attempts, r.timeout_ms,
       coalesce(r.run_at, n.now + r.delay), n.now, r.meta, r.lkey
FROM (SELECT {now} AS now) AS n,
     (SELECT key AS k,
             value ->> 0 AS queue, value ->> 1 AS kind, value ->> 2 AS args,
             value ->> 3 AS priority, value ->> 4 AS max_attempts,
             value ->> 5 AS timeout_ms, value ->> 6 AS run_at,
             value ->> 7 AS delay, value ->> 8 AS meta,
             value ->> 9 AS lkey
        FROM json_each(?1)) AS r
ORDER BY r.k

-- name: insert_unique
-- ?1: one row as for insert, ?2 its unique key, ?3 its keep bits. Nothing
-- is inserted, and no row returned, when a job holding the key exists
-- (the partial unique index jobs_unique). "WHERE true" tells SQLite's
-- parser that ON CONFLICT belongs to the INSERT, not to a join.
INSERT INTO {p}jobs (queue, kind, args, state, priority, max_attempts,
                     timeout_ms, scheduled_at, created_at, unique_key, unique_keep, meta, lkey)
SELECT r.queue, r.kind, r.args,
       CASE WHEN coalesce(r.run_at, n.now + r.delay) > n.now
            THEN 'scheduled' ELSE 'available' END,
       r.priority, r.max_attempts, r.timeout_ms,
       coalesce(r.run_at, n.now + r.delay), n.now, ?2, ?3, r.meta, r.lkey
FROM (SELECT {now} AS now) AS n,
     (SELECT value ->> 0 AS queue, value ->> 1 AS kind, value ->> 2 AS args,
             value ->> 3 AS priority, value ->> 4 AS max_attempts,
             value ->> 5 AS timeout_ms, value ->> 6 AS run_at,
             value ->> 7 AS delay, value ->> 8 AS meta,
             value ->> 9 AS lkey
        FROM json_each(?1)) AS r
WHERE true
ON CONFLICT DO NOTHING
RETURNING id

-- name: unique_holder
-- ?1 a unique key: the job holding it (the predicate is the index's).
SELECT id FROM {p}jobs
 WHERE unique_key = ?1
   AND (state IN ('available', 'scheduled', 'running', 'retryable')
        OR (state = 'completed' AND (unique_keep & 1) <> 0)
        OR (state = 'discarded' AND (unique_keep & 2) <> 0)
        OR (state = 'cancelled' AND (unique_keep & 4) <> 0))

-- name: claim
-- ?1 queue, ?2 limit, ?3 lease in microseconds, ?4 worker.
-- Run inside BEGIN IMMEDIATE: the write lock is taken before the read, so
-- claimers (in this process or others) queue on the lock instead of
-- deadlocking on a read-to-write upgrade. The subquery walks the partial
-- index jobs_claim in claim order and stops after ?2 rows. The statement
-- is prepared once (stmts.go); "?2 + 0" keeps it so: SQLite reads a bare
-- bound LIMIT while planning and then recompiles the statement whenever
-- that parameter is bound again, which was every claim.
UPDATE {p}jobs
   SET state = 'running',
       attempt = attempt + 1,
       fence = fence + 1,
       attempted_at = {now},
       lease_expires_at = {now} + ?3,
       attempted_by = ?4
 WHERE id IN (SELECT id FROM {p}jobs
               WHERE state = 'available' AND queue = ?1
                AND NOT EXISTS (SELECT 1 FROM {p}queues
                                 WHERE name = ?1 AND paused_at IS NOT NULL)
               ORDER BY priority, scheduled_at, id
               LIMIT ?2 + 0)
RETURNING {cols}

-- name: claim_job
-- ?1 id, ?2 lease in microseconds, ?3 worker. One job by id, as claim
-- claims it, whatever its queue or schedule, if it is neither running nor
-- finished. Run inside BEGIN IMMEDIATE, like claim.
UPDATE {p}jobs
   SET state = 'running',
       attempt = attempt + 1,
       fence = fence + 1,
       attempted_at = {now},
       lease_expires_at = {now} + ?2,
       attempted_by = ?3
 WHERE id = ?1 AND state IN ('available', 'scheduled', 'retryable')
RETURNING {cols}

-- name: complete
-- ?1: [[id, fence, new_state, retry_in_us, error object or null], ...]
-- Fenced: applies only where the job still runs under that claim. Returns
-- each applied job's id, and for a job with a limit key its key and
-- queue (NULL otherwise), whose key slot the caller then frees.
UPDATE {p}jobs
   SET state = o.new_state,
       scheduled_at = CASE WHEN o.new_state IN ('retryable', 'scheduled')
                           THEN n.now + o.retry_in ELSE scheduled_at END,
       finalized_at = CASE WHEN o.new_state IN ('retryable', 'scheduled')
                           THEN NULL ELSE n.now END,
       attempt = CASE WHEN o.new_state = 'scheduled'
                      THEN attempt - 1 ELSE attempt END,
       lease_expires_at = NULL,
       errors = CASE WHEN o.err IS NULL THEN errors
                     ELSE json_insert(errors, '$[#]', json(o.err)) END
  FROM (SELECT {now} AS now) AS n,
       (SELECT value ->> 0 AS oid, value ->> 1 AS ofence,
               value ->> 2 AS new_state, value ->> 3 AS retry_in,
               value ->> 4 AS err
          FROM json_each(?1)) AS o
 WHERE id = o.oid AND fence = o.ofence AND state = 'running'
RETURNING id, lkey, CASE WHEN lkey IS NOT NULL THEN queue END

-- name: store_results
-- ?1: [[id, fence, result], ...] of outcomes the complete statement
-- just applied, in its transaction.
INSERT OR REPLACE INTO {p}job_results (job_id, fence, result, stored_at)
SELECT value ->> 0, value ->> 1, json(value -> 2), {now} FROM json_each(?1)

-- name: get_result
-- ?1 job id, ?2 the job's fence: a result of an earlier completion of a
-- job retried since is not its result.
SELECT result FROM {p}job_results WHERE job_id = ?1 AND fence = ?2

-- name: prune_results
-- ?1 age (microseconds), ?2 limit.
DELETE FROM {p}job_results
 WHERE job_id IN (SELECT job_id FROM {p}job_results WHERE stored_at < {now} - ?1 LIMIT ?2)

-- name: drop_results
DROP TABLE IF EXISTS {p}job_results

-- name: insert_batch
-- ?1 the callback (encoded InsertParams).
INSERT INTO {p}batches (callback, created_at) VALUES (?1, {now}) RETURNING id

-- name: insert_batch_jobs
-- ?1 batch id, ?2 [job id, ...].
INSERT INTO {p}batch_jobs (batch_id, job_id) SELECT ?1, value FROM json_each(?2)

-- name: ready_batches
-- Batches without a callback yet whose every member has finished (a
-- member Prune deleted has finished), oldest first, ?1 at most, with ids
-- past ?2. Reads each open batch's members up to its first unfinished
-- one.
SELECT b.id, b.callback FROM {p}batches b INDEXED BY {p}batches_open
 WHERE b.callback_id IS NULL AND b.id > ?2
   AND NOT EXISTS (SELECT 1 FROM {p}batch_jobs m JOIN {p}jobs j ON j.id = m.job_id
                    WHERE m.batch_id = b.id AND j.state NOT IN ('completed', 'discarded', 'cancelled'))
   AND NOT EXISTS (SELECT 1 FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
                     LEFT JOIN {p}jobs j ON j.id = p.callback_id
                    WHERE d.batch_id = b.id
                      AND (p.callback_id IS NULL OR j.state NOT IN ('completed', 'discarded', 'cancelled')))
 ORDER BY b.id LIMIT ?1

-- name: insert_batch_deps
-- ?1 batch id, ?2 [batch id, ...] it waits for.
INSERT INTO {p}batch_deps (batch_id, dep_batch_id) SELECT ?1, value FROM json_each(?2)

-- name: batch_ready
-- Batch ?1 as ready_batches reads it: a row while it has no callback yet
-- and every member, and the callback of every batch it waits for, has
-- finished. Read again in the write transaction that fires the batch:
-- a member retried by hand since ready_batches read it is seen there.
SELECT 1 FROM {p}batches b
 WHERE b.id = ?1 AND b.callback_id IS NULL
   AND NOT EXISTS (SELECT 1 FROM {p}batch_jobs m JOIN {p}jobs j ON j.id = m.job_id
                    WHERE m.batch_id = b.id AND j.state NOT IN ('completed', 'discarded', 'cancelled'))
   AND NOT EXISTS (SELECT 1 FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
                     LEFT JOIN {p}jobs j ON j.id = p.callback_id
                    WHERE d.batch_id = b.id
                      AND (p.callback_id IS NULL OR j.state NOT IN ('completed', 'discarded', 'cancelled')))

-- name: fire_batch
-- ?1 batch id, ?2 callback job id: only while no callback is recorded.
UPDATE {p}batches SET callback_id = ?2, fired_at = {now} WHERE id = ?1 AND callback_id IS NULL

-- name: get_batch
-- The batch, and the batches it waits for whose callback is not
-- enqueued yet (a JSON array of their ids), read before its members: a
-- batch that fires in between is then listed twice (waited for, and its
-- callback a member), never left out.
SELECT id, callback, callback_id, created_at, fired_at,
       (SELECT json_group_array(d.dep_batch_id) FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
         WHERE d.batch_id = ?1 AND p.callback_id IS NULL)
  FROM {p}batches WHERE id = ?1

-- name: job_batch
-- ?1 job id: the batch it is a member of and the batch whose callback it
-- is, 0 for none; one probe each of the indexes of migration 15. A
-- callback is a member of the batches that wait for its batch (a
-- workflow's later steps, which list it among their jobs): found by
-- batch_deps_dep (migration 17) from the batch it closes.
SELECT coalesce((SELECT min(b) FROM (SELECT min(batch_id) AS b FROM {p}batch_jobs WHERE job_id = ?1
                                       UNION ALL
                                       SELECT min(d.batch_id) FROM {p}batches p JOIN {p}batch_deps d ON d.dep_batch_id = p.id
                                        WHERE p.callback_id = ?1)), 0),
       coalesce((SELECT min(id) FROM {p}batches WHERE callback_id = ?1), 0)

-- name: batch_members
-- A member's result is its result only under the job's current fence.
SELECT m.job_id, coalesce(j.state, ''), r.result
  FROM (SELECT job_id FROM {p}batch_jobs WHERE batch_id = ?1
        UNION ALL
        SELECT p.callback_id FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
         WHERE d.batch_id = ?1 AND p.callback_id IS NOT NULL) m
  LEFT JOIN {p}jobs j ON j.id = m.job_id
  LEFT JOIN {p}job_results r ON r.job_id = m.job_id AND r.fence = j.fence AND j.state = 'completed'
 ORDER BY m.job_id

-- name: prune_batches
-- ?1 age (microseconds), ?2 limit: batches fired that long ago whose
-- callback has finished (it reads its batch when it runs; deleted by
-- retention counts as finished) and that no kept batch waits for (a
-- workflow's step is kept while the batch of a later step is: that batch
-- reads it to know whether it may fire, and lists its callback among its
-- jobs).
DELETE FROM {p}batches
 WHERE id IN (SELECT b.id FROM {p}batches AS b INDEXED BY {p}batches_fired
               WHERE b.fired_at IS NOT NULL AND b.fired_at < {now} - ?1
                 AND NOT EXISTS (SELECT 1 FROM {p}jobs j WHERE j.id = b.callback_id
                                    AND j.state NOT IN ('completed', 'discarded', 'cancelled'))
                 AND NOT EXISTS (SELECT 1 FROM {p}batch_deps d WHERE d.dep_batch_id = b.id)
               ORDER BY b.fired_at LIMIT ?2)
RETURNING id

-- name: prune_batch_jobs
-- ?1 [batch id, ...] prune_batches deleted, in its transaction.
DELETE FROM {p}batch_jobs WHERE batch_id IN (SELECT value FROM json_each(?1))

-- name: prune_batch_deps
DELETE FROM {p}batch_deps WHERE batch_id IN (SELECT value FROM json_each(?1))

-- name: drop_batches
DROP TABLE IF EXISTS {p}batches

-- name: drop_batch_jobs
DROP TABLE IF EXISTS {p}batch_jobs

-- name: drop_batch_deps
DROP TABLE IF EXISTS {p}batch_deps

-- name: heartbeat
-- ?1: [[id, fence], ...], ?2 lease in microseconds.
UPDATE {p}jobs
   SET lease_expires_at = {now} + ?2
  FROM (SELECT value ->> 0 AS lid, value ->> 1 AS lfence
          FROM json_each(?1)) AS l
 WHERE id = l.lid AND fence = l.lfence AND state = 'running'
RETURNING id

-- name: release
-- ?1: [[id, fence], ...]. The attempt is given back; the fence is not.
-- Returns as complete does.
UPDATE {p}jobs
   SET state = 'available',
       attempt = attempt - 1,
       lease_expires_at = NULL,
       attempted_by = NULL
  FROM (SELECT value ->> 0 AS lid, value ->> 1 AS lfence
          FROM json_each(?1)) AS l
 WHERE id = l.lid AND fence = l.lfence AND state = 'running'
RETURNING id, lkey, CASE WHEN lkey IS NOT NULL THEN queue END

-- name: rescue
-- ?1 limit. Running jobs whose lease expired become available again (or
-- discarded when out of attempts) with an error recording who lost them.
UPDATE {p}jobs
   SET state = CASE WHEN attempt >= max_attempts THEN 'discarded' ELSE 'available' END,
       finalized_at = CASE WHEN attempt >= max_attempts THEN n.now END,
       lease_expires_at = NULL,
       errors = json_insert(errors, '$[#]', json_object(
           'attempt', attempt,
           'at', strftime('%Y-%m-%dT%H:%M:%fZ', n.now / 1000000.0, 'unixepoch'),
           'error', 'lease expired: ' || coalesce(attempted_by, '') || ' stopped heartbeating'))
  FROM (SELECT {now} AS now) AS n
 WHERE id IN (SELECT id FROM {p}jobs
               WHERE state = 'running' AND lease_expires_at < {now}
               ORDER BY lease_expires_at
               LIMIT ?1)
RETURNING queue

-- name: promote
-- ?1 limit.
UPDATE {p}jobs
   SET state = 'available'
 WHERE id IN (SELECT id FROM {p}jobs
               WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= {now}
               ORDER BY scheduled_at
               LIMIT ?1)
RETURNING queue

-- name: prune
-- ?1 completed age, ?2 discarded/cancelled age (microseconds), ?3 limit.
-- The first finalized_at bound is a range on jobs_finalized; the second
-- applies each state's own age.
DELETE FROM {p}jobs
 WHERE id IN (SELECT id FROM {p}jobs
               WHERE state IN ('completed', 'discarded', 'cancelled')
                 AND finalized_at < {now} - min(?1, ?2)
                 AND finalized_at < {now} - CASE state WHEN 'completed' THEN ?1 ELSE ?2 END
               LIMIT ?3)

-- name: try_lead
-- ?1 leader id, ?2 ttl in microseconds. Takes the row when it is free or
-- expired, keeps it when we hold it; returns a row only on success.
INSERT INTO {p}leader (name, leader_id, expires_at)
VALUES ('maintenance', ?1, {now} + ?2)
ON CONFLICT (name) DO UPDATE
   SET leader_id = excluded.leader_id, expires_at = excluded.expires_at
 WHERE {p}leader.leader_id = excluded.leader_id OR {p}leader.expires_at < {now}
RETURNING leader_id

-- name: get_job
SELECT {cols} FROM {p}jobs WHERE id = ?1

-- name: job_state
SELECT state FROM {p}jobs WHERE id = ?1

-- name: job_unique_key
SELECT unique_key FROM {p}jobs WHERE id = ?1

-- name: list_jobs
-- ?1 after id, ?2 limit; the WHERE gets the filters below that apply, each
-- numbered from ?3 on. A filter is a plain predicate (no "?n = '' OR"),
-- so that the planner can walk the matching list index of migration 8 in
-- id order.
SELECT {cols} FROM {p}jobs
 WHERE id > ?1{where}
 ORDER BY id
 LIMIT ?2

-- name: list_jobs_desc
-- list_jobs newest first: the same index walked backwards.
SELECT {cols} FROM {p}jobs
 WHERE id > ?1{where}
 ORDER BY id DESC
 LIMIT ?2

-- name: list_jobs_before
 AND id < ?{n}

-- name: list_jobs_state
 AND state = ?{n}

-- name: list_jobs_states
 AND state IN (SELECT value FROM json_each(?{n}))

-- name: list_jobs_queue
 AND queue = ?{n}

-- name: list_jobs_kind
 AND kind = ?{n}

-- name: retry_job
UPDATE {p}jobs
   SET state = 'available',
       scheduled_at = {now},
       finalized_at = NULL,
       lease_expires_at = NULL,
       max_attempts = max(max_attempts, attempt + 1)
 WHERE id = ?1
   AND state IN ('discarded', 'cancelled', 'retryable', 'scheduled', 'completed')
RETURNING {cols}

-- name: finish_job
-- ?1 id, ?2 the new state (cancelled or discarded).
UPDATE {p}jobs
   SET state = ?2,
       finalized_at = {now},
       lease_expires_at = NULL
 WHERE id = ?1
   AND state IN ('available', 'scheduled', 'running', 'retryable')
RETURNING {cols}

-- name: stats
SELECT queue, state, count(*),
       min(CASE WHEN state = 'available' THEN scheduled_at END),
       {now}
  FROM {p}jobs
 GROUP BY queue, state
 ORDER BY queue

-- name: overview
-- ?1 finishedSince (unix microseconds). Stats at a bounded cost: each
-- arm's WHERE implies one partial index's predicate (jobs_claim,
-- jobs_due, jobs_lease, jobs_finalized), so each reads only its own
-- states' index entries (plan_test.go checks); the finished states count
-- only the jobs finalized at or after ?1. Columns as in stats. INDEXED BY
-- pins each arm: left to itself the planner serves GROUP BY queue by
-- walking the whole jobs_queue_list index (migration 8) instead.
SELECT queue, 'available', count(*), min(scheduled_at), {now}
  FROM {p}jobs INDEXED BY {p}jobs_claim WHERE state = 'available' GROUP BY queue
UNION ALL
SELECT queue, state, count(*), NULL, {now}
  FROM {p}jobs INDEXED BY {p}jobs_due WHERE state IN ('scheduled', 'retryable') GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*), NULL, {now}
  FROM {p}jobs INDEXED BY {p}jobs_lease WHERE state = 'running' GROUP BY queue
UNION ALL
SELECT queue, state, count(*), NULL, {now}
  FROM {p}jobs INDEXED BY {p}jobs_finalized WHERE state IN ('completed', 'discarded', 'cancelled') AND finalized_at >= ?1
 GROUP BY queue, state

-- name: awaiting_dependencies
-- The callbacks of the open batches (not enqueued yet: jobs waiting for
-- their dependencies), counted by the callback's queue; read through
-- batches_open, whose entries are the open batches only.
SELECT json_extract(callback, '$.Queue'), count(*)
  FROM {p}batches INDEXED BY {p}batches_open
 WHERE callback_id IS NULL
 GROUP BY 1

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {p}schema_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
)

-- name: migrations_table_exists
SELECT count(*) FROM sqlite_schema
 WHERE type = 'table' AND name = '{p}schema_migrations'

-- name: schema_version
SELECT coalesce(max(version), 0) FROM {p}schema_migrations

-- name: record_migration
INSERT INTO {p}schema_migrations (version, applied_at) VALUES (?1, {now})

-- name: drop_jobs
DROP TABLE IF EXISTS {p}jobs

-- name: drop_leader
DROP TABLE IF EXISTS {p}leader

-- name: drop_queues
DROP TABLE IF EXISTS {p}queues

-- name: drop_schedules
DROP TABLE IF EXISTS {p}schedules

-- name: drop_processes
DROP TABLE IF EXISTS {p}processes

-- name: drop_migrations
DROP TABLE IF EXISTS {p}schema_migrations

-- name: server_info
SELECT sqlite_version()

-- name: pragma_journal_mode
PRAGMA journal_mode

-- name: pragma_synchronous
PRAGMA synchronous

-- name: pragma_journal_size_limit
PRAGMA journal_size_limit

-- name: pragma_busy_timeout
PRAGMA busy_timeout

-- name: main_file
SELECT file FROM pragma_database_list WHERE name = 'main'

-- name: pause_queue
-- ?1 queue, ?2 1 to pause or 0 to resume. Pausing keeps the first
-- pause's time.
INSERT INTO {p}queues (name, paused_at, updated_at)
VALUES (?1, CASE WHEN ?2 THEN {now} END, {now})
ON CONFLICT (name) DO UPDATE
   SET paused_at = CASE WHEN ?2 THEN coalesce({p}queues.paused_at, excluded.paused_at) END,
       updated_at = excluded.updated_at

-- name: paused_queues
SELECT name, paused_at FROM {p}queues WHERE paused_at IS NOT NULL

-- name: record_schedule
-- ?1 name, ?2 spec, ?3 last slot, ?4 last job, ?5 next slot (µs or NULL).
-- The slots only move forward.
INSERT INTO {p}schedules (name, spec, last_slot, last_job, next_slot, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, {now})
ON CONFLICT (name) DO UPDATE
   SET spec = excluded.spec,
       last_job = CASE WHEN {p}schedules.last_slot IS NULL OR excluded.last_slot >= {p}schedules.last_slot
                       THEN excluded.last_job ELSE {p}schedules.last_job END,
       next_slot = CASE WHEN {p}schedules.last_slot IS NULL OR excluded.last_slot >= {p}schedules.last_slot
                        THEN excluded.next_slot ELSE {p}schedules.next_slot END,
       last_slot = max(coalesce({p}schedules.last_slot, excluded.last_slot), excluded.last_slot),
       updated_at = excluded.updated_at

-- name: schedules
SELECT name, spec, last_slot, last_job, next_slot, updated_at FROM {p}schedules ORDER BY name

-- name: touch_schedule
-- ?1 name: a started process that has the schedule says it still does,
-- so that prune_schedules keeps the row; a schedule with no row gets
-- none (its first slot records it).
UPDATE {p}schedules SET updated_at = {now} WHERE name = ?1

-- name: prune_schedules
-- ?1 age in microseconds: rows that no process recorded or touched for
-- that long.
DELETE FROM {p}schedules WHERE updated_at < {now} - ?1

-- name: register_process
-- ?1 id, ?2 kind, ?3 host, ?4 pid (NULL when unknown), ?5 version,
-- ?6 queues (JSON), ?7 ttl in microseconds. started_at is kept while the
-- row is alive; a row that had expired starts anew.
INSERT INTO {p}processes (id, kind, host, pid, version, queues, started_at, heartbeat_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, {now}, {now}, {now} + ?7)
ON CONFLICT (id) DO UPDATE
   SET kind = excluded.kind, host = excluded.host, pid = excluded.pid,
       version = excluded.version, queues = excluded.queues,
       started_at = CASE WHEN {p}processes.expires_at < excluded.heartbeat_at
                         THEN excluded.started_at ELSE {p}processes.started_at END,
       heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at

-- name: remove_process
DELETE FROM {p}processes WHERE id = ?1

-- name: processes
-- Alive first, then by kind and id; alive by the database's clock.
SELECT id, kind, host, pid, version, queues, started_at, heartbeat_at, expires_at, expires_at > n.now AS alive
  FROM {p}processes, (SELECT {now} AS now) AS n
 ORDER BY alive DESC, kind, id

-- name: prune_processes
-- ?1 age in microseconds.
DELETE FROM {p}processes WHERE expires_at < {now} - ?1

-- name: pragma_wal_autocheckpoint
PRAGMA wal_autocheckpoint

-- name: checkpoint_passive
-- Copies what it can of the WAL into the database file without waiting
-- for any lock: another connection's checkpoint in progress makes it
-- return busy = 1 at once, and a reader's snapshot or a writer's new
-- frames only stop it where they begin. Columns: busy, frames in the WAL,
-- frames copied.
PRAGMA wal_checkpoint(PASSIVE)

-- name: checkpoint_restart
-- Copies the rest of the WAL and starts it over, so that the next commit
-- writes from its beginning (and truncates the file to
-- journal_size_limit). The checkpointer's connection has no busy
-- handler: when a writer holds the write lock it does only what PASSIVE
-- does, and when a reader still uses the WAL it does not start it over;
-- it never waits.
PRAGMA wal_checkpoint(RESTART)

-- Queue limits (migration 9). A queue's rate is held by rows of
-- limit_slots, 'r' slots stamped with the starts they admitted (used_at);
-- its concurrency limit by counting its running jobs (migration 16: the
-- 'c' slots are gone) and the slots leased to processes in blocks ('b'
-- rows, migration 18). Claims of a limited queue run these inside their
-- BEGIN IMMEDIATE transaction, and so do the leases of blocks: the write
-- lock is the writer's alone, so no slot is counted twice and no job
-- starts, and no block grows, between the count and the write.

-- name: set_queue_limits
-- ?1 queue, ?2 max_running, ?3 rate, ?4 rate period in microseconds, ?5
-- key_max_running, each NULL for no limit, ?6 key_order (0 none, 1
-- ordered, 2 ordered moving on), ?7 key_rate and ?8 its period in
-- microseconds (NULL for none), ?9 key_fair (1, or NULL for none).
-- Touches only the limit columns: the pause and the key weights stay.
INSERT INTO {p}queues (name, max_running, rate, rate_period_us, key_max_running, key_order,
                       key_rate, key_rate_period_us, key_fair, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, {now})
ON CONFLICT (name) DO UPDATE
   SET max_running = excluded.max_running,
       rate = excluded.rate,
       rate_period_us = excluded.rate_period_us,
       key_max_running = excluded.key_max_running,
       key_order = excluded.key_order,
       key_rate = excluded.key_rate,
       key_rate_period_us = excluded.key_rate_period_us,
       key_fair = excluded.key_fair,
       updated_at = excluded.updated_at

-- name: add_limit_slots
-- ?1 queue, ?2 type ('r'), ?3 count: slots 0 .. ?3-1, those
-- missing (the WHERE also tells SQLite's parser that the conflict clause
-- belongs to the INSERT).
WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < ?3)
INSERT INTO {p}limit_slots (queue, type, lkey, n)
SELECT ?1, ?2, '', n FROM s WHERE n < ?3
ON CONFLICT DO NOTHING

-- name: drop_limit_slots
-- ?1 queue, ?2 rate (0 for none), ?3 its period in microseconds. Rate
-- slots at or above the rate are ignored by claims; those whose start
-- has left the window (or that never admitted one) are deleted, and
-- every one when the queue has no rate. Those within it stay, so that a
-- rate raised again within the window counts their starts: no window
-- holds more starts than the highest rate in force during it. So do
-- concurrency slots an earlier version made (migration 16 deleted those
-- there were), which nothing reads. The slots leased in blocks ('b')
-- stay, whatever the new limits: their owners give them back at their
-- next lease (all of them when the queue has no MaxRunning any more),
-- or Rescue does once they expired.
DELETE FROM {p}limit_slots
 WHERE queue = ?1 AND lkey = ''
   AND (type = 'c'
        OR (type = 'r' AND n >= ?2 AND (?2 = 0 OR used_at IS NULL OR used_at <= {now} - ?3)))

-- name: queue_limits
SELECT name, coalesce(max_running, 0), coalesce(rate, 0), coalesce(rate_period_us, 0),
       coalesce(key_max_running, 0), coalesce(key_order, 0),
       coalesce(key_rate, 0), coalesce(key_rate_period_us, 0), coalesce(key_fair, 0)
  FROM {p}queues
 WHERE max_running IS NOT NULL OR rate IS NOT NULL OR key_max_running IS NOT NULL
    OR key_rate IS NOT NULL OR key_fair > 0

-- name: limits_of
-- ?1 queue, ?2 1 for a claim under a block of the queue's slots
-- (ClaimParams.Blocked), 0 otherwise: its limits (0 for none), for a
-- concurrency limit how many of its slots are in use (slots_in_use: the
-- slots leased in blocks and the running jobs no block's owner claimed;
-- index entries and block rows only), or 0 for a claim under a block,
-- which counts nothing (CASE evaluates the count only when it is
-- needed), its key limits (key_max_running, key_order), whether it is
-- paused, its rate per key (key_rate, key_rate_period_us), whether it is
-- fair and its key weights (as stored, NULL for none).
SELECT coalesce(q.max_running, 0), coalesce(q.rate, 0), coalesce(q.rate_period_us, 0),
       CASE WHEN q.max_running > 0 AND NOT ?2 THEN {in_use} ELSE 0 END,
       coalesce(q.key_max_running, 0), coalesce(q.key_order, 0), q.paused_at IS NOT NULL,
       coalesce(q.key_rate, 0), coalesce(q.key_rate_period_us, 0),
       coalesce(q.key_fair, 0), q.key_weights
  FROM {p}queues AS q
 WHERE q.name = ?1

-- name: free_rate_slots
-- ?1 queue, ?2 rate, ?3 period in microseconds, ?4 how many: rate slots
-- whose last start has left the window (or that never admitted one).
SELECT n FROM {p}limit_slots
 WHERE queue = ?1 AND type = 'r' AND lkey = '' AND n < ?2
   AND (used_at IS NULL OR used_at <= {now} - ?3)
 ORDER BY n
 LIMIT ?4 + 0

-- name: take_rate_slot
-- ?1 queue, ?2 slot, ?3 the start's attempted_at.
UPDATE {p}limit_slots SET used_at = ?3
 WHERE queue = ?1 AND type = 'r' AND lkey = '' AND n = ?2

-- name: due_job_waits
-- ?1 queue: whether a claim would find a due job (not paused).
SELECT EXISTS (SELECT 1 FROM {p}jobs WHERE state = 'available' AND queue = ?1)
   AND NOT EXISTS (SELECT 1 FROM {p}queues WHERE name = ?1 AND paused_at IS NOT NULL)

-- name: rate_retry_in
-- ?1 queue, ?2 period in microseconds, ?3 rate: how long until the
-- oldest start recorded in the queue's rate slots below the rate leaves
-- the window.
SELECT coalesce(min(used_at) + ?2 - {now}, 0) FROM {p}limit_slots
 WHERE queue = ?1 AND type = 'r' AND lkey = '' AND n < ?3 AND used_at IS NOT NULL

-- name: limit_usage
-- Every limited queue's limits, for a concurrency limit its slots in use
-- (slots_in_use, as limits_of counts them), its starts
-- within the window with the oldest of them, the keys with a held or
-- kept key slot, and the keys whose rate window is full (key_rate rate
-- slots within the rate, each stamped within the period), by one clock.
SELECT q.name, coalesce(q.max_running, 0), coalesce(q.rate, 0), coalesce(q.rate_period_us, 0),
       coalesce(q.key_max_running, 0), coalesce(q.key_order, 0),
       CASE WHEN q.max_running > 0 THEN {in_use} ELSE 0 END,
       (SELECT count(*) FROM {p}limit_slots AS s
         WHERE s.queue = q.name AND s.type = 'r' AND s.lkey = '' AND s.n < q.rate
           AND s.used_at > n.now - q.rate_period_us),
       (SELECT min(s.used_at) FROM {p}limit_slots AS s
         WHERE s.queue = q.name AND s.type = 'r' AND s.lkey = '' AND s.n < q.rate
           AND s.used_at > n.now - q.rate_period_us),
       (SELECT count(DISTINCT s.lkey) FROM {p}key_slots AS s
         WHERE s.queue = q.name AND s.job_id IS NOT NULL),
       n.now,
       coalesce(q.key_rate, 0), coalesce(q.key_rate_period_us, 0),
       CASE WHEN q.key_rate > 0
            THEN (SELECT count(*) FROM (SELECT 1 FROM {p}key_slots AS s
                                         WHERE s.queue = q.name AND s.n < 0 AND s.n >= -q.key_rate
                                           AND s.used_at > n.now - q.key_rate_period_us
                                         GROUP BY s.lkey
                                        HAVING count(*) >= q.key_rate))
            ELSE 0 END,
       coalesce(q.key_fair, 0)
  FROM {p}queues AS q, (SELECT {now} AS now) AS n
 WHERE q.max_running IS NOT NULL OR q.rate IS NOT NULL OR q.key_max_running IS NOT NULL
    OR q.key_rate IS NOT NULL OR q.key_fair > 0
 ORDER BY q.name

-- Blocks of a queue's concurrency slots (migration 18, driver.SlotLeaser):
-- a slot leased to a process is a 'b' row of limit_slots, numbered below
-- max_running when taken, with its owner (the process's worker id, the
-- attempted_by of the jobs it claims under the block) and the lease's
-- expiry (expires_at, by the database's clock). A free slot has no row:
-- giving a slot back deletes it. The owner's claims take no slot and
-- count nothing (limits_of with ?2 = 1), so its running jobs count
-- through its block's rows, not one by one.
--
-- slots_in_use is the fragment the statements' in_use token stands for
-- (put there as it is, so it carries no comment): how many of queue q's
-- concurrency slots are in use, as claims without a block, LeaseSlots
-- and LimitUsage count them against max_running: the slots leased in
-- blocks (every owner's, expired ones too until Rescue gives them back),
-- and the queue's running jobs that no owner of a block of the queue
-- claimed (claimed and not ended, by any process, HTTP worker or
-- ClaimJob, an expired lease until Rescue ends it). Those are the
-- running jobs less the owners' (attempted_by): one range of
-- jobs_running for the queue, one probe of it per owner, index entries
-- only, and the queue's block rows. Counting the jobs "attempted_by NOT
-- IN (the owners)" would make SQLite build the list of owners, a
-- correlated subquery, anew for every running job.

-- name: slots_in_use
((SELECT count(*) FROM {p}limit_slots AS b
   WHERE b.queue = q.name AND b.type = 'b' AND b.lkey = '')
 + (SELECT count(*) FROM {p}jobs INDEXED BY {p}jobs_running
     WHERE queue = q.name AND state = 'running')
 - (SELECT count(*) FROM {p}jobs INDEXED BY {p}jobs_running
     WHERE queue = q.name AND state = 'running'
       AND attempted_by IN (SELECT b.owner FROM {p}limit_slots AS b
                             WHERE b.queue = q.name AND b.type = 'b' AND b.lkey = '')))

-- name: block_give_back
-- ?1 queue, ?2 owner, ?3 how many it wants: gives back (deletes) the
-- owner's slots of the queue but the lowest ?3, all of them when the
-- queue has no max_running. The lowest are those below max_running
-- (their numbers are lower), then those at or above a lowered one, so
-- ORDER BY n keeps them in the contract's order: the owner's handlers may
-- still run under those, and a slot it keeps stays no one else's, so
-- that once the limit is raised again no other claim starts a job under
-- it while the owner's still runs. A kept slot counts in use
-- (slots_in_use) wherever it is, so while the slots in use exceed the
-- limit nobody takes a slot and the owner may use fewer than it holds
-- (SlotBlock.Usable, from block_room).
DELETE FROM {p}limit_slots
 WHERE queue = ?1 AND type = 'b' AND lkey = '' AND owner = ?2
   AND n NOT IN (SELECT n FROM {p}limit_slots
                  WHERE queue = ?1 AND type = 'b' AND lkey = '' AND owner = ?2
                    AND EXISTS (SELECT 1 FROM {p}queues WHERE name = ?1 AND max_running > 0)
                  ORDER BY n
                  LIMIT ?3 + 0)

-- name: block_renew
-- ?1 queue, ?2 owner, ?3 ttl in microseconds: leases the owner's slots
-- of the queue (those block_give_back kept, expired ones included: an
-- owner renewing before Rescue gave them back keeps them) until ?3 from
-- now. The count of rows changed is how many it kept.
UPDATE {p}limit_slots SET expires_at = {now} + ?3
 WHERE queue = ?1 AND type = 'b' AND lkey = '' AND owner = ?2

-- name: block_room
-- ?1 queue: its max_running (0 for none) and its slots in use
-- (slots_in_use), read after the owner's slots were given back or kept,
-- so counting those it kept: the caller takes no more than max_running
-- less these (so none while a lowered limit is exceeded, and never
-- beyond max_running for the owner), and tells the owner how many it may
-- use: max_running less the slots in use by others (these less its
-- own). No row when the queue has no queues row (no limits).
SELECT coalesce(q.max_running, 0), {in_use} FROM {p}queues AS q WHERE q.name = ?1

-- name: block_take
-- ?1 queue, ?2 owner, ?3 ttl in microseconds, ?4 max_running, ?5 how
-- many: leases the owner ?5 slots below ?4 that no block holds, rows
-- made here, the lowest first (the recursive CTE yields 0, 1, ... in
-- order, the LIMIT stops it once ?5 are found). The caller computed ?5
-- from block_room in this transaction: no more than the limit leaves.
WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < ?4)
INSERT INTO {p}limit_slots (queue, type, lkey, n, owner, expires_at)
SELECT ?1, 'b', '', s.n, ?2, {now} + ?3 FROM s
 WHERE s.n NOT IN (SELECT n FROM {p}limit_slots WHERE queue = ?1 AND type = 'b' AND lkey = '')
 LIMIT ?5 + 0

-- name: sweep_blocks
-- Gives back (deletes) the slots of blocks whose lease expired and whose
-- owner has no job of the slot's queue running (attempted_by = owner;
-- one probe of jobs_running per slot): an owner that stopped renewing
-- keeps its slots while a job it claimed runs, and loses them in the
-- Rescue round that ended its last one (run after the rescue statement,
-- in its transaction) or a later one. The write transaction is
-- exclusive, so a block renewed or a job claimed before it is seen, and
-- none meanwhile. Reads the expired blocks' rows by limit_slots_blocks.
DELETE FROM {p}limit_slots
 WHERE type = 'b' AND expires_at < {now}
   AND NOT EXISTS (SELECT 1 FROM {p}jobs INDEXED BY {p}jobs_running
                    WHERE queue = {p}limit_slots.queue AND state = 'running'
                      AND attempted_by = {p}limit_slots.owner)

-- name: set_key_weights
-- ?1 queue, ?2 its key weights (EncodeKeyWeights; NULL for none).
-- Touches only key_weights: a queue row it makes has no limits and no
-- pause.
INSERT INTO {p}queues (name, key_weights, updated_at)
VALUES (?1, ?2, {now})
ON CONFLICT (name) DO UPDATE
   SET key_weights = excluded.key_weights,
       updated_at = excluded.updated_at

-- name: key_weights
SELECT name, key_weights FROM {p}queues WHERE key_weights IS NOT NULL

-- name: drop_limit_slots_table
DROP TABLE IF EXISTS {p}limit_slots

-- Key limits (migration 12). A key-limited queue's keys hold rows of
-- key_slots, made by the claims that need them: concurrency slots
-- (n >= 0) and, for a rate per key (migration 13), rate slots (n < 0). A claim of such a queue
-- runs these inside its BEGIN IMMEDIATE transaction, whose write lock is
-- its own: no other claimer sees a slot between its read and its take.

-- name: next_keys
-- ?1 queue, ?2 a key, ?3 how many: the queue's first ?3 keys after ?2
-- among its due jobs with a key, in key order. One probe of jobs_key per
-- key, whatever the keys' depths, in one statement.
WITH RECURSIVE w(k, i) AS (
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > ?2
             ORDER BY lkey
             LIMIT 1), 1
    UNION ALL
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > w.k
             ORDER BY lkey
             LIMIT 1), w.i + 1
      FROM w
     WHERE w.k IS NOT NULL AND w.i < ?3)
SELECT k FROM w WHERE k IS NOT NULL

-- name: next_keys_heads
-- next_keys for a limit of one job per key (KeyMaxRunning 1, not
-- ordered), with each key's slot 0 (NULL when it has no row: free), its
-- job and whether it is open (as open_key_slots), the key's first two
-- due jobs (as key_jobs), and whether a slot above 0 is held or kept (a
-- limit lowered while they ran: the claim then reads the key's slots
-- with open_key_slots), one statement for the batch.
WITH RECURSIVE w(k, i) AS (
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > ?2
             ORDER BY lkey
             LIMIT 1), 1
    UNION ALL
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > w.k
             ORDER BY lkey
             LIMIT 1), w.i + 1
      FROM w
     WHERE w.k IS NOT NULL AND w.i < ?3)
SELECT w.k, s.n, s.job_id, s.job_id IS NULL OR s.fence IS NULL,
       (SELECT id FROM {p}jobs INDEXED BY {p}jobs_key
         WHERE queue = ?1 AND lkey = w.k AND state = 'available' AND lkey IS NOT NULL
         ORDER BY priority, id
         LIMIT 1),
       (SELECT id FROM {p}jobs INDEXED BY {p}jobs_key
         WHERE queue = ?1 AND lkey = w.k AND state = 'available' AND lkey IS NOT NULL
         ORDER BY priority, id
         LIMIT 1 OFFSET 1),
       EXISTS (SELECT 1 FROM {p}key_slots AS a
                WHERE a.queue = ?1 AND a.lkey = w.k AND a.n >= 1 AND a.job_id IS NOT NULL)
  FROM w LEFT JOIN {p}key_slots AS s ON s.queue = ?1 AND s.lkey = w.k AND s.n = 0
 WHERE w.k IS NOT NULL
 ORDER BY w.i

-- name: next_keys_heads_ordered
-- next_keys_heads for ordered keys: each key's oldest two due jobs (as
-- key_jobs_ordered).
WITH RECURSIVE w(k, i) AS (
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > ?2
             ORDER BY lkey
             LIMIT 1), 1
    UNION ALL
    SELECT (SELECT lkey FROM {p}jobs INDEXED BY {p}jobs_key
             WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL AND lkey > w.k
             ORDER BY lkey
             LIMIT 1), w.i + 1
      FROM w
     WHERE w.k IS NOT NULL AND w.i < ?3)
SELECT w.k, s.n, s.job_id, s.job_id IS NULL OR s.fence IS NULL,
       (SELECT id FROM {p}jobs INDEXED BY {p}jobs_key_order
         WHERE queue = ?1 AND lkey = w.k AND state = 'available' AND lkey IS NOT NULL
         ORDER BY id
         LIMIT 1),
       (SELECT id FROM {p}jobs INDEXED BY {p}jobs_key_order
         WHERE queue = ?1 AND lkey = w.k AND state = 'available' AND lkey IS NOT NULL
         ORDER BY id
         LIMIT 1 OFFSET 1),
       EXISTS (SELECT 1 FROM {p}key_slots AS a
                WHERE a.queue = ?1 AND a.lkey = w.k AND a.n >= 1 AND a.job_id IS NOT NULL)
  FROM w LEFT JOIN {p}key_slots AS s ON s.queue = ?1 AND s.lkey = w.k AND s.n = 0
 WHERE w.k IS NOT NULL
 ORDER BY w.i

-- name: open_key_slots
-- ?1 queue, ?2 key, ?3 key_max_running: the key's concurrency slots, in
-- order, with whether each is open: free (job_id NULL) or kept for a job
-- (fence NULL), and whether it is below the limit. Fewer rows below the
-- limit than the limit: the missing ones are free, and take_key_slots
-- makes those a claim takes. Rows at or above it are left from a higher
-- limit: held or kept, each still counts against the key's limit.
SELECT n, job_id, job_id IS NULL OR fence IS NULL, n < ?3 FROM {p}key_slots
 WHERE queue = ?1 AND lkey = ?2 AND n >= 0
 ORDER BY n

-- name: add_key_rate_slots
-- ?1 queue, ?2 key, ?3 a count up to key_rate: the key's rate slots -1 ..
-- -?3 that are missing, open (stamped 0).
WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n + 1 <= ?3)
INSERT INTO {p}key_slots (queue, lkey, n, used_at)
SELECT ?1, ?2, -n, 0 FROM s WHERE n <= ?3
ON CONFLICT DO NOTHING

-- name: key_rate_slots
-- ?1 queue, ?2 key, ?3 key_rate: the key's rate slots within the rate,
-- -1 first, with their stamps and the database's time. Fewer rows than
-- the rate: some are to be made.
SELECT n, used_at, {now} FROM {p}key_slots
 WHERE queue = ?1 AND lkey = ?2 AND n < 0 AND n >= -?3
 ORDER BY n DESC

-- name: take_key_rate_slot
-- ?1 queue, ?2 key, ?3 rate slot, ?4 the claim's attempted_at: the slot
-- admitted that start.
UPDATE {p}key_slots SET used_at = ?4
 WHERE queue = ?1 AND lkey = ?2 AND n = ?3 AND job_id IS NULL

-- name: kept_job_due
-- ?1 job id a kept slot is kept for: whether it is due (available).
SELECT EXISTS (SELECT 1 FROM {p}jobs WHERE id = ?1 AND state = 'available')

-- name: key_jobs
-- ?1 queue, ?2 key, ?3 how many: the key's next due jobs by priority,
-- then id, read from jobs_key without touching its other jobs.
SELECT id FROM {p}jobs INDEXED BY {p}jobs_key
 WHERE queue = ?1 AND lkey = ?2 AND state = 'available' AND lkey IS NOT NULL
 ORDER BY priority, id
 LIMIT ?3 + 0

-- name: key_jobs_ordered
-- ?1 queue, ?2 key, ?3 how many: the key's oldest due jobs, by id.
SELECT id FROM {p}jobs INDEXED BY {p}jobs_key_order
 WHERE queue = ?1 AND lkey = ?2 AND state = 'available' AND lkey IS NOT NULL
 ORDER BY id
 LIMIT ?3 + 0

-- name: claim_ids
-- ?1 [id, ...], ?2 lease in microseconds, ?3 worker: the given due jobs,
-- claimed as claim claims them.
UPDATE {p}jobs
   SET state = 'running',
       attempt = attempt + 1,
       fence = fence + 1,
       attempted_at = {now},
       lease_expires_at = {now} + ?2,
       attempted_by = ?3
 WHERE id IN (SELECT value FROM json_each(?1)) AND state = 'available'
RETURNING {cols}

-- name: claim_unkeyed
-- claim, for the jobs without a key of a key-limited queue. It walks
-- jobs_claim, which carries lkey, past the queue's keyed jobs ahead of
-- them in claim order (index entries only, no row read).
UPDATE {p}jobs
   SET state = 'running',
       attempt = attempt + 1,
       fence = fence + 1,
       attempted_at = {now},
       lease_expires_at = {now} + ?3,
       attempted_by = ?4
 WHERE id IN (SELECT id FROM {p}jobs
               WHERE state = 'available' AND queue = ?1 AND lkey IS NULL
                AND NOT EXISTS (SELECT 1 FROM {p}queues
                                 WHERE name = ?1 AND paused_at IS NOT NULL)
               ORDER BY priority, scheduled_at, id
               LIMIT ?2 + 0)
RETURNING {cols}

-- name: take_key_slots
-- ?1 queue, ?2 [[key, slot, job id, fence, the claim's attempted_at],
-- ...]: each attempt holds its slot, made when missing. One primary key
-- probe per slot.
INSERT INTO {p}key_slots (queue, lkey, n, job_id, fence, used_at)
SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4
  FROM json_each(?2) WHERE true
ON CONFLICT (queue, lkey, n) DO UPDATE
   SET job_id = excluded.job_id, fence = excluded.fence, used_at = excluded.used_at

-- name: insert_claim_limits
-- ?1 queue: the limits an insert that claims the queue's jobs checks
-- (Driver.InsertClaiming): whether it has a limit other than per key
-- (max_running, rate, key_rate, key_fair), its key_max_running and its
-- key_order. No row: no limits.
SELECT coalesce(max_running, 0) > 0 OR coalesce(rate, 0) > 0
         OR coalesce(key_rate, 0) > 0 OR coalesce(key_fair, 0) > 0,
       coalesce(key_max_running, 0), coalesce(key_order, 0)
  FROM {p}queues
 WHERE name = ?1

-- name: key_waits
-- ?1 queue, ?2 key: whether a due job of the key waits for a claim (one
-- probe of jobs_key_order).
SELECT EXISTS (SELECT 1 FROM {p}jobs INDEXED BY {p}jobs_key_order
                WHERE queue = ?1 AND lkey = ?2 AND state = 'available' AND lkey IS NOT NULL)

-- name: free_key_slots
-- ?1: [[id, fence, new state, queue, key], ...], attempts just ended (or
-- jobs finished by hand). Frees the slot each holds under that fence, or
-- keeps it for the job (fence cleared) when the job waits for its retry
-- (retryable, or scheduled by a snooze) in an ordered queue without
-- move-on. A slot already kept for the job (fence NULL: the job ran by
-- ClaimJob, which takes no slot, or was finished by hand) is matched too,
-- and kept or freed alike. One primary key range per job.
UPDATE {p}key_slots AS s
   SET job_id = CASE WHEN o.st IN ('retryable', 'scheduled')
                      AND (SELECT key_order FROM {p}queues WHERE name = o.q) = 1
                     THEN s.job_id END,
       fence = NULL
  FROM (SELECT value ->> 0 AS oid, value ->> 1 AS ofence, value ->> 2 AS st,
               value ->> 3 AS q, value ->> 4 AS k
          FROM json_each(?1)) AS o
 WHERE s.queue = o.q AND s.lkey = o.k AND s.job_id = o.oid
   AND (s.fence = o.ofence OR s.fence IS NULL)

-- name: sweep_key_slots
-- Frees the key slots held by an attempt that no longer runs under the
-- slot's fence, and those kept for a job that no longer waits to run
-- (cancelled, discarded, completed, deleted).
UPDATE {p}key_slots
   SET job_id = NULL, fence = NULL
 WHERE job_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM {p}jobs AS j
                    WHERE j.id = {p}key_slots.job_id
                      AND CASE WHEN {p}key_slots.fence IS NULL
                               THEN j.state IN ('available', 'scheduled', 'retryable', 'running')
                               ELSE j.fence = {p}key_slots.fence AND j.state = 'running' END)

-- name: sweep_idle_key_slots
-- Deletes the free concurrency key slots unused for a minute, those at
-- or above their key's current limit, and those of a queue without key
-- limits: claims make them again when they need them.
DELETE FROM {p}key_slots
 WHERE job_id IS NULL AND n >= 0
   AND (used_at < {now} - 60000000
        OR n >= coalesce((SELECT key_max_running FROM {p}queues
                           WHERE name = {p}key_slots.queue), 0))

-- name: sweep_key_rate_slots
-- Deletes the rate slots stamped more than max(period, a minute) ago (or
-- never), and those of a queue without a rate per key: claims make them
-- again, open, when they need them. A slot stamped within the period
-- stays, beyond a lowered key_rate too (claims ignore it), so that the
-- rate raised again within the window counts its start.
DELETE FROM {p}key_slots
 WHERE n < 0
   AND NOT EXISTS (SELECT 1 FROM {p}queues AS q
                    WHERE q.name = {p}key_slots.queue AND q.key_rate > 0
                      AND {p}key_slots.used_at >= {now} - max(q.key_rate_period_us, 60000000))

-- name: key_held
-- ?1 queue, ?2 key_max_running (0 for none), ?3 1 when ordered, ?4
-- key_rate (0 for none), ?5 its period in microseconds: the queue's due
-- jobs with a key that its key's slots leave no room for. Per key whose
-- rate window is full (key_rate rate slots stamped within the period):
-- all of its due jobs. Per other key, with a concurrency limit: all of
-- its due jobs but those its concurrency slots below the limit admit (a
-- kept slot its own job if due; a free one, unless the key is ordered and
-- has a kept slot, one more job).
WITH a AS (SELECT lkey, count(*) AS cnt FROM {p}jobs INDEXED BY {p}jobs_key
            WHERE queue = ?1 AND state = 'available' AND lkey IS NOT NULL
            GROUP BY lkey),
     s AS (SELECT ks.lkey,
                  sum(ks.job_id IS NOT NULL) AS occupied,
                  sum(ks.job_id IS NOT NULL AND ks.fence IS NULL) AS kept,
                  sum(ks.job_id IS NOT NULL AND ks.fence IS NULL
                      AND EXISTS (SELECT 1 FROM {p}jobs AS j
                                   WHERE j.id = ks.job_id AND j.state = 'available')) AS kept_due
             FROM {p}key_slots AS ks
            WHERE ks.queue = ?1 AND ks.n >= 0 AND ks.n < ?2
            GROUP BY ks.lkey),
     r AS (SELECT rs.lkey FROM {p}key_slots AS rs
            WHERE ?4 > 0 AND rs.queue = ?1 AND rs.n < 0 AND rs.n >= -?4
              AND rs.used_at > {now} - ?5
            GROUP BY rs.lkey
           HAVING count(*) >= ?4)
SELECT coalesce(sum(CASE WHEN r.lkey IS NOT NULL THEN a.cnt
                         WHEN ?2 = 0 THEN 0
                         WHEN ?3 AND coalesce(s.kept, 0) > 0
                         THEN a.cnt - coalesce(s.kept_due, 0)
                         ELSE a.cnt - min(a.cnt, coalesce(s.kept_due, 0) + max(?2 - coalesce(s.occupied, 0), 0)) END), 0)
  FROM a LEFT JOIN s ON s.lkey = a.lkey LEFT JOIN r ON r.lkey = a.lkey

-- name: drop_key_slots_table
DROP TABLE IF EXISTS {p}key_slots
