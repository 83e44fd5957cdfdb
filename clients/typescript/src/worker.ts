import { Client, ClaimedJob } from "./client.js";
import { CancelJob, ConveyorError, Snooze, StaleFenceError } from "./errors.js";

/**
 * Works one job. Resolve (with anything but a Snooze) to complete it;
 * throw to fail the attempt (retried with the server's backoff until its
 * max attempts, then discarded); throw a CancelJob to cancel it without
 * retry; return or throw `snooze(ms)` to put it back for later without
 * using an attempt. `signal` is aborted when the job's timeout passes,
 * when its lease is lost (a 409 at a heartbeat: it was cancelled, or
 * rescued and claimed by another worker) and when `stop` gives up
 * waiting; the outcome is then dropped, so stop working promptly.
 */
export type Handler<Args = any> = (job: ClaimedJob<Args>, signal: AbortSignal) => unknown;

export interface WorkerOptions {
  /** The queue to work; default "default". */
  queue?: string;
  /** Jobs run at once; default 1. */
  concurrency?: number;
  /** A handler per job kind. A claimed job of another kind fails ("no handler"), as in Go. */
  handlers: Record<string, Handler>;
  /** The lease asked for at claim and at each heartbeat; default 30s (1s to 1h). */
  leaseMs?: number;
  /** Heartbeat period of each running job; default a fifth of the lease. */
  heartbeatMs?: number;
  /** How long one claim long-polls; default 20s (the server allows up to 30s). */
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
  | { kind: "complete" }
  | { kind: "snooze"; delayMs: number }
  | { kind: "fail"; error: string; trace?: string; cancel: boolean };

interface Running {
  job: ClaimedJob;
  ctl: AbortController;
  /** running: the handler works; acking: its outcome is being sent; dropped: lost or released, nothing to send. */
  phase: "running" | "acking" | "dropped";
  timer: ReturnType<typeof setInterval> | undefined;
  beating: boolean;
  /** When the last heartbeat that succeeded was sent (the claim's time at first). */
  renewedAt: number;
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
 * A worker loop over conveyor's worker protocol: it long-polls claims for
 * as many jobs as it has free slots, runs each with its kind's handler,
 * heartbeats each running job, and completes, fails or snoozes it under
 * the claim's fence. A 409 (stale fence) aborts the job's signal and
 * drops its outcome.
 */
export class Worker {
  readonly client: Client;
  readonly queue: string;
  readonly concurrency: number;
  readonly name: string;
  private readonly handlers: Record<string, Handler>;
  private readonly leaseMs: number;
  private readonly heartbeatMs: number;
  private readonly waitMs: number;
  private readonly jobTimeoutMs: number;
  private readonly onError: (err: unknown, job?: ClaimedJob) => void;
  private readonly running = new Map<number, Running>();
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
    const all = () => Promise.all([...this.running.values()].map((r) => r.done));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = await Promise.race([
      all().then(() => false),
      new Promise<boolean>((res) => (timer = setTimeout(() => res(true), timeoutMs))),
    ]);
    clearTimeout(timer);
    let released = 0;
    if (timedOut) {
      const releases: Promise<void>[] = [];
      for (const r of this.running.values()) {
        if (r.phase !== "running") continue; // acking: let the acknowledgement finish
        r.phase = "dropped";
        this.stopHeartbeat(r);
        r.ctl.abort(new WorkerStopping());
        released++;
        releases.push(
          this.client.release(r.job.id, r.job.fence).catch((err) => {
            if (!(err instanceof StaleFenceError)) this.report(err, r.job);
          }),
        );
      }
      await Promise.all(releases);
    }
    await all();
    return { released };
  }

  private async loop(): Promise<void> {
    let backoff = 500;
    while (!this.stopCtl.signal.aborted) {
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        await new Promise<void>((res) => this.slotWaiters.push(res));
        continue;
      }
      let jobs: ClaimedJob[];
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
        await Promise.all(
          jobs.map((j) =>
            this.client.release(j.id, j.fence).catch((err) => {
              if (!(err instanceof StaleFenceError)) this.report(err, j);
            }),
          ),
        );
        break;
      }
      for (const job of jobs) this.run(job);
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

