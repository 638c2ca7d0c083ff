/**
 * Contract tests for the node-llama-cpp internals that LlamaAdapter relies on (pinned 3.21.1). Re-run on every
 * upgrade: a change in the native batch API, in KV clearing, in failure rollback, or in the sequential-sampling
 * workaround for the cross-sequence token race (docs/upstream.md) makes one of these fail.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureDefaultModel } from "../../model/default-model.js";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { GrammarMaskedError, type GrammarState, type SamplerConfig, type SamplerHandle } from "../backend.js";
import { LlamaAdapter, slotOrder } from "./adapter.js";

const SEQS = 4;
let adapter: LlamaAdapter;
let modelPath: string;

beforeAll(async () => {
  modelPath = await ensureDefaultModel();
  adapter = await LlamaAdapter.open({
    modelPath,
    sequences: SEQS,
    contextSize: 512,
    batchSize: 128,
    threads: 1,
    flashAttention: false,
    kvCacheType: "f16",
    gpu: "cpu",
  });
});

afterAll(async () => {
  await adapter?.dispose();
});

const greedy = (a: LlamaAdapter = adapter) => a.createSampler({ temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 });

/** Greedy-generate `n` tokens for several prompts at once, one batch per step, sampling sequentially (on `on`). */
async function generateTogether(prompts: number[][], n: number, slots: number[] = prompts.map((_, s) => s), on: LlamaAdapter = adapter): Promise<number[][]> {
  const samplers: SamplerHandle[] = prompts.map(() => greedy(on));
  const out: number[][] = prompts.map(() => []);
  for (let s = 0; s < SEQS; s++) on.clearSequence(s);
  // Prefill all prompts in one batch (prompt s on slot slots[s], items in prompt order).
  let idx = await on.decode(prompts.map((p, s) => ({ slot: slots[s]!, pos: 0, tokens: p, wantsLogits: true })));
  for (let step = 0; step < n; step++) {
    for (let s = 0; s < prompts.length; s++) out[s]!.push(await on.sample(idx[s]!, samplers[s]!));
    if (step === n - 1) break;
    idx = await on.decode(prompts.map((p, s) => ({ slot: slots[s]!, pos: p.length + step, tokens: [out[s]!.at(-1)!], wantsLogits: true })));
  }
  samplers.forEach((x) => x.dispose());
  return out;
}

