-- The statements of the jobs' tables (docs/postgres-storage.md): every
-- job lives in one segment table of its phase, listed in the registry
-- {p}segments. Most are templates; besides {p} (the prefix), segments.go
-- fills in:
--   {t}                     one segment table (maintenance, DDL)
--   {ready} {running} {waiting} {done} {dead}
--                           the current segment of each phase
--   {guard}                 the incarnation guard of every current segment
--                           the statement inserts into, as
--                           (SELECT last_value FROM <tbl>_inc) = <inc> AND ...
--   {cols}                  every column of a segment table, in order
--   {jobcols}               the columns of a job row (scanJob's order)
--   {each}X{sep}Y{end}      X once per source segment ({src} its table,
--                           {i} its index), joined by Y
-- Every statement that ends an attempt (seg_complete, seg_complete_done,
-- seg_release, seg_rescue, seg_finish) frees the attempt's key slot (kf:
-- by the moved row's queue, key, id and fence, only for rows with a key,
-- behind a one-time test on the moved rows, so that jobs without a key
-- pay nothing more) and its queue limit slot in a CTE of its own (fr): the slot held under the moved row's id
-- and fence, so that a stale outcome, which moves nothing, frees nothing.
-- Its one-time test (an uncorrelated EXISTS, evaluated once before the
-- join) skips the join while no slot of the prefix is held, so that
-- jobs of unlimited queues pay one look at the slots table (a few pages:
-- one row per slot of a limit) per statement. The slots table has no
-- index on job_id: every take and free changes job_id, which an index
-- would turn into a new index entry and a dead one per job (a drain with
-- a limit above its workers ran at 23k jobs/s with such an index, 30k
-- without it, alternated in one run); without it, with fillfactor 50,
-- takes and frees are HOT updates that pruning keeps on the table's few
-- pages, and the join by job_id reads those pages. A statement that freed a slot wakes the slot's queue; the
-- outcomes' statements read the wake-ups as a one-time test too (not a
-- join repeated per row).
-- Statements are built once per set of tables and cached. A statement
-- that moves jobs deletes them from their sources and inserts them into
-- the current segment of their next phase in one statement; the guard
-- sits in the delete (or the input) so that, when a reclaim has made a
-- target a different incarnation, nothing moves and the statement says so
-- (a row with id -1, or queue '!stale'), and the caller refreshes its view
-- of the registry and runs it again.

-- name: seg_table
CREATE TABLE {t} (
    pos              bigint       NOT NULL DEFAULT nextval('{p}pos_seq'),
    id               bigint       NOT NULL DEFAULT nextval('{p}job_ids'),
    queue            varchar(128) NOT NULL,
    kind             varchar(128) NOT NULL,
    args             json         NOT NULL DEFAULT '{}',
    state            text         NOT NULL,
    priority         integer      NOT NULL DEFAULT 0,
    attempt          integer      NOT NULL DEFAULT 0,
    max_attempts     integer      NOT NULL DEFAULT 25,
    timeout_ms       bigint       NOT NULL DEFAULT 0,
    scheduled_at     timestamptz  NOT NULL DEFAULT now(),
    created_at       timestamptz  NOT NULL DEFAULT now(),
    attempted_at     timestamptz,
    finalized_at     timestamptz,
    lease_expires_at timestamptz,
    attempted_by     text,
    errors           jsonb        NOT NULL DEFAULT '[]',
    fence            bigint       NOT NULL DEFAULT 0,
    unique_key       bytea,
    unique_keep      smallint     NOT NULL DEFAULT 0,
    meta             jsonb,
    lkey             text COLLATE "C"
) WITH (fillfactor = 80);
CREATE UNIQUE INDEX {t}_id_idx ON {t} (id);
CREATE SEQUENCE {t}_inc OWNED BY {t}.pos;
SELECT setval('{t}_inc', 1)

-- name: seg_index_ready
-- Claims: a queue's jobs by priority, then in the order they became
-- available.
CREATE INDEX {t}_claim_idx ON {t} (queue, priority, pos);
-- The keyed claim (key limits): a queue's distinct keys in key order (the
-- walk's skip scan) and a key's head by (priority, id), or by id for an
-- ordered queue. Partial: jobs without a key add no entry to them.
CREATE INDEX IF NOT EXISTS {t}_key_idx ON {t} (queue, lkey, priority, id) WHERE lkey IS NOT NULL;
CREATE INDEX IF NOT EXISTS {t}_key_id_idx ON {t} (queue, lkey, id) WHERE lkey IS NOT NULL

-- name: seg_index_waiting
-- Promote: scheduled and retryable jobs by due time.
CREATE INDEX {t}_due_idx ON {t} (scheduled_at)

-- name: seg_index_finished
-- The job lists of done and dead segments filtered by queue or by kind,
-- in id order (as migration 8's indexes on {p}jobs): retention keeps
-- these segments for a day by default, so a filtered page must read one
-- index range per segment, not walk every finished job. Built once a
-- sealed segment takes no more writes, with its counts (seg_record_counts,
-- under the segment's SHARE lock): a current done segment takes a row per
-- finished job, and two index entries per job were a tenth of a drain's
-- time. The current segment and the few sealed in the last minute are
-- read without them (at most finishedBytes each). IF NOT EXISTS: a
-- segment counted again after a by-hand retry keeps its own.
CREATE INDEX IF NOT EXISTS {t}_queue_idx ON {t} (queue, id);
CREATE INDEX IF NOT EXISTS {t}_kind_idx ON {t} (kind, id)

-- name: seg_unindex_finished
-- A free done or dead table made current again: empty (truncated) and
-- read by nobody, so dropping the list indexes it kept is instant.
DROP INDEX IF EXISTS {t}_queue_idx, {t}_kind_idx

-- name: seg_registry
-- The live segments: current and sealed, oldest first within a phase, with
-- the time each sealed one was sealed (none for current ones).
SELECT tbl, phase, status, inc, sealed_at FROM {p}segments
 WHERE status IN ('current', 'sealed')
 ORDER BY phase, ord

-- name: seg_registry_tx
-- seg_registry inside a caller's transaction, with its isolation level
-- (see readIn).
SELECT tbl, phase, status, inc, sealed_at, current_setting('transaction_isolation') FROM {p}segments
 WHERE status IN ('current', 'sealed')
 ORDER BY phase, ord

-- name: seg_count
SELECT count(*) FROM {p}segments

-- name: seg_insert
-- Jobs into the current ready segment (due now) or waiting segment (due
-- later). Ids are drawn from the sequence in input order (WITH
-- ORDINALITY) and returned in that order. With $11 true, one pg_notify
-- per distinct queue that received a job that is available now, in the
-- same statement and transaction (an insert in the caller's transaction:
-- the wake-up is delivered at its commit). With $11 false the caller
-- notifies after the commit, in a transaction of its own (see
-- notify_queues_async). $9 is the metadata and $10 the limit keys (NULL:
-- no key); a batch without any passes an empty array, which unnest pads
-- with NULLs, so plain jobs cost nothing more.
WITH input AS MATERIALIZED (
    SELECT nextval('{p}job_ids') AS id,
           i.ord, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.timeout_ms,
           coalesce(i.run_at, now() + i.delay_us * interval '1 microsecond') AS sched, i.meta, i.lkey
    FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[], $8::bigint[],
                $9::jsonb[], $10::text[])
         WITH ORDINALITY AS i(queue, kind, args, priority, max_attempts, timeout_ms, run_at, delay_us, meta, lkey, ord)
    WHERE {guard}
),
r AS (
    INSERT INTO {ready} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at, meta, lkey)
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, max_attempts, timeout_ms, sched, meta, lkey
    FROM input WHERE sched <= now() ORDER BY ord
),
wt AS (
    INSERT INTO {waiting} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at, meta, lkey)
    SELECT 0, id, queue, kind, args, 'scheduled', priority, max_attempts, timeout_ms, sched, meta, lkey
    FROM input WHERE sched > now()
),
woke AS (
    SELECT pg_notify('{p}wake', d.queue)
    FROM (SELECT DISTINCT queue FROM input WHERE sched <= now() AND $11::boolean) d
)
SELECT i.id FROM input i CROSS JOIN (SELECT count(*) FROM woke) w ORDER BY i.ord

-- name: seg_insert_claim
-- seg_insert whose jobs flagged in $11 are claimed as they are written
-- (driver.InsertClaimer): a flagged job that is due now, in a queue that
-- is not paused, goes straight into the current running segment as
-- seg_claim would have moved it there (attempt 1, leased to $13 for $12
-- microseconds, its fence the clock floor of seg_claim); every other job
-- goes where seg_insert puts it. With $14 true, only the jobs left
-- available notify their queue; with $14 false the caller notifies after
-- the commit (see seg_insert). The statement commits as an insert does (synchronously):
-- the enqueue is durable before the caller hears of it. Returns, in
-- input order, each job's id and, for a claimed one, its fence, claim
-- time, lease and creation time (NULL fence: not claimed).
WITH input AS MATERIALIZED (
    SELECT nextval('{p}job_ids') AS id,
           i.ord, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.timeout_ms,
           coalesce(i.run_at, now() + i.delay_us * interval '1 microsecond') AS sched, i.meta, i.lkey,
           coalesce(i.claim, false) AS claim
    FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[], $8::bigint[],
                $9::jsonb[], $10::text[], $11::bool[])
         WITH ORDINALITY AS i(queue, kind, args, priority, max_attempts, timeout_ms, run_at, delay_us, meta, lkey, claim, ord)
    WHERE {guard}
),
dec AS MATERIALIZED (
    SELECT input.*,
           input.claim AND input.sched <= now()
             AND NOT EXISTS (SELECT 1 FROM {p}queues q WHERE q.name = input.queue AND q.paused_at IS NOT NULL) AS take
    FROM input
),
cl AS MATERIALIZED (
    SELECT (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint + 128) * 17592186044416
             + (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS floor
     WHERE EXISTS (SELECT 1 FROM dec WHERE take)
),
run AS (
    INSERT INTO {running} (pos, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
                           scheduled_at, attempted_at, lease_expires_at, attempted_by, fence, meta, lkey)
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'running', priority, 1, max_attempts, timeout_ms,
           sched, now(), now() + $12::bigint * interval '1 microsecond', $13, cl.floor, meta, lkey
    FROM dec, cl WHERE take ORDER BY ord
    RETURNING id, fence, attempted_at, lease_expires_at, created_at
),
r AS (
    INSERT INTO {ready} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at, meta, lkey)
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, max_attempts, timeout_ms, sched, meta, lkey
    FROM dec WHERE sched <= now() AND NOT take ORDER BY ord
),
wt AS (
    INSERT INTO {waiting} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at, meta, lkey)
    SELECT 0, id, queue, kind, args, 'scheduled', priority, max_attempts, timeout_ms, sched, meta, lkey
    FROM dec WHERE sched > now()
),
woke AS (
    SELECT pg_notify('{p}wake', d.queue)
    FROM (SELECT DISTINCT queue FROM dec WHERE sched <= now() AND NOT take AND $14::boolean) d
)
SELECT i.id, run.fence, run.attempted_at, run.lease_expires_at, run.created_at, i.sched
FROM dec i LEFT JOIN run ON run.id = i.id CROSS JOIN (SELECT count(*) FROM woke) w
ORDER BY i.ord

