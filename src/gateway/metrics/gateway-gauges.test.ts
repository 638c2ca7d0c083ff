import pino from "pino";
import client from "prom-client";
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type StepMessage } from "../../protocol/messages.js";
import { Scheduler } from "../../engine/scheduler.js";
import { kvUsage, LAG_COLLECT_MIN_MS, Metrics, spaceLagCollects, type ModelGauges } from "./metrics.js";
import { requestObserver, StepObserver } from "./metrics-observer.js";

/** Metrics whose per-model gauges read `models` (mutable between scrapes). */
function setup(models: ModelGauges[]) {
  const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0, models: () => models });
  /** Series lines of metric `name` (a histogram's by `family`). */
  const series = async (name: string, family = name): Promise<string[]> => (await metrics.registry.getSingleMetricAsString(family)).split("\n").filter((l) => l.startsWith(name));
  return { metrics, series };
}

const model = (over: Partial<ModelGauges>): ModelGauges => ({ modelName: "m", waiting: 0, running: 0, kvTokensInUse: 0, kvTokenCapacity: 0, cacheDtype: "f16", prefixCaching: true, ...over });

describe("gateway gauges under vLLM and OVMS names, one series per model", () => {
  it("two models: waiting, running, KV usage and cache config each carry model_name", async () => {
    const models = [model({ modelName: "a", waiting: 3, running: 2, kvTokensInUse: 512, kvTokenCapacity: 2048 }), model({ modelName: "b", running: 1, kvTokensInUse: 10, kvTokenCapacity: 40, cacheDtype: "q8_0", prefixCaching: false })];
    const t = setup(models);
    expect(await t.series("vllm:num_requests_waiting")).toEqual(['vllm:num_requests_waiting{model_name="a"} 3', 'vllm:num_requests_waiting{model_name="b"} 0']);
    expect(await t.series("vllm:num_requests_running")).toEqual(['vllm:num_requests_running{model_name="a"} 2', 'vllm:num_requests_running{model_name="b"} 1']);
    expect(await t.series("vllm:kv_cache_usage_perc")).toEqual(['vllm:kv_cache_usage_perc{model_name="a"} 0.25', 'vllm:kv_cache_usage_perc{model_name="b"} 0.25']);
    expect(await t.series("vllm:cache_config_info")).toEqual([
      'vllm:cache_config_info{model_name="a",block_size="1",num_gpu_blocks="2048",cache_dtype="f16",enable_prefix_caching="true"} 1',
      'vllm:cache_config_info{model_name="b",block_size="1",num_gpu_blocks="40",cache_dtype="q8_0",enable_prefix_caching="false"} 1',
    ]);
    expect(await t.series("ovms_current_graphs")).toEqual(['ovms_current_graphs{name="a"} 5', 'ovms_current_graphs{name="b"} 1']);
  });

  it("a model that goes away leaves no series; one without a ready engine has no cache config yet", async () => {
    const models = [model({ modelName: "a", kvTokenCapacity: 100 }), model({ modelName: "b" })];
    const t = setup(models);
    expect(await t.series("vllm:cache_config_info")).toHaveLength(1);
    models.splice(0, 1);
    expect(await t.series("vllm:num_requests_running")).toEqual(['vllm:num_requests_running{model_name="b"} 0']);
    expect(await t.series("vllm:cache_config_info")).toEqual([]);
  });

  it("linear-attention blocks (in use, pool) only for a model that reports them", async () => {
    const t = setup([model({ modelName: "hybrid", linearAttentionBlocks: { inUse: 3, total: 19 } }), model({ modelName: "dense" })]);
    expect(await t.series("keel_engine_linear_attention_blocks_in_use")).toEqual(['keel_engine_linear_attention_blocks_in_use{model="hybrid"} 3']);
    expect(await t.series("keel_engine_linear_attention_blocks_capacity")).toEqual(['keel_engine_linear_attention_blocks_capacity{model="hybrid"} 19']);
  });

  it("kvUsage is bounded to 0..1 and 0 without a budget", () => {
    expect(kvUsage({ kvTokensInUse: 5, kvTokenCapacity: 0 })).toBe(0);
    expect(kvUsage({ kvTokensInUse: 30, kvTokenCapacity: 20 })).toBe(1);
    expect(kvUsage({ kvTokensInUse: 5, kvTokenCapacity: 20 })).toBe(0.25);
  });
});