describe("llama.cpp adapter contract (node-llama-cpp 3.21.1 internals)", () => {
  const prompts = ["<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nthe river in the morning<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nqueues and servers<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\n{\"a\": 1}<|im_end|>\n<|im_start|>assistant\n"];

  it("tokenizes ChatML markers as single special tokens and maps token bytes back to the text", () => {
    const toks = adapter.tokenize("<|im_start|>user\nhé 🦊");
    expect(adapter.bytesOf(toks[0]!)).toHaveLength(0); // control token: no text
    const bytes = Buffer.concat(toks.slice(1).map((t) => Buffer.from(adapter.bytesOf(t))));
    expect(bytes.toString("utf8")).toBe("user\nhé 🦊");
  });

  it("batched sequences with sequential sampling get exactly their solo tokens (no cross-sequence leak)", async () => {
    const tokenized = prompts.map((p) => adapter.tokenize(p));
    const solo: number[][] = [];
    for (const p of tokenized) solo.push((await generateTogether([p], 24))[0]!);
    const together = await generateTogether(tokenized, 24);
    expect(together).toEqual(solo);
    // The sequences really differ, so a token taken from another sequence would be visible.
    expect(new Set(solo.map((s) => s.join(","))).size).toBe(prompts.length);
  });

  it("a batch whose items are not in slot order (it is added to llama.cpp in slot order) gives each item its own logits", async () => {
    const tokenized = prompts.map((p) => adapter.tokenize(p));
    const solo: number[][] = [];
    for (const p of tokenized) solo.push((await generateTogether([p], 16))[0]!);
    // Items in prompt order on slots 2, 0, 3, 1: every item's logit index must still be its own sequence's.
    expect(await generateTogether(tokenized, 16, [2, 0, 3, 1])).toEqual(solo);
    expect(await generateTogether(tokenized.slice(0, 3), 16, [3, 1, 0])).toEqual(solo.slice(0, 3));
  });

  it("clearSequence frees a slot's KV at once: a new prompt on a reused slot matches a fresh run", async () => {
    const a = adapter.tokenize(prompts[0]!);
    const b = adapter.tokenize(prompts[1]!);
    const fresh = (await generateTogether([b], 12))[0]!;
    await generateTogether([a], 12); // slot 0 now holds a's KV
    const reused = (await generateTogether([b], 12))[0]!; // cleared first by generateTogether
    expect(reused).toEqual(fresh);
  });

  it("a refused batch throws, is rolled back, and the next decode works", async () => {
    adapter.clearSequence(0);
    // A token id outside the vocabulary makes llama.cpp refuse the whole batch (docs/upstream.md); the valid item
    // in the same batch is collateral, which is why the step loop validates ids before batching.
    await expect(
      adapter.decode([
        { slot: 1, pos: 0, tokens: [65], wantsLogits: true },
        { slot: 0, pos: 0, tokens: [65, adapter.vocabSize + 10], wantsLogits: true },
      ]),
    ).rejects.toThrow();
    adapter.clearSequence(1);
    const again = (await generateTogether([adapter.tokenize(prompts[2]!)], 6))[0]!;
    const solo = (await generateTogether([adapter.tokenize(prompts[2]!)], 6))[0]!;
    expect(again).toEqual(solo);
  });

  it("refuses a second native call while a decode is in flight", async () => {
    adapter.clearSequence(0);
    // A prefill the measured pace calls quick runs on this thread (nothing in flight): forget the pace so this one
    // goes to a worker, as the first prefill of an engine does.
    (adapter as unknown as { pace: { msPerToken: number | null } }).pace.msPerToken = null;
    const pending = adapter.decode([{ slot: 0, pos: 0, tokens: adapter.tokenize(prompts[3]!), wantsLogits: true }]);
    await expect(adapter.decode([{ slot: 1, pos: 0, tokens: [65], wantsLogits: true }])).rejects.toThrow(/in flight/);
    expect(() => adapter.clearSequence(1)).toThrow(/in flight/);
    await pending;
  });

  it("tokenLowerBound never exceeds the real token count", () => {
    const texts = ["", "hello", "<|im_start|>user\nhi<|im_end|>\n", "<|im_end|>".repeat(50), "ünïcödé 🦊 日本語 ".repeat(20), "x".repeat(3000), "a<|im_start|>b<|endoftext|>c"];
    for (const t of texts) expect(adapter.tokenLowerBound(t), JSON.stringify(t).slice(0, 40)).toBeLessThanOrEqual(adapter.tokenize(t).length);
    expect(adapter.tokenLowerBound("<|im_end|>".repeat(50))).toBe(50);
  });

  it("logprobs equal the full softmax of the raw logits (window and fallback paths) and leave the logits untouched", async () => {
    // Reference: the whole sorted distribution from a plain greedy sampler with probabilities (one native call).
    const native = (adapter as unknown as { native: { ctx: { sampleToken(i: number, s: unknown, p: boolean): Promise<[number, number[]]> }; model: unknown; SamplerClass: new (m: unknown) => { applyConfig(c: object): void; dispose(): void } } }).native;
    const ref = new native.SamplerClass(native.model);
    ref.applyConfig({ temperature: 0 });
    adapter.clearSequence(0);
    const prompt = adapter.tokenize(prompts[1]!);
    let [idx] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
    const biased = adapter.createSampler({ temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 2 }, prompt);
    for (let step = 0; step < 8; step++) {
      const [, full] = await native.ctx.sampleToken(idx!, ref, true);
      const rank = (t: number): number => full.findIndex((v, i) => i % 2 === 0 && v === t) / 2;
      const lp = (t: number): number => Math.log(full[2 * rank(t) + 1]!);
      const least = full.at(-2)!; // the least likely token: outside any top-k window
      const got = await adapter.logprobs(idx!, least, 5);
      expect(got.top.map((e) => e.token)).toEqual([0, 1, 2, 3, 4].map((i) => full[2 * i]));
      got.top.forEach((e) => expect(Math.abs(e.logprob - lp(e.token))).toBeLessThan(1e-5));
      expect(got.logprob).toBeCloseTo(Math.max(-9999, lp(least)), 4);
      // The logits are untouched by the logprobs calls and by a penalised sampler: the raw distribution is the same.
      const token = await adapter.sample(idx!, biased);
      expect((await native.ctx.sampleToken(idx!, ref, true))[1]).toEqual(full);
      expect((await adapter.logprobs(idx!, token, 0)).logprob).toBeCloseTo(lp(token), 5);
      [idx] = await adapter.decode([{ slot: 0, pos: prompt.length + step, tokens: [token], wantsLogits: true }]);
    }
    biased.dispose();
    ref.dispose();
  });

  it("repetition-penalty state is a pure function of the history: kept, reconfigured or rebuilt, the same tokens", async () => {
    const cfg = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map<number, number>(), repetitionPenalty: 3 };
    const prompt = adapter.tokenize(prompts[2]!);
    /** Greedy-generate 12 tokens; `samplerAt(history)` gives the sampler for the next position. */
    const run = async (samplerAt: (history: number[]) => SamplerHandle): Promise<number[]> => {
      adapter.clearSequence(0);
      const out: number[] = [];
      let [idx] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
      for (let i = 0; i < 12; i++) {
        out.push(await adapter.sample(idx!, samplerAt([...prompt, ...out])));
        [idx] = await adapter.decode([{ slot: 0, pos: prompt.length + i, tokens: [out.at(-1)!], wantsLogits: true }]);
      }
      return out;
    };
    const kept = adapter.createSampler(cfg, prompt);
    const keptTokens = await run(() => kept);
    const reconfigured = adapter.createSampler(cfg, prompt);
    const reconfiguredTokens = await run(() => (reconfigured.configure({ ...cfg, bias: new Map() }), reconfigured));
    const fresh: SamplerHandle[] = [];
    const rebuiltTokens = await run((history) => {
      fresh.push(adapter.createSampler(cfg, history));
      return fresh.at(-1)!;
    });
    const plain = greedy();
    const unpenalised = await run(() => plain);
    plain.dispose();
    expect(reconfiguredTokens).toEqual(keptTokens);
    expect(rebuiltTokens).toEqual(keptTokens);
    expect(keptTokens).not.toEqual(unpenalised);
    [kept, reconfigured, ...fresh].forEach((x) => x.dispose());
  });

  it("lists end-of-generation tokens and bans them under ignore_eos", async () => {
    expect(adapter.eogTokens.length).toBeGreaterThan(0);
    expect(adapter.eogTokens.every((t) => adapter.isEndOfGeneration(t))).toBe(true);
  });
});