-- name: seg_insert_unique
-- seg_insert for jobs with a unique key ($11, hex) and keep bits ($12),
-- given in key order, each with its place in the caller's order ($13).
-- The key goes into {p}unique_keys first, in key order (ORDER BY ord), so
-- that concurrent inserters of overlapping keys wait for each other in
-- the same order and cannot deadlock: ON CONFLICT DO NOTHING waits for a
-- concurrent inserter of the same key and skips a held one. Only jobs
-- whose key went in are inserted, and only they notify (with $14 true;
-- false: the caller notifies after the commit, see seg_insert); the
-- result says which went in. Ids and queue positions follow the caller's order
-- (ORDER BY corder), so that a batch's jobs run in the order given (a
-- schedule's late slots caught up in one insert run oldest first).
WITH input AS MATERIALIZED (
    SELECT nextval('{p}job_ids') AS id, i.*
    FROM (SELECT i.ord, i.corder, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.timeout_ms,
                 coalesce(i.run_at, now() + i.delay_us * interval '1 microsecond') AS sched,
                 i.meta, i.lkey, decode(i.ukey, 'hex') AS ukey, i.keep
          FROM unnest($1::text[], $2::text[], $3::json[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[], $8::bigint[],
                      $9::jsonb[], $10::text[], $11::text[], $12::int[], $13::int[])
               WITH ORDINALITY AS i(queue, kind, args, priority, max_attempts, timeout_ms, run_at, delay_us, meta, lkey, ukey, keep, corder, ord)
          WHERE {guard}
          ORDER BY i.corder) i
),
k AS (
    INSERT INTO {p}unique_keys (key, job_id)
    SELECT ukey, id FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING job_id
),
ins AS (SELECT input.* FROM input JOIN k ON k.job_id = input.id),
r AS (
    INSERT INTO {ready} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at,
                         unique_key, unique_keep, meta, lkey)
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, max_attempts, timeout_ms, sched,
           ukey, keep, meta, lkey
    FROM ins WHERE sched <= now() ORDER BY corder
),
wt AS (
    INSERT INTO {waiting} (pos, id, queue, kind, args, state, priority, max_attempts, timeout_ms, scheduled_at,
                           unique_key, unique_keep, meta, lkey)
    SELECT 0, id, queue, kind, args, 'scheduled', priority, max_attempts, timeout_ms, sched, ukey, keep, meta, lkey
    FROM ins WHERE sched > now()
),
woke AS (
    SELECT pg_notify('{p}wake', d.queue)
    FROM (SELECT DISTINCT queue FROM ins WHERE sched <= now() AND $14::boolean) d
)
SELECT i.id, k.job_id IS NOT NULL
FROM input i LEFT JOIN k ON k.job_id = i.id CROSS JOIN (SELECT count(*) FROM woke) w
ORDER BY i.ord

-- name: seg_job_unique_key
SELECT unique_key FROM (
{each}SELECT unique_key FROM {src} WHERE id = $1{sep}
UNION ALL
{end}) j
LIMIT 1

-- name: seg_unique_holders
SELECT encode(key, 'hex'), job_id FROM {p}unique_keys
 WHERE key = ANY (ARRAY(SELECT decode(k, 'hex') FROM unnest($1::text[]) AS k))