describe("OVMS request families follow the registry", () => {
  it("accepted on queue; success for stop/length, fail for error/abort; processing time in µs", async () => {
    const t = setup([]);
    const log = pino({ level: "silent" });
    const observe = requestObserver(t.metrics, log, () => 0, "m1");
    expect(await t.series("ovms_requests_success")).toEqual(['ovms_requests_success{name="m1"} 0']);
    const info = (e2eMs: number) => ({ phase: "decode" as const, e2eMs, released: false, refused: false });
    const usage = { promptTokens: 1, completionTokens: 1 };
    for (const id of ["a", "b", "c", "d"]) observe({ type: "queued", id });
    observe({ type: "finished", id: "a", reason: "stop", usage, ...info(2) });
    observe({ type: "finished", id: "b", reason: "length", usage, ...info(2) });
    observe({ type: "finished", id: "c", reason: "error", usage, ...info(2), error: { code: "engine_error", message: "x" } });
    observe({ type: "finished", id: "d", reason: "abort", usage, ...info(2) });
    observe({ type: "finished", id: "e", reason: "error", usage, ...info(2), refused: true, error: { code: "context_length_exceeded", message: "too long" } });
    expect(await t.series("ovms_requests_accepted")).toEqual(['ovms_requests_accepted{name="m1"} 4']);
    expect(await t.series("ovms_requests_success")).toEqual(['ovms_requests_success{name="m1"} 2']);
    expect(await t.series("ovms_requests_fail")).toEqual(['ovms_requests_fail{name="m1"} 2']);
    expect(await t.series("ovms_requests_rejected")).toEqual(['ovms_requests_rejected{name="m1"} 1']);
    expect(await t.series("ovms_graph_processing_time_us_sum", "ovms_graph_processing_time_us")).toEqual(['ovms_graph_processing_time_us_sum{name="m1"} 8000']);
  });
});

describe("KV cells in use: scheduler → step stats → StepObserver", () => {
  it("counts tokens in live requests' slots, not idle prefix-cache KV, and returns to 0", () => {
    const s = new Scheduler({ maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 32, prefixCaching: true });
    const add = (id: string, n: number): void => void s.add({ id, inputTokens: Array.from({ length: n }, (_, i) => 10 + i), promptLength: n, maxNewTokens: 4, ignoreEos: true });
    add("a", 5);
    add("b", 3);
    expect(s.kvTokensInUse).toBe(0); // waiting: nothing in any slot yet
    const step = (): void => {
      const plan = s.schedule();
      s.commit(plan, plan.items.filter((it) => it.wantsLogits).map((it) => ({ id: it.id, token: 1 })), () => false);
    };
    step(); // both prompts prefilled
    expect(s.kvTokensInUse).toBe(8);
    step(); // each decodes its first sampled token (the prefill sampled it; it goes into the KV now)
    expect(s.kvTokensInUse).toBe(10);
    step(); // the second sampled token goes in: 12
    expect(s.kvTokensInUse).toBe(12);
    step(); // max 4 new tokens: both finish; their KV stays as prefix cache, not in use
    expect(s.runningCount).toBe(0);
    expect(s.cachedSlots).toBe(2);
    expect(s.kvTokensInUse).toBe(0);

    const t = setup([]);
    const steps = new StepObserver(t.metrics);
    const msg = (kv: number | undefined): StepMessage => ({ v: PROTOCOL_VERSION, type: "step", step: 1, batchTokens: 1, outputs: [], stats: { waiting: 0, running: 1, activeSequences: 1, cachedSequences: 0, prefixCacheHitTokens: 0, ...(kv === undefined ? {} : { kvTokensInUse: kv }) } });
    steps.observe(msg(42));
    expect(steps.kvTokensInUse).toBe(42);
    steps.engineGone();
    expect(steps.kvTokensInUse).toBe(0);
    steps.observe(msg(7));
    steps.observe(msg(undefined)); // an engine that does not report it
    expect(steps.kvTokensInUse).toBe(0);
  });
});