/**
 * Run a node-llama-cpp hazard in a child process (it may abort the process: that is what it demonstrates). Returns
 * the exit status and the output. Uses the package directly, as our adapter never would.
 */
function inChild(body: string): { status: number | null; signal: NodeJS.Signals | null; out: string } {
  // A script file, not \`node -e\`: node-llama-cpp's binary self-test re-spawns process.execArgv.
  const pkg = pathToFileURL(path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../node_modules/node-llama-cpp/dist/index.js")).href;
  const script = `
    const { getLlama } = await import(${JSON.stringify(pkg)});
    const llama = await getLlama({ gpu: false, build: "never" });
    const model = await llama.loadModel({ modelPath: ${JSON.stringify(modelPath)} });
    const B = llama._bindings, M = model._model;
    const grammar = new B.AddonGrammar('root ::= "yes" | "no"', { addonExports: B, rootRuleName: "root" });
    const state = new B.AddonGrammarEvaluationState(M, grammar);
    const tok = (t) => model.tokenize(t, false);
    ${body}
    console.log("SURVIVED");
    process.exit(0);`;
  const dir = mkdtempSync(path.join(tmpdir(), "keel-hazard-"));
  const file = path.join(dir, "hazard.mjs");
  writeFileSync(file, script);
  const r = spawnSync(process.execPath, [file], { encoding: "utf8", timeout: 60_000 });
  rmSync(dir, { recursive: true, force: true });
  return { status: r.status, signal: r.signal, out: `${r.stdout}${r.stderr}` };
}

describe("slotOrder", () => {
  it("orders a batch's items by slot, ties kept in batch order", () => {
    expect(slotOrder([{ slot: 5 }, { slot: 0 }, { slot: 3 }, { slot: 1 }])).toEqual([1, 3, 2, 0]);
    expect(slotOrder([{ slot: 2 }, { slot: 1 }, { slot: 2 }])).toEqual([1, 0, 2]);
    expect(slotOrder([])).toEqual([]);
  });
});

describe("grammar support (node-llama-cpp 3.21.1 AddonGrammar / AddonSampler statics)", () => {
  const plain: SamplerConfig = { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 };
  /** The token ids of plain text (no BOS). */
  const ids = (text: string): number[] => {
    const t = adapter.tokenize(text);
    return adapter.bosToken !== null && t[0] === adapter.bosToken ? t.slice(1) : t;
  };
  const textOf = (tokens: number[]): string => Buffer.concat(tokens.map((t) => Buffer.from(adapter.bytesOf(t)))).toString("utf8");
  const yesNo = () => adapter.createGrammarState(adapter.compileGrammar('root ::= "yes" | "no"', "root"));
  const eog = () => adapter.eogTokens[0]!;
  /** Prefill a prompt on slot 0 and return the logit index of its last token. */
  const prefill = async (prompt = "<|im_start|>user\nanswer<|im_end|>\n<|im_start|>assistant\n"): Promise<{ idx: number; pos: number }> => {
    adapter.clearSequence(0);
    const tokens = adapter.tokenize(prompt);
    const [idx] = await adapter.decode([{ slot: 0, pos: 0, tokens, wantsLogits: true }]);
    return { idx: idx!, pos: tokens.length };
  };

  it("canBeNext follows the grammar; EOG is allowed exactly when the rule is complete", () => {
    const s = yesNo();
    const [y, es] = ids("yes");
    expect(adapter.grammarCanBeNext(s, y!)).toBe(true);
    expect(adapter.grammarCanBeNext(s, ids("q")[0]!)).toBe(false);
    expect(adapter.grammarIsComplete(s)).toBe(false);
    adapter.grammarAccept(s, y!);
    adapter.grammarAccept(s, es!);
    expect(adapter.grammarIsComplete(s)).toBe(true);
    expect(adapter.grammarCanBeNext(s, y!)).toBe(false);
  });

  it("compiled grammars are cached by text; a prefix literal makes a root variant; a bad grammar throws", () => {
    const a = adapter.compileGrammar('root ::= "yes" | "no"', "root");
    expect(adapter.compileGrammar('root ::= "yes" | "no"', "root")).toBe(a);
    // Least recently used first out: 40 other grammars later it is compiled again (a new handle); the old handle works.
    for (let i = 0; i < 40; i++) adapter.compileGrammar(`root ::= "x${i}"`, "root");
    expect(adapter.compileGrammar('root ::= "yes" | "no"', "root")).not.toBe(a);
    expect(adapter.grammarCanBeNext(adapter.createGrammarState(a), ids("y")[0]!)).toBe(true);
    const s = adapter.createGrammarState(adapter.compileGrammar('root ::= "yes" | "no"', "root", 'a "q"\\'));
    for (const t of ids('a "q"\\no')) adapter.grammarAccept(s, t);
    expect(adapter.grammarIsComplete(s)).toBe(true);
    expect(() => adapter.compileGrammar('root ::= "yes" | "no"', "missing")).toThrow();
    expect(() => adapter.compileGrammar("root ::= [a-", "root")).toThrow();
    expect(() => adapter.compileGrammar("root ::= undefined-rule", "root")).toThrow();
  });

  it("hazard (a): llama.cpp aborts on an EOG accepted into an incomplete grammar; our accept refuses it in JS", () => {
    const raw = inChild(`B.AddonSampler.acceptGrammarEvaluationStateToken(state, ${eog()});`);
    expect(raw.out).not.toContain("SURVIVED");
    expect(raw.status === 134 || raw.signal === "SIGABRT").toBe(true);
    const s = yesNo();
    expect(() => adapter.grammarAccept(s, eog())).toThrow(/never fed/);
    expect(s.dead).toBe(false); // nothing reached llama.cpp: the state is intact
    expect(adapter.grammarCanBeNext(s, ids("y")[0]!)).toBe(true);
  });

  it("hazard (b): reusing a state after a rejected accept aborts; our accept checks first and retires the state", () => {
    const raw = inChild(`try { B.AddonSampler.acceptGrammarEvaluationStateToken(state, tok("q")[0]); } catch (e) { console.log("caught", e.message); }
      B.AddonSampler.canBeNextTokenForGrammarEvaluationState(state, tok("y")[0]);`);
    expect(raw.out).toContain("caught");
    expect(raw.out).not.toContain("SURVIVED");
    expect(raw.status === 134 || raw.signal === "SIGABRT").toBe(true);
    const s = yesNo();
    expect(() => adapter.grammarAccept(s, ids("q")[0]!)).toThrow(/cannot continue/);
    expect(s.dead).toBe(true);
    expect(adapter.grammarCanBeNext(s, ids("y")[0]!)).toBe(false); // no native call on a dead state
    expect(() => adapter.grammarAccept(s, ids("y")[0]!)).toThrow(/dead/);
  });

  it("a sampler with a grammar attached samples only what the grammar allows, across reconfigurations", async () => {
    for (const temperature of [0, 1.5]) {
      let { idx, pos } = await prefill();
      const s = yesNo();
      const sampler = adapter.createSampler({ ...plain, temperature, grammar: s });
      const out: number[] = [];
      for (let i = 0; i < 3 && !adapter.isEndOfGeneration(out.at(-1) ?? -1); i++) {
        // Reseeding per position (as the step loop does) must keep the grammar attached.
        sampler.configure({ ...plain, temperature, seed: 100 + i, grammar: s });
        out.push(await adapter.sample(idx, sampler));
        [idx] = await adapter.decode([{ slot: 0, pos: pos++, tokens: [out.at(-1)!], wantsLogits: true }]) as [number];
      }
      expect(adapter.isEndOfGeneration(out.at(-1)!)).toBe(true);
      expect(["yes", "no"]).toContain(textOf(out.slice(0, -1)));
      sampler.dispose();
    }
  });

  it("hazard (c): with every token masked, llama.cpp returns a token outside the grammar without any error", async () => {
    // Raw native calls (what the adapter wraps): a grammar that allows only "y…"/"n…" and a bias banning both.
    const native = (adapter as unknown as { native: { ctx: { sampleToken(i: number, s: unknown): Promise<number> }; model: unknown; SamplerClass: new (m: unknown) => { applyConfig(c: object): void; dispose(): void }; grammar: { Grammar: new (t: string, o: object) => object; State: new (m: unknown, g: object) => object } } }).native;
    const llamaBindings = (adapter as unknown as { llama: { _bindings: unknown } }).llama._bindings;
    const picks: number[] = [];
    for (const temperature of [0, 0.8]) {
      const { idx } = await prefill();
      const state = new native.grammar.State(native.model, new native.grammar.Grammar('root ::= "yes" | "no"', { addonExports: llamaBindings, rootRuleName: "root" }));
      const raw = new native.SamplerClass(native.model);
      raw.applyConfig({ temperature, seed: 1, grammarEvaluationState: state, tokenBiasKeys: Uint32Array.from(ids("yn")), tokenBiasValues: Float32Array.of(-Infinity, -Infinity) });
      picks.push(await native.ctx.sampleToken(idx, raw)); // resolves: no exception reaches the caller
      raw.dispose();
    }
    // Neither pick is allowed by the grammar: greedy took candidate 0, the seeded draw took whatever the NaNs gave.
    for (const t of picks) expect(adapter.grammarCanBeNext(yesNo(), t)).toBe(false);
  });

  it("every token masked (grammar ∩ bias = ∅) is caught: GrammarMaskedError, state retired, resample works", async () => {
    for (const temperature of [0, 0.8]) {
      const { idx } = await prefill();
      const s = yesNo();
      const ban = new Map(ids("yn").map((t) => [t, -Infinity] as [number, number]));
      const sampler = adapter.createSampler({ ...plain, temperature, bias: ban, grammar: s });
      await expect(adapter.sample(idx, sampler)).rejects.toBeInstanceOf(GrammarMaskedError);
      expect(s.dead).toBe(true);
      sampler.configure({ ...plain, temperature, bias: ban, grammar: null });
      const t = await adapter.sample(idx, sampler);
      expect(ids("yn")).not.toContain(t);
      sampler.dispose();
    }
  });

  it("grammarCanContinue: true while a non-EOG, unbanned continuation exists; false when only EOG is left", async () => {
    const { idx } = await prefill();
    const s = adapter.createGrammarState(adapter.compileGrammar('root ::= "ab" | "abc"', "root"));
    for (const t of ids("ab")) adapter.grammarAccept(s, t);
    expect(adapter.grammarIsComplete(s)).toBe(true);
    expect(await adapter.grammarCanContinue(idx, s, new Map())).toBe(true);
    expect(await adapter.grammarCanContinue(idx, s, new Map([[ids("c")[0]!, -Infinity]]))).toBe(false);
    const done: GrammarState = yesNo();
    for (const t of ids("no")) adapter.grammarAccept(done, t);
    expect(await adapter.grammarCanContinue(idx, done, new Map())).toBe(false);
    // The probe works on a clone: the state is unchanged and still usable.
    expect(adapter.grammarIsComplete(done)).toBe(true);
    expect(done.dead).toBe(false);
  });

  it("lists special (control / user-defined) tokens that are not end-of-generation", () => {
    const specials = adapter.specialTokens();
    expect(specials.map((s) => s.text)).toContain("<|im_start|>");
    expect(specials.some((s) => adapter.isEndOfGeneration(s.token))).toBe(false);
  });
});

describe("the shared KV buffer (--kv_unified; Keel's addon sets llama.cpp's kv_unified before the context is made)", () => {
  let unified: LlamaAdapter;
  beforeAll(async () => {
    unified = await LlamaAdapter.open({ modelPath, sequences: SEQS, contextSize: 512, batchSize: 128, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu", kvUnified: true });
  });
  afterAll(async () => {
    await unified?.dispose();
  });

  it("is on when asked for (one sequence may then hold more than its share of the cells), off by default and after", async () => {
    expect(unified.kvUnified).toBe(true);
    expect(adapter.kvUnified).toBe(false);
    // node-llama-cpp sizes the context at contextSize × sequences cells (2,048 here): one stream of all of them when
    // shared, four of 512 when not. 600 tokens on one slot fit only the shared buffer: llama.cpp got kv_unified.
    const long = Array.from({ length: 600 }, (_, i) => 65 + (i % 26));
    for (const a of [unified, adapter]) for (let s = 0; s < SEQS; s++) a.clearSequence(s);
    const fill = async (a: LlamaAdapter) => {
      for (let at = 0; at < long.length; at += 100) await a.decode([{ slot: 0, pos: at, tokens: long.slice(at, at + 100), wantsLogits: true }]);
    };
    await expect(fill(unified)).resolves.toBeUndefined();
    await expect(fill(adapter)).rejects.toThrow(/KV slot/);
    for (const a of [unified, adapter]) a.clearSequence(0);
    // The addon's switch is set for one context's creation only: a context made after it has one stream per sequence.
    const after = await LlamaAdapter.open({ modelPath, sequences: SEQS, contextSize: 512, batchSize: 128, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
    expect(after.kvUnified).toBe(false);
    await expect(fill(after)).rejects.toThrow(/KV slot/);
    await after.dispose();
  });

  it("prompts of different lengths prefilled in one batch, on slots out of order, get exactly their solo tokens", async () => {
    const texts = ["hi", "the river in the morning, and the queue of the servers after it", "queues", "{\"a\": 1, \"b\": [2, 3]}"];
    const tokenized = texts.map((t) => unified.tokenize(`<|im_start|>user\n${t}<|im_end|>\n<|im_start|>assistant\n`));
    expect(new Set(tokenized.map((t) => t.length)).size).toBe(texts.length);
    const solo: number[][] = [];
    for (const p of tokenized) solo.push((await generateTogether([p], 16, [0], unified))[0]!);
    expect(await generateTogether(tokenized, 16, [2, 0, 3, 1], unified)).toEqual(solo);
    // A reused slot (cleared first) gives a fresh run's tokens: no cell of the shared buffer is left to it.
    expect((await generateTogether([tokenized[1]!], 16, [3], unified))[0]).toEqual(solo[1]);
  });
});
