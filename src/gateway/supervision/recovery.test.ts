/**
 * Recovery's verdicts, each with plain inputs (no engine, no sleeps): whom a death is charged to, what an exit means
 * (the failed-start cut-off included), group testing of suspects, and the isolated-prompt memory — with the two
 * promises end to end through the request table: an engine that cannot start fails the waiting requests, and a
 * prompt isolated as a culprit is refused at admission without reaching the engine.
 */
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { AddMessage, GuideSpec, SamplingParams } from "../../protocol/messages.js";
import { notReady } from "../http/errors.js";
import type { RouteContext } from "../http/route-context.js";
import { admissionError } from "../requests/generate.js";
import type { FinishReason } from "../requests/lifecycle.js";
import { SinkTable, type RequestSink } from "../../../test/support/table-sinks.js";
import { deathVerdict, exitDecision, FAULT_THRESHOLD, IsolatedPrompts, isolationKey, MAX_FAILED_STARTS, MAX_STALL_BACKOFF, stallLimitMs, SuspectTests } from "./recovery.js";
import { recoverFromExit } from "./supervisor.js";

const params: SamplingParams = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };
const SIGABRT = { code: null, signal: "SIGABRT" as const };

/** A request table whose engine accepts everything; what each request's client was told. */
function table() {
  const sent: (AddMessage | { type: "abort"; ids: string[] })[] = [];
  const reg = new SinkTable((m) => {
    sent.push(m);
    return true;
  });
  const told = new Map<string, { reason: FinishReason; code?: string; status?: number; message?: string }>();
  const submit = (id: string, text = id, guide?: GuideSpec) => {
    const sink: RequestSink = {
      onAdmitted: () => undefined,
      onOutput: () => undefined,
      onFinish: (reason, _u, error) => void told.set(id, { reason, ...(error ? { code: error.code, message: error.message, ...(error.httpError ? { status: error.httpError.status } : {}) } : {}) }),
    };
    return reg.submit(id, { text }, guide ? { ...params, guide } : params, sink);
  };
  return { reg, sent, told, submit };
}

describe("deathVerdict: whom an engine death can be charged to", () => {
  it("signals from outside (an OOM killer's SIGKILL, an operator's SIGTERM/SIGINT/SIGHUP/SIGQUIT) blame nobody", () => {
    for (const signal of ["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"] as const) {
      expect([signal, deathVerdict({ code: null, signal }, "none")]).toEqual([signal, { reason: "signal", blame: false }]);
    }
  });

  it("the engine crashing by itself (GGML abort, segfault, bus error, FPE, illegal instruction) can be a request's doing", () => {
    for (const signal of ["SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"] as const) {
      expect([signal, deathVerdict({ code: null, signal }, "none")]).toEqual([signal, { reason: "signal", blame: true }]);
    }
  });

  it("a non-zero exit (uncaught error) is blamable; a clean exit is not", () => {
    expect(deathVerdict({ code: 1, signal: null }, "none")).toEqual({ reason: "exit", blame: true });
    expect(deathVerdict({ code: 0, signal: null }, "none")).toEqual({ reason: "exit", blame: false });
  });

  it("the watchdog's kill of an idle or unready engine blames nobody, whatever the signal; a stalled batch is blamable", () => {
    expect(deathVerdict({ code: null, signal: "SIGKILL" }, "unresponsive")).toEqual({ reason: "watchdog", blame: false });
    expect(deathVerdict({ code: null, signal: "SIGABRT" }, "unresponsive")).toEqual({ reason: "watchdog", blame: false });
    expect(deathVerdict({ code: null, signal: "SIGKILL" }, "stalled")).toEqual({ reason: "watchdog", blame: true });
  });
});


