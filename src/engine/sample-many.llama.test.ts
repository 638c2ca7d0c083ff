/**
 * LlamaAdapter.sampleMany (Keel's addon: one synchronous native call samples a whole step) against the reference,
 * node-llama-cpp's async per-sequence sampleToken (LlamaAdapter.sample), on the real engine and the embedded model.
 *
 * Sampling never changes the context's logits (llama-adapter.contract.test.ts), so each step is decoded ONCE and
 * sampled twice: by twin A samplers through sampleMany and by twin B samplers (same config, same history) through
 * sample(). The twins must agree on every token of every step; A's tokens are fed back, so penalty histories, RNG
 * states and the adapter's penalty mirror (exercised by a reconfigure every step) carry over from step to step.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureDefaultModel } from "../model/default-model.js";
import { buildNativeAddon, getLlamaBinDir } from "../native/build.js";
import type { SamplerConfig, SamplerHandle } from "./backend.js";
import { LlamaAdapter } from "./llama/adapter.js";

const PROMPTS = [
  "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\nthe river in the morning<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\nqueues and servers<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\n{\"a\": 1}<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\nwrite a poem about stones<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
];
const STEPS = 20;
let adapter: LlamaAdapter;

beforeAll(async () => {
  // Keel's addon for the directory node-llama-cpp loads on CPU (cached after the first build; prepare.mjs builds it).
  const binDir = await getLlamaBinDir(false);
  if (binDir === null) throw new Error("node-llama-cpp loads no CPU addon here");
  await buildNativeAddon({ binDir });
  adapter = await LlamaAdapter.open({
    modelPath: await ensureDefaultModel(),
    sequences: PROMPTS.length,
    contextSize: 256,
    batchSize: 256,
    threads: 1,
    flashAttention: false,
    kvCacheType: "f16",
    gpu: "cpu",
  });
}, 300_000);

afterAll(async () => {
  await adapter?.dispose();
});

const base: SamplerConfig = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };

/** Per sequence: its config at a step (seeded configs reseed per position, as the engine does). */
type Plan = (step: number) => SamplerConfig;

/**
 * Run every plan for STEPS steps in one batch per step; sample each step with sampleMany (A twins) and with sample()
 * (B twins), reconfiguring both twins before every step. Returns A's tokens and B's tokens per sequence.
 */
async function runTwins(plans: Plan[], prompts: string[]): Promise<{ many: number[][]; single: number[][] }> {
  const sampleMany = adapter.sampleMany;
  if (!sampleMany) throw new Error("Keel's addon is not loaded (sampleMany absent)");
  const tokenized = prompts.map((p) => adapter.tokenize(p));
  const a: SamplerHandle[] = plans.map((plan, s) => adapter.createSampler(plan(0), tokenized[s]));
  const b: SamplerHandle[] = plans.map((plan, s) => adapter.createSampler(plan(0), tokenized[s]));
  const many: number[][] = plans.map(() => []);
  const single: number[][] = plans.map(() => []);
  plans.forEach((_, s) => adapter.clearSequence(s));
  let idx = await adapter.decode(tokenized.map((t, s) => ({ slot: s, pos: 0, tokens: t, wantsLogits: true })));
  for (let step = 0; step < STEPS; step++) {
    // 1. Same config for both twins (the mirror of the penalty history is what a reconfigure passes natively).
    plans.forEach((plan, s) => {
      a[s]!.configure(plan(step));
      b[s]!.configure(plan(step));
    });
    // 2. One synchronous call for the whole step, then the reference, one async call per sequence.
    const got = sampleMany(plans.map((_, s) => ({ batchLogitIndex: idx[s]!, sampler: a[s]! })));
    for (let s = 0; s < plans.length; s++) {
      const t = got[s];
      if (typeof t !== "number") throw t ?? new Error(`no result for sequence ${s}`);
      many[s]!.push(t);
      single[s]!.push(await adapter.sample(idx[s]!, b[s]!));
    }
    // 3. A's tokens go back into the model.
    idx = await adapter.decode(tokenized.map((t, s) => ({ slot: s, pos: t.length + step, tokens: [many[s]!.at(-1)!], wantsLogits: true })));
  }
  [...a, ...b].forEach((h) => h.dispose());
  return { many, single };
}