-- name: seg_bulk_lock
-- BulkInsert's lock on the current ready and waiting segments, the lock
-- an insert takes (a reclaim's ACCESS EXCLUSIVE waits for it).
LOCK TABLE {ready}, {waiting} IN ROW EXCLUSIVE MODE

-- name: seg_bulk_guard
-- BulkInsert copies into the current ready and waiting segments: it locks
-- them as an insert would, then checks their incarnations.
SELECT {guard}

-- name: seg_claim
-- Every live ready segment offers its first $2 jobs of the queue (FOR
-- UPDATE SKIP LOCKED: claimers never wait for each other); the first $2
-- of all by (priority, pos) move to the current running segment. The
-- delete finds them by the ctids the locking read returned (a TID scan:
-- no index descent per job). A locked row cannot move (rows of a ready
-- segment are never updated, and the lock keeps any other statement from
-- deleting it), so its ctid still names it when the delete runs.
--
-- The claim commits without waiting for its WAL to reach disk (async:
-- synchronous_commit off for this statement's transaction only), which
-- takes an fsync off every pick-up. A crash of the server may then lose a
-- claim whose worker already runs the job; the job is claimed again, as
-- after any crash, and the fence makes that safe: the new claim's fence
-- differs from the lost one's even though the lost one never reached the
-- table, and the first worker's acknowledgements are refused. Every
-- acknowledgement (complete, heartbeat, release) commits synchronously,
-- and its flush carries any earlier claim of its job with it.
--
-- The fence is greatest(fence + 1, floor), the floor computed once per
-- statement (the materialized CTE) as
--
--     (timeline + 128) * 2^44 + milliseconds since 1970 (database clock)
--
-- where timeline is the server's current WAL timeline: the first 8 hex
-- digits of the name of the WAL file being written (pg_walfile_name of
-- pg_current_wal_lsn, both callable by any role; pg_control_checkpoint's
-- timeline would lag until the next checkpoint). Why no fence repeats:
--   - Within one timeline, fence + 1 makes every claim of a job larger
--     than the last one the table holds. A claim lost in a crash of the
--     same server (the timeline survives a restart) was at most a few
--     claims past the table's fence, at a clock the restarted server has
--     passed long since (a restart takes far longer than a millisecond).
--   - A promotion always starts a new, larger timeline, whatever the
--     clocks of the old and new primary say. Every fence issued on
--     timeline t is below (t + 129) * 2^44 (a job would need 2^44 claims
--     to climb past it), and every fence on a later timeline is at least
--     its floor, so the claims lost with the old primary can never be
--     repeated by the new one.
-- 128 puts timeline 1's floor (about 2.27e15) above every fence of the
-- former layout (the clock in microseconds: 1.8e15 in 2027, 2^51 in
-- 2041), so jobs claimed before an upgrade move into the new layout with
-- their next claim. Milliseconds keep the fence below 2^53, the integers
-- JSON numbers carry exactly (the HTTP worker protocol sends the fence to
-- JavaScript workers), up to timeline 383 and the year 2527.
WITH
async AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true),
           (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint + 128) * 17592186044416
             + (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS floor
),
{each}c{i} AS (
    SELECT {i} AS s, ctid AS c, priority, pos FROM {src}
     WHERE queue = $1 AND (priority, pos) > ($5::int, $6::bigint) AND {nokey}{guard}
       AND NOT EXISTS (SELECT 1 FROM {p}queues WHERE name = $1 AND paused_at IS NOT NULL)
     ORDER BY priority, pos
     LIMIT $2
     FOR UPDATE SKIP LOCKED
),
{sep}{end}
picked AS (
    SELECT s, c FROM ({each}SELECT * FROM c{i}{sep} UNION ALL {end}) a
    ORDER BY priority, pos
    LIMIT $2
),
{each}d{i} AS (DELETE FROM {src} r WHERE r.ctid = ANY (ARRAY(SELECT c FROM picked WHERE s = {i})) RETURNING r.*),
{sep}{end}
ins AS (
    INSERT INTO {running} ({cols})
    SELECT pos, id, queue, kind, args, 'running', priority, attempt + 1, max_attempts, timeout_ms,
           scheduled_at, created_at, now(), NULL, now() + $3::bigint * interval '1 microsecond', $4,
           errors, greatest(fence + 1, async.floor),
           unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d, async
    RETURNING id, kind, args, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at,
              attempted_at, lease_expires_at, errors, fence, meta, lkey, pos
)
SELECT id, kind, args, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at,
       attempted_at, lease_expires_at, errors, fence, meta, lkey, pos
FROM ins
UNION ALL
-- The guard's refusal, in the claim's own result (one round trip, not a
-- second statement after every claim that found nothing): a row with id
-- -1 when the running segment is no longer the incarnation the statement
-- was built for. It is evaluated apart from the guard of the reads above,
-- so that a reclaim between the two can give jobs and this row: the jobs
-- moved, and the caller keeps them and drops the row.
SELECT -1, '', '{}'::json, 0, 0, 0, 0, now(), now(), now(), now(), '[]'::jsonb, 0, NULL::jsonb, NULL::text, 0
 WHERE NOT ({guard})
ORDER BY priority, pos

-- name: seg_key_room
-- seg_key_walk's test of the key x.k, the same at each step of its walk
-- (put in place of its {key_room}, without this comment, when the
-- queries load): whether the key has room (fewer than $5 concurrency
-- slots held, and its rate window not full), whether its rate window is
-- full (rfull: $6 or more of its rate slots stamped within the last $7
-- microseconds), and its rate slots (rtot), their highest number (rmax)
-- and those open (ropen), and its concurrency slots below $5 (cs: the
-- walk makes none for a key that has them all).
LATERAL (
        SELECT ($5::int = 0 OR c.held < $5::int) AND NOT c.rfull AS room, c.rfull, c.rtot, c.rmax, c.rtot - c.rrec AS ropen,
               c.cs
          FROM (SELECT count(*) FILTER (WHERE s.n >= 0 AND s.fence IS NOT NULL) AS held,
                       count(*) FILTER (WHERE s.n >= 0 AND s.n < $5::int) AS cs,
                       count(*) FILTER (WHERE s.n < 0 AND s.n >= -$6::int) AS rtot,
                       count(*) FILTER (WHERE s.n < 0 AND s.n >= -$6::int
                                          AND s.used_at > now() - $7::bigint * interval '1 microsecond') AS rrec,
                       coalesce(max(-s.n) FILTER (WHERE s.n < 0 AND s.n >= -$6::int), 0) AS rmax,
                       $6::int > 0 AND count(*) FILTER (WHERE s.n < 0 AND s.n >= -$6::int
                                          AND s.used_at > now() - $7::bigint * interval '1 microsecond') >= $6::int AS rfull
                  FROM {p}key_slots s WHERE s.queue = $1 AND s.lkey = x.k) c
    ) rm

-- name: seg_key_walk
-- The keyed claim's walk (key limits), the first statement of the
-- claim's transaction (sent before its BEGIN, in the same round trip as
-- limit_begin; see ClaimLimited): the distinct keys of queue $1's jobs in the
-- live ready segments, in key order from after $2 (the key the previous
-- claim of the queue stopped at, '' for the start; from $2 itself when
-- $8, a fair queue's key whose turn the previous claim left unfinished,
-- if it still has jobs) and, once past the last key, from the start up to
-- $2 (before it when $8); past its window (below) a skip scan (one
-- probe of each segment's key index per key, whatever the keys' depth).
-- It examines at
-- most $3 keys and stops once $4 of them have room: fewer than $5 (the
-- queue's KeyMaxRunning; 0: none) slots held by running attempts (at any
-- number: a lowered limit leaves slots above it held) and, with a rate
-- per key ($6 starts in $7 microseconds; 0: none), fewer than $6 of its
-- rate slots (n -1 .. -$6) stamped within the window. It makes the
-- missing slots of the keys with room, ON CONFLICT DO NOTHING, in key
-- order then number (concurrent walks insert in the same order): the
-- concurrency slots n < $5, and rate slots, unstamped ('epoch': open),
-- so that the key has as many open ones as it has ready jobs, up to $4
-- (within $6): the next numbers after its highest, or from -1 when the
-- sweep left gaps below it. It
-- returns every key examined, in walk order, with whether it had room
-- and whether its rate's window was full, and how many distinct keys and
-- entries the window held.
-- The window: the first $9 entries after $2 of the key indexes, merged
-- in key order, read in one scan each (0: none). It holds every key
-- between $2 and its last key, so the walk takes its keys from it, one
-- step each, and probes the indexes for the next key only past it: for
-- shallow keys (a few jobs each) a probe per key costs several times a
-- window's entries. The caller makes the window small or none for deep
-- keys (keyStates.sawWindow: a window that held few keys for its
-- entries).
-- Asynchronous commit as a claim's: slot rows are made again on demand.
WITH RECURSIVE
async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
win AS MATERIALIZED (
    SELECT coalesce(array_agg(DISTINCT t.lkey ORDER BY t.lkey), '{}') AS keys, count(*)::int AS n FROM (
        SELECT u.lkey FROM (
{each}(SELECT lkey FROM {src} WHERE queue = $1 AND lkey > $2::text AND $9::int > 0 ORDER BY lkey LIMIT $9::int){sep}
UNION ALL
{end}) u ORDER BY u.lkey LIMIT $9::int
    ) t
),
w1(k, i, p, r, room, rfull, rtot, rmax, ropen, cs) AS (
    SELECT x.k, 1, x.p, rm.room::int, rm.room, rm.rfull, rm.rtot, rm.rmax, rm.ropen, rm.cs
      FROM (SELECT CASE WHEN rs.again THEN $2::text
                        WHEN cardinality(wn.keys) > 0 THEN wn.keys[1]
                        ELSE (SELECT min(m) FROM (
{each}SELECT min(lkey) AS m FROM {src} WHERE queue = $1 AND lkey > $2::text{sep}
UNION ALL
{end}) s) END AS k,
                   CASE WHEN rs.again THEN 0 ELSE 1 END AS p
              FROM (SELECT $8::boolean AND EXISTS (
{each}SELECT 1 FROM {src} WHERE queue = $1 AND lkey = $2::text{sep}
UNION ALL
{end}) AS again) rs, win wn OFFSET 0) x,
    {key_room}
     WHERE x.k IS NOT NULL
    UNION ALL
    SELECT x.k, w1.i + 1, w1.p + 1, w1.r + rm.room::int, rm.room, rm.rfull, rm.rtot, rm.rmax, rm.ropen, rm.cs
      FROM w1, LATERAL (SELECT CASE WHEN w1.p < cardinality(wn.keys) THEN wn.keys[w1.p + 1]
                                    ELSE (SELECT min(m) FROM (
{each}SELECT min(lkey) AS m FROM {src} WHERE queue = $1 AND lkey > w1.k{sep}
UNION ALL
{end}) s) END AS k FROM win wn OFFSET 0) x,
    {key_room}
     WHERE w1.i < $3::int AND w1.r < $4::int AND x.k IS NOT NULL
),
w2(k, i, r, room, rfull, rtot, rmax, ropen, cs) AS (
    SELECT x.k, (SELECT count(*)::int FROM w1) + 1, (SELECT coalesce(max(r), 0) FROM w1) + rm.room::int,
           rm.room, rm.rfull, rm.rtot, rm.rmax, rm.ropen, rm.cs
      FROM (SELECT (SELECT min(m) FROM (
{each}SELECT min(lkey) AS m FROM {src} WHERE queue = $1 AND lkey > ''{sep}
UNION ALL
{end}) s) AS k OFFSET 0) x,
    {key_room}
     WHERE x.k IS NOT NULL AND (x.k < $2::text OR x.k = $2::text AND NOT $8::boolean) AND $2::text <> ''
       AND (SELECT count(*) FROM w1) < $3::int AND (SELECT coalesce(max(r), 0) FROM w1) < $4::int
    UNION ALL
    SELECT x.k, w2.i + 1, w2.r + rm.room::int, rm.room, rm.rfull, rm.rtot, rm.rmax, rm.ropen, rm.cs
      FROM w2, LATERAL (SELECT (SELECT min(m) FROM (
{each}SELECT min(lkey) AS m FROM {src} WHERE queue = $1 AND lkey > w2.k{sep}
UNION ALL
{end}) s) AS k OFFSET 0) x,
    {key_room}
     WHERE w2.i < $3::int AND w2.r < $4::int AND x.k IS NOT NULL
       AND (x.k < $2::text OR x.k = $2::text AND NOT $8::boolean)
),
ks AS MATERIALIZED (
    SELECT k, i, room, rfull, rtot, rmax, ropen, cs, greatest(0, least($6::int - rtot, $4::int - ropen)) AS need FROM w1
    UNION ALL
    SELECT k, i, room, rfull, rtot, rmax, ropen, cs, greatest(0, least($6::int - rtot, $4::int - ropen)) FROM w2
),
-- The rate slots to make: no more than the key has ready jobs (up to $4)
-- beyond its open ones.
rk AS MATERIALIZED (
    SELECT ks.k, ks.rtot, ks.rmax,
           least(ks.need, (SELECT count(*) FROM (
{each}(SELECT 1 FROM {src} WHERE queue = $1 AND lkey = ks.k LIMIT $4){sep}
UNION ALL
{end}) j) - ks.ropen) AS need
      FROM ks
     WHERE ks.room AND ks.need > 0
),
mk AS (
    INSERT INTO {p}key_slots (queue, lkey, n, used_at)
    SELECT $1, k, n, u FROM (
        SELECT ks.k, g AS n, now() AS u FROM ks CROSS JOIN generate_series(0, $5::int - 1) AS g
         WHERE ks.room AND ks.cs < $5::int
        UNION ALL
        SELECT rk.k, -g, 'epoch'::timestamptz FROM rk
         CROSS JOIN generate_series(CASE WHEN rk.rtot = rk.rmax THEN rk.rmax + 1 ELSE 1 END,
                                    least($6::int, rk.rmax + rk.need)) AS g
         WHERE rk.need > 0
    ) m
     ORDER BY k, n
    ON CONFLICT DO NOTHING
)
SELECT coalesce(array_agg(k ORDER BY i), '{}'), coalesce(array_agg(room ORDER BY i), '{}'),
       coalesce(array_agg(rfull ORDER BY i), '{}'), (SELECT cardinality(keys) FROM win), (SELECT n FROM win)
  FROM ks CROSS JOIN async

-- name: seg_key_pick
-- The heads of the keys a keyed claim looks at, from the live ready
-- segments: $2 the keys, $3 how many of each (by priority then id, or by
-- id alone when $4, ordered), and, when $5, the jobs that the keys' kept
-- slots wait for (kept: true; slots kept for a job waiting for its retry,
-- as this statement's snapshot, taken after key_lock locked the slots,
-- has them), if they are ready. Read through the key indexes: a key's
-- other jobs are not read. Sent with key_lock in one round trip: the
-- counts bound what the slots key_lock locks can admit, and the caller
-- keeps of each key what they do admit.
-- For ordered keys ($4) it also checks, in its own snapshot, that the
-- registry's live ready segments are exactly $6 (as seg_sweep_kept's
-- $1): a view that misses one (a rotation, or a reclaim that moved a
-- sealed segment's leftover jobs into a current segment made since the
-- view was read) would read a key's later job as its oldest. When they
-- differ, a row with id -1 says so, and the claim runs again on a fresh
-- view.
SELECT '', -1::bigint, 0, false
 WHERE $4::boolean AND (
    SELECT coalesce(string_agg(tbl || ':' || inc, ',' ORDER BY tbl COLLATE "C"), '')
      FROM {p}segments WHERE phase = 'ready' AND status IN ('current', 'sealed')) <> $6::text
