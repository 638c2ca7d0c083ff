import { describe, expect, it } from "vitest";
import type { AddMessage, FinishInfo, RequestOutput, SamplingParams, StepMessage } from "../../protocol/messages.js";
import { PROTOCOL_VERSION } from "../../protocol/messages.js";
import { KeelHttpError, shuttingDown } from "../http/errors.js";
import type { FinishReason } from "./lifecycle.js";
import { FORGIVE_AFTER_TOKENS, type Usage } from "./registry.js";
import { SinkTable, type RequestSink, type TableObserver } from "../../../test/support/table-sinks.js";

type Sent = AddMessage | { v: number; type: "abort"; ids: string[] };

const params: SamplingParams = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };

interface SinkLog {
  admitted: number;
  outputs: { tokens: number[]; text: string }[];
  finishes: { reason: FinishReason; usage: Usage; error?: { code: string; message: string; httpError?: KeelHttpError } }[];
}

function sink(): RequestSink & { log: SinkLog } {
  const log: SinkLog = { admitted: 0, outputs: [], finishes: [] };
  return {
    log,
    onAdmitted: () => {
      log.admitted += 1;
    },
    onOutput: (tokens, text) => {
      log.outputs.push({ tokens: [...tokens], text });
    },
    onFinish: (reason, usage, error) => {
      log.finishes.push({ reason, usage, ...(error ? { error } : {}) });
    },
  };
}

function setup(accept = true) {
  const sent: Sent[] = [];
  const events: string[] = [];
  const observer: TableObserver = {
    onCancel: (id, phase, cause) => events.push(`cancel ${id} ${phase} ${cause}`),
    onFinished: (id, reason, _usage, info) => events.push(`finished ${id} ${reason} ${info.phase}`),
    onAdmitted: (id, n) => events.push(`admitted ${id} ${n}`),
    onFirstToken: (id) => events.push(`first ${id}`),
    onInternalError: (id, message) => events.push(`internal ${id} ${message}`),
  };
  let ok = accept;
  const reg = new SinkTable((m) => {
    if (!ok) return false;
    sent.push(structuredClone(m));
    return true;
  }, observer);
  return { reg, sent, events, setAccept: (v: boolean) => (ok = v) };
}

let stepNo = 0;
function step(...outputs: RequestOutput[]): StepMessage {
  stepNo += 1;
  return { v: PROTOCOL_VERSION, type: "step", step: stepNo, batchTokens: 1, outputs, stats: { waiting: 0, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0 } };
}
const out = (id: string, o: Partial<RequestOutput> = {}): RequestOutput => ({ id, tokens: [], text: "", ...o });
const fin = (reason: FinishInfo["reason"], promptTokens = 3, completionTokens = 0, error?: FinishInfo["error"]): FinishInfo => ({
  reason,
  promptTokens,
  completionTokens,
  ...(error ? { error } : {}),
});

