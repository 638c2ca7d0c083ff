#!/usr/bin/env node
// Per-step sampling cost: N sequences sampled with node-llama-cpp's async sampleToken one after another
// (LlamaAdapter.sample) against Keel's one synchronous call (LlamaAdapter.sampleMany), on one decoded batch, greedy.
// Needs Keel's addon (node scripts/prepare.mjs builds it) and dist/.
//
//   node bench/sample-many.mjs [--model PATH] [--seqs 16] [--iters 200] [--rounds 3]
import { arg, benchModel, openAdapter } from "./lib.mjs";

const modelPath = await benchModel();
const N = Number(arg("seqs", 16));
const ITERS = Number(arg("iters", 200));
const ROUNDS = Number(arg("rounds", 3));

const a = await openAdapter(modelPath, { sequences: N, contextSize: 128, batchSize: Math.max(256, 2 * N) });
if (!a.sampleMany) {
  console.error(`Keel's addon is not loaded (${a.nativeAddon.reason}); run node scripts/prepare.mjs`);
  process.exit(1);
}
const cfg = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };
const samplers = Array.from({ length: N }, () => a.createSampler(cfg));
// 1. One decode: two tokens per sequence, logits at the last.
const idx = await a.decode(Array.from({ length: N }, (_, i) => ({ slot: i, pos: 0, tokens: [1, 2 + (i % 50)], wantsLogits: true })));
const batch = samplers.map((sampler, i) => ({ batchLogitIndex: idx[i], sampler }));
// 2. Interleaved rounds: sequential async calls, then one synchronous call, on the same logits.
for (let r = 0; r < ROUNDS; r++) {
  let t = performance.now();
  for (let k = 0; k < ITERS; k++) for (const b of batch) await a.sample(b.batchLogitIndex, b.sampler);
  const seq = (performance.now() - t) / ITERS;
  t = performance.now();
  for (let k = 0; k < ITERS; k++) a.sampleMany(batch);
  const many = (performance.now() - t) / ITERS;
  const us = (ms) => ((ms / N) * 1000).toFixed(1);
  console.log(`vocab ${a.vocabSize}, ${N} sequences: sample() x${N} ${seq.toFixed(3)} ms/step (${us(seq)} µs/seq); sampleMany ${many.toFixed(3)} ms/step (${us(many)} µs/seq); ${(seq / many).toFixed(1)}x`);
}
samplers.forEach((s) => s.dispose());
await a.dispose();