UNION ALL
SELECT k.lkey, h.id, h.priority, false FROM unnest($2::text[], $3::int[]) AS k(lkey, cnt)
CROSS JOIN LATERAL (
    SELECT id, priority FROM (
{each}(SELECT id, priority FROM {src} WHERE queue = $1 AND lkey = k.lkey
  ORDER BY priority, id LIMIT CASE WHEN $4::boolean THEN 0 ELSE k.cnt END){sep}
UNION ALL
{end}) a
    UNION ALL
    SELECT id, priority FROM (
{each}(SELECT id, priority FROM {src} WHERE queue = $1 AND lkey = k.lkey
  ORDER BY id LIMIT CASE WHEN $4::boolean THEN k.cnt ELSE 0 END){sep}
UNION ALL
{end}) b
) h
UNION ALL
SELECT j.lkey, j.id, j.priority, true
-- OFFSET 0: a probe of each key's slots, never a scan of the queue's.
  FROM (SELECT ARRAY(SELECT x.job_id FROM unnest($2::text[]) AS k(lkey)
                      CROSS JOIN LATERAL (SELECT s.job_id FROM {p}key_slots s
                                           WHERE s.queue = $1 AND s.lkey = k.lkey AND s.n >= 0
                                             AND s.job_id IS NOT NULL AND s.fence IS NULL OFFSET 0) x
                     WHERE $5::boolean) AS ids) kept
 CROSS JOIN LATERAL (
{each}SELECT lkey, id, priority FROM {src} WHERE id = ANY (kept.ids) AND queue = $1{sep}
UNION ALL
{end}) j

-- name: seg_claim_ids
-- The keyed claim's move of exactly the jobs $2 of queue $1 (chosen by
-- seg_key_pick under the key slots the claim's transaction holds) from
-- the live ready segments to the current running segment, as seg_claim
-- moves its jobs: locked (SKIP LOCKED), deleted by ctid, inserted with
-- the lease $3 and worker $4, the same fence, the same guard's refusal.
WITH
async AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true),
           (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint + 128) * 17592186044416
             + (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS floor
),
{each}c{i} AS (
    SELECT ctid AS c FROM {src}
     WHERE id = ANY ($2::bigint[]) AND queue = $1 AND {guard}
     FOR UPDATE SKIP LOCKED
),
{sep}{end}
{each}d{i} AS (DELETE FROM {src} r WHERE r.ctid = ANY (ARRAY(SELECT c FROM c{i})) RETURNING r.*),
{sep}{end}
ins AS (
    INSERT INTO {running} ({cols})
    SELECT pos, id, queue, kind, args, 'running', priority, attempt + 1, max_attempts, timeout_ms,
           scheduled_at, created_at, now(), NULL, now() + $3::bigint * interval '1 microsecond', $4,
           errors, greatest(fence + 1, async.floor),
           unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d, async
    RETURNING id, kind, args, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at,
              attempted_at, lease_expires_at, errors, fence, meta, lkey, pos
)
SELECT id, kind, args, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at,
       attempted_at, lease_expires_at, errors, fence, meta, lkey, pos
FROM ins
UNION ALL
SELECT -1, '', '{}'::json, 0, 0, 0, 0, now(), now(), now(), now(), '[]'::jsonb, 0, NULL::jsonb, NULL::text, 0
 WHERE NOT ({guard})
ORDER BY priority, pos

-- name: seg_key_held
-- LimitUsage's KeyHeld: per queue with key limits, its jobs with a key in
-- the live ready segments whose key has no slot open for them (every
-- slot below the limit held by another job: running, or kept for an
-- ordered key's retry), or whose key's rate window is full (as many rate
-- slots stamped within the period as the rate); each job once.
SELECT j.queue, count(*) FROM (
{each}SELECT queue, lkey, id FROM {src} WHERE lkey IS NOT NULL{sep}
UNION ALL
{end}) j
JOIN {p}queues q ON q.name = j.queue AND (q.key_max_running IS NOT NULL OR q.key_rate IS NOT NULL)
WHERE (q.key_max_running IS NOT NULL
       AND (SELECT count(*) FROM {p}key_slots s
             WHERE s.queue = j.queue AND s.lkey = j.lkey AND s.n >= 0 AND s.n < q.key_max_running
               AND s.job_id IS NOT NULL AND s.job_id <> j.id) >= q.key_max_running)
   OR (q.key_rate IS NOT NULL
       AND (SELECT count(*) FROM {p}key_slots s
             WHERE s.queue = j.queue AND s.lkey = j.lkey AND s.n < 0 AND s.n >= -q.key_rate
               AND s.used_at > now() - q.key_rate_period_us * interval '1 microsecond') >= q.key_rate)
GROUP BY j.queue

-- name: seg_sweep_kept
-- Rescue's sweep of the key slots kept for ordered keys' retries (fence
-- NULL): frees those whose job is in none of the live ready and waiting
-- segments (the statement's sources) any more (cancelled, discarded,
-- completed after a retry by hand, deleted), re-checked on the slot's
-- latest version, and wakes their queues. $1 the live ready and waiting
-- segments the statement was built for, as "tbl:inc" joined by "," in
-- byte order: the statement's snapshot of the registry must name exactly
-- them (the first column says whether it did), else it frees nothing,
-- since a segment it does not read (a rotation and reclaim since the
-- view was read) may hold the job (as seg_sweep_slots).
WITH
reg AS MATERIALIZED (
    SELECT coalesce(string_agg(tbl || ':' || inc, ',' ORDER BY tbl COLLATE "C"), '') = $1 AS same
      FROM {p}segments WHERE phase IN ('ready', 'waiting') AND status IN ('current', 'sealed')
),
c AS MATERIALIZED (
    SELECT s.queue, s.lkey, s.n, s.job_id FROM {p}key_slots s
     WHERE s.job_id IS NOT NULL AND s.fence IS NULL AND (SELECT same FROM reg)
       AND NOT EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = s.job_id{sep}
UNION ALL
{end})
),
fr AS (
    UPDATE {p}key_slots s SET job_id = NULL
      FROM c
     WHERE s.queue = c.queue AND s.lkey = c.lkey AND s.n = c.n AND s.job_id = c.job_id AND s.fence IS NULL
    RETURNING s.queue
),
woke AS (SELECT pg_notify('{p}wake', f.queue) FROM (SELECT DISTINCT queue FROM fr) f)
SELECT (SELECT same FROM reg), (SELECT count(*) FROM fr), (SELECT count(*) FROM woke)

-- name: seg_has_ready
-- Whether a job of queue $1 is available in a live ready segment: a
-- limited claim that took nothing tells so whether its limits held a
-- job back.
SELECT EXISTS (
{each}SELECT 1 FROM {src} WHERE queue = $1{sep}
UNION ALL
{end})

-- name: seg_sweep_slots
-- Rescue's sweep of the queue limit slots. $1 the live running segments
-- the statement was built for, as "tbl:inc" joined by "," in byte order:
-- the statement's snapshot of the registry must name exactly them (the
-- first column says whether it did), else it frees nothing, since a
-- running segment it does not read would make it free a slot whose
-- holder runs there. Frees every slot whose holder is not running under
-- the slot's fence in those segments (an attempt that ended by a path
-- that did not free it: a statement of an earlier version), re-checking
-- job_id and fence on the slot's latest version so that a slot taken
-- meanwhile stays taken, and wakes their queues; gives back the slots of
-- blocks (driver.SlotLeaser) whose lease expired and whose owner has no
-- job of the slot's queue running in those segments (re-checking the
-- lease on the slot's latest version, so that a block renewed meanwhile
-- stays), and wakes their queues; deletes the free concurrency slots at
-- or above their queue's limit (left held by a lowered limit, or leased),
-- or of a queue without one.
WITH
reg AS MATERIALIZED (
    SELECT coalesce(string_agg(tbl || ':' || inc, ',' ORDER BY tbl COLLATE "C"), '') = $1 AS same
      FROM {p}segments WHERE phase = 'running' AND status IN ('current', 'sealed')
),
c AS MATERIALIZED (
    SELECT s.queue, s.type, s.lkey, s.n, s.job_id, s.fence FROM {p}limit_slots s
     WHERE s.job_id IS NOT NULL AND (SELECT same FROM reg)
       AND NOT EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = s.job_id AND r.fence = s.fence{sep}
UNION ALL
{end})
),
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM c
     WHERE s.queue = c.queue AND s.type = c.type AND s.lkey = c.lkey AND s.n = c.n
       AND s.job_id = c.job_id AND s.fence = c.fence
    RETURNING s.queue
),
-- (Slots an owner's LeaseSlots has locked are skipped: it is renewing
-- or giving them back, and the sweep never waits for it.)
bc AS MATERIALIZED (
    SELECT s.queue, s.n FROM {p}limit_slots s
     WHERE s.type = 'c' AND s.lkey = '' AND s.owner IS NOT NULL AND s.owner_until < now() AND (SELECT same FROM reg)
       AND NOT EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.queue = s.queue AND r.attempted_by = s.owner{sep}
UNION ALL
{end})
     FOR UPDATE OF s SKIP LOCKED
),
bf AS (
    UPDATE {p}limit_slots s SET owner = NULL, owner_until = NULL
      FROM bc
     WHERE s.queue = bc.queue AND s.type = 'c' AND s.lkey = '' AND s.n = bc.n
       AND s.owner IS NOT NULL AND s.owner_until < now()
    RETURNING s.queue
),
del AS (
    DELETE FROM {p}limit_slots s
     WHERE s.type = 'c' AND s.job_id IS NULL AND s.owner IS NULL
       AND s.n >= coalesce((SELECT q.max_running FROM {p}queues q WHERE q.name = s.queue), 0)
),
-- Key slots the same way: held ones whose attempt is not running under
-- their fence are freed; free ones unused for a minute, at or above
-- their queue's KeyMaxRunning, or of a queue without key limits, are
-- deleted (claims make them again when they need them). Rate slots
-- (negative n, never held) are deleted unless their queue has a rate per
-- key and they were stamped within the longer of its period and a
-- minute: a slot stamped within the period stays, beyond a lowered rate
-- too (claims ignore it), so that the rate raised again within the
-- window counts its start.
kc AS MATERIALIZED (
    SELECT s.queue, s.lkey, s.n, s.job_id, s.fence FROM {p}key_slots s
     WHERE s.fence IS NOT NULL AND (SELECT same FROM reg)
       AND NOT EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = s.job_id AND r.fence = s.fence{sep}
UNION ALL
{end})
),
kfr AS (
    UPDATE {p}key_slots s SET job_id = NULL, fence = NULL
      FROM kc
     WHERE s.queue = kc.queue AND s.lkey = kc.lkey AND s.n = kc.n
       AND s.job_id = kc.job_id AND s.fence = kc.fence
    RETURNING s.queue
),
kdel AS (
    DELETE FROM {p}key_slots s
     WHERE s.job_id IS NULL
       AND ((s.n >= 0
             AND (s.used_at < now() - interval '1 minute'
                  OR s.n >= coalesce((SELECT q.key_max_running FROM {p}queues q WHERE q.name = s.queue), 0)))
            OR (s.n < 0
                AND NOT EXISTS (
                    SELECT 1 FROM {p}queues q
                     WHERE q.name = s.queue AND q.key_rate > 0
                       AND s.used_at >= now() - greatest(q.key_rate_period_us * interval '1 microsecond',
                                                         interval '1 minute'))))
),
woke AS (SELECT pg_notify('{p}wake', f.queue) FROM (SELECT queue FROM fr UNION SELECT queue FROM kfr UNION SELECT queue FROM bf) f)
SELECT (SELECT same FROM reg), (SELECT count(*) FROM fr) + (SELECT count(*) FROM kfr) + (SELECT count(*) FROM bf),
       (SELECT count(*) FROM woke)