describe("RequestRegistry", () => {
  it("submit sends add and records the request as queued", () => {
    const t = setup();
    const s = sink();
    expect(t.reg.submit("a", { text: "hi" }, params, s)).toBe(true);
    expect(t.sent).toEqual([{ v: PROTOCOL_VERSION, type: "add", id: "a", prompt: { text: "hi" }, params }]);
    expect(t.reg.size).toBe(1);
    expect(t.reg.phase("a")).toBe("queued");
    expect(t.reg.counts()).toEqual({ waiting: 1, running: 0 });
    expect(() => t.reg.submit("a", { text: "again" }, params, sink())).toThrow(/already live/);
    expect(t.sent).toHaveLength(1);
  });

  it("submit returns false and records nothing when send returns false", () => {
    const t = setup(false);
    const s = sink();
    expect(t.reg.submit("a", { tokens: [1, 2] }, params, s)).toBe(false);
    expect(t.reg.size).toBe(0);
    expect(t.reg.phase("a")).toBeNull();
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 0 });
    // Nothing was recorded, so the same id can be submitted once the engine is back.
    t.setAccept(true);
    expect(t.reg.submit("a", { tokens: [1, 2] }, params, s)).toBe(true);
  });

  it("routes admission, outputs and finish to the sink", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [5, 6, 7], cachedTokens: 0 } })));
    expect(s.log.admitted).toBe(1);
    expect(t.reg.phase("a")).toBe("prefill");
    expect(t.reg.promptLength("a")).toBe(3);
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 1 });
    t.reg.handleStep(step(out("a", { tokens: [40], text: "x" })));
    expect(t.reg.phase("a")).toBe("decode");
    t.reg.handleStep(step(out("a", { tokens: [41], text: "" }), out("zzz", { tokens: [1], text: "late" })));
    t.reg.handleStep(step(out("a", { tokens: [42], text: "yz", finish: fin("length", 3, 3) })));
    expect(s.log.outputs).toEqual([
      { tokens: [40], text: "x" },
      { tokens: [41], text: "" },
      { tokens: [42], text: "yz" },
    ]);
    expect(s.log.finishes).toEqual([{ reason: "length", usage: { promptTokens: 3, completionTokens: 3 } }]);
    expect(t.reg.size).toBe(0);
    expect(t.reg.phase("a")).toBeNull();
    expect(t.events).toEqual(["admitted a 3", "first a", "finished a length decode"]);
  });

  it("admission and first token in the same output", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [9], text: "q" })));
    expect(s.log.admitted).toBe(1);
    expect(s.log.outputs).toEqual([{ tokens: [9], text: "q" }]);
    expect(t.reg.phase("a")).toBe("decode");
  });

  it("passes the engine's error through on a finish with reason error", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [1, 2], cachedTokens: 0 }, finish: fin("error", 2, 0, { code: "engine_error", message: "decode failed" }) })));
    expect(s.log.finishes.map((f) => [f.reason, f.usage, f.error?.code, f.error?.message])).toEqual([["error", { promptTokens: 2, completionTokens: 0 }, "engine_error", "decode failed"]]);
    // The engine's code is mapped to HTTP once, in errors.ts: an engine failure is a 500 engine_error.
    expect([s.log.finishes[0]!.error?.httpError?.status, s.log.finishes[0]!.error?.httpError?.code]).toEqual([500, "engine_error"]);
  });

  it("engine error codes map to HTTP once: refusals are 4xx (onRefused), failures and unknown codes 500 engine_error", () => {
    const cases: [string, number, string, boolean][] = [
      ["context_length_exceeded", 400, "context_length_exceeded", true],
      ["invalid_prompt", 400, "invalid_prompt", true],
      ["invalid_params", 400, "invalid_params", true],
      ["duplicate_id", 409, "duplicate_id", true],
      ["engine_error", 500, "engine_error", false],
      ["invariant_violation", 500, "engine_error", false],
      ["made_up_by_an_engine", 500, "engine_error", false],
    ];
    for (const [code, status, httpCode, refused] of cases) {
      const refusals: string[] = [];
      const finished: string[] = [];
      const reg = new SinkTable(() => true, { onRefused: (id) => refusals.push(id), onFinished: (id) => finished.push(id) });
      const s = sink();
      reg.submit("a", { text: "x" }, params, s);
      reg.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "a", code: code as "engine_error", message: `m ${code}` });
      const e = s.log.finishes[0]!.error!;
      expect([code, e.httpError?.status, e.httpError?.code]).toEqual([code, status, httpCode]);
      expect([refusals.length, finished.length]).toEqual(refused ? [1, 0] : [0, 1]);
    }
  });

  it("a refusal naming a params field answers with the client's field, like the gateway's own check; an unmapped one stays unnamed", () => {
    const answer = (param?: string) => {
      const reg = new SinkTable(() => true);
      const s = sink();
      reg.submit("a", { text: "x" }, params, s);
      reg.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "a", code: "invalid_params", message: "no", ...(param ? { param } : {}) });
      const h = s.log.finishes[0]!.error!.httpError!;
      return [h.status, h.code, h.param];
    };
    expect(answer("logitBias")).toEqual([400, "invalid_value", "logit_bias"]);
    expect(answer("stopTokenIds")).toEqual([400, "invalid_value", "stop_token_ids"]);
    expect(answer("guide")).toEqual([400, "invalid_params", null]);
    expect(answer()).toEqual([400, "invalid_params", null]);
  });

  it("cancel sends exactly one abort, keeps the request until the engine's finish, and silences the sink", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [1, 2], cachedTokens: 0 }, tokens: [3], text: "c" })));
    t.reg.cancel("a", "client_disconnect");
    t.reg.cancel("a", "client_disconnect");
    t.reg.cancel("a", "shutdown");
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["a"] }]);
    expect(t.reg.size).toBe(1);
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 1 });
    expect(t.reg.phase("a")).toBe("decode");
    // Outputs of steps already in flight are not forwarded.
    t.reg.handleStep(step(out("a", { tokens: [4], text: "d" })));
    expect(s.log.outputs).toEqual([{ tokens: [3], text: "c" }]);
    t.reg.handleStep(step(out("a", { finish: fin("abort", 2, 2) })));
    expect(t.reg.size).toBe(0);
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 0 });
    expect(s.log.finishes).toEqual([]);
    expect(t.events).toContain("cancel a decode client_disconnect");
    expect(t.events.at(-1)).toBe("finished a abort decode");
    // A later cancel or output for the id is ignored.
    t.reg.cancel("a", "client_disconnect");
    t.reg.handleStep(step(out("a", { tokens: [5], text: "e", finish: fin("stop") })));
    expect(t.sent.filter((m) => m.type === "abort")).toHaveLength(1);
    expect(s.log.finishes).toEqual([]);
  });

  it("a request cancelled while queued and then reported admitted (the abort came during that step) is released in phase prefill; admission is not forwarded to the sink", () => {
    const t = setup();
    const s = sink();
    const released: (string | null)[] = [];
    t.reg.submit("q", { text: "hi" }, params, { ...s, onReleased: (phase) => void released.push(phase) });
    t.reg.cancel("q", "client_disconnect");
    expect(t.reg.counts()).toEqual({ waiting: 1, running: 0 });
    t.reg.handleStep(step(out("q", { admitted: { promptTokens: [1], cachedTokens: 0 } })));
    expect(s.log.admitted).toBe(0);
    // It holds a sequence until the abort is applied.
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 1 });
    t.reg.handleStep(step(out("q", { finish: fin("abort", 1, 0) })));
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 0 });
    expect(t.events.at(-1)).toBe("finished q abort prefill");
    expect(released).toEqual(["prefill"]);
  });

  it("a request cancelled while queued and released without admission is released in phase queued", () => {
    const t = setup();
    const released: (string | null)[] = [];
    t.reg.submit("q", { text: "hi" }, params, { ...sink(), onReleased: (phase) => void released.push(phase) });
    t.reg.cancel("q", "client_disconnect");
    t.reg.handleStep(step(out("q", { finish: fin("abort", 0, 0) })));
    expect(t.events.at(-1)).toBe("finished q abort queued");
    expect(released).toEqual(["queued"]);
  });

  it("a stop-string cancel finishes as stop for metrics, without calling the sink", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [2], text: "x" })));
    t.reg.cancel("a", "stop_string");
    t.reg.handleStep(step(out("a", { finish: fin("abort", 1, 1) })));
    expect(t.events.at(-1)).toBe("finished a stop decode");
    expect(s.log.finishes).toEqual([]);
  });

  it("cancel of an unknown id does nothing", () => {
    const t = setup();
    t.reg.cancel("nope", "client_disconnect");
    expect(t.sent).toEqual([]);
  });

  it("ignores late outputs for unknown ids without throwing", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "hi" }, params, s);
    expect(() =>
      t.reg.handleStep(step(out("ghost", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [1], text: "boo", finish: fin("stop") }), out("a", { tokens: [7], text: "k" }))),
    ).not.toThrow();
    expect(s.log.outputs).toEqual([{ tokens: [7], text: "k" }]);
    expect(t.reg.size).toBe(1);
    expect(() => t.reg.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "ghost", code: "invalid_prompt", message: "y" })).not.toThrow();
    expect(t.reg.size).toBe(1);
  });

  it("an engine_error refusal is an engine failure: 500, counted as finished with an error", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "x" }, params, s);
    t.reg.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "a", code: "engine_error", message: "no sampler" });
    expect(s.log.finishes[0]!.error!.httpError!.status).toBe(500);
    expect(t.events).toContain("finished a error queued");
  });

  it("handleRequestError ends the request with the http error", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "long" }, params, s);
    t.reg.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "a", code: "context_length_exceeded", message: "too long" });
    expect(s.log.finishes).toHaveLength(1);
    const f = s.log.finishes[0]!;
    expect(f.reason).toBe("error");
    expect(f.usage).toEqual({ promptTokens: 0, completionTokens: 0 });
    expect(f.error).toMatchObject({ code: "context_length_exceeded", message: "too long" });
    expect(f.error!.httpError).toBeInstanceOf(KeelHttpError);
    expect(f.error!.httpError!.code).toBe("context_length_exceeded");
    expect(f.error!.httpError!.status).toBe(400);
    expect(t.reg.size).toBe(0);
    // A refusal is a client error: reported as refused, not as a finished request.
    expect(t.events.some((e) => e.startsWith("finished a"))).toBe(false);
    expect(t.events).toEqual([]);
  });

  it("handleEngineExit at shutdown answers shutting_down", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    t.reg.handleEngineExit("The server is shutting down.", shuttingDown());
    expect(s.log.finishes[0]!.error).toMatchObject({ code: "shutting_down", httpError: { status: 503, code: "shutting_down" } });
  });

  it("handleEngineExit fails every live request with code engine_fault", () => {
    const t = setup();
    const sinks = { q: sink(), p: sink(), d: sink(), c: sink() };
    for (const [id, s] of Object.entries(sinks)) t.reg.submit(id, { text: id }, params, s);
    t.reg.handleStep(step(out("p", { admitted: { promptTokens: [1, 2], cachedTokens: 0 } }), out("d", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [5, 6], text: "ab" }), out("c", { admitted: { promptTokens: [1], cachedTokens: 0 } })));
    t.reg.cancel("c", "client_disconnect");
    t.reg.handleEngineExit("engine exited with signal SIGABRT");
    expect(t.reg.size).toBe(0);
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 0 });
    for (const id of ["q", "p", "d"] as const) {
      expect(sinks[id].log.finishes, id).toHaveLength(1);
      const f = sinks[id].log.finishes[0]!;
      expect(f.reason).toBe("error");
      expect(f.error).toMatchObject({ code: "engine_fault", message: "engine exited with signal SIGABRT" });
      // What the client sees carries the same code (it was a 500 engine_error when no HTTP error was attached).
      expect(f.error?.httpError).toMatchObject({ status: 500, code: "engine_fault" });
    }
    expect(sinks.p.log.finishes[0]!.usage).toEqual({ promptTokens: 2, completionTokens: 0 });
    expect(sinks.d.log.finishes[0]!.usage).toEqual({ promptTokens: 1, completionTokens: 2 });
    // The cancelled request ends too (as abort, silently).
    expect(sinks.c.log.finishes).toEqual([]);
    expect(t.events).toContain("finished c abort prefill");
    // Late outputs from the dead engine are ignored.
    t.reg.handleStep(step(out("d", { tokens: [7], text: "z", finish: fin("stop") })));
    expect(sinks.d.log.outputs).toHaveLength(1);
    expect(sinks.d.log.finishes).toHaveLength(1);
  });

});

