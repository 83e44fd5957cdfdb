/**
 * An error from conveyor's HTTP API: a 4xx or 5xx answer (with the
 * server's one-sentence message), or a request that got no answer
 * (network failure, timeout: `status` is null).
 */
export class ConveyorError extends Error {
  /** The HTTP status, or null when no answer came. */
  readonly status: number | null;
  /** The server's message (`{"error": ...}`), or the failure's description. */
  readonly serverMessage: string;
  /** The request, as `METHOD /path`. */
  readonly request: string;

  constructor(request: string, status: number | null, serverMessage: string, options?: { cause?: unknown }) {
    const what = status === null ? "no answer" : `${status}`;
    super(`conveyor: ${request}: ${what}: ${serverMessage}`, options);
    this.name = "ConveyorError";
    this.status = status;
    this.serverMessage = serverMessage;
    this.request = request;
  }

  /** Whether retrying the same request later may succeed (no answer, 429 or 5xx). */
  get transient(): boolean {
    return this.status === null || this.status === 429 || this.status >= 500;
  }
}

/**
 * A 409 to heartbeat, complete, fail, snooze or release: the claim no
 * longer holds the job (its lease expired and it was claimed again, or it
 * was released, cancelled, discarded or finished). Nothing was written;
 * stop working the job and do not retry the request. (An outcome sent
 * again after its first answer was lost, whose first request was written,
 * is not refused: it resolves, marked `alreadyRecorded`.)
 */
export class StaleFenceError extends ConveyorError {
  readonly jobId: number;
  readonly fence: number;

  constructor(request: string, serverMessage: string, jobId: number, fence: number) {
    super(request, 409, serverMessage);
    this.name = "StaleFenceError";
    this.jobId = jobId;
    this.fence = fence;
  }
}

/**
 * Returned or thrown by a handler to put its job back for later without
 * using an attempt (the server's snooze). Make one with `snooze(delayMs)`.
 */
export class Snooze {
  readonly delayMs: number;
  constructor(delayMs: number) {
    if (!Number.isFinite(delayMs) || delayMs < 0) {
      throw new RangeError(`snooze: delayMs ${delayMs} must be a finite number >= 0`);
    }
    this.delayMs = Math.round(delayMs);
  }
}

/** A snooze marker: `return snooze(60_000)` or `throw snooze(60_000)`. */
export function snooze(delayMs: number): Snooze {
  return new Snooze(delayMs);
}

/**
 * Thrown by a handler to fail its job without retry: the job ends
 * cancelled, with this error's message recorded as the attempt's error.
 */
export class CancelJob extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "CancelJob";
  }
}
