#!/usr/bin/env node
// Benchmark: what a real vocabulary costs per token. The same measurements on two models, straight on the llama.cpp
// adapter (no step loop, no HTTP), printed side by side with the ratio:
//   small  keel-tiny-qwen3: the tiny model, vocabulary 1023 (with the agent tags as tokens)
//   large  `keel make-model --shape qwen2.5-0.5b --f16 --agent qwen3`: Qwen2.5-0.5B's shape and a generated
//          151936-token vocabulary (written once to $TMPDIR/keel-bench-vocab/; LARGE=path.gguf takes any GGUF instead,
//          e.g. the real qwen2.5-coder-0.5b-instruct)
// Rows (mean µs per call over N calls on the logits of one prompt, after a warm-up; "configure + sample" reconfigures
// the seed per token as the engine does with a temperature):
//   - one decode step (1 token) for scale; greedy; top-p 0.9; top-k 40 + top-p 0.9; repetition penalty 1.1 over a
//     512-token history; a 256-entry bias map (presence/frequency penalties and logit_bias travel as bias);
//   - logprobs with top 5: sampled token among the top 20 (two native calls), and outside them (a third call that
//     transfers the whole distribution);
//   - guided, tool_choice required, hermes3, 1 / 10 / 50 tools (bench/guided.mjs's tool shapes): the first token of a
//     call (a fresh grammar state per sample), and the mean over the first CALL_TOKENS tokens of a call (greedy path
//     through the grammar; a fresh state after each call).
// Asserts nothing. Nice it on a shared machine:  node scripts/prepare.mjs && nice node bench/vocab.mjs
// Knobs (env): N (400), CALL_TOKENS (32), LARGE (path), THREADS (1).
import { existsSync, mkdirSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { GrammarMaskedError } from "../dist/engine/backend.js";
import { LlamaAdapter } from "../dist/engine/llama/adapter.js";
import { buildGuide } from "../dist/gateway/guided/guide.js";
import { AGENT_TAGS, QWEN3_STYLE_TEMPLATE } from "../dist/model/agent-templates.js";
import { ensureTinyModel } from "../dist/model/default-model.js";
import { writeGgufFile } from "../dist/model/gguf-writer.js";
import { MODEL_SHAPES, tinyModelWriter } from "../dist/model/tiny-model.js";
import { benchTools } from "./lib.mjs";

const num = (k, d) => (process.env[k] ? Number(process.env[k]) : d);
const N = num("N", 400);
const CALL_TOKENS = num("CALL_TOKENS", 32);
const THREADS = num("THREADS", 1);
const TOOL_COUNTS = [1, 10, 50];

/** The large model: a generated Qwen2.5-0.5B-shaped F16 model with the agent tags, cached by name. */
function largeModel() {
  if (process.env.LARGE) return process.env.LARGE;
  const dir = path.join(os.tmpdir(), "keel-bench-vocab");
  const file = path.join(dir, "qwen2.5-0.5b-shape-f16-agent.gguf");
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true });
    const t0 = performance.now();
    writeGgufFile(file, tinyModelWriter({ ...MODEL_SHAPES["qwen2.5-0.5b"], f16: true, chatTemplate: QWEN3_STYLE_TEMPLATE, userTokens: AGENT_TAGS }));
    console.error(`wrote ${file} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  return file;
}


/** Mean µs of `fn(i)` over N calls, after N/8 warm-up calls. */
async function time(fn, n = N) {
  for (let i = 0; i < Math.max(5, n >> 3); i++) await fn(i);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await fn(i);
  return ((performance.now() - t0) / n) * 1000;
}

/** Every measurement on one model. @returns rows [name, µs] and the vocabulary size */
async function measure(modelPath) {
  const adapter = await LlamaAdapter.open({ modelPath, sequences: 1, contextSize: 2048, batchSize: 512, threads: THREADS, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
  const rows = [];
  try {
    const base = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };
    const prompt = adapter.tokenize("<|im_start|>user\nWhat is the weather in Paris today?<|im_end|>\n<|im_start|>assistant\n");
    const [idx] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
    // 1. decode cost for scale (its own slot positions; the prompt's logits are re-decoded after it)
    let pos = prompt.length;
    rows.push(["decode step, 1 token (for scale)", await time(() => adapter.decode([{ slot: 0, pos: pos++, tokens: [prompt[0]], wantsLogits: true }]), 40)]);
    adapter.trimSequence(0, 0);
    const [at] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
    // 2. plain sampling
    const greedy = adapter.createSampler(base);
    rows.push(["sample greedy", await time(() => adapter.sample(at, greedy))]);
    for (const [name, cfg] of [
      ["configure + sample, top-p 0.9 (temp 0.8)", { ...base, temperature: 0.8, topP: 0.9 }],
      ["configure + sample, top-k 40 + top-p 0.9", { ...base, temperature: 0.8, topP: 0.9, topK: 40 }],
    ]) {
      const s = adapter.createSampler(cfg);
      rows.push([name, await time((i) => (s.configure({ ...cfg, seed: i }), adapter.sample(at, s)))]);
    }
    // 3. penalties: multiplicative over a history; additive as a bias map
    const history = Array.from({ length: 512 }, (_, i) => (i * 7919) % adapter.vocabSize);
    const rep = adapter.createSampler({ ...base, repetitionPenalty: 1.1 }, history);
    rows.push(["sample greedy, repetition penalty (512-token history)", await time(() => adapter.sample(at, rep))]);
    const bias = new Map(Array.from({ length: 256 }, (_, i) => [(i * 104729) % adapter.vocabSize, -0.5]));
    const biased = adapter.createSampler({ ...base, bias });
    rows.push(["sample greedy, 256-entry bias (presence/frequency)", await time(() => adapter.sample(at, biased))]);
    // 4. logprobs (top 5)
    const pick = await adapter.sample(at, adapter.createSampler(base));
    rows.push(["logprobs top 5, sampled token in the top 20", await time(() => adapter.logprobs(at, pick, 5))]);
    const full = await adapter.logprobs(at, pick, 40);
    const outside = full.top.at(-1).token; // ranked beyond the 20-token window
    rows.push(["logprobs top 5, sampled token outside the top 20", await time(() => adapter.logprobs(at, outside, 5))]);
    // 5. guided tool calls
    for (const n of TOOL_COUNTS) {
      const spec = buildGuide({ toolParser: "hermes3", tools: benchTools(n).map((t) => t.function), toolChoice: { kind: "required" }, parallelToolCalls: true, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null });
      const compiled = adapter.compileGrammar(spec.grammar, spec.start.rule);
      const s = adapter.createSampler(base);
      const fresh = Array.from({ length: N + (N >> 3) + 5 }, () => adapter.createGrammarState(compiled));
      rows.push([`guided ${n} tools: first token of a call`, await time((i) => (s.configure({ ...base, grammar: fresh[i] }), adapter.sample(at, s)).catch((e) => {
        if (!(e instanceof GrammarMaskedError)) throw e;
      }))]);
      let state = adapter.createGrammarState(compiled);
      let made = 0;
      rows.push([`guided ${n} tools: mean of a call's first ${CALL_TOKENS} tokens`, await time(async () => {
        s.configure({ ...base, grammar: state });
        try {
          await adapter.sample(at, s);
          made++;
          if (made === CALL_TOKENS || adapter.grammarIsComplete(state)) [state, made] = [adapter.createGrammarState(compiled), 0];
        } catch (e) {
          if (!(e instanceof GrammarMaskedError)) throw e;
          [state, made] = [adapter.createGrammarState(compiled), 0];
        }
      })]);
    }
    return { rows, vocab: adapter.vocabSize };
  } finally {
    await adapter.dispose();
  }
}

const small = await measure(await ensureTinyModel("keel-tiny-qwen3"));
const large = await measure(largeModel());
console.log(`per-token costs, µs (mean of ${N}; ${THREADS} thread(s)); small vocabulary ${small.vocab}, large ${large.vocab}`);
console.log(`${"".padEnd(58)} ${"small".padStart(9)} ${"large".padStart(9)} ${"ratio".padStart(7)}`);
small.rows.forEach(([name, us], i) => {
  const big = large.rows[i][1];
  console.log(`${name.padEnd(58)} ${us.toFixed(1).padStart(9)} ${big.toFixed(1).padStart(9)} ${(big / us).toFixed(1).padStart(7)}`);
});
