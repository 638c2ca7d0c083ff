#!/usr/bin/env node
// Why a speculative greedy text can differ from the plain one (docs/speculative.md, "Numerics"): one sequence decoded
// token by token (greedy) against the same tokens decoded K at a time with logits at every position (the shape of a
// verification decode of K - 1 drafts), on llama.cpp through Keel's adapter. Prints the largest difference in any
// position's greedy log-probability, the smallest top-2 margin of the one-token path, and every position whose
// argmax differs. Asserts nothing.
//
//   node bench/verify-numerics.mjs MODEL.gguf [--columns 6] [--tokens 48]
import { arg, openAdapter } from "./lib.mjs";
const model = process.argv[2];
if (!model || model.startsWith("--")) throw new Error("usage: node bench/verify-numerics.mjs MODEL.gguf [--columns 6] [--tokens 48]");
const a = await openAdapter(model, { sequences: 2, contextSize: 1024 });
const prompt = a.tokenize("<|im_start|>user\nHere is a tool result: {\"city\": \"Paris\", \"temp\": 21.5, \"rows\": [1, 2, 3, 4, 5, 6]}. Quote the rows back exactly.<|im_end|>\n<|im_start|>assistant\n");
const N = Number(arg("tokens", "48"));
const K = Number(arg("columns", "6"));
// 1. One token a step (greedy), top-2 at each position.
a.clearSequence(0);
let idx = await a.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
const single = [];
const toks = [];
for (let i = 0; i < N; i++) {
  const lp = await a.logprobs(idx[0], 0, 2);
  const t = lp.top[0].token;
  single.push(lp.top);
  toks.push(t);
  idx = await a.decode([{ slot: 0, pos: prompt.length + i, tokens: [t], wantsLogits: true }]);
}
// 2. The same tokens, K a decode, logits at every position (position j's logits predict toks[j]).
a.clearSequence(1);
await a.decode([{ slot: 1, pos: 0, tokens: prompt.slice(0, -1), wantsLogits: false }]);
const seq = [prompt.at(-1), ...toks];
const multi = [];
for (let s = 0; s < N; s += K) {
  const chunk = seq.slice(s, s + K);
  const r = await a.decode([{ slot: 1, pos: prompt.length - 1 + s, tokens: chunk, wantsLogits: true, drafts: chunk.length - 1 }]);
  for (let j = 0; j < chunk.length; j++) multi.push((await a.logprobs(r[0] + j, 0, 2)).top);
}
let maxDiff = 0, flips = 0, minMargin = Infinity;
for (let i = 0; i < N; i++) {
  const s = single[i], m = multi[i];
  const d = Math.abs(s[0].logprob - (m.find((x) => x.token === s[0].token)?.logprob ?? -99));
  maxDiff = Math.max(maxDiff, d);
  minMargin = Math.min(minMargin, s[0].logprob - s[1].logprob);
  if (s[0].token !== m[0].token) { flips++; console.log(`position ${i}: one-column argmax ${s[0].token} (margin ${(s[0].logprob - s[1].logprob).toFixed(4)}), ${K}-column argmax ${m[0].token}`); }
}
console.log(JSON.stringify({ model: model.split("/").pop(), positions: N, columnsPerDecode: K, maxAbsLogprobDiff: +maxDiff.toFixed(4), argmaxFlips: flips, smallestTop2Margin: +minMargin.toFixed(4) }));
process.exit(0);
