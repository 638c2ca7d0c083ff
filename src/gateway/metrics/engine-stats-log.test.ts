/**
 * The periodic engine line: one INFO line per busy model at each tick, with the interval's prompt and generation
 * rates, running/waiting, KV usage and prefix-cache hit rate; nothing while idle. A fake clock and a fake ticker drive
 * it (no real waiting); the tokens come from a real StepObserver fed step messages.
 */
import pino from "pino";
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type RequestOutput, type StepMessage } from "../../protocol/messages.js";
import { startEngineStatsLog, type EngineStatsSource, type Ticker } from "./engine-stats-log.js";
import { Metrics } from "./metrics.js";
import { StepObserver } from "./metrics-observer.js";

const step = (n: number, outputs: RequestOutput[]): StepMessage => ({
  v: PROTOCOL_VERSION,
  type: "step",
  step: n,
  batchTokens: 1,
  outputs,
  stats: { waiting: 0, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0 },
});

function setup() {
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: "info" }, { write: (l: string) => void lines.push(JSON.parse(l)) });
  const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
  const steps = new StepObserver(metrics, "tiny");
  let counts = { waiting: 0, running: 0 };
  let kv = 0;
  const source: EngineStatsSource = { modelName: "tiny", processed: steps.processed, counts: () => counts, kvUsage: () => kv };
  let clock = 1_000_000;
  let tick: (() => void) | null = null;
  let intervalMs = 0;
  const ticker: Ticker = {
    every(ms, fn) {
      intervalMs = ms;
      tick = fn;
      return () => void (tick = null);
    },
  };
  const stop = startEngineStatsLog(log, () => [source], { ticker, now: () => clock });
  return {
    lines,
    steps,
    stop,
    intervalMs: () => intervalMs,
    set(c: { waiting: number; running: number }, kvUsage: number) {
      counts = c;
      kv = kvUsage;
    },
    /** Move the clock by `ms` and run the tick the ticker was given (if it still runs). */
    elapse(ms: number) {
      clock += ms;
      tick?.();
    },
    ticking: () => tick !== null,
  };
}

describe("the periodic engine line", () => {
  it("ticks every 5 s; while busy one line with the interval's rates, the counts, KV usage and prefix-cache hits", () => {
    const t = setup();
    expect(t.intervalMs()).toBe(5000);
    // Two admissions (100 prompt tokens, 40 of them from the prefix cache) and 50 generated tokens in 5 s.
    t.steps.observe(step(1, [{ id: "a", tokens: [], text: "", admitted: { promptTokens: Array(60).fill(1), cachedTokens: 40 } }, { id: "b", tokens: [], text: "", admitted: { promptTokens: Array(40).fill(1), cachedTokens: 0 } }]));
    for (let i = 2; i <= 26; i++) t.steps.observe(step(i, [{ id: "a", tokens: [i], text: "x" }, { id: "b", tokens: [i], text: "y" }]));
    t.set({ waiting: 1, running: 2 }, 0.125);
    t.elapse(5000);
    expect(t.lines).toEqual([
      expect.objectContaining({
        level: 30,
        event: "engine_stats",
        model: "tiny",
        promptTokPerS: 12,
        genTokPerS: 10,
        running: 2,
        waiting: 1,
        kvUsagePct: 12.5,
        prefixCacheHitPct: 40,
        intervalS: 5,
        msg: "tiny: prompt 12 tok/s, generation 10 tok/s, running 2, waiting 1, KV cache 12.5%, prefix cache hits 40%",
      }),
    ]);
  });

  it("is silent while idle, and says a burst that ended within the interval once", () => {
    const t = setup();
    t.elapse(5000);
    t.elapse(5000);
    expect(t.lines).toEqual([]);
    // A request ran and finished between two ticks: nothing is running at the tick, but its tokens are reported.
    t.steps.observe(step(1, [{ id: "a", tokens: [1, 2, 3, 4, 5], text: "x" }]));
    t.elapse(5000);
    t.elapse(5000);
    expect(t.lines).toEqual([expect.objectContaining({ genTokPerS: 1, promptTokPerS: 0, running: 0, waiting: 0, prefixCacheHitPct: null })]);
  });

  it("a request that waits without progress keeps the line coming (running or waiting is busy)", () => {
    const t = setup();
    t.set({ waiting: 3, running: 0 }, 0);
    t.elapse(5000);
    t.elapse(5000);
    expect(t.lines.map((l) => [l["waiting"], l["genTokPerS"]])).toEqual([
      [3, 0],
      [3, 0],
    ]);
  });

  it("rates are over the time since the last tick, and stop() ends the ticks", () => {
    const t = setup();
    t.steps.observe(step(1, Array.from({ length: 20 }, (_, i) => ({ id: `r${i}`, tokens: [1], text: "" }))));
    t.elapse(2000); // a late or early tick: the rate is over what really elapsed
    expect(t.lines).toEqual([expect.objectContaining({ genTokPerS: 10, intervalS: 2 })]);
    t.stop();
    expect(t.ticking()).toBe(false);
  });
});
