import { ConveyorError, StaleFenceError } from "./errors.js";

/** A job's state, as conveyor names it. */
export type JobState =
  | "available"
  | "scheduled"
  | "running"
  | "retryable"
  | "completed"
  | "discarded"
  | "cancelled";

/** One failed attempt of a job. */
export interface AttemptError {
  attempt: number;
  /** When it failed: RFC 3339, UTC, microseconds. */
  at: string | null;
  error: string;
  trace: string | null;
}

/**
 * A job as the API describes it. Times are RFC 3339 strings in UTC with
 * microseconds (kept as text: a Date would drop the microseconds), null
 * when absent. Ids and fences are JavaScript numbers (exact up to 2^53).
 */
export interface Job<Args = unknown> {
  id: number;
  queue: string;
  kind: string;
  state: JobState;
  args: Args;
  priority: number;
  attempt: number;
  maxAttempts: number;
  /** The job's own timeout; null for the workers' default, -1 for none. */
  timeoutMs: number | null;
  createdAt: string | null;
  scheduledAt: string | null;
  attemptedAt: string | null;
  attemptedBy: string | null;
  leaseExpiresAt: string | null;
  finalizedAt: string | null;
  errors: AttemptError[];
  /** The job's metadata (`EnqueueOptions.metadata`), null when it has none. */
  metadata: Record<string, string> | null;
  /** The job's limit key (`EnqueueOptions.key`), null when it has none. */
  key: string | null;
  /**
   * The result the attempt that completed the job stored (a Go worker's
   * `conveyor.SetResult`, the value a TypeScript handler resolved with), a
   * JSON value; null when there is none, and in job lists and claims,
   * which do not read it.
   */
  result: unknown;
  /**
   * For a batch's callback (and so for a workflow job with dependencies),
   * the batch's id, read from its metadata `conveyor.batch_id`: pass it
   * to `getBatch` to read the states and results of the jobs it waited
   * for. Null for any other job.
   */
  batchId: number | null;
  /**
   * The batch the job is a member of (the server's `batch_id`; the
   * first of a workflow job's that several steps wait for): pass it to
   * `getBatch` to read its jobs and its callback. Null when it is in
   * none or its batch was pruned, and in job lists and claims, which do
   * not read it (`getJob` does).
   */
  memberOf: number | null;
  /**
   * For a batch's callback, the batch it closes as the server recorded
   * it when the batch fired (`callback_of`); null for any other job, and
   * in job lists and claims, which do not read it (`getJob` does).
   */
  callbackOf: number | null;
}

/** A job handed out by a claim, with the fence its acknowledgements must carry. */
export interface ClaimedJob<Args = unknown> extends Job<Args> {
  fence: number;
}

/** Options of a unique job (conveyor.UniqueOpts). */
export interface UniqueOptions {
  byArgs?: boolean;
  argsFields?: string[];
  byQueue?: boolean;
  byPeriodMs?: number;
  states?: JobState[];
}

/** How to enqueue a job; every field is optional. */
export interface EnqueueOptions {
  /** Default "default". */
  queue?: string;
  /** Smaller runs first. */
  priority?: number;
  maxAttempts?: number;
  /** The job's own timeout; -1 for none. */
  timeoutMs?: number;
  /** When to run it (a Date or an RFC 3339 string). */
  runAt?: Date | string;
  /** Run it this long from now. */
  delayMs?: number;
  unique?: UniqueOptions;
  /**
   * Strings that travel with the job outside its arguments (a trace
   * context, a tenant, a request id) and come back in `Job.metadata`. The
   * server refuses (400) a key or value with a NUL character, or more
   * than 64 KiB encoded as JSON. An empty object stores nothing.
   */
  metadata?: Record<string, string>;
  /**
   * The job's limit key: a tenant, an account, a partner. The queue's
   * per-key limits (`QueueLimits.keyMaxRunning`, `ordered`) apply to each
   * key on its own; a job without a key is held only by the queue's own
   * limits. 1 to 255 bytes of UTF-8 without NUL characters (the server
   * refuses others with 400); "" or absent for none. Not part of a
   * unique job's key. It comes back in `Job.key`.
   */
  key?: string;
}

/** One job of `enqueueMany`. */
export interface EnqueueItem<Args = unknown> extends EnqueueOptions {
  kind: string;
  args?: Args;
}

/** One job of a batch as `getBatch` reads it. */
export interface BatchJob {
  id: number;
  /** The job's state; "" once retention deleted it. */
  state: JobState | "";
  /** The job's result (see `Job.result`); null for none. */
  result: unknown;
}

