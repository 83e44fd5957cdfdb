import { Client, ClaimedJob } from "./client.js";
import { CancelJob, ConveyorError, Snooze, StaleFenceError } from "./errors.js";

/**
 * Works one job. Resolve (with anything but a Snooze) to complete it: a
 * value other than undefined or null is the job's result, sent with the
 * completion as JSON (at most 256 KiB) and stored with the job (one JSON
 * cannot encode, such as a BigInt, or the server refuses fails the
 * attempt, naming why);
 * throw to fail the attempt (retried with the server's backoff until its
 * max attempts, then discarded); throw a CancelJob to cancel it without
 * retry; return or throw `snooze(ms)` to put it back for later without
 * using an attempt (a snooze the server refuses, longer than 30 days,
 * fails the attempt, naming why). `signal` is aborted when the job's timeout passes
 * (the attempt fails), when no heartbeat got through for four fifths of
 * the lease (a LeaseDeadlineError: the attempt fails), when its lease is
 * lost (a 409 at a heartbeat: it was cancelled, or rescued and claimed by
 * another worker; the outcome is dropped) and when `stop` gives up
 * waiting (the job is released). After an abort the worker no longer
 * waits for the handler and ignores what it returns, so stop working
 * promptly.
 */
export type Handler<Args = any> = (job: ClaimedJob<Args>, signal: AbortSignal) => unknown;

export interface WorkerOptions {
  /** The queue to work; default "default". */
  queue?: string;
  /** Jobs run at once; default 1. */
  concurrency?: number;
  /** A handler per job kind. A claimed job of another kind fails ("no handler"), as in Go. */
  handlers: Record<string, Handler>;
  /**
   * The lease asked for at claim and at each heartbeat; default 30s (1s to
   * 1h). A job's handler is aborted when no renewal got through for four
   * fifths of it, counted from when the last renewal that succeeded (or
   * the claim) was sent, so it has the last fifth to return before
   * another worker may claim the job.
   */
  leaseMs?: number;
  /**
   * Heartbeat period of each running job, from one send to the next;
   * default a fifth of the lease, at most half of it. A heartbeat that
   * fails is sent again within 50ms to 2s; one that has no answer after
   * a tenth of the lease is given up and sent again.
   */
  heartbeatMs?: number;
  /**
   * How long one claim long-polls; default 20s (the server allows up to
   * 30s). A claim answered with no jobs before its wait was over (with
   * 0, every empty claim) is followed by a pause, 50ms doubling to 1s.
   */
  waitMs?: number;
  /** Timeout of jobs without their own timeout_ms; default 60s (conveyor's JobTimeout); 0 or less for none. */
  jobTimeoutMs?: number;
  /** Recorded as the jobs' attempted_by ("http:" + name); default "ts-PID-RANDOM". */
  name?: string;
  /**
   * Told of every problem the loop handles by itself: claims that failed
   * (retried with backoff), failed heartbeats, refused acknowledgements
   * (StaleFenceError), releases that failed. Default: console.error.
   */
  onError?: (err: unknown, job?: ClaimedJob) => void;
}

export interface StopOptions {
  /** How long running jobs may take to finish; then they are aborted and released. Default 30s. */
  timeoutMs?: number;
}

export interface StopResult {
  /** Jobs still running at the timeout, aborted and given back to the queue. */
  released: number;
}

type Outcome =
  | { kind: "complete"; result?: unknown }
  | { kind: "snooze"; delayMs: number }
  | { kind: "fail"; error: string; trace?: string; cancel: boolean };

type Timer = ReturnType<typeof setTimeout>;

