// Tests against a real `conveyor serve`. cmd/conveyor's TestTypeScriptClient
// starts the server (SQLite, and PostgreSQL/MariaDB when reachable),
// enqueues jobs from Go, runs a Go worker, and passes in the environment:
//
//   CONVEYOR_URL, CONVEYOR_TOKEN   the server and an admin token
//   CONVEYOR_TS_DRAIN_QUEUE/IDS    jobs Go enqueued for the TypeScript worker,
//                                  each with metadata {"from": "go", "n": its n}
//   CONVEYOR_TS_GO_QUEUE/KIND      where a Go worker runs what TypeScript enqueues
//   CONVEYOR_TS_RESULTS            a directory for the ids seen, checked by Go afterwards
//
// Without CONVEYOR_URL every test is skipped.

import test from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  CancelJob,
  ClaimedJob,
  Client,
  ConveyorError,
  Job,
  StaleFenceError,
  Worker,
  WorkerStopping,
  snooze,
} from "../src/index.js";

const env = process.env;
const url = env.CONVEYOR_URL ?? "";
const skip = url === "" ? "CONVEYOR_URL not set: run through cmd/conveyor's TestTypeScriptClient" : false;
const client = new Client({ baseUrl: url || "http://127.0.0.1:1", token: env.CONVEYOR_TOKEN });
const run = `${Date.now().toString(36)}`; // queue names unique to this run

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls until cond holds, failing after ms. */
async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`timed out after ${ms}ms waiting for ${what}`);
    await sleep(25);
  }
}

/** Waits for a job to reach one of the states and returns it. */
async function settled(id: number, states: string[], ms = 20_000): Promise<Job> {
  let j: Job | undefined;
  await until(`job ${id} to be ${states.join(" or ")} (is ${j?.state})`, async () => {
    j = await client.getJob(id);
    return states.includes(j.state);
  }, ms);
  return j as Job;
}

/** A worker whose onError collects instead of printing. */
function quietWorker(opts: ConstructorParameters<typeof Worker>[1], errors: unknown[] = []): Worker {
  return new Worker(client, { onError: (e) => errors.push(e), ...opts });
}

test("drains the jobs Go enqueued, each exactly once", { skip, timeout: 60_000 }, async () => {
  const queue = env.CONVEYOR_TS_DRAIN_QUEUE;
  const ids = (env.CONVEYOR_TS_DRAIN_IDS ?? "").split(",").filter(Boolean).map(Number);
  assert.ok(queue && ids.length > 0, "CONVEYOR_TS_DRAIN_QUEUE and CONVEYOR_TS_DRAIN_IDS are required");
  const seen: number[] = [];
  let running = 0;
  let most = 0;
  const errors: unknown[] = [];
  const w = quietWorker(
    {
      queue,
      concurrency: 8,
      waitMs: 2000,
      handlers: {
        ts_echo: async (job: ClaimedJob<{ n: number }>) => {
          assert.equal(typeof job.args.n, "number");
          assert.deepEqual(job.metadata, { from: "go", n: String(job.args.n) });
          running++;
          most = Math.max(most, running);
          seen.push(job.id);
          await sleep(Math.random() * 10);
          running--;
        },
      },
    },
    errors,
  );
  w.start();
  const want = new Set(ids);
  await until(`${ids.length} jobs drained (${seen.length} so far)`, () => seen.filter((id) => want.has(id)).length >= want.size, 45_000);
  const res = await w.stop({ timeoutMs: 10_000 });
  assert.equal(res.released, 0);
  assert.deepEqual(errors, []);
  assert.equal(new Set(seen).size, seen.length, "a job was run twice");
  assert.deepEqual([...seen].sort((a, b) => a - b), [...ids].sort((a, b) => a - b));
  assert.ok(most <= 8, `concurrency ${most} over 8`);
  assert.ok(most > 1, "jobs never ran concurrently");
  const j = await client.getJob(ids[0]);
  assert.equal(j.state, "completed");
  assert.equal(j.attemptedBy, `http:${w.name}`);
  if (env.CONVEYOR_TS_RESULTS) writeFileSync(join(env.CONVEYOR_TS_RESULTS, "drained.json"), JSON.stringify(seen));
});

test("enqueues jobs that a Go worker runs", { skip, timeout: 60_000 }, async () => {
  const queue = env.CONVEYOR_TS_GO_QUEUE;
  const kind = env.CONVEYOR_TS_GO_KIND;
  assert.ok(queue && kind, "CONVEYOR_TS_GO_QUEUE and CONVEYOR_TS_GO_KIND are required");
  const batch = await client.enqueueMany(
    Array.from({ length: 49 }, (_, i) => ({ kind, args: { n: i, from: "ts" }, queue, maxAttempts: 3 })),
  );
  assert.equal(batch.length, 49);
  assert.ok(batch.every((r) => r.id > 0 && !r.duplicate));
  const one = await client.enqueue(kind, { n: 49, from: "ts" }, { queue, priority: 1 });
  assert.equal(one.duplicate, false);
  const ids = [...batch.map((r) => r.id), one.id];
  assert.equal(new Set(ids).size, 50);
  for (const id of ids) {
    const j = await settled(id, ["completed", "retryable", "discarded", "cancelled"], 30_000);
    assert.equal(j.state, "completed", `job ${id}: ${JSON.stringify(j.errors)}`);
    assert.equal(j.queue, queue);
    assert.equal((j.args as { from: string }).from, "ts");
    assert.ok(!j.attemptedBy?.startsWith("http:"), `job ${id} was run by ${j.attemptedBy}, not the Go worker`);
  }
  const page = await client.listJobs({ queue, limit: 100 });
  assert.deepEqual(page.jobs.map((j) => j.id).sort((a, b) => a - b), [...ids].sort((a, b) => a - b));
  assert.equal(page.truncated, false);
  assert.ok(page.maxPageBytes > 0, `maxPageBytes ${page.maxPageBytes}`);
  if (env.CONVEYOR_TS_RESULTS) writeFileSync(join(env.CONVEYOR_TS_RESULTS, "enqueued.json"), JSON.stringify(ids));
});

