import { describe, expect, it } from "vitest";
import fc from "fast-check";
import type { AddMessage, EngineMessage, RequestErrorMessage, RequestOutput, SamplingParams, StepMessage } from "../protocol/messages.js";
import { PROTOCOL_VERSION } from "../protocol/messages.js";
import type { DecodeItem, RawLogprobs, SamplerConfig, SamplerHandle, ModelBackend } from "./backend.js";
import type { SchedulerConfig } from "./scheduler.js";
import { tokenSeed } from "./request-state.js";
import { StepLoop } from "./step-loop.js";

/** End-of-generation token of the fake vocabulary (tokens 0..255 are raw bytes). */
const EOG = 300;
const EOT = 301;

interface Deferred<T> {
  promise: Promise<T>;
  resolve(v: T): void;
  reject(e: Error): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

class FakeSampler implements SamplerHandle {
  readonly configs: SamplerConfig[] = [];
  /** Tokens sampled with this sampler (the sequence's generated history). */
  readonly history: number[] = [];
  disposed = 0;
  constructor(
    readonly index: number,
    readonly created: SamplerConfig,
    /** Repetition-penalty history given at creation (prompt + resumed tokens when a penalty is on). */
    readonly penaltyHistory: readonly number[],
  ) {}
  /** The configuration in force: the last one applied. */
  get current(): SamplerConfig {
    return this.configs.at(-1) ?? this.created;
  }
  configure(cfg: SamplerConfig): void {
    this.configs.push(structuredClone(cfg));
  }
  dispose(): void {
    this.disposed += 1;
  }
}

/**
 * A byte-level fake model: token t < 256 is the byte t; EOG/EOT are end-of-generation tokens. Tokenize maps each
 * UTF-16 unit to its char code (ASCII prompts only). Decode records every batch and can fail or be held pending.
 */
class FakeBackend implements ModelBackend {
  readonly eogTokens = [EOG, EOT];
  readonly vocabSize = 512;
  /** Every decoded batch, as llama.cpp would see it (slots and positions, no request ids). */
  readonly batches: Omit<DecodeItem, "id">[][] = [];
  readonly samplers: FakeSampler[] = [];
  readonly cleared: { slot: number; duringDecode: boolean }[] = [];
  /** Next decode rejects with this error. */
  failNext: Error | null = null;
  /** Every decode whose batch holds this slot fails (a request that makes the batch fail). */
  failWhenSlot: number | null = null;
  /** Next decode stays pending until the test resolves it. */
  holdNext = false;
  pending: Deferred<void> | null = null;
  decodeInFlight = false;
  /** Per-sampler scripted tokens; the default derives a letter from the sampler's history. */
  script: ((s: FakeSampler, item: DecodeItem) => number) | null = null;
  /**
   * Fake model logits at an item's last position: when set, sampling applies the sampler's configuration the way
   * the native chain does (additive bias, then repetition penalty over creation history + sampled tokens), then
   * takes the argmax (lowest id on ties) — temperature is ignored.
   */
  logits: ((s: FakeSampler, item: DecodeItem) => number[]) | null = null;
  /** Log-probability calls: [batch logit index, token, top]. */
  readonly logprobCalls: [number, number, number][] = [];
  /** Items of the last decoded batch, by logit index. */
  private logitItems: DecodeItem[] = [];

