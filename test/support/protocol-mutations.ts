/**
 * Protocol messages for comparing validators: one valid message of every shape (every optional field set, and a
 * minimal one), and seeded random mutations of them — a field deleted, replaced by a value from a pool of boundary
 * and wrong-typed values, or an unknown field added — so that two validators of the same schema can be checked to
 * classify thousands of near-valid messages alike.
 */
import { PROTOCOL_VERSION } from "../../src/protocol/messages.js";

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const v = PROTOCOL_VERSION;
const params = { maxTokens: 8, temperature: 0.7, topP: 0.9, topK: 40, seed: 7, ignoreEos: false };
const guide: Json = {
  grammar: 'root ::= "yes" | "no"\ncall ::= "{" [a-z]+ "}"\ngate ::= "<think>" | root',
  start: { kind: "rule", rule: "gate", then: "end" },
  reasoning: { open: "<think>", close: "</think>", after: { kind: "free" } },
  triggers: [{ text: "<tool_call>", rule: "call" }, { text: "{", rule: "call", atStart: true, then: "free" }],
  specialTokens: ["<tool_call>"],
};
const fullParams = { ...params, presencePenalty: 0.5, frequencyPenalty: -0.5, repetitionPenalty: 1.1, minP: 0.05, logitBias: [[5, -100], [6, 2.5]], minTokens: 2, stopTokenIds: [2, 3], logprobs: 3, guide };

/** One valid gateway → engine message of every shape. */
export const GATEWAY_MESSAGES: Json[] = [
  { v, type: "add", id: "req-1", prompt: { text: "hello" }, params },
  { v, type: "add", id: "req-2", prompt: { tokens: [1, 2, 3] }, params: fullParams, generated: [4, 5] },
  { v, type: "add", id: "req-3", prompt: { text: "" }, params: { ...params, maxTokens: null, logprobs: null, guide: { grammar: "root ::= [a-z]", start: { kind: "reasoning" }, reasoning: { open: "<think>", close: "</think>", after: { kind: "rule", rule: "root", then: "end" } } } } },
  { v, type: "abort", ids: ["a", "b"] },
  { v, type: "ping", nonce: 1712345678901 },
  { v, type: "shutdown" },
  { v, type: "tokenize", id: "tok-1", text: "hi", addSpecialTokens: true },
];

const lp = (token: number): Json => ({ token, logprob: -0.5, bytes: [104, 105] });

/** One valid engine → gateway message of every shape. */
export const ENGINE_MESSAGES: Json[] = [
  { v, type: "loading", progress: 0.5 },
  {
    v,
    type: "ready",
    pid: 42,
    model: { path: "/m.gguf", name: "tiny", architecture: "llama", trainContextSize: 2048, vocabSize: 100, chatTemplate: "{{ x }}", kvElementsPerToken: 4096, bosToken: "<s>", eosToken: "</s>" },
    limits: { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 1024, kvPoolTokens: 4096 },
    engine: "node-llama-cpp@3.21.1",
    capabilities: { exactSeededResume: true, maxTopLogprobs: 20, extendedSampling: false, grammars: true, sharedPrefill: true, samplingFields: ["minP", "stopTokenIds"] },
    backend: { gpu: false, devices: [], addon: "keel" },
    loadMs: 120,
  },
  { v, type: "ready", pid: 43, model: { path: "/m", name: null, architecture: "qwen2", trainContextSize: 0, vocabSize: 1, chatTemplate: null, kvElementsPerToken: null, bosToken: "", eosToken: "" }, limits: { maxNumSeqs: 1, maxNumBatchedTokens: 1, maxModelLen: 1 }, engine: "openvino", capabilities: { exactSeededResume: false, maxTopLogprobs: -1, extendedSampling: false, grammars: false, sharedPrefill: false }, backend: { gpu: "cuda", devices: ["H200"] } },
  { v, type: "pong", nonce: 17, step: 3 },
  {
    v,
    type: "step",
    step: 9,
    batchTokens: 12,
    outputs: [
      { id: "a", admitted: { promptTokens: [1, 2], cachedTokens: 1, queueMs: 0.25 }, tokens: [7], logprobs: [{ ...(lp(7) as object), top: [lp(7), lp(8)] }], text: "hi", guideDropped: "grammar rejected the replay" },
      { id: "b", tokens: [], text: "", finish: { reason: "error", promptTokens: 3, completionTokens: 0, error: { code: "engine_error", message: "failed" } } },
      { id: "c", tokens: [9], text: "x", finish: { reason: "abort", promptTokens: 3, completionTokens: 1, stepsAfterAbort: 1 } },
    ],
    stats: { waiting: 0, running: 2, activeSequences: 2, cachedSequences: 1, prefixCacheHitTokens: 5, kvTokensInUse: 10, preemptions: 0, phaseUs: { decode: 100.5, sample: 20, step: 130 } },
  },
  { v, type: "step", step: 0, batchTokens: 0, outputs: [], stats: { waiting: 1, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0 } },
  { v, type: "request_error", id: "a", code: "context_length_exceeded", message: "too long" },
  { v, type: "protocol_error", message: "bad frame" },
  { v, type: "fatal", message: "out of memory" },
  { v, type: "tokenized", id: "t", tokens: [1, 2] },
  { v, type: "tokenized", id: "t", error: "cannot tokenize" },
];

/** Replacement values: wrong types, boundaries of the schema's ranges, names the grammar rules care about. */
const POOL: Json[] = [
  null, true, false, 0, 1, -1, 2, 3, 0.5, 1.5, -2, -2.5, 100, 101, -100, -101, 255, 256, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32,
  "", "x", "é😀", "not a name", "keel-prefixed-root", "keel-prefixed-root ::= \"x\"", "free", "rule", "reasoning", "end", "add", "step", "engine_error",
  [], [1], [-1], [1.5], ["a"], [[1, 2]], [[1, 2], [1, 3]], [[1, 200]], {}, { kind: "free" }, { kind: "reasoning" }, { kind: "rule", rule: "root", then: "end" }, { text: "x" }, { tokens: [] },
];

/** mulberry32: a small seeded generator, so a failing case reproduces. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Every container (object or array) inside `value`, with the value itself. */
function containers(value: Json, into: (Json[] | { [k: string]: Json })[] = []): (Json[] | { [k: string]: Json })[] {
  if (typeof value === "object" && value !== null) {
    into.push(value);
    for (const x of Object.values(value)) containers(x, into);
  }
  return into;
}

/** `n` mutants of `bases`, each one to three edits deep. */
export function mutations(bases: Json[], n: number, seed: number): Json[] {
  const rnd = random(seed);
  const pick = <T>(xs: T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const out: Json[] = [];
  for (let c = 0; c < n; c++) {
    const m = structuredClone(pick(bases));
    const edits = 1 + Math.floor(rnd() * 3);
    for (let e = 0; e < edits; e++) {
      const target = pick(containers(m));
      const keys = Object.keys(target);
      const action = rnd();
      if (Array.isArray(target)) {
        if (action < 0.2 || target.length === 0) target.push(pick(POOL));
        else if (action < 0.4) target.splice(Math.floor(rnd() * target.length), 1);
        else target[Math.floor(rnd() * target.length)] = structuredClone(pick(POOL));
      } else if (action < 0.15 || keys.length === 0) target[pick(["extra", "typicalP", "kind", "text", "tokens", "error"])] = structuredClone(pick(POOL));
      else if (action < 0.35) delete target[pick(keys)];
      else target[pick(keys)] = structuredClone(pick(POOL));
    }
    out.push(m);
  }
  return out;
}
