/**
 * A byte-level fake model backend for the engine step loop's unit tests (src/engine/step-loop*.test.ts), and the
 * harness that drives a StepLoop over it step by step.
 */
import type { AddMessage, EngineMessage, RequestOutput, SamplingParams, StepMessage } from "../../src/protocol/messages.js";
import { PROTOCOL_VERSION } from "../../src/protocol/messages.js";
import type { DecodeItem, ModelBackend, RawLogprobs, SamplerConfig, SamplerHandle } from "../../src/engine/backend.js";
import type { SchedulerConfig } from "../../src/engine/scheduler.js";
import { StepLoop } from "../../src/engine/step-loop.js";

/** End-of-generation token of the fake vocabulary (tokens 0..255 are raw bytes). */
export const EOG = 300;
export const EOT = 301;

export interface Deferred<T> {
  promise: Promise<T>;
  resolve(v: T): void;
  reject(e: Error): void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

export class FakeSampler implements SamplerHandle {
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
export class FakeBackend implements ModelBackend {
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
  /** Like a GPU backend: the loop passes host work to run while a decode is in flight (`alongside`). */
  overlapsDecode = false;
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
  protected logitItems: DecodeItem[] = [];

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
  async decode(items: DecodeItem[], _step?: number, alongside?: () => Promise<void> | void): Promise<number[]> {
    this.batches.push(items.map((it) => ({ slot: it.slot, pos: it.pos, tokens: [...it.tokens], wantsLogits: it.wantsLogits })));
    this.decodeInFlight = true;
    try {
      if (alongside) await alongside();
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

export const params = (p: Partial<SamplingParams> = {}): SamplingParams => ({ maxTokens: 4, temperature: 0, topP: 1, topK: -1, seed: 42, ignoreEos: false, ...p });

export function add(id: string, text: string, p: Partial<SamplingParams> = {}, extra: Partial<AddMessage> = {}): AddMessage {
  return { v: PROTOCOL_VERSION, type: "add", id, prompt: { text }, params: params(p), ...extra };
}

export function setup(cfg: Partial<SchedulerConfig> = {}, backend = new FakeBackend()) {
  const messages: EngineMessage[] = [];
  /** Whether a decode was in flight when each message was emitted (same order as `messages`). */
  const emittedDuringDecode: boolean[] = [];
  const violations: string[][] = [];
  const emit = (m: EngineMessage): void => {
    messages.push(structuredClone(m));
    emittedDuringDecode.push(backend.decodeInFlight);
  };
  const loop = new StepLoop(backend, { maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 32, ...cfg }, emit, { onInvariantViolation: (v) => violations.push(v) });
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
  return { backend, messages, emittedDuringDecode, loop, violations, steps, outputsOf, stepOnce, drain };
}