test("metadata comes back from get, list and claim, whoever enqueued it", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-meta-${run}`;
  const meta = { tenant: "acme", traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", note: "✓ <&>" };
  const one = await client.enqueue("meta", { n: 1 }, { queue, metadata: meta });
  const [two, none, empty] = await client.enqueueMany([
    { kind: "meta", queue, metadata: { request: "r-2" } },
    { kind: "meta", queue },
    { kind: "meta", queue, metadata: {} },
  ]);
  // Through the API itself, as a program in another language would.
  const res = await fetch(`${url}/api/v1/jobs`, {
    method: "POST",
    headers: { Authorization: `Bearer ${env.CONVEYOR_TOKEN}`, "Content-Type": "application/json" },
    body: JSON.stringify({ kind: "meta", queue, metadata: { from: "raw" } }),
  });
  assert.equal(res.status, 201);
  const raw = (await res.json()) as { id: number };
  const want = new Map<number, Record<string, string> | null>([
    [one.id, meta],
    [two.id, { request: "r-2" }],
    [none.id, null],
    [empty.id, null],
    [raw.id, { from: "raw" }],
  ]);
  for (const [id, m] of want) assert.deepEqual((await client.getJob(id)).metadata, m, `getJob(${id})`);
  const page = await client.listJobs({ queue });
  assert.deepEqual(
    page.jobs.map((j) => [j.id, j.metadata]),
    [...want],
  );
  const claimed = await client.claim({ queue, limit: 10, waitMs: 5000, worker: "ts-meta" });
  assert.deepEqual(claimed.map((j) => j.id).sort((a, b) => a - b), [...want.keys()].sort((a, b) => a - b));
  for (const j of claimed) {
    assert.deepEqual(j.metadata, want.get(j.id), `claimed job ${j.id}`);
    await client.complete(j.id, j.fence);
  }

  // The server refuses what the library refuses, naming it.
  const refused = await client.enqueue("meta", {}, { queue, metadata: { k: "a\u0000b" } }).then(
    () => assert.fail("metadata with a NUL character was accepted"),
    (e: unknown) => e,
  );
  assert.ok(refused instanceof ConveyorError, `not a ConveyorError: ${refused}`);
  assert.equal(refused.status, 400);
  assert.match(refused.serverMessage, /metadata key "k": a NUL character/);
  const big = await client.enqueue("meta", {}, { queue, metadata: { pad: "x".repeat(70_000) } }).then(
    () => assert.fail("metadata over 64 KiB was accepted"),
    (e: unknown) => e,
  );
  assert.ok(big instanceof ConveyorError && big.status === 400, `not a 400: ${big}`);
  assert.match(big.serverMessage, /metadata is \d+ bytes encoded, over the 65536-byte limit/);
  assert.equal((await client.listJobs({ queue })).jobs.length, want.size, "a refused enqueue wrote a job");

  // cmd/conveyor's test reads these back with `conveyor job --json`.
  if (env.CONVEYOR_TS_RESULTS) {
    writeFileSync(join(env.CONVEYOR_TS_RESULTS, "metadata.json"), JSON.stringify(Object.fromEntries(want)));
  }
});

test("a stale worker's acknowledgements are refused with 409", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-stale-${run}`;
  const { id } = await client.enqueue("stale", { x: 1 }, { queue });
  const [first] = await client.claim({ queue, waitMs: 5000, worker: "stale-a" });
  assert.equal(first?.id, id);
  await client.release(id, first.fence);
  const [second] = await client.claim({ queue, waitMs: 5000, worker: "stale-b" });
  assert.equal(second?.id, id);
  assert.ok(second.fence > first.fence, `fence ${second.fence} not above ${first.fence}`);

  const refused = await client.complete(id, first.fence).then(
    () => assert.fail("a completion under the old fence was accepted"),
    (e: unknown) => e,
  );
  assert.ok(refused instanceof StaleFenceError, `not a StaleFenceError: ${refused}`);
  assert.equal(refused.status, 409);
  assert.equal(refused.jobId, id);
  assert.equal(refused.fence, first.fence);
  assert.match(refused.serverMessage, /no longer held under fence/);
  assert.match(refused.message, /409/);
  await assert.rejects(client.heartbeat(id, first.fence), StaleFenceError);
  await assert.rejects(client.fail(id, first.fence, { error: "late" }), StaleFenceError);
  await assert.rejects(client.snooze(id, first.fence, 1000), StaleFenceError);
  await assert.rejects(client.release(id, first.fence), StaleFenceError);

  let j = await client.getJob(id);
  assert.equal(j.state, "running", "a refused acknowledgement changed the job");
  assert.deepEqual(j.errors, []);
  await client.complete(id, second.fence);
  j = await client.getJob(id);
  assert.equal(j.state, "completed");
  assert.equal(j.attempt, 1, "the released attempt was counted");
});

