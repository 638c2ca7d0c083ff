/**
 * Gateway gauges against a real `keel serve` (keel-tiny): the vLLM-named gauges that inference gateways scrape and
 * OVMS's families, during a load of live streams and after it (back to 0).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { metrics, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const SEQS = 4;
const MODEL_LEN = 1024;
let server: ServerHandle;

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", String(SEQS), "--max_model_len", String(MODEL_LEN)]);
});
afterAll(async () => {
  await server?.stop();
});

const L = '{model_name="keel-tiny"}';

/** Start a stream that generates to the sequence's capacity; resolves once its first content token arrived. */
async function openStream(signal: AbortSignal): Promise<void> {
  const res = await fetch(server.baseUrl + "/v3/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "go on" }], stream: true, ignore_eos: true }),
    signal,
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let text = "";
  // 1. Read until a chunk with content: the request owns a sequence and its prompt is in the KV cache.
  while (!text.includes('"content":"')) {
    const { value, done } = await reader.read();
    if (done) throw new Error("stream ended before its first token");
    text += new TextDecoder().decode(value);
  }
}

describe("vLLM-named gauges and OVMS families", () => {
  it("a fresh server shows every family at 0 and its KV budget in vllm:cache_config_info", async () => {
    const m = await metrics(server.baseUrl);
    expect(m.get(`vllm:num_requests_waiting${L}`)).toBe(0);
    expect(m.get(`vllm:num_requests_running${L}`)).toBe(0);
    expect(m.get(`vllm:kv_cache_usage_perc${L}`)).toBe(0);
    expect(m.get(`vllm:cache_config_info{model_name="keel-tiny",block_size="1",num_gpu_blocks="${SEQS * MODEL_LEN}",cache_dtype="f16",enable_prefix_caching="true"}`)).toBe(1);
    expect(m.get('ovms_current_graphs{name="keel-tiny"}')).toBe(0);
    expect(m.get('ovms_requests_success{name="keel-tiny"}')).toBe(0);
  });

  it("during a load of live streams the gauges show it, and after the streams end every gauge is back to 0", async () => {
    const before = await metrics(server.baseUrl);
    const ctl = new AbortController();
    // 1. SEQS + 2 streams: SEQS run, 2 wait (each runs to the capacity, so none ends during the scrape).
    const running = Array.from({ length: SEQS }, () => openStream(ctl.signal));
    await Promise.all(running);
    const queued = Array.from({ length: 2 }, () => openStream(ctl.signal).catch(() => undefined));
    const during = await waitForMetrics(server.baseUrl, (m) => m.get(`vllm:num_requests_waiting${L}`) === 2);
    expect(during.get(`vllm:num_requests_running${L}`)).toBe(SEQS);
    expect(during.get('ovms_current_graphs{name="keel-tiny"}')).toBe(SEQS + 2);
    const usage = during.get(`vllm:kv_cache_usage_perc${L}`)!;
    // Every running request holds at least its prompt and first token; all of it fits the budget.
    expect(usage).toBeGreaterThan(0);
    expect(usage).toBeLessThanOrEqual(1);
    expect(usage * SEQS * MODEL_LEN).toBeGreaterThanOrEqual(SEQS * 2);
    // 2. The clients leave: every gauge returns to 0 by itself.
    ctl.abort();
    await Promise.all(queued);
    const after = await waitForMetrics(server.baseUrl, (m) => m.get(`vllm:num_requests_running${L}`) === 0 && m.get(`vllm:num_requests_waiting${L}`) === 0 && m.get(`vllm:kv_cache_usage_perc${L}`) === 0);
    expect(after.get('ovms_current_graphs{name="keel-tiny"}')).toBe(0);
    expect(after.get('ovms_requests_accepted{name="keel-tiny"}')! - before.get('ovms_requests_accepted{name="keel-tiny"}')!).toBe(SEQS + 2);
    const failed = (m: Map<string, number>): number => m.get('ovms_requests_fail{name="keel-tiny"}')!;
    await waitForMetrics(server.baseUrl, (m) => failed(m) - failed(before) === SEQS + 2);
  });

  it("a request that ends by itself counts as an OVMS success, with its processing time in µs", async () => {
    const before = await metrics(server.baseUrl);
    const res = await fetch(server.baseUrl + "/v3/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 5 }) });
    expect(res.status).toBe(200);
    await res.json();
    const after = await metrics(server.baseUrl);
    const d = (k: string): number => after.get(k)! - before.get(k)!;
    expect(d('ovms_requests_success{name="keel-tiny"}')).toBe(1);
    expect(d('ovms_graph_processing_time_us_count{name="keel-tiny"}')).toBe(1);
    expect(d('ovms_graph_processing_time_us_sum{name="keel-tiny"}')).toBeGreaterThan(0);
    expect(after.get(`vllm:kv_cache_usage_perc${L}`)).toBe(0);
  });
});

describe("--metrics_list (OVMS): /metrics exports only the named families", () => {
  it("names from each kind (vLLM gauge, OVMS family, Keel's own) come out; the others do not", async () => {
    const listed = await startServer(["--max_num_seqs", "1", "--metrics_list", "vllm:num_requests_running,ovms_requests_success,keel_engine_steps_total"]);
    try {
      const text = await (await fetch(listed.baseUrl + "/metrics")).text();
      const families = [...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]);
      expect(families.sort()).toEqual(["keel_engine_steps_total", "ovms_requests_success", "vllm:num_requests_running"]);
      expect(text).toContain('vllm:num_requests_running{model_name="keel-tiny"} 0');
    } finally {
      await listed.stop();
    }
  });
});
