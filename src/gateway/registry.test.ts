import { describe, expect, it } from "vitest";
import type { AddMessage, FinishInfo, RequestOutput, SamplingParams, StepMessage } from "../protocol/messages.js";
import { PROTOCOL_VERSION } from "../protocol/messages.js";
import { KeelHttpError } from "./errors.js";
import type { FinishReason } from "./lifecycle.js";
import { RequestRegistry, type RegistryObserver, type RequestSink, type Usage } from "./registry.js";

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
  const observer: RegistryObserver = {
    onCancel: (id, phase, cause) => events.push(`cancel ${id} ${phase} ${cause}`),
    onFinished: (id, reason, _usage, info) => events.push(`finished ${id} ${reason} ${info.phase}`),
    onAdmitted: (id, n) => events.push(`admitted ${id} ${n}`),
    onFirstToken: (id) => events.push(`first ${id}`),
    onInternalError: (id, message) => events.push(`internal ${id} ${message}`),
  };
  let ok = accept;
  const reg = new RequestRegistry((m) => {
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
    expect(s.log.finishes).toEqual([{ reason: "error", usage: { promptTokens: 2, completionTokens: 0 }, error: { code: "engine_error", message: "decode failed" } }]);
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
      expect(f.error).toEqual({ code: "engine_fault", message: "engine exited with signal SIGABRT" });
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

  it("a sink that throws fails only its own request: one abort, an internal_error finish, other requests unaffected", () => {
    const t = setup();
    const bad = sink();
    const good = sink();
    bad.onOutput = () => {
      throw new Error("socket write failed");
    };
    t.reg.submit("bad", { text: "x" }, params, bad);
    t.reg.submit("good", { text: "y" }, params, good);
    expect(() =>
      t.reg.handleStep(step(out("bad", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [2], text: "b" }), out("good", { admitted: { promptTokens: [1], cachedTokens: 0 }, tokens: [3], text: "g" }))),
    ).not.toThrow();
    expect(good.log.outputs).toEqual([{ tokens: [3], text: "g" }]);
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["bad"] }]);
    expect(bad.log.finishes).toHaveLength(1);
    expect(bad.log.finishes[0]!.reason).toBe("error");
    expect(bad.log.finishes[0]!.error!.code).toBe("internal_error");
    expect(bad.log.finishes[0]!.error!.message).toContain("socket write failed");
    expect(t.events.some((e) => e.startsWith("internal bad "))).toBe(true);
    // The entry stays until the engine confirms; then it ends as error without a second sink call.
    expect(t.reg.size).toBe(2);
    t.reg.handleStep(step(out("bad", { finish: fin("abort", 1, 1) })));
    expect(t.reg.size).toBe(1);
    expect(bad.log.finishes).toHaveLength(1);
    expect(t.events).toContain("finished bad error decode");
  });
});

describe("culprit isolation by bisection (simulated engine)", () => {
  /**
   * n requests, one of which (index `culprit`) kills the engine whenever it is in flight. The fake engine either
   * dies (if the culprit is in flight) or finishes everything in flight. Returns how each request ended.
   */
  async function simulate(n: number, culprit: number): Promise<{ ends: Map<string, { reason: FinishReason; code?: string }>; deaths: number }> {
    const inEngine = new Set<string>();
    const reg = new RequestRegistry((m) => {
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
    for (let round = 0; round < 100 && reg.size > 0; round++) {
      if (inEngine.has(`r${culprit}`)) {
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

  for (const n of [1, 2, 5, 8, 16]) {
    for (const culprit of [0, Math.floor(n / 2), n - 1]) {
      it(`n=${n}, culprit r${culprit}: only the culprit fails (engine_fault), everyone else finishes, deaths bounded`, async () => {
        const { ends, deaths } = await simulate(n, culprit);
        expect(ends.size).toBe(n);
        for (let i = 0; i < n; i++) {
          if (i === culprit) expect(ends.get(`r${i}`)).toEqual({ reason: "error", code: "engine_fault" });
          else expect(ends.get(`r${i}`)).toEqual({ reason: "stop" });
        }
        expect(deaths).toBeLessThanOrEqual(2 + Math.ceil(Math.log2(n)) + 1);
      });
    }
  }
});