describe("exitDecision: what an engine exit means", () => {
  const base = { stopping: false, failedStarts: 0, exit: SIGABRT, byWatchdog: "none" as const };

  it("the shutdown's exit is the shutdown's, whatever else is true", () => {
    expect(exitDecision({ ...base, stopping: true, failedStarts: MAX_FAILED_STARTS })).toEqual({ kind: "shutdown" });
  });

  it("a restart carries the death verdict and says how the engine died", () => {
    expect(exitDecision(base)).toEqual({ kind: "restart", verdict: { reason: "signal", blame: true }, description: "the engine process exited (SIGABRT)" });
    expect(exitDecision({ ...base, exit: { code: 3, signal: null } })).toEqual({ kind: "restart", verdict: { reason: "exit", blame: true }, description: "the engine process exited (code 3)" });
    expect(exitDecision({ ...base, failedStarts: MAX_FAILED_STARTS - 1, byWatchdog: "unresponsive" as const }).kind).toBe("restart");
  });

  it(`after ${MAX_FAILED_STARTS} failed starts in a row the engine is unrecoverable`, () => {
    expect(MAX_FAILED_STARTS).toBe(5);
    for (const failedStarts of [MAX_FAILED_STARTS, MAX_FAILED_STARTS + 3]) {
      expect(exitDecision({ ...base, failedStarts })).toEqual({
        kind: "unrecoverable",
        verdict: { reason: "signal", blame: true },
        failedStarts,
        description: `the engine failed to start ${failedStarts} times in a row`,
      });
    }
  });

  it(`promise: after ${MAX_FAILED_STARTS} failed starts the waiting requests are failed (engine_fault), not kept for a resumption`, () => {
    const t = table();
    t.submit("a");
    t.submit("b");
    // One start short of the cut-off: the requests wait for the restart.
    recoverFromExit(t.reg, new IsolatedPrompts(60_000), exitDecision({ ...base, failedStarts: MAX_FAILED_STARTS - 1, exit: { code: 1, signal: null } }));
    expect(t.told.size).toBe(0);
    expect(t.reg.recoveringCount).toBe(2);
    // The cut-off: every waiting client is told, with a 500 engine_fault naming the failed starts.
    recoverFromExit(t.reg, new IsolatedPrompts(60_000), exitDecision({ ...base, failedStarts: MAX_FAILED_STARTS, exit: { code: 1, signal: null } }));
    const expected = { reason: "error", code: "engine_fault", status: 500, message: `the engine failed to start ${MAX_FAILED_STARTS} times in a row` };
    expect(Object.fromEntries(t.told)).toEqual({ a: expected, b: expected });
    expect(t.reg.size).toBe(0);
  });

  it("the shutdown's exit ends every request with shutting_down (503)", () => {
    const t = table();
    t.submit("a");
    recoverFromExit(t.reg, new IsolatedPrompts(60_000), { kind: "shutdown" });
    expect(t.told.get("a")).toMatchObject({ reason: "error", code: "shutting_down", status: 503 });
  });
});

