/**
 * Disconnect storm under saturation (public failure recipes: OVMS #4428, ik_llama.cpp #1929, llama.cpp #11414, Ollama #11889, vLLM #42157, SGLang #36876, LMDeploy #1788, node-llama-cpp #623), end to end:
 * 4 sequences, a small prefill budget, a long shared system prompt (prefix reuse active), 16 concurrent clients,
 * 240 requests, about a third hard-closed (FIN or RST) at random phases — before headers, at admission (prefill),
 * mid-decode, at the instant of natural finish (max_tokens 1–2) — and the rest compared with control runs.
 *
 * Asserts the invariants of docs/design-rules.md: the same process, every bystander identical to its control, back
 * to baseline (sequences, queue and KV; every abort applied within 2 engine steps), one terminal record per aborted
 * request, and that the metrics show queueing, prefix-cache hits and disconnects happened. No timing expectations (those are in bench/).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildTinyRecurrentModel } from "../../src/model/tiny-recurrent-model.js";
import { chat, type ChatResult, type CloseMode } from "../support/chat-client.js";
import { hybridModel } from "../support/openvino.js";
import { get, metrics, startServer, waitForMetrics, type EngineUnderTest, type ServerHandle } from "../support/server.js";

const SYSTEM = Array.from({ length: 12 }, (_, i) => `Rule ${i + 1}: answer briefly, keep the queue moving, and never drop a request.`).join(" ");
const QUESTIONS = [
  "What is a queue?",
  "Describe the river in the morning.",
  "Tell a story about a fox.",
  "Why do requests get cancelled?",
  "How is memory measured?",
  "Explain prefill and decode.",
  "What is a KV cache?",
  "Write a line of JSON.",
];
const MAX_TOKENS = [1, 2, 8, 24];
const TOTAL = 240;
const CONCURRENCY = 16;

/** Deterministic PRNG (mulberry32) so a failing storm can be replayed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const body = (q: string, maxTokens: number) => ({
  model: "keel-tiny",
  messages: [
    { role: "system", content: SYSTEM },
    { role: "user", content: q },
  ],
  temperature: 0,
  ignore_eos: true,
  max_tokens: maxTokens,
  stream: true,
});

const key = (q: string, n: number) => `${n}|${q}`;

type Plan = { q: string; n: number; victim: null | { at: "sent" | "admitted" | "chunk" | "finish"; chunk: number; mode: CloseMode } };

/** The models the storm runs on: the embedded attention model, and a hybrid (attention + Mamba) model whose
 * recurrent state the scheduler must never trim partially (docs/design-rules.md: recurrent state is never partially evicted). */
const MODELS: { name: string; flags: () => string[] | Promise<string[]>; recurrent: boolean; engine?: EngineUnderTest; maxTokens?: number[] }[] = [
  { name: "keel-tiny (attention)", flags: () => [], recurrent: false },
  // OpenVINO's shared paged pool, smaller than the load: 26 blocks of 32 tokens hold two ~385-token requests, and
  // decoding up to 64 tokens each outgrows it, so OpenVINO preempts (prefix caching off: shared prefix blocks would
  // leave room). The bystanders must still equal their controls (issue #11).
  { name: "keel-tiny-f16 on OpenVINO (26-block pool: preemption)", engine: "openvino", recurrent: false, maxTokens: [1, 2, 24, 64], flags: () => ["--model_name", "keel-tiny", "--num_kv_blocks", "26", "--enable_prefix_caching", "false"] },
  // The tiny hybrid (Gated DeltaNet + attention) IR on OpenVINO with the seed's flags; 45 blocks of 32 tokens hold
  // two ~700-token requests, whose growth to 64 tokens outgrows it: the worker preempts whole (hybrid_guard.py).
  {
    name: "tiny hybrid IR (linear attention) on OpenVINO, seed's flags (45-block pool: preemption)",
    engine: "openvino",
    recurrent: true,
    maxTokens: [1, 2, 24, 64],
    flags: async () => ["--model_path", await hybridModel(), "--model_name", "keel-tiny", "--num_kv_blocks", "45", "--enable_prefix_caching", "true", "--cache_interval_multiplier", "64"],
  },
  {
    name: "tiny jamba (hybrid: attention + Mamba)",
    recurrent: true,
    flags: () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-jamba-"));
      const file = path.join(dir, "tiny-jamba.gguf");
      fs.writeFileSync(file, buildTinyRecurrentModel({ arch: "jamba" }));
      return ["--model_path", file, "--model_name", "keel-tiny"];
    },
  },
];