interface Running {
  job: ClaimedJob;
  ctl: AbortController;
  /**
   * running: the handler works (or is about to start); acking: its outcome
   * is being sent; dropped: lost or released, nothing to send; done: over.
   */
  phase: "running" | "acking" | "dropped" | "done";
  /** Whether the handler was started (the cut-off applies from then on). */
  started: boolean;
  /** The next heartbeat. */
  beatTimer: Timer | undefined;
  /** The heartbeat in flight. */
  beating: Promise<void> | undefined;
  /** Heartbeats that failed in a row. */
  fails: number;
  /**
   * When the last renewal that succeeded was sent (the claim's send at
   * first): the lease holds until leaseMs after it, whatever is in flight.
   */
  renewedAt: number;
  /** Aborts the handler at renewedAt + the cut-off; moved by each renewal. */
  cutTimer: Timer | undefined;
  /** Set when the cut-off aborted the handler. */
  cutOff: LeaseDeadlineError | undefined;
  done: Promise<void>;
}

/** Thrown into a job's signal when stop() gives up waiting for it. */
export class WorkerStopping extends Error {
  constructor() {
    super("worker stopping: the job was released");
    this.name = "WorkerStopping";
  }
}

/**
 * Thrown into a job's signal when no renewal of its lease got through for
 * four fifths of the lease, counted from when the last one that succeeded
 * (or the claim) was sent, whether heartbeats failed or are still waiting
 * for an answer. The handler has the lease's last fifth to return before
 * the lease can expire and another worker claim the job. As with
 * conveyor's own workers, the attempt fails with this message (retried
 * with backoff), sent under the claim's fence, whatever the handler
 * returns afterwards.
 */
export class LeaseDeadlineError extends Error {
  /** The job whose handler was aborted. */
  readonly jobId: number;
  /** How long before the abort the last renewal that succeeded was sent. */
  readonly sinceRenewalMs: number;

  constructor(jobId: number, sinceRenewalMs: number, leaseMs: number) {
    super(
      `job ${jobId}: lease could not be renewed in time (none got through for ${sinceRenewalMs}ms of a ${leaseMs}ms lease); handler aborted before the lease could expire`,
    );
    this.name = "LeaseDeadlineError";
    this.jobId = jobId;
    this.sinceRenewalMs = sinceRenewalMs;
  }
}

/**
 * A worker loop over conveyor's worker protocol: it long-polls claims for
 * as many jobs as it has free slots, runs each with its kind's handler,
 * heartbeats each running job, and completes, fails or snoozes it under
 * the claim's fence. A 409 (stale fence) aborts the job's signal and
 * drops its outcome.
 *
 * Leases follow conveyor's own rule: a job's lease is known to hold until
 * leaseMs after the last renewal that succeeded was sent (the claim, then
 * each heartbeat answered). A timer aborts the handler at four fifths of
 * that, whether the heartbeats failed or still wait for an answer, so the
 * handler has the last fifth to return before another worker may claim
 * the job; the attempt then fails. Every request that concerns a lease
 * is bounded by it: a heartbeat by a tenth of the lease, an
 * acknowledgement or release by the time until the lease may expire (at
 * least a tenth of it), and by the client's timeoutMs.
 */
export class Worker {
  readonly client: Client;
  readonly queue: string;
  readonly concurrency: number;
  readonly name: string;
  private readonly handlers: Record<string, Handler>;
  private readonly leaseMs: number;
  private readonly heartbeatMs: number;
  /** When, after the last successful renewal's send, a handler is aborted: four fifths of the lease. */
  private readonly cutOffMs: number;
  /** How long a heartbeat may wait for its answer: a tenth of the lease, half its last fifth. */
  private readonly heartbeatTimeoutMs: number;
  private readonly waitMs: number;
  private readonly jobTimeoutMs: number;
  private readonly onError: (err: unknown, job?: ClaimedJob) => void;
  /**
   * The attempts this worker holds. Not keyed by job id: an attempt still
   * sending its outcome when its lease lapsed may meet the same job
   * claimed again by this worker under a new fence.
   */
  private readonly running = new Set<Running>();
  private readonly stopCtl = new AbortController();
  private slotWaiters: Array<() => void> = [];
  private loopDone: Promise<void> | undefined;
  private stopping: Promise<StopResult> | undefined;