/** A batch: its jobs' states and results, and its callback once enqueued. */
export interface Batch {
  id: number;
  /** When it was enqueued: RFC 3339, UTC, microseconds. */
  createdAt: string | null;
  /** Whether every job has finished (completed, discarded, cancelled or deleted) and none is still to be enqueued (`waitingFor` is empty). */
  finished: boolean;
  /** The callback job's kind. */
  callbackKind: string;
  /** The callback job's id; null until every job has finished and the callback was enqueued. */
  callbackId: number | null;
  /** When the callback was enqueued; null until then. */
  firedAt: string | null;
  /** The jobs counted by state ("" for jobs retention deleted). */
  counts: Record<string, number>;
  /** The batch's jobs by id. */
  jobs: BatchJob[];
  /**
   * For a workflow job's batch: the batches of its dependencies that are
   * workflow jobs with dependencies of their own and are not enqueued
   * yet. Each dependency is one of `jobs` once enqueued.
   */
  waitingFor: number[];
}

/** What `enqueueBatch` enqueued. */
export interface BatchEnqueued {
  /** The batch's id, for `getBatch`. */
  batchId: number;
  /** The jobs' ids, in the order given. */
  ids: number[];
}

/** One job of `enqueueWorkflow`. */
export interface WorkflowJob<Args = unknown> extends EnqueueItem<Args> {
  /** The job's name, unique and non-empty within its workflow. */
  name: string;
  /** Names of the workflow's jobs this one waits for. */
  dependsOn?: string[];
}

/** Options of `enqueueWorkflow`. */
export interface WorkflowOptions {
  /**
   * What becomes of a job one of whose dependencies was discarded or
   * cancelled: "cancel" (the default) marks it to be cancelled, "run" runs
   * it once every dependency has finished. Workers (Go's and this
   * package's `Worker`) cancel such a job before its handler runs, failing
   * it with an error naming the dependency and its state; a program that
   * drives the worker protocol itself must read the job's batch
   * (`getBatch(job.batchId)`) and fail it with `cancel: true`.
   */
  onDependencyFailure?: "cancel" | "run";
}

/** What `enqueueWorkflow` enqueued, by job name. */
export interface WorkflowEnqueued {
  /** Ids of the jobs without dependencies, enqueued at once. */
  jobIds: Record<string, number>;
  /**
   * For each job with dependencies, the batch whose callback it is: its
   * `callbackId` is the job's id once the dependencies have finished.
   */
  batchIds: Record<string, number>;
}

/** The result of enqueueing one job. */
export interface EnqueueResult {
  /** The new job's id, or for a duplicate the id of the job holding the unique key. */
  id: number;
  /** True when nothing was inserted because a unique job's key was held. */
  duplicate: boolean;
}

/** A page of `listJobs`. */
export interface JobPage {
  jobs: Job[];
  /** Pass as `after` for the next page; null at the end. */
  nextAfter: number | null;
  scanned: number;
  scanLimit: number;
  /**
   * True when the page stopped before `limit` jobs because it reached the
   * server's byte budget (`maxPageBytes`); `nextAfter` continues it.
   */
  truncated: boolean;
  /** The server's byte budget of one page. */
  maxPageBytes: number;
}

/** A filter of `listJobs`. */
export interface ListJobsOptions {
  state?: JobState | JobState[];
  queue?: string;
  kind?: string;
  /** Text searched in the arguments. */
  q?: string;
  after?: number;
  limit?: number;
}

/** The body of a claim. */
export interface ClaimOptions {
  /** Default "default". */
  queue?: string;
  /** 1 to 1000; default 1. */
  limit?: number;
  /** Long-poll this long for a job (at most the server's MaxClaimWait, 30s). */
  waitMs?: number;
  /** The claimed jobs' lease, 1s to 1h; default the server's (30s). */
  leaseMs?: number;
  /** Recorded as `attempted_by` ("http:" + worker). */
  worker?: string;
}

/** How a failed attempt is recorded. */
export interface FailOptions {
  error: string;
  trace?: string;
  /** End the job as cancelled, without retry. */
  cancel?: boolean;
  /** Retry after this long instead of the server's backoff. */
  retryInMs?: number;
}

/** Why a queue's available jobs are not started although workers may be free. */
export type Held = "paused" | "concurrency" | "rate" | "key";

/** A queue's flow limits, held across every process claiming from the queue; 0 is no limit. */
export interface QueueLimits {
  /** The most jobs of the queue running at once across every process. */
  maxRunning: number;
  /** The most jobs of the queue started per ratePeriod (by the database's clock). */
  rate: number;
  /** rate's window as a Go duration ("1m", "250ms"); "" without a rate. */
  ratePeriod: string;
  /** ratePeriod in milliseconds; 0 without a rate. */
  ratePeriodMs: number;
  /** The most jobs with the same key running at once across every process; 1 when ordered. */
  keyMaxRunning: number;
  /** Each key's jobs start one at a time, in the order they were enqueued. */
  ordered: boolean;
  /** With ordered: a key's next job may start while a failed job of the key waits for its retry. */
  orderedMoveOn: boolean;
  /** The most jobs with the same key started per keyRatePeriod; 0 for no rate per key. */
  keyRate: number;
  /** keyRate's window as a Go duration ("1h"); "" without a keyRate. */
  keyRatePeriod: string;
  /** keyRatePeriod in milliseconds; 0 without a keyRate. */
  keyRatePeriodMs: number;
  /** The queue's keys are served in turns, each taking up to its weight (setKeyWeights) of a claim per turn. */
  fair: boolean;
}