  tokenize(text: string): number[] {
    return [...text].map((c) => c.charCodeAt(0));
  }
  bytesOf(token: number): Uint8Array {
    if (token < 256) return Uint8Array.of(token);
    return new TextEncoder().encode(token === EOG ? "</s>" : "<|eot|>");
  }
  isEndOfGeneration(token: number): boolean {
    return this.eogTokens.includes(token);
  }
  createSampler(cfg: SamplerConfig, history: readonly number[] = []): SamplerHandle {
    const s = new FakeSampler(this.samplers.length, structuredClone(cfg), [...history]);
    this.samplers.push(s);
    return s;
  }
  async decode(items: DecodeItem[]): Promise<number[]> {
    this.batches.push(items.map((it) => ({ slot: it.slot, pos: it.pos, tokens: [...it.tokens], wantsLogits: it.wantsLogits })));
    this.decodeInFlight = true;
    try {
      if (this.holdNext) {
        this.holdNext = false;
        this.pending = deferred<void>();
        await this.pending.promise;
        this.pending = null;
      }
      if (this.failNext) {
        const e = this.failNext;
        this.failNext = null;
        throw e;
      }
      if (this.failWhenSlot !== null && items.some((it) => it.slot === this.failWhenSlot)) throw new Error("ggml exploded");
    } finally {
      this.decodeInFlight = false;
    }
    this.logitItems = [];
    return items.map((it) => {
      if (!it.wantsLogits) return -1;
      this.logitItems.push(it);
      return this.logitItems.length - 1;
    });
  }
  async sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number> {
    return this.pick(batchLogitIndex, sampler);
  }
  /** The token `sample` gives (synchronous: the batched fake shares it). */
  pick(batchLogitIndex: number, sampler: SamplerHandle): number {
    const s = sampler as FakeSampler;
    const item = this.logitItems[batchLogitIndex]!;
    const token = this.logits ? this.argmax(s, this.logits(s, item)) : this.script ? this.script(s, item) : 97 + ((s.index * 7 + s.history.length) % 26);
    s.history.push(token);
    return token;
  }
  private argmax(s: FakeSampler, raw: number[]): number {
    const cfg = s.current;
    const seen = new Set([...s.penaltyHistory, ...s.history]);
    const l = raw.map((x, t) => {
      const v = x + (cfg.bias.get(t) ?? 0);
      if (cfg.repetitionPenalty === 1 || !seen.has(t)) return v;
      return v > 0 ? v / cfg.repetitionPenalty : v * cfg.repetitionPenalty;
    });
    let best = 0;
    for (let t = 1; t < l.length; t++) if (l[t]! > l[best]!) best = t;
    return best;
  }
  /** Fake raw log probabilities: token t gets -(t + 1) (so the top list is 0, 1, 2, …), tagged by logit index. */
  async logprobs(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs> {
    this.logprobCalls.push([batchLogitIndex, token, top]);
    return { token, logprob: -(token + 1), top: Array.from({ length: top }, (_, t) => ({ token: t, logprob: -(t + 1) })) };
  }
  clearSequence(slot: number): void {
    this.cleared.push({ slot, duringDecode: this.decodeInFlight });
  }
}

const params = (p: Partial<SamplingParams> = {}): SamplingParams => ({ maxTokens: 4, temperature: 0, topP: 1, topK: -1, seed: 42, ignoreEos: false, ...p });

function add(id: string, text: string, p: Partial<SamplingParams> = {}, extra: Partial<AddMessage> = {}): AddMessage {
  return { v: PROTOCOL_VERSION, type: "add", id, prompt: { text }, params: params(p), ...extra };
}

function setup(cfg: Partial<SchedulerConfig> = {}) {
  const backend = new FakeBackend();
  const messages: EngineMessage[] = [];
  const violations: string[][] = [];
  const loop = new StepLoop(backend, { maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 32, ...cfg }, (m) => messages.push(structuredClone(m)), { onInvariantViolation: (v) => violations.push(v) });
  const steps = (): StepMessage[] => messages.filter((m): m is StepMessage => m.type === "step");
  const outputsOf = (id: string): RequestOutput[] => steps().flatMap((m) => m.outputs.filter((o) => o.id === id));
  /** Step and return the step messages that step emitted. */
  const stepOnce = async (): Promise<StepMessage[]> => {
    const before = messages.length;
    await loop.step();
    return messages.slice(before).filter((m): m is StepMessage => m.type === "step");
  };
  const drain = async (): Promise<void> => {
    // The first step applies the inbox; then step until the scheduler is empty.
    let i = 0;
    do {
      if (i++ > 200) throw new Error("loop does not drain");
      await loop.step();
    } while (loop.scheduler.hasWork);
  };
  return { backend, messages, loop, violations, steps, outputsOf, stepOnce, drain };
}

describe("tokenize", () => {
  it("is answered at a step boundary, never while a decode is in flight", async () => {
    const t = setup();
    t.loop.submit(add("a", "hi", { maxTokens: 2, temperature: 0 }));
    t.backend.holdNext = true;
    const first = t.loop.step();
    await Promise.resolve();
    expect(t.backend.decodeInFlight).toBe(true);
    t.loop.submit({ v: PROTOCOL_VERSION, type: "tokenize", id: "tok-1", text: "ok", addSpecialTokens: true });
    expect(t.messages.filter((m) => m.type === "tokenized")).toEqual([]);
    t.backend.pending!.resolve();
    await first;
    expect(t.messages.filter((m) => m.type === "tokenized")).toEqual([]);
    await t.loop.step();
    expect(t.messages.filter((m) => m.type === "tokenized")).toEqual([{ v: PROTOCOL_VERSION, type: "tokenized", id: "tok-1", tokens: [111, 107] }]);
  });
});

describe("queue time", () => {
  it("admitted.queueMs runs from the add's arrival to its admission, not to the end of the prefill step", async () => {
    const t = setup({ maxNumSeqs: 1 });
    let now = 1_000;
    const realNow = Date.now;
    Date.now = () => now;
    try {
      t.loop.submit(add("a", "hi", { maxTokens: 1, temperature: 0 }));
      now = 1_200; // a waits 200 ms for the step boundary
      t.backend.holdNext = true;
      const first = t.loop.step();
      await Promise.resolve();
      now = 1_900; // the prefill decode takes 700 ms: not queue time
      t.backend.pending!.resolve();
      await first;
      expect(t.outputsOf("a")[0]!.admitted!.queueMs).toBe(200);
      // b arrives later and waits 150 ms for the next step boundary.
      t.loop.submit(add("b", "yo", { maxTokens: 1, temperature: 0 }));
      now = 2_050;
      await t.drain();
      expect(t.outputsOf("b")[0]!.admitted!.queueMs).toBe(150);
    } finally {
      Date.now = realNow;
    }
  });
});

describe("tokenSeed", () => {
  it("is deterministic", () => {
    fc.assert(fc.property(fc.integer({ min: 0, max: 0xffffffff }), fc.nat(), (seed, pos) => tokenSeed(seed, pos) === tokenSeed(seed, pos)));
  });

  it("returns a uint32 that differs across positions and seeds", () => {
    const seen = new Set<number>();
    for (let pos = 0; pos < 5000; pos++) {
      const v = tokenSeed(42, pos);
      expect(Number.isInteger(v) && v >= 0 && v <= 0xffffffff).toBe(true);
      seen.add(v);
    }
    expect(seen.size).toBe(5000);
    expect(tokenSeed(1, 10)).not.toBe(tokenSeed(2, 10));
    fc.assert(fc.property(fc.integer({ min: 0, max: 0xffffffff }), fc.nat(1e6), (seed, pos) => tokenSeed(seed, pos) !== tokenSeed(seed, pos + 1)));
  });
});

describe("StepLoop", () => {
  it("emits exactly one step message per step that did work, and none for an idle step", async () => {
    const t = setup();
    const none = await t.stepOnce();
    expect(none).toEqual([]);
    expect(t.messages).toEqual([]);
    t.loop.submit(add("a", "hello", { maxTokens: 3 }));
    t.loop.submit(add("b", "hi", { maxTokens: 2 }));
    let calls = 0;
    while (t.loop.scheduler.hasWork || calls === 0) {
      const emitted = await t.stepOnce();
      expect(emitted).toHaveLength(1);
      calls += 1;
    }
    expect(calls).toBe(3);
    expect(t.steps().map((m) => m.step)).toEqual([1, 2, 3]);
    expect(t.loop.steps).toBe(3);
    expect(await t.stepOnce()).toEqual([]);
    // First step: both admitted and prefilled in one batch.
    const first = t.steps()[0]!;
    expect(first.batchTokens).toBe(7);
    expect(first.outputs.map((o) => [o.id, o.admitted?.promptTokens.length, o.tokens.length])).toEqual([
      ["a", 5, 1],
      ["b", 2, 1],
    ]);
    // Both prompts' KV is in their slots (5 + 2 cells).
    expect(first.stats).toEqual({ waiting: 0, running: 2, activeSequences: 2, cachedSequences: 0, prefixCacheHitTokens: 0, kvTokensInUse: 7, phaseUs: expect.any(Object) });
    const finA = t.outputsOf("a").find((o) => o.finish)!.finish;
    expect(finA).toEqual({ reason: "length", promptTokens: 5, completionTokens: 3 });
    expect(t.outputsOf("a").flatMap((o) => o.tokens)).toHaveLength(3);
    expect(t.outputsOf("b").find((o) => o.finish)!.finish).toEqual({ reason: "length", promptTokens: 2, completionTokens: 2 });
    expect(t.steps().at(-1)!.stats).toEqual({ waiting: 0, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0, kvTokensInUse: 0, phaseUs: expect.any(Object) });
    expect(t.loop.liveRequests).toBe(0);
    expect(t.backend.samplers.every((s) => s.disposed === 1)).toBe(true);
    expect(t.violations).toEqual([]);
  });

  it("never mentions an id after its finish", async () => {
    const t = setup({ maxNumSeqs: 1 });
    t.loop.submit(add("a", "x", { maxTokens: 1 }));
    t.loop.submit(add("b", "y", { maxTokens: 3 }));
    await t.drain();
    const msgs = t.steps();
    for (const id of ["a", "b"]) {
      const idx = msgs.findIndex((m) => m.outputs.some((o) => o.id === id && o.finish));
      expect(idx).toBeGreaterThanOrEqual(0);
      expect(msgs.slice(idx + 1).some((m) => m.outputs.some((o) => o.id === id))).toBe(false);
      expect(t.outputsOf(id).filter((o) => o.finish)).toHaveLength(1);
    }
  });

  it("applies adds and aborts submitted during a pending decode only at the next step boundary", async () => {
    const t = setup({ maxNumSeqs: 1 });
    t.loop.submit(add("a", "abc", { maxTokens: 10 }));
    await t.stepOnce();
    expect(t.loop.scheduler.phaseOf("a")).toBe("decode");
    t.backend.holdNext = true;
    const p = t.loop.step();
    expect(t.backend.pending).not.toBeNull();
    const clearedBefore = t.backend.cleared.length;
    t.loop.submit({ type: "abort", ids: ["a"] });
    t.loop.submit(add("b", "zz", { maxTokens: 2 }));
    // Nothing applied mid-step.
    expect(t.loop.scheduler.phaseOf("a")).toBe("decode");
    expect(t.loop.scheduler.phaseOf("b")).toBeNull();
    expect(t.backend.cleared.length).toBe(clearedBefore);
    expect(t.backend.samplers).toHaveLength(1);
    t.backend.pending!.resolve();
    const [msg] = await p.then(() => t.steps().slice(-1));
    // The in-flight batch's output for a still arrives (the abort is not applied yet), without a finish.
    expect(msg!.outputs).toEqual([{ id: "a", tokens: [expect.any(Number)], text: expect.any(String) }]);
    expect(t.loop.scheduler.phaseOf("a")).toBe("decode");
    // Next boundary: the abort frees a's slot, then b is admitted into it.
    const [next] = await t.stepOnce();
    const outA = next!.outputs.find((o) => o.id === "a")!;
    expect(outA.finish).toEqual({ reason: "abort", promptTokens: 3, completionTokens: 2, stepsAfterAbort: 1 });
    expect(outA.tokens).toEqual([]);
    expect(next!.outputs.find((o) => o.id === "b")!.admitted).toMatchObject({ promptTokens: [122, 122], cachedTokens: 0 });
    expect(t.backend.cleared.slice(clearedBefore)).toEqual([{ slot: 0, duringDecode: false }]);
    expect(t.backend.batches.at(-1)).toEqual([{ slot: 0, pos: 0, tokens: [122, 122], wantsLogits: true }]);
    expect(t.backend.cleared.every((c) => !c.duringDecode)).toBe(true);
    expect(t.violations).toEqual([]);
  });

  it("drops a late abort for a request that finished in the in-flight step", async () => {
    const t = setup();
    t.loop.submit(add("a", "abc", { maxTokens: 2 }));
    await t.stepOnce();
    t.backend.holdNext = true;
    const p = t.loop.step();
    t.loop.submit({ type: "abort", ids: ["a"] });
    t.backend.pending!.resolve();
    await p;
    expect(t.outputsOf("a").at(-1)!.finish).toEqual({ reason: "length", promptTokens: 3, completionTokens: 2 });
    const count = t.messages.length;
    expect(await t.stepOnce()).toEqual([]);
    expect(t.messages.length).toBe(count);
    expect(t.outputsOf("a").filter((o) => o.finish)).toHaveLength(1);
  });

  it("never calls clearSequence while a decode is pending, across many interleavings", async () => {
    const t = setup({ maxNumSeqs: 2, maxNumBatchedTokens: 4 });
    let n = 0;
    for (let round = 0; round < 12; round++) {
      t.loop.submit(add(`r${n++}`, "abcdef", { maxTokens: 3 }));
      t.backend.holdNext = round % 2 === 0;
      const p = t.loop.step();
      if (t.backend.pending) {
        t.loop.submit({ type: "abort", ids: [`r${n - 2}`, "unknown"] });
        t.loop.submit(add(`r${n++}`, "xy", { maxTokens: 2 }));
        t.backend.pending.resolve();
      }
      await p;
    }
    await t.drain();
    expect(t.backend.cleared.length).toBeGreaterThan(0);
    expect(t.backend.cleared.every((c) => !c.duringDecode)).toBe(true);
    expect(t.loop.liveRequests).toBe(0);
    for (let i = 0; i < n; i++) expect(t.outputsOf(`r${i}`).filter((o) => o.finish), `r${i}`).toHaveLength(1);
    expect(t.violations).toEqual([]);
  });

  it("add + abort for the same id in one snapshot never leaks the request", async () => {
    const t = setup();
    t.loop.submit(add("x", "hello"));
    t.loop.submit({ type: "abort", ids: ["x"] });
    const [msg] = await t.stepOnce();
    expect(msg!.outputs).toEqual([{ id: "x", tokens: [], text: "", finish: { reason: "abort", promptTokens: 5, completionTokens: 0, stepsAfterAbort: 0 } }]);
    expect(msg!.batchTokens).toBe(0);
    expect(t.loop.liveRequests).toBe(0);
    expect(t.loop.scheduler.hasWork).toBe(false);
    expect(t.backend.batches).toEqual([]);
    expect(t.backend.samplers.map((s) => s.disposed)).toEqual([1]);
    expect(t.backend.cleared).toEqual([]);
    expect(await t.stepOnce()).toEqual([]);
  });

  it("applies adds before aborts within a snapshot even when the abort arrived first", async () => {
    const t = setup();
    t.loop.submit({ type: "abort", ids: ["x"] });
    t.loop.submit(add("x", "hello"));
    const [msg] = await t.stepOnce();
    expect(msg!.outputs).toEqual([{ id: "x", tokens: [], text: "", finish: { reason: "abort", promptTokens: 5, completionTokens: 0 } }]);
    expect(t.loop.liveRequests).toBe(0);
    expect(t.backend.samplers.map((s) => s.disposed)).toEqual([1]);
  });

  it("a decode that fails once is retried: nobody fails and the output is what an undisturbed run gives", async () => {
    const clean = setup({ maxNumSeqs: 2 });
    clean.loop.submit(add("a", "aa", { maxTokens: 3 }));
    clean.loop.submit(add("b", "bb", { maxTokens: 3 }));
    await clean.drain();
    const t = setup({ maxNumSeqs: 2 });
    t.loop.submit(add("a", "aa", { maxTokens: 3 }));
    t.loop.submit(add("b", "bb", { maxTokens: 3 }));
    t.backend.failNext = new Error("transient");
    await t.drain();
    for (const id of ["a", "b"]) {
      expect(t.outputsOf(id).flatMap((o) => o.tokens)).toEqual(clean.outputsOf(id).flatMap((o) => o.tokens));
      expect(t.outputsOf(id).at(-1)!.finish!.reason).toBe("length");
    }
    expect(t.violations).toEqual([]);
  });

  it("a batch that keeps failing because of one request is bisected: only that request fails, the rest go on", async () => {
    const t = setup({ maxNumSeqs: 2 });
    t.loop.submit(add("a", "aa", { maxTokens: 3 }));
    t.loop.submit(add("b", "bb", { maxTokens: 3 }));
    t.loop.submit(add("w", "ww", { maxTokens: 2 }));
    t.backend.failWhenSlot = 1; // b's slot
    const [msg] = await t.stepOnce();
    t.backend.failWhenSlot = null;
    const fins = msg!.outputs.filter((o) => o.finish).map((o) => [o.id, o.finish!.reason, o.finish!.error?.code]);
    expect(fins).toEqual([["b", "error", "engine_error"]]);
    expect(msg!.outputs.find((o) => o.id === "b")!.finish!.error!.message).toContain("ggml exploded");
    expect(msg!.outputs.find((o) => o.id === "a")!.tokens).toHaveLength(1);
    expect(t.backend.cleared.map((c) => c.slot)).toEqual([1]);
    // The loop goes on: a finishes, w takes the freed slot and finishes.
    await t.drain();
    expect(t.outputsOf("a").at(-1)!.finish!.reason).toBe("length");
    expect(t.outputsOf("w").at(-1)!.finish!.reason).toBe("length");
    expect(t.violations).toEqual([]);
  });

  it("a sampler that cannot be created fails only that add; the rest of the snapshot and the step go on", async () => {
    // BUG (reported to the lead): applyAdd calls scheduler.add() before backend.createSampler(); when
    // createSampler throws, step() rejects (run() claims it never rejects), the rest of the snapshot is lost, and the
    // scheduler keeps a request without engine state, which is prefilled but never sampled and then decoded with
    // an undefined token.
    const t = setup();
    const create = t.backend.createSampler.bind(t.backend);
    t.backend.createSampler = (cfg) => {
      if (t.backend.samplers.length === 1 && !("thrown" in t.backend)) {
        Object.assign(t.backend, { thrown: true });
        throw new Error("llama_sampler_init failed");
      }
      return create(cfg);
    };
    t.loop.submit(add("ok1", "aa", { maxTokens: 2 }));
    t.loop.submit(add("bad", "bb", { maxTokens: 2 }));
    t.loop.submit(add("ok2", "cc", { maxTokens: 2 }));
    await expect(t.loop.step()).resolves.toBeUndefined();
    await t.drain();
    const terminal = (id: string): number =>
      t.outputsOf(id).filter((o) => o.finish).length + t.messages.filter((m) => m.type === "request_error" && m.id === id).length;
    expect(terminal("bad")).toBe(1);
    expect(t.outputsOf("ok1").at(-1)!.finish!.reason).toBe("length");
    expect(t.outputsOf("ok2").at(-1)!.finish!.reason).toBe("length");
    expect(t.loop.scheduler.hasWork).toBe(false);
    expect(t.backend.batches.flat().every((it) => it.tokens.every((tok) => Number.isInteger(tok)))).toBe(true);
  });

  it("refuses out-of-vocabulary token prompts and duplicate live ids", async () => {
    const t = setup();
    t.loop.submit({ v: PROTOCOL_VERSION, type: "add", id: "oov", prompt: { tokens: [1, 9999] }, params: params() });
    t.loop.submit(add("d", "abc"));
    t.loop.submit(add("d", "abc"));
    await t.loop.step();
    const errs = t.messages.filter((m): m is RequestErrorMessage => m.type === "request_error");
    expect(errs.map((e) => [e.id, e.code])).toEqual([
      ["oov", "invalid_prompt"],
      ["d", "duplicate_id"],
    ]);
    expect(t.loop.liveRequests).toBe(1);
  });

  it("holds back a UTF-8 character split across tokens, emits it when complete, U+FFFD for impossible bytes", async () => {
    const t = setup();
    // "A", "€" (E2 82 AC), "😀" (F0 9F 98 80), impossible 0xFF, "B", then a lone lead byte flushed at the end.
    const bytes = [0x41, 0xe2, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80, 0xff, 0x42, 0xc3];
    t.backend.script = (s) => bytes[s.history.length]!;
    t.loop.submit(add("u", "p", { maxTokens: bytes.length }));
    await t.drain();
    const outs = t.outputsOf("u");
    expect(outs.map((o) => o.text)).toEqual(["A", "", "", "€", "", "", "", "😀", "\uFFFD", "B", "\uFFFD"]);
    expect(outs.flatMap((o) => o.tokens)).toEqual(bytes);
    expect(outs.at(-1)!.finish!.reason).toBe("length");
    expect(outs.map((o) => o.text).join("")).toBe(new TextDecoder().decode(Uint8Array.from(bytes)));
  });

  it("concatenated text equals TextDecoder over all bytes (property)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 24 }), fc.boolean(), async (bytes, endWithEog) => {
        const t = setup({ maxModelLen: 64 });
        const script = endWithEog ? [...bytes, EOG] : bytes;
        t.backend.script = (s) => script[s.history.length]!;
        t.loop.submit(add("u", "p", { maxTokens: endWithEog ? null : bytes.length }));
        await t.drain();
        const outs = t.outputsOf("u");
        const text = outs.map((o) => o.text).join("");
        expect(text).toBe(new TextDecoder("utf-8", { ignoreBOM: true }).decode(Uint8Array.from(bytes)));
        expect(outs.at(-1)!.finish!.reason).toBe(endWithEog ? "stop" : "length");
        expect(outs.at(-1)!.finish!.completionTokens).toBe(script.length);
        // Text is never emitted for an incomplete character: no step text ends in a replacement char unless the
        // bytes really were invalid (checked through the whole-string equality above).
      }),
      { numRuns: 150 },
    );
  });

  it("does not emit the text of an end-of-generation token", async () => {
    const t = setup();
    const script = [0x68, 0x69, EOT];
    t.backend.script = (s) => script[s.history.length]!;
    t.loop.submit(add("e", "p", { maxTokens: null }));
    await t.drain();
    const outs = t.outputsOf("e");
    expect(outs.map((o) => o.text).join("")).toBe("hi");
    expect(outs.at(-1)!.tokens).toEqual([EOT]);
    expect(outs.at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 1, completionTokens: 3 });
  });

  it("ignoreEos bans the EOG tokens through the sampler's bias", async () => {
    const t = setup();
    const script = [0x61, EOG, 0x62];
    t.backend.script = (s) => script[s.history.length]!;
    t.loop.submit(add("ig", "pp", { ignoreEos: true, temperature: 0.8, maxTokens: 3, seed: 7 }));
    t.loop.submit(add("no", "pp", { ignoreEos: false, temperature: 0.8, maxTokens: 3, seed: 7 }));
    await t.drain();
    const [ig, no] = t.backend.samplers;
    expect([...ig!.created.bias]).toEqual([[EOG, -Infinity], [EOT, -Infinity]]);
    expect(ig!.configs.length).toBe(3);
    expect(ig!.configs.every((c) => [...c.bias].join() === [[EOG, -Infinity], [EOT, -Infinity]].join())).toBe(true);
    expect(no!.created.bias.size).toBe(0);
    expect(no!.configs.every((c) => c.bias.size === 0)).toBe(true);
    // EOG does not finish an ignore_eos request (if the sampler ever returned it), and its text is not emitted.
    expect(t.outputsOf("ig").at(-1)!.finish).toEqual({ reason: "length", promptTokens: 2, completionTokens: 3 });
    expect(t.outputsOf("ig").map((o) => o.text).join("")).toBe("ab");
    expect(t.outputsOf("no").at(-1)!.finish!.reason).toBe("stop");
    // Per-token seeds depend on (seed, position of the sampled token) only.
    expect(ig!.created.seed).toBe(tokenSeed(7, 2));
    expect(ig!.configs.map((c) => c.seed)).toEqual([tokenSeed(7, 2), tokenSeed(7, 3), tokenSeed(7, 4)]);
    expect(ig!.configs.map((c) => [c.temperature, c.topP, c.topK])).toEqual(Array(3).fill([0.8, 1, -1]));
  });

  it("greedy requests are never reconfigured per token", async () => {
    const t = setup();
    t.loop.submit(add("g", "pp", { temperature: 0, maxTokens: 3, ignoreEos: true }));
    await t.drain();
    expect(t.backend.samplers[0]!.configs).toEqual([]);
    expect([...t.backend.samplers[0]!.created.bias.keys()]).toEqual([EOG, EOT]);
  });

  it("resumes: generated tokens are prefilled, count towards maxTokens, and their text is not emitted again", async () => {
    const t = setup();
    t.backend.script = () => 0xa9; // completes the "é" whose lead byte was generated before the resume
    t.loop.submit({ ...add("r", "ab", { maxTokens: 3, temperature: 1, seed: 5 }), generated: [0x78, 0xc3] });
    await t.drain();
    const outs = t.outputsOf("r");
    expect(outs[0]!.admitted).toMatchObject({ promptTokens: [97, 98], cachedTokens: 0 });
    expect(t.backend.batches[0]).toEqual([{ slot: 0, pos: 0, tokens: [97, 98, 0x78, 0xc3], wantsLogits: true }]);
    expect(outs.map((o) => o.text).join("")).toBe("é");
    expect(outs.at(-1)!.finish).toEqual({ reason: "length", promptTokens: 4, completionTokens: 1 });
    expect(t.backend.samplers[0]!.configs.map((c) => c.seed)).toEqual([tokenSeed(5, 4)]);
  });

  it("a violated scheduler invariant is reported and contained: only the implicated request fails, the rest goes on", async () => {
    const t = setup({ maxNumSeqs: 2 });
    t.loop.submit(add("a", "aa", { maxTokens: 4 }));
    t.loop.submit(add("b", "bb", { maxTokens: 4 }));
    await t.stepOnce();
    // Corrupt the scheduler the way a bug would: a's processed count runs past its tokens.
    const a = (t.loop.scheduler as unknown as { running: { id: string; status: { processed: number } }[] }).running.find((r) => r.id === "a")!;
    a.status = { ...a.status, processed: 999 };
    await t.drain();
    expect(t.violations.length).toBeGreaterThan(0);
    const finA = t.outputsOf("a").at(-1)!.finish!;
    expect([finA.reason, finA.error?.code]).toEqual(["error", "invariant_violation"]);
    expect(t.outputsOf("b").at(-1)!.finish!.reason).toBe("length");
    expect(t.loop.scheduler.checkInvariants()).toEqual([]);
    expect(t.loop.liveRequests).toBe(0);
  });
});