describe("culprit isolation by bisection (simulated engine)", () => {
  /**
   * n requests; those at the indices in `culprits` kill the engine whenever one of them is in flight. The fake engine
   * either dies (a culprit is in flight) or finishes everything in flight. Returns how each request ended and how
   * many times the engine died.
   */
  async function simulate(n: number, culprits: number[]): Promise<{ ends: Map<string, { reason: FinishReason; code?: string }>; deaths: number }> {
    const inEngine = new Set<string>();
    const reg = new SinkTable((m) => {
      if (m.type === "add") inEngine.add(m.id);
      return true;
    });
    const ends = new Map<string, { reason: FinishReason; code?: string }>();
    const ids = Array.from({ length: n }, (_, i) => `r${i}`);
    for (const id of ids) {
      const s = sink();
      s.onFinish = (reason, _u, error) => void ends.set(id, { reason, ...(error ? { code: error.code } : {}) });
      reg.submit(id, { text: id }, params, s);
    }
    let deaths = 0;
    let step = 0;
    for (let round = 0; round < 200 && reg.size > 0; round++) {
      if (culprits.some((c) => inEngine.has(`r${c}`))) {
        deaths += 1;
        inEngine.clear();
        reg.handleEngineDeath("killed");
        reg.resumeRecovering(); // the restarted engine is ready
      } else {
        const outs = [...inEngine].map((id) => ({ id, tokens: [], text: "", finish: { reason: "stop" as const, promptTokens: 1, completionTokens: 0 } }));
        inEngine.clear();
        reg.handleStep({ v: PROTOCOL_VERSION, type: "step", step: ++step, batchTokens: 1, outputs: outs, stats: { waiting: 0, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0 } });
        await Promise.resolve(); // the next bisection group is released in a microtask
      }
    }
    return { ends, deaths };
  }

  /** Exactly the culprits end with engine_fault; every other request finishes (reason stop). */
  function expectOnlyCulpritsFail(ends: Map<string, { reason: FinishReason; code?: string }>, n: number, culprits: number[]): void {
    expect(ends.size).toBe(n);
    for (let i = 0; i < n; i++) {
      if (culprits.includes(i)) expect(ends.get(`r${i}`), `r${i} is a culprit`).toEqual({ reason: "error", code: "engine_fault" });
      else expect(ends.get(`r${i}`), `r${i} is a bystander`).toEqual({ reason: "stop" });
    }
  }

  for (const n of [1, 2, 5, 8, 16]) {
    for (const culprit of [0, Math.floor(n / 2), n - 1]) {
      it(`n=${n}, culprit r${culprit}: only the culprit fails (engine_fault), everyone else finishes, deaths bounded`, async () => {
        const { ends, deaths } = await simulate(n, [culprit]);
        expectOnlyCulpritsFail(ends, n, [culprit]);
        // Two deaths start the bisection, one per halving, one for the lone culprit.
        expect(deaths).toBeLessThanOrEqual(2 + Math.ceil(Math.log2(n)) + 1);
      });
    }
  }

  // Several culprits: adjacent (the same test group), far apart, at both ends, and everyone but one.
  const several: [number, number[]][] = [
    [2, [0, 1]],
    [3, [0, 2]],
    [6, [4, 5]],
    [6, [0, 5]],
    [8, [1, 6]],
    [8, [3, 4]],
    [16, [0, 15]],
    [16, [7, 8]],
    [3, [0, 1, 2]],
    [5, [0, 2, 4]],
    [6, [3, 4, 5]],
    [8, [0, 1, 7]],
    [16, [2, 9, 13]],
    [16, [5, 6, 7]],
    [5, [0, 1, 2, 3]],
  ];
  for (const [n, culprits] of several) {
    it(`n=${n}, culprits ${culprits.map((c) => `r${c}`).join("+")}: exactly the culprits fail (engine_fault), every bystander finishes`, async () => {
      const { ends, deaths } = await simulate(n, culprits);
      expectOnlyCulpritsFail(ends, n, culprits);
      // Group testing: each culprit costs at most one halving per level plus its lone death and a retest.
      expect(deaths).toBeLessThanOrEqual(2 + culprits.length * (Math.ceil(Math.log2(n)) + 2));
    });
  }
});

