import pino from "pino";
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type StepMessage } from "../../protocol/messages.js";
import { invalidValue } from "../http/errors.js";
import { Metrics } from "./metrics.js";
import { requestObserver, StepObserver, stepTrace } from "./metrics-observer.js";

function setup(level = "debug") {
  const lines: { level: number; event?: string; requestId?: string; msg?: string; [k: string]: unknown }[] = [];
  const log = pino({ level }, { write: (l: string) => void lines.push(JSON.parse(l)) });
  const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
  const value = async (name: string, labels = ""): Promise<number> => {
    const text = await metrics.registry.getSingleMetricAsString(name);
    const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `));
    return Number(line?.split(" ")[1]);
  };
  return { lines, metrics, value, observe: requestObserver(metrics, log, () => 4, "tiny") };
}

const stepMsg = (step: number, hits: number, active = 1): StepMessage => ({
  v: PROTOCOL_VERSION,
  type: "step",
  step,
  batchTokens: 1,
  outputs: [],
  stats: { waiting: 0, running: 1, activeSequences: active, cachedSequences: 2, prefixCacheHitTokens: hits },
});

describe("requestObserver: every request event reaches metrics and the log", () => {
  it("an internal error while serving one request is logged at error level with its request id", () => {
    const t = setup();
    t.observe({ type: "internal_error", id: "req-1", message: "sink failed: boom" });
    expect(t.lines).toEqual([expect.objectContaining({ level: 50, event: "internal_error", requestId: "req-1", error: "sink failed: boom" })]);
  });

  it("cancel, culprit, resume and refusal are logged with the request id", async () => {
    const t = setup();
    t.observe({ type: "cancelled", id: "a", phase: "decode", cause: "client_disconnect" });
    t.observe({ type: "culprit", id: "b", deaths: 3 });
    t.observe({ type: "resumed", id: "c", generatedTokens: 5, deaths: 1 });
    t.observe({ type: "finished", id: "d", reason: "error", usage: { promptTokens: 0, completionTokens: 0 }, phase: "queued", e2eMs: 1, error: { code: "context_length_exceeded", message: "too long" }, released: false, refused: true });
    expect(t.lines.map((l) => [l.level, l.event, l.requestId])).toEqual([
      [20, "cancelled", "a"],
      [50, "culprit_isolated", "b"],
      [30, "resumed", "c"],
      [20, "rejected", "d"],
    ]);
    expect(await t.value("keel_requests_resumed_total")).toBe(1);
    expect(await t.value("keel_requests_rejected_total", '{reason="invalid_request"}')).toBe(1);
  });

  it("a dropped guide is counted and warned about; a disconnect is counted once its children are released, in its phase", async () => {
    const t = setup();
    t.observe({ type: "guide_dropped", id: "g", reason: "trigger replay rejected", ends: false });
    t.observe({ type: "guide_dropped", id: "h", reason: "every token was masked", ends: true });
    t.observe({ type: "client_disconnect", requestId: "r", children: 2 });
    t.observe({ type: "client_disconnect_released", requestId: "r", phase: "prefill" });
    t.observe({ type: "client_disconnect_released", requestId: "s", phase: null }); // no engine held it: not counted
    expect(await t.value("keel_guided_dropped_total")).toBe(2);
    expect(await t.value("keel_client_disconnects_total", '{phase="prefill"}')).toBe(1);
    expect(t.lines.filter((l) => l.event === "guide_dropped").map((l) => l.msg)).toEqual([
      "guided generation dropped; the request continues unconstrained",
      "guided generation dropped: the request's logit_bias left its guide no token; it ends with a 400",
    ]);
    expect(t.lines.map((l) => [l.level, l.event, l.requestId])).toEqual([
      [40, "guide_dropped", "g"],
      [40, "guide_dropped", "h"],
      [20, "client_disconnect", "r"],
      [20, "client_disconnect_released", "r"],
      [20, "client_disconnect_released", "s"],
    ]);
  });

  it("a finished request counts by reason; errors count by cause", async () => {
    const t = setup();
    const done = { released: false, refused: false } as const;
    t.observe({ type: "finished", id: "a", reason: "error", usage: { promptTokens: 3, completionTokens: 2 }, phase: "decode", error: { code: "engine_fault", message: "x" }, e2eMs: 10, ...done });
    t.observe({ type: "finished", id: "b", reason: "error", usage: { promptTokens: 1, completionTokens: 0 }, phase: "queued", error: { code: "shutting_down", message: "y" }, e2eMs: 5, ...done });
    t.observe({ type: "finished", id: "c", reason: "stop", usage: { promptTokens: 4, completionTokens: 6 }, phase: "decode", e2eMs: 7, ...done });
    const bias = invalidValue("logit_bias", "bans everything");
    t.observe({ type: "finished", id: "d", reason: "error", usage: { promptTokens: 0, completionTokens: 0 }, phase: "decode", error: { code: "invalid_value", message: "z", httpError: bias }, e2eMs: 3, ...done });
    expect(await t.value("keel_requests_failed_total", '{reason="invalid_request"}')).toBe(1);
    expect(await t.value("keel_requests_failed_total", '{reason="engine_error"}')).toBe(0);
    expect(await t.value("keel_requests_finished_total", '{finish_reason="error"}')).toBe(3);
    expect(await t.value("keel_requests_failed_total", '{reason="engine_fault"}')).toBe(1);
    expect(await t.value("keel_requests_failed_total", '{reason="shutdown"}')).toBe(1);
    expect(await t.value("keel_prompt_tokens_total")).toBe(8);
    expect(await t.value("keel_generation_tokens_total")).toBe(8);
  });
});

describe("requestObserver: one INFO line per request", () => {
  const done = { type: "request_done", route: "/v3/chat/completions", promptTokens: 12, completionTokens: 30, ttftMs: 45, e2eMs: 545, tokPerS: 58, finishReason: "stop", clientGone: false } as const;

  it("at INFO a request's lifecycle events write nothing; its terminal record writes one line with every field", () => {
    const t = setup("info");
    const usage = { promptTokens: 12, completionTokens: 30 };
    t.observe({ type: "queued", id: "r" });
    t.observe({ type: "admitted", id: "r", promptTokens: 12, first: { queueMs: 3, cachedTokens: 4 }, live: true });
    t.observe({ type: "first_token", id: "r", ttftMs: 45 });
    t.observe({ type: "tokens", id: "r", count: 29, itlMs: 17 });
    t.observe({ type: "finished", id: "r", reason: "stop", usage, phase: "decode", e2eMs: 545, released: false, refused: false });
    t.observe({ ...done, requestId: "r" });
    expect(t.lines).toEqual([
      expect.objectContaining({ level: 30, msg: "request finished (stop)", requestId: "r", event: "request_done", model: "tiny", route: "/v3/chat/completions", promptTokens: 12, completionTokens: 30, ttftMs: 45, e2eMs: 545, tokPerS: 58, finishReason: "stop", clientGone: false }),
    ]);
  });

  it("at DEBUG the lifecycle events are there too, in order, before the request's line", () => {
    const t = setup("debug");
    t.observe({ type: "queued", id: "r" });
    t.observe({ type: "admitted", id: "r", promptTokens: 12, first: { queueMs: 3, cachedTokens: 4 }, live: true });
    t.observe({ type: "first_token", id: "r", ttftMs: 45 });
    t.observe({ type: "finished", id: "r", reason: "abort", usage: { promptTokens: 12, completionTokens: 1 }, phase: "decode", e2eMs: 60, abortLatencySteps: 1, released: true, refused: false });
    t.observe({ ...done, requestId: "r", finishReason: "abort", clientGone: true, abortLatencySteps: 1 });
    expect(t.lines.map((l) => [l.level, l.event])).toEqual([
      [20, "queued"],
      [20, "prefill_started"],
      [20, "first_token"],
      [20, "aborted"],
      [30, "request_done"],
    ]);
    expect(t.lines[4]).toMatchObject({ msg: "request ended: the client went away", clientGone: true, abortLatencySteps: 1 });
  });

  it("a failed request's line names the error; a server-side failure is a WARN line, a refusal or a 503 stays INFO", () => {
    const t = setup("info");
    const failed = (id: string, code: string, status: number) => t.observe({ ...done, requestId: id, finishReason: "error", error: { code, status, message: `${code} happened` } });
    failed("a", "engine_fault", 500);
    failed("b", "context_length_exceeded", 400);
    failed("c", "shutting_down", 503);
    expect(t.lines.map((l) => [l.level, l.requestId, l.msg, l.errorCode, l.status, l.error])).toEqual([
      [40, "a", "request failed (engine_fault)", "engine_fault", 500, "engine_fault happened"],
      [30, "b", "request failed (context_length_exceeded)", "context_length_exceeded", 400, "context_length_exceeded happened"],
      [30, "c", "request failed (shutting_down)", "shutting_down", 503, "shutting_down happened"],
    ]);
  });
});

describe("StepObserver: metrics from step outputs in one place", () => {
  it("counts step and prefix-hit increments of the engine's cumulative counters, and starts over with a new engine", async () => {
    const t = setup();
    const steps = new StepObserver(t.metrics);
    steps.observe(stepMsg(3, 10));
    steps.observe(stepMsg(5, 10, 2));
    expect([steps.lastStep, steps.activeSequences, steps.cachedSequences]).toEqual([5, 2, 2]);
    steps.engineStarted(); // the restarted engine counts from 0 again
    expect([steps.lastStep, steps.activeSequences, steps.cachedSequences]).toEqual([0, 0, 0]);
    steps.observe(stepMsg(2, 4));
    expect(await t.value("keel_engine_steps_total")).toBe(7);
    expect(await t.value("keel_prefix_cache_hit_tokens_total")).toBe(14);
  });
});

describe("StepObserver: tokens processed, for the periodic engine line", () => {
  it("counts prefilled and cached prompt tokens at admission and every generated token, across engine restarts", () => {
    const t = setup();
    const steps = new StepObserver(t.metrics);
    steps.observe({ ...stepMsg(1, 0), outputs: [{ id: "a", tokens: [], text: "", admitted: { promptTokens: [1, 2, 3, 4], cachedTokens: 3 } }, { id: "b", tokens: [9, 9], text: "" }] });
    steps.engineStarted(); // the gateway's totals are not the engine's: they go on
    steps.observe({ ...stepMsg(1, 0), outputs: [{ id: "a", tokens: [5], text: "", admitted: { promptTokens: [1, 2], cachedTokens: 0 } }] });
    expect(steps.processed).toEqual({ promptTokens: 3, cachedTokens: 3, generatedTokens: 3 });
  });
});

describe("StepObserver: requests scheduled per step", () => {
  it("observes how many requests got a token in each step that decoded; a repeated step number (aborts only) adds nothing", async () => {
    const t = setup();
    const steps = new StepObserver(t.metrics);
    const out = (id: string, tokens: number[]) => ({ id, tokens, text: "" });
    steps.observe({ ...stepMsg(1, 0), outputs: [out("a", [5]), out("b", [6]), out("c", [])] });
    steps.observe({ ...stepMsg(2, 0), outputs: [out("a", [7])] });
    steps.observe({ ...stepMsg(2, 0), outputs: [out("b", [])] });
    steps.observe({ ...stepMsg(3, 0), outputs: [out("c", [])] }); // a prefill-only step: nothing sampled
    const text = await t.metrics.registry.getSingleMetricAsString("keel_engine_step_requests");
    const line = (prefix: string): number => Number(text.split("\n").find((l) => l.startsWith(prefix))?.split(" ")[1]);
    expect(line("keel_engine_step_requests_count ")).toBe(2);
    expect(line("keel_engine_step_requests_sum ")).toBe(3);
    expect(line('keel_engine_step_requests_bucket{le="1"} ')).toBe(1);
  });
});

describe("StepObserver: where the engine's step time went", () => {
  it("observes decode, sample and the rest of each decoding step's phaseUs; a step without it observes nothing", async () => {
    const t = setup();
    const steps = new StepObserver(t.metrics);
    const withPhase = (step: number, phaseUs?: { decode: number; sample: number; step: number }): StepMessage => {
      const m = stepMsg(step, 0);
      return phaseUs ? { ...m, stats: { ...m.stats, phaseUs } } : m;
    };
    steps.observe(withPhase(1, { decode: 2000, sample: 500, step: 3000 }));
    steps.observe(withPhase(2, { decode: 1000, sample: 1500, step: 2600 }));
    steps.observe(withPhase(3));
    const text = await t.metrics.registry.getSingleMetricAsString("keel_engine_step_phase_seconds");
    const line = (prefix: string): number => Number(text.split("\n").find((l) => l.startsWith(prefix))?.split(" ")[1]);
    expect(line('keel_engine_step_phase_seconds_count{phase="decode"} ')).toBe(2);
    expect(line('keel_engine_step_phase_seconds_sum{phase="decode"} ')).toBeCloseTo(0.003, 9);
    expect(line('keel_engine_step_phase_seconds_sum{phase="sample"} ')).toBeCloseTo(0.002, 9);
    expect(line('keel_engine_step_phase_seconds_sum{phase="other"} ')).toBeCloseTo(0.0006, 9);
  });
});

describe("StepObserver: preemptions from the engine's cumulative count", () => {
  const withPreemptions = (step: number, preemptions: number | undefined): StepMessage => {
    const m = stepMsg(step, 0);
    return preemptions === undefined ? m : { ...m, stats: { ...m.stats, preemptions } };
  };

  it("counts increments per model under Keel's and vLLM's names, starts over with a new engine, and stays 0 for an engine that never reports them", async () => {
    const t = setup();
    const coder = new StepObserver(t.metrics, "coder");
    const tiny = new StepObserver(t.metrics, "tiny");
    t.metrics.registerModel("coder");
    t.metrics.registerModel("tiny");
    coder.observe(withPreemptions(1, 0));
    coder.observe(withPreemptions(2, 3));
    coder.observe(withPreemptions(3, 3)); // no new preemption
    coder.observe(withPreemptions(4, 5));
    coder.engineStarted(); // the restarted engine reports from 0 again
    coder.observe(withPreemptions(1, 2));
    tiny.observe(withPreemptions(1, undefined)); // llama.cpp: no preemption field
    expect(await t.value("keel_engine_preemptions_total", '{model="coder"}')).toBe(7);
    expect(await t.value("vllm:num_preemptions_total", '{model_name="coder"}')).toBe(7);
    expect(await t.value("keel_engine_preemptions_total", '{model="tiny"}')).toBe(0);
    expect(await t.value("vllm:num_preemptions_total", '{model_name="tiny"}')).toBe(0);
  });

  it("linear-attention blocks follow the last step; an engine that exits holds none; absent stays undefined", () => {
    const t = setup();
    const hybrid = new StepObserver(t.metrics, "hybrid");
    const m = stepMsg(1, 0);
    hybrid.observe({ ...m, stats: { ...m.stats, linearAttentionBlocks: { inUse: 4, total: 19 } } });
    expect(hybrid.linearAttentionBlocks).toEqual({ inUse: 4, total: 19 });
    hybrid.engineGone();
    expect(hybrid.linearAttentionBlocks).toEqual({ inUse: 0, total: 19 });
    const dense = new StepObserver(t.metrics, "dense");
    dense.observe(m);
    expect(dense.linearAttentionBlocks).toBeUndefined();
  });

  it("draft tokens: proposed and accepted counted per model from the cumulative stats, from 0 again after a restart", async () => {
    const t = setup();
    const coder = new StepObserver(t.metrics, "coder");
    t.metrics.registerModel("coder");
    const at = (step: number, drafts?: [number, number]) => {
      const m = stepMsg(step, 0);
      return drafts ? { ...m, stats: { ...m.stats, draftTokens: drafts[0], acceptedDraftTokens: drafts[1] } } : m;
    };
    coder.observe(at(1));
    coder.observe(at(2, [5, 4]));
    coder.observe(at(3, [10, 6]));
    coder.engineStarted();
    coder.observe(at(1, [3, 3]));
    expect(await t.value("keel_engine_draft_tokens_total", '{model="coder"}')).toBe(13);
    expect(await t.value("keel_engine_accepted_draft_tokens_total", '{model="coder"}')).toBe(9);
    expect(await t.value("vllm:spec_decode_num_draft_tokens_total", '{model_name="coder"}')).toBe(13);
    expect(await t.value("vllm:spec_decode_num_accepted_tokens_total", '{model_name="coder"}')).toBe(9);
  });

  it("both names are metric families --metrics_list may name", async () => {
    const { metricFamilies } = await import("./metrics.js");
    expect(metricFamilies()).toEqual(expect.arrayContaining(["keel_engine_preemptions_total", "vllm:num_preemptions_total"]));
  });
});

describe("stepTrace: the TRACE line of one engine step", () => {
  it("counts admissions, prefilled tokens past the prefix cache, sampled and finished requests, and the phase times", () => {
    const msg: StepMessage = {
      ...stepMsg(7, 0),
      batchTokens: 41,
      outputs: [
        { id: "a", tokens: [5], text: "x", admitted: { promptTokens: [1, 2, 3, 4, 5, 6], cachedTokens: 4 } },
        { id: "b", tokens: [], text: "", admitted: { promptTokens: [1, 2, 3], cachedTokens: 9 } },
        { id: "c", tokens: [8], text: "y", finish: { reason: "stop", promptTokens: 2, completionTokens: 3 } },
      ],
      stats: { waiting: 2, running: 3, activeSequences: 3, cachedSequences: 0, prefixCacheHitTokens: 4, phaseUs: { decode: 900, sample: 40, step: 1100 } },
    };
    expect(stepTrace(msg)).toEqual({
      event: "engine_step", step: 7, batchTokens: 41, admitted: 2, prefilledTokens: 2, sampledRequests: 2, finished: 1,
      waiting: 2, running: 3, decodeUs: 900, sampleUs: 40, stepUs: 1100,
    });
  });
});
