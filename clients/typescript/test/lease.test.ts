// The worker's lease safety against a fake conveyor server whose worker
// endpoints hang or fail on demand: no database and no Go needed (npm test
// runs these alone; cmd/conveyor's TestTypeScriptClient runs them too).
//
// The rule, as conveyor's own processes keep it: a job's lease is known to
// hold until Lease after the last renewal that succeeded was *sent* (the
// claim, then each heartbeat answered 200); when no renewal got through
// for four fifths of the lease, the handler's signal is aborted, so the
// handler has the last fifth to return before the lease can expire and
// another worker claim the job. Times below are taken by a fetch wrapper
// as each request leaves the client, so "the last successful renewal's
// send" is the client's own.
//
// At the end, against the same fake server: the worker's check of a
// workflow job's dependencies before its handler runs.

import test from "node:test";
import assert from "node:assert/strict";
import { createServer, IncomingMessage, ServerResponse } from "node:http";
import { Client, ConveyorError, LeaseDeadlineError, Worker, snooze } from "../src/index.js";

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls until cond holds or ms passed; returns whether it held. */
async function until(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await sleep(5);
  }
  return true;
}

/** What the fake server does with a request: answer, or never answer. */
type Reply = { status: number; body: unknown } | "hang";

const ok = (body: unknown = {}): Reply => ({ status: 200, body });
const down: Reply = { status: 503, body: { error: "database unavailable" } };

/** A request as the fake server saw it. */
interface Seen {
  /** claim, heartbeat, complete, fail, snooze, release */
  kind: string;
  body: Record<string, unknown>;
  at: number;
  /** When the connection closed before an answer was written (the client gave up). */
  abandonedAt?: number;
}

interface Fake {
  url: string;
  seen: Seen[];
  of(kind: string): Seen[];
  close(): Promise<void>;
}

/** A job as a claim hands it out; no timeout of its own, so only the lease can stop it. */
function wireJob(id: number, kind = "work") {
  return {
    id, queue: "q", kind, state: "running", args: {}, priority: 0, attempt: 1, max_attempts: 25,
    timeout_ms: -1, created_at: null, scheduled_at: null, attempted_at: null, attempted_by: "http:t",
    lease_expires_at: null, finalized_at: null, errors: [], fence: 7,
  };
}