describe("engine deaths (state model: recovering, blame, forgiveness)", () => {
  /** A registry whose observer records resumes and finishes. */
  function tracked() {
    const sent: Sent[] = [];
    const resumed: { id: string; generated: number; deaths: number }[] = [];
    const finished: { id: string; reason: FinishReason; phase: string | null; code?: string }[] = [];
    const reg = new SinkTable(
      (m) => {
        sent.push(structuredClone(m));
        return true;
      },
      {
        onResumed: (id, g, deaths) => resumed.push({ id, generated: g, deaths }),
        onFinished: (id, reason, _u, info) => finished.push({ id, reason, phase: info.phase, ...(info.errorCode ? { code: info.errorCode } : {}) }),
      },
    );
    return { reg, sent, resumed, finished };
  }
  const adds = (sent: Sent[]) => sent.filter((m): m is AddMessage => m.type === "add");

  it("requests in prefill and decode are kept across a death and resumed with their prompt and generated tokens", () => {
    const t = tracked();
    const p = sink();
    const d = sink();
    t.reg.submit("p", { text: "p" }, params, p);
    t.reg.submit("d", { text: "d" }, params, d);
    t.reg.handleStep(step(out("p", { admitted: { promptTokens: [1, 2], cachedTokens: 0 } }), out("d", { admitted: { promptTokens: [3], cachedTokens: 0 }, tokens: [7, 8], text: "xy" })));
    expect([t.reg.phase("p"), t.reg.phase("d")]).toEqual(["prefill", "decode"]);
    t.reg.handleEngineDeath("SIGABRT");
    expect(t.reg.size).toBe(2);
    expect(t.reg.recoveringCount).toBe(2);
    expect([t.reg.phase("p"), t.reg.phase("d")]).toEqual(["prefill", "decode"]);
    t.sent.length = 0;
    t.reg.resumeRecovering();
    const resent = adds(t.sent);
    expect(resent.map((m) => [m.id, m.prompt, m.generated ?? null])).toEqual([
      ["p", { tokens: [1, 2] }, null],
      ["d", { tokens: [3] }, [7, 8]],
    ]);
    expect(t.reg.recoveringCount).toBe(0);
    // Both finish normally on the new engine; nobody's sink saw an error.
    t.reg.handleStep(step(out("p", { tokens: [5], text: "a", finish: fin("stop", 2, 1) }), out("d", { tokens: [9], text: "z", finish: fin("length", 1, 1) })));
    expect(p.log.finishes.map((f) => f.reason)).toEqual(["stop"]);
    expect(d.log.finishes.map((f) => [f.reason, f.usage.completionTokens])).toEqual([["length", 3]]);
    expect(t.reg.size).toBe(0);
  });

  it("a cancel while recovering releases the request at once: no abort, never resubmitted, finished as abort", () => {
    const t = tracked();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    t.reg.handleStep(step(out("a", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [4], text: "x" })));
    t.reg.handleEngineDeath("SIGABRT");
    t.sent.length = 0;
    t.reg.cancel("a", "client_disconnect");
    expect(t.reg.size).toBe(0);
    expect(t.reg.recoveringCount).toBe(0);
    expect(t.finished).toEqual([{ id: "a", reason: "abort", phase: "decode" }]);
    t.reg.resumeRecovering();
    expect(t.sent).toEqual([]);
    expect(s.log.finishes).toEqual([]); // the gateway itself ended it: the sink is not called
  });

  it("a request cancelling when the engine dies is released by the death, as its cause says", () => {
    const t = tracked();
    t.reg.submit("a", { text: "a" }, params, sink());
    t.reg.cancel("a", "stop_string");
    t.reg.handleEngineDeath("SIGABRT");
    expect(t.reg.size).toBe(0);
    expect(t.finished).toEqual([{ id: "a", reason: "stop", phase: "queued" }]);
  });

  /** Kill the engine under `id`, resume it, and let it generate `tokens` tokens on the new engine. */
  function dieAndProgress(t: ReturnType<typeof tracked>, id: string, tokens: number, blame = true): void {
    t.reg.handleEngineDeath("SIGABRT", { blame });
    t.reg.resumeRecovering();
    t.reg.handleStep(step(out(id, { admitted: { promptTokens: [1], cachedTokens: 0 } })));
    for (let i = 0; i < tokens; i++) t.reg.handleStep(step(out(id, { tokens: [10 + i], text: "t" })));
  }

  it("progress forgives earlier deaths: a request making FORGIVE_AFTER_TOKENS tokens between deaths is never isolated", () => {
    const t = tracked();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    for (let i = 0; i < 5; i++) dieAndProgress(t, "a", FORGIVE_AFTER_TOKENS);
    expect(t.resumed.map((r) => r.deaths)).toEqual([1, 1, 1, 1, 1]);
    expect(s.log.finishes).toEqual([]);
    expect(t.reg.phase("a")).toBe("decode");
  });

  it("without enough progress deaths add up and a lone request is isolated with engine_fault", () => {
    const t = tracked();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    for (let i = 0; i < 4 && t.reg.size > 0; i++) dieAndProgress(t, "a", FORGIVE_AFTER_TOKENS - 1);
    expect(t.resumed.map((r) => r.deaths)).toEqual([1, 2]);
    expect(s.log.finishes.map((f) => [f.reason, f.error?.code, f.error?.httpError?.status])).toEqual([["error", "engine_fault", 500]]);
    expect(t.reg.size).toBe(0);
  });

  it("deaths nobody could cause (blame: false) never count: a request survives any number of them", () => {
    const t = tracked();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    for (let i = 0; i < 6; i++) dieAndProgress(t, "a", 0, false);
    expect(t.resumed.map((r) => r.deaths)).toEqual([0, 0, 0, 0, 0, 0]);
    expect(s.log.finishes).toEqual([]);
    expect(t.reg.size).toBe(1);
  });
});

