-- Queries of the MySQL / MariaDB backend.
--
-- Tokens besides {p}, replaced by the driver:
--   {cols}   the job_columns list below
--   {ids}    a list of N "?" placeholders (N rounded up to a power of two and
--            padded with a repeated id, so that each size is prepared once)
--   {source} the batch of (id, attempt, ...) tuples: a JSON_TABLE over one
--            JSON parameter where the server has it (MySQL 8.0.4+, MariaDB
--            10.6+), else a derived table of UNION ALL rows
--   {skip}   "SKIP LOCKED" where the server supports it, else empty
--   {iso}    the server's name for the isolation variable
--   {server} the current server's identity for fence epochs (see
--            fence_floor): IF(@@wsrep_on, 0, @@server_id) where the server
--            knows wsrep_on (MariaDB, Galera builds of MySQL), else
--            @@server_id
--   {fence_floor} the fence_floor expression below
--   {keys}   a list of N "?" placeholders, one per key (key_slot_stats)
--   {intx}   on Galera, " AND @@in_transaction = 1", else empty: the guard
--            of every write of the claim, rescue and promote transactions
--            (see "Transactions on Galera" below)
--
-- Every time is computed with UTC_TIMESTAMP(6) (the database's clock, UTC,
-- microseconds), which is constant within one statement. Sessions run with
-- time_zone '+00:00', READ COMMITTED and an explicit sql_mode (see Open).

-- name: job_columns
id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms, scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors, fence, meta, lkey

-- Fences. A claim sets fence = GREATEST(fence + 1, floor), where floor is
-- this expression: the current server's floor, from the fence_epochs row
-- with the largest epoch, or NULL when that row is not this server's (none
-- yet, another primary's, or this server's from before a failover away
-- and back). On NULL the driver inserts epoch max + 1 for this server
-- (fence_epoch_state, fence_epoch_insert) in the claim's transaction and
-- reads the floor again. The layout, below 2^53 (the integers JSON numbers
-- carry exactly: the HTTP worker protocol sends fences to JavaScript
-- workers) for epochs up to 2^17 - 1:
--
--     epoch * 2^36 + (server & 65535) * 2^20 + claims since the floor
--
-- Why a fence never repeats across primaries. Replication applies the
-- primary's transactions in commit order, so a replica always holds a
-- prefix of its primary's history. Say job J's last fence a promoted
-- replica B holds is f, and primary A issued further fences for J that B
-- never received (claims lost in the failover). Every claim of a server
-- reads the floor of an epoch row of its own that committed before it, so:
--   - If B holds A's epoch row e (A's lost claims came after it), B's max
--     is at least e, so B's new epoch is larger: B's floor is at least
--     (e + 1) * 2^36, above every fence A issued in epoch e (a job would
--     need 2^36 claims in one epoch to climb past it).
--   - If B lost A's epoch row too, B may pick the same epoch e, but its
--     floor differs from A's in the server bits (servers of one
--     replication topology have distinct server_ids, required by MySQL
--     replication; they must also differ modulo 65536). A's lost fences
--     lie in [A's floor, A's floor + k) and B's start at B's floor, above
--     f (J's fences before epoch e are below both floors); the ranges are
--     2^20 apart at least, so they meet only after a million claims of J
--     in the one epoch.
--   - A failback to A (its row no longer the largest) bumps again, so A's
--     new fences are above everything B issued.
-- A Galera cluster is one logical primary (every node takes writes and
-- certifies them in one global order): its nodes share server 0, so they
-- never bump each other's epoch.
-- name: fence_floor
(SELECT IF(e.server = {server}, e.epoch * 68719476736 + ({server} & 65535) * 1048576, NULL) FROM `{p}fence_epochs` e ORDER BY e.epoch DESC LIMIT 1)

-- fence_epoch_state reads the floor, this server's identity and the
-- largest epoch; fence_epoch_insert takes the next one. Plain values are
-- inserted (not an INSERT ... SELECT of @@server_id), so the row
-- replicates the same in every binlog format. A concurrent claimer that
-- inserted the same epoch first wins (duplicate key), and the floor is
-- read again.
-- name: fence_epoch_state
SELECT {fence_floor}, {server}, (SELECT COALESCE(MAX(epoch), 0) FROM `{p}fence_epochs`)

-- name: fence_epoch_insert
INSERT INTO `{p}fence_epochs` (epoch, server, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))

-- Insert: a multi-row "simple insert" (row count known in advance), so
-- InnoDB assigns consecutive ids in every innodb_autoinc_lock_mode. A value
-- list may refer to a column set earlier in the same row: state is derived
-- from the scheduled_at just computed and created_at (both the statement's
-- now when there is no delay).
-- name: insert_head
INSERT INTO `{p}jobs` (queue, kind, args, priority, max_attempts, timeout_ms, scheduled_at, created_at, state, errors, meta, lkey) VALUES

-- name: insert_row
(?, ?, ?, ?, ?, ?, COALESCE(CAST(? AS DATETIME(6)), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6), IF(scheduled_at > created_at, 'scheduled', 'available'), '[]', ?, ?)

-- Claims at insert (InsertClaiming, see jobs.go): the database's clock,
-- this server's fence floor (see fence_floor) and which of the queues
-- named in {names} (those of the jobs to claim) are paused, read by a
-- plain read that locks nothing right before the insert; always one row
-- at least (name NULL when none is paused). On Galera it is a causal read
-- (causal_read): a pause committed through another node stops the claim.
-- name: insert_claim_state
SELECT UTC_TIMESTAMP(6), {fence_floor}, q.name FROM (SELECT 1 AS one) o LEFT JOIN `{p}queues` q ON q.paused_at IS NOT NULL AND q.name IN ({names})

-- The insert of InsertClaiming: insert_row's columns and the attempt's,
-- with two kinds of row. insert_claim_plain_row writes a job as
-- insert_row does (no attempt yet); insert_claim_row writes one running,
-- as claim_mark would leave it: scheduled, created and attempted at the
-- clock insert_claim_state read, leased until that clock plus the lease,
-- attempt 1, attempted_by the worker and the fence floor as its fence
-- (a new job's first claim gets GREATEST(0 + 1, floor), the floor).
-- name: insert_claim_head
INSERT INTO `{p}jobs` (queue, kind, args, priority, max_attempts, timeout_ms, scheduled_at, created_at, state, errors, meta, lkey, attempt, attempted_at, lease_expires_at, attempted_by, fence) VALUES

-- name: insert_claim_plain_row
(?, ?, ?, ?, ?, ?, COALESCE(CAST(? AS DATETIME(6)), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6), IF(scheduled_at > created_at, 'scheduled', 'available'), '[]', ?, ?, 0, NULL, NULL, NULL, 0)

-- name: insert_claim_row
(?, ?, ?, ?, ?, ?, ?, ?, 'running', '[]', ?, ?, 1, ?, ?, ?, ?)

-- Unique jobs are inserted one row each (insert_unique_head +
-- insert_unique_row) after unique_holder, a plain consistent read that
-- takes no lock, found no holder: a duplicate key (error 1062 on
-- unique_idx) then means a concurrent transaction took the key in between
-- (see InsertUnique in unique.go for why that case is handled apart).
-- name: insert_unique_head
INSERT INTO `{p}jobs` (queue, kind, args, priority, max_attempts, timeout_ms, scheduled_at, created_at, state, errors, meta, lkey, unique_key, unique_keep) VALUES

-- name: insert_unique_row
(?, ?, ?, ?, ?, ?, COALESCE(CAST(? AS DATETIME(6)), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6), IF(scheduled_at > created_at, 'scheduled', 'available'), '[]', ?, ?, ?, ?)

-- name: unique_holder
SELECT id FROM `{p}jobs` WHERE unique_live = ?

-- Claim with SKIP LOCKED, in one READ COMMITTED transaction: lock up to
-- Limit due rows in claim order, skipping rows other claimers hold (never
-- waiting), read the database's clock in the same statement, then mark the
-- locked rows. avail_queue is the queue of an available job and NULL
-- otherwise (the emulated partial index, see migrations). FORCE INDEX keeps
-- the plan on the claim index: a filesort plan would lock every available
-- row of the queue before sorting.
-- A claim skips a paused queue (a row of {p}queues with paused_at set).
-- The NOT EXISTS subquery is a plain consistent read: a locking read does
-- not lock the rows of a nested subquery, so claimers never wait on the
-- queue's row (checked on MariaDB 10.11). It reads the statement's
-- snapshot, which can be older than the jobs the locking read finds, so it
-- only spares a paused queue the locking; claim_mark_queued decides.
-- name: claim_select
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ? AND NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) AND state = 'available' ORDER BY priority, scheduled_at, id LIMIT ? FOR UPDATE SKIP LOCKED