/** Limits to set: a field left out is no limit (setQueueLimits replaces them whole). */
export interface QueueLimitsInput {
  /** The most jobs running at once, 0 to 100000. */
  maxRunning?: number;
  /** The most jobs started per ratePeriod, 0 to 100000; needs ratePeriod. */
  rate?: number;
  /** rate's window, 1ms to 30 days: a Go duration string ("1m", "30s", "1h30m") or milliseconds. */
  ratePeriod?: string | number;
  /** The most jobs with the same key (`EnqueueOptions.key`) running at once, 0 to 100000 (0 or 1 with ordered). */
  keyMaxRunning?: number;
  /**
   * Each key's jobs start one at a time in enqueue order; a failed job
   * waiting for its retry (or a snoozed one) holds its key.
   */
  ordered?: boolean;
  /** With ordered: a key's next job may start while a failed job of the key waits for its retry. */
  orderedMoveOn?: boolean;
  /**
   * The most jobs with the same key started in any window of
   * keyRatePeriod, by the database's clock, 0 to 100000. Every start
   * counts, whatever its outcome; jobs without a key are not held by it.
   */
  keyRate?: number;
  /** keyRate's window, 1ms to 30 days: a Go duration string ("1h", "30s") or milliseconds; with keyRate only. */
  keyRatePeriod?: string | number;
  /**
   * Serve the queue's keys in turns, so that a key with many waiting jobs
   * does not delay a key with few: each claim takes at most a key's
   * weight (setKeyWeights; 1 for a key not weighed) of its jobs per turn,
   * within its other limits, and gives the keys that have more further
   * turns when it has room left. Jobs without a key come after the keyed
   * ones. It holds no job back.
   */
  fair?: boolean;
}

/** How much of a queue's limits is in use. */
export interface LimitUse {
  /** Jobs holding the queue's concurrency slots. */
  running: number;
  /** Jobs started within the last rate period. */
  started: number;
  /** When started has reached the rate, how long until the window has room again; 0 otherwise. */
  nextStartMs: number;
  /** Keys holding at least one of their slots (keyMaxRunning, ordered). */
  keysRunning: number;
  /** Due available jobs waiting because their key has no slot free for them, or no room left in its keyRate window. */
  keyHeld: number;
  /** Keys whose keyRate window is full. */
  keysRated: number;
}

/** One queue as GET /api/v1/queues lists it. */
export interface QueueInfo {
  queue: string;
  /** Per state: the unfinished ones count every job, the finished ones the last 5 minutes'. */
  counts: Record<JobState, number>;
  /** Age of the oldest available job; null when none is available. */
  oldestAvailableMs: number | null;
  paused: boolean;
  pausedAt: string | null;
  /** How many alive processes work the queue. */
  processes: number;
  /** Jobs are available and no alive process works the queue. */
  unworked: boolean;
  /** The queue's flow limits; null when it has none. */
  limits: QueueLimits | null;
  /** How much of limits is in use; null without limits. */
  limitUse: LimitUse | null;
  /** Why its available jobs wait although workers may be free; null when nothing holds them. */
  held: Held | null;
  /**
   * Jobs of the queue waiting for their dependencies: batch callbacks and
   * workflow jobs not enqueued yet, in no state of counts.
   */
  awaitingDependencies: number;
  /** How many keys of a fair queue have a weight (keyWeights lists them); 0 for a queue that is not fair. */
  weightedKeys: number;
}

export interface ClientOptions {
  /** Where conveyor serve (or the mounted handler) is, e.g. "http://127.0.0.1:8080" or ".../conveyor". */
  baseUrl: string;
  /** An admin bearer token (a read-only token can only read). */
  token?: string;
  /** Bound on each request, default 30s; a long-polling claim gets its wait on top. */
  timeoutMs?: number;
  /** Replaces the global fetch (tests, proxies). */
  fetch?: typeof fetch;
  /** Sent with every request. */
  headers?: Record<string, string>;
}

// Wire shapes (snake_case, as the server writes them).
interface WireJob {
  id: number;
  queue: string;
  kind: string;
  state: JobState;
  args: unknown;
  priority: number;
  attempt: number;
  max_attempts: number;
  timeout_ms: number | null;
  created_at: string | null;
  scheduled_at: string | null;
  attempted_at: string | null;
  attempted_by: string | null;
  lease_expires_at: string | null;
  finalized_at: string | null;
  errors: AttemptError[] | null;
  metadata?: Record<string, string> | null;
  key?: string | null;
  result?: unknown;
  fence?: number;
  batch_id?: number;
  callback_of?: number;
}