describe("StepLoop: the extended sampling set", () => {
  /** Fake logits where `ranked[0]` is the most likely token, then ranked[1], … (everything else far below). */
  const ranking = (ranked: number[]): number[] => {
    const l = new Array<number>(512).fill(-50);
    ranked.forEach((t, i) => (l[t] = 10 - i));
    return l;
  };
  const textOf = (t: ReturnType<typeof setup>, id: string): string => t.outputsOf(id).map((o) => o.text).join("");
  const tokensOf = (t: ReturnType<typeof setup>, id: string): number[] => t.outputsOf(id).flatMap((o) => o.tokens);

  it("min_tokens bans EOG and stop tokens until reached, counting resumed tokens, then they end the request", async () => {
    const t = setup({ maxModelLen: 64 });
    // The model always prefers EOG, then "x" (a stop token), then "a".
    t.backend.logits = () => ranking([EOG, 0x78, 0x61]);
    t.loop.submit(add("m", "p", { maxTokens: 10, minTokens: 3, stopTokenIds: [0x78] }));
    t.loop.submit(add("r", "p", { maxTokens: 10, minTokens: 3, stopTokenIds: [0x78] }, { generated: [0x61, 0x61] }));
    t.loop.submit(add("plain", "p", { maxTokens: 10 }));
    await t.drain();
    expect(tokensOf(t, "m")).toEqual([0x61, 0x61, 0x61, EOG]);
    expect(t.outputsOf("m").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 1, completionTokens: 4 });
    expect(textOf(t, "m")).toBe("aaa");
    // Two tokens were generated before the resume: one more before EOG may end it.
    expect(tokensOf(t, "r")).toEqual([0x61, EOG]);
    expect(t.outputsOf("r").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 3, completionTokens: 2 });
    expect(tokensOf(t, "plain")).toEqual([EOG]);
    // The bans are lifted once: the sampler is reconfigured when min_tokens is reached, not per token before.
    const m = t.backend.samplers[0]!;
    expect([...m.created.bias]).toEqual([[EOG, -Infinity], [EOT, -Infinity], [0x78, -Infinity]]);
    expect(m.configs.map((c) => c.bias.size)).toEqual([0]);
  });

  it("stop_token_ids end the request with reason stop; the token is reported without text, also under ignore_eos", async () => {
    const t = setup({ maxModelLen: 64 });
    const script = [0x68, 0x69, 0x21, 0x7a];
    t.backend.script = (s) => script[s.history.length]!;
    t.loop.submit(add("s", "p", { maxTokens: 10, stopTokenIds: [0x21], ignoreEos: true }));
    await t.drain();
    expect(tokensOf(t, "s")).toEqual([0x68, 0x69, 0x21]);
    expect(textOf(t, "s")).toBe("hi");
    expect(t.outputsOf("s").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 1, completionTokens: 3 });
  });

  it("logit_bias is additive and -100 bans: the biased argmax changes accordingly", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    t.loop.submit(add("none", "p", { maxTokens: 2 }));
    t.loop.submit(add("ban", "p", { maxTokens: 2, logitBias: [[0x61, -100]] }));
    t.loop.submit(add("lift", "p", { maxTokens: 2, logitBias: [[0x63, 2.5]] }));
    await t.drain();
    expect(textOf(t, "none")).toBe("aa");
    expect(textOf(t, "ban")).toBe("bb");
    expect(textOf(t, "lift")).toBe("cc");
    expect([...t.backend.samplers[1]!.created.bias]).toEqual([[0x61, -Infinity]]);
    expect([...t.backend.samplers[2]!.created.bias]).toEqual([[0x63, 2.5]]);
  });

  it("presence and frequency penalties count generated tokens only (not the prompt) and reconfigure greedy sampling", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    // The prompt is full of "a": a generated-only penalty leaves the first token alone.
    t.loop.submit(add("pres", "aaaa", { maxTokens: 4, presencePenalty: 1.5 }));
    t.loop.submit(add("freq", "aaaa", { maxTokens: 5, frequencyPenalty: 0.6 }));
    await t.drain();
    // Presence 1.5, once per used token: a(10) → b (9 > a's 8.5) → a (8.5 > b's 7.5 and c's 8) → a (it does not grow).
    expect(textOf(t, "pres")).toBe("abaa");
    // Frequency 0.6 per occurrence: a(10) → a(9.4) → b(9) → a(8.8) → b(8.4)… as the counts grow.
    const freq = t.backend.samplers[1]!;
    expect(freq.configs.map((c) => [...c.bias])).toEqual([[[0x61, -0.6]], [[0x61, -0.6 * 2]], [[0x61, -0.6 * 2], [0x62, -0.6]], [[0x61, -0.6 * 3], [0x62, -0.6]]]);
    expect(textOf(t, "freq")).toBe("aabab");
  });

  it("repetition penalty covers prompt + resumed tokens: the sampler gets them as its history", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    t.loop.submit(add("rep", "ab", { maxTokens: 3, repetitionPenalty: 1.25 }, { generated: [0x63] }));
    t.loop.submit(add("off", "ab", { maxTokens: 3 }));
    await t.drain();
    expect(t.backend.samplers[0]!.penaltyHistory).toEqual([0x61, 0x62, 0x63]);
    expect(t.backend.samplers[0]!.created.repetitionPenalty).toBe(1.25);
    expect(t.backend.samplers[1]!.penaltyHistory).toEqual([]);
    // All of a, b, c are penalised equally (10/1.25, 9/1.25, 8/1.25): the order stays, "a" wins.
    expect(textOf(t, "rep")).toBe("aa");
  });

  it("a continuation with `generated` samples exactly what the uninterrupted run did, at every resume point", async () => {
    // Logits that depend on the position, so every token matters; all penalties and bias on.
    const logitsAt = (pos: number): number[] => {
      const l = new Array<number>(512).fill(-50);
      for (let k = 0; k < 6; k++) l[0x61 + ((pos * 5 + k * 3) % 7)] = 6 - k * 0.7;
      l[EOG] = pos % 4 === 0 ? 6.5 : -50;
      return l;
    };
    const p = { maxTokens: 12, presencePenalty: 0.4, frequencyPenalty: 0.3, repetitionPenalty: 1.2, minTokens: 9, logitBias: [[0x62, 0.5]] as [number, number][] };
    const run = async (generated: number[]): Promise<number[]> => {
      const t = setup({ maxModelLen: 64 });
      t.backend.logits = (_s, item) => logitsAt(item.pos + item.tokens.length);
      t.loop.submit(add("c", "abcab", p, generated.length > 0 ? { generated } : {}));
      await t.drain();
      return [...generated, ...tokensOf(t, "c")];
    };
    const full = await run([]);
    expect(full.length).toBeGreaterThan(9);
    expect(new Set(full).size).toBeGreaterThan(3);
    for (let k = 1; k < full.length - 1; k++) expect(await run(full.slice(0, k)), `resumed after ${k}`).toEqual(full);
  });

  it("logprobs: one entry per token from the backend, at the token's own logit index; none unless asked", async () => {
    const t = setup({ maxNumSeqs: 2 });
    t.loop.submit(add("lp", "abc", { maxTokens: 3, logprobs: 2 }));
    t.loop.submit(add("no", "xy", { maxTokens: 3 }));
    await t.drain();
    const outs = t.outputsOf("lp").filter((o) => o.tokens.length > 0);
    expect(outs).toHaveLength(3);
    for (const o of outs) {
      // Each entry carries its token's raw bytes (protocol TokenLogprob.bytes).
      expect(o.logprobs).toEqual([{ token: o.tokens[0], logprob: -(o.tokens[0]! + 1), bytes: [...t.backend.bytesOf(o.tokens[0]!)], top: [{ token: 0, logprob: -1, bytes: [0] }, { token: 1, logprob: -2, bytes: [1] }] }]);
    }
    expect(t.outputsOf("no").some((o) => o.logprobs !== undefined)).toBe(false);
    // Only the request that asked paid a call; its logit index is the one it was sampled at (it is first in each batch).
    expect(t.backend.logprobCalls.map(([idx, , top]) => [idx, top])).toEqual([[0, 2], [0, 2], [0, 2]]);
    expect(t.backend.logprobCalls.map(([, tok]) => tok)).toEqual(outs.map((o) => o.tokens[0]));
  });

  it("refuses params the engine cannot serve with invalid_params: out-of-vocabulary ids, logprobs over the cap or without support", async () => {
    const t = setup();
    t.loop.submit(add("bias", "a", { logitBias: [[600, 1]] }));
    t.loop.submit(add("stop", "a", { stopTokenIds: [512] }));
    t.loop.submit(add("lp", "a", { logprobs: 21 }));
    t.loop.submit(add("ok", "a", { logprobs: 20, maxTokens: 1 }));
    await t.drain();
    const errs = t.messages.filter((m): m is RequestErrorMessage => m.type === "request_error");
    expect(errs.map((e) => [e.id, e.code])).toEqual([["bias", "invalid_params"], ["stop", "invalid_params"], ["lp", "invalid_params"]]);
    expect(t.outputsOf("ok").at(-1)!.logprobs![0]!.top).toHaveLength(20);
    expect(t.loop.maxTopLogprobs).toBe(20);
    const bare = setup();
    Object.assign(bare.backend, { logprobs: undefined });
    expect(bare.loop.maxTopLogprobs).toBe(-1);
    bare.loop.submit(add("lp0", "a", { logprobs: 0 }));
    await bare.loop.step();
    expect(bare.messages).toEqual([expect.objectContaining({ type: "request_error", id: "lp0", code: "invalid_params" })]);
  });
});