-- claim_select_after is claim_select resumed after the last key this process
-- claimed from the queue (see claimCursor in jobs.go). InnoDB keeps the
-- delete-marked claim-index entries of claimed jobs until purge removes
-- them, and a claim that starts at the front of the queue reads all of them
-- (and each one's row): under a backlog that made each claim slower than
-- the last, and while a long consistent snapshot (a backup's) holds purge
-- back, every claim of a drained queue read every job claimed since the
-- snapshot began.
-- name: claim_select_after
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ? AND NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) AND state = 'available' AND (priority > ? OR (priority = ? AND (scheduled_at > ? OR (scheduled_at = ? AND id > ?)))) ORDER BY priority, scheduled_at, id LIMIT ? FOR UPDATE SKIP LOCKED

-- claim_probe finds where the available jobs of a queue begin, without
-- locking: a plain read of the claim index alone (every column it needs is
-- in the index), a consistent read that passes over the delete-marked
-- entries of claimed jobs at a fraction of what the locking claim_select
-- pays for each (which checks each entry's row for a lock). Measured on
-- MariaDB 10.11 80 s into a held consistent snapshot at 1,000 jobs/s: 1,032
-- pages and 24 ms, where claim_select read 233,689 pages and took 262 ms.
-- The claim then takes the jobs it found before its cursor by id
-- (claim_select_ids), and resumes after its cursor for the rest.
-- name: claim_probe
SELECT priority, scheduled_at, id FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ? ORDER BY priority, scheduled_at, id LIMIT ?

-- claim_select_ids is claim_select over the given jobs only (found by
-- claim_probe): a primary-key read that locks each one that is still
-- available (avail_queue is read on the row's latest version, as for any
-- locking read) and that no other claim holds.
-- name: claim_select_ids
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` WHERE avail_queue = ? AND NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) AND id IN ({ids}) ORDER BY priority, scheduled_at, id FOR UPDATE SKIP LOCKED

-- claim_mark runs in the same transaction over the rows just locked. It
-- sets attempted_at and lease_expires_at from the clock claim_select read
-- (microseconds earlier, same transaction), and the fence from the floor
-- it read (see fence_floor), so the driver returns exactly the stored rows
-- without reading them again.
-- name: claim_mark
UPDATE `{p}jobs` SET state = 'running', attempt = attempt + 1, attempted_at = ?, lease_expires_at = ?, attempted_by = ?, fence = GREATEST(fence + 1, ?) WHERE id IN ({ids}){intx}

-- claim_mark_queued is claim_mark for a queue claim: it marks nothing if the
-- queue is paused by now. claim_select's pause check reads the statement's
-- snapshot, but its locking read of the jobs sees rows committed after
-- that snapshot was taken, so a claim statement that began before a pause
-- committed could lock a job inserted after the pause. This statement
-- begins after those rows were locked, so its read of the queue's row sees
-- any pause that the locked jobs' inserts came after. The driver then
-- returns no job and the commit releases the locks.
-- name: claim_mark_queued
UPDATE `{p}jobs` SET state = 'running', attempt = attempt + 1, attempted_at = ?, lease_expires_at = ?, attempted_by = ?, fence = GREATEST(fence + 1, ?) WHERE NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) AND id IN ({ids}){intx}

-- claim_job_select locks one job by id for ClaimJob, which then marks it with
-- claim_mark if it is neither running nor finished. It waits for a claim
-- that holds the row; once that claim commits the row is running and is
-- left alone.
-- name: claim_job_select
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` WHERE id = ? FOR UPDATE

-- Optimistic claim, for servers without SKIP LOCKED. claim_window reads the
-- first N available rows in claim order with a plain SELECT: under READ
-- COMMITTED that is a consistent read and takes no locks. The driver picks
-- up to Limit of them (at random once it has seen contention, so that
-- concurrent claimers mostly pick different rows) and claim_optimistic takes
-- them in one autocommit UPDATE. The id list is a primary-key range read
-- in ascending order, so claimers lock rows in the same order and cannot
-- deadlock on each other; state = 'available' is evaluated on the locked,
-- latest version of each row, so a row another claimer took in the
-- meantime is skipped and one job is never handed to two claimers (a row
-- another claimer's UPDATE is still holding is waited for, for the length
-- of that one autocommit statement). The rows taken carry this call's
-- claim_token and are read back by id + token. The window read returns
-- the fence floor (fence_floor) beside each id; claim_optimistic sets the
-- fence from it only while the largest epoch is still the one it came
-- from (a floor read on one server is never applied on another).
--
-- This is deliberately not one multi-table UPDATE joined to a derived
-- table of the window: InnoDB reads the derived table of a multi-table
-- UPDATE with shared locks even under READ COMMITTED (only single-table
-- UPDATE and INSERT ... SELECT get consistent reads), and the S-to-X lock
-- upgrades between concurrent claimers deadlock constantly (about 200
-- deadlocks per 4,000 jobs with 10 claimers on MariaDB 10.11).
-- name: claim_window
SELECT id, {fence_floor} FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ? AND NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) ORDER BY priority, scheduled_at, id LIMIT ?

-- name: claim_optimistic
UPDATE `{p}jobs` SET state = 'running', attempt = attempt + 1, fence = GREATEST(fence + 1, ?), attempted_at = UTC_TIMESTAMP(6), lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, attempted_by = ?, claim_token = ? WHERE (SELECT MAX(epoch) FROM `{p}fence_epochs`) = ? AND id IN ({ids}) AND state = 'available'

-- name: claim_by_token
SELECT {cols} FROM `{p}jobs` WHERE claim_token = ? AND id IN ({ids})

-- Batch sources. Outcome tuples are [id, fence, state, retry_us, err]
-- where err is the AttemptError JSON text, or '' for none.
-- name: outcome_source_json
JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]', state VARCHAR(16) PATH '$[2]', retry_us BIGINT PATH '$[3]', err LONGTEXT PATH '$[4]'))

-- name: outcome_source_row
SELECT CAST(? AS SIGNED) AS id, CAST(? AS SIGNED) AS fence, CAST(? AS CHAR(16)) AS state, CAST(? AS SIGNED) AS retry_us, CAST(? AS CHAR) AS err

-- name: lease_source_json
JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$[0]', fence BIGINT PATH '$[1]'))

-- name: lease_source_row
SELECT CAST(? AS SIGNED) AS id, CAST(? AS SIGNED) AS fence

-- Complete: MariaDB has no UPDATE ... RETURNING, so the batch is one UPDATE
-- joined to the batch source (STRAIGHT_JOIN: the batch drives primary-key
-- lookups), fenced by id + fence token + state = 'running'. With
-- CLIENT_FOUND_ROWS the driver learns how many rows matched; when that is
-- every outcome no further round trip is needed. Otherwise the rows this
-- call changed are the ones carrying its op_token (fence_check). Outcomes
-- with an error go through complete_with_errors: assigning the LONGTEXT
-- errors column, even to itself, costs about a third of the statement, so
-- the common error-free batch does not touch it. Complete, Heartbeat and
-- Release (the lease path) run on a pool of their own. In a multi-table UPDATE
-- the order of assignments is unspecified, so no assignment reads a column
-- another one writes. A snooze (state scheduled) gives the attempt back.
--
-- Queue limits: an attempt of a limited queue holds a concurrency slot,
-- freed in the transaction that ends the attempt. slot_holders first reads
-- which of the batch's attempts hold one (a plain read by slot_job_idx;
-- an attempt's slot was written by the claim that issued its fence, so
-- the read cannot miss it, and nothing takes a slot for a fence later).
-- Those outcomes go, in one transaction per chunk, through complete (or
-- complete_with_errors) and then free_slots; the others through complete
-- and complete_with_errors alone, autocommitted, which never touch the
-- slots. Completions with a result go through complete_one and
-- store_result, job by job, and then free_slots over those applied, in
-- one transaction (completeResults).
--
-- Why two statements and not one UPDATE of both tables: MariaDB keeps
-- the row ids of a multi-table UPDATE's second table in an internal
-- temporary table, and limit_slots' row id is its primary key (queue,
-- type, lkey, n: up to about 1.5 KB in utf8mb4), too long for a
-- temporary table in memory. Every such statement made one on disk
-- (1.2-2.0 ms a statement against 0.5 ms without the slots); the
-- single-table free_slots makes none.
--
-- free_slots frees the slots held by the attempts (id, fence) of the
-- chunk ({pairs}, with their ids in {ids} for the index). It runs after
-- complete in the same transaction, so that no slot is free while its
-- attempt still runs, nor kept (below) for a job whose outcome was not
-- written. It needs no join to the jobs: a slot held under (id, fence)
-- means the attempt of that fence, and a fence only grows; when that
-- attempt has ended otherwise (rescued, cancelled), whatever ended it
-- freed the slot in the same transaction, and a slot found held for an
-- ended attempt is free to give back in any case.
--
-- Key limits: an attempt of a job with a key in a key-limited queue also
-- holds a key slot (type 'k', see migrations/013_keys.sql), found and
-- freed by the same pair. In a queue whose key_order is 1 (ordered,
-- holding), a retryable or snoozed outcome ({keep}: their ids) keeps the
-- key slot for the job instead: its fence is cleared and its job_id
-- stays, so that no later job of the key starts before this one (see
-- claimKeyedTx). A single-table UPDATE assigns left to right: job_id is
-- computed before fence is cleared.
-- name: slot_holders
SELECT s.job_id FROM {source} u STRAIGHT_JOIN `{p}limit_slots` s FORCE INDEX (slot_job_idx) ON s.job_id = u.id AND s.fence = u.fence

-- name: complete
UPDATE {source} u STRAIGHT_JOIN `{p}jobs` j ON j.id = u.id AND j.fence = u.fence SET j.state = u.state, j.finalized_at = IF(u.state IN ('retryable', 'scheduled'), NULL, UTC_TIMESTAMP(6)), j.scheduled_at = IF(u.state IN ('retryable', 'scheduled'), UTC_TIMESTAMP(6) + INTERVAL u.retry_us MICROSECOND, j.scheduled_at), j.attempt = IF(u.state = 'scheduled', j.attempt - 1, j.attempt), j.lease_expires_at = NULL, j.op_token = ? WHERE j.state = 'running'

-- name: complete_with_errors
UPDATE {source} u STRAIGHT_JOIN `{p}jobs` j ON j.id = u.id AND j.fence = u.fence SET j.state = u.state, j.finalized_at = IF(u.state IN ('retryable', 'scheduled'), NULL, UTC_TIMESTAMP(6)), j.scheduled_at = IF(u.state IN ('retryable', 'scheduled'), UTC_TIMESTAMP(6) + INTERVAL u.retry_us MICROSECOND, j.scheduled_at), j.attempt = IF(u.state = 'scheduled', j.attempt - 1, j.attempt), j.lease_expires_at = NULL, j.errors = CONCAT(LEFT(j.errors, CHAR_LENGTH(j.errors) - 1), IF(j.errors = '[]', '', ','), u.err, ']'), j.op_token = ? WHERE j.state = 'running'

