#!/usr/bin/env node
// Benchmark: engine throughput (tok/s) for --engine_threads values at several concurrencies, straight into the
// step loop (no HTTP). Prints a table and the ratio of each thread count to threads=1. Does not assert.
// Usage: npm run build && node bench/threads.mjs [threads...]
import { LlamaAdapter } from "../dist/engine/llama/adapter.js";
import { StepLoop } from "../dist/engine/step-loop.js";
import { ensureDefaultModel } from "../dist/model/default-model.js";

const threadCounts = process.argv.slice(2).map(Number).filter(Boolean);
const THREADS = threadCounts.length ? threadCounts : [1, 2];
const CONCURRENCY = [1, 4, 8];
const TOKENS = 128;
const modelPath = await ensureDefaultModel();

async function run(threads, concurrency) {
  const adapter = await LlamaAdapter.open({ modelPath, sequences: 8, contextSize: 1024, batchSize: 256, threads, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
  let finished = 0;
  let tokens = 0;
  let done;
  const allDone = new Promise((r) => (done = r));
  const loop = new StepLoop(adapter, { maxNumSeqs: 8, maxNumBatchedTokens: 256, maxModelLen: 1024 }, (msg) => {
    if (msg.type !== "step") return;
    for (const o of msg.outputs) {
      tokens += o.tokens.length;
      if (o.finish && ++finished === concurrency) done();
    }
  });
  const running = loop.run();
  const t0 = performance.now();
  for (let i = 0; i < concurrency; i++) {
    loop.submit({ v: 1, type: "add", id: `r${i}`, prompt: { text: `<|im_start|>user\nrequest ${i} about queues<|im_end|>\n<|im_start|>assistant\n` }, params: { maxTokens: TOKENS, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: true } });
  }
  await allDone;
  const ms = performance.now() - t0;
  loop.stop();
  await running;
  await adapter.dispose();
  return (tokens / ms) * 1000;
}

const rows = [];
for (const c of CONCURRENCY) {
  const row = { concurrency: c };
  for (const t of THREADS) {
    const samples = [];
    for (let k = 0; k < 3; k++) samples.push(await run(t, c));
    samples.sort((a, b) => a - b);
    row[`threads=${t} tok/s`] = Math.round(samples[1]);
  }
  for (const t of THREADS.slice(1)) row[`ratio t${t}/t${THREADS[0]}`] = +(row[`threads=${t} tok/s`] / row[`threads=${THREADS[0]} tok/s`]).toFixed(2);
  rows.push(row);
}
console.table(rows);
