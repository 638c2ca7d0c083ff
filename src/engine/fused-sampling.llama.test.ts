/**
 * Keel's fused sampling path (src/native/keel-fused-sampling.cpp) against node-llama-cpp's sampler chain, on the real
 * engine and three vocabularies (the embedded model, SmolLM2-135M's 49,152 and Qwen2.5-Coder-0.5B's 151,936 tokens).
 *
 * Randomized (a fixed-seed PRNG picks the configs): every step of a real generation is sampled many times, each time
 * with a fresh config and seed, by twin A samplers through sampleMany (the fused path) and twin B samplers through
 * sample() (node-llama-cpp's async sampleToken: the chain). Seeded sampling must give the very same token on both, or
 * a request resumed on a restarted engine would not continue as it began. sampleMany runs on 2 threads, so it
 * spreads the sequences over the sampling pool as an engine with 2 threads does.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../../test/support/real-models.js";
import { ensureDefaultModel } from "../model/default-model.js";
import { buildNativeAddon, getLlamaBinDir } from "../native/build.js";
import type { SamplerConfig, SamplerHandle } from "./backend.js";
import { LlamaAdapter } from "./llama/adapter.js";

const TEXTS = ["Write a Python function that reverses a list.", "The river in the morning", "Explain what a mutex is:", "def parse(line):", "Once upon a time", "{\"name\": \"Ada\", \"age\":"];
const STEPS = 6;
const ROUNDS = 8;
const base: SamplerConfig = { temperature: 0.8, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };

/** Sampling-path counters of Keel's addon. */
interface Counts {
  fast: number;
  fused: number;
  chain: number;
}

/** mulberry32: a small deterministic PRNG, so a failure names a reproducible config. */
function prng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A random sampled config: the knobs of the chain, a seed, sometimes a repetition penalty or a bias. */
function randomConfig(rand: () => number, vocab: number): SamplerConfig {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const bias = new Map<number, number>();
  if (rand() < 0.25) for (let i = 0; i < 3; i++) bias.set(Math.floor(rand() * vocab), pick([-Infinity, -4, 2, 6]));
  return {
    ...base,
    temperature: pick([0.1, 0.3, 0.7, 0.8, 1, 1.5, 3]),
    topK: pick([0, 0, 1, 5, 40, 300]),
    topP: pick([1, 1, 0.5, 0.9, 0.95, 0.999]),
    minP: pick([0, 0, 0.01, 0.1]),
    repetitionPenalty: rand() < 0.2 ? 1.3 : 1,
    seed: Math.floor(rand() * 2 ** 32),
    bias,
  };
}

const models: [string, () => Promise<string>][] = [
  ["the embedded model", () => ensureDefaultModel()],
  ["SmolLM2-135M", async () => realModelPath("smollm2-135m-instruct")],
  ["Qwen2.5-Coder-0.5B", async () => realModelPath("qwen2.5-coder-0.5b-instruct")],
];

beforeAll(async () => {
  const binDir = await getLlamaBinDir(false);
  if (binDir === null) throw new Error("node-llama-cpp loads no CPU addon here");
  await buildNativeAddon({ binDir });
}, 300_000);