  private run(job: ClaimedJob): void {
    const r: Running = {
      job,
      ctl: new AbortController(),
      phase: "running",
      timer: undefined,
      beating: false,
      renewedAt: Date.now(),
      done: Promise.resolve(),
    };
    this.running.set(job.id, r);
    r.timer = setInterval(() => void this.beat(r), this.heartbeatMs);
    r.done = this.work(r).finally(() => {
      this.stopHeartbeat(r);
      this.running.delete(job.id);
      this.wakeSlots();
    });
  }

  private async work(r: Running): Promise<void> {
    const { job } = r;
    let outcome: Outcome;
    const handler = Object.prototype.hasOwnProperty.call(this.handlers, job.kind) ? this.handlers[job.kind] : undefined;
    if (!handler) {
      outcome = { kind: "fail", error: `no handler for kind ${job.kind} in worker ${this.name} (queue ${this.queue})`, cancel: false };
    } else {
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
            .then(() => handler(job, r.ctl.signal))
            .then(resolve, reject)
            .finally(() => r.ctl.signal.removeEventListener("abort", onAbort));
        });
        outcome = result instanceof Snooze ? { kind: "snooze", delayMs: result.delayMs } : { kind: "complete" };
      } catch (err) {
        if (err instanceof Snooze) outcome = { kind: "snooze", delayMs: err.delayMs };
        else outcome = { kind: "fail", ...errorText(err), cancel: err instanceof CancelJob };
      } finally {
        clearTimeout(timer);
      }
    }
    if (r.phase !== "running") return; // lost (409) or released by stop: the outcome is not ours to send
    r.phase = "acking";
    await this.ack(r, outcome);
  }

  /** Sends an outcome, retrying transient failures while the heartbeat keeps the lease. */
  private async ack(r: Running, o: Outcome): Promise<void> {
    const { id, fence } = r.job;
    for (let attempt = 1; ; attempt++) {
      try {
        switch (o.kind) {
          case "complete":
            await this.client.complete(id, fence);
            break;
          case "snooze":
            await this.client.snooze(id, fence, o.delayMs);
            break;
          case "fail":
            await this.client.fail(id, fence, { error: o.error, trace: o.trace, cancel: o.cancel });
            break;
        }
        return;
      } catch (err) {
        this.report(err, r.job);
        if (!(err instanceof ConveyorError) || !err.transient || attempt >= 5 || dropped(r)) {
          return; // refused (409 stale fence, 4xx) or given up: the lease will lapse and the job be rescued
        }
        await sleep(Math.min(250 * 2 ** attempt, 4000));
      }
    }
  }

  private async beat(r: Running): Promise<void> {
    if (r.beating || r.phase === "dropped") return;
    r.beating = true;
    const sent = Date.now();
    try {
      await this.client.heartbeat(r.job.id, r.job.fence, this.leaseMs);
      r.renewedAt = sent;
    } catch (err) {
      if (dropped(r)) return;
      if (err instanceof StaleFenceError) {
        this.lose(r, err);
        return;
      }
      this.report(err, r.job);
      // As conveyor's own processes do: once four fifths of the lease have
      // passed since the last renewal that got through, another worker may
      // soon hold the job, so stop working it.
      if (Date.now() - r.renewedAt > (this.leaseMs * 4) / 5) {
        this.lose(r, new Error(`job ${r.job.id}: lease lost: no heartbeat got through for ${Date.now() - r.renewedAt}ms`));
      }
    } finally {
      r.beating = false;
    }
  }

  private lose(r: Running, reason: Error): void {
    const wasRunning = r.phase === "running";
    r.phase = "dropped";
    this.stopHeartbeat(r);
    if (wasRunning) this.report(reason, r.job);
    r.ctl.abort(reason);
  }

  private stopHeartbeat(r: Running): void {
    if (r.timer !== undefined) clearInterval(r.timer);
    r.timer = undefined;
  }
}

/** Whether the job was lost or released (a function, so that TypeScript does not narrow phase across awaits). */
function dropped(r: Running): boolean {
  return r.phase === "dropped";
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