describe("queue time", () => {
  it("is the engine's measure of the wait before admission when it reports one (not up to the first prefill chunk's output)", () => {
    const queued: number[] = [];
    const reg = new SinkTable(() => true, { onAdmitted: (_id, _n, info) => queued.push(info.queueMs) });
    reg.submit("a", { text: "a" }, params, sink());
    reg.submit("b", { text: "b" }, params, sink());
    reg.handleStep(step(out("a", { admitted: { promptTokens: [1], cachedTokens: 0, queueMs: 3 } })));
    reg.handleStep(step(out("b", { admitted: { promptTokens: [1], cachedTokens: 0 } })));
    expect(queued[0]).toBe(3);
    // Without the engine's measure: from acceptance to the step output (non-negative, small in a unit test).
    expect(queued[1]).toBeGreaterThanOrEqual(0);
    expect(queued[1]).toBeLessThan(10_000);
    expect(queued).toHaveLength(2);
  });
});

describe("registry bookkeeping (mutation-testing gaps)", () => {
  it("endAll ends every live request with a 503 shutting_down and one abort each; requests already cancelling are left alone", () => {
    const t = setup();
    const live = sink();
    const leaving = sink();
    t.reg.submit("live", { text: "a" }, params, live);
    t.reg.submit("leaving", { text: "b" }, params, leaving);
    t.reg.cancel("leaving", "client_disconnect");
    t.sent.length = 0;
    expect(t.reg.endAll("bye")).toBe(1);
    expect(live.log.finishes.map((f) => [f.reason, f.error?.code, f.error?.message, f.error?.httpError?.status])).toEqual([["error", "shutting_down", "bye", 503]]);
    expect(leaving.log.finishes).toEqual([]);
    expect(t.sent).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["live"] }]);
    expect(t.events).toContain("cancel live queued shutdown");
  });

  it("abort latency: the engine's stepsAfterAbort when reported, 0 when the engine ended it before the abort arrived, else the gateway's step count since the cancel", () => {
    let current = 5;
    const latencies: (number | undefined)[] = [];
    const reg = new SinkTable(() => true, { onFinished: (_id, _r, _u, info) => latencies.push(info.abortLatencySteps) }, () => current);
    for (const id of ["a", "b", "c", "d"]) reg.submit(id, { text: id }, params, sink());
    reg.cancel("a", "client_disconnect");
    reg.cancel("b", "client_disconnect");
    reg.cancel("d", "client_disconnect");
    // The gateway reads the engine's steps late (messages in flight): its own count since the cancel includes them.
    current = 13;
    reg.handleStep(step(out("a", { finish: fin("abort") })));
    reg.handleStep(step(out("b", { finish: { ...fin("abort"), stepsAfterAbort: 1 } })));
    reg.handleStep(step(out("c", { finish: fin("stop") })));
    reg.handleStep(step(out("d", { finish: fin("length") })));
    expect(latencies).toEqual([8, 1, undefined, 0]);
  });

  it("usage falls back to the engine's prompt count for a request that finished without an admission output", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("a", { text: "a" }, params, s);
    t.reg.handleStep(step(out("a", { finish: fin("length", 7, 0) })));
    expect(s.log.finishes[0]!.usage).toEqual({ promptTokens: 7, completionTokens: 0 });
  });

  it("time to first token once, then inter-token latency per later output with its token count", () => {
    const first: number[] = [];
    const later: [number, number][] = [];
    const reg = new SinkTable(() => true, { onFirstToken: (_id, ms) => first.push(ms), onTokens: (_id, n, itl) => later.push([n, itl]) });
    reg.submit("a", { text: "a" }, params, sink());
    reg.handleStep(step(out("a", { admitted: { promptTokens: [1], cachedTokens: 0 } })));
    reg.handleStep(step(out("a", { tokens: [5], text: "x" })));
    reg.handleStep(step(out("a", { tokens: [6, 7], text: "yz" })));
    reg.handleStep(step(out("a", { tokens: [], text: "" })));
    expect(first).toHaveLength(1);
    expect(first[0]).toBeGreaterThanOrEqual(0);
    expect(first[0]).toBeLessThan(10_000);
    expect(later.map(([n]) => n)).toEqual([2]);
    expect(later[0]![1]).toBeGreaterThanOrEqual(0);
    expect(later[0]![1]).toBeLessThan(10_000);
  });

  it("a request that dies before admission is resubmitted with its original prompt text", () => {
    const t = setup();
    t.reg.submit("q", { text: "the prompt" }, params, sink());
    t.reg.handleEngineDeath("SIGABRT");
    t.sent.length = 0;
    t.reg.resumeRecovering();
    expect(t.sent).toEqual([{ v: PROTOCOL_VERSION, type: "add", id: "q", prompt: { text: "the prompt" }, params }]);
  });

  it("a resubmission the engine cannot take (no engine connected) leaves the request recovering for the next ready", () => {
    const t = setup();
    t.reg.submit("q", { text: "p" }, params, sink());
    t.reg.handleEngineDeath("SIGABRT");
    t.setAccept(false);
    t.reg.resumeRecovering();
    expect(t.reg.recoveringCount).toBe(1);
    t.setAccept(true);
    t.reg.resumeRecovering();
    expect(t.reg.recoveringCount).toBe(0);
    expect(t.reg.phase("q")).toBe("queued");
  });

});


