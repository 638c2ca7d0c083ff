import pino from "pino";
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type StepMessage } from "../../protocol/messages.js";
import { Metrics } from "./metrics.js";
import { registryObserver, StepObserver } from "./metrics-observer.js";

function setup() {
  const lines: { level: number; event?: string; requestId?: string; [k: string]: unknown }[] = [];
  const log = pino({ level: "info" }, { write: (l: string) => void lines.push(JSON.parse(l)) });
  const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
  const value = async (name: string, labels = ""): Promise<number> => {
    const text = await metrics.registry.getSingleMetricAsString(name);
    const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `));
    return Number(line?.split(" ")[1]);
  };
  return { lines, metrics, value, observer: registryObserver(metrics, log, () => 4) };
}

const stepMsg = (step: number, hits: number, active = 1): StepMessage => ({
  v: PROTOCOL_VERSION,
  type: "step",
  step,
  batchTokens: 1,
  outputs: [],
  stats: { waiting: 0, running: 1, activeSequences: active, cachedSequences: 2, prefixCacheHitTokens: hits },
});

describe("registryObserver: every registry hook reaches metrics and the log", () => {
  it("an internal error while serving one request is logged at error level with its request id", () => {
    const t = setup();
    t.observer.onInternalError!("req-1", "sink failed: boom");
    expect(t.lines).toEqual([expect.objectContaining({ level: 50, event: "internal_error", requestId: "req-1", error: "sink failed: boom" })]);
  });

  it("cancel, culprit, resume and refusal are logged with the request id", async () => {
    const t = setup();
    t.observer.onCancel!("a", "decode", "client_disconnect");
    t.observer.onCulprit!("b", 3);
    t.observer.onResumed!("c", 5, 1);
    t.observer.onRefused!("d", "context_length_exceeded");
    expect(t.lines.map((l) => [l.event, l.requestId])).toEqual([
      ["cancelled", "a"],
      ["culprit_isolated", "b"],
      ["resumed", "c"],
      ["rejected", "d"],
    ]);
    expect(await t.value("keel_requests_resumed_total")).toBe(1);
    expect(await t.value("keel_requests_rejected_total", '{reason="invalid_request"}')).toBe(1);
  });

  it("a finished request counts by reason; errors count by cause", async () => {
    const t = setup();
    t.observer.onFinished!("a", "error", { promptTokens: 3, completionTokens: 2 }, { phase: "decode", errorCode: "engine_fault", error: "x", e2eMs: 10 });
    t.observer.onFinished!("b", "error", { promptTokens: 1, completionTokens: 0 }, { phase: "queued", errorCode: "shutting_down", error: "y", e2eMs: 5 });
    t.observer.onFinished!("c", "stop", { promptTokens: 4, completionTokens: 6 }, { phase: "decode", e2eMs: 7 });
    expect(await t.value("keel_requests_finished_total", '{finish_reason="error"}')).toBe(2);
    expect(await t.value("keel_requests_failed_total", '{reason="engine_fault"}')).toBe(1);
    expect(await t.value("keel_requests_failed_total", '{reason="shutdown"}')).toBe(1);
    expect(await t.value("keel_prompt_tokens_total")).toBe(8);
    expect(await t.value("keel_generation_tokens_total")).toBe(8);
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

  it("both names are metric families --metrics_list may name", async () => {
    const { metricFamilies } = await import("./metrics.js");
    expect(metricFamilies()).toEqual(expect.arrayContaining(["keel_engine_preemptions_total", "vllm:num_preemptions_total"]));
  });
});