async function fakeServer(route: (kind: string, s: Seen) => Reply | Promise<Reply>): Promise<Fake> {
  const seen: Seen[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let text = "";
    req.on("data", (c) => (text += c.toString()));
    req.on("end", async () => {
      const path = req.url ?? "";
      const kind = path === "/api/v1/claim" ? "claim" : (/^\/api\/v1\/jobs\/\d+\/(\w+)$/.exec(path)?.[1] ?? path);
      const s: Seen = { kind, body: text ? JSON.parse(text) : {}, at: Date.now() };
      seen.push(s);
      let answered = false;
      res.on("close", () => {
        if (!answered) s.abandonedAt = Date.now();
      });
      const reply = await route(kind, s);
      if (reply === "hang") return;
      answered = true;
      res.writeHead(reply.status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(reply.body));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const addr = server.address();
  const port = typeof addr === "object" && addr ? addr.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    of: (kind) => seen.filter((s) => s.kind === kind),
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** A request as the client sent it. */
interface Sent {
  kind: string;
  sent: number;
  status?: number;
  answered?: number;
}

/** A client whose fetch records when each request left and how it was answered. */
function recordingClient(url: string): { client: Client; sent: Sent[]; renewals: () => Sent[] } {
  const sent: Sent[] = [];
  const f: typeof fetch = async (input, init) => {
    const path = new URL(String(input)).pathname;
    const kind = path === "/api/v1/claim" ? "claim" : (/(\w+)$/.exec(path)?.[1] ?? path);
    const s: Sent = { kind, sent: Date.now() };
    sent.push(s);
    const res = await fetch(input, init);
    s.status = res.status;
    s.answered = Date.now();
    return res;
  };
  // The claim that handed out the job, then every heartbeat answered 200.
  const renewals = () => sent.filter((s) => (s.kind === "claim" && s === sent[0]) || (s.kind === "heartbeat" && s.status === 200));
  return { client: new Client({ baseUrl: url, token: "t", fetch: f }), sent, renewals };
}

/** Answers the first claim with job 1 (after delayMs), later ones with nothing after their wait. */
function claims(delayMs = 0): (s: Seen) => Promise<Reply> {
  let handed = false;
  return async (s) => {
    if (!handed) {
      handed = true;
      await sleep(delayMs);
      return ok({ jobs: [wireJob(1)] });
    }
    await sleep(Number(s.body.wait_ms ?? 0));
    return ok({ jobs: [] });
  };
}

/** A handler that waits for its signal, notes when and why it was aborted, then resolves (a "success" that must not be sent). */
function abortWatcher() {
  const w = { started: 0, abortedAt: 0, reason: undefined as unknown, ran: 0 };
  const handler = (_job: unknown, signal: AbortSignal) =>
    new Promise<void>((resolve) => {
      w.ran++;
      w.started = Date.now();
      signal.addEventListener("abort", () => {
        w.abortedAt = Date.now();
        w.reason = signal.reason;
        resolve();
      });
    });
  return { w, handler };
}

/**
 * Checks that the handler was aborted by the lease deadline after four
 * fifths of the lease and before the lease could expire, both measured
 * from the send of the last renewal that succeeded before the abort.
 */
async function checkCutOff(
  w: { abortedAt: number; reason: unknown },
  renewals: () => Sent[],
  leaseMs: number,
): Promise<number> {
  const lastOk = () => Math.max(...renewals().filter((s) => w.abortedAt === 0 || s.sent < w.abortedAt).map((s) => s.sent));
  const aborted = await until(() => w.abortedAt > 0 || Date.now() > lastOk() + leaseMs + 500, 60_000);
  assert.ok(aborted && w.abortedAt > 0, `the handler's signal was not aborted before the lease (${leaseMs}ms from the last successful renewal) expired`);
  const since = w.abortedAt - lastOk();
  assert.ok(since < leaseMs, `aborted ${since}ms after the last successful renewal was sent: the lease (${leaseMs}ms) could have expired`);
  assert.ok(since >= (leaseMs * 4) / 5 - 50, `aborted ${since}ms after the last successful renewal was sent, before four fifths of the lease`);
  assert.ok(w.reason instanceof LeaseDeadlineError, `aborted with ${w.reason}`);
  assert.equal(w.reason.jobId, 1);
  assert.match(w.reason.message, /lease could not be renewed in time/);
  return since;
}

/** Waits for the attempt's outcome: a fail naming the lease deadline, and never a complete. */
async function checkFailedNotCompleted(srv: Fake): Promise<void> {
  assert.ok(await until(() => srv.of("fail").length > 0 || srv.of("complete").length > 0, 20_000), "no outcome was sent");
  assert.equal(srv.of("complete").length, 0, "a cut-off attempt was sent as a success");
  const f = srv.of("fail")[0];
  assert.equal(f.body.fence, 7);
  assert.match(String(f.body.error), /lease could not be renewed in time/);
  assert.notEqual(f.body.cancel, true);
}

test("a heartbeat that hangs: the handler is aborted in time, the hung beat given up and retried", { timeout: 60_000 }, async (t) => {
  const leaseMs = 4000;
  let beats = 0;
  const claim = claims();
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ++beats === 1 ? ok({ id: 1, lease_ms: leaseMs }) : "hang";
    return ok({ state: "retryable" });
  });
  const { client, sent, renewals } = recordingClient(srv.url);
  const { w, handler } = abortWatcher();
  const worker = new Worker(client, { queue: "q", leaseMs, waitMs: 100, handlers: { work: handler }, onError: () => {} });
  worker.start();
  try {
    const since = await checkCutOff(w, renewals, leaseMs);
    const okBeats = renewals().filter((s) => s.kind === "heartbeat");
    assert.equal(okBeats.length, 1, "the renewal the abort was measured from is the one heartbeat answered");
    // The hung beat did not hold up the others: it was given up (its
    // connection closed by the client) and beats were sent again.
    const hung = srv.of("heartbeat").slice(1);
    assert.ok(hung.length >= 2, `${hung.length} heartbeats sent after the last success, want the hung one given up and retried`);
    assert.ok(hung[0].abandonedAt !== undefined && hung[0].abandonedAt < w.abortedAt, "the hung heartbeat was not given up before the handler was aborted");
    await checkFailedNotCompleted(srv);
    assert.ok(sent.every((s) => s.kind !== "complete"));
    t.diagnostic(`hanging heartbeat: aborted ${since}ms after the last successful renewal's send (lease ${leaseMs}ms); ${hung.length} beats tried meanwhile`);
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("heartbeats that fail: the handler is aborted before the lease can expire, measured from the last success", { timeout: 60_000 }, async () => {
  const leaseMs = 3000;
  let beats = 0;
  const claim = claims();
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ++beats === 1 ? ok({ id: 1, lease_ms: leaseMs }) : down;
    return ok({ state: "retryable" });
  });
  const { client, renewals } = recordingClient(srv.url);
  const { w, handler } = abortWatcher();
  // Beats at the longest interval allowed (half the lease): a check made
  // only when a beat fails comes a whole lease after the last success.
  const worker = new Worker(client, { queue: "q", leaseMs, heartbeatMs: leaseMs / 2, waitMs: 100, handlers: { work: handler }, onError: () => {} });
  worker.start();
  try {
    await checkCutOff(w, renewals, leaseMs);
    assert.equal(renewals().filter((s) => s.kind === "heartbeat").length, 1);
    await checkFailedNotCompleted(srv);
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("a claim that came back late: its lease counts from the claim's send, and it is renewed at once", { timeout: 60_000 }, async () => {
  const leaseMs = 3000;
  const claim = claims(leaseMs * 0.6); // a long poll whose job came late
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return down;
    return ok({ state: "retryable" });
  });
  const { client, sent, renewals } = recordingClient(srv.url);
  const { w, handler } = abortWatcher();
  const worker = new Worker(client, { queue: "q", leaseMs, waitMs: 100, handlers: { work: handler }, onError: () => {} });
  worker.start();
  try {
    await checkCutOff(w, renewals, leaseMs);
    const answered = sent[0].answered as number;
    const first = sent.find((s) => s.kind === "heartbeat");
    assert.ok(first, "no heartbeat was sent");
    assert.ok(first.sent - answered < leaseMs / 10, `the first heartbeat left ${first.sent - answered}ms after the late claim's answer, not at once`);
    await checkFailedNotCompleted(srv);
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("a claim that came back past its cut-off: the handler starts only after a renewal", { timeout: 60_000 }, async () => {
  const leaseMs = 2000;
  const claim = claims(leaseMs * 0.9);
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ok({ id: 1, lease_ms: leaseMs });
    return ok({});
  });
  const { client, sent } = recordingClient(srv.url);
  let started = 0;
  const worker = new Worker(client, {
    queue: "q", leaseMs, waitMs: 100, onError: () => {},
    handlers: { work: () => void (started = Date.now()) },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("complete").length > 0, 20_000), "the job was not completed");
    const renewed = sent.find((s) => s.kind === "heartbeat" && s.status === 200);
    assert.ok(renewed?.answered, "the job was started without a renewal");
    assert.ok(started >= renewed.answered, "the handler started before its lease was renewed");
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("a claim that came back past its cut-off and cannot be renewed is given back unstarted", { timeout: 60_000 }, async () => {
  const leaseMs = 2000;
  const claim = claims(leaseMs * 0.9);
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return down;
    return ok({});
  });
  const { client } = recordingClient(srv.url);
  let ran = 0;
  const errors: unknown[] = [];
  const worker = new Worker(client, {
    queue: "q", leaseMs, waitMs: 100, onError: (e) => errors.push(e),
    handlers: { work: () => void ran++ },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("release").length > 0 || ran > 0, 20_000), "the job was neither run nor given back");
    assert.equal(ran, 0, "the handler ran although its lease could not be renewed");
    assert.equal(srv.of("release")[0].body.fence, 7);
    assert.ok(await until(() => worker.active === 0, 5000));
    assert.equal(srv.of("complete").length + srv.of("fail").length, 0);
    assert.ok(errors.some((e) => /not started/.test(String((e as Error).message))), "the give-back was not reported to onError");
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("heartbeats that get through keep a handler running past its lease", { timeout: 60_000 }, async () => {
  const leaseMs = 1500;
  const claim = claims();
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ok({ id: 1, lease_ms: leaseMs });
    return ok({});
  });
  const { client } = recordingClient(srv.url);
  let aborted = false;
  const worker = new Worker(client, {
    queue: "q", leaseMs, waitMs: 100, onError: () => {},
    handlers: {
      work: async (_job, signal) => {
        signal.addEventListener("abort", () => (aborted = true));
        await sleep(leaseMs * 2.5);
      },
    },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("complete").length > 0 || srv.of("fail").length > 0, 20_000), "no outcome");
    assert.equal(aborted, false, "a handler whose lease was renewed was aborted");
    assert.equal(srv.of("complete").length, 1);
    assert.equal(srv.of("fail").length, 0);
    assert.ok(srv.of("heartbeat").length >= 5, `${srv.of("heartbeat").length} heartbeats in 2.5 leases`);
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("an acknowledgement that hangs is given up within the lease and sent again", { timeout: 60_000 }, async () => {
  const leaseMs = 3000;
  let completes = 0;
  const claim = claims();
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ok({ id: 1, lease_ms: leaseMs });
    if (kind === "complete") return ++completes === 1 ? "hang" : ok({});
    return ok({});
  });
  const { client } = recordingClient(srv.url);
  const worker = new Worker(client, { queue: "q", leaseMs, waitMs: 100, onError: () => {}, handlers: { work: () => {} } });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("complete").length > 0, 20_000), "no completion sent");
    const first = srv.of("complete")[0];
    const again = await until(() => srv.of("complete").length > 1, 2 * leaseMs);
    assert.ok(again, `the hung completion was not given up and sent again within ${2 * leaseMs}ms`);
    assert.ok(first.abandonedAt !== undefined && first.abandonedAt - first.at <= leaseMs + 200, "the hung completion outlived the lease");
  } finally {
    await srv.close();
    await worker.stop({ timeoutMs: 1000 });
  }
});

test("an outcome whose answer was lost, sent again and answered already_recorded, ends as a success", { timeout: 60_000 }, async () => {
  const leaseMs = 3000;
  const claim = claims();
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    if (kind === "heartbeat") return ok({ id: 1, lease_ms: leaseMs });
    // The first completion is written but its answer never comes; the
    // repeat is answered as conveyor serve answers it then.
    if (kind === "complete") return srv.of("complete").length === 1 ? "hang" : ok({ id: 1, state: "completed", already_recorded: true });
    return ok({});
  });
  const { client } = recordingClient(srv.url);
  const errors: unknown[] = [];
  const worker = new Worker(client, { queue: "q", leaseMs, waitMs: 100, onError: (e) => errors.push(e), handlers: { work: () => "done" } });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("complete").length > 1, 4 * leaseMs), "the completion whose answer was lost was not sent again");
    const stopped = await worker.stop({ timeoutMs: 5000 });
    assert.equal(stopped.released, 0);
    assert.equal(srv.of("complete").length, 2, "the completion was sent again after its success");
    assert.deepEqual(srv.of("complete")[1].body, { fence: 7, result: "done" });
    assert.equal(srv.of("fail").length + srv.of("release").length, 0, "the attempt was failed or released after its success");
    assert.ok(errors.every((e) => e instanceof ConveyorError && e.status === null), `errors other than the lost answer: ${errors}`);
  } finally {
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
});