describe("bisection bookkeeping", () => {
  function tracked() {
    const adds: string[] = [];
    const resumed = new Map<string, number[]>();
    const reg = new SinkTable(
      (m) => {
        if (m.type === "add") adds.push(m.id);
        return true;
      },
      { onResumed: (id, _g, deaths) => resumed.set(id, [...(resumed.get(id) ?? []), deaths]) },
    );
    const sinks = new Map<string, ReturnType<typeof sink>>();
    const submit = (id: string) => {
      const s = sink();
      sinks.set(id, s);
      reg.submit(id, { text: id }, params, s);
    };
    return { reg, adds, resumed, sinks, submit };
  }

  it("repeated deaths start a bisection when any request in flight reached the threshold: only the first half is resubmitted", () => {
    const t = tracked();
    t.submit("a");
    t.reg.handleEngineDeath("SIGABRT"); // a: 1 death
    t.reg.resumeRecovering();
    t.submit("b");
    t.reg.handleEngineDeath("SIGABRT"); // a: 2 deaths, b: 1
    t.adds.length = 0;
    t.reg.resumeRecovering();
    expect(t.adds).toEqual(["a"]);
    expect(t.reg.recoveringCount).toBe(1);
  });

  it("a request in flight beside a lone group member when it dies is not charged, but the member is not isolated until it dies alone", async () => {
    const t = tracked();
    t.submit("a");
    t.submit("b");
    t.reg.handleEngineDeath("SIGABRT");
    t.reg.resumeRecovering();
    t.reg.handleEngineDeath("SIGABRT"); // both at 2: bisection over [a, b]
    t.reg.resumeRecovering(); // group [a]; b held back
    t.submit("c"); // arrives beside the group: it could be a second culprit
    t.reg.handleEngineDeath("SIGABRT");
    expect(t.sinks.get("a")!.log.finishes).toEqual([]);
    t.adds.length = 0;
    t.reg.resumeRecovering(); // a again, alone: c and b are held back as suspects
    expect(t.adds).toEqual(["a"]);
    t.reg.handleEngineDeath("SIGABRT"); // a died alone: it is isolated
    expect(t.sinks.get("a")!.log.finishes.map((f) => f.error?.code)).toEqual(["engine_fault"]);
    t.adds.length = 0;
    t.reg.resumeRecovering(); // the remaining suspects are tested together
    expect(t.adds).toEqual(["b", "c"]);
    expect(t.resumed.get("c")).toEqual([0]); // never charged
    t.reg.handleStep(step(out("b", { finish: fin("stop") }), out("c", { finish: fin("stop") })));
    await Promise.resolve();
    expect([t.sinks.get("b")!.log.finishes, t.sinks.get("c")!.log.finishes].map((f) => f.map((x) => x.reason))).toEqual([["stop"], ["stop"]]);
    expect(t.reg.size).toBe(0);
  });

  it("suspects held back while a group of several dies stay suspects: not resumed until the group is resolved", async () => {
    const t = tracked();
    for (const id of ["a", "b", "c", "d"]) t.submit(id);
    t.reg.handleEngineDeath("SIGABRT");
    t.reg.resumeRecovering();
    t.reg.handleEngineDeath("SIGABRT"); // all at 2: bisection over [a, b, c, d]
    t.adds.length = 0;
    t.reg.resumeRecovering(); // group [a, b]
    expect(t.adds).toEqual(["a", "b"]);
    t.reg.handleEngineDeath("SIGABRT"); // the group of two dies: c and d were not in flight
    t.adds.length = 0;
    t.reg.resumeRecovering();
    // c and d may hold a second culprit: they wait; [a, b] is bisected alone.
    expect(t.adds).toEqual(["a"]);
    expect(t.reg.recoveringCount).toBe(3);
    t.reg.handleStep(step(out("a", { finish: fin("stop") })));
    await Promise.resolve();
    expect(t.adds).toEqual(["a", "b"]); // b alone next
    t.reg.handleEngineDeath("SIGABRT"); // b dies alone: isolated
    expect(t.sinks.get("b")!.log.finishes.map((f) => f.error?.code)).toEqual(["engine_fault"]);
    t.adds.length = 0;
    t.reg.resumeRecovering();
    expect(t.adds).toEqual(["c", "d"]); // the remaining suspects, tested together, with their deaths kept
    expect([t.resumed.get("c")!.at(-1), t.resumed.get("d")!.at(-1)]).toEqual([2, 2]);
  });

  it("a death nobody caused during a bisection reruns the same test group (its members are not stranded)", () => {
    const t = tracked();
    for (const id of ["a", "b"]) t.submit(id);
    t.reg.handleEngineDeath("SIGABRT");
    t.reg.resumeRecovering();
    t.reg.handleEngineDeath("SIGABRT");
    t.reg.resumeRecovering(); // group [a]
    t.reg.handleEngineDeath("watchdog", { blame: false });
    t.adds.length = 0;
    t.reg.resumeRecovering();
    expect(t.adds).toEqual(["a"]);
    expect(t.resumed.get("a")!.at(-1)).toBe(2); // not charged
  });

  it("a group that ends cleanly releases the next half of the suspects", async () => {
    const t = tracked();
    for (const id of ["a", "b"]) t.submit(id);
    t.reg.handleEngineDeath("SIGABRT");
    t.reg.resumeRecovering();
    t.reg.handleEngineDeath("SIGABRT");
    t.adds.length = 0;
    t.reg.resumeRecovering(); // group [a]
    expect(t.adds).toEqual(["a"]);
    t.reg.handleStep(step(out("a", { finish: fin("stop") })));
    await Promise.resolve(); // the next group is released in a microtask
    expect(t.adds).toEqual(["a", "b"]);
  });
});