-- name: seg_guard
-- Whether the current segments a statement inserts into are still the
-- incarnations this process knows.
SELECT {guard}

-- name: seg_complete
-- Outcomes fenced by (id, fence), looked up in every live running
-- segment: completed to done, retryable and snoozed (scheduled) to
-- waiting, discarded and cancelled to dead. A job leaving the states of
-- its unique key frees it. $6 and $7 are the ids and results of the
-- outcomes that carry one (empty arrays for none): stored in rs for the
-- jobs the statement completed, so that a stale attempt's result is
-- refused with its outcome.
--
-- The running segments are read through m, the batch as a map keyed by
-- 'id:fence' within the batch's range of ids, never joined with the
-- batch: a running segment is emptied and filled again all day, and the
-- statistics of one analyzed while empty (by autovacuum, between two
-- bursts) say it holds no row. A generic plan made with them joined the
-- segment's every row to every outcome (rows x batch: 9 million pairs,
-- 1.7-3.4 s for a batch of 2,000 against 4,500 running jobs, during which
-- no outcome of the process was written). A scan of the id range with a
-- lookup in the map is linear in the rows it reads, whatever the plan.
-- The same holds for seg_complete_done, seg_heartbeat and seg_release,
-- and for the rows seg_rescue and seg_promote lock (m{i}).
WITH o AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])
             AS o(id, fence, state, retry_us, err)
),
m AS (
    SELECT min(id) AS lo, max(id) AS hi,
           jsonb_object_agg(id || ':' || fence, jsonb_build_array(state, retry_us, err)) AS f
      FROM o
),
{each}d{i} AS (
    DELETE FROM {src} r
     WHERE r.id BETWEEN (SELECT lo FROM m) AND (SELECT hi FROM m)
       AND (SELECT f FROM m) ? (r.id || ':' || r.fence) AND {guard}
    RETURNING r.*, (SELECT f FROM m) -> (r.id || ':' || r.fence) ->> 0 AS nstate,
              ((SELECT f FROM m) -> (r.id || ':' || r.fence) ->> 1)::bigint AS retry_us,
              (SELECT f FROM m) -> (r.id || ':' || r.fence) ->> 2 AS err
),
{sep}{end}
x AS (
    SELECT pos, id, queue, kind, args, nstate AS state, priority,
           CASE WHEN nstate = 'scheduled' THEN attempt - 1 ELSE attempt END AS attempt,
           max_attempts, timeout_ms,
           CASE WHEN nstate IN ('retryable', 'scheduled')
                THEN now() + retry_us * interval '1 microsecond' ELSE scheduled_at END AS scheduled_at,
           created_at, attempted_at,
           CASE WHEN nstate IN ('retryable', 'scheduled') THEN NULL ELSE now() END AS finalized_at,
           NULL::timestamptz AS lease_expires_at, attempted_by,
           CASE WHEN err = '' THEN errors ELSE errors || jsonb_build_array(err::jsonb) END AS errors,
           fence, unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
),
iw AS (INSERT INTO {waiting} ({cols}) SELECT {cols} FROM x WHERE state IN ('retryable', 'scheduled')),
idn AS (INSERT INTO {done} ({cols}) SELECT {cols} FROM x WHERE state = 'completed'),
idd AS (INSERT INTO {dead} ({cols}) SELECT {cols} FROM x WHERE state IN ('discarded', 'cancelled')),
uk AS (
    DELETE FROM {p}unique_keys k USING x
     WHERE x.unique_key IS NOT NULL AND k.key = x.unique_key AND k.job_id = x.id
       AND NOT ((x.state = 'completed' AND (x.unique_keep & 1) <> 0)
             OR (x.state = 'discarded' AND (x.unique_keep & 2) <> 0)
             OR (x.state = 'cancelled' AND (x.unique_keep & 4) <> 0)
             OR x.state IN ('retryable', 'scheduled'))
),
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM x
     WHERE s.job_id = x.id AND s.fence = x.fence
       AND EXISTS (SELECT 1 FROM {p}limit_slots WHERE job_id IS NOT NULL)
    RETURNING s.queue
),
-- The key slot of each attempt with a key (see the top of this file); an
-- ordered queue without move-on keeps it for a job that waits for its
-- retry or was snoozed (fence NULL, job_id kept).
kf AS (
    UPDATE {p}key_slots s
       SET fence = NULL,
           job_id = CASE WHEN x.state IN ('retryable', 'scheduled')
                          AND (SELECT q.key_order FROM {p}queues q WHERE q.name = x.queue) = 1
                         THEN s.job_id END
      FROM x
     WHERE x.lkey IS NOT NULL AND s.queue = x.queue AND s.lkey = x.lkey AND s.job_id = x.id AND s.fence = x.fence
       AND EXISTS (SELECT 1 FROM x WHERE lkey IS NOT NULL)
    RETURNING s.queue
),
rs AS (
    INSERT INTO {p}job_results (job_id, fence, result)
    SELECT x.id, x.fence, r.result::json
      FROM unnest($6::bigint[], $7::text[]) AS r(id, result) JOIN x ON x.id = r.id
     WHERE x.state = 'completed'
    ON CONFLICT (job_id) DO UPDATE
       SET fence = excluded.fence, result = excluded.result, stored_at = excluded.stored_at
),
woke AS (SELECT pg_notify('{p}wake', f.queue) FROM (SELECT queue FROM fr UNION SELECT queue FROM kf) f)
SELECT id FROM x WHERE (SELECT count(*) FROM woke) >= 0
UNION ALL SELECT -1 WHERE NOT ({guard})

-- name: seg_complete_done
-- seg_complete for a batch of outcomes that are all completed without an
-- error (a drain's every batch): each job moves from its running segment
-- straight into the current done segment, without the rows of every kind
-- of outcome that seg_complete computes and keeps (x), a third of its
-- cost. The same fence, guard, columns and unique-key rule as there; $3
-- and $4 are seg_complete's $6 and $7 (results).
WITH m AS (
    SELECT min(id) AS lo, max(id) AS hi, jsonb_object_agg(id || ':' || fence, true) AS f
      FROM unnest($1::bigint[], $2::bigint[]) AS o(id, fence)
),
{each}d{i} AS (
    DELETE FROM {src} r
     WHERE r.id BETWEEN (SELECT lo FROM m) AND (SELECT hi FROM m)
       AND (SELECT f FROM m) ? (r.id || ':' || r.fence) AND {guard}
    RETURNING r.*
),
{sep}{end}
idn AS (
    INSERT INTO {done} ({cols})
    SELECT pos, id, queue, kind, args, 'completed', priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, now(), NULL, attempted_by, errors,
           fence, unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
    RETURNING id, fence, unique_key, unique_keep, queue, lkey
),
uk AS (
    DELETE FROM {p}unique_keys k USING idn
     WHERE idn.unique_key IS NOT NULL AND k.key = idn.unique_key AND k.job_id = idn.id
       AND (idn.unique_keep & 1) = 0
),
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM idn
     WHERE s.job_id = idn.id AND s.fence = idn.fence
       AND EXISTS (SELECT 1 FROM {p}limit_slots WHERE job_id IS NOT NULL)
    RETURNING s.queue
),
kf AS (
    UPDATE {p}key_slots s SET job_id = NULL, fence = NULL
      FROM idn
     WHERE idn.lkey IS NOT NULL AND s.queue = idn.queue AND s.lkey = idn.lkey
       AND s.job_id = idn.id AND s.fence = idn.fence
       AND EXISTS (SELECT 1 FROM idn WHERE lkey IS NOT NULL)
    RETURNING s.queue
),
rs AS (
    INSERT INTO {p}job_results (job_id, fence, result)
    SELECT idn.id, idn.fence, r.result::json
      FROM unnest($3::bigint[], $4::text[]) AS r(id, result) JOIN idn ON idn.id = r.id
    ON CONFLICT (job_id) DO UPDATE
       SET fence = excluded.fence, result = excluded.result, stored_at = excluded.stored_at
),
woke AS (SELECT pg_notify('{p}wake', f.queue) FROM (SELECT queue FROM fr UNION SELECT queue FROM kf) f)
SELECT id FROM idn WHERE (SELECT count(*) FROM woke) >= 0
UNION ALL SELECT -1 WHERE NOT ({guard})

-- name: seg_heartbeat
-- In place, in whichever live running segment holds the job. No index
-- covers lease_expires_at, so the update is HOT when the page has room.
WITH m AS (
    SELECT min(id) AS lo, max(id) AS hi, jsonb_object_agg(id || ':' || fence, true) AS f
      FROM unnest($1::bigint[], $2::bigint[]) AS l(id, fence)
),
{each}u{i} AS (
    UPDATE {src} j
    SET lease_expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
    WHERE j.id BETWEEN (SELECT lo FROM m) AND (SELECT hi FROM m)
      AND (SELECT f FROM m) ? (j.id || ':' || j.fence)
    RETURNING j.id
){sep},
{end}
{each}SELECT id FROM u{i}{sep} UNION ALL {end}