test("an outcome sent again after its answer was lost resolves as already recorded; another outcome is refused", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-again-${run}`;
  const claimOne = async () => {
    const [j] = await client.claim({ queue, waitMs: 5000, worker: "again" });
    assert.ok(j, "nothing claimed");
    return j;
  };
  await client.enqueue("again", {}, { queue });
  const c = await claimOne();
  assert.deepEqual(await client.complete(c.id, c.fence, undefined, { n: 1 }), { id: c.id, state: "completed", alreadyRecorded: false });
  assert.deepEqual(await client.complete(c.id, c.fence, undefined, { n: 1 }), { id: c.id, state: "completed", alreadyRecorded: true });
  assert.deepEqual((await client.getJob(c.id)).result, { n: 1 });
  await assert.rejects(client.fail(c.id, c.fence, { error: "late" }), StaleFenceError);

  await client.enqueue("again", {}, { queue });
  const f = await claimOne();
  const failure = { error: "smtp: timeout", trace: "at send", retryInMs: 3_600_000 };
  assert.equal(await client.fail(f.id, f.fence, failure), "retryable");
  assert.equal(await client.fail(f.id, f.fence, failure), "retryable");
  await assert.rejects(client.complete(f.id, f.fence), StaleFenceError);
  const j = await client.getJob(f.id);
  assert.equal(j.state, "retryable");
  assert.equal(j.errors.length, 1, "the failure sent again was recorded twice");

  await client.enqueue("again", {}, { queue });
  const s = await claimOne();
  assert.equal((await client.snooze(s.id, s.fence, 3_600_000)).alreadyRecorded, false);
  assert.equal((await client.snooze(s.id, s.fence, 3_600_000)).alreadyRecorded, true);
  await assert.rejects(client.complete(s.id, s.fence), StaleFenceError);
});

test("a lease that expired is rescued, and the old holder's completion refused", { skip, timeout: 60_000 }, async () => {
  // serve's maintenance rescues expired leases every 5s.
  const queue = `ts-lease-${run}`;
  const { id } = await client.enqueue("lease", {}, { queue });
  const [old] = await client.claim({ queue, waitMs: 5000, leaseMs: 1000, worker: "slow" });
  assert.equal(old?.id, id);
  let again: ClaimedJob | undefined;
  await until("the job to be rescued and claimed again", async () => {
    [again] = await client.claim({ queue, waitMs: 1000, worker: "fresh" });
    return again !== undefined;
  }, 30_000);
  assert.equal(again?.id, id);
  await assert.rejects(client.complete(id, old.fence), (e: unknown) => e instanceof StaleFenceError && e.status === 409);
  await client.complete(id, (again as ClaimedJob).fence);
  assert.equal((await client.getJob(id)).state, "completed");
});

test("the worker aborts a job cancelled while it runs, and drops its outcome", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-cancel-${run}`;
  let started = false;
  let reason: unknown;
  const errors: unknown[] = [];
  const w = quietWorker(
    {
      queue,
      leaseMs: 2000,
      heartbeatMs: 100,
      waitMs: 1000,
      handlers: {
        slow: (_job: ClaimedJob, signal: AbortSignal) =>
          new Promise<void>((resolve) => {
            started = true;
            signal.addEventListener("abort", () => {
              reason = signal.reason;
              resolve(); // a "success" after the abort: must not be sent
            });
          }),
      },
    },
    errors,
  );
  w.start();
  const { id } = await client.enqueue("slow", {}, { queue });
  await until("the handler to start", () => started);
  await client.cancel(id);
  await until("the handler's signal to be aborted", () => reason !== undefined, 10_000);
  assert.ok(reason instanceof StaleFenceError, `aborted with ${reason}`);
  await until("the job to leave the worker", () => w.active === 0);
  assert.equal((await w.stop({ timeoutMs: 2000 })).released, 0);
  const j = await client.getJob(id);
  assert.equal(j.state, "cancelled");
  assert.ok(errors.some((e) => e instanceof StaleFenceError), "the 409 was not reported to onError");
});