describe("process metrics (prom-client's default set)", () => {
  /** The value of the first sample of `name` in a /metrics text. */
  const value = (text: string, name: string): number => Number(text.split("\n").find((l) => l.startsWith(name + " "))?.split(" ")[1]);

  it("every gateway exports the process's RSS and V8 heap, read at scrape time from the one shared collector", async () => {
    for (const t of [setup([]), setup([])]) {
      const text = await t.metrics.text();
      // This test process's own figures: a live Node process holds megabytes of each, and its heap is inside its RSS.
      expect(value(text, "process_resident_memory_bytes")).toBeGreaterThan(1e6);
      expect(value(text, "nodejs_heap_size_used_bytes")).toBeGreaterThan(1e6);
      expect(value(text, "nodejs_heap_size_used_bytes")).toBeLessThan(value(text, "process_resident_memory_bytes"));
      expect(text).toMatch(/^nodejs_heap_space_size_used_bytes\{space="old"\} [1-9]/m);
    }
  });

  it("contract: prom-client fills nodejs_heap_size_used_bytes from its sibling's collect, so --metrics_list is cut from a whole scrape", async () => {
    // Upstream, on a registry of its own: the family read alone is 0 (docs/upstream.md).
    const bare = new client.Registry();
    client.collectDefaultMetrics({ register: bare });
    expect(value(await bare.getSingleMetricAsString("nodejs_heap_size_used_bytes"), "nodejs_heap_size_used_bytes")).toBe(0);
    // Keel's listed scrape: the real figure, each listed family once (HELP, TYPE, samples), nothing else.
    const listed = await setup([]).metrics.text(["nodejs_heap_size_used_bytes", "keel_engine_steps_total"]);
    expect(value(listed, "nodejs_heap_size_used_bytes")).toBeGreaterThan(1e6);
    expect(value(listed, "keel_engine_steps_total")).toBe(0);
    expect(listed.split("\n").filter((l) => l.startsWith("# TYPE")).sort()).toEqual(["# TYPE keel_engine_steps_total counter", "# TYPE nodejs_heap_size_used_bytes gauge"]);
  });

  it("contract: prom-client's lag collect exports an empty delay histogram (no sample since the last collect's reset) as NaN", async () => {
    type Collecting = client.Metric & { collect(): unknown };
    // Two collects with no event-loop turn between them: the second reads a histogram with no sample.
    const bare = new client.Registry();
    client.collectDefaultMetrics({ register: bare });
    const lag = bare.getSingleMetric("nodejs_eventloop_lag_seconds") as Collecting;
    lag.collect();
    lag.collect();
    expect((await bare.getSingleMetricAsString("nodejs_eventloop_lag_mean_seconds")).split("\n").at(-1)).toBe("nodejs_eventloop_lag_mean_seconds Nan");
  });

  it("Keel's lag collect runs at most once a second (by the clock it is given); the calls between keep the last values", () => {
    const reg = new client.Registry();
    let calls = 0;
    new client.Gauge({ name: "nodejs_eventloop_lag_seconds", help: "h", registers: [reg], collect: () => void (calls += 1) });
    let t = 0;
    spaceLagCollects(reg, () => t);
    const lag = reg.getSingleMetric("nodejs_eventloop_lag_seconds") as client.Metric & { collect(): unknown };
    const seen: number[] = [];
    for (t of [0, 500, LAG_COLLECT_MIN_MS - 1, LAG_COLLECT_MIN_MS, LAG_COLLECT_MIN_MS + 10, 2 * LAG_COLLECT_MIN_MS + 5]) {
      lag.collect();
      seen.push(calls);
    }
    expect(seen).toEqual([1, 1, 1, 2, 2, 3]);
  });
});