describe("SuspectTests: group testing of suspects", () => {
  it("charges every blamed death while no bisection runs; during one, only the test group's members", () => {
    const s = new SuspectTests();
    expect(s.charged("a", true)).toBe(true);
    expect(s.charged("a", false)).toBe(false);
    s.afterDeath([{ id: "a", deaths: FAULT_THRESHOLD }, { id: "b", deaths: 1 }], true);
    expect(s.running).toBe(true);
    expect(s.nextTest(() => true)).toEqual(["a"]);
    s.testing("a");
    expect([s.charged("a", true), s.charged("b", true), s.charged("c", true), s.charged("a", false)]).toEqual([true, false, false, false]);
  });

  it("starts a bisection only once deaths repeat (the threshold), with everyone in flight a suspect", () => {
    const s = new SuspectTests();
    expect(s.afterDeath([{ id: "a", deaths: FAULT_THRESHOLD - 1 }], true)).toEqual({ culprit: null });
    expect([s.running, s.isSuspect("a")]).toEqual([false, false]);
    s.afterDeath([{ id: "a", deaths: FAULT_THRESHOLD }, { id: "b", deaths: 1 }, { id: "c", deaths: 1 }], true);
    expect(["a", "b", "c", "d"].map((id) => s.isSuspect(id))).toEqual([true, true, true, false]);
  });

  it("a guilty pool is halved; a lone member dying alone is the culprit; the rest is then tested whole", () => {
    const s = new SuspectTests();
    s.afterDeath(["a", "b", "c", "d"].map((id) => ({ id, deaths: 2 })), true);
    expect(s.nextTest(() => true)).toEqual(["a", "b"]);
    s.testing("a");
    s.testing("b");
    expect(s.afterDeath([{ id: "a", deaths: 3 }, { id: "b", deaths: 3 }], true)).toEqual({ culprit: null });
    expect(s.nextTest(() => true)).toEqual(["a"]);
    s.testing("a");
    expect(s.afterDeath([{ id: "a", deaths: 4 }], true)).toEqual({ culprit: "a" });
    // Not known guilty any more: b, c and d are tested together.
    expect(s.nextTest((id) => id !== "a")).toEqual(["b", "c", "d"]);
  });

  it("a lone member below the threshold, or one with others in flight beside it, is no culprit", () => {
    const s = new SuspectTests(3);
    s.afterDeath([{ id: "a", deaths: 3 }, { id: "b", deaths: 3 }], true);
    s.testing(s.nextTest(() => true)[0]!);
    expect(s.afterDeath([{ id: "a", deaths: 4 }, { id: "x", deaths: 0 }], true)).toEqual({ culprit: null });
    expect(s.isSuspect("x")).toBe(true); // in flight beside the test: deferred
    s.testing(s.nextTest(() => true)[0]!);
    const low = new SuspectTests(3);
    low.afterDeath([{ id: "a", deaths: 3 }, { id: "b", deaths: 3 }], true);
    low.testing("a");
    low.afterDeath([{ id: "a", deaths: 3 }], true);
    low.testing("a");
    expect(low.afterDeath([{ id: "a", deaths: 2 }], true)).toEqual({ culprit: null });
  });

  it("a death nobody caused reruns the same test; a test whose members all ended releases the next", () => {
    const s = new SuspectTests();
    s.afterDeath(["a", "b"].map((id) => ({ id, deaths: 2 })), true);
    s.testing(s.nextTest(() => true)[0]!);
    expect(s.afterDeath([{ id: "a", deaths: 2 }], false)).toEqual({ culprit: null });
    expect(s.nextTest(() => true)).toEqual(["a"]);
    s.testing("a");
    expect(s.nextTest(() => true)).toEqual([]); // a test is in flight
    expect(s.ended("b")).toBe(false); // not a member of the test
    expect(s.ended("a")).toBe(true);
    expect(s.isSuspect("a")).toBe(false);
    expect(s.nextTest(() => true)).toEqual([]); // b ended too: nothing left to test
    expect(s.running).toBe(false);
  });
});

describe("IsolatedPrompts: a refusal is earned and does not last forever", () => {
  it("refuses an isolated prompt until its time is up, then forgets it", () => {
    const m = new IsolatedPrompts(1000);
    m.add("kill me", 5000);
    expect(m.has("kill me", 5000)).toBe(true);
    expect(m.has("kill me", 5999)).toBe(true);
    expect(m.has("other", 5500)).toBe(false);
    expect(m.has("kill me", 6000)).toBe(false);
    expect(m.size).toBe(0);
  });

  it("isolating a prompt again restarts its time", () => {
    const m = new IsolatedPrompts(1000);
    m.add("p", 0);
    m.add("p", 900);
    expect(m.has("p", 1500)).toBe(true);
    expect(m.has("p", 1900)).toBe(false);
  });

  it("is bounded: the oldest prompt goes first", () => {
    const m = new IsolatedPrompts(60_000, 2);
    m.add("a", 1);
    m.add("b", 2);
    m.add("c", 3);
    expect([m.has("a", 4), m.has("b", 4), m.has("c", 4)]).toEqual([false, true, true]);
  });

  it("a request isolated with a guide refuses only that prompt with that guide, not the same messages unguided", () => {
    const m = new IsolatedPrompts(60_000);
    const killer: GuideSpec = { grammar: 'root ::= "a"', start: { kind: "rule", rule: "root", then: "end" } };
    const other: GuideSpec = { ...killer, grammar: 'root ::= "b"' };
    m.add(isolationKey("What is 2+2?", killer), 0);
    expect(m.has(isolationKey("What is 2+2?", killer), 1)).toBe(true);
    expect(m.has(isolationKey("What is 2+2?"), 1)).toBe(false);
    expect(m.has(isolationKey("What is 2+2?", other), 1)).toBe(false);
    expect(m.has(isolationKey("What is 3+3?", killer), 1)).toBe(false);
    // Unguided keys stay the prompt itself (existing behaviour).
    expect(isolationKey("p")).toBe("p");
  });
});