describe("StepLoop: one native call samples the step (backend.sampleMany)", () => {
  /** The fake backend with a batched sampler: the same per-sampler rule as `sample`, one call per step, recorded. */
  class BatchingBackend extends FakeBackend {
    /** Sequences per sampleMany call, in call order. */
    readonly calls: number[] = [];
    /** Calls of the one-sequence `sample`. */
    singles = 0;
    /** Sampler index whose item fails inside the batch (an Error in its place). */
    failSampler: number | null = null;
    /** The next sampleMany call throws as a whole. */
    throwNext = false;
    override async sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number> {
      this.singles += 1;
      return super.sample(batchLogitIndex, sampler);
    }
    sampleMany(batch: readonly { batchLogitIndex: number; sampler: SamplerHandle }[]): (number | Error)[] {
      this.calls.push(batch.length);
      if (this.throwNext) {
        this.throwNext = false;
        throw new Error("native batch call failed");
      }
      return batch.map(({ batchLogitIndex, sampler }) => ((sampler as FakeSampler).index === this.failSampler ? new Error("sampler failed") : this.pick(batchLogitIndex, sampler)));
    }
  }
  // Position-dependent logits with penalties and bias on, so every sampler's own history matters.
  const logitsAt = (pos: number, salt: number): number[] => {
    const l = new Array<number>(512).fill(-50);
    for (let k = 0; k < 6; k++) l[0x61 + ((pos * 5 + k * 3 + salt) % 7)] = 6 - k * 0.7;
    return l;
  };
  const p = { maxTokens: 8, presencePenalty: 0.4, frequencyPenalty: 0.3, repetitionPenalty: 1.2, logitBias: [[0x62, 0.5]] as [number, number][] };
  const tokensOf = (t: ReturnType<typeof setup>, id: string): number[] => t.outputsOf(id).flatMap((o) => o.tokens);

  async function run(backend: FakeBackend, ids: string[]) {
    const messages: EngineMessage[] = [];
    const loop = new StepLoop(backend, { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 64 }, (m) => messages.push(structuredClone(m)));
    backend.logits = (s, item) => logitsAt(item.pos + item.tokens.length, s.index);
    for (const id of ids) loop.submit(add(id, `prompt ${id}`, p));
    let i = 0;
    do {
      if (i++ > 100) throw new Error("loop does not drain");
      await loop.step();
    } while (loop.scheduler.hasWork);
    const steps = messages.filter((m): m is StepMessage => m.type === "step");
    const outs = (id: string) => steps.flatMap((m) => m.outputs.filter((o) => o.id === id));
    return { steps, tokens: (id: string) => outs(id).flatMap((o) => o.tokens), finish: (id: string) => outs(id).at(-1)?.finish };
  }

  it("samples every sequence of a step in one call and yields exactly the tokens of one call per sequence", async () => {
    const ids = ["a", "b", "c", "d"];
    const plain = await run(new FakeBackend(), ids);
    const batching = new BatchingBackend();
    const batched = await run(batching, ids);
    for (const id of ids) {
      expect(plain.tokens(id)).toHaveLength(8);
      expect(batched.tokens(id), id).toEqual(plain.tokens(id));
    }
    // The four requests differ (the salt), so a mixed-up assignment would show.
    expect(new Set(ids.map((id) => plain.tokens(id).join())).size).toBe(4);
    expect(batching.singles).toBe(0);
    expect(batching.calls).toEqual(new Array(8).fill(4));
  });

  it("an item that fails in the batch fails only its request; a batch call that throws fails only its items", async () => {
    const plain = await run(new FakeBackend(), ["a", "b", "c"]);
    const itemFails = new BatchingBackend();
    itemFails.failSampler = 1;
    const r = await run(itemFails, ["a", "b", "c"]);
    expect(r.finish("b")).toMatchObject({ reason: "error" });
    expect(r.tokens("a")).toEqual(plain.tokens("a"));
    expect(r.tokens("c")).toEqual(plain.tokens("c"));
    const callFails = new BatchingBackend();
    callFails.throwNext = true;
    const r2 = await run(callFails, ["a", "b"]);
    expect(r2.finish("a")).toMatchObject({ reason: "error" });
    expect(r2.finish("b")).toMatchObject({ reason: "error" });
    // The loop goes on: a later request is served by the same loop and backend.
    const after = await run(callFails, ["c"]);
    expect(after.tokens("c")).toEqual(plain.tokens("c"));
  });

  it("log probabilities are still read for a request sampled in the batch", async () => {
    const t = setup({ maxNumSeqs: 2 });
    const b = new BatchingBackend();
    const loop = new StepLoop(b, { maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 32 }, (m) => t.messages.push(structuredClone(m)));
    loop.submit(add("lp", "abc", { maxTokens: 3, logprobs: 2 }));
    loop.submit(add("no", "xy", { maxTokens: 3 }));
    do await loop.step();
    while (loop.scheduler.hasWork);
    expect(b.singles).toBe(0);
    const outs = t.outputsOf("lp").filter((o) => o.tokens.length > 0);
    expect(outs).toHaveLength(3);
    expect(b.logprobCalls.map(([, tok]) => tok)).toEqual(outs.map((o) => o.tokens[0]));
    expect(tokensOf(t, "no")).toHaveLength(3);
  });

  it("every step message says where its time went: decode + sample <= step", async () => {
    const r = await run(new BatchingBackend(), ["a", "b"]);
    const decoding = r.steps.filter((s) => s.batchTokens > 0);
    expect(decoding.length).toBeGreaterThan(0);
    for (const s of decoding) {
      const ph = s.stats.phaseUs!;
      expect(ph.decode).toBeGreaterThanOrEqual(0);
      expect(ph.sample).toBeGreaterThanOrEqual(0);
      expect(ph.decode + ph.sample).toBeLessThanOrEqual(ph.step + 2); // each is rounded on its own
    }
  });
});

describe("StepLoop.run: the event loop gets a turn between steps", () => {
  it("a busy loop whose backend never leaves the microtask queue still receives commands from I/O callbacks", async () => {
    // FakeBackend's decode and sample settle without any real I/O (like Keel's synchronous native calls).
    const t = setup({ maxNumSeqs: 1, maxModelLen: 4096, maxNumBatchedTokens: 64 });
    t.loop.submit(add("long", "p", { maxTokens: 4000, ignoreEos: true }));
    const running = t.loop.run();
    // An abort that arrives the way the channel delivers commands: from an I/O-phase callback.
    await new Promise<void>((resolve) => setImmediate(resolve));
    setImmediate(() => t.loop.submit({ type: "abort", ids: ["long"] }));
    await new Promise<void>((resolve) => {
      const check = (): void => (t.outputsOf("long").some((o) => o.finish) ? resolve() : void setImmediate(check));
      setImmediate(check);
    });
    t.loop.stop();
    await running;
    const finish = t.outputsOf("long").find((o) => o.finish)!.finish!;
    expect(finish.reason).toBe("abort");
    expect(finish.completionTokens).toBeLessThan(4000);
  });
});