function fromWire(w: WireJob): Job {
  return {
    id: w.id,
    queue: w.queue,
    kind: w.kind,
    state: w.state,
    args: w.args,
    priority: w.priority,
    attempt: w.attempt,
    maxAttempts: w.max_attempts,
    timeoutMs: w.timeout_ms,
    createdAt: w.created_at,
    scheduledAt: w.scheduled_at,
    attemptedAt: w.attempted_at,
    attemptedBy: w.attempted_by,
    leaseExpiresAt: w.lease_expires_at,
    finalizedAt: w.finalized_at,
    errors: w.errors ?? [],
    metadata: w.metadata ?? null,
    key: w.key ?? null,
    result: w.result ?? null,
    batchId: batchIdOf(w.metadata),
    memberOf: w.batch_id ?? null,
    callbackOf: w.callback_of ?? null,
  };
}

/** The metadata key under which a batch's callback job names its batch. */
const batchMetaKey = "conveyor.batch_id";

function batchIdOf(m: Record<string, string> | null | undefined): number | null {
  const v = m?.[batchMetaKey];
  if (v === undefined || !/^[1-9][0-9]*$/.test(v)) return null;
  const id = Number(v);
  return Number.isSafeInteger(id) ? id : null;
}

interface WireBatch {
  id: number;
  created_at: string | null;
  finished: boolean;
  callback_kind: string;
  callback_id: number | null;
  fired_at: string | null;
  counts: Record<string, number> | null;
  jobs: { id: number; state: JobState | ""; result?: unknown }[] | null;
  waiting_for?: number[] | null;
  /** The after= of the next page of jobs; null (or absent) on the last. */
  next_after?: number | null;
}

function toWire(kind: string, args: unknown, o: EnqueueOptions = {}): Record<string, unknown> {
  if (typeof kind !== "string" || kind === "") {
    throw new TypeError("enqueue: kind must be a non-empty string");
  }
  const body: Record<string, unknown> = { kind, args: args === undefined ? {} : args };
  if (o.queue !== undefined) body.queue = o.queue;
  if (o.priority !== undefined) body.priority = o.priority;
  if (o.maxAttempts !== undefined) body.max_attempts = o.maxAttempts;
  if (o.timeoutMs !== undefined) body.timeout_ms = o.timeoutMs;
  if (o.runAt !== undefined) body.run_at = o.runAt instanceof Date ? o.runAt.toISOString() : o.runAt;
  if (o.delayMs !== undefined) body.delay_ms = o.delayMs;
  if (o.metadata !== undefined) body.metadata = o.metadata;
  if (o.key !== undefined) body.key = o.key;
  if (o.unique !== undefined) {
    const u = o.unique;
    body.unique = {
      by_args: u.byArgs ?? false,
      args_fields: u.argsFields ?? null,
      by_queue: u.byQueue ?? false,
      by_period_ms: u.byPeriodMs ?? 0,
      states: u.states ?? null,
    };
  }
  return body;
}

interface WireLimits {
  max_running: number;
  rate: number;
  rate_period: string;
  rate_period_ms: number;
  key_max_running?: number;
  ordered?: boolean;
  ordered_move_on?: boolean;
  key_rate?: number;
  key_rate_period?: string;
  key_rate_period_ms?: number;
  fair?: boolean;
}

interface WireQueue {
  queue: string;
  counts: Record<JobState, number>;
  oldest_available_ms: number | null;
  paused: boolean;
  paused_at: string | null;
  processes: number;
  unworked: boolean;
  limits?: WireLimits | null;
  limit_use?: { running: number; started: number; next_start_ms: number; keys_running?: number; key_held?: number; keys_rated?: number } | null;
  held?: Held | null;
  awaiting_dependencies?: number;
  weighted_keys?: number;
}

function limitsFromWire(w: WireLimits | null | undefined): QueueLimits | null {
  if (!w) return null;
  return {
    maxRunning: w.max_running,
    rate: w.rate,
    ratePeriod: w.rate_period,
    ratePeriodMs: w.rate_period_ms,
    keyMaxRunning: w.key_max_running ?? 0,
    ordered: w.ordered ?? false,
    orderedMoveOn: w.ordered_move_on ?? false,
    keyRate: w.key_rate ?? 0,
    keyRatePeriod: w.key_rate_period ?? "",
    keyRatePeriodMs: w.key_rate_period_ms ?? 0,
    fair: w.fair ?? false,
  };
}

function limitsToWire(l: QueueLimitsInput): Record<string, unknown> {
  if (!l || typeof l !== "object") {
    throw new TypeError("setQueueLimits: give the limits, e.g. { maxRunning: 5 } or { rate: 100, ratePeriod: \"1m\" }");
  }
  const body: Record<string, unknown> = {};
  if (l.maxRunning !== undefined) body.max_running = l.maxRunning;
  if (l.rate !== undefined) body.rate = l.rate;
  if (typeof l.ratePeriod === "number") body.rate_period_ms = l.ratePeriod;
  else if (l.ratePeriod !== undefined) body.rate_period = l.ratePeriod;
  if (l.keyMaxRunning !== undefined) body.key_max_running = l.keyMaxRunning;
  if (l.ordered !== undefined) body.ordered = l.ordered;
  if (l.orderedMoveOn !== undefined) body.ordered_move_on = l.orderedMoveOn;
  if (l.keyRate !== undefined) body.key_rate = l.keyRate;
  if (typeof l.keyRatePeriod === "number") body.key_rate_period_ms = l.keyRatePeriod;
  else if (l.keyRatePeriod !== undefined) body.key_rate_period = l.keyRatePeriod;
  if (l.fair !== undefined) body.fair = l.fair;
  return body;
}