-- name: seg_release
-- Running attempts back to ready (at the back of their priority), the
-- attempt given back, the fence kept; wakes their queues.
WITH m AS (
    SELECT min(id) AS lo, max(id) AS hi, jsonb_object_agg(id || ':' || fence, true) AS f
      FROM unnest($1::bigint[], $2::bigint[]) AS l(id, fence)
),
{each}d{i} AS (
    DELETE FROM {src} r
     WHERE r.id BETWEEN (SELECT lo FROM m) AND (SELECT hi FROM m)
       AND (SELECT f FROM m) ? (r.id || ':' || r.fence) AND {guard}
    RETURNING r.*
),
{sep}{end}
ins AS (
    INSERT INTO {ready} ({cols})
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, attempt - 1, max_attempts,
           timeout_ms, scheduled_at, created_at, attempted_at, NULL, NULL, NULL, errors, fence,
           unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
    RETURNING id, fence, queue, lkey
),
-- The released jobs' queues are woken whether a slot was freed or not.
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM ins
     WHERE s.job_id = ins.id AND s.fence = ins.fence
       AND EXISTS (SELECT 1 FROM {p}limit_slots WHERE job_id IS NOT NULL)
),
kf AS (
    UPDATE {p}key_slots s SET job_id = NULL, fence = NULL
      FROM ins
     WHERE ins.lkey IS NOT NULL AND s.queue = ins.queue AND s.lkey = ins.lkey
       AND s.job_id = ins.id AND s.fence = ins.fence
       AND EXISTS (SELECT 1 FROM ins WHERE lkey IS NOT NULL)
),
q AS (SELECT queue, count(*) AS n FROM ins GROUP BY queue),
woke AS (SELECT pg_notify('{p}wake', queue) FROM q)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w
UNION ALL SELECT '!stale', 0 WHERE NOT ({guard})

-- name: seg_rescue
-- Running jobs whose lease expired: back to ready, or to dead when out of
-- attempts, with the lost attempt recorded. FOR UPDATE SKIP LOCKED passes
-- over rows a heartbeat is renewing right now, and the delete re-checks
-- the lease on the latest version.
WITH
{each}p{i} AS (
    SELECT id AS c FROM {src}
     WHERE lease_expires_at < now() AND {guard}
     ORDER BY lease_expires_at
     LIMIT $1
     FOR UPDATE SKIP LOCKED
),
m{i} AS (SELECT min(c) AS lo, max(c) AS hi, jsonb_object_agg(c, true) AS f FROM p{i}),
d{i} AS (
    DELETE FROM {src} r
     WHERE r.id BETWEEN (SELECT lo FROM m{i}) AND (SELECT hi FROM m{i})
       AND (SELECT f FROM m{i}) ? r.id::text AND r.lease_expires_at < now()
    RETURNING r.*
),
{sep}{end}
x AS (
    SELECT pos, id, queue, kind, args,
           CASE WHEN attempt >= max_attempts THEN 'discarded' ELSE 'available' END AS state,
           priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at, attempted_at,
           CASE WHEN attempt >= max_attempts THEN now() END AS finalized_at,
           NULL::timestamptz AS lease_expires_at, attempted_by,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempt,
               'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'error', 'lease expired: ' || coalesce(attempted_by, '') || ' stopped heartbeating')) AS errors,
           fence, unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
),
ir AS (
    INSERT INTO {ready} ({cols})
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, lkey
    FROM x WHERE state = 'available'
),
idd AS (INSERT INTO {dead} ({cols}) SELECT {cols} FROM x WHERE state = 'discarded'),
uk AS (
    DELETE FROM {p}unique_keys k USING x
     WHERE x.state = 'discarded' AND x.unique_key IS NOT NULL AND k.key = x.unique_key AND k.job_id = x.id
       AND (x.unique_keep & 2) = 0
),
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM x
     WHERE s.job_id = x.id AND s.fence = x.fence
       AND EXISTS (SELECT 1 FROM {p}limit_slots WHERE job_id IS NOT NULL)
    RETURNING s.queue
),
kf AS (
    UPDATE {p}key_slots s SET job_id = NULL, fence = NULL
      FROM x
     WHERE x.lkey IS NOT NULL AND s.queue = x.queue AND s.lkey = x.lkey AND s.job_id = x.id AND s.fence = x.fence
       AND EXISTS (SELECT 1 FROM x WHERE lkey IS NOT NULL)
    RETURNING s.queue
),
q AS (SELECT queue, count(*) AS n, bool_or(state = 'available') AS wake FROM x GROUP BY queue),
woke AS (
    SELECT pg_notify('{p}wake', w.queue)
      FROM (SELECT queue FROM q WHERE wake UNION SELECT queue FROM fr UNION SELECT queue FROM kf) w
)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w
UNION ALL SELECT '!stale', 0 WHERE NOT ({guard})

-- name: seg_promote
-- Due scheduled and retryable jobs to ready; wakes their queues.
WITH
{each}p{i} AS (
    SELECT id AS c FROM {src}
     WHERE scheduled_at <= now() AND {guard}
     ORDER BY scheduled_at
     LIMIT $1
     FOR UPDATE SKIP LOCKED
),
m{i} AS (SELECT min(c) AS lo, max(c) AS hi, jsonb_object_agg(c, true) AS f FROM p{i}),
d{i} AS (
    DELETE FROM {src} r
     WHERE r.id BETWEEN (SELECT lo FROM m{i}) AND (SELECT hi FROM m{i})
       AND (SELECT f FROM m{i}) ? r.id::text
    RETURNING r.*
),
{sep}{end}
ins AS (
    INSERT INTO {ready} ({cols})
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, NULL, NULL, attempted_by, errors, fence,
           unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
    RETURNING queue
),
q AS (SELECT queue, count(*) AS n FROM ins GROUP BY queue),
woke AS (SELECT pg_notify('{p}wake', queue) FROM q)
SELECT q.queue, q.n FROM q CROSS JOIN (SELECT count(*) FROM woke) w
UNION ALL SELECT '!stale', 0 WHERE NOT ({guard})

-- name: seg_claim_job
-- One job by id from any ready or waiting segment, claimed as seg_claim
-- claims. A row a claim has locked is waited for; once that claim commits
-- the row is gone and nothing moves here. The fence as in seg_claim.
WITH
f AS MATERIALIZED (
    SELECT (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint + 128) * 17592186044416
             + (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS floor
),
{each}d{i} AS (DELETE FROM {src} r WHERE r.id = $1 AND {guard} RETURNING r.*),
{sep}{end}
ins AS (
    INSERT INTO {running} ({cols})
    SELECT pos, id, queue, kind, args, 'running', priority, attempt + 1, max_attempts, timeout_ms,
           scheduled_at, created_at, now(), NULL, now() + $2::bigint * interval '1 microsecond', $3,
           errors, greatest(fence + 1, f.floor),
           unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d, f
    RETURNING {jobcols}
)
SELECT {jobcols} FROM ins

-- name: seg_ready_batches
-- Batches without a callback yet none of whose members is in a live
-- ready, running or waiting segment (the statement's sources): every
-- member has finished, or Prune deleted it. Oldest first, $1 at most,
-- with ids past $2. Each open batch's members are probed by id, up to
-- the first unfinished one.
SELECT b.id, b.callback FROM {p}batches b
 WHERE b.callback_id IS NULL AND b.id > $2
   AND NOT EXISTS (
       SELECT 1 FROM {p}batch_jobs m
        WHERE m.batch_id = b.id AND EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = m.job_id{sep}
UNION ALL
{end}))
   AND NOT EXISTS (
       SELECT 1 FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
        WHERE d.batch_id = b.id AND (p.callback_id IS NULL OR EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = p.callback_id{sep}
UNION ALL
{end})))
 ORDER BY b.id LIMIT $1

-- name: seg_lock_batch
-- The first statement of a batch's firing: locks FOR SHARE the rows of
-- batch $1's members, and of the callbacks of the batches it waits for,
-- that are in a live done or dead segment (the statement's sources). A
-- retry by hand deletes the job's row from its finished segment: one
-- that did so first, uncommitted, is waited for (its row is then gone,
-- and seg_batch_ready, a statement begun after this one, sees the job in
-- ready); one that comes later waits for the firing's commit. Returns
-- the number of rows locked.
WITH ids AS (
    SELECT m.job_id AS id FROM {p}batch_jobs m WHERE m.batch_id = $1
    UNION ALL
    SELECT p.callback_id FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
     WHERE d.batch_id = $1 AND p.callback_id IS NOT NULL
),
{each}l{i} AS (SELECT r.id FROM {src} r WHERE r.id IN (SELECT id FROM ids) FOR SHARE OF r){sep},
{end}
SELECT {each}(SELECT count(*) FROM l{i}){sep} + {end}

-- name: seg_batch_ready
-- Batch $1 as seg_ready_batches reads it (the statement's sources are
-- the live ready, running and waiting segments): a row while it has no
-- callback yet and none of its members, nor of the callbacks of the
-- batches it waits for, is unfinished. Read in the firing's transaction
-- after seg_lock_batch.
SELECT 1 FROM {p}batches b
 WHERE b.id = $1 AND b.callback_id IS NULL
   AND NOT EXISTS (
       SELECT 1 FROM {p}batch_jobs m
        WHERE m.batch_id = b.id AND EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = m.job_id{sep}
UNION ALL
{end}))
   AND NOT EXISTS (
       SELECT 1 FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
        WHERE d.batch_id = b.id AND (p.callback_id IS NULL OR EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = p.callback_id{sep}
UNION ALL
{end})))

-- name: seg_prunable_batches
-- $1 age in microseconds, $2 limit: batches fired that long ago whose
-- callback is in no live ready, running or waiting segment (the
-- statement's sources: it has finished, or Prune deleted it; it reads
-- its batch when it runs) and that no kept batch waits for (a workflow's
-- step is kept while the batch of a later step is: that batch reads it
-- to know whether it may fire, and lists its callback among its jobs).
SELECT f.id FROM {p}batches f
 WHERE f.fired_at IS NOT NULL AND f.fired_at < now() - $1::bigint * interval '1 microsecond'
   AND NOT EXISTS (SELECT 1 FROM {p}batch_deps w WHERE w.dep_batch_id = f.id)
   AND NOT EXISTS (
{each}SELECT 1 FROM {src} r WHERE r.id = f.callback_id{sep}
UNION ALL
{end})
 ORDER BY f.fired_at LIMIT $2