describe("LlamaAdapter.sampleMany (Keel's addon) equals sequential sample()", () => {
  it("runs on Keel's addon and says so in the backend description", async () => {
    expect(adapter.nativeAddon.kind).toBe("keel");
    expect(typeof adapter.sampleMany).toBe("function");
    expect((await adapter.backend()).addon).toBe("keel");
  });

  it("greedy, seeded temperature/top-k/top-p/min-p, repetition penalty and logit bias: the same tokens every step", async () => {
    const greedyToks = (await runTwins([() => base], [PROMPTS[0]!])).many[0]!;
    // A bias that moves greedy off its first pick at step 0 (a token greedy does not choose on its own).
    const boosted = greedyToks[0]! === 65 ? 66 : 65;
    const plans: Plan[] = [
      () => base,
      (step) => ({ ...base, temperature: 0.9, topK: 40, topP: 0.95, seed: 1000 + step }), // reseeded per position
      () => ({ ...base, temperature: 1.3, topK: 0, topP: 0.9, minP: 0.02, seed: 7 }), // RNG state carries over
      () => ({ ...base, repetitionPenalty: 1.8 }), // penalty history: prompt + every sampled token
      (step) => ({ ...base, temperature: 0.7, topK: 20, seed: 3 + step, repetitionPenalty: 1.5, bias: biasMap }),
      () => ({ ...base, bias: boostMap }),
    ];
    const biasMap = new Map([[greedyToks[1]!, -Infinity]]);
    const boostMap = new Map([[boosted, 50]]);
    const { many, single } = await runTwins(plans, PROMPTS);
    expect(many).toEqual(single);
    // The samplers really differ from plain greedy where their prompt is greedy's (so a sampler mix-up would show):
    // sequence 5 has sequence 0's prompt with a +50 bias, and its first token is the boosted one.
    expect(many[0]).toEqual(greedyToks);
    expect(many[5]![0]).toBe(boosted);
    // The penalty changed something over 20 steps (the history is in play), and temperature draws are not greedy.
    const unpenalized = (await runTwins([() => base], [PROMPTS[3]!])).many[0]!;
    expect(many[3]).not.toEqual(unpenalized);
    const greedy1 = (await runTwins([() => base], [PROMPTS[1]!])).many[0]!;
    expect(many[1]).not.toEqual(greedy1);
  });

  it("greedy samplers (with or without a bias) take the fast path, sampled ones the fused path, greedy with a penalty the chain", async () => {
    const counts = (): { fast: number; fused: number; chain: number } => (adapter as unknown as { llama: { _bindings: { keelSamplingCounts(): { fast: number; fused: number; chain: number } } } }).llama._bindings.keelSamplingCounts();
    const greedyToks = (await runTwins([() => base], [PROMPTS[2]!])).many[0]!;
    const before = counts();
    // A bias that bans greedy's own second pick, and one that lifts a token greedy never picks to the top.
    const fastPlans: Plan[] = [() => base, () => ({ ...base, bias: new Map([[greedyToks[1]!, -Infinity], [7, 0.25]]) }), () => ({ ...base, bias: new Map([[66, 40]]) })];
    const fast = await runTwins(fastPlans, [PROMPTS[2]!, PROMPTS[2]!, PROMPTS[4]!]);
    expect(fast.many).toEqual(fast.single);
    expect(fast.many[1]).not.toEqual(fast.many[0]); // the ban changed the text: the bias is applied on the fast path
    expect(fast.many[2]![0]).toBe(66);
    const mid = counts();
    expect(mid.fast - before.fast).toBe(3 * STEPS);
    expect(mid.chain - before.chain).toBe(0);
    expect(mid.fused - before.fused).toBe(0);
    const chainPlans: Plan[] = [() => ({ ...base, repetitionPenalty: 1.5 }), (step) => ({ ...base, temperature: 0.8, seed: 9 + step })];
    const chain = await runTwins(chainPlans, [PROMPTS[0]!, PROMPTS[1]!]);
    expect(chain.many).toEqual(chain.single);
    const after = counts();
    expect(after.chain - mid.chain).toBe(STEPS);
    expect(after.fused - mid.fused).toBe(STEPS);
    expect(after.fast - mid.fast).toBe(0);
  });


  it("a biased greedy pick leaves the logits row as it was: a plain greedy pick of the same row after it is unchanged", async () => {
    const sampleMany = adapter.sampleMany!;
    const prompt = adapter.tokenize(PROMPTS[1]!);
    adapter.clearSequence(0);
    const [row] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
    const plain = adapter.createSampler(base, prompt);
    const pick = (handle: SamplerHandle): number => {
      const [t] = sampleMany([{ batchLogitIndex: row!, sampler: handle }]);
      if (typeof t !== "number") throw t ?? new Error("no token");
      return t;
    };
    const top = pick(plain);
    // The biases go onto the row during the scan: a ban of the top token and a lift of another token to the top.
    const other = top === 65 ? 66 : 65;
    const biased = adapter.createSampler({ ...base, bias: new Map([[top, -Infinity], [other, 80]]) }, prompt);
    expect(pick(biased)).toBe(other);
    expect(pick(plain)).toBe(top);
    const raw = await adapter.logprobs(row!, top, 0);
    expect(pick(biased)).toBe(other);
    expect(await adapter.logprobs(row!, top, 0)).toEqual(raw);
    [plain, biased].forEach((h) => h.dispose());
  });
  it("under a grammar too: the same tokens, each twin's grammar state advanced by its own sampler", async () => {
    const grammar = adapter.compileGrammar('root ::= [a-z ]{1,40} "."', "root");
    const states = { a: [0, 1].map(() => adapter.createGrammarState(grammar)), b: [0, 1].map(() => adapter.createGrammarState(grammar)) };
    const tokenized = PROMPTS.slice(0, 2).map((p) => adapter.tokenize(p));
    // Under a grammar sampleMany first masks the tokens whose bytes are not UTF-8 (keel-grammar-utf8.cpp; this
    // grammar's output is ASCII, so always between characters): twin B bans the same tokens by its bias, so both
    // chains see the same candidates.
    const notUtf8 = new Map<number, number>();
    for (let t = 0; t < adapter.vocabSize; t++) {
      try {
        new TextDecoder("utf-8", { fatal: true }).decode(adapter.bytesOf(t), { stream: true });
      } catch {
        notUtf8.set(t, -Infinity);
      }
    }
    expect(notUtf8.size).toBeGreaterThan(0);
    const cfg = (s: number, step: number, twin: "a" | "b"): SamplerConfig => ({ ...base, temperature: 0.9, topK: 40, seed: 50 + s + step, grammar: states[twin][s]!, ...(twin === "b" ? { bias: notUtf8 } : {}) });
    const a = [0, 1].map((s) => adapter.createSampler(cfg(s, 0, "a")));
    const b = [0, 1].map((s) => adapter.createSampler(cfg(s, 0, "b")));
    tokenized.forEach((_, s) => adapter.clearSequence(s));
    let idx = await adapter.decode(tokenized.map((t, s) => ({ slot: s, pos: 0, tokens: t, wantsLogits: true })));
    const many: number[][] = [[], []];
    const single: number[][] = [[], []];
    for (let step = 0; step < 8; step++) {
      [0, 1].forEach((s) => {
        a[s]!.configure(cfg(s, step, "a"));
        b[s]!.configure(cfg(s, step, "b"));
      });
      const got = adapter.sampleMany!([0, 1].map((s) => ({ batchLogitIndex: idx[s]!, sampler: a[s]! })));
      for (let s = 0; s < 2; s++) {
        if (typeof got[s] !== "number") throw got[s];
        many[s]!.push(got[s] as number);
        single[s]!.push(await adapter.sample(idx[s]!, b[s]!));
      }
      idx = await adapter.decode(tokenized.map((t, s) => ({ slot: s, pos: t.length + step, tokens: [many[s]!.at(-1)!], wantsLogits: true })));
    }
    expect(many).toEqual(single);
    // The grammar constrained them (lowercase letters and spaces only), and both twins' states are alive.
    const text = many.map((toks) => Buffer.concat(toks.map((t) => Buffer.from(adapter.bytesOf(t)))).toString("latin1"));
    for (const t of text) expect(t).toMatch(/^[a-z .]+$/);
    expect([...states.a, ...states.b].every((st) => !st.dead)).toBe(true);
    [...a, ...b].forEach((h) => h.dispose());
  });

  it("a failing item fails alone: a disposed sampler and a foreign handle are Errors, the others keep their tokens", async () => {
    const tokenized = PROMPTS.slice(0, 4).map((p) => adapter.tokenize(p));
    tokenized.forEach((_, s) => adapter.clearSequence(s));
    const idx = await adapter.decode(tokenized.map((t, s) => ({ slot: s, pos: 0, tokens: t, wantsLogits: true })));
    const seeded = (s: number): SamplerConfig => ({ ...base, temperature: 0.8, topK: 30, seed: 11 + s });
    const live = [0, 1, 2, 3].map((s) => adapter.createSampler(seeded(s)));
    const twins = [0, 1, 2, 3].map((s) => adapter.createSampler(seeded(s)));
    live[1]!.dispose();
    const foreign: SamplerHandle = { configure: () => {}, dispose: () => {} };
    const got = adapter.sampleMany!([
      { batchLogitIndex: idx[0]!, sampler: live[0]! },
      { batchLogitIndex: idx[1]!, sampler: live[1]! },
      { batchLogitIndex: idx[2]!, sampler: foreign },
      { batchLogitIndex: idx[2]!, sampler: live[2]! },
      { batchLogitIndex: idx[3]!, sampler: live[3]! },
    ]);
    expect(got[1]).toBeInstanceOf(Error);
    expect((got[1] as Error).message).toMatch(/disposed/);
    expect(got[2]).toBeInstanceOf(Error);
    expect((got[2] as Error).message).toMatch(/not created by this adapter/);
    const expected = [await adapter.sample(idx[0]!, twins[0]!), await adapter.sample(idx[2]!, twins[2]!), await adapter.sample(idx[3]!, twins[3]!)];
    expect([got[0], got[3], got[4]]).toEqual(expected);
    // Sequences 2 and 3 have different prompts: their tokens came from their own logits (different positions).
    expect(new Set(expected).size).toBeGreaterThan(1);
    [...live, ...twins].forEach((h) => h.dispose());
  });

  it("is refused while a decode is in flight (one native call at a time)", async () => {
    adapter.clearSequence(0);
    const sampler = adapter.createSampler(base);
    // A prefill the measured pace calls quick runs on this thread (nothing in flight): forget the pace so this one
    // goes to node-llama-cpp's worker, as an engine's first prefill does.
    (adapter as unknown as { pace: { msPerToken: number | null } }).pace.msPerToken = null;
    const pending = adapter.decode([{ slot: 0, pos: 0, tokens: adapter.tokenize(PROMPTS[2]!), wantsLogits: true }]);
    expect(() => adapter.sampleMany!([{ batchLogitIndex: 0, sampler }])).toThrow(/in flight/);
    await pending;
    sampler.dispose();
  });

  it("decode steps (one token per sequence) run on the calling thread; prefill chunks on node-llama-cpp's worker", async () => {
    // A decode on the worker is still in flight when decode() hands back its promise; one on this thread is done.
    const inFlight = (): boolean => (adapter as unknown as { guard: { decoding: boolean } }).guard.decoding;
    const decodeNoting = async (items: Parameters<LlamaAdapter["decode"]>[0], where: string[]): Promise<number[]> => {
      const p = adapter.decode(items);
      where.push(inFlight() ? "worker" : "here");
      return p;
    };
    const prompts = [adapter.tokenize(PROMPTS[0]!), adapter.tokenize(PROMPTS[1]!)];
    const run = async (): Promise<{ tokens: number[][]; where: string[] }> => {
      for (const s of [0, 1]) adapter.clearSequence(s);
      // The first prefill of an engine goes to the worker (no pace measured yet; a quick one later stays here).
      (adapter as unknown as { pace: { msPerToken: number | null } }).pace.msPerToken = null;
      const samplers = [adapter.createSampler(base), adapter.createSampler(base)];
      const where: string[] = [];
      const tokens: number[][] = [[], []];
      let idx = await decodeNoting(prompts.map((p, s) => ({ slot: s, pos: 0, tokens: p, wantsLogits: true })), where);
      for (let step = 0; step < 6; step++) {
        for (const s of [0, 1]) tokens[s]!.push(await adapter.sample(idx[s]!, samplers[s]!));
        idx = await decodeNoting(prompts.map((p, s) => ({ slot: s, pos: p.length + step, tokens: [tokens[s]!.at(-1)!], wantsLogits: true })), where);
      }
      samplers.forEach((h) => h.dispose());
      return { tokens, where };
    };
    const fast = await run();
    expect(fast.where).toEqual(["worker", ...new Array(6).fill("here")]);
    // A refused decode step (a position behind the sequence's cells) throws and leaves the context usable.
    await expect(adapter.decode([{ slot: 0, pos: 0, tokens: [fast.tokens[0]![0]!], wantsLogits: true }])).rejects.toThrow();
    // The reference: the same sequences decoded only on the worker (node-llama-cpp's decodeBatch).
    const native = (adapter as unknown as { native: { decodeSync: unknown } }).native;
    const saved = native.decodeSync;
    native.decodeSync = null;
    try {
      const ref = await run();
      expect(ref.where).toEqual(new Array(7).fill("worker"));
      expect(fast.tokens).toEqual(ref.tokens);
      expect(new Set(fast.tokens.map((t) => t.join())).size).toBe(2);
    } finally {
      native.decodeSync = saved;
    }
  });
  it("a decode queued with host work alongside (keelDecodeBatch(ctx, false), then keelSynchronize) gives the waiting decode's tokens", async () => {
    const inFlight = (): boolean => (adapter as unknown as { guard: { decoding: boolean } }).guard.decoding;
    const prompt = adapter.tokenize(PROMPTS[4]!);
    const run = async (alongside?: () => void): Promise<number[]> => {
      adapter.clearSequence(0);
      const sampler = adapter.createSampler(base);
      const tokens: number[] = [];
      let idx = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }], 0, alongside);
      for (let step = 0; step < 8; step++) {
        tokens.push(adapter.sampleMany!([{ batchLogitIndex: idx[0]!, sampler }])[0] as number);
        idx = await adapter.decode([{ slot: 0, pos: prompt.length + step, tokens: [tokens.at(-1)!], wantsLogits: true }], step + 1, alongside);
      }
      sampler.dispose();
      return tokens;
    };
    const during: boolean[] = [];
    const queued = await run(() => void during.push(inFlight()));
    expect(during).toHaveLength(9);
    expect(during.every((d) => d)).toBe(true); // the host work ran inside the decode, before its wait
    expect(queued).toEqual(await run());
    expect(new Set(queued).size).toBeGreaterThan(1);
  });
});