/**
 * The answer to complete and snooze: the job's state after the outcome.
 * `alreadyRecorded` is true when the request was sent again after its
 * first answer was lost and that first request had written this very
 * outcome of the attempt (same fence): the server wrote nothing now and
 * answered as it had then. Either way the outcome is the job's.
 */
export interface Acknowledged {
  id: number;
  state: JobState;
  alreadyRecorded: boolean;
}

/** The wire form of complete's, fail's and snooze's answer. */
interface WireOutcome {
  id: number;
  state: JobState;
  already_recorded?: boolean;
}

function acknowledged(o: WireOutcome): Acknowledged {
  return { id: o.id, state: o.state, alreadyRecorded: o.already_recorded === true };
}

/** Acknowledgement endpoints: a 409 there is a stale fence. */
const fenced = new Set(["heartbeat", "complete", "fail", "snooze", "release"]);

/**
 * A client of conveyor's HTTP API (`conveyor serve`, or the `web` handler
 * mounted in a Go server). Every method throws a ConveyorError carrying
 * the server's message on a 4xx or 5xx, and a StaleFenceError on a 409
 * to an acknowledgement.
 */
export class Client {
  readonly baseUrl: string;
  private readonly token: string | undefined;
  private readonly timeoutMs: number;
  private readonly fetchFn: typeof fetch;
  private readonly headers: Record<string, string>;

  constructor(opts: ClientOptions) {
    if (!opts || typeof opts.baseUrl !== "string" || opts.baseUrl === "") {
      throw new TypeError("Client: baseUrl is required, e.g. http://127.0.0.1:8080");
    }
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.fetchFn = opts.fetch ?? globalThis.fetch;
    if (typeof this.fetchFn !== "function") {
      throw new TypeError("Client: no global fetch (Node 20 or later has one); pass options.fetch");
    }
    this.headers = { ...(opts.headers ?? {}) };
  }

  /** Enqueues one job. */
  async enqueue<Args = unknown>(kind: string, args?: Args, opts?: EnqueueOptions): Promise<EnqueueResult> {
    return this.request<EnqueueResult>("POST", "/api/v1/jobs", toWire(kind, args, opts));
  }

  /** Enqueues 1 to 1000 jobs in one commit: all or none. Results are in the items' order. */
  async enqueueMany(items: EnqueueItem[]): Promise<EnqueueResult[]> {
    if (!Array.isArray(items) || items.length === 0) {
      throw new TypeError("enqueueMany: give 1 to 1000 jobs");
    }
    const jobs = items.map((it) => toWire(it.kind, it.args, it));
    const out = await this.request<{ results: EnqueueResult[] }>("POST", "/api/v1/jobs/batch", { jobs });
    return out.results;
  }

  /**
   * Enqueues a batch: 1 to 1000 jobs (none unique) and a callback job,
   * all in one commit. The callback is enqueued exactly once, after every
   * job of the batch has finished (completed, discarded or cancelled);
   * its `batchId` then names the batch, whose jobs' states and results
   * `getBatch` reads.
   */
  async enqueueBatch(jobs: EnqueueItem[], callback: EnqueueItem): Promise<BatchEnqueued> {
    if (!Array.isArray(jobs) || jobs.length === 0) {
      throw new TypeError("enqueueBatch: give 1 to 1000 jobs");
    }
    if (!callback || typeof callback !== "object") {
      throw new TypeError("enqueueBatch: give the callback job, e.g. { kind: \"report\" }");
    }
    const out = await this.request<{ batch_id: number; ids: number[] }>("POST", "/api/v1/batches", {
      jobs: jobs.map((it) => toWire(it.kind, it.args, it)),
      callback: toWire(callback.kind, callback.args, callback),
    });
    return { batchId: out.batch_id, ids: out.ids };
  }

  /**
   * Enqueues a workflow: named jobs with dependencies, in one commit. A
   * job without dependencies is enqueued at once; a job with dependencies
   * is the callback of the batch of them, enqueued exactly once after they
   * have all finished, and reads their results with
   * `getBatch(job.batchId)`. Duplicate or empty names, a dependency on a
   * job not in the workflow, or a cycle are refused with a 400 naming
   * them, and nothing is enqueued.
   */
  async enqueueWorkflow(jobs: WorkflowJob[], opts: WorkflowOptions = {}): Promise<WorkflowEnqueued> {
    if (!Array.isArray(jobs) || jobs.length === 0) {
      throw new TypeError("enqueueWorkflow: give 1 to 1000 jobs");
    }
    const body: Record<string, unknown> = {
      jobs: jobs.map((j) => {
        const w = toWire(j.kind, j.args, j);
        w.name = j.name;
        if (j.dependsOn !== undefined) w.depends_on = j.dependsOn;
        return w;
      }),
    };
    if (opts.onDependencyFailure !== undefined) body.on_dependency_failure = opts.onDependencyFailure;
    const out = await this.request<{ job_ids: Record<string, number>; batch_ids: Record<string, number> }>("POST", "/api/v1/workflows", body);
    return { jobIds: out.job_ids, batchIds: out.batch_ids };
  }

