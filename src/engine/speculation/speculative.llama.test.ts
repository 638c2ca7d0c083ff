/**
 * Prompt-lookup speculative decoding on the real engine (llama.cpp, Keel's addon): the same requests run with
 * speculation off and on must emit the same tokens, while drafts are actually proposed and accepted (else the check
 * would prove nothing). Greedy on a real model (Qwen2.5-Coder-0.5B, real text), alone and batched with others.
 * Seeded sampling with penalties on keel-tiny: its F32 weights make a multi-token decode's logits bit-identical to
 * one-token decodes, so any difference would be the verification's; a quantized model's CPU kernels change the
 * logits with the batch shape (up to ~0.1 in log probability measured here), which can flip a seeded draw — as
 * batching with other sequences already can (docs/speculative.md).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../../../test/support/real-models.js";
import { ensureDefaultModel } from "../../model/default-model.js";
import { buildNativeAddon, getLlamaBinDir } from "../../native/build.js";
import type { AddMessage, EngineMessage, SamplingParams } from "../../protocol/messages.js";
import { PROTOCOL_VERSION } from "../../protocol/messages.js";
import { LlamaAdapter } from "../llama/adapter.js";
import { StepLoop } from "../step-loop.js";

const SOURCE = `export function parseRange(text: string): { start: number; end: number } | null {
  const match = /^(\\d+)-(\\d+)$/.exec(text.trim());
  if (!match) return null;
  const start = Number(match[1]);
  const end = Number(match[2]);
  if (end < start) return null;
  return { start, end };
}

export function formatRange(range: { start: number; end: number }): string {
  return \`\${range.start}-\${range.end}\`;
}
`;
const EDIT = `<|im_start|>user\nHere is a file:\n\`\`\`ts\n${SOURCE}\`\`\`\nReturn the whole file, with formatRange renamed to printRange.<|im_end|>\n<|im_start|>assistant\n`;
const OTHER = "<|im_start|>user\nName three rivers.<|im_end|>\n<|im_start|>assistant\n";
const MAX_TOKENS = 48;

let adapter: LlamaAdapter;
let tiny: LlamaAdapter;

beforeAll(async () => {
  const binDir = await getLlamaBinDir(false);
  if (binDir === null) throw new Error("node-llama-cpp loads no CPU addon here");
  await buildNativeAddon({ binDir });
  const opts = { sequences: 3, contextSize: 1024, batchSize: 512, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" } as const;
  adapter = await LlamaAdapter.open({ modelPath: realModelPath("qwen2.5-coder-0.5b-instruct"), ...opts });
  tiny = await LlamaAdapter.open({ modelPath: await ensureDefaultModel(), ...opts });
}, 300_000);

afterAll(async () => {
  await adapter?.dispose();
  await tiny?.dispose();
});

const greedy: SamplingParams = { maxTokens: MAX_TOKENS, temperature: 0, topP: 1, topK: -1, seed: 0, ignoreEos: false };

/** What one run produced: tokens per request and the engine's cumulative draft counters. */
interface RunResult {
  tokens: Record<string, number[]>;
  drafts: { proposed: number; accepted: number };
  stepsWithManyTokens: number;
}

/** Run requests to completion on a fresh loop over the shared adapter (every slot cleared before and after). */
async function run(requests: { id: string; prompt: string; params: SamplingParams }[], budget = 512, model = adapter): Promise<RunResult> {
  for (let s = 0; s < 3; s++) model.clearSequence(s);
  const tokens: Record<string, number[]> = {};
  const finished = new Set<string>();
  let stepsWithManyTokens = 0;
  const loop = new StepLoop(model, { maxNumSeqs: 3, maxNumBatchedTokens: budget, maxModelLen: 1024 }, (m: EngineMessage) => {
    if (m.type === "request_error") throw new Error(m.message);
    if (m.type !== "step") return;
    for (const o of m.outputs) {
      (tokens[o.id] ??= []).push(...o.tokens);
      if (o.tokens.length > 1) stepsWithManyTokens += 1;
      if (o.finish) finished.add(o.id);
    }
  }, { onInvariantViolation: (v) => { throw new Error(v.join("; ")); } });
  for (const r of requests) loop.submit({ v: PROTOCOL_VERSION, type: "add", id: r.id, prompt: { text: r.prompt }, params: r.params } satisfies AddMessage);
  for (let i = 0; i < 2000 && finished.size < requests.length; i++) await loop.step();
  expect(finished.size).toBe(requests.length);
  return { tokens, drafts: { ...loop.drafts }, stepsWithManyTokens };
}

const spec = { numAssistantTokens: 5, maxNgramSize: 3 };

describe("prompt-lookup speculative decoding on the real engine", () => {
  it("emits the same greedy tokens with speculation on, accepting drafts on an edit-this-file prompt", async () => {
    const off = await run([{ id: "a", prompt: EDIT, params: greedy }]);
    const on = await run([{ id: "a", prompt: EDIT, params: { ...greedy, speculation: spec } }]);
    expect(on.tokens["a"]).toEqual(off.tokens["a"]);
    expect(off.drafts.proposed).toBe(0);
    expect(on.drafts.accepted).toBeGreaterThan(10);
    expect(on.stepsWithManyTokens).toBeGreaterThan(3);
  }, 300_000);

  it("emits the same seeded tokens (top-k, top-p, repetition and presence penalties) with speculation on (keel-tiny)", async () => {
    const params: SamplingParams = { ...greedy, maxTokens: 80, temperature: 0.15, topP: 0.95, topK: 40, seed: 1234, repetitionPenalty: 1.02, presencePenalty: 0.05 };
    const off = await run([{ id: "a", prompt: EDIT, params }], 512, tiny);
    const on = await run([{ id: "a", prompt: EDIT, params: { ...params, speculation: spec } }], 512, tiny);
    expect(on.tokens["a"]).toEqual(off.tokens["a"]);
    expect(on.drafts.accepted).toBeGreaterThan(0);
  }, 300_000);

  it("stays exact batched with other requests, under a tight step budget and a max_tokens cut", async () => {
    const reqs = (s: boolean) => [
      { id: "edit", prompt: EDIT, params: { ...greedy, maxTokens: 29, ...(s ? { speculation: { numAssistantTokens: 8, maxNgramSize: 2 } } : {}) } },
      { id: "other", prompt: OTHER, params: { ...greedy, maxTokens: 24, ...(s ? { speculation: spec } : {}) } },
      { id: "greedy", prompt: EDIT, params: { ...greedy, ...(s ? { speculation: spec } : {}) } },
    ];
    const off = await run(reqs(false), 16);
    const on = await run(reqs(true), 16);
    expect(on.tokens).toEqual(off.tokens);
    expect(on.tokens["edit"]).toHaveLength(29);
    expect(on.drafts.accepted).toBeGreaterThan(0);
  }, 300_000);
});
