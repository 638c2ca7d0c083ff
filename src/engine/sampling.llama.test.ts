/**
 * The extended sampling set and log probabilities through the real step loop on the real llama.cpp adapter (tiny
 * embedded model): penalties and bias really change what is sampled, and the raw log probabilities are consistent
 * with greedy sampling.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureDefaultModel } from "../model/default-model.js";
import { PROTOCOL_VERSION, type EngineMessage, type PositionLogprobs, type SamplingParams } from "../protocol/messages.js";
import { LlamaAdapter, MIN_LOGPROB } from "./llama/adapter.js";
import { StepLoop } from "./step-loop.js";

let adapter: LlamaAdapter;

beforeAll(async () => {
  adapter = await LlamaAdapter.open({ modelPath: await ensureDefaultModel(), sequences: 2, contextSize: 256, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
});

afterAll(async () => {
  await adapter?.dispose();
});

/** Run one request to its finish on a fresh loop; returns its tokens, text, log probabilities and finish reason. */
async function generate(p: Partial<SamplingParams>, prompt = "once upon a time") {
  const messages: EngineMessage[] = [];
  const loop = new StepLoop(adapter, { maxNumSeqs: 2, maxNumBatchedTokens: 64, maxModelLen: 256 }, (m) => messages.push(m));
  loop.submit({ v: PROTOCOL_VERSION, type: "add", id: "r", prompt: { text: prompt }, params: { maxTokens: 16, temperature: 0, topP: 1, topK: -1, seed: 3, ignoreEos: true, ...p } });
  do await loop.step();
  while (loop.scheduler.hasWork);
  const outs = messages.flatMap((m) => (m.type === "step" ? m.outputs : []));
  const errors = messages.filter((m) => m.type === "request_error");
  expect(errors).toEqual([]);
  return {
    tokens: outs.flatMap((o) => o.tokens),
    text: outs.map((o) => o.text).join(""),
    logprobs: outs.flatMap((o) => o.logprobs ?? []),
    reason: outs.at(-1)?.finish?.reason,
  };
}

describe("extended sampling on the real engine", () => {
  it("greedy output repeats itself without penalties; each penalty breaks the repetition", async () => {
    const plain = await generate({});
    // The tiny model falls into a loop: some token recurs in its greedy continuation.
    expect(new Set(plain.tokens).size).toBeLessThan(plain.tokens.length);
    for (const p of [{ repetitionPenalty: 1.5 }, { presencePenalty: 1.5 }, { frequencyPenalty: 1 }]) {
      const penalised = await generate(p);
      expect(penalised.tokens, JSON.stringify(p)).not.toEqual(plain.tokens);
      expect(new Set(penalised.tokens).size, JSON.stringify(p)).toBeGreaterThan(new Set(plain.tokens).size);
    }
  });

  it("logit_bias -100 keeps a token out; a large positive bias makes it the greedy choice", async () => {
    const plain = await generate({ maxTokens: 6 });
    const first = plain.tokens[0]!;
    const banned = await generate({ maxTokens: 6, logitBias: [[first, -100]] });
    expect(banned.tokens).not.toContain(first);
    const forced = await generate({ maxTokens: 6, logitBias: [[first + 1, 100]] });
    expect(forced.tokens).toEqual(Array(6).fill(first + 1));
  });

  it("min_p and temperature: a strict min_p (1.0) samples only the most likely token, i.e. the greedy continuation", async () => {
    const greedy = await generate({});
    const strict = await generate({ temperature: 1.5, seed: 11, minP: 1 });
    const loose = await generate({ temperature: 1.5, seed: 11 });
    expect(strict.tokens).toEqual(greedy.tokens);
    expect(loose.tokens).not.toEqual(greedy.tokens);
  });

  it("logprobs are the raw distribution: greedy picks top[0], its logprob equals top[0]'s, top is sorted, mass ≤ 1", async () => {
    // ignore_eos off: no bias at all, so greedy takes the raw top token.
    const r = await generate({ logprobs: 5, ignoreEos: false });
    expect(r.logprobs).toHaveLength(r.tokens.length);
    r.logprobs.forEach((lp: PositionLogprobs, i) => {
      expect(lp.token).toBe(r.tokens[i]);
      expect(lp.top).toHaveLength(5);
      expect(lp.top[0]!.token).toBe(lp.token);
      expect(lp.top[0]!.logprob).toBe(lp.logprob);
      for (let k = 1; k < 5; k++) expect(lp.top[k]!.logprob).toBeLessThanOrEqual(lp.top[k - 1]!.logprob);
      const mass = lp.top.reduce((a, t) => a + Math.exp(t.logprob), 0);
      expect(mass).toBeLessThanOrEqual(1 + 1e-5);
      expect(lp.logprob).toBeGreaterThan(MIN_LOGPROB);
    });
    // Asking for logprobs does not change what is sampled.
    expect((await generate({ ignoreEos: false })).tokens).toEqual(r.tokens);
  });

  it("logprobs are taken before penalties and bias: a banned greedy token still shows its raw rank", async () => {
    const plain = await generate({ maxTokens: 1, logprobs: 2, ignoreEos: false });
    const first = plain.tokens[0]!;
    const banned = await generate({ maxTokens: 1, logprobs: 2, ignoreEos: false, logitBias: [[first, -100]] });
    // Greedy without the banned token takes the raw runner-up...
    const runnerUp = plain.logprobs[0]!.top[1]!;
    expect(banned.tokens[0]).toBe(runnerUp.token);
    // ...and the report is the same raw distribution: the banned token still ranks first, the sampled one second.
    expect(banned.logprobs[0]!.top).toEqual(plain.logprobs[0]!.top);
    expect(banned.logprobs[0]).toEqual({ ...runnerUp, top: plain.logprobs[0]!.top });
  });
});