  /**
   * A batch, with every job's state and result (404 when there is none).
   * The server lists a batch's jobs a page at a time (at most 500 jobs and
   * 4 MiB): the next pages are read after the first, one request each.
   * Aborting `signal` gives up the requests.
   */
  async getBatch(id: number, signal?: AbortSignal): Promise<Batch> {
    if (!Number.isSafeInteger(id) || id <= 0) {
      throw new TypeError(`${id} is not a batch id`);
    }
    const path = `/api/v1/batches/${id}`;
    const w = await this.request<WireBatch>("GET", path, undefined, { signal });
    const jobs = w.jobs ?? [];
    for (let after = w.next_after ?? null; after !== null; ) {
      const p = await this.request<WireBatch>("GET", `${path}?after=${after}`, undefined, { signal });
      jobs.push(...(p.jobs ?? []));
      const next = p.next_after ?? null;
      if (next !== null && next <= after) {
        throw new Error(`batch ${id}: the page after job ${after} ends at job ${next}`);
      }
      after = next;
    }
    w.jobs = jobs;
    return {
      id: w.id,
      createdAt: w.created_at,
      finished: w.finished,
      callbackKind: w.callback_kind,
      callbackId: w.callback_id,
      firedAt: w.fired_at,
      counts: w.counts ?? {},
      jobs: (w.jobs ?? []).map((j) => ({ id: j.id, state: j.state, result: j.result ?? null })),
      waitingFor: w.waiting_for ?? [],
    };
  }

  /** One job, with every failed attempt. */
  async getJob<Args = unknown>(id: number): Promise<Job<Args>> {
    return fromWire(await this.request<WireJob>("GET", `/api/v1/jobs/${jobId(id)}`)) as Job<Args>;
  }

  /** A page of jobs in id order. */
  async listJobs(f: ListJobsOptions = {}): Promise<JobPage> {
    const q = new URLSearchParams();
    if (f.state !== undefined) q.set("state", Array.isArray(f.state) ? f.state.join(",") : f.state);
    if (f.queue !== undefined) q.set("queue", f.queue);
    if (f.kind !== undefined) q.set("kind", f.kind);
    if (f.q !== undefined) q.set("q", f.q);
    if (f.after !== undefined) q.set("after", String(f.after));
    if (f.limit !== undefined) q.set("limit", String(f.limit));
    const qs = q.toString();
    const out = await this.request<{ jobs: WireJob[]; next_after: number | null; scanned: number; scan_limit: number; truncated?: boolean; max_page_bytes?: number }>(
      "GET",
      "/api/v1/jobs" + (qs ? "?" + qs : ""),
    );
    return { jobs: out.jobs.map(fromWire), nextAfter: out.next_after, scanned: out.scanned, scanLimit: out.scan_limit,
      truncated: out.truncated ?? false, maxPageBytes: out.max_page_bytes ?? 0 };
  }

  /** Retries a job now (409 when its state does not allow it). */
  async retry(id: number): Promise<Job> {
    return fromWire(await this.request<WireJob>("POST", `/api/v1/jobs/${jobId(id)}/retry`));
  }

  /** Cancels a job (409 when its state does not allow it). A worker running it gets a 409 at its next heartbeat. */
  async cancel(id: number): Promise<Job> {
    return fromWire(await this.request<WireJob>("POST", `/api/v1/jobs/${jobId(id)}/cancel`));
  }

  /** Discards a job (409 when its state does not allow it). */
  async discard(id: number): Promise<Job> {
    return fromWire(await this.request<WireJob>("POST", `/api/v1/jobs/${jobId(id)}/discard`));
  }

  async pauseQueue(queue: string): Promise<void> {
    await this.request("POST", `/api/v1/queues/${encodeURIComponent(queue)}/pause`);
  }

  async resumeQueue(queue: string): Promise<void> {
    await this.request("POST", `/api/v1/queues/${encodeURIComponent(queue)}/resume`);
  }

  /** Every queue with unfinished or recently finished jobs, paused or limited: counts, pause, limits and what holds it. */
  async queues(): Promise<QueueInfo[]> {
    const out = await this.request<{ queues: WireQueue[] }>("GET", "/api/v1/queues");
    return out.queues.map((q) => ({
      queue: q.queue,
      counts: q.counts,
      oldestAvailableMs: q.oldest_available_ms,
      paused: q.paused,
      pausedAt: q.paused_at,
      processes: q.processes,
      unworked: q.unworked,
      limits: limitsFromWire(q.limits),
      limitUse: q.limit_use
        ? {
            running: q.limit_use.running,
            started: q.limit_use.started,
            nextStartMs: q.limit_use.next_start_ms,
            keysRunning: q.limit_use.keys_running ?? 0,
            keyHeld: q.limit_use.key_held ?? 0,
            keysRated: q.limit_use.keys_rated ?? 0,
          }
        : null,
      held: q.held ?? null,
      awaitingDependencies: q.awaiting_dependencies ?? 0,
      weightedKeys: q.weighted_keys ?? 0,
    }));
  }