  constructor(client: Client, opts: WorkerOptions) {
    if (!(client instanceof Client)) throw new TypeError("Worker: the first argument must be a Client");
    if (!opts || !opts.handlers || typeof opts.handlers !== "object") {
      throw new TypeError("Worker: options.handlers is required: { kind: async (job, signal) => ... }");
    }
    for (const [kind, h] of Object.entries(opts.handlers)) {
      if (typeof h !== "function") throw new TypeError(`Worker: the handler of kind ${kind} is not a function`);
    }
    this.client = client;
    this.queue = opts.queue ?? "default";
    this.concurrency = opts.concurrency ?? 1;
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1 || this.concurrency > 1000) {
      throw new RangeError(`Worker: concurrency ${opts.concurrency} must be an integer from 1 to 1000`);
    }
    this.handlers = { ...opts.handlers };
    this.leaseMs = opts.leaseMs ?? 30_000;
    if (!(this.leaseMs >= 1000 && this.leaseMs <= 3_600_000)) {
      throw new RangeError(`Worker: leaseMs ${opts.leaseMs} must be 1000 to 3600000`);
    }
    this.heartbeatMs = opts.heartbeatMs ?? this.leaseMs / 5;
    if (!(this.heartbeatMs > 0 && this.heartbeatMs <= this.leaseMs / 2)) {
      throw new RangeError(`Worker: heartbeatMs ${opts.heartbeatMs} must be above 0 and at most half the lease (${this.leaseMs / 2})`);
    }
    this.cutOffMs = (this.leaseMs * 4) / 5;
    this.heartbeatTimeoutMs = this.leaseMs / 10;
    this.waitMs = opts.waitMs ?? 20_000;
    if (!(this.waitMs >= 0 && this.waitMs <= 30_000)) throw new RangeError(`Worker: waitMs ${opts.waitMs} must be 0 to 30000`);
    this.jobTimeoutMs = opts.jobTimeoutMs ?? 60_000;
    const pid = (globalThis as { process?: { pid?: number } }).process?.pid ?? 0;
    this.name = opts.name ?? `ts-${pid}-${Math.random().toString(36).slice(2, 8)}`;
    this.onError =
      opts.onError ??
      ((err, job) => console.error(`conveyor worker ${this.name}${job ? ` (job ${job.id})` : ""}:`, err instanceof Error ? err.message : err));
  }

  /** Jobs running now. */
  get active(): number {
    return this.running.size;
  }

  /** Starts claiming and running jobs; returns at once. */
  start(): void {
    if (this.loopDone) throw new Error("Worker: already started");
    this.loopDone = this.loop();
  }

  /**
   * Stops gracefully: claims no more (an in-flight claim is ended, and the
   * server gives back what it had claimed for it), waits up to timeoutMs
   * for running jobs to finish and be acknowledged, then aborts the
   * signals of those still running and releases them (they go back to the
   * queue without using an attempt). Resolves when nothing is left.
   */
  stop(opts: StopOptions = {}): Promise<StopResult> {
    if (!this.stopping) this.stopping = this.doStop(opts.timeoutMs ?? 30_000);
    return this.stopping;
  }

  private async doStop(timeoutMs: number): Promise<StopResult> {
    this.stopCtl.abort(new WorkerStopping());
    this.wakeSlots();
    await this.loopDone;
    const all = () => Promise.all([...this.running].map((r) => r.done));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = await Promise.race([
      all().then(() => false),
      new Promise<boolean>((res) => (timer = setTimeout(() => res(true), timeoutMs))),
    ]);
    clearTimeout(timer);
    let released = 0;
    if (timedOut) {
      const releases: Promise<void>[] = [];
      for (const r of this.running) {
        if (r.phase !== "running") continue; // acking: let the acknowledgement finish
        r.phase = "dropped";
        this.stopTimers(r);
        r.ctl.abort(new WorkerStopping());
        released++;
        releases.push(this.release(r.job, r.renewedAt));
      }
      await Promise.all(releases);
    }
    await all();
    return { released };
  }

  private async loop(): Promise<void> {
    let backoff = 500;
    let idle = 0; // the pause after the last claim answered empty early
    while (!this.stopCtl.signal.aborted) {
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        await new Promise<void>((res) => this.slotWaiters.push(res));
        continue;
      }
      let jobs: ClaimedJob[];
      // The claimed jobs' leases are taken between the send and the
      // answer: they are known to hold until leaseMs after the send.
      const sent = now();
      try {
        jobs = await this.client.claim(
          { queue: this.queue, limit: free, waitMs: this.waitMs, leaseMs: this.leaseMs, worker: this.name },
          this.stopCtl.signal,
        );
        backoff = 500;
      } catch (err) {
        if (this.stopCtl.signal.aborted) break;
        this.report(err);
        await sleep(backoff, this.stopCtl.signal);
        backoff = Math.min(backoff * 2, 30_000);
        continue;
      }
      if (this.stopCtl.signal.aborted) {
        // Stopped while the answer came: give the jobs straight back.
        await Promise.all(jobs.map((j) => this.release(j, sent)));
        break;
      }
      for (const job of jobs) this.run(job, sent);
      if (jobs.length === 0 && (this.waitMs === 0 || now() - sent < this.waitMs)) {
        // Empty before its wait was over: the server is closing (it
        // answers at once then) or waitMs is 0. Claim again after 50ms,
        // doubling to 1s, as the server's own long poll paces its claims,
        // rather than in a tight loop of claim statements.
        idle = Math.min(Math.max(2 * idle, 50), 1000);
        await sleep(idle, this.stopCtl.signal);
      } else {
        idle = 0;
      }
    }
  }

  /** Tells onError, which must not break the loop by throwing. */
  private report(err: unknown, job?: ClaimedJob): void {
    try {
      this.onError(err, job);
    } catch {
      // ignored: a reporter's failure is not the job's
    }
  }

  private wakeSlots(): void {
    const ws = this.slotWaiters;
    this.slotWaiters = [];
    for (const w of ws) w();
  }

  /** Gives a job back (fenced, not counting the attempt), bounded by its lease; a 409 means it is not ours anyway. */
  private release(job: ClaimedJob, renewedAt: number): Promise<void> {
    const t = deadline(this.untilExpiry(renewedAt));
    return this.client
      .release(job.id, job.fence, t.signal)
      .catch((err) => {
        if (!(err instanceof StaleFenceError)) this.report(err, job);
      })
      .finally(t.clear);
  }

  /**
   * How long a request about a lease renewed (or claimed) at renewedAt may
   * wait for its answer: until the lease may expire, as no answer after
   * that can be trusted to help, but at least the heartbeat's bound.
   */
  private untilExpiry(renewedAt: number): number {
    return Math.max(this.heartbeatTimeoutMs, renewedAt + this.leaseMs - now());
  }

  /** Runs a job claimed by a claim sent at claimSent. */
  private run(job: ClaimedJob, claimSent: number): void {
    const r: Running = {
      job,
      ctl: new AbortController(),
      phase: "running",
      started: false,
      beatTimer: undefined,
      beating: undefined,
      fails: 0,
      renewedAt: claimSent,
      cutTimer: undefined,
      cutOff: undefined,
      done: Promise.resolve(),
    };
    this.running.add(r);
    // A claim that took longer than a heartbeat interval to come back (a
    // long poll that waited) is renewed at once, as conveyor's own
    // processes do, rather than an interval later.
    this.scheduleBeat(r, Math.max(0, claimSent + this.heartbeatMs - now()));
    r.done = this.work(r).finally(() => {
      r.phase = "done";
      this.stopTimers(r);
      this.running.delete(r);
      this.wakeSlots();
    });
  }

  /**
   * Whether a job may start: its lease holds for more than the last fifth
   * (a handler never starts where the cut-off would already abort it). A
   * claim that came back that late (a long poll, a slow network) waits
   * for the renewal sent on its answer; when none gets through, the job
   * is given back unstarted (released under its fence, its attempt not
   * counted) and reported to onError, as conveyor's own processes do.
   */
  private async startable(r: Running): Promise<boolean> {
    if (now() < r.renewedAt + this.cutOffMs) return true;
    await this.beat(r);
    if (r.phase !== "running") return false; // lost: a 409
    const since = Math.round(now() - r.renewedAt);
    if (since < this.cutOffMs) return true;
    r.phase = "dropped";
    this.stopTimers(r);
    this.report(
      new Error(
        `job ${r.job.id} not started: its claim came back late and its lease could not be renewed in time (none got through for ${since}ms of a ${this.leaseMs}ms lease); given back`,
      ),
      r.job,
    );
    await this.release(r.job, r.renewedAt);
    return false;
  }

  private async work(r: Running): Promise<void> {
    const { job } = r;
    let outcome: Outcome;
    const handler = Object.prototype.hasOwnProperty.call(this.handlers, job.kind) ? this.handlers[job.kind] : undefined;
    if (!handler) {
      outcome = { kind: "fail", error: `no handler for kind ${job.kind} in worker ${this.name} (queue ${this.queue})`, cancel: false };
    } else if (!(await this.startable(r))) {
      return; // given back unstarted, or lost
    } else {
      r.started = true;
      this.armCutOff(r);
      const timeout = job.timeoutMs === null ? this.jobTimeoutMs : job.timeoutMs;
      let timer: ReturnType<typeof setTimeout> | undefined;
      try {
        const result = await new Promise<unknown>((resolve, reject) => {
          const onAbort = () => reject(r.ctl.signal.reason);
          r.ctl.signal.addEventListener("abort", onAbort, { once: true });
          if (timeout > 0) {
            timer = setTimeout(() => {
              const e = new Error(`job ${job.id} timed out after ${timeout}ms`);
              e.name = "TimeoutError";
              r.ctl.abort(e);
            }, timeout);
          }
          Promise.resolve()
            .then(() => this.checkDependencies(job, r.ctl.signal))
            .then(() => handler(job, r.ctl.signal))
            .then(resolve, reject)
            .finally(() => r.ctl.signal.removeEventListener("abort", onAbort));
        });
        outcome = result instanceof Snooze ? { kind: "snooze", delayMs: result.delayMs } : { kind: "complete", result };
      } catch (err) {
        if (err instanceof Snooze) outcome = { kind: "snooze", delayMs: err.delayMs };
        else if (err instanceof DependencyFailed) outcome = { kind: "fail", error: err.message, cancel: true };
        else if (err !== undefined && err === r.cutOff) outcome = { kind: "fail", error: r.cutOff.message, cancel: false };
        else outcome = { kind: "fail", ...errorText(err), cancel: err instanceof CancelJob };
      } finally {
        clearTimeout(timer);
        clearTimeout(r.cutTimer);
        r.cutTimer = undefined;
      }
    }
    if (r.phase !== "running") return; // lost (409) or released by stop: the outcome is not ours to send
    r.phase = "acking";
    await this.ack(r, outcome);
  }

  /**
   * Throws a DependencyFailed, before the handler runs, when the job is a
   * workflow job under the "cancel" policy (the default) one of whose
   * dependencies did not complete (it was discarded or cancelled, or
   * retention deleted it), as conveyor's own workers do: the job is then
   * cancelled, and its own dependents in turn. The dependencies are read
   * from the job's batch; when that read fails the attempt fails and is
   * retried.
   */
  private async checkDependencies(job: ClaimedJob, signal: AbortSignal): Promise<void> {
    if (job.metadata?.[cancelOnDependencyFailureKey] !== "1" || job.batchId === null) return;
    let jobs;
    try {
      jobs = (await this.client.getBatch(job.batchId, signal)).jobs;
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      throw new Error(`reading the dependencies of workflow job ${job.id}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    for (const d of jobs) {
      if (d.state !== "completed") throw new DependencyFailed(`dependency job ${d.id} is ${d.state || "deleted"}`);
    }
  }

  /**
   * Sends an outcome, retrying transient failures while the heartbeat
   * keeps the lease. Each try waits for its answer until the lease may
   * expire, counted from the last renewal that succeeded.
   */
  private async ack(r: Running, o: Outcome): Promise<void> {
    const { id, fence } = r.job;
    for (let attempt = 1; ; attempt++) {
      const t = deadline(this.untilExpiry(r.renewedAt));
      try {
        switch (o.kind) {
          case "complete":
            await this.client.complete(id, fence, t.signal, o.result);
            break;
          case "snooze":
            await this.client.snooze(id, fence, o.delayMs, t.signal);
            break;
          case "fail":
            await this.client.fail(id, fence, { error: o.error, trace: o.trace, cancel: o.cancel }, t.signal);
            break;
        }
        return;
      } catch (err) {
        this.report(err, r.job);
        // 413: the request went over the server's body cap (MaxBodyBytes,
        // 1 MiB by default), checked before the result's own limit.
        const tooLarge = err instanceof ConveyorError && err.status === 413;
        if (o.kind === "complete" && o.result !== undefined && !(err instanceof ConveyorError)) {
          // The result cannot be encoded as JSON (a BigInt, a cycle): the
          // request was never sent, and never will be.
          o = { kind: "fail", error: `result refused: not JSON-encodable: ${err instanceof Error ? err.message : String(err)}`, cancel: false };
          continue;
        }
        if (o.kind === "complete" && o.result !== undefined && err instanceof ConveyorError && (err.status === 400 || tooLarge)) {
          // The server refused the result (not valid JSON for it, or too
          // large): the attempt fails naming why, rather than its lease
          // lapsing and the handler running again for the same refusal.
          o = { kind: "fail", error: `result refused: ${err.serverMessage}`, cancel: false };
          continue;
        }
        if (o.kind === "snooze" && err instanceof ConveyorError && err.status === 400) {
          // The server refused the snooze (a delay over its 30 days): the
          // attempt fails naming why, rather than its lease lapsing and
          // the handler running again, its attempt counted by the rescue.
          o = { kind: "fail", error: `snooze refused: ${err.serverMessage}`, cancel: false };
          continue;
        }
        if (o.kind === "fail" && tooLarge && (o.trace !== undefined || o.error.length > cutErrorChars)) {
          // An error (and trace) too large to send: the server would keep
          // only their first 64 KiB and 256 KiB; send the error's start.
          o = { ...o, error: `${o.error.slice(0, cutErrorChars)} [truncated: the failure was over the server's request body limit]`, trace: undefined };
          continue;
        }
        if (!(err instanceof ConveyorError) || !err.transient || attempt >= 5 || dropped(r)) {
          return; // refused (409 stale fence, 4xx) or given up: the lease will lapse and the job be rescued
        }
      } finally {
        t.clear();
      }
      await sleep(Math.min(250 * 2 ** attempt, 4000));
    }
  }

  private scheduleBeat(r: Running, ms: number): void {
    clearTimeout(r.beatTimer);
    r.beatTimer = setTimeout(() => void this.beat(r), ms);
  }

  /** Sends a heartbeat now, or joins the one in flight. */
  private beat(r: Running): Promise<void> {
    clearTimeout(r.beatTimer);
    r.beatTimer = undefined;
    if (ended(r)) return Promise.resolve();
    if (!r.beating) r.beating = this.renew(r).finally(() => (r.beating = undefined));
    return r.beating;
  }

  /**
   * One heartbeat, given up after a tenth of the lease so that a hung
   * request cannot hold up the next. Intervals run from one send to the
   * next; a failure is retried within 50ms to 2s. Only a success moves
   * the cut-off, to four fifths of the lease after this beat's send.
   */
  private async renew(r: Running): Promise<void> {
    const sent = now();
    const t = deadline(this.heartbeatTimeoutMs);
    let next: number;
    try {
      await this.client.heartbeat(r.job.id, r.job.fence, this.leaseMs, t.signal);
      r.fails = 0;
      if (sent > r.renewedAt) r.renewedAt = sent;
      this.armCutOff(r);
      next = Math.max(0, sent + this.heartbeatMs - now());
    } catch (err) {
      if (ended(r)) return;
      if (err instanceof StaleFenceError) {
        this.lose(r, err);
        return;
      }
      this.report(err, r.job);
      r.fails++;
      next = Math.min(errBackoff(r.fails), this.heartbeatMs);
    } finally {
      t.clear();
    }
    if (!ended(r)) this.scheduleBeat(r, next);
  }

  /** (Re)sets the timer that aborts a running handler at four fifths of the lease after the last successful renewal's send. */
  private armCutOff(r: Running): void {
    clearTimeout(r.cutTimer);
    r.cutTimer = undefined;
    if (!r.started || r.phase !== "running" || r.cutOff) return;
    r.cutTimer = setTimeout(() => this.cutOffNow(r), Math.max(0, r.renewedAt + this.cutOffMs - now()));
  }

  /** Aborts a handler whose lease could not be renewed in time; its outcome is then that failure. */
  private cutOffNow(r: Running): void {
    r.cutTimer = undefined;
    if (r.phase !== "running" || r.cutOff || r.ctl.signal.aborted) return;
    const since = Math.round(now() - r.renewedAt);
    if (since < this.cutOffMs) {
      this.armCutOff(r); // a timer may fire a millisecond early
      return;
    }
    r.cutOff = new LeaseDeadlineError(r.job.id, since, this.leaseMs);
    this.report(r.cutOff, r.job);
    r.ctl.abort(r.cutOff);
  }

  private lose(r: Running, reason: Error): void {
    const wasRunning = r.phase === "running";
    r.phase = "dropped";
    this.stopTimers(r);
    if (wasRunning) this.report(reason, r.job);
    r.ctl.abort(reason);
  }

  private stopTimers(r: Running): void {
    clearTimeout(r.beatTimer);
    r.beatTimer = undefined;
    clearTimeout(r.cutTimer);
    r.cutTimer = undefined;
  }
}