-- name: free_slots
UPDATE `{p}limit_slots` s SET s.job_id = IF(s.type = 'k' AND s.job_id IN ({keep}) AND (SELECT q.key_order FROM `{p}queues` q WHERE q.name = s.queue) = 1, s.job_id, NULL), s.fence = NULL WHERE s.job_id IN ({ids}) AND (s.job_id, s.fence) IN ({pairs}){intx}

-- name: heartbeat
UPDATE {source} u STRAIGHT_JOIN `{p}jobs` j ON j.id = u.id AND j.fence = u.fence SET j.lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, j.op_token = ? WHERE j.state = 'running'

-- Release frees the slots of the attempts it gives back in the same
-- statement (a LEFT JOIN of limit_slots by job and fence; release runs
-- when a process stops, so its temporary table on disk, see free_slots,
-- is not worth a transaction), and marks the rows it changed with
-- op_token. A freed slot adds to the matched count, so its assignment
-- also sets LAST_INSERT_ID(1), which the server reports with the
-- statement's result (0 when no slot was freed): the driver then reads
-- back the ids applied by op_token instead of trusting the count.
-- name: release
UPDATE {source} u STRAIGHT_JOIN `{p}jobs` j ON j.id = u.id AND j.fence = u.fence LEFT JOIN `{p}limit_slots` s FORCE INDEX (slot_job_idx) ON s.job_id = j.id AND s.fence = j.fence SET j.state = 'available', j.attempt = j.attempt - 1, j.lease_expires_at = NULL, j.attempted_by = NULL, j.op_token = ?, s.job_id = NULL, s.fence = IF(LAST_INSERT_ID(1), NULL, NULL) WHERE j.state = 'running'

-- When fewer rows matched than outcomes/leases were sent: the ids the call
-- changed, by its op_token.
-- name: fence_check
SELECT id FROM `{p}jobs` WHERE op_token = ? AND id IN ({ids})

-- Rescue, in one transaction: lock expired leases (oldest first, by the
-- lease index), then requeue or discard them. Rescue and promote read each
-- job's claim key (priority, scheduled_at, id), which neither changes, to
-- move the driver's claim cursor of the queue back before it. Single-table
-- UPDATE assignments run left to right, so errors and finalized_at are
-- computed before state changes.
-- name: rescue_select
SELECT id, queue, priority, scheduled_at FROM `{p}jobs` FORCE INDEX (lease_idx) WHERE lease_expires_at < UTC_TIMESTAMP(6) AND state = 'running' ORDER BY lease_expires_at LIMIT ? FOR UPDATE {skip}