  /** A queue's flow limits; null when it has none. */
  async queueLimits(queue: string): Promise<QueueLimits | null> {
    const out = await this.request<{ limits: WireLimits | null }>("GET", `/api/v1/queues/${encodeURIComponent(queue)}/limits`);
    return limitsFromWire(out.limits);
  }

  /**
   * Sets a queue's flow limits for every process, replacing them whole (a
   * field left out is no limit; all left out clears them). The queue need
   * not exist yet; its pause is kept. A value out of range is refused
   * with a 400 naming the field, and nothing changes. Returns the limits
   * set, null for none.
   */
  async setQueueLimits(queue: string, limits: QueueLimitsInput): Promise<QueueLimits | null> {
    const out = await this.request<{ limits: WireLimits | null }>(
      "PUT",
      `/api/v1/queues/${encodeURIComponent(queue)}/limits`,
      limitsToWire(limits),
    );
    return limitsFromWire(out.limits);
  }

  /** Removes a queue's flow limits. */
  async clearQueueLimits(queue: string): Promise<void> {
    await this.request("DELETE", `/api/v1/queues/${encodeURIComponent(queue)}/limits`);
  }

  /** A queue's key weights (setKeyWeights); {} when it has none. */
  async keyWeights(queue: string): Promise<Record<string, number>> {
    const out = await this.request<{ key_weights: Record<string, number> | null }>(
      "GET",
      `/api/v1/queues/${encodeURIComponent(queue)}/weights`,
    );
    return out.key_weights ?? {};
  }

  /**
   * Replaces a queue's key weights for every process ({} removes them):
   * under the queue's fair limit a key of weight 3 takes up to 3 jobs per
   * turn where a key not weighed takes 1. At most 1000 keys, weights 1 to
   * 1000; a bad key or weight is refused with a 400 naming it, and nothing
   * changes. The queue need not be fair yet, and setQueueLimits leaves the
   * weights as they are. Returns the weights set.
   */
  async setKeyWeights(queue: string, weights: Record<string, number>): Promise<Record<string, number>> {
    if (!weights || typeof weights !== "object" || Array.isArray(weights)) {
      throw new TypeError("setKeyWeights: give the weights by key, e.g. { acme: 3 } ({} removes them)");
    }
    const out = await this.request<{ key_weights: Record<string, number> | null }>(
      "PUT",
      `/api/v1/queues/${encodeURIComponent(queue)}/weights`,
      { key_weights: weights },
    );
    return out.key_weights ?? {};
  }

  /** Removes a queue's key weights: every key weighs 1. */
  async clearKeyWeights(queue: string): Promise<void> {
    await this.request("DELETE", `/api/v1/queues/${encodeURIComponent(queue)}/weights`);
  }

  // The worker protocol. Worker uses these; call them directly to drive
  // the protocol yourself.

  /**
   * Claims up to `limit` jobs of a queue, long-polling up to `waitMs`.
   * An empty array means the wait ended. Aborting `signal` ends the
   * request; the server then gives back any jobs it had claimed for it.
   */
  async claim(opts: ClaimOptions = {}, signal?: AbortSignal): Promise<ClaimedJob[]> {
    const body: Record<string, unknown> = {};
    if (opts.queue !== undefined) body.queue = opts.queue;
    if (opts.limit !== undefined) body.limit = opts.limit;
    if (opts.waitMs !== undefined) body.wait_ms = Math.round(opts.waitMs);
    if (opts.leaseMs !== undefined) body.lease_ms = Math.round(opts.leaseMs);
    if (opts.worker !== undefined) body.worker = opts.worker;
    const out = await this.request<{ jobs: WireJob[] }>("POST", "/api/v1/claim", body, {
      signal,
      extraTimeoutMs: opts.waitMs ?? 0,
    });
    return out.jobs.map((w) => ({ ...fromWire(w), fence: w.fence as number }));
  }

  /**
   * Renews a claimed job's lease. Throws StaleFenceError once the claim no
   * longer holds it. Aborting `signal` gives up the request (as do the
   * acknowledgements' signals below): the Worker bounds each by its lease.
   */
  async heartbeat(id: number, fence: number, leaseMs?: number, signal?: AbortSignal): Promise<void> {
    const body: Record<string, unknown> = { fence };
    if (leaseMs !== undefined) body.lease_ms = Math.round(leaseMs);
    await this.request("POST", `/api/v1/jobs/${jobId(id)}/heartbeat`, body, { signal });
  }