test("stop waits for running jobs, then aborts and releases the rest", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-stop-${run}`;
  const started = new Set<string>();
  let stuckReason: unknown;
  const w = quietWorker({
    queue,
    concurrency: 2,
    waitMs: 1000,
    handlers: {
      quick: async () => {
        started.add("quick");
        await sleep(300);
      },
      stuck: (_job: ClaimedJob, signal: AbortSignal) => {
        started.add("stuck");
        return new Promise((_, reject) => signal.addEventListener("abort", () => reject((stuckReason = signal.reason))));
      },
    },
  });
  const [quick, stuck] = await client.enqueueMany([
    { kind: "quick", queue },
    { kind: "stuck", queue },
  ]);
  w.start();
  await until("both jobs to start", () => started.size === 2);
  const t0 = Date.now();
  const res = await w.stop({ timeoutMs: 1000 });
  const took = Date.now() - t0;
  assert.equal(res.released, 1);
  assert.ok(took >= 900 && took < 5000, `stop took ${took}ms`);
  assert.ok(stuckReason instanceof WorkerStopping, `stuck job aborted with ${stuckReason}`);
  assert.equal(w.active, 0);
  assert.equal((await client.getJob(quick.id)).state, "completed", "stop did not wait for the running job");
  const s = await client.getJob(stuck.id);
  assert.equal(s.state, "available", "the stuck job was not released");
  assert.equal(s.attempt, 0, "the released attempt was counted");
  assert.deepEqual(s.errors, []);
  // Stopped: nothing is claimed any more.
  await sleep(300);
  assert.equal((await client.getJob(stuck.id)).state, "available");
  await client.cancel(stuck.id);
});

test("fail records the message and stack; CancelJob cancels; snooze puts back", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-outcomes-${run}`;
  const w = quietWorker({
    queue,
    concurrency: 4,
    waitMs: 1000,
    handlers: {
      boom: async function explodingHandler() {
        throw new Error("boom: 42 <script>");
      },
      nope: async () => {
        throw new CancelJob("not worth retrying");
      },
      later: async () => snooze(60_000),
      laterThrown: async () => {
        throw snooze(60_000);
      },
      slowpoke: (_job: ClaimedJob, signal: AbortSignal) =>
        new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
    },
  });
  const [boom, nope, later, laterThrown, unknown, slowpoke] = await client.enqueueMany([
    { kind: "boom", queue, maxAttempts: 3 },
    { kind: "nope", queue },
    { kind: "later", queue },
    { kind: "laterThrown", queue },
    { kind: "no_such_kind", queue, maxAttempts: 1 },
    { kind: "slowpoke", queue, timeoutMs: 300, maxAttempts: 1 },
  ]);
  w.start();
  try {
    const b = await settled(boom.id, ["retryable", "discarded"]);
    assert.equal(b.state, "retryable");
    assert.equal(b.errors.length, 1);
    assert.equal(b.errors[0].error, "boom: 42 <script>");
    assert.match(b.errors[0].trace ?? "", /explodingHandler/);
    const n = await settled(nope.id, ["cancelled", "retryable"]);
    assert.equal(n.state, "cancelled");
    assert.equal(n.errors[0]?.error, "not worth retrying");
    for (const id of [later.id, laterThrown.id]) {
      const l = await settled(id, ["scheduled", "retryable", "completed"]);
      assert.equal(l.state, "scheduled");
      assert.equal(l.attempt, 0, "a snooze used an attempt");
      assert.ok(Date.parse(l.scheduledAt ?? "") > Date.now() + 30_000, `scheduled at ${l.scheduledAt}`);
    }
    const u = await settled(unknown.id, ["discarded", "retryable"]);
    assert.match(u.errors[0]?.error ?? "", /no handler for kind no_such_kind/);
    const s = await settled(slowpoke.id, ["discarded", "retryable"]);
    assert.match(s.errors[0]?.error ?? "", /timed out after 300ms/);
  } finally {
    await w.stop({ timeoutMs: 2000 });
  }
  for (const id of [boom.id, later.id, laterThrown.id]) await client.cancel(id).catch(() => {});
});

test("a handler's value is stored as the job's result; a refused result fails the attempt naming why", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-results-${run}`;
  const w = quietWorker({
    queue,
    concurrency: 2,
    waitMs: 1000,
    handlers: {
      answer: async (job: ClaimedJob<{ n: number }>) => ({ doubled: job.args.n * 2 }),
      huge: async () => "x".repeat(300 * 1024),
    },
  });
  const [answer, huge] = await client.enqueueMany([
    { kind: "answer", queue, args: { n: 21 } },
    { kind: "huge", queue, maxAttempts: 1 },
  ]);
  w.start();
  try {
    const a = await settled(answer.id, ["completed", "retryable", "discarded"]);
    assert.equal(a.state, "completed");
    assert.deepEqual(a.result, { doubled: 42 });
    const h = await settled(huge.id, ["discarded", "retryable", "completed"]);
    assert.equal(h.state, "discarded", "a result over the limit must not complete the job");
    assert.match(h.errors[0]?.error ?? "", /^result refused: .*result/);
    assert.equal(h.result ?? null, null);
  } finally {
    await w.stop({ timeoutMs: 2000 });
  }
});

test("a diamond workflow A -> B, C -> D: each job runs once, D reads B's and C's results from its batch", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-workflow-${run}`;
  const ran: string[] = [];
  const errors: unknown[] = [];
  // Each step's result is its name around its dependencies' results,
  // read from the batch whose callback it is.
  const step = async (job: ClaimedJob<{ name: string }>) => {
    ran.push(job.args.name);
    const deps: string[] = [];
    if (job.batchId !== null) {
      const b = await client.getBatch(job.batchId);
      for (const d of b.jobs) {
        assert.equal(d.state, "completed", `dependency ${d.id} of ${job.args.name}`);
        deps.push(d.result as string);
      }
    }
    deps.sort();
    return deps.length > 0 ? `${job.args.name}(${deps.join(",")})` : job.args.name;
  };
  const w = quietWorker({ queue, concurrency: 2, waitMs: 500, handlers: { step } }, errors);
  const job = (name: string, ...dependsOn: string[]) => ({ name, kind: "step", queue, args: { name }, dependsOn, maxAttempts: 1 });
  const wf = await client.enqueueWorkflow([job("D", "B", "C"), job("B", "A"), job("C", "A"), job("A")]);
  assert.deepEqual(Object.keys(wf.jobIds), ["A"]);
  assert.deepEqual(Object.keys(wf.batchIds).sort(), ["B", "C", "D"]);
  const before = await client.getBatch(wf.batchIds.D);
  assert.equal(before.callbackId, null, "D must wait for B and C");
  assert.equal(before.finished, false, "D's dependencies are not enqueued yet");
  assert.deepEqual(before.waitingFor, [wf.batchIds.B, wf.batchIds.C].sort((x, y) => x - y), "D's batch names the batches of B and C");
  await until("B, C and D to be counted as awaiting their dependencies", async () =>
    (await client.queues()).find((x) => x.queue === queue)?.awaitingDependencies === 3);
  assert.equal(before.callbackKind, "step");
  w.start();
  try {
    let d: Job | undefined;
    await until("D to be enqueued and finish", async () => {
      const b = await client.getBatch(wf.batchIds.D);
      if (b.callbackId === null) return false;
      d = await client.getJob(b.callbackId);
      return ["completed", "discarded", "cancelled"].includes(d.state);
    }, 40_000);
    assert.equal(d?.state, "completed", `D: ${JSON.stringify(d?.errors)}`);
    assert.equal(d?.result, "D(B(A),C(A))");
    assert.equal(d?.batchId, wf.batchIds.D);
    assert.equal(d?.callbackOf, wf.batchIds.D, "the server names the batch D closes");
    assert.equal(d?.memberOf, null, "D is no member of a batch");
    const a = await client.getJob(wf.jobIds.A);
    assert.equal(a.memberOf, Math.min(wf.batchIds.B, wf.batchIds.C), "A is a member of B's and C's batches, the first reported");
    assert.equal(a.callbackOf, null);
    const b = await client.getBatch(wf.batchIds.D);
    assert.equal(b.finished, true);
    assert.deepEqual(b.waitingFor, []);
    assert.equal(b.jobs.length, 2);
    assert.deepEqual(b.jobs.map((j) => j.result).sort(), ["B(A)", "C(A)"]);
    assert.deepEqual([...ran].sort(), ["A", "B", "C", "D"], "each job runs exactly once");
    assert.equal(ran[0], "A");
    assert.equal(ran[3], "D");
    assert.deepEqual(errors, []);
  } finally {
    await w.stop({ timeoutMs: 2000 });
  }
});