-- name: seg_batch_members
-- Every member's state (from every live segment, by id) and, when
-- completed under the fence its result was stored with, its result.
SELECT m.job_id, coalesce(r.state, ''), res.result::text
  FROM (SELECT job_id FROM {p}batch_jobs WHERE batch_id = $1
        UNION ALL
        SELECT p.callback_id FROM {p}batch_deps d JOIN {p}batches p ON p.id = d.dep_batch_id
         WHERE d.batch_id = $1 AND p.callback_id IS NOT NULL) m
  LEFT JOIN LATERAL (
{each}SELECT state, fence FROM {src} WHERE id = m.job_id{sep}
UNION ALL
{end}
LIMIT 1) r ON true
  LEFT JOIN {p}job_results res ON res.job_id = m.job_id AND res.fence = r.fence AND r.state = 'completed'
 ORDER BY m.job_id

-- name: seg_get_job
{each}SELECT {jobcols} FROM {src} WHERE id = $1{sep}
UNION ALL
{end}
LIMIT 1

-- name: seg_list_jobs
-- A merge of per-segment index scans in id order. listQuery fills in
-- {queue} and {kind}: "queue = $3" when the list is filtered by queue,
-- so that the planner can read the (queue, id) index of a finished
-- segment, else "$3 = ''" (true); the same for kind, and for {before}
-- ("id < $6" or "$6 = 0").
SELECT {jobcols} FROM (
{each}(SELECT {jobcols} FROM {src}
  WHERE id > $1
    AND (cardinality($2::text[]) = 0 OR state = ANY($2::text[]))
    AND {queue}
    AND {kind}
    AND {before}
  ORDER BY id LIMIT $5){sep}
UNION ALL
{end}) j
ORDER BY id
LIMIT $5

-- name: seg_list_jobs_desc
-- seg_list_jobs newest first: the same scans, backwards.
SELECT {jobcols} FROM (
{each}(SELECT {jobcols} FROM {src}
  WHERE id > $1
    AND (cardinality($2::text[]) = 0 OR state = ANY($2::text[]))
    AND {queue}
    AND {kind}
    AND {before}
  ORDER BY id DESC LIMIT $5){sep}
UNION ALL
{end}) j
ORDER BY id DESC
LIMIT $5

-- name: seg_retry
-- A discarded, cancelled, completed, retryable or scheduled job to ready,
-- now, with one more attempt if all were used. A unique job that does not
-- hold its key (it finished in a state that freed it) takes it again: if
-- another job took it meanwhile, the insert fails (unique_violation) and
-- the whole statement with it, which Retry reports as a conflict. Wakes
-- its queue.
WITH
{each}d{i} AS (
    DELETE FROM {src} r WHERE r.id = $1 AND {guard}
       AND r.state IN ('discarded', 'cancelled', 'retryable', 'scheduled', 'completed')
    RETURNING r.*, '{src}'::text AS src
),
{sep}{end}
-- A done or dead segment the job left no longer matches its recorded
-- counts (see seg_counts_lock): cleared whether recorded or not, so that
-- the registry row's lock is always taken. A retry out of a finished
-- segment thus leaves one dead registry row version.
inv AS (
    UPDATE {p}segments g SET counts = NULL
      FROM ({each}SELECT src FROM d{i}{sep} UNION ALL {end}) d
     WHERE g.tbl = d.src AND g.phase IN ('done', 'dead')
),
ins AS (
    INSERT INTO {ready} ({cols})
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, 'available', priority, attempt,
           greatest(max_attempts, attempt + 1), timeout_ms, now(), created_at, attempted_at, NULL, NULL,
           attempted_by, errors, fence, unique_key, unique_keep, meta, lkey
    FROM ({each}SELECT * FROM d{i}{sep} UNION ALL {end}) d
    RETURNING {jobcols}, unique_key
),
uk AS (
    INSERT INTO {p}unique_keys (key, job_id)
    SELECT unique_key, id FROM ins
     WHERE unique_key IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM {p}unique_keys h WHERE h.key = ins.unique_key AND h.job_id = ins.id)
),
woke AS (SELECT pg_notify('{p}wake', queue) FROM ins)
SELECT {jobcols} FROM ins CROSS JOIN (SELECT count(*) FROM woke) w

-- name: seg_finish
-- Cancel or discard ($2) a job that has not finished, from any ready,
-- waiting or running segment, into dead. When it was running, every
-- process is told ('!cancel'), and its attempt's limit slot is freed.
WITH
{each}d{i} AS (DELETE FROM {src} r WHERE r.id = $1 AND {guard} RETURNING r.*),
{sep}{end}
d AS ({each}SELECT * FROM d{i}{sep} UNION ALL {end}),
ins AS (
    INSERT INTO {dead} ({cols})
    SELECT pos, id, queue, kind, args, $2::text, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, now(), NULL, attempted_by, errors, fence,
           unique_key, unique_keep, meta, lkey
    FROM d
    RETURNING {jobcols}
),
uk AS (
    DELETE FROM {p}unique_keys k USING d
     WHERE d.unique_key IS NOT NULL AND k.key = d.unique_key AND k.job_id = d.id
       AND NOT (($2::text = 'discarded' AND (d.unique_keep & 2) <> 0)
             OR ($2::text = 'cancelled' AND (d.unique_keep & 4) <> 0))
),
fr AS (
    UPDATE {p}limit_slots s SET job_id = NULL, fence = NULL
      FROM d
     WHERE d.state = 'running' AND s.job_id = d.id AND s.fence = d.fence
       AND EXISTS (SELECT 1 FROM {p}limit_slots WHERE job_id IS NOT NULL)
    RETURNING s.queue
),
-- A running job's key slot, or the slot an ordered key keeps for a job
-- waiting for its retry (or made available again by hand).
kf AS (
    UPDATE {p}key_slots s SET job_id = NULL, fence = NULL
      FROM d
     WHERE d.lkey IS NOT NULL AND s.queue = d.queue AND s.lkey = d.lkey AND s.job_id = d.id
       AND ((d.state = 'running' AND s.fence = d.fence)
            OR (d.state <> 'running' AND s.fence IS NULL))
    RETURNING s.queue
),
woke AS (
    SELECT pg_notify('{p}wake', '!cancel') FROM d WHERE d.state = 'running'
    UNION ALL
    SELECT pg_notify('{p}wake', f.queue) FROM (SELECT queue FROM fr UNION SELECT queue FROM kf) f
)
SELECT {jobcols} FROM ins CROSS JOIN (SELECT count(*) FROM woke) w

-- name: seg_stats
-- Every live segment is counted, except a sealed done or dead one whose
-- counts the leader recorded (seg_record_counts): those counts are read
-- from the registry instead. The test on the registry is uncorrelated, so
-- it runs once, before the segment's scan, which it skips. A by-hand retry
-- clears a segment's counts in the transaction that takes its job out
-- (seg_retry), so one snapshot sees either the counts or the rows. Counts
-- hold only on a sealed segment under the incarnation they were recorded
-- under (a process of an earlier version changes a status without
-- clearing them).
SELECT queue, state, sum(n)::bigint, coalesce(max(age), 0)::bigint FROM (
{each}SELECT queue, state, count(*) AS n,
       CASE WHEN state = 'available'
            THEN greatest(0, (extract(epoch FROM now() - min(scheduled_at)) * 1000000)::bigint)
            ELSE 0 END AS age
  FROM {src}
 WHERE NOT EXISTS (SELECT 1 FROM {p}segments WHERE tbl = '{src}' AND counts IS NOT NULL AND status = 'sealed' AND counts_inc = inc)
 GROUP BY queue, state{sep}
UNION ALL
{end}
UNION ALL
SELECT c.queue, c.state, c.n, 0
  FROM {p}segments g CROSS JOIN LATERAL jsonb_to_recordset(g.counts) AS c(queue text, state text, n bigint)
 WHERE g.counts IS NOT NULL AND g.status = 'sealed' AND g.counts_inc = g.inc AND g.tbl IN ({each}'{src}'{sep}, {end})
) s
GROUP BY queue, state
ORDER BY queue, state

-- name: seg_stats_serial
-- Stats without parallel workers: the planner sizes a sealed finished
-- segment's arm by its rows, not knowing that recorded counts skip its
-- scan, and starting the workers it plans for took 40-60 ms of a 60 ms
-- Stats over 1,000,000 counted jobs.
SET LOCAL max_parallel_workers_per_gather = 0

-- name: seg_overview
-- $1 finishedSince: the unfinished jobs of the segments given (every live
-- ready, running and waiting one) and the jobs finished at or after $1 of
-- the done and dead segments given (only those that may hold one: see
-- overviewQuery). Columns as for seg_stats.
SELECT queue, state, sum(n)::bigint, coalesce(max(age), 0)::bigint FROM (
{each}SELECT queue, state, count(*) AS n,
       CASE WHEN state = 'available'
            THEN greatest(0, (extract(epoch FROM now() - min(scheduled_at)) * 1000000)::bigint)
            ELSE 0 END AS age
  FROM {src}
 WHERE state NOT IN ('completed', 'discarded', 'cancelled') OR finalized_at >= $1
 GROUP BY queue, state{sep}
UNION ALL
{end}) s
GROUP BY queue, state
ORDER BY queue, state

-- name: seg_maint_lock
-- One maintainer at a time per prefix, for the transaction.
SELECT pg_try_advisory_xact_lock(hashtextextended('conveyor-segments:' || $1::text, 0))

-- name: seg_registry_all
-- $1 grace, $2 late writes, in microseconds. The last column: a sealed
-- done or dead segment past its late writes whose counts are unknown.
SELECT tbl, phase, status, inc, coalesce(sealed_at < now() - $1::bigint * interval '1 microsecond', false),
       status = 'sealed' AND phase IN ('done', 'dead') AND (counts IS NULL OR counts_inc IS DISTINCT FROM inc)
         AND coalesce(sealed_at < now() - $2::bigint * interval '1 microsecond', false)
  FROM {p}segments ORDER BY phase, ord

-- name: seg_current
-- $1 phase: its current segment, in the maintainer's transaction.
SELECT tbl FROM {p}segments WHERE phase = $1 AND status = 'current'

-- name: seg_free
-- $1 phase: its oldest free table and that table's incarnation.
SELECT tbl, inc FROM {p}segments WHERE phase = $1 AND status = 'free' ORDER BY ord LIMIT 1

-- name: seg_inc
SELECT inc FROM {p}segments WHERE tbl = $1