test("complete and snooze resolve with alreadyRecorded from the answer", { timeout: 30_000 }, async () => {
  const srv = await fakeServer((kind, s) =>
    ok({ id: 1, state: kind === "snooze" ? "scheduled" : "completed", ...(s.body.fence === 8 ? { already_recorded: true } : {}) }),
  );
  try {
    const client = new Client({ baseUrl: srv.url, token: "t" });
    assert.deepEqual(await client.complete(1, 7), { id: 1, state: "completed", alreadyRecorded: false });
    assert.deepEqual(await client.complete(1, 8), { id: 1, state: "completed", alreadyRecorded: true });
    assert.deepEqual(await client.snooze(1, 8, 1000), { id: 1, state: "scheduled", alreadyRecorded: true });
  } finally {
    await srv.close();
  }
});

test("an outcome over the server's body cap (413) is not given up: a result fails the attempt, an error is sent cut", { timeout: 60_000 }, async () => {
  // As conveyor serve answers a body over MaxBodyBytes (1 MiB by default).
  const cap = 1 << 20;
  const tooLarge: Reply = { status: 413, body: { error: `request body over the ${cap}-byte limit` } };
  let handed = 0;
  const srv = await fakeServer(async (kind, s) => {
    if (kind === "claim") {
      if (handed < 2) return ok({ jobs: [wireJob(++handed, handed === 1 ? "bigResult" : "bigError")] });
      await sleep(Number(s.body.wait_ms ?? 0));
      return ok({ jobs: [] });
    }
    if (kind === "complete" || kind === "fail") {
      return JSON.stringify(s.body).length > cap ? tooLarge : ok({ state: "retryable" });
    }
    return ok({});
  });
  const worker = new Worker(new Client({ baseUrl: srv.url, token: "t" }), {
    queue: "q",
    concurrency: 2,
    waitMs: 100,
    onError: () => {},
    handlers: {
      bigResult: async () => "x".repeat(2 * cap),
      bigError: async () => {
        throw new Error("y".repeat(2 * cap));
      },
    },
  });
  worker.start();
  try {
    assert.ok(
      await until(() => srv.of("fail").filter((s) => JSON.stringify(s.body).length <= cap).length >= 2, 20_000),
      "an outcome refused with 413 was given up: the job's lease would lapse and its handler run again",
    );
    const fails = srv.of("fail").filter((s) => JSON.stringify(s.body).length <= cap);
    assert.ok(fails.some((s) => /^result refused: .*limit/.test(String(s.body.error))), "the result refused with 413 did not fail the attempt naming why");
    assert.ok(fails.some((s) => String(s.body.error).startsWith("yyy")), "the error refused with 413 was not sent again, cut");
  } finally {
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
});

test("a result JSON cannot encode fails the attempt naming why; it is not retried as if unanswered", { timeout: 60_000 }, async () => {
  const claim = claims();
  const srv = await fakeServer((kind, s) => (kind === "claim" ? claim(s) : ok({ id: 1, state: "retryable" })));
  const { client, sent } = recordingClient(srv.url);
  const errors: unknown[] = [];
  const worker = new Worker(client, {
    queue: "q",
    waitMs: 100,
    onError: (e) => errors.push(e),
    handlers: { work: async () => ({ total: 10n }) },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("fail").length > 0, 15_000), "the attempt whose result cannot be encoded was never failed: its lease would lapse and its handler run again");
    const f = srv.of("fail")[0];
    assert.equal(f.body.fence, 7);
    assert.match(String(f.body.error), /^result refused: .*BigInt/);
    assert.equal(sent.filter((s) => s.kind === "complete").length, 0, "a completion left the client");
    assert.ok(!errors.some((e) => e instanceof ConveyorError && e.status === null), `reported as a request without answer: ${errors}`);
  } finally {
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
});

test("a client call whose body JSON cannot encode throws its TypeError, not a request without answer", { timeout: 30_000 }, async () => {
  const srv = await fakeServer(() => ok({ id: 1, state: "completed" }));
  try {
    const client = new Client({ baseUrl: srv.url, token: "t" });
    await assert.rejects(client.complete(1, 7, undefined, { n: 1n }), (e: unknown) => e instanceof TypeError && !(e instanceof ConveyorError));
    assert.equal(srv.seen.length, 0);
  } finally {
    await srv.close();
  }
});

test("a snooze the server refuses (400) fails the attempt naming why, rather than being dropped", { timeout: 60_000 }, async () => {
  const claim = claims();
  const maxMs = 30 * 24 * 3600 * 1000;
  const srv = await fakeServer((kind, s) => {
    if (kind === "claim") return claim(s);
    // As conveyor serve answers a delay over conveyor.MaxSnooze.
    if (kind === "snooze" && Number(s.body.delay_ms) > maxMs) return { status: 400, body: { error: `delay_ms ${s.body.delay_ms}: must be 0 to ${maxMs}` } };
    return ok({ id: 1, state: kind === "fail" ? "retryable" : "scheduled" });
  });
  const worker = new Worker(new Client({ baseUrl: srv.url, token: "t" }), {
    queue: "q",
    waitMs: 100,
    onError: () => {},
    handlers: { work: async () => snooze(2 * maxMs) },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("fail").length > 0, 15_000), "the refused snooze was dropped: the job's lease would lapse and its handler run again");
    assert.equal(srv.of("snooze").length, 1);
    assert.match(String(srv.of("fail")[0].body.error), /^snooze refused: delay_ms/);
    assert.equal(srv.of("fail")[0].body.fence, 7);
  } finally {
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
});

test("a job claimed again while its old attempt is still being acknowledged is counted, waited for and released on its own", { timeout: 60_000 }, async () => {
  // Attempt 1 (fence 7) completes, but its completion gets no answer
  // until the job was rescued and this very worker claimed it again
  // (fence 8); then it is refused as stale. Attempt 2 is still running.
  let claimsSeen = 0;
  let secondStarted = false;
  let firstRefused = false;
  const srv = await fakeServer(async (kind, s) => {
    if (kind === "claim") {
      claimsSeen++;
      if (claimsSeen === 1) return ok({ jobs: [wireJob(1)] });
      if (claimsSeen === 2 && (await until(() => srv.of("complete").length > 0, 10_000))) return ok({ jobs: [{ ...wireJob(1), fence: 8 }] });
      await sleep(Number(s.body.wait_ms ?? 0));
      return ok({ jobs: [] });
    }
    if (kind === "complete" && s.body.fence === 7) {
      await until(() => secondStarted, 10_000);
      firstRefused = true;
      return { status: 409, body: { error: "job 1 is no longer held under fence 7" } };
    }
    return ok({ id: 1, lease_ms: 30_000, state: "available" });
  });
  let releaseSecond = () => {};
  const worker = new Worker(new Client({ baseUrl: srv.url, token: "t" }), {
    queue: "q",
    concurrency: 2,
    waitMs: 100,
    onError: () => {},
    handlers: {
      work: (job: { fence: number }, signal: AbortSignal) => {
        if (job.fence === 7) return "first";
        secondStarted = true;
        return new Promise<void>((resolve) => {
          releaseSecond = resolve;
          signal.addEventListener("abort", () => resolve());
        });
      },
    },
  });
  worker.start();
  try {
    assert.ok(await until(() => secondStarted, 15_000), "the job was not claimed again");
    assert.ok(await until(() => firstRefused, 5000), "the first attempt's completion was not answered");
    await sleep(200); // the first attempt's acknowledgement is over
    assert.equal(worker.active, 1, "the second attempt, still running, is not counted");
    const stopped = await worker.stop({ timeoutMs: 300 });
    assert.equal(stopped.released, 1, "stop did not give back the second attempt, still running");
    assert.deepEqual(srv.of("release").map((r) => r.body.fence), [8]);
  } finally {
    releaseSecond();
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
});

test("claims answered empty before their wait (a server closing, or waitMs 0) are paced, not sent in a tight loop", { timeout: 30_000 }, async () => {
  // As a closing conveyor serve answers: at once, with no jobs.
  const srv = await fakeServer(() => ok({ jobs: [] }));
  try {
    for (const waitMs of [20_000, 0]) {
      const before = srv.of("claim").length;
      const worker = new Worker(new Client({ baseUrl: srv.url, token: "t" }), { queue: "q", waitMs, onError: () => {}, handlers: { work: () => 1 } });
      worker.start();
      await sleep(1000);
      await worker.stop({ timeoutMs: 1000 });
      const n = srv.of("claim").length - before;
      assert.ok(n >= 2 && n <= 12, `${n} claims in a second with waitMs ${waitMs} against a server answering empty at once, want a few (50ms doubling to 1s between them)`);
    }
  } finally {
    await srv.close();
  }
});

/** A claimed workflow job (the callback of batch 5); cancel marks it for the "cancel" policy. */
function workflowJob(cancel: boolean) {
  const metadata: Record<string, string> = { "conveyor.batch_id": "5" };
  if (cancel) metadata["conveyor.cancel_on_dependency_failure"] = "1";
  return { ...wireJob(1), metadata };
}

/** Runs a worker over one claimed job until it sends an outcome; returns the fake server and whether the handler ran. */
async function workOne(job: unknown, batch: (path: string) => Reply): Promise<{ srv: Fake; ran: boolean }> {
  let handed = false;
  const srv = await fakeServer(async (kind, s) => {
    if (kind === "claim") {
      if (!handed) {
        handed = true;
        return ok({ jobs: [job] });
      }
      await sleep(Number(s.body.wait_ms ?? 0));
      return ok({ jobs: [] });
    }
    if (kind === "/api/v1/batches/5" || kind.startsWith("/api/v1/batches/5?")) return batch(kind);
    return ok({});
  });
  let ran = false;
  const worker = new Worker(new Client({ baseUrl: srv.url, token: "t" }), {
    queue: "q",
    waitMs: 100,
    onError: () => {},
    handlers: { work: () => void (ran = true) },
  });
  worker.start();
  try {
    assert.ok(await until(() => srv.of("fail").length + srv.of("complete").length > 0, 20_000), "no outcome was sent");
  } finally {
    await worker.stop({ timeoutMs: 1000 });
    await srv.close();
  }
  return { srv, ran };
}

const batchOf = (...jobs: Array<{ id: number; state: string }>) =>
  ok({ id: 5, created_at: null, finished: true, callback_kind: "work", callback_id: 1, fired_at: null, counts: {}, jobs });

test("a workflow job whose dependency did not complete is failed with cancel, naming it, without running the handler", { timeout: 30_000 }, async () => {
  for (const [state, said] of [["discarded", "discarded"], ["cancelled", "cancelled"], ["", "deleted"]]) {
    const { srv, ran } = await workOne(workflowJob(true), () => batchOf({ id: 8, state: "completed" }, { id: 9, state }));
    assert.equal(ran, false, `the handler ran although dependency 9 is ${said}`);
    assert.equal(srv.of("complete").length, 0);
    const f = srv.of("fail")[0];
    assert.equal(f.body.fence, 7);
    assert.equal(f.body.cancel, true);
    assert.equal(f.body.error, `dependency job 9 is ${said}`);
  }
});

const batchPage = { id: 5, created_at: null, finished: true, callback_kind: "work", callback_id: 1, fired_at: null, counts: { completed: 2, discarded: 1 } };

test("the dependencies of a workflow job are read on every page of its batch", { timeout: 30_000 }, async () => {
  const { srv, ran } = await workOne(workflowJob(true), (path) => {
    switch (path) {
      case "/api/v1/batches/5":
        return ok({ ...batchPage, jobs: [{ id: 7, state: "completed" }, { id: 8, state: "completed" }], next_after: 8 });
      case "/api/v1/batches/5?after=8":
        return ok({ ...batchPage, jobs: [{ id: 9, state: "discarded" }], next_after: null });
      default:
        return { status: 400, body: { error: `unexpected ${path}` } };
    }
  });
  assert.equal(ran, false, "the handler ran although dependency 9, on the second page, is discarded");
  assert.deepEqual(srv.seen.filter((s) => s.kind.startsWith("/api/v1/batches/")).map((s) => s.kind), ["/api/v1/batches/5", "/api/v1/batches/5?after=8"]);
  assert.equal(srv.of("fail")[0]?.body.error, "dependency job 9 is discarded");
});

test("a workflow job whose dependencies completed runs; under the run policy its batch is not read", { timeout: 30_000 }, async () => {
  let r = await workOne(workflowJob(true), () => batchOf({ id: 8, state: "completed" }, { id: 9, state: "completed" }));
  assert.equal(r.ran, true);
  assert.equal(r.srv.of("complete").length, 1);
  assert.equal(r.srv.of("/api/v1/batches/5").length, 1);
  r = await workOne(workflowJob(false), () => batchOf({ id: 9, state: "discarded" }));
  assert.equal(r.ran, true, "a job under the run policy runs whatever its dependencies became");
  assert.equal(r.srv.of("complete").length, 1);
  assert.equal(r.srv.of("/api/v1/batches/5").length, 0, "the batch of a job under the run policy was read");
});

test("a workflow job whose batch cannot be read fails its attempt (retried), without running the handler", { timeout: 30_000 }, async () => {
  const { srv, ran } = await workOne(workflowJob(true), () => down);
  assert.equal(ran, false);
  const f = srv.of("fail")[0];
  assert.notEqual(f.body.cancel, true, "a failed read cancelled the job");
  assert.match(String(f.body.error), /^reading the dependencies of workflow job 1: .*503.*database unavailable/);
});