test("a workflow job whose dependency did not complete is cancelled by the worker, its handler not run, and its dependents in turn", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-depfail-${run}`;
  const ran: string[] = [];
  const errors: unknown[] = [];
  const w = quietWorker({
    queue,
    concurrency: 2,
    waitMs: 500,
    handlers: {
      boom: () => {
        ran.push("boom");
        throw new Error("boom");
      },
      nope: () => {
        ran.push("nope");
        throw new CancelJob("not worth it");
      },
      step: (job: ClaimedJob<{ name: string }>) => {
        ran.push(job.args.name);
      },
    },
  }, errors);
  const finished = async (batchId: number): Promise<Job> => {
    let j: Job | undefined;
    await until(`the callback of batch ${batchId} to finish`, async () => {
      const b = await client.getBatch(batchId);
      if (b.callbackId === null) return false;
      j = await client.getJob(b.callbackId);
      return ["completed", "discarded", "cancelled"].includes(j.state);
    }, 40_000);
    return j as Job;
  };
  // A is discarded (its one attempt fails): B is cancelled, then C
  // (B's dependent). X is cancelled by its handler: Y is cancelled.
  const step = (name: string, ...dependsOn: string[]) => ({ name, kind: "step", queue, args: { name }, dependsOn });
  const wf = await client.enqueueWorkflow([
    { name: "A", kind: "boom", queue, maxAttempts: 1 },
    step("B", "A"),
    step("C", "B"),
    { name: "X", kind: "nope", queue },
    step("Y", "X"),
  ]);
  // Under "run", a job runs whatever its dependencies became.
  const runWf = await client.enqueueWorkflow([{ name: "P", kind: "boom", queue, maxAttempts: 1 }, step("Q", "P")], { onDependencyFailure: "run" });
  w.start();
  try {
    const b = await finished(wf.batchIds.B);
    assert.equal(b.state, "cancelled", `B: ${JSON.stringify(b.errors)}`);
    assert.equal(b.errors.length, 1);
    assert.equal(b.errors[0].error, `dependency job ${wf.jobIds.A} is discarded`);
    const c = await finished(wf.batchIds.C);
    assert.equal(c.state, "cancelled", `C: ${JSON.stringify(c.errors)}`);
    assert.equal(c.errors[0].error, `dependency job ${b.id} is cancelled`);
    const y = await finished(wf.batchIds.Y);
    assert.equal(y.state, "cancelled", `Y: ${JSON.stringify(y.errors)}`);
    assert.equal(y.errors[0].error, `dependency job ${wf.jobIds.X} is cancelled`);
    const q = await finished(runWf.batchIds.Q);
    assert.equal(q.state, "completed", `Q: ${JSON.stringify(q.errors)}`);
    assert.deepEqual([...ran].sort(), ["Q", "boom", "boom", "nope"], "no handler ran for B, C or Y");
    assert.deepEqual(errors, []);
  } finally {
    await w.stop({ timeoutMs: 2000 });
  }
});

test("enqueueBatch: the callback runs once after the jobs, and getBatch reads their results", { skip, timeout: 60_000 }, async () => {
  const queue = `ts-batch-${run}`;
  const w = quietWorker({
    queue,
    concurrency: 2,
    waitMs: 500,
    handlers: {
      part: async (job: ClaimedJob<{ n: number }>) => job.args.n * 10,
      sum: async (job: ClaimedJob) => {
        const b = await client.getBatch(job.batchId as number);
        return b.jobs.reduce((acc, j) => acc + (j.result as number), 0);
      },
    },
  });
  const got = await client.enqueueBatch(
    [1, 2, 3].map((n) => ({ kind: "part", queue, args: { n } })),
    { kind: "sum", queue, metadata: { why: "total" } },
  );
  assert.equal(got.ids.length, 3);
  w.start();
  try {
    let cb: Job | undefined;
    await until("the callback to finish", async () => {
      const b = await client.getBatch(got.batchId);
      if (b.callbackId === null) return false;
      cb = await client.getJob(b.callbackId);
      return ["completed", "discarded", "cancelled"].includes(cb.state);
    }, 40_000);
    assert.equal(cb?.state, "completed");
    assert.equal(cb?.result, 60);
    assert.equal(cb?.metadata?.why, "total");
    const b = await client.getBatch(got.batchId);
    assert.deepEqual(b.jobs.map((j) => j.id), got.ids);
    assert.deepEqual(b.counts, { completed: 3 });
  } finally {
    await w.stop({ timeoutMs: 2000 });
  }
  await assert.rejects(client.enqueueWorkflow([{ name: "a", kind: "k", dependsOn: ["b"] }]), (e: unknown) =>
    e instanceof ConveyorError && e.status === 400 && /"a" depends on "b"/.test(e.message));
  await assert.rejects(client.getBatch(999_999_999), (e: unknown) => e instanceof ConveyorError && e.status === 404);
});

test("errors carry the server's message", { skip, timeout: 30_000 }, async () => {
  const status = (p: Promise<unknown>) =>
    p.then(
      () => assert.fail("no error"),
      (e: unknown) => {
        assert.ok(e instanceof ConveyorError, `not a ConveyorError: ${e}`);
        return e;
      },
    );
  const bad = new Client({ baseUrl: url, token: "wrong-token-0123456789abcdef" });
  let e = await status(bad.getJob(1));
  assert.equal(e.status, 401);
  assert.ok(e.serverMessage.length > 0);
  assert.ok(!e.transient);

  e = await status(client.enqueue("x", {}, { delayMs: -1 }));
  assert.equal(e.status, 400);
  assert.match(e.serverMessage, /delay_ms -1 is negative/);
  assert.match(e.message, /^conveyor: POST \/api\/v1\/jobs: 400: /);

  e = await status(client.getJob(2 ** 40));
  assert.equal(e.status, 404);
  assert.ok(!(e instanceof StaleFenceError));

  e = await status(client.claim({ queue: "q", limit: 5000 }));
  assert.equal(e.status, 400);
  assert.match(e.serverMessage, /limit 5000/);

  const { id } = await client.enqueue("done", {}, { queue: `ts-errors-${run}` });
  await client.cancel(id);
  e = await status(client.cancel(id));
  assert.equal(e.status, 409);
  assert.ok(!(e instanceof StaleFenceError), "a 409 of cancel is not about a fence");

  const down = new Client({ baseUrl: "http://127.0.0.1:1", token: "x", timeoutMs: 2000 });
  e = await status(down.getJob(1));
  assert.equal(e.status, null);
  assert.ok(e.transient);

  assert.throws(() => new Client({ baseUrl: "" }), TypeError);
  await assert.rejects(client.enqueue("", {}), TypeError);
  assert.throws(() => new Worker(client, { handlers: {}, concurrency: 0 }), RangeError);
});

test("queue limits: set, read, listed with their use and what holds the queue, cleared", { skip, timeout: 30_000 }, async () => {
  const q = `ts-limits-${run}`;
  assert.equal(await client.queueLimits(q), null);

  const set = await client.setQueueLimits(q, { maxRunning: 5, rate: 100, ratePeriod: "1m" });
  const noKeyRate = { keyRate: 0, keyRatePeriod: "", keyRatePeriodMs: 0, fair: false };
  const want = { maxRunning: 5, rate: 100, ratePeriod: "1m", ratePeriodMs: 60_000, keyMaxRunning: 0, ordered: false, orderedMoveOn: false, ...noKeyRate };
  assert.deepEqual(set, want);
  assert.deepEqual(await client.queueLimits(q), want);
  // Milliseconds are a period too.
  assert.deepEqual(await client.setQueueLimits(q, { rate: 10, ratePeriod: 1500 }), {
    maxRunning: 0,
    rate: 10,
    ratePeriod: "1.5s",
    ratePeriodMs: 1500,
    keyMaxRunning: 0,
    ordered: false,
    orderedMoveOn: false,
    ...noKeyRate,
  });
  await client.setQueueLimits(q, { maxRunning: 5, rate: 100, ratePeriod: "1m" });

  // Listed without jobs, with its use; a job waiting in the paused queue
  // is held by the pause.
  let info = (await client.queues()).find((x) => x.queue === q);
  assert.ok(info, `queue ${q} not listed`);
  assert.deepEqual(info.limits, want);
  assert.deepEqual(info.limitUse, { running: 0, started: 0, nextStartMs: 0, keysRunning: 0, keyHeld: 0, keysRated: 0 });
  assert.equal(info.held, null);
  const { id } = await client.enqueue("limited", {}, { queue: q });
  await client.pauseQueue(q);
  await until("the paused queue to be held", async () => {
    info = (await client.queues()).find((x) => x.queue === q);
    return info?.held === "paused";
  });
  assert.deepEqual(info?.limits, want, "the pause kept the limits");

  // Bad values are refused naming the field, and nothing changes.
  for (const [bad, field] of [
    [{ maxRunning: -1 }, /MaxRunning -1 is out of range/],
    [{ rate: 10 }, /RatePeriod 0s is out of range/],
    [{ rate: 10, ratePeriod: "a minute" }, /rate_period "a minute" is not a duration/],
    [{ ratePeriod: "1m" }, /RatePeriod 1m0s is set without a Rate/],
  ] as const) {
    await assert.rejects(client.setQueueLimits(q, bad), (e: unknown) => {
      assert.ok(e instanceof ConveyorError, `not a ConveyorError: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.serverMessage, field);
      return true;
    });
  }
  assert.deepEqual(await client.queueLimits(q), want);

  await client.clearQueueLimits(q);
  assert.equal(await client.queueLimits(q), null);
  info = (await client.queues()).find((x) => x.queue === q);
  assert.equal(info?.limits, null);
  assert.equal(info?.limitUse, null);
  await client.resumeQueue(q);
  await client.cancel(id).catch(() => {});
});