  /**
   * Records success, with the attempt's result when `result` is neither
   * undefined nor null: any JSON value, at most 256 KiB encoded (the server
   * answers 400 otherwise; a value JSON.stringify cannot encode, such as a
   * BigInt, throws its TypeError and nothing is sent). Throws StaleFenceError if the claim no longer
   * holds the job; its result is then not stored either. Safe to send
   * again when an earlier call got no answer: if that one was written, the
   * server answers success with `alreadyRecorded` (its result kept).
   */
  async complete(id: number, fence: number, signal?: AbortSignal, result?: unknown): Promise<Acknowledged> {
    const body: Record<string, unknown> = { fence };
    if (result !== undefined && result !== null) body.result = result;
    return acknowledged(await this.request<WireOutcome>("POST", `/api/v1/jobs/${jobId(id)}/complete`, body, { signal }));
  }

  /**
   * Records a failed attempt; returns the job's new state (retryable,
   * discarded or cancelled). Safe to send again, with the same options,
   * when an earlier call got no answer: if that one was written, the
   * server answers with the state it left.
   */
  async fail(id: number, fence: number, f: FailOptions, signal?: AbortSignal): Promise<JobState> {
    const body: Record<string, unknown> = { fence, error: f.error };
    if (f.trace !== undefined) body.trace = f.trace;
    if (f.cancel) body.cancel = true;
    if (f.retryInMs !== undefined) body.retry_in_ms = Math.round(f.retryInMs);
    return (await this.request<{ state: JobState }>("POST", `/api/v1/jobs/${jobId(id)}/fail`, body, { signal })).state;
  }

  /**
   * Puts a claimed job back for `delayMs` without using an attempt. Safe
   * to send again as complete is, while the job is still scheduled.
   */
  async snooze(id: number, fence: number, delayMs: number, signal?: AbortSignal): Promise<Acknowledged> {
    return acknowledged(
      await this.request<WireOutcome>("POST", `/api/v1/jobs/${jobId(id)}/snooze`, { fence, delay_ms: Math.round(delayMs) }, { signal }),
    );
  }

  /** Gives a claimed job back at once without counting the attempt. */
  async release(id: number, fence: number, signal?: AbortSignal): Promise<void> {
    await this.request("POST", `/api/v1/jobs/${jobId(id)}/release`, { fence }, { signal });
  }

  /** One request: JSON in, JSON out, errors as ConveyorError. */
  private async request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    o: { signal?: AbortSignal; extraTimeoutMs?: number } = {},
  ): Promise<T> {
    const what = `${method} ${path.split("?")[0]}`;
    // Encoded before anything is sent: a body JSON cannot encode (a
    // BigInt, a cycle) throws its TypeError here, never a ConveyorError
    // without status, which would say the request may have been sent and
    // invite sending it again.
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const ctl = new AbortController();
    const limit = this.timeoutMs + (o.extraTimeoutMs ?? 0);
    const timer = setTimeout(() => ctl.abort(new Error(`timed out after ${limit}ms`)), limit);
    const onAbort = () => ctl.abort(o.signal?.reason ?? new Error("aborted"));
    if (o.signal) {
      if (o.signal.aborted) onAbort();
      else o.signal.addEventListener("abort", onAbort, { once: true });
    }
    const headers: Record<string, string> = { Accept: "application/json", ...this.headers };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    let text: string;
    try {
      res = await this.fetchFn(this.baseUrl + path, {
        method,
        headers,
        body: payload,
        signal: ctl.signal,
      });
      text = await res.text();
    } catch (err) {
      const reason = ctl.signal.aborted ? ctl.signal.reason : err;
      throw new ConveyorError(what, null, describe(reason), { cause: err });
    } finally {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
    }
    let parsed: unknown = undefined;
    if (text !== "") {
      try {
        parsed = JSON.parse(text);
      } catch {
        // not JSON (a proxy's page, say): reported below when it matters
      }
    }
    if (!res.ok) {
      const msg =
        parsed && typeof parsed === "object" && typeof (parsed as { error?: unknown }).error === "string"
          ? (parsed as { error: string }).error
          : text.trim().slice(0, 500) || res.statusText || "no message";
      const m = /^\/api\/v1\/jobs\/(\d+)\/(\w+)$/.exec(path);
      if (res.status === 409 && m && fenced.has(m[2])) {
        const fence = body && typeof body === "object" ? Number((body as { fence?: unknown }).fence) : NaN;
        throw new StaleFenceError(what, msg, Number(m[1]), fence);
      }
      throw new ConveyorError(what, res.status, msg);
    }
    if (parsed === undefined && text !== "") {
      throw new ConveyorError(what, res.status, `answer is not JSON: ${text.trim().slice(0, 200)}`);
    }
    return parsed as T;
  }
}

function jobId(id: number): string {
  if (!Number.isSafeInteger(id) || id <= 0) {
    throw new TypeError(`${id} is not a job id`);
  }
  return String(id);
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error && cause.message && cause.message !== e.message
      ? `${e.message}: ${cause.message}`
      : e.message;
  }
  return String(e);
}
