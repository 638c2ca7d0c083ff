#!/usr/bin/env node
// Benchmark: what a grammar costs per sampled token on the llama.cpp adapter (tiny model, vocabulary 1019), straight
// on the adapter (no step loop, no HTTP): unconstrained sample vs sample with a grammar attached (pick-first path,
// and the masked path when the greedy pick is rejected), the continuation probe, canBeNext, state creation and a
// compile. Prints a table; does not assert. Usage: node scripts/prepare.mjs && node bench/guided-cost.mjs
import { LlamaAdapter } from "../dist/engine/llama/adapter.js";
import { ensureDefaultModel } from "../dist/model/default-model.js";

const N = 2000;
const adapter = await LlamaAdapter.open({ modelPath: await ensureDefaultModel(), sequences: 1, contextSize: 256, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
const cfg = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };
const prompt = adapter.tokenize("<|im_start|>user\nmeasure me<|im_end|>\n<|im_start|>assistant\n");
const [idx] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
const greedyPick = await adapter.sample(idx, adapter.createSampler(cfg));
const pickText = Buffer.from(adapter.bytesOf(greedyPick)).toString("utf8");

/** Mean ms of `fn` over N runs (after 50 warm-up runs). */
async function time(fn) {
  for (let i = 0; i < 50; i++) await fn(i);
  const t0 = performance.now();
  for (let i = 0; i < N; i++) await fn(i);
  return (performance.now() - t0) / N;
}

const rows = [];
const plain = adapter.createSampler(cfg);
rows.push(["sample, unconstrained", await time(() => adapter.sample(idx, plain))]);
// The same logits every time; a fresh state per sample so that each sample is the first token of the rule.
for (const [name, grammar] of [
  ["sample, grammar accepts the greedy pick", `root ::= ${JSON.stringify(pickText)} [a-z]*`],
  ["sample, grammar rejects the pick (masks the vocabulary)", 'root ::= "{" [a-z]{1,8} "}"'],
]) {
  const compiled = adapter.compileGrammar(grammar, "root");
  const states = Array.from({ length: N + 50 }, () => adapter.createGrammarState(compiled));
  const s = adapter.createSampler(cfg);
  rows.push([name, await time((i) => (s.configure({ ...cfg, grammar: states[i] }), adapter.sample(idx, s)))]);
}
const json = adapter.compileGrammar('root ::= "{" [a-z]{1,8} "}"', "root");
const probeState = adapter.createGrammarState(json);
rows.push(["continuation probe (grammarCanContinue)", await time(() => adapter.grammarCanContinue(idx, probeState, new Map()))]);
rows.push(["canBeNext (one token)", await time(() => adapter.grammarCanBeNext(probeState, greedyPick))]);
rows.push(["createGrammarState", await time(() => adapter.createGrammarState(json))]);
rows.push(["compileGrammar (cache miss, 1 KB)", await time((i) => adapter.compileGrammar(`root ::= "{" [a-z]{1,8} "}"\nx${i} ::= ${JSON.stringify("y".repeat(1000))}`, "root"))]);
console.log(`vocabulary ${adapter.vocabSize}, ${N} runs each`);
for (const [name, ms] of rows) console.log(`${name.padEnd(58)} ${(ms * 1000).toFixed(1).padStart(8)} µs`);
await adapter.dispose();
