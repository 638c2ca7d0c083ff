#!/usr/bin/env node
// Per-step sampling cost of Keel's one synchronous call (LlamaAdapter.sampleMany) on one decoded batch of N sequences,
// per sampler config: greedy (node-llama-cpp's async sampleToken one after another against sampleMany), and sampled
// configs (temperature > 0) through node-llama-cpp's chain against Keel's fused path (keelSamplingOptions({ fused })),
// same logits, same seeds (reseeded per iteration as the engine reseeds per position), interleaved rounds; the modes
// must pick the same tokens (a mismatch is reported and fails the run). With --threads T > 1 a third mode samples
// the fused/fast paths on T threads (sampleMany's `threads`, the engine's thread count). Needs Keel's addon
// (node scripts/prepare.mjs builds it) and dist/.
//
//   node bench/sample-many.mjs [--model PATH] [--seqs 8,32,64] [--iters 50] [--rounds 3] [--configs greedy,ban128,k40,p95,temp]
//                              [--threads T]
import { arg, benchModel, median, openAdapter } from "./lib.mjs";

const modelPath = await benchModel();
const SEQS = String(arg("seqs", "8,32,64")).split(",").map(Number);
const ITERS = Number(arg("iters", 50));
const ROUNDS = Number(arg("rounds", 3));
const base = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };
const CONFIGS = {
  greedy: base,
  // Greedy with 128 tokens banned, as bench/compare.mjs sends to the keel-tiny models (the bias path of the fast greedy).
  ban128: { ...base, bias: new Map(Array.from({ length: 128 }, (_, i) => [1000 + 7 * i, -Infinity])) },
  k40: { ...base, temperature: 0.8, topP: 0.95, topK: 40 },
  p95: { ...base, temperature: 0.8, topP: 0.95 },
  temp: { ...base, temperature: 0.8 },
};
const chosen = String(arg("configs", "greedy,k40,p95,temp")).split(",");
const THREADS = Number(arg("threads", 1));
const MAXN = Math.max(...SEQS);
const TEXTS = ["Write a function that parses a CSV line in Python.", "The river in the morning was", "Explain how a hash map works:", "def fibonacci(n):", "Once upon a time, in a small town,", "SELECT name FROM users WHERE"];

const a = await openAdapter(modelPath, { sequences: MAXN, contextSize: 128, batchSize: Math.max(512, 24 * MAXN), threads: THREADS });
/** sampleMany's thread count (the adapter passes the engine's threads; the bench switches it per mode). */
const samplerThreads = (t) => (a.samplers.threads = t);
if (!a.sampleMany) {
  console.error(`Keel's addon is not loaded (${a.nativeAddon.reason}); run node scripts/prepare.mjs`);
  process.exit(1);
}
const bindings = a.llama._bindings;
if (typeof bindings.keelSamplingOptions !== "function") {
  console.error("Keel's addon has no keelSamplingOptions (rebuild: node scripts/build-native.mjs)");
  process.exit(1);
}
// 1. One decode of MAXN real prompts (different texts and lengths), logits at each last token.
const prompts = Array.from({ length: MAXN }, (_, i) => a.tokenize(`${TEXTS[i % TEXTS.length]} (${i})`));
const idx = await a.decode(prompts.map((tokens, slot) => ({ slot, pos: 0, tokens, wantsLogits: true })));
let mismatches = 0;
for (const name of chosen) {
  const cfg = CONFIGS[name];
  if (!cfg) throw new Error(`unknown config ${name} (${Object.keys(CONFIGS).join(", ")})`);
  for (const N of SEQS) {
    const samplers = Array.from({ length: N }, () => a.createSampler(cfg));
    const batch = samplers.map((sampler, i) => ({ batchLogitIndex: idx[i], sampler }));
    // 2. ms per step of one mode: reconfigure (untimed: a new seed per iteration, as per position), then sample.
    const step = async (mode) => {
      let ms = 0;
      let cpuMs = 0;
      const tokens = [];
      for (let k = 0; k < ITERS; k++) {
        if (cfg.temperature > 0) samplers.forEach((s, i) => s.configure({ ...cfg, seed: 1000 * k + i }));
        if (mode === "single") {
          const t = performance.now();
          for (const b of batch) tokens.push(await a.sample(b.batchLogitIndex, b.sampler));
          ms += performance.now() - t;
        } else {
          bindings.keelSamplingOptions({ fused: mode !== "chain" });
          samplerThreads(mode === "threads" ? THREADS : 1);
          const c = process.cpuUsage();
          const t = performance.now();
          const got = a.sampleMany(batch);
          ms += performance.now() - t;
          const dc = process.cpuUsage(c);
          cpuMs += (dc.user + dc.system) / 1000;
          tokens.push(...got);
        }
      }
      bindings.keelSamplingOptions({ fused: true });
      samplerThreads(THREADS);
      return { ms: ms / ITERS, cpuMs: cpuMs / ITERS, tokens };
    };
    const modes = [cfg.temperature > 0 ? "chain" : "single", "fused", ...(THREADS > 1 ? ["threads"] : [])];
    const times = Object.fromEntries(modes.map((m) => [m, []]));
    const cpu = Object.fromEntries(modes.map((m) => [m, []]));
    for (let r = 0; r < ROUNDS; r++) {
      const runs = [];
      for (const m of modes) {
        const x = await step(m);
        times[m].push(x.ms);
        cpu[m].push(x.cpuMs);
        runs.push(x.tokens.join());
      }
      if (new Set(runs).size !== 1) mismatches++;
    }
    const us = (ms) => ((ms / N) * 1000).toFixed(1);
    const med = Object.fromEntries(modes.map((m) => [m, median(times[m])]));
    const names = { single: "sample() x N", chain: "chain", fused: cfg.temperature > 0 ? "fused" : "sampleMany", threads: `${THREADS} threads` };
    const parts = modes.map((m, i) => `${names[m]} ${us(med[m])}${i === 0 ? "" : ` (${(med[modes[0]] / med[m]).toFixed(1)}x)`}`);
    // Process CPU time of the call (all threads): on a shared machine it is steadier than wall time (not for sample(),
    // whose work runs on libuv workers around event-loop turns).
    const cpuParts = modes.filter((m) => m !== "single").map((m) => `${names[m]} ${us(median(cpu[m]))}`);
    console.log(`vocab ${a.vocabSize} ${name.padEnd(6)} ${String(N).padStart(2)} seqs, wall µs/seq: ${parts.join(", ")}; CPU µs/seq: ${cpuParts.join(", ")}; medians of ${ROUNDS}`);
    samplers.forEach((s) => s.dispose());
  }
}
console.log(`counts ${JSON.stringify(bindings.keelSamplingCounts())}; token mismatches between the modes: ${mismatches}`);
await a.dispose();
if (mismatches > 0) process.exit(1);
