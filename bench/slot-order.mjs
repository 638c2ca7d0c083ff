#!/usr/bin/env node
// Cost of llama.cpp's micro-batch split by sequence id (docs/upstream.md): ms per decode step of N single tokens,
// one per sequence, added to llama.cpp's batch in slot order, reversed and shuffled (bypassing Keel's slotOrder).
// Prints the ratios; asserts nothing.
//
//   node bench/slot-order.mjs [--model PATH] [--seqs 16] [--steps 40] [--rounds 3] [--gpu]
import path from "node:path";
import { arg, benchModel, median as med, openAdapter } from "./lib.mjs";

const N = Number(arg("seqs", "16"));
const steps = Number(arg("steps", "40"));
const rounds = Number(arg("rounds", "3"));
const modelPath = await benchModel();
const a = await openAdapter(modelPath, { sequences: N, contextSize: 512, gpu: process.argv.includes("--gpu") ? "gpu" : "cpu" });
const ctx = a.native.ctx;
const prompt = a.tokenize("hello there, the river in the morning");
for (let s = 0; s < N; s++) await a.decode([{ slot: s, pos: 0, tokens: prompt, wantsLogits: false }]);
/** ms per step of `steps` decode steps with the items added in `order` (node-llama-cpp's worker decode). */
async function run(order) {
  const t0 = performance.now();
  for (let k = 0; k < steps; k++) {
    ctx.initBatch(N);
    for (const s of order) ctx.addToBatch(s, prompt.length + k, Uint32Array.of(100 + s), Uint32Array.of(0));
    await ctx.decodeBatch();
  }
  for (let s = 0; s < N; s++) ctx.removeTokenCellsFromSequence(s, prompt.length, -1);
  return (performance.now() - t0) / steps;
}
const asc = [...Array(N).keys()];
const desc = [...asc].reverse();
// A fixed shuffle (seeded LCG) so runs compare.
let x = 7;
const shuffled = [...asc].sort(() => ((x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) - 0.5);
const res = { asc: [], desc: [], shuffled: [] };
for (let r = 0; r < rounds; r++) for (const [k, o] of [["asc", asc], ["desc", desc], ["shuffled", shuffled]]) res[k].push(await run(o));
console.log(`${path.basename(modelPath)}, ${N} sequences, one token each, median of ${rounds} rounds × ${steps} steps:`);
console.log(`  slot order ${med(res.asc).toFixed(2)} ms/step; reversed ${med(res.desc).toFixed(2)} (${(med(res.desc) / med(res.asc)).toFixed(2)}×); shuffled ${med(res.shuffled).toFixed(2)} (${(med(res.shuffled) / med(res.asc)).toFixed(2)}×)`);
await a.dispose();