describe("RequestRegistry: guideDropped", () => {
  it("delivers the engine's guideDropped to the sink before that step's output, and not for a request being cancelled", () => {
    const t = setup();
    const order: string[] = [];
    const s: RequestSink = {
      onAdmitted: () => undefined,
      onOutput: (_tokens, text) => void order.push(`out ${text}`),
      onFinish: () => undefined,
      onGuideDropped: (why) => void order.push(`dropped ${why}`),
    };
    t.reg.submit("g", { text: "hi" }, params, s);
    t.reg.handleStep(step(out("g", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [7], text: "a" })));
    t.reg.handleStep(step(out("g", { tokens: [8], text: "b", guideDropped: "trigger replay rejected" })));
    expect(order).toEqual(["out a", "dropped trigger replay rejected", "out b"]);
    t.reg.cancel("g", "client_disconnect");
    t.reg.handleStep(step(out("g", { tokens: [9], text: "c", guideDropped: "late" })));
    expect(order).toEqual(["out a", "dropped trigger replay rejected", "out b"]);
  });

  it("a guide dropped while the client's logit_bias bans tokens ends the request with a 400 naming logit_bias; nothing unconstrained is sent", () => {
    const t = setup();
    const banned = sink();
    const unbanned = sink();
    t.reg.submit("b", { text: "hi" }, { ...params, logitBias: [[4, -100], [6, 3]] }, banned);
    t.reg.submit("u", { text: "hi" }, { ...params, logitBias: [[4, -99]] }, unbanned);
    t.reg.handleStep(step(out("b", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [7], text: "{" }), out("u", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [7], text: "{" })));
    t.sent.length = 0;
    t.reg.handleStep(step(out("b", { tokens: [8], text: "x", guideDropped: "every token was masked" }), out("u", { tokens: [8], text: "x", guideDropped: "every token was masked" })));
    expect(banned.log.outputs.map((o) => o.text)).toEqual(["{"]);
    const [f] = banned.log.finishes;
    expect([f?.reason, f?.error?.httpError?.status, f?.error?.httpError?.param]).toEqual(["error", 400, "logit_bias"]);
    expect(f?.error?.message).toContain("after 1 generated tokens.");
    expect(t.sent).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["b"] }]);
    expect(t.events).toContain("cancel b decode guide_unsatisfiable");
    // Without a ban the request goes on unconstrained (the drop is logged, guide_dropped).
    expect(unbanned.log.outputs.map((o) => o.text)).toEqual(["{", "x"]);
    expect(unbanned.log.finishes).toEqual([]);
  });

  // The breaker's leak: the bans left nothing at the first token and the engine ended the request in the same output
  // (it sampled an end token unconstrained); the 400 must still close the entry, not wait for an abort's answer.
  it("a guide-400 in the output that also finishes the request closes it at once: nothing left running, no abort", () => {
    const t = setup();
    const s = sink();
    t.reg.submit("b", { text: "hi" }, { ...params, logitBias: [[4, -100]] }, s);
    t.sent.length = 0;
    t.reg.handleStep(step(out("b", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [2], text: "", guideDropped: "every token was masked", finish: fin("stop") })));
    expect(s.log.outputs).toEqual([]);
    expect(s.log.finishes.map((f) => [f.reason, f.error?.httpError?.param])).toEqual([["error", "logit_bias"]]);
    expect(t.reg.size).toBe(0);
    expect(t.reg.counts()).toEqual({ waiting: 0, running: 0 });
    expect(t.sent).toEqual([]);
  });
});