for (const model of MODELS) describe(`disconnect storm under saturation — ${model.name}`, () => {
  let server: ServerHandle;
  const control = new Map<string, string>();

  beforeAll(async () => {
    server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "32", "--max_queued_requests", "1000", ...(await model.flags())], {}, { engine: model.engine ?? "llama.cpp" });
    for (const q of QUESTIONS) {
      for (const n of model.maxTokens ?? MAX_TOKENS) {
        const r = await chat(server.baseUrl, body(q, n));
        expect(r.done).toBe(true);
        control.set(key(q, n), r.text);
      }
    }
  });

  afterAll(async () => {
    await server?.stop();
  });

  it(`${TOTAL} requests at concurrency ${CONCURRENCY}, a third hard-closed at random phases: bystanders identical, nothing leaks`, async () => {
    const rand = prng(20261201);
    const plans: Plan[] = Array.from({ length: TOTAL }, () => {
      const q = QUESTIONS[Math.floor(rand() * QUESTIONS.length)]!;
      const lengths = model.maxTokens ?? MAX_TOKENS;
      const n = lengths[Math.floor(rand() * lengths.length)]!;
      if (rand() >= 1 / 3) return { q, n, victim: null };
      const kinds = ["sent", "admitted", "chunk", "finish"] as const;
      const at = kinds[Math.floor(rand() * kinds.length)]!;
      return { q, n, victim: { at, chunk: 1 + Math.floor(rand() * 6), mode: rand() < 0.5 ? "fin" : "rst" } };
    });
    const before = await metrics(server.baseUrl);
    const pid = server.proc.pid;

    // Watch the queue while the storm runs (observation only).
    let maxWaiting = 0;
    let storming = true;
    const watcher = (async () => {
      while (storming) {
        const m = await metrics(server.baseUrl);
        maxWaiting = Math.max(maxWaiting, m.get("keel_requests_waiting") ?? 0);
      }
    })();

    const results: { plan: Plan; r: ChatResult }[] = [];
    let next = 0;
    async function worker(): Promise<void> {
      while (next < plans.length) {
        const plan = plans[next++]!;
        const v = plan.victim;
        const r = await chat(server.baseUrl, body(plan.q, plan.n), {
          onSent: (ctl) => v?.at === "sent" && ctl.close(v.mode),
          onEvent: (_e, i, ctl) => {
            if (!v) return;
            if (v.at === "admitted" && i === 0) ctl.close(v.mode);
            if (v.at === "chunk" && i === v.chunk) ctl.close(v.mode);
            // max_tokens 1–2: the first content chunk is also the moment of natural finish.
            if (v.at === "finish" && i === 1) ctl.close(v.mode);
          },
        });
        results.push({ plan, r });
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));
    storming = false;
    await watcher;

    // Bystanders exact: every bystander, and every victim that happened to finish before its close, equals its control.
    let bystanders = 0;
    for (const { plan, r } of results) {
      if (r.closedByClient) continue;
      bystanders += 1;
      expect(r.status, `${plan.q} n=${plan.n}`).toBe(200);
      expect(r.done).toBe(true);
      expect(r.text, `${plan.q} n=${plan.n}`).toBe(control.get(key(plan.q, plan.n)));
    }
    const closed = results.filter((x) => x.r.closedByClient).length;
    expect(bystanders + closed).toBe(TOTAL);
    expect(closed).toBeGreaterThan(TOTAL / 5);

    // Same process, ready, everything back to baseline.
    expect(server.proc.exitCode).toBeNull();
    expect(server.proc.pid).toBe(pid);
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    const after = await waitForMetrics(
      server.baseUrl,
      (m) => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0 && m.get("keel_engine_sequences_active") === 0,
    );

    // Metrics show the regime we meant to test: queueing, prefix reuse, disconnects in several phases.
    expect(maxWaiting).toBeGreaterThan(0);
    // The attention model reuses shared prefixes; the hybrid one only reuses a cache that is a full prefix of the
    // new prompt (rare here), so for it the bystander equality above is what proves the state was never trimmed.
    // OpenVINO does not say which tokens its prefix cache saved (reported as 0); what it must show is preemption.
    if (!model.recurrent && model.engine !== "openvino") expect(after.get("keel_prefix_cache_hit_tokens_total")!).toBeGreaterThan(before.get("keel_prefix_cache_hit_tokens_total")!);
    if (model.engine === "openvino") expect(after.get("keel_engine_preemptions_total{model=\"keel-tiny\"}")!).toBeGreaterThan(before.get("keel_engine_preemptions_total{model=\"keel-tiny\"}") ?? 0);
    // On the hybrid IR every preemption is the worker's own, whole (OpenVINO never preempts a hybrid sequence itself).
    if (model.engine === "openvino" && model.recurrent) expect(server.logs.some((l) => l.includes('"event":"hybrid_ov_preempted"'))).toBe(false);
    const delta = (p: string) => after.get(`keel_client_disconnects_total{phase="${p}"}`)! - before.get(`keel_client_disconnects_total{phase="${p}"}`)!;
    expect(delta("queued") + delta("prefill") + delta("decode")).toBeGreaterThan(TOTAL / 10);
    expect([delta("queued"), delta("prefill"), delta("decode")].filter((d) => d > 0).length).toBeGreaterThanOrEqual(2);

    // Abort latency in engine steps and one terminal record: every request has exactly one terminal record (its one
    // INFO line), and each aborted one says its client went away and was released within 2 steps of its abort.
    const records = server.logs
      .map((l) => {
        try {
          return JSON.parse(l) as { event?: string; requestId?: string; finishReason?: string; clientGone?: boolean; abortLatencySteps?: number };
        } catch {
          return {};
        }
      })
      .filter((j) => j.event === "request_done");
    const ids = records.map((a) => a.requestId);
    expect(new Set(ids).size).toBe(ids.length);
    const aborted = records.filter((r) => r.finishReason === "abort");
    for (const a of aborted) expect(a.clientGone, a.requestId).toBe(true);
    expect(aborted.length).toBe(after.get('keel_requests_finished_total{finish_reason="abort"}')!);
    for (const a of aborted) expect(a.abortLatencySteps, a.requestId).toBeLessThanOrEqual(2);

    // A fresh request succeeds: it still gives its control text.
    const fresh = await chat(server.baseUrl, body(QUESTIONS[0]!, 24));
    expect(fresh.text).toBe(control.get(key(QUESTIONS[0]!, 24)));
  });
});
