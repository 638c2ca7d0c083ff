import { describe, expect, it } from "vitest";
import type { DecodeItem } from "./backend.js";
import { decodeWidths, shouldWarmUp, warmUp, warmupShapes } from "./warmup.js";

/**
 * A backend that keeps each slot's KV length and refuses what llama.cpp refuses: a position that does not follow on
 * from the slot's KV, a batch over the step budget, a slot past the context's sequences, a sequence over its capacity.
 */
class KvBackend {
  readonly kv = new Map<number, number>();
  readonly batches: DecodeItem[][] = [];
  constructor(
    private readonly limits: { maxNumSeqs: number; maxNumBatchedTokens: number; maxModelLen: number },
    private readonly failAtBatch = -1,
  ) {}
  async decode(items: DecodeItem[]): Promise<number[]> {
    const total = items.reduce((a, it) => a + it.tokens.length, 0);
    if (total > this.limits.maxNumBatchedTokens) throw new RangeError(`batch of ${total} tokens over the budget`);
    if (this.batches.length === this.failAtBatch) throw new Error("decode failed (injected)");
    for (const it of items) {
      if (it.slot >= this.limits.maxNumSeqs) throw new RangeError(`slot ${it.slot} does not exist`);
      const len = this.kv.get(it.slot) ?? 0;
      if (it.pos !== len) throw new Error(`slot ${it.slot}: position ${it.pos} does not follow ${len}`);
      if (len + it.tokens.length > this.limits.maxModelLen) throw new RangeError(`slot ${it.slot} over its capacity`);
    }
    for (const it of items) this.kv.set(it.slot, (this.kv.get(it.slot) ?? 0) + it.tokens.length);
    this.batches.push(items);
    return items.map((_, i) => i);
  }
  clearSequence(slot: number): void {
    this.kv.delete(slot);
  }
}

describe("warm-up at load", () => {
  it("covers every matrix-vector width up to 8, then the powers of two and max_num_seqs", () => {
    expect(decodeWidths(1)).toEqual([1]);
    expect(decodeWidths(5)).toEqual([1, 2, 3, 4, 5]);
    expect(decodeWidths(12)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 12]);
    expect(decodeWidths(64)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
    expect(decodeWidths(100)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 100]);
  });

  it("runs on a GPU backend under auto, everywhere under on, nowhere under off", () => {
    expect(shouldWarmUp("auto", "vulkan")).toBe(true);
    expect(shouldWarmUp("auto", "cuda")).toBe(true);
    expect(shouldWarmUp("auto", false)).toBe(false);
    expect(shouldWarmUp("on", false)).toBe(true);
    expect(shouldWarmUp("off", "vulkan")).toBe(false);
  });

  it("decodes a prefill chunk of the step budget, then one decode step per width, and leaves no KV behind", async () => {
    const limits = { maxNumSeqs: 32, maxNumBatchedTokens: 256, maxModelLen: 2048 };
    const backend = new KvBackend(limits);
    const report = await warmUp(backend, limits, 7);
    // 1. The batches the scheduler can produce: 256 prompt tokens on one slot, then n sequences × 1 token.
    expect(backend.batches.map((b) => [b.length, b[0]!.tokens.length])).toEqual([
      [1, 256],
      ...[1, 2, 3, 4, 5, 6, 7, 8, 16, 32].map((n) => [n, 1]),
    ]);
    expect(backend.batches.flat().every((it) => it.wantsLogits && it.tokens.every((t) => t === 7))).toBe(true);
    // 2. Each decode step holds slots 0..n-1 once.
    for (const b of backend.batches) expect(b.map((it) => it.slot)).toEqual(b.map((_, i) => i));
    // 3. Every slot used is empty again.
    expect(report.slotsCleared).toBe(32);
    expect(backend.kv.size).toBe(0);
    expect(report.shapes).toHaveLength(11);
  });

  it("fits a small context: the prefill chunk leaves slot 0 room for every decode step", async () => {
    const limits = { maxNumSeqs: 4, maxNumBatchedTokens: 512, maxModelLen: 64 };
    const backend = new KvBackend(limits);
    await warmUp(backend, limits, 0);
    expect(backend.batches[0]![0]!.tokens).toHaveLength(60);
    expect(backend.batches.slice(1).map((b) => b.length)).toEqual([1, 2, 3, 4]);
    expect(backend.kv.size).toBe(0);
    // A context of 2 tokens per sequence: no prefill chunk, two decode steps.
    expect(warmupShapes({ maxNumSeqs: 8, maxNumBatchedTokens: 256, maxModelLen: 2 })).toEqual([
      { kind: "decode", sequences: 1, tokensPerSequence: 1 },
      { kind: "decode", sequences: 2, tokensPerSequence: 1 },
    ]);
  });

  it("starts no batch once the time budget has passed, and says how many it left out", async () => {
    const limits = { maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 512 };
    const backend = new KvBackend(limits);
    // A clock that advances 40 ms per batch decoded: with a 100 ms budget, batches start at 0, 40 and 80 ms.
    const report = await warmUp(backend, limits, 1, 100, () => backend.batches.length * 40);
    expect(backend.batches.map((b) => b.length)).toEqual([1, 1, 2]);
    expect(report.shapes).toHaveLength(3);
    expect(report.skipped).toBe(warmupShapes(limits).length - 3);
    expect(backend.kv.size).toBe(0);
  });

  it("clears the slots it used when a warm-up decode fails, and reports the failure", async () => {
    const limits = { maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 512 };
    const backend = new KvBackend(limits, 3);
    await expect(warmUp(backend, limits, 1)).rejects.toThrow("decode failed (injected)");
    expect(backend.batches).toHaveLength(3);
    expect(backend.kv.size).toBe(0);
  });
});