/**
 * The metadata key that marks a workflow job to be cancelled instead of
 * run when a dependency did not complete (the workflow's "cancel" policy).
 */
const cancelOnDependencyFailureKey = "conveyor.cancel_on_dependency_failure";

/** Why a workflow job is cancelled before its handler runs: a dependency did not complete. */
class DependencyFailed extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DependencyFailed";
  }
}

/** How much of an error is sent again after the server refused the failure as too large (413). */
const cutErrorChars = 8192;

/** Whether the job was lost or released (a function, so that TypeScript does not narrow phase across awaits). */
function dropped(r: Running): boolean {
  return r.phase === "dropped";
}

/** Whether nothing more is to be done for the job: lost, released or over. */
function ended(r: Running): boolean {
  return r.phase === "dropped" || r.phase === "done";
}

/** The wait before retrying a heartbeat after n failures in a row: 50ms doubling to 2s, with jitter (as conveyor's own processes). */
function errBackoff(n: number): number {
  const d = Math.min(50 * 2 ** Math.min(n, 6), 2000);
  return d / 2 + Math.random() * (d / 2);
}

/** A signal that gives up a request after ms. */
function deadline(ms: number): { signal: AbortSignal; clear: () => void } {
  const ctl = new AbortController();
  const t = setTimeout(() => ctl.abort(new Error(`gave up waiting after ${Math.round(ms)}ms, a bound set by the job's lease`)), ms);
  return { signal: ctl.signal, clear: () => clearTimeout(t) };
}

function errorText(err: unknown): { error: string; trace?: string } {
  if (err instanceof Error) {
    const msg = err.message || err.name || "error";
    return { error: msg, trace: err.stack };
  }
  try {
    return { error: typeof err === "string" ? err : JSON.stringify(err) ?? String(err) };
  } catch {
    return { error: String(err) };
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((res) => {
    if (signal?.aborted) return res();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      res();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A monotonic clock in milliseconds for lease times: a step of the wall clock cannot move a deadline. */
function now(): number {
  return performance.now();
}