-- name: seg_still
-- $1 table, $2 status, $3 incarnation: whether the registry row a
-- maintenance step acts on is still as its round read it (before the
-- step took the maintenance lock: another process maintaining the prefix
-- meanwhile may have reclaimed the table and made it current again),
-- locked for the step. NOWAIT: a by-hand retry holding it, next round.
SELECT true FROM {p}segments WHERE tbl = $1 AND status = $2 AND inc = $3 FOR UPDATE NOWAIT

-- name: seg_new_name
SELECT nextval('{p}segments_n')

-- name: seg_register
INSERT INTO {p}segments (tbl, phase, status, inc, ord)
VALUES ($1, $2, $3, $4, nextval('{p}segments_n'))

-- name: seg_set_status
-- $1 table, $2 status, $3 incarnation. Becoming current moves it to the
-- end of its phase's order; being sealed records when.
UPDATE {p}segments
   SET status = $2, inc = $3, counts = NULL, counts_inc = NULL,
       ord = CASE WHEN $2 = 'current' THEN nextval('{p}segments_n') ELSE ord END,
       sealed_at = CASE WHEN $2 = 'sealed' THEN now() WHEN $2 = 'current' THEN NULL ELSE sealed_at END
 WHERE tbl = $1

-- name: seg_counts_lock
-- Before counting a sealed finished segment: its registry row, locked
-- until the counts are recorded, so that a by-hand retry's clearing of
-- the counts (seg_retry) waits for them and comes after.
SELECT status = 'sealed' AND (counts IS NULL OR counts_inc IS DISTINCT FROM inc)
  FROM {p}segments WHERE tbl = $1 FOR UPDATE

-- name: seg_record_counts
-- $2 the segment's new incarnation (seg_advance, drawn after the table's
-- SHARE lock): a writer whose view still takes the segment for current
-- fails its guard from now on and reads the registry again, so no late
-- write enters it after the count. Counted in a statement begun after the
-- locks: every retry that committed before is seen, and any later one
-- clears the counts after this transaction commits.
UPDATE {p}segments
   SET inc = $2, counts_inc = $2,
       counts = (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', queue, 'state', state, 'n', n)), '[]'::jsonb)
                   FROM (SELECT queue, state, count(*) AS n FROM {t} GROUP BY queue, state) c)
 WHERE tbl = $1

-- name: seg_unregister
DELETE FROM {p}segments WHERE tbl = $1

-- name: seg_size
SELECT pg_relation_size($1::regclass)

-- name: seg_lock_exclusive
LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE NOWAIT

-- name: seg_lock_share
-- Keeps writers out (they take ROW EXCLUSIVE) but not readers, so a held
-- snapshot that read the table does not refuse it.
LOCK TABLE {t} IN SHARE MODE NOWAIT

-- name: seg_rows
SELECT count(*) FROM (SELECT 1 FROM {t} LIMIT $1) s

-- name: seg_expired
-- Whether a finished segment's newest row is older than $1 microseconds.
SELECT coalesce(max(finalized_at) < now() - $1::bigint * interval '1 microsecond', true) FROM {t}

-- name: seg_oldest
-- Whether a finished segment holds a row older than $1 microseconds.
SELECT coalesce(min(finalized_at) < now() - $1::bigint * interval '1 microsecond', false) FROM {t}

-- name: seg_move
-- The leftovers of a segment being reclaimed, into the current segment
-- of its phase (under its ACCESS EXCLUSIVE lock: nothing else reads it).
INSERT INTO {dst} ({cols}) SELECT {cols} FROM {t}

-- name: seg_move_delete
-- The leftovers of a segment a snapshot still holds (SHARE lock: no
-- writer inside), deleted and inserted into the current segment.
WITH d AS (DELETE FROM {t} RETURNING *)
INSERT INTO {dst} ({cols}) SELECT {cols} FROM d

-- name: seg_free_keys
-- Retention: the unique keys still held by finished jobs of a segment
-- about to be truncated.
DELETE FROM {p}unique_keys k USING {t} j WHERE j.unique_key IS NOT NULL AND k.key = j.unique_key AND k.job_id = j.id

-- name: seg_analyze
-- Statistics for the planner: without them it takes a segment's queue
-- for a few rows and sorts the whole segment under a claim's LockRows
-- (which a LIMIT cannot bound) instead of reading the claim index in
-- order. The analyze also invalidates the generic plans cached on the
-- segment, which are then made again with these statistics. Only the
-- columns that statements filter, join or order segments by: the
-- others (arguments, errors, metadata, times only returned) cost most of
-- an analyze's time and steer no plan, and a bulk enqueue's large segment
-- took a third of the server's CPU in analyzing them.
ANALYZE {t} (queue, kind, state, priority, pos, id, fence, lkey, scheduled_at, lease_expires_at, finalized_at)

-- name: seg_analyze_sample
-- Before seg_analyze of a current done or dead segment, in its
-- transaction: a sample of 3,000 rows instead of 30,000. No claim reads
-- these segments; the lists' plans need their size and a rough mix of
-- queues and kinds, and the segment is analyzed each time it doubles up
-- to 64 MiB (an analyze of the full sample took 60-90 ms of a drain's
-- server CPU each time).
SET LOCAL default_statistics_target = 10

-- name: seg_reltuples
-- The rows a segment held at its last analyze (-1: never analyzed).
SELECT reltuples FROM pg_class WHERE oid = $1::regclass

-- name: seg_analyze_table
-- The key slots (see analyzeGrown): every column.
ANALYZE {t}

-- name: seg_truncate
TRUNCATE {t}

-- name: seg_advance
-- The next incarnation: above both the registry's and the sequence's. It
-- is set by setval, never drawn by nextval: nextval writes its value 32
-- ahead to the WAL, so that after a crash the sequence resumes up to 32
-- past the incarnation the registry committed, and every guard on the
-- table would fail for good. setval writes the exact value.
SELECT setval('{t}_inc', greatest(q.last_value, r.inc) + 1)
  FROM {t}_inc q, {p}segments r
 WHERE r.tbl = '{t}'

-- name: seg_sync
-- Sets the sequence of a current segment back to the incarnation the
-- registry records, if they differ: the table is current, so no reclaim
-- advanced it, and the difference is nextval's advance into the WAL
-- replayed by crash recovery (prefixes whose sequences were drawn by
-- nextval before seg_advance used setval). Reports the table if it did.
SELECT tbl, setval('{t}_inc', inc) FROM {p}segments
 WHERE tbl = '{t}' AND status = 'current' AND inc <> (SELECT last_value FROM {t}_inc)

-- name: seg_out_of_sync
-- Of the current segments as a round read them (one check each), those
-- whose sequence is not at their registry incarnation.
SELECT r.tbl FROM {p}segments r JOIN (
{each}SELECT '{src}'::text AS tbl, (SELECT last_value FROM {src}_inc) AS inc{sep}
UNION ALL
{end}) q ON q.tbl = r.tbl
 WHERE r.status = 'current' AND q.inc <> r.inc

-- name: seg_drop
-- IF EXISTS: DropAll drops every table the registry names.
DROP TABLE IF EXISTS {t}

-- name: seg_notify
SELECT pg_notify('{p}wake', '!segments')

-- name: seg_tables
-- Every segment table (DropAll), if the registry exists.
SELECT tbl FROM {p}segments

-- name: seg_convert_setup
-- The sequences and the unique keys table of the segment tables,
-- created by the conversion of a prefix. Job ids continue from the jobs
-- table's: the next id is the one its sequence would give (last_value
-- itself while is_called is false: on a fresh install, where the first
-- id is then 1 as on the other backends), and above every id in it.
CREATE SEQUENCE {p}job_ids OWNED BY {p}segments.ord;
CREATE SEQUENCE {p}pos_seq OWNED BY {p}segments.ord;
SELECT setval('{p}job_ids', greatest((SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {p}jobs_id_seq), (SELECT coalesce(max(id), 0) + 1 FROM {p}jobs)), false);
CREATE TABLE {p}unique_keys (
    key    bytea  PRIMARY KEY,
    job_id bigint NOT NULL
)

-- name: seg_convert_lock
-- The conversion waits (up to lock_timeout, retried: lockForConvert) for
-- the writers of the jobs table to finish, and keeps every other
-- statement out of it until it commits; processes of an earlier version
-- still writing the one table then fail on the missing table rather than
-- write where nobody reads.
LOCK TABLE {p}jobs IN ACCESS EXCLUSIVE MODE

-- name: seg_convert_lock_timeout
-- $1: how long each attempt of seg_convert_lock waits, for the
-- transaction.
SELECT set_config('lock_timeout', $1, true)

-- name: seg_convert_lock_reset
-- Once the lock is taken: the rest of the conversion waits as long as it
-- must.
SET LOCAL lock_timeout TO DEFAULT

-- name: seg_convert_move
-- Every job into the current segment of its phase. Running jobs keep
-- their attempt, fence and lease; ready jobs keep their claim order. The
-- one table never held a limit key (lkey NULL).
WITH r AS (
    INSERT INTO {ready} ({cols})
    SELECT nextval('{p}pos_seq'), id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, NULL
    FROM (SELECT * FROM {p}jobs WHERE state = 'available' ORDER BY priority, scheduled_at, id) j
),
run AS (
    INSERT INTO {running} ({cols})
    SELECT 0, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, NULL
    FROM {p}jobs WHERE state = 'running'
),
wt AS (
    INSERT INTO {waiting} ({cols})
    SELECT 0, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, NULL
    FROM {p}jobs WHERE state IN ('scheduled', 'retryable')
),
dn AS (
    INSERT INTO {done} ({cols})
    SELECT 0, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, NULL
    FROM {p}jobs WHERE state = 'completed'
),
dd AS (
    INSERT INTO {dead} ({cols})
    SELECT 0, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms,
           scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors,
           fence, unique_key, unique_keep, meta, NULL
    FROM {p}jobs WHERE state IN ('discarded', 'cancelled')
),
uk AS (
    INSERT INTO {p}unique_keys (key, job_id)
    SELECT unique_key, id FROM {p}jobs
     WHERE unique_key IS NOT NULL
       AND (state IN ('available', 'scheduled', 'running', 'retryable')
            OR (state = 'completed' AND (unique_keep & 1) <> 0)
            OR (state = 'discarded' AND (unique_keep & 2) <> 0)
            OR (state = 'cancelled' AND (unique_keep & 4) <> 0))
)
SELECT count(*) FROM {p}jobs

-- name: seg_convert_drop
DROP TABLE {p}jobs
