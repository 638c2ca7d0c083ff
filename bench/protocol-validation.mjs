#!/usr/bin/env node
// Benchmark: what checking one engine frame costs the gateway (src/protocol/engine-validator.ts, the compiled
// validator of the protocol's JSON Schema) against what decoding it costs anyway (JSON.parse), and what zod would
// cost (engine-schema.ts parsed directly). Frames: a typical decode step of OUTPUTS outputs (one token and its text
// each, the stats with phase timings), the same with top-5 log probabilities, and a step admitting OUTPUTS requests.
// Prints µs per frame; asserts nothing. Needs dist/ (node node_modules/typescript/bin/tsc -p tsconfig.build.json).
//   node bench/protocol-validation.mjs [OUTPUTS=64]
import { parseEngineMessage } from "../dist/protocol/engine-validator.js";
import { engineMessages } from "../dist/protocol/engine-schema.js";

const OUTPUTS = Number(process.argv[2] ?? 64);
const ROUNDS = 20_000;

const stats = { waiting: 0, running: OUTPUTS, activeSequences: OUTPUTS, cachedSequences: 2, prefixCacheHitTokens: 120, kvTokensInUse: 40 * OUTPUTS, phaseUs: { decode: 3100, sample: 240, step: 3400 } };
const step = (outputs) => ({ v: 1, type: "step", step: 1234, batchTokens: outputs.length, outputs, stats });
const ids = Array.from({ length: OUTPUTS }, (_, i) => `chatcmpl-${i.toString(36)}-7f3a9c`);
const lp = (token) => ({ token, logprob: -0.25, bytes: [32, 119, 111] });
const frames = {
  decode: step(ids.map((id, i) => ({ id, tokens: [1200 + i], text: " word" }))),
  "decode+logprobs": step(ids.map((id, i) => ({ id, tokens: [1200 + i], text: " word", logprobs: [{ ...lp(1200 + i), top: [1, 2, 3, 4, 5].map(lp) }] }))),
  admit: step(ids.map((id, i) => ({ id, admitted: { promptTokens: Array.from({ length: 40 }, (_, t) => t + i), cachedTokens: 0, queueMs: 1.5 }, tokens: [], text: "" }))),
};

/** µs per call of f over ROUNDS calls, after a warm-up. */
function time(f) {
  for (let i = 0; i < 2000; i++) f();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < ROUNDS; i++) f();
  return Number(process.hrtime.bigint() - t0) / ROUNDS / 1000;
}

console.log(`${OUTPUTS} outputs per step; µs per frame (${ROUNDS} rounds)`);
console.log("frame            bytes   JSON.parse  validate  zod");
for (const [name, frame] of Object.entries(frames)) {
  const text = JSON.stringify(frame);
  const parsed = JSON.parse(text);
  if (!parseEngineMessage(parsed).ok) throw new Error(`${name} does not validate: ${parseEngineMessage(parsed).error}`);
  const decode = time(() => JSON.parse(text));
  const validate = time(() => parseEngineMessage(parsed));
  const zod = time(() => engineMessages.step.safeParse(parsed));
  console.log(`${name.padEnd(16)} ${String(text.length).padStart(6)} ${decode.toFixed(1).padStart(11)} ${validate.toFixed(1).padStart(9)} ${zod.toFixed(1).padStart(5)}`);
}