-- name: rescue_update
UPDATE `{p}jobs` SET errors = CONCAT(LEFT(errors, CHAR_LENGTH(errors) - 1), IF(errors = '[]', '', ','), '{"attempt":', attempt, ',"at":"', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%fZ'), '","error":', JSON_QUOTE(CONCAT('lease expired: ', COALESCE(attempted_by, ''), ' stopped heartbeating')), '}]'), finalized_at = IF(attempt >= max_attempts, UTC_TIMESTAMP(6), NULL), state = IF(attempt >= max_attempts, 'discarded', 'available'), lease_expires_at = NULL WHERE id IN ({ids}) AND state = 'running'{intx}

-- Promote, in one transaction: lock due scheduled/retryable rows (due_at is
-- their scheduled_at, NULL for other states), oldest first, and make them
-- available.
-- rescue_free_slots runs in the rescue's transaction after rescue_update,
-- over the same ids, whose rows it still holds locked: a slot held by one
-- of them is held by the attempt just rescued (a job's fence only grows,
-- and no later attempt can have started while the row is locked), so the
-- job id alone fences it.
-- name: rescue_free_slots
UPDATE `{p}limit_slots` SET job_id = NULL, fence = NULL WHERE job_id IN ({ids}){intx}

-- name: promote_select
SELECT id, queue, priority, scheduled_at FROM `{p}jobs` FORCE INDEX (due_idx) WHERE due_at <= UTC_TIMESTAMP(6) ORDER BY due_at LIMIT ? FOR UPDATE {skip}

-- name: promote_update
UPDATE `{p}jobs` SET state = 'available' WHERE id IN ({ids}) AND state IN ('retryable', 'scheduled'){intx}

-- A completion that carries a result, in a transaction with
-- store_result and free_slots (see completeResults): the one job, fenced.
-- name: complete_one
UPDATE `{p}jobs` SET state = 'completed', finalized_at = UTC_TIMESTAMP(6), lease_expires_at = NULL WHERE id = ? AND fence = ? AND state = 'running'

-- name: store_result
INSERT INTO `{p}job_results` (job_id, fence, result, stored_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE fence = VALUES(fence), result = VALUES(result), stored_at = VALUES(stored_at)

-- name: get_result
SELECT result FROM `{p}job_results` WHERE job_id = ? AND fence = ?

-- name: prune_results
DELETE FROM `{p}job_results` WHERE stored_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY stored_at LIMIT ?

-- name: insert_batch
INSERT INTO `{p}batches` (callback, created_at) VALUES (?, UTC_TIMESTAMP(6))

-- Members: the driver appends one (?, ?) per job.
-- name: insert_batch_jobs
INSERT INTO `{p}batch_jobs` (batch_id, job_id) VALUES

-- Batches without a callback yet whose every member has finished (a
-- member Prune deleted has finished), oldest first, with ids past the
-- first parameter. Reads each open batch's members up to its first
-- unfinished one.
-- name: ready_batches
SELECT b.id, b.callback FROM `{p}batches` b FORCE INDEX (open_idx) WHERE b.callback_id IS NULL AND b.id > ? AND NOT EXISTS (SELECT 1 FROM `{p}batch_jobs` m JOIN `{p}jobs` j ON j.id = m.job_id WHERE m.batch_id = b.id AND j.state NOT IN ('completed', 'discarded', 'cancelled')) AND NOT EXISTS (SELECT 1 FROM `{p}batch_deps` d JOIN `{p}batches` p ON p.id = d.dep_batch_id LEFT JOIN `{p}jobs` j ON j.id = p.callback_id WHERE d.batch_id = b.id AND (p.callback_id IS NULL OR j.state NOT IN ('completed', 'discarded', 'cancelled'))) ORDER BY b.id LIMIT ?

-- Earlier batches a batch waits for: the driver appends one (?, ?) each.
-- name: insert_batch_deps
INSERT INTO `{p}batch_deps` (batch_id, dep_batch_id) VALUES

-- The firing's reads of a batch again, in its transaction, before the
-- callback is inserted: every member's row, and the row of every batch it
-- waits for with its callback's, by a locking read (the latest committed
-- versions, kept by a shared lock until the commit). A retry by hand
-- updates the job's row: one that did so first, uncommitted, is waited
-- for and its result read; one that comes later waits for the firing's
-- commit. Every row read is locked: no condition on the state (READ
-- COMMITTED releases the locks of rows a locking read's WHERE rejects),
-- the unfinished are counted instead. A member Prune deleted has
-- finished.
-- name: lock_batch_members
SELECT COUNT(*), COALESCE(SUM(j.state NOT IN ('completed', 'discarded', 'cancelled')), 0) FROM `{p}batch_jobs` m JOIN `{p}jobs` j ON j.id = m.job_id WHERE m.batch_id = ? LOCK IN SHARE MODE

-- Of the batches the batch waits for, those not ready: not fired yet, or
-- whose callback has not finished.
-- name: lock_batch_deps
SELECT COUNT(*), COALESCE(SUM(p.callback_id IS NULL OR j.state NOT IN ('completed', 'discarded', 'cancelled')), 0) FROM `{p}batch_deps` d JOIN `{p}batches` p ON p.id = d.dep_batch_id LEFT JOIN `{p}jobs` j ON j.id = p.callback_id WHERE d.batch_id = ? LOCK IN SHARE MODE

-- name: fire_batch
UPDATE `{p}batches` SET callback_id = ?, fired_at = UTC_TIMESTAMP(6) WHERE id = ? AND callback_id IS NULL

-- Batches fired longer ago than the completed jobs' retention whose
-- callback has finished (it reads its batch when it runs; deleted by
-- retention counts as finished) and that no kept batch waits for (a workflow's step is kept while the batch of a
-- later step is: that batch reads it to know whether it may fire, and
-- lists its callback among its jobs); the driver then deletes them and
-- their members in one transaction.
-- name: prunable_batches
SELECT b.id FROM `{p}batches` b WHERE b.fired_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND NOT EXISTS (SELECT 1 FROM `{p}jobs` j WHERE j.id = b.callback_id AND j.state NOT IN ('completed', 'discarded', 'cancelled')) AND NOT EXISTS (SELECT 1 FROM `{p}batch_deps` d WHERE d.dep_batch_id = b.id) ORDER BY b.fired_at LIMIT ?

-- name: prune_batch_jobs
DELETE FROM `{p}batch_jobs` WHERE batch_id IN ({ids})

-- name: prune_batch_deps
DELETE FROM `{p}batch_deps` WHERE batch_id IN ({ids})

-- name: prune_batches
DELETE FROM `{p}batches` WHERE id IN ({ids})

-- The batch id twice: the batch, and the batches it waits for whose
-- callback is not enqueued yet (a JSON array of their ids, NULL for
-- none), read before its members: a batch that fires in between is then
-- listed twice (waited for, and its callback a member), never left out.
-- name: get_batch
SELECT id, callback, callback_id, created_at, fired_at, (SELECT JSON_ARRAYAGG(d.dep_batch_id) FROM `{p}batch_deps` d JOIN `{p}batches` p ON p.id = d.dep_batch_id WHERE d.batch_id = ? AND p.callback_id IS NULL) FROM `{p}batches` WHERE id = ?

-- name: job_batch
-- The job id three times: the batch it is a member of and the batch
-- whose callback it is, 0 for none; one probe each of job_idx (migration
-- 16) and open_idx (migration 12). A callback is a member of the batches
-- that wait for its batch (a workflow's later steps, which list it among
-- their jobs): found by dep_idx (migration 17) from the batch it closes.
SELECT COALESCE((SELECT MIN(x.b) FROM (SELECT MIN(`batch_id`) AS b FROM `{p}batch_jobs` WHERE `job_id` = ? UNION ALL SELECT MIN(d.`batch_id`) FROM `{p}batches` p JOIN `{p}batch_deps` d ON d.`dep_batch_id` = p.`id` WHERE p.`callback_id` = ?) x), 0),
       COALESCE((SELECT MIN(`id`) FROM `{p}batches` WHERE `callback_id` = ?), 0)

-- The callbacks of the open batches (not enqueued yet: jobs waiting for
-- their dependencies), counted by the callback's queue; read through
-- open_idx's range of callback_id NULL, the open batches only.
-- name: awaiting_dependencies
SELECT JSON_UNQUOTE(JSON_EXTRACT(callback, '$.Queue')) AS q, COUNT(*) FROM `{p}batches` FORCE INDEX (open_idx) WHERE callback_id IS NULL GROUP BY q

-- A member's result is its result only under the job's current fence.
-- name: batch_members
SELECT m.job_id, COALESCE(j.state, ''), r.result FROM (SELECT job_id FROM `{p}batch_jobs` WHERE batch_id = ? UNION ALL SELECT p.callback_id FROM `{p}batch_deps` d JOIN `{p}batches` p ON p.id = d.dep_batch_id WHERE d.batch_id = ? AND p.callback_id IS NOT NULL) m LEFT JOIN `{p}jobs` j ON j.id = m.job_id LEFT JOIN `{p}job_results` r ON r.job_id = m.job_id AND r.fence = j.fence AND j.state = 'completed' ORDER BY m.job_id

-- name: prune_completed
DELETE FROM `{p}jobs` WHERE finalized_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND state = 'completed' ORDER BY finalized_at LIMIT ?

-- name: prune_discarded
DELETE FROM `{p}jobs` WHERE finalized_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND state IN ('discarded', 'cancelled') ORDER BY finalized_at LIMIT ?

-- TryLead: ON DUPLICATE KEY UPDATE assignments run left to right, so
-- expires_at is extended only when leader_id is (now) ours.
-- name: try_lead
INSERT INTO `{p}leader` (name, leader_id, expires_at) VALUES ('maintenance', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) ON DUPLICATE KEY UPDATE leader_id = IF(leader_id = ? OR expires_at < UTC_TIMESTAMP(6), ?, leader_id), expires_at = IF(leader_id = ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)

-- name: leader
SELECT leader_id FROM `{p}leader` WHERE name = 'maintenance'

-- name: get_job
SELECT {cols} FROM `{p}jobs` WHERE id = ?

-- name: job_unique_key
SELECT unique_key FROM `{p}jobs` WHERE id = ?

-- name: list_jobs
SELECT {cols} FROM `{p}jobs` WHERE id > ?{where} ORDER BY id LIMIT ?

-- name: list_jobs_desc
-- ListJobs newest first: the same index read backwards.
SELECT {cols} FROM `{p}jobs` WHERE id > ?{where} ORDER BY id DESC LIMIT ?

-- name: list_jobs_before
 AND id < ?

-- name: list_jobs_states
 AND state IN ({ids})

-- name: list_jobs_queue
 AND queue = ?

-- name: list_jobs_kind
 AND kind = ?

-- name: retry
UPDATE `{p}jobs` SET state = 'available', scheduled_at = UTC_TIMESTAMP(6), finalized_at = NULL, lease_expires_at = NULL, max_attempts = GREATEST(max_attempts, attempt + 1) WHERE id = ? AND state IN ('discarded', 'cancelled', 'retryable', 'scheduled', 'completed')

-- Cancel and Discard (the new state is the first parameter). A running
-- job's attempt ends here: its slot is freed in the same statement (see
-- complete), and so is a key slot kept for it (an ordered key's job
-- waiting for its retry). The matched count is only compared with 0,
-- which a freed slot (matched only beside its job) cannot make.
-- name: finalize
UPDATE `{p}jobs` j LEFT JOIN `{p}limit_slots` s FORCE INDEX (slot_job_idx) ON s.job_id = j.id AND ((s.fence = j.fence AND j.state = 'running') OR (s.type = 'k' AND s.fence IS NULL)) SET j.state = ?, j.finalized_at = UTC_TIMESTAMP(6), j.lease_expires_at = NULL, s.job_id = NULL, s.fence = NULL WHERE j.id = ? AND j.state IN ('available', 'scheduled', 'retryable', 'running')

-- name: stats
SELECT queue, state, COUNT(*), MIN(scheduled_at), UTC_TIMESTAMP(6) FROM `{p}jobs` GROUP BY queue, state

-- name: overview
-- ? finishedSince (UTC). Stats at a bounded cost: each arm reads one
-- secondary index's range of the generated or nullable columns that are
-- NULL outside the states it serves (claim_idx: avail_queue, due_idx:
-- due_at, lease_idx: lease_expires_at, finalized_idx: finalized_at),
-- forced so that a large share never turns an arm into a table scan; the
-- finished states count only the jobs finalized at or after ?. Columns
-- as in Stats.
SELECT avail_queue, 'available', COUNT(*), MIN(scheduled_at), UTC_TIMESTAMP(6)
  FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue IS NOT NULL GROUP BY avail_queue
UNION ALL
SELECT queue, state, COUNT(*), MIN(scheduled_at), UTC_TIMESTAMP(6)
  FROM `{p}jobs` FORCE INDEX (due_idx) WHERE due_at IS NOT NULL GROUP BY queue, state
UNION ALL
SELECT queue, state, COUNT(*), MIN(scheduled_at), UTC_TIMESTAMP(6)
  FROM `{p}jobs` FORCE INDEX (lease_idx) WHERE lease_expires_at IS NOT NULL AND state = 'running' GROUP BY queue, state
UNION ALL
SELECT queue, state, COUNT(*), MIN(scheduled_at), UTC_TIMESTAMP(6)
  FROM `{p}jobs` FORCE INDEX (finalized_idx) WHERE finalized_at >= ? AND state IN ('completed', 'discarded', 'cancelled') GROUP BY queue, state

-- name: server_info
SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@{iso}, @@log_bin, @@max_allowed_packet, @@innodb_autoinc_lock_mode

-- name: probe
SELECT VERSION(), @@max_allowed_packet, @@auto_increment_increment

-- name: probe_isolation
SELECT @@transaction_isolation

-- Galera: wsrep_on is ON on a MariaDB Galera node (MySQL without wsrep has
-- no such variable: error 1193); see {server}.
-- name: probe_wsrep
SELECT @@wsrep_on

-- On Galera, reads that must see what was committed on any node before
-- they began (a job just enqueued through another node, the schema another
-- node's migrator just recorded) run with this prefix: the node first
-- applies every write set the cluster had ordered when the read arrived.
-- name: causal_read
SET STATEMENT wsrep_sync_wait = 1 FOR

-- On Galera, the fenced acknowledgements of a lease (complete, heartbeat,
-- release and fence_check), the changes of one job by id (finalize,
-- retry) and the rescue's giving back of an expired block (block_free)
-- run with this prefix: a worker may acknowledge through a node that has
-- not yet applied the claim, where the fenced UPDATE would match nothing;
-- a block's owner may have claimed, through such a node, the job that
-- keeps its block; and certification never sees a stale read (an UPDATE
-- that changes nothing writes nothing, and the jobs block_free reads are
-- not written at all). The node first applies what the cluster had
-- ordered (3: before reads, bit 1, and before UPDATE and DELETE, bit 2;
-- none of them is an INSERT or REPLACE, bit 4).
-- name: causal_ack
SET STATEMENT wsrep_sync_wait = 3 FOR

-- Transactions on Galera. A node that applies another node's write set
-- aborts the local transactions holding locks it needs. A transaction
-- aborted while one of its statements runs (a locking read of the slots
-- or the jobs, say) can find that statement answered without an error
-- and be rolled back all the same: the statements after it then run
-- outside any transaction, each committed on its own, and the COMMIT
-- commits nothing. A claim would hand out jobs whose marking was rolled
-- back, or take slots for attempts that never started, or keep its jobs'
-- marking after its slots were lost and another claim took them. So on
-- Galera the writes of the claim, rescue and promote transactions carry
-- {intx}: after such an abort they change nothing, and their counts fall
-- short; and before every COMMIT the driver reads @@in_transaction, and
-- runs the whole transaction again when it is no longer open.
-- name: tx_open
SELECT @@in_transaction

-- Multi-row inserts on Galera return their ids: auto_increment_increment
-- follows the cluster's size (wsrep_auto_increment_control) and changes,
-- in open sessions too, when a node leaves or joins, so ids cannot be
-- derived from LAST_INSERT_ID() and a step read earlier (MariaDB 10.5+).
-- name: insert_returning
 RETURNING id

-- Migrations, serialised across processes by a named lock (the name hashes
-- database and prefix so that it stays under 64 characters).
-- name: get_lock
SELECT GET_LOCK(CONCAT('conveyor:', MD5(CONCAT(DATABASE(), '.', '{p}'))), ?)

-- name: release_lock
SELECT RELEASE_LOCK(CONCAT('conveyor:', MD5(CONCAT(DATABASE(), '.', '{p}'))))

-- On Galera, GET_LOCK is node-local: the migrators of different nodes
-- take a lock row instead, an expiring lease (renewed while migrating, so
-- a migrator that died frees it) granted like try_lead. Two nodes taking
-- it at once write the same row: certification lets one commit and the
-- other retries (error 1213) and then reads the winner.
-- name: migration_lock_table
CREATE TABLE IF NOT EXISTS `{p}migration_lock` (`name` VARCHAR(64) NOT NULL, `holder` VARCHAR(64) NOT NULL, `expires_at` DATETIME(6) NOT NULL, PRIMARY KEY (`name`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin

-- (holder, ttl µs.)
-- name: migration_lock_take
INSERT INTO `{p}migration_lock` (name, holder, expires_at) VALUES ('migrate', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) ON DUPLICATE KEY UPDATE holder = IF(holder = VALUES(holder) OR expires_at < UTC_TIMESTAMP(6), VALUES(holder), holder), expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)

-- name: migration_lock_holder
SELECT holder FROM `{p}migration_lock` WHERE name = 'migrate'

-- name: migration_lock_release
DELETE FROM `{p}migration_lock` WHERE name = 'migrate' AND holder = ?

-- name: migrations_table
CREATE TABLE IF NOT EXISTS `{p}schema_migrations` (`version` INT NOT NULL, `applied_at` DATETIME(6) NOT NULL, PRIMARY KEY (`version`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4

-- name: migrations_max
SELECT COALESCE(MAX(version), 0) FROM `{p}schema_migrations`

-- name: migrations_record
INSERT INTO `{p}schema_migrations` (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))

-- name: drop_all
DROP TABLE IF EXISTS `{p}jobs`, `{p}leader`, `{p}queues`, `{p}schedules`, `{p}processes`, `{p}fence_epochs`, `{p}limit_slots`, `{p}job_results`, `{p}batches`, `{p}batch_jobs`, `{p}batch_deps`, `{p}schema_migrations`, `{p}migration_lock`

-- name: pause_queue
-- Pausing keeps the first pause's time (?, ?: queue, paused 0/1).
INSERT INTO `{p}queues` (name, paused_at, updated_at) VALUES (?, IF(?, UTC_TIMESTAMP(6), NULL), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE paused_at = IF(VALUES(paused_at) IS NULL, NULL, COALESCE(paused_at, VALUES(paused_at))), updated_at = VALUES(updated_at)

-- name: paused_queues
SELECT name, paused_at FROM `{p}queues` WHERE paused_at IS NOT NULL

-- name: record_schedule
-- The slots only move forward. MySQL evaluates the assignments left to
-- right, each seeing the ones before it: last_slot is assigned last.
INSERT INTO `{p}schedules` (name, spec, last_slot, last_job, next_slot, updated_at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE spec = VALUES(spec),
  last_job = IF(last_slot IS NULL OR VALUES(last_slot) >= last_slot, VALUES(last_job), last_job),
  next_slot = IF(last_slot IS NULL OR VALUES(last_slot) >= last_slot, VALUES(next_slot), next_slot),
  last_slot = GREATEST(COALESCE(last_slot, VALUES(last_slot)), VALUES(last_slot)),
  updated_at = VALUES(updated_at)

-- name: schedules
SELECT name, spec, last_slot, last_job, next_slot, updated_at FROM `{p}schedules` ORDER BY name

-- name: touch_schedule
-- (name.) A started process that has the schedule says it still does,
-- so that prune_schedules keeps the row; a schedule with no row gets
-- none (its first slot records it).
UPDATE `{p}schedules` SET updated_at = UTC_TIMESTAMP(6) WHERE name = ?

-- name: prune_schedules
-- (age µs.) Rows that no process recorded or touched for that long (the
-- database's clock).
DELETE FROM `{p}schedules` WHERE updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND

-- name: register_process
-- (id, kind, host, pid, version, queues JSON, ttl µs.) started_at
-- is kept while the row is alive; a row that had expired starts anew.
-- MySQL evaluates the assignments left to right, each seeing the ones
-- before it: started_at reads expires_at before it is assigned.
INSERT INTO `{p}processes` (id, kind, host, pid, version, queues, started_at, heartbeat_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  started_at = IF(expires_at < UTC_TIMESTAMP(6), VALUES(started_at), started_at),
  kind = VALUES(kind), host = VALUES(host), pid = VALUES(pid), version = VALUES(version), queues = VALUES(queues),
  heartbeat_at = VALUES(heartbeat_at), expires_at = VALUES(expires_at)

-- name: remove_process
DELETE FROM `{p}processes` WHERE id = ?

-- name: processes
-- Alive first, then by kind and id; alive by the database's clock.
SELECT id, kind, host, pid, version, queues, started_at, heartbeat_at, expires_at, expires_at > UTC_TIMESTAMP(6) AS alive
  FROM `{p}processes`
 ORDER BY alive DESC, kind, id

-- name: prune_processes
DELETE FROM `{p}processes` WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND

-- Queue limits (see migrations/010_limits.sql and limits.go).
-- SetQueueLimits, in one transaction: set_queue_limits upserts only the
-- limit columns (a pause is kept, as pause_queue keeps the limits), then
-- the missing slots are created and the slots beyond the limits deleted.
-- The key weights (key_weights) are not limits: they are kept.
-- (queue, max_running, rate, rate_period_us, key_max_running, key_order,
-- key_rate, key_rate_period_us, key_fair; NULL for none.)
-- name: set_queue_limits
INSERT INTO `{p}queues` (name, paused_at, updated_at, max_running, rate, rate_period_us, key_max_running, key_order, key_rate, key_rate_period_us, key_fair) VALUES (?, NULL, UTC_TIMESTAMP(6), ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE max_running = VALUES(max_running), rate = VALUES(rate), rate_period_us = VALUES(rate_period_us), key_max_running = VALUES(key_max_running), key_order = VALUES(key_order), key_rate = VALUES(key_rate), key_rate_period_us = VALUES(key_rate_period_us), key_fair = VALUES(key_fair), updated_at = VALUES(updated_at)

-- SetKeyWeights upserts only key_weights (migrations/015_fair.sql): a
-- new row has no pause and no limits, as a queue without a row. (queue,
-- weights or NULL.)
-- name: set_key_weights
INSERT INTO `{p}queues` (name, paused_at, updated_at, key_weights) VALUES (?, NULL, UTC_TIMESTAMP(6), ?)
ON DUPLICATE KEY UPDATE key_weights = VALUES(key_weights), updated_at = VALUES(updated_at)

-- name: key_weights
SELECT name, key_weights FROM `{p}queues` WHERE key_weights IS NOT NULL

-- (queue, type, count): how many of the slots [0, count) exist.
-- name: slot_count
SELECT COUNT(*) FROM `{p}limit_slots` WHERE queue = ? AND type = ? AND lkey = '' AND n < ?

-- slot_insert_head + slot_insert_row per slot (queue, type, n) +
-- slot_insert_tail: create slots, keeping those that exist.
-- name: slot_insert_head
INSERT INTO `{p}limit_slots` (queue, type, lkey, n) VALUES

-- name: slot_insert_row
(?, ?, '', ?)

-- name: slot_insert_tail
ON DUPLICATE KEY UPDATE n = n

-- Locks every concurrency slot at or beyond the new limit, held or not,
-- until SetQueueLimits commits: an attempt cannot free one meanwhile, so
-- a claim that read the old limits and locks such a slot freed later
-- reads the new limits after its lock (limitsStill), and one that locked
-- it first makes the change wait for it. (queue, max_running.)
-- name: slot_lock_above
SELECT n FROM `{p}limit_slots` WHERE queue = ? AND type = 'c' AND lkey = '' AND n >= ? ORDER BY n FOR UPDATE

-- Concurrency slots at or beyond the limit that no attempt holds and no
-- owner has leased; a held one stays until its attempt ends or its owner
-- gives it back (then the rescue's sweep deletes it). (queue,
-- max_running.)
-- name: slot_trim_c
DELETE FROM `{p}limit_slots` WHERE queue = ? AND type = 'c' AND lkey = '' AND n >= ? AND job_id IS NULL AND owner IS NULL

-- Rate slots at or beyond the rate whose start has left the window, or
-- that never admitted one; all of them when the queue has no rate.
-- Claims ignore those beyond the rate: a lowered rate counts the starts
-- of its first slots, and those beyond it within the window stay, so
-- that a rate raised again within it counts them (no window holds more
-- starts than the highest rate in force during it). (queue, rate, rate,
-- period µs.)
-- name: slot_trim_r
DELETE FROM `{p}limit_slots` WHERE queue = ? AND type = 'r' AND lkey = '' AND n >= ? AND (? = 0 OR used_at IS NULL OR used_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)

-- name: queue_limits
SELECT name, max_running, rate, rate_period_us, key_max_running, key_order, key_rate, key_rate_period_us, key_fair FROM `{p}queues` WHERE max_running IS NOT NULL OR rate IS NOT NULL OR key_max_running IS NOT NULL OR key_rate IS NOT NULL OR key_fair IS NOT NULL

-- LimitUsage, one statement by the database's clock: per limited queue,
-- the concurrency slots held (by an attempt, or leased to an owner in a
-- block), the starts within the window and how long until the oldest of
-- them leaves it.
-- name: limit_usage
SELECT q.name, q.max_running, q.rate, q.rate_period_us, q.key_max_running, q.key_order, q.key_rate, q.key_rate_period_us, q.key_fair,
  (SELECT COUNT(*) FROM `{p}limit_slots` s WHERE s.queue = q.name AND s.type = 'c' AND s.lkey = '' AND (s.job_id > 0 OR s.owner IS NOT NULL)),
  (SELECT COUNT(*) FROM `{p}limit_slots` s WHERE s.queue = q.name AND s.type = 'r' AND s.lkey = '' AND s.n < q.rate AND s.used_at > UTC_TIMESTAMP(6) - INTERVAL q.rate_period_us MICROSECOND),
  (SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(s.used_at) + INTERVAL q.rate_period_us MICROSECOND) FROM `{p}limit_slots` s WHERE s.queue = q.name AND s.type = 'r' AND s.lkey = '' AND s.n < q.rate AND s.used_at > UTC_TIMESTAMP(6) - INTERVAL q.rate_period_us MICROSECOND)
  FROM `{p}queues` q WHERE q.max_running IS NOT NULL OR q.rate IS NOT NULL OR q.key_max_running IS NOT NULL OR q.key_rate IS NOT NULL OR q.key_fair IS NOT NULL

-- ClaimLimited. limits_read is a plain read of the queue's limits and of
-- how many concurrency slots at or beyond max_running are still held by
-- attempts or leased to owners (a lowered limit: they count against it
-- until the attempts end and the owners give them back), then
-- the queue's key weights (a Fair queue's). A queue without limits is
-- claimed by Claim. (queue.)
-- name: limits_read
SELECT q.max_running, q.rate, q.rate_period_us, q.key_max_running, q.key_order, q.key_rate, q.key_rate_period_us, q.key_fair, (SELECT COUNT(*) FROM `{p}limit_slots` s WHERE s.queue = q.name AND s.type = 'c' AND s.lkey = '' AND s.n >= q.max_running AND (s.job_id IS NOT NULL OR s.owner IS NOT NULL)), q.key_weights FROM `{p}queues` q WHERE q.name = ?

-- With SKIP LOCKED (the skip-locked strategy), in the claim's
-- transaction and before the jobs: lock up to want free concurrency slots,
-- neither held by an attempt nor leased to an owner (queue, max_running,
-- want; LeaseSlots locks the free slots it takes with this statement too),
-- and up to want rate slots whose last start has left the window (queue,
-- rate, period µs, want), skipping the slots other claimers hold. Slots
-- before jobs in every claim, so claimers lock in one order; and they
-- never wait.
-- name: slot_lock_c
SELECT n FROM `{p}limit_slots` WHERE queue = ? AND type = 'c' AND lkey = '' AND n < ? AND job_id IS NULL AND owner IS NULL ORDER BY n LIMIT ? FOR UPDATE {skip}

-- name: slot_lock_r
SELECT n FROM `{p}limit_slots` WHERE queue = ? AND type = 'r' AND lkey = '' AND n < ? AND (used_at IS NULL OR used_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND) ORDER BY n LIMIT ? FOR UPDATE {skip}

-- Without SKIP LOCKED (the optimistic strategy): reserve the same slots
-- with a conditional UPDATE that marks them with this claim's reservation
-- (a negative job_id, never a job's); the rows it changed are the
-- claim's, and a slot another claim reserved or took is not free any
-- more once that claim commits (a reservation never commits: the claim
-- turns it into a holder or clears it); nor is one leased to an owner.
-- Rows are locked in slot order.
-- (marker, queue, max_running, want) and (marker, queue, rate, period µs,
-- want).
-- name: slot_reserve_c
UPDATE `{p}limit_slots` SET job_id = ? WHERE queue = ? AND type = 'c' AND lkey = '' AND n < ? AND job_id IS NULL AND owner IS NULL{intx} ORDER BY n LIMIT ?

-- name: slot_reserve_r
UPDATE `{p}limit_slots` SET job_id = ? WHERE queue = ? AND type = 'r' AND lkey = '' AND n < ? AND job_id IS NULL AND (used_at IS NULL OR used_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND){intx} ORDER BY n LIMIT ?

-- The slots this claim reserved (marker): a read of its own changes.
-- name: slot_reserved
SELECT type, n FROM `{p}limit_slots` WHERE job_id = ? ORDER BY type, n

-- Clears the reservations the claim did not use (marker).
-- name: slot_unreserve
UPDATE `{p}limit_slots` SET job_id = NULL WHERE job_id = ?{intx}

-- slot_take gives the claimed attempts the slots of one type that this
-- claim locked (or reserved with its marker): a concurrency slot gets the
-- job and the attempt's fence, a rate slot the start's time (its job and
-- fence stay NULL); used_at is the attempt's attempted_at, the clock value
-- the claim wrote. {cases} is one "WHEN ? THEN ?" per slot (slot number,
-- value) and {ids} the slot numbers. Only a slot still free, or reserved
-- with the marker, and leased to no owner, is taken, and the driver
-- requires every one of them:
-- a slot the claim no longer holds is never taken over from another
-- attempt. (job cases, fence cases, used_at cases, queue, type, slot
-- numbers, marker: 0 without a reservation.)
-- name: slot_take
UPDATE `{p}limit_slots` SET job_id = CASE n {cases} END, fence = CASE n {cases} END, used_at = CASE n {cases} END WHERE queue = ? AND type = ? AND lkey = '' AND n IN ({ids}) AND (job_id IS NULL OR job_id = ?) AND owner IS NULL{intx}

-- How long until the oldest start of the rate's window leaves it, when
-- the rate held jobs back; 0 when a slot never admitted a start: open,
-- it was skipped because another claim had it locked, and is open again
-- once that claim ends unless it took it. (period µs, queue, rate.)
-- name: slot_retry_in
SELECT IF(COUNT(*) > COUNT(used_at), 0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(used_at) + INTERVAL ? MICROSECOND)) FROM `{p}limit_slots` WHERE queue = ? AND type = 'r' AND lkey = '' AND n < ?

-- Whether the queue has a due job (a claim the limits cut to nothing is
-- Held only then). (queue.)
-- name: due_exists
SELECT EXISTS (SELECT 1 FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ?)

-- The rescue's sweep. slot_stale is a plain read of the slots whose
-- holder is no longer running under the slot's fence (a holder's outcome
-- frees its slot in its own statement, so these are rare: an attempt
-- ended by a path that could not see it). The read and the job's state
-- come from one snapshot; a fence never runs again once its attempt
-- ended, so slot_free, fenced by the slot's job and fence, frees only
-- that stale holder and never a slot taken meanwhile. (limit.)
-- name: slot_stale
SELECT s.queue, s.type, s.lkey, s.n, s.job_id, s.fence FROM `{p}limit_slots` s LEFT JOIN `{p}jobs` j ON j.id = s.job_id WHERE s.job_id > 0 AND s.fence IS NOT NULL AND (j.id IS NULL OR j.fence <> s.fence OR j.state <> 'running') LIMIT ?

-- (queue, type, lkey, n, job_id, fence.)
-- name: slot_free
UPDATE `{p}limit_slots` SET job_id = NULL, fence = NULL WHERE queue = ? AND type = ? AND lkey = ? AND n = ? AND job_id = ? AND fence = ?

-- The highest concurrency slot of each queue (a loose index scan of the
-- primary key), compared with the queue's limit to find slots to delete.
-- name: slot_max_c
SELECT queue, MAX(n) FROM `{p}limit_slots` WHERE type = 'c' AND lkey = '' GROUP BY queue

-- Locks the queue's row (the one SetQueueLimits upserts first) before the
-- sweep deletes its slots beyond the limit: the sweep and SetQueueLimits
-- serialise on it, so the sweep never deletes slots of a limit just
-- raised. (queue.)
-- name: slot_lock_queue
SELECT max_running FROM `{p}queues` WHERE name = ? FOR UPDATE

-- Slot blocks (migrations/018_slot_blocks.sql, blocks.go): a queue's
-- concurrency slots leased to an owner (a process's worker id) until
-- leased_until. LeaseSlots runs, in one transaction on the lease path,
-- queue by queue in name order: lease_limit, lease_read, then
-- lease_give_back and lease_renew when the owner holds slots, then the
-- take of free slots (slot_lock_c and lease_take with SKIP LOCKED,
-- lease_take_free without), and last, when the owner holds any,
-- lease_others, which locks nothing. Its locks come in one order: the
-- queue's row, then its slots; SetQueueLimits and the rescue's trim
-- take them in the same order, and claims lock no queue row. A
-- skip-locked claim skips the slots a lease holds; an optimistic one
-- waits only for a slot a lease is taking, as it waits for one another
-- claim reserved (see lease_give_back and lease_take_free). The writes
-- carry {intx} (see "Transactions on Galera" below): after the cluster
-- aborted the transaction their counts fall short, and the driver runs
-- it again.
--
-- lease_limit reads the queue's MaxRunning under a shared lock of its
-- row, which SetQueueLimits (its first statement) and the rescue's trim
-- of the queue's slots (slot_lock_queue) lock exclusively: the limit
-- cannot change before the lease commits, and a change under way is
-- waited for, so the slots below the limit read are the limit's. Leases
-- of other owners share the lock. No row: no limit. (queue.)
-- name: lease_limit
SELECT max_running FROM `{p}queues` WHERE name = ? LOCK IN SHARE MODE

-- A plain read (it locks nothing and never waits) of the queue's
-- concurrency slots the owner holds, at any n (those at or beyond a
-- lowered limit too: it keeps them while it asks for them), and of
-- those at or beyond the limit held by an attempt or leased to another
-- owner (a lowered limit: while there is one the owner takes no slot),
-- as (n, the owner's), in slot order. Nobody but the owner leases slots
-- to it, and the rescue that gives them back re-checks their lease on
-- their latest version, which the renewal below has locked: the owner's
-- slots read are still its own when lease_renew counts them, but for
-- any the rescue gave back before, which the count leaves out. (owner,
-- queue, owner, max_running.)
-- name: lease_read
SELECT n, owner <=> ? FROM `{p}limit_slots` WHERE queue = ? AND type = 'c' AND lkey = '' AND (owner = ? OR (n >= ? AND (job_id IS NOT NULL OR owner IS NOT NULL))) ORDER BY n

-- Gives back the owner's slots of the queue from slot n on: those
-- beyond the ones it keeps, its lowest, as many as it wants (those
-- below the limit first, then those at or beyond a lowered one, whose
-- numbers are higher), or all of them when the queue has no limit (n
-- its lowest). Under READ COMMITTED an UPDATE that meets a row another
-- transaction has locked reads the row's last committed version and
-- waits only if that version matches: here only the owner's own slots
-- do, so the statement never waits for a claim's slot (nor a claim for
-- the owner's: its free slot reads find them leased). (queue, owner,
-- n.)
-- name: lease_give_back
UPDATE `{p}limit_slots` SET owner = NULL, leased_until = NULL WHERE queue = ? AND type = 'c' AND lkey = '' AND owner = ? AND n >= ?{intx}

-- Renews the lease of every slot of the queue the owner still holds,
-- those it keeps, until ttl from the database's clock; the matched count
-- is what it kept. (ttl µs, queue, owner.)
-- name: lease_renew
UPDATE `{p}limit_slots` SET leased_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE queue = ? AND type = 'c' AND lkey = '' AND owner = ?{intx}

-- With SKIP LOCKED: leases to the owner the free slots slot_lock_c
-- locked (skipping those claims and other leases hold), each only while
-- still free; the driver requires every one. {ids} is the slot numbers.
-- (owner, ttl µs, queue, slot numbers.)
-- name: lease_take
UPDATE `{p}limit_slots` SET owner = ?, leased_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE queue = ? AND type = 'c' AND lkey = '' AND n IN ({ids}) AND job_id IS NULL AND owner IS NULL{intx}

-- Without SKIP LOCKED (the optimistic strategy): the same in one
-- conditional UPDATE, as slot_reserve_c reserves slots for a claim: the
-- lowest free slots below the limit, in slot order; a slot whose last
-- committed version is free but that a claim or another lease has
-- locked is waited for (for the length of that transaction, whose own
-- locks come in slot order too) and taken only if still free; the
-- matched count is what it took. (owner, ttl µs, queue, max_running,
-- count.)
-- name: lease_take_free
UPDATE `{p}limit_slots` SET owner = ?, leased_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE queue = ? AND type = 'c' AND lkey = '' AND n < ? AND job_id IS NULL AND owner IS NULL{intx} ORDER BY n LIMIT ?

-- After the writes, for SlotBlock.Usable: a plain read (it locks
-- nothing and never waits) of the queue's concurrency slots, at any n,
-- held by an attempt or leased to another owner, as their numbers. The
-- owner may use min(Held, max_running less their count), never below 0:
-- Held, but fewer while a lowered limit is exceeded. Under READ
-- COMMITTED the read sees the transaction's own writes and the others'
-- last committed versions (a claim's reservation never commits, and is
-- never seen); on Galera, what the node has applied, as lease_read. A
-- range of the primary key, the queue's concurrency slots. (queue,
-- owner.)
-- name: lease_others
SELECT n FROM `{p}limit_slots` WHERE queue = ? AND type = 'c' AND lkey = '' AND (job_id IS NOT NULL OR owner <> ?)

-- The rescue's giving back of blocks whose lease expired. block_expired
-- is a plain read of up to limit expired leases, oldest first, through
-- slot_lease_idx (a range of the owned slots only), as (queue, owner)
-- per slot, which the driver takes once each. (limit.)
-- name: block_expired
SELECT queue, owner FROM `{p}limit_slots` FORCE INDEX (slot_lease_idx) WHERE leased_until < UTC_TIMESTAMP(6) ORDER BY leased_until LIMIT ?

-- block_free gives back the owner's slots of the queue whose lease has
-- expired if no job of the queue runs under a claim of the owner. The
-- UPDATE locks each slot and evaluates its lease on the row's latest
-- version: a block renewed since block_expired read it stays with its
-- owner, and one whose renewal is under way is waited for (LeaseSlots is
-- short), then kept; the claims' slots, whose last committed version is
-- not the owner's, are passed over without waiting (see
-- lease_give_back). The running jobs are a consistent read, which takes
-- no lock (the subquery of a single-table UPDATE, under READ COMMITTED),
-- of the statement's snapshot, through lease_idx, whose non-NULL entries
-- are the running jobs: all of them, for want of an index by worker,
-- paid only by a rescue round that meets an expired block. A claim that
-- commits after the snapshot came back after the lease had expired (the
-- statement's clock, read first, already found it expired), and its
-- owner does not start its jobs. On Galera the statement first applies
-- what the cluster has ordered (causal_ack): the owner's claims may
-- have been made through another node. (queue, owner, queue, owner.)
-- name: block_free
UPDATE `{p}limit_slots` SET owner = NULL, leased_until = NULL WHERE queue = ? AND type = 'c' AND lkey = '' AND owner = ? AND leased_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM `{p}jobs` FORCE INDEX (lease_idx) WHERE lease_expires_at IS NOT NULL AND state = 'running' AND queue = ? AND attempted_by = ?)

-- Key limits (migrations/013_keys.sql, keys.go). A limited claim of a
-- queue with key limits first walks the distinct keys of its available
-- keyed jobs in key order from the key after its cursor (key_walk; past
-- the last key it wraps around, key_walk_upto, up to the cursor): a window
-- of at most count entries of key_idx from a seek past the last key
-- found, whose distinct keys the driver takes (the window's last key may
-- have more jobs beyond it; the next window seeks past it), so that the
-- walk's cost does not grow with a key's depth (a DISTINCT or GROUP BY
-- with a LIMIT reads every job of the keys it returns unless the server
-- picks a loose index scan, which it does not when most keys are
-- shallow), and shallow keys take one round trip for many keys. (queue,
-- after, count) and (queue, after, upto, count.)
-- name: key_walk
SELECT lkey FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey > ? ORDER BY lkey LIMIT ?

-- name: key_walk_upto
SELECT lkey FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey > ? AND lkey <= ? ORDER BY lkey LIMIT ?

-- When key_walk's window found deep keys (it ended before it held the keys
-- wanted), the walk reads the rest of its keys in one statement that
-- groups key_idx by (akey_queue, lkey): grouped by both, the server reads
-- it by a loose index scan, a seek per key, when its statistics say keys
-- are deep (it does not when grouped by lkey alone), and else reads the
-- entries of the keys it returns, few when they are shallow. (queue,
-- after, count) and (queue, after, upto, count.)
-- name: key_walk_grouped
SELECT lkey FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey > ? GROUP BY akey_queue, lkey ORDER BY akey_queue, lkey LIMIT ?

-- name: key_walk_grouped_upto
SELECT lkey FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey > ? AND lkey <= ? GROUP BY akey_queue, lkey ORDER BY akey_queue, lkey LIMIT ?

-- A Fair claim that goes on with the turn of the key at its cursor reads
-- that key first: whether it still has an available job. (queue, key.)
-- name: key_walk_at
SELECT lkey FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey = ? ORDER BY lkey LIMIT 1

-- A plain read of the walked keys' slots: how many exist below the
-- limit, how many a running attempt holds and how many are kept for a
-- job, at any n: after a lowered limit the attempts holding slots at or
-- beyond it still count against it until they end. {keys} is one "?" per
-- key. (limit, queue, keys.)
-- name: key_slot_stats
SELECT lkey, COALESCE(SUM(n < ?), 0), COALESCE(SUM(job_id IS NOT NULL AND fence IS NOT NULL), 0), COALESCE(SUM(job_id IS NOT NULL AND fence IS NULL), 0) FROM `{p}limit_slots` WHERE queue = ? AND type = 'k' AND lkey IN ({keys}) GROUP BY lkey

-- The missing key slots of the candidate keys, one (queue, key, n) row
-- each, in key order, in a statement of its own before the claim's
-- transaction (autocommit): a slot another claim holds or just made is
-- kept as it is, and the claim never waits for one.
-- name: key_slot_insert
INSERT IGNORE INTO `{p}limit_slots` (queue, type, lkey, n, used_at) VALUES

-- name: key_slot_insert_row
(?, 'k', ?, ?, UTC_TIMESTAMP(6))

-- In the claim's transaction, in one statement, key by key in key order:
-- lock up to count open slots of each key, free ones below the limit and
-- ones kept for a job at any n (a lowered limit can leave one at or
-- beyond it, for its job alone), skipping those other claims hold. The driver joins one
-- parenthesized part per key with UNION ALL (each part keeps its own
-- LIMIT, which an IN list could not), padding the number of parts to a
-- power of two with parts of a NULL queue that match nothing, so that
-- each size is prepared once. (queue, key, limit, count per part.)
-- name: key_slot_lock_part
(SELECT lkey, n, job_id FROM `{p}limit_slots` WHERE queue = ? AND type = 'k' AND lkey = ? AND n >= 0 AND ((job_id IS NULL AND n < ?) OR (job_id > 0 AND fence IS NULL)) ORDER BY n LIMIT ? FOR UPDATE {skip})

-- When the claim may take as many slots of a key as the limit (limit at
-- most count), the parts' LIMITs bound nothing: the same slots are locked
-- by one range read of the primary key over the keys, in key then slot
-- order, which costs the server one statement instead of one per key.
-- {keys} is one "?" per key, padded to a power of two by repeating the
-- first. (queue, keys, limit.)
-- name: key_slot_lock_in
SELECT lkey, n, job_id FROM `{p}limit_slots` WHERE queue = ? AND type = 'k' AND lkey IN ({keys}) AND n >= 0 AND ((job_id IS NULL AND n < ?) OR (job_id > 0 AND fence IS NULL)) ORDER BY lkey, n FOR UPDATE {skip}

-- The next available jobs of the keys with open slots, in one statement
-- of one part per key joined and padded as key_slot_lock_part's: a key's
-- oldest jobs by id (key_head_part; Ordered: the first is the head, a
-- second says more wait), or its next ones by priority then id
-- (key_next_part), read by key_idx and key_prio_idx without reading the
-- key's other jobs; the driver orders each key's rows. (queue, key,
-- count per part.)
-- name: key_head_part
(SELECT lkey, priority, id FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? AND lkey = ? ORDER BY id LIMIT ?)

-- name: key_next_part
(SELECT lkey, priority, id FROM `{p}jobs` FORCE INDEX (key_prio_idx) WHERE akey_queue = ? AND lkey = ? ORDER BY priority, id LIMIT ?)

-- The same for keys the walk found shallow (readKeyJobs): every
-- available job of theirs, in one range read of key_prio_idx (which
-- covers the columns) over the keys, which costs the server one
-- statement instead of one per key; the driver orders each key's rows
-- (Ordered: by id) and keeps as many as it wanted. {keys} is one "?" per
-- key, padded to a power of two by repeating the first. (queue, keys.)
-- name: key_jobs_in
SELECT lkey, priority, id FROM `{p}jobs` FORCE INDEX (key_prio_idx) WHERE akey_queue = ? AND lkey IN ({keys})

-- Locks the keyed jobs picked for the key slots the claim locked, those
-- still available, skipping any another transaction holds (claim_mark_queued
-- then marks them). (queue, ids.)
-- name: key_claim_select
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` WHERE queue = ? AND state = 'available' AND lkey IS NOT NULL AND id IN ({ids}) ORDER BY id FOR UPDATE {skip}

-- The jobs without a key of a key-limited queue, after the keyed ones, in
-- claim order. (queue, queue, count.)
-- name: claim_select_nokey
SELECT UTC_TIMESTAMP(6), {fence_floor}, {cols} FROM `{p}jobs` FORCE INDEX (claim_idx) WHERE avail_queue = ? AND NOT EXISTS (SELECT 1 FROM `{p}queues` WHERE name = ? AND paused_at IS NOT NULL) AND state = 'available' AND lkey IS NULL ORDER BY priority, scheduled_at, id LIMIT ? FOR UPDATE {skip}

-- Takes the key slots the claim locked for its attempts, in one
-- statement: each gets its attempt's job and fence and the claim's clock,
-- only while still free or kept for that same job (the driver requires
-- every one). {cases} is one "WHEN lkey = ? AND n = ? THEN ?" per slot
-- (key, n, value) and {pairs} one "(?, ?)" per slot (key, n). (job
-- cases, fence cases, used_at, queue, pairs, job cases again.)
-- name: key_slot_take
UPDATE `{p}limit_slots` SET job_id = CASE {cases} END, fence = CASE {cases} END, used_at = ? WHERE queue = ? AND type = 'k' AND (lkey, n) IN ({pairs}) AND (job_id IS NULL OR (job_id = CASE {cases} END AND fence IS NULL)){intx}

-- LimitUsage of a key-limited queue: the keys with a slot held or kept,
-- and per key with available jobs, their count, the key's held, kept and
-- kept-for-an-available-job slots below the limit and its rate slots
-- below the rate stamped within the window. (queue) and (queue, queue,
-- limit, queue, key rate, key rate period µs.)
-- name: keys_running
SELECT COUNT(DISTINCT lkey) FROM `{p}limit_slots` WHERE queue = ? AND type = 'k' AND job_id > 0

-- name: key_usage
SELECT a.cnt, COALESCE(s.held, 0), COALESCE(s.kept, 0), COALESCE(s.kept_avail, 0), COALESCE(r.closed, 0) FROM (SELECT lkey, COUNT(*) AS cnt FROM `{p}jobs` FORCE INDEX (key_idx) WHERE akey_queue = ? GROUP BY lkey) a LEFT JOIN (SELECT s.lkey, SUM(s.fence IS NOT NULL) AS held, SUM(s.fence IS NULL) AS kept, SUM(s.fence IS NULL AND j.state = 'available') AS kept_avail FROM `{p}limit_slots` s LEFT JOIN `{p}jobs` j ON j.id = s.job_id WHERE s.queue = ? AND s.type = 'k' AND s.n < ? AND s.job_id > 0 GROUP BY s.lkey) s ON s.lkey = a.lkey LEFT JOIN (SELECT lkey, COUNT(*) AS closed FROM `{p}limit_slots` WHERE queue = ? AND type = 'w' AND n < ? AND used_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND GROUP BY lkey) r ON r.lkey = a.lkey

-- The rescue's sweep of key slots: slots kept for a job that no longer
-- waits to run (finished, deleted, or claimed by hand), freed one by one,
-- fenced by the job and the row's state (limit; queue, key, n, job, job);
-- then the free key slots unused for a minute, at or beyond their key's
-- limit, or of a queue without key limits are deleted: claims make them
-- again when needed (limit).
-- name: key_kept_stale
SELECT s.queue, s.lkey, s.n, s.job_id FROM `{p}limit_slots` s LEFT JOIN `{p}jobs` j ON j.id = s.job_id WHERE s.type = 'k' AND s.job_id > 0 AND s.fence IS NULL AND (j.id IS NULL OR j.state NOT IN ('available', 'scheduled', 'retryable')) LIMIT ?

-- name: key_kept_free
UPDATE `{p}limit_slots` SET job_id = NULL WHERE queue = ? AND type = 'k' AND lkey = ? AND n = ? AND job_id = ? AND fence IS NULL AND NOT EXISTS (SELECT 1 FROM `{p}jobs` WHERE id = ? AND state IN ('available', 'scheduled', 'retryable'))

-- name: key_slot_trim
DELETE FROM `{p}limit_slots` WHERE type = 'k' AND job_id IS NULL AND (used_at < UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE OR n >= COALESCE((SELECT q.key_max_running FROM `{p}queues` q WHERE q.name = `{p}limit_slots`.queue), 0)) LIMIT ?

-- Rates per key (migrations/014_key_rates.sql, keys.go): rate slots are
-- rows of type 'w', one per key and unit of the rate, stamped (used_at)
-- with the start each last admitted; a slot is open when its stamp is at
-- least the period old. key_rate_stats is a plain read, in the claim's
-- walk, of the walked keys' rate slots: how many exist below the rate and
-- how many of them are stamped within the window. {keys} is one "?" per
-- key. (rate, rate, period µs, queue, keys.)
-- name: key_rate_stats
SELECT lkey, COALESCE(SUM(n < ?), 0), COALESCE(SUM(n < ? AND used_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND), 0) FROM `{p}limit_slots` WHERE queue = ? AND type = 'w' AND lkey IN ({keys}) GROUP BY lkey

-- The missing rate slots of the candidate keys, one (queue, key, n) row
-- each, in key order, in a statement of its own before the claim's
-- transaction (autocommit), as key_slot_insert: each is made open
-- (unstamped); a slot that exists is kept as it is.
-- name: key_rate_insert
INSERT IGNORE INTO `{p}limit_slots` (queue, type, lkey, n) VALUES

-- name: key_rate_insert_row
(?, 'w', ?, ?)

-- In the claim's transaction, in one statement joined and padded as
-- key_slot_lock_part's, key by key in key order after the key slots:
-- lock up to count open rate slots below the rate of each key, skipping
-- those other claims hold. (queue, key, rate, period µs, count per part.)
-- name: key_rate_lock_part
(SELECT lkey, n FROM `{p}limit_slots` WHERE queue = ? AND type = 'w' AND lkey = ? AND n < ? AND (used_at IS NULL OR used_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND) ORDER BY n LIMIT ? FOR UPDATE {skip})

-- Stamps the rate slots the claim locked for its attempts with the
-- claim's clock, in one statement, only while each is still open (the
-- driver requires every one). {pairs} is one "(?, ?)" per slot (key, n).
-- (used_at, queue, pairs, period µs.)
-- name: key_rate_take
UPDATE `{p}limit_slots` SET used_at = ? WHERE queue = ? AND type = 'w' AND (lkey, n) IN ({pairs}) AND (used_at IS NULL OR used_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND){intx}

-- How long until the oldest start within the window of the keys a claim
-- found without room leaves it. {keys} is one "?" per key. (period µs,
-- queue, keys, rate, period µs.)
-- name: key_rate_retry_in
SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(used_at) + INTERVAL ? MICROSECOND) FROM `{p}limit_slots` WHERE queue = ? AND type = 'w' AND lkey IN ({keys}) AND n < ? AND used_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND

-- LimitUsage: the keys whose window is full, every rate slot below the
-- rate stamped within it. (queue, rate, period µs, rate.)
-- name: keys_rated
SELECT COUNT(*) FROM (SELECT lkey FROM `{p}limit_slots` WHERE queue = ? AND type = 'w' AND n < ? AND used_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND GROUP BY lkey HAVING COUNT(*) >= ?) f

-- The rescue's sweep of rate slots: those stamped longer ago than the
-- period or a minute, whichever is longer, or never, and those of a
-- queue without a rate per key. A slot stamped within the window is
-- never deleted, beyond a lowered rate too (claims ignore it), so that
-- the rate raised again within the window counts its start; one a claim
-- has locked is deleted, if still unstamped, only once that claim ends.
-- (limit.)
-- name: key_rate_trim
DELETE FROM `{p}limit_slots` WHERE type = 'w' AND NOT EXISTS (SELECT 1 FROM `{p}queues` q WHERE q.name = `{p}limit_slots`.queue AND q.key_rate > 0 AND `{p}limit_slots`.used_at >= UTC_TIMESTAMP(6) - INTERVAL GREATEST(q.key_rate_period_us, 60000000) MICROSECOND) LIMIT ?