test("job keys: a bad key or key limit is refused naming it, and nothing is written", { skip, timeout: 30_000 }, async () => {
  const q = `ts-keys-bad-${run}`;
  const refused = (p: Promise<unknown>, field: RegExp) =>
    assert.rejects(p, (e: unknown) => {
      assert.ok(e instanceof ConveyorError, `not a ConveyorError: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.serverMessage, field);
      return true;
    });
  for (const bad of ["k".repeat(256), "a\u0000b"]) {
    await refused(client.enqueue("k", {}, { queue: q, key: bad }), /key/);
    await refused(client.enqueueMany([{ kind: "k", queue: q, key: "ok" }, { kind: "k", queue: q, key: bad }]), /job 1: key/);
    await refused(client.enqueueBatch([{ kind: "k", queue: q, key: bad }], { kind: "cb", queue: q }), /job 0: key/);
    await refused(client.enqueueWorkflow([{ name: "a", kind: "k", queue: q, key: bad }]), /key/);
  }
  assert.equal((await client.listJobs({ queue: q })).jobs.length, 0, "a refused enqueue wrote jobs");
  for (const [bad, field] of [
    [{ keyMaxRunning: -1 }, /KeyMaxRunning -1 is out of range/],
    [{ keyMaxRunning: 100_001 }, /KeyMaxRunning 100001 is out of range/],
    [{ keyMaxRunning: 2, ordered: true }, /KeyMaxRunning 2 with Ordered/],
    [{ orderedMoveOn: true }, /OrderedMoveOn is set without Ordered/],
    [{ keyRate: -1, keyRatePeriod: "1h" }, /KeyRate -1 is out of range/],
    [{ keyRate: 100_001, keyRatePeriod: "1h" }, /KeyRate 100001 is out of range/],
    [{ keyRate: 3 }, /KeyRatePeriod 0s is out of range/],
    [{ keyRate: 3, keyRatePeriod: "0.5ms" }, /KeyRatePeriod 500µs is out of range/],
    [{ keyRate: 3, keyRatePeriod: 0.5 }, /key_rate_period_ms/],
    [{ keyRate: 3, keyRatePeriod: "hourly" }, /key_rate_period "hourly" is not a duration/],
    [{ keyRatePeriod: "1h" }, /KeyRatePeriod 1h0m0s is set without a KeyRate/],
  ] as const) {
    await refused(client.setQueueLimits(q, bad), field);
  }
  assert.equal(await client.queueLimits(q), null);
});

test("job keys: stored, read back and claimed; a key limit holds each key", { skip, timeout: 30_000 }, async () => {
  const q = `ts-keys-${run}`;
  const none = { maxRunning: 0, rate: 0, ratePeriod: "", ratePeriodMs: 0, keyRate: 0, keyRatePeriod: "", keyRatePeriodMs: 0, fair: false };
  assert.deepEqual(await client.setQueueLimits(q, { keyMaxRunning: 1 }), { ...none, keyMaxRunning: 1, ordered: false, orderedMoveOn: false });
  assert.deepEqual(await client.queueLimits(q), { ...none, keyMaxRunning: 1, ordered: false, orderedMoveOn: false });

  const keys = new Map<number, string | null>();
  keys.set((await client.enqueue("k", {}, { queue: q, key: "acme" })).id, "acme");
  const many = await client.enqueueMany([
    { kind: "k", queue: q, key: "acme" },
    { kind: "k", queue: q, key: "globex" },
    { kind: "k", queue: q },
  ]);
  many.forEach((r, i) => keys.set(r.id, ["acme", "globex", null][i]));
  const wf = await client.enqueueWorkflow([{ name: "a", kind: "k", queue: `${q}-later`, key: "wf", delayMs: 3_600_000 }]);
  assert.equal((await client.getJob(wf.jobIds.a)).key, "wf");
  for (const [id, key] of keys) assert.equal((await client.getJob(id)).key, key, `job ${id}`);
  for (const j of (await client.listJobs({ queue: q })).jobs) assert.equal(j.key, keys.get(j.id), `listed job ${j.id}`);

  // One job per key: acme's second waits for its key.
  const claimed = await client.claim({ queue: q, limit: 10 });
  assert.deepEqual(claimed.map((j) => j.key).sort(), ["acme", "globex", null].sort());
  for (const j of claimed) assert.equal(j.key, keys.get(j.id), `claimed job ${j.id}`);
  let info = (await client.queues()).find((x) => x.queue === q);
  await until("the queue to be held by key", async () => {
    info = (await client.queues()).find((x) => x.queue === q);
    return info?.held === "key";
  });
  assert.equal(info?.limitUse?.keysRunning, 2);
  assert.equal(info?.limitUse?.keyHeld, 1);

  // Ordered reads back with the one job per key it implies.
  const ordered = { ...none, keyMaxRunning: 1, ordered: true, orderedMoveOn: true };
  assert.deepEqual(await client.setQueueLimits(q, { ordered: true, orderedMoveOn: true }), ordered);
  assert.deepEqual(await client.queueLimits(q), ordered);

  for (const j of claimed) await client.complete(j.id, j.fence);
  await client.clearQueueLimits(q);
  for (const id of [...keys.keys(), wf.jobIds.a]) await client.cancel(id).catch(() => {});
});

test("rates per key: stored and read back; a claim starts at most keyRate jobs of a key in the window", { skip, timeout: 30_000 }, async () => {
  const q = `ts-key-rate-${run}`;
  const want = { maxRunning: 0, rate: 0, ratePeriod: "", ratePeriodMs: 0, keyMaxRunning: 0, ordered: false, orderedMoveOn: false, keyRate: 2, keyRatePeriod: "1h", keyRatePeriodMs: 3_600_000, fair: false };
  assert.deepEqual(await client.setQueueLimits(q, { keyRate: 2, keyRatePeriod: "1h" }), want);
  assert.deepEqual(await client.queueLimits(q), want);
  assert.deepEqual(await client.setQueueLimits(q, { keyRate: 2, keyRatePeriod: 3_600_000 }), want, "milliseconds are a period too");

  const ids: number[] = [];
  for (const key of ["acme", "acme", "acme", undefined]) ids.push((await client.enqueue("k", {}, { queue: q, key })).id);
  // Claims after the window is full take none of acme's.
  const claimed: ClaimedJob[] = [];
  for (let i = 0; i < 3; i++) claimed.push(...(await client.claim({ queue: q, limit: 10 })));
  assert.deepEqual(claimed.map((j) => j.key ?? "-").sort(), ["-", "acme", "acme"]);
  let info = (await client.queues()).find((x) => x.queue === q);
  await until("the queue to be held by key", async () => {
    info = (await client.queues()).find((x) => x.queue === q);
    return info?.held === "key";
  });
  assert.equal(info?.limitUse?.keysRated, 1);
  assert.equal(info?.limitUse?.keyHeld, 1);

  // Completing them frees nothing: the window still holds acme's third.
  for (const j of claimed) await client.complete(j.id, j.fence);
  assert.deepEqual(await client.claim({ queue: q, limit: 10 }), []);

  await client.clearQueueLimits(q);
  for (const id of ids) await client.cancel(id).catch(() => {});
});

test("fair queues: stored and read back; key weights set, read and cleared; a claim serves every key before a flood's second", { skip, timeout: 30_000 }, async () => {
  const q = `ts-fair-${run}`;
  const want = { maxRunning: 0, rate: 0, ratePeriod: "", ratePeriodMs: 0, keyMaxRunning: 0, ordered: false, orderedMoveOn: false, keyRate: 0, keyRatePeriod: "", keyRatePeriodMs: 0, fair: true };
  assert.deepEqual(await client.setQueueLimits(q, { fair: true }), want);
  assert.deepEqual(await client.queueLimits(q), want);

  assert.deepEqual(await client.keyWeights(q), {});
  assert.deepEqual(await client.setKeyWeights(q, { acme: 3, globex: 2 }), { acme: 3, globex: 2 });
  assert.deepEqual(await client.keyWeights(q), { acme: 3, globex: 2 });
  // Setting the limits leaves the weights.
  await client.setQueueLimits(q, { fair: true, maxRunning: 10 });
  assert.deepEqual(await client.keyWeights(q), { acme: 3, globex: 2 });

  // Bad weights are refused naming the key or weight, and nothing changes.
  const refused = (p: Promise<unknown>, field: RegExp) =>
    assert.rejects(p, (e: unknown) => {
      assert.ok(e instanceof ConveyorError, `not a ConveyorError: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.serverMessage, field);
      return true;
    });
  await refused(client.setKeyWeights(q, { acme: 0 }), /weight 0 of key "acme" is out of range/);
  await refused(client.setKeyWeights(q, { acme: 2, globex: 1001 }), /weight 1001 of key "globex" is out of range/);
  await refused(client.setKeyWeights(q, { "": 2 }), /an empty key is weighed/);
  await refused(client.setKeyWeights(q, { acme: 1.5 }), /key_weights/);
  await assert.rejects(client.setKeyWeights(q, null as unknown as Record<string, number>), TypeError);
  assert.deepEqual(await client.keyWeights(q), { acme: 3, globex: 2 });

  // A flood of one key, enqueued first, then one job each of two others:
  // a claim of 3 takes one of each key.
  const ids: number[] = [];
  for (let i = 0; i < 10; i++) ids.push((await client.enqueue("k", {}, { queue: q, key: "flood" })).id);
  for (const key of ["acme", "initech"]) ids.push((await client.enqueue("k", {}, { queue: q, key })).id);
  const claimed = await client.claim({ queue: q, limit: 3 });
  assert.deepEqual(claimed.map((j) => j.key).sort(), ["acme", "flood", "initech"]);
  let info = (await client.queues()).find((x) => x.queue === q);
  await until("the queue to list its weighted keys", async () => {
    info = (await client.queues()).find((x) => x.queue === q);
    return info?.weightedKeys === 2;
  });
  assert.equal(info?.limits?.fair, true);
  assert.equal(info?.held, null);

  await client.clearKeyWeights(q);
  assert.deepEqual(await client.keyWeights(q), {});
  assert.deepEqual(await client.setKeyWeights(q, { acme: 2 }), { acme: 2 });
  assert.deepEqual(await client.setKeyWeights(q, {}), {});
  assert.deepEqual(await client.keyWeights(q), {});

  for (const j of claimed) await client.complete(j.id, j.fence);
  await client.clearQueueLimits(q);
  for (const id of ids) await client.cancel(id).catch(() => {});
});