describe.each(models)("the fused sampling path on %s", (_name, modelPath) => {
  let adapter: LlamaAdapter;
  let counts: () => Counts;
  let options: (o: { fused?: boolean }) => { fused: boolean };

  beforeAll(async () => {
    adapter = await LlamaAdapter.open({ modelPath: await modelPath(), sequences: TEXTS.length, contextSize: 256, batchSize: 256, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
    // sampleMany on 2 threads (as an engine with 2 threads); ggml keeps 1 (its spinning threads crawl on a busy machine).
    (adapter as unknown as { samplers: { threads: number } }).samplers.threads = 2;
    const bindings = (adapter as unknown as { llama: { _bindings: { keelSamplingCounts(): Counts; keelSamplingOptions(o: { fused?: boolean }): { fused: boolean } } } }).llama._bindings;
    counts = () => bindings.keelSamplingCounts();
    options = (o) => bindings.keelSamplingOptions(o);
  }, 300_000);

  afterAll(async () => {
    await adapter?.dispose();
  });

  /** Sample every step ROUNDS times with random configs (A: sampleMany, B: sample()); feed A's last tokens back. */
  async function twins(seed: number, configFor: (rand: () => number) => SamplerConfig): Promise<{ many: number[]; single: number[]; configs: SamplerConfig[] }> {
    const rand = prng(seed);
    const prompts = TEXTS.map((t) => adapter.tokenize(t));
    const a: SamplerHandle[] = prompts.map((p) => adapter.createSampler(base, p));
    const b: SamplerHandle[] = prompts.map((p) => adapter.createSampler(base, p));
    const many: number[] = [];
    const single: number[] = [];
    const configs: SamplerConfig[] = [];
    prompts.forEach((_, s) => adapter.clearSequence(s));
    let idx = await adapter.decode(prompts.map((tokens, slot) => ({ slot, pos: 0, tokens, wantsLogits: true })));
    for (let step = 0; step < STEPS; step++) {
      let last: number[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        // 1. A fresh config per sequence and round; both twins get it (same seed, same penalty history).
        const cfgs = prompts.map(() => configFor(rand));
        cfgs.forEach((c, s) => {
          a[s]!.configure(c);
          b[s]!.configure(c);
        });
        // 2. A through the fused path, B through the chain.
        const got = adapter.sampleMany!(prompts.map((_, s) => ({ batchLogitIndex: idx[s]!, sampler: a[s]! })));
        last = [];
        for (let s = 0; s < prompts.length; s++) {
          const t = got[s];
          if (typeof t !== "number") throw t ?? new Error(`no result for sequence ${s}`);
          many.push(t);
          last.push(t);
          single.push(await adapter.sample(idx[s]!, b[s]!));
          configs.push(cfgs[s]!);
        }
      }
      // 3. The generation moves on by A's last tokens (new logits for the next step).
      idx = await adapter.decode(prompts.map((p, slot) => ({ slot, pos: p.length + step, tokens: [last[slot]!], wantsLogits: true })));
    }
    [...a, ...b].forEach((h) => h.dispose());
    return { many, single, configs };
  }

  /** Index and config of the first disagreement, for a readable failure. */
  const firstMismatch = (r: { many: number[]; single: number[]; configs: SamplerConfig[] }) => {
    const i = r.many.findIndex((t, k) => t !== r.single[k]);
    return i < 0 ? null : { i, fused: r.many[i], chain: r.single[i], config: { ...r.configs[i], bias: [...r.configs[i]!.bias] } };
  };

  it("random temperature/top-k/top-p/min-p/penalty/bias configs and seeds: the chain's token every time, mostly on the fused path", async () => {
    const before = counts();
    const r = await twins(20261203, (rand) => randomConfig(rand, adapter.vocabSize));
    expect(firstMismatch(r)).toBeNull();
    const after = counts();
    const items = STEPS * ROUNDS * TEXTS.length;
    // Every item went through Keel's call; the fused path took the large majority (the rest fell back to the chain).
    expect(after.fused + after.chain - before.fused - before.chain).toBe(items);
    expect(after.fused - before.fused).toBeGreaterThan(items * 0.8);
    // The draws are not degenerate: many distinct tokens came out.
    expect(new Set(r.many).size).toBeGreaterThan(20);
  });

  it("the common configs (top-p 0.95 with and without top-k 40; temperature only) take the fused path every time", async () => {
    const before = counts();
    const common = [
      { ...base, topP: 0.95, topK: 40 },
      { ...base, topP: 0.95 },
      { ...base, temperature: 0.7 },
    ];
    const r = await twins(7, (rand) => ({ ...common[Math.floor(rand() * common.length)]!, seed: Math.floor(rand() * 2 ** 32) }));
    expect(firstMismatch(r)).toBeNull();
    expect(counts().fused - before.fused).toBe(STEPS * ROUNDS * TEXTS.length);
  });

  it("a draw that lands on tied values is left to the chain (the sort's order of ties is not reproducible)", async () => {
    const before = counts();
    // Two tokens lifted by 2^30 tie exactly at the top (any logit in [-32, 64] + 2^30 rounds to 2^30), so every draw
    // selects a tied value. top-k 40: the chain sorts with std::partial_sort (its bucket sort cannot take such values).
    const r = await twins(11, (rand) => ({ ...base, topK: 40, topP: 0.9, seed: Math.floor(rand() * 2 ** 32), bias: new Map([[17, 2 ** 30], [23, 2 ** 30]]) }));
    expect(firstMismatch(r)).toBeNull();
    expect(r.many.every((t) => t === 17 || t === 23)).toBe(true);
    const after = counts();
    expect(after.chain - before.chain).toBe(STEPS * ROUNDS * TEXTS.length);
    expect(after.fused - before.fused).toBe(0);
  }, 180_000);

  it("values beyond llama.cpp's bucket sort (a bias of 2^30 without top-k) are left to the chain, which stays the reference", async () => {
    const before = counts();
    const r = await twins(12, (rand) => ({ ...base, topP: 0.9, seed: Math.floor(rand() * 2 ** 32), bias: new Map([[17, 2 ** 30]]) }));
    expect(firstMismatch(r)).toBeNull();
    const after = counts();
    expect(after.chain - before.chain).toBe(STEPS * ROUNDS * TEXTS.length);
    expect(after.fused - before.fused).toBe(0);
  }, 180_000); // every item on the chain (a full-vocabulary sort each) on a shared 2-core machine

  it("one sampler at several positions of one call (a verification round) samples them in order, as sample() one by one", async () => {
    const prompts = TEXTS.map((t) => adapter.tokenize(t));
    prompts.forEach((_, s) => adapter.clearSequence(s));
    const idx = await adapter.decode(prompts.map((tokens, slot) => ({ slot, pos: 0, tokens, wantsLogits: true })));
    const shared: SamplerConfig = { ...base, temperature: 1.2, topK: 40, topP: 0.95, repetitionPenalty: 1.3, seed: 99 };
    const others = (s: number): SamplerConfig => ({ ...base, topP: 0.9, seed: 500 + s });
    const a = adapter.createSampler(shared, prompts[0]);
    const b = adapter.createSampler(shared, prompts[0]);
    const aOthers = [3, 4, 5].map((s) => adapter.createSampler(others(s)));
    const bOthers = [3, 4, 5].map((s) => adapter.createSampler(others(s)));
    // The shared sampler's three items are interleaved with the others': its RNG and penalty window move on per item.
    const got = adapter.sampleMany!([
      { batchLogitIndex: idx[0]!, sampler: a },
      { batchLogitIndex: idx[3]!, sampler: aOthers[0]! },
      { batchLogitIndex: idx[1]!, sampler: a },
      { batchLogitIndex: idx[4]!, sampler: aOthers[1]! },
      { batchLogitIndex: idx[2]!, sampler: a },
      { batchLogitIndex: idx[5]!, sampler: aOthers[2]! },
    ]);
    const expected = [
      await adapter.sample(idx[0]!, b),
      await adapter.sample(idx[3]!, bOthers[0]!),
      await adapter.sample(idx[1]!, b),
      await adapter.sample(idx[4]!, bOthers[1]!),
      await adapter.sample(idx[2]!, b),
      await adapter.sample(idx[5]!, bOthers[2]!),
    ];
    expect(got).toEqual(expected);
    [a, b, ...aOthers, ...bOthers].forEach((h) => h.dispose());
  });

  it("keelSamplingOptions({ fused: false }) sends sampled items through the chain (the A/B switch of the benchmark)", async () => {
    expect(options({ fused: false })).toEqual({ fused: false });
    try {
      const before = counts();
      const r = await twins(3, (rand) => ({ ...base, topK: 40, topP: 0.95, seed: Math.floor(rand() * 2 ** 32) }));
      expect(firstMismatch(r)).toBeNull();
      const after = counts();
      expect(after.chain - before.chain).toBe(STEPS * ROUNDS * TEXTS.length);
      expect(after.fused - before.fused).toBe(0);
    } finally {
      expect(options({ fused: true })).toEqual({ fused: true });
    }
  }, 180_000);
});