describe("promise: a prompt isolated as a culprit is refused at admission without reaching the engine", () => {
  const killer: GuideSpec = { grammar: 'root ::= "a"', start: { kind: "rule", rule: "root", then: "end" } };
  const ctxOver = (isolated: IsolatedPrompts, now: () => number, t: ReturnType<typeof table>): RouteContext =>
    ({
      // Admission reads the queue (the table's counts), the engine's sequences and recovery's memory.
      model: { name: "m", requests: t.reg, maxQueuedRequests: 10, isKnownCulprit: (prompt: string, guide?: GuideSpec) => isolated.isKnownCulprit(prompt, guide, now()) },
      engine: () => ({ maxNumSeqs: 4 }),
      unavailable: () => notReady(),
      rejected: () => undefined,
      log: pino({ level: "silent" }),
    }) as unknown as RouteContext;

  /** Kill the engine with `id` alone in flight until recovery isolates it; the memory learns it at `at`. */
  function isolate(t: ReturnType<typeof table>, isolated: IsolatedPrompts, at: number): void {
    for (let death = 0; death < 4 && t.reg.size > 0; death++) {
      recoverFromExit(t.reg, isolated, exitDecision({ stopping: false, failedStarts: 0, exit: SIGABRT, byWatchdog: "none" }), at);
      t.reg.resumeRecovering();
    }
  }

  it("refused (engine_fault) while remembered, with its guide as part of the key; admitted again after the TTL", () => {
    let now = 1_000;
    const isolated = new IsolatedPrompts(60_000);
    const t = table();
    t.submit("killer", "What is 2+2?", killer);
    isolate(t, isolated, now);
    expect(t.told.get("killer")).toMatchObject({ reason: "error", code: "engine_fault" });
    const ctx = ctxOver(isolated, () => now, t);
    t.sent.length = 0;
    const refused = admissionError(ctx, { n: 1, prompts: ["What is 2+2?"], params: { ...params, guide: killer } });
    expect(refused).toMatchObject({ status: 500, code: "engine_fault" });
    // Any prompt of a list; never the same messages unguided, or with another guide.
    expect(admissionError(ctx, { n: 1, prompts: ["hi", "What is 2+2?"], params: { ...params, guide: killer } })).toMatchObject({ code: "engine_fault" });
    expect(admissionError(ctx, { n: 1, prompts: ["What is 2+2?"], params })).toBeNull();
    expect(admissionError(ctx, { n: 1, prompts: ["What is 2+2?"], params: { ...params, guide: { ...killer, grammar: 'root ::= "b"' } } })).toBeNull();
    expect(t.sent).toEqual([]); // refused at the door: nothing reached the engine
    now += 59_999;
    expect(admissionError(ctx, { n: 1, prompts: ["What is 2+2?"], params: { ...params, guide: killer } })).toMatchObject({ code: "engine_fault" });
    now += 1;
    expect(admissionError(ctx, { n: 1, prompts: ["What is 2+2?"], params: { ...params, guide: killer } })).toBeNull();
  });

  it("deaths nobody caused isolate nobody: the prompt stays admissible", () => {
    const isolated = new IsolatedPrompts(60_000);
    const t = table();
    t.submit("r", "p");
    for (let i = 0; i < 5; i++) {
      recoverFromExit(t.reg, isolated, exitDecision({ stopping: false, failedStarts: 0, exit: { code: null, signal: "SIGKILL" }, byWatchdog: "none" }), 0);
      t.reg.resumeRecovering();
    }
    expect(t.told.size).toBe(0);
    expect(isolated.size).toBe(0);
    expect(admissionError(ctxOver(isolated, () => 1, t), { n: 1, prompts: ["p"], params })).toBeNull();
  });

  it("a culprit resubmitted as token ids (no prompt text) is not remembered: admission cannot recognise it", () => {
    const isolated = new IsolatedPrompts(60_000);
    isolated.addCulprits([{ prompt: { tokens: [1, 2] }, params }, { prompt: { text: "t" }, params }], 0);
    expect(isolated.size).toBe(1);
    expect(isolated.isKnownCulprit("t", undefined, 1)).toBe(true);
  });
});

describe("the watchdog's stall limit", () => {
  it("is the configured limit until the watchdog kills; a kill in a row doubles it, up to the cap", () => {
    const limits = [0, 1, 2, 3, 4, 10].map((streak) => stallLimitMs(30_000, streak));
    expect(limits).toEqual([30_000, 60_000, 60_000, 60_000, 60_000, 60_000]);
    expect(Math.max(...limits)).toBe(30_000 * MAX_STALL_BACKOFF);
  });
});
