/**
 * A disposed native sampler's candidates buffer (vocabulary × 12 bytes) is freed only when V8 collects its wrapper,
 * and a request's sampler lives long enough to be promoted out of the young generation, so only a full collection
 * frees it (issue #22's engine RSS growth; native-garbage.ts). On the real adapter and the tiny model: samplers that
 * were promoted and then disposed are all collected once the ledger passes its threshold, and the ledger is back to
 * zero; with no collection allowed, promoted samplers stay uncollected however long the loop runs young collections.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureDefaultModel } from "../../model/default-model.js";
import { LlamaAdapter } from "./adapter.js";
import { CANDIDATE_BYTES_PER_TOKEN } from "./native-garbage.js";

const SAMPLERS = 600;
let adapter: LlamaAdapter;
let threshold = 0;

beforeAll(async () => {
  const modelPath = await ensureDefaultModel();
  // Probe the vocabulary size, then reopen with a threshold of 100 samplers' buffers.
  const probe = await LlamaAdapter.open({ modelPath, sequences: 1, contextSize: 64, batchSize: 8, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
  threshold = probe.vocabSize * CANDIDATE_BYTES_PER_TOKEN * 100;
  await probe.dispose();
  adapter = await LlamaAdapter.open({ modelPath, sequences: 1, contextSize: 64, batchSize: 8, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu", garbageThresholdBytes: threshold });
});
afterAll(async () => {
  await adapter?.dispose();
});

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Young-generation churn: enough short-lived allocation for several scavenges (promotes what survives them). */
function scavenge(): void {
  let keep = 0;
  for (let i = 0; i < 4000; i++) keep += new Array(1000).fill(i).length;
  expect(keep).toBeGreaterThan(0);
}

/** Create `n` samplers, promote them (they live through young collections, as a request's sampler does), dispose them. */
function promotedAndDisposed(n: number, finalized: FinalizationRegistry<void>): void {
  const cfg = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1, bias: new Map<number, number>(), repetitionPenalty: 1, grammar: null };
  const handles = Array.from({ length: n }, () => adapter.createSampler(cfg));
  for (const h of handles) finalized.register(h, undefined);
  scavenge();
  scavenge();
  for (const h of handles) h.dispose();
}

describe("disposed native samplers", () => {
  it("are collected once their buffers pass the threshold; the ledger returns to zero", async () => {
    let collected = 0;
    const finalized = new FinalizationRegistry<void>(() => (collected += 1));
    const before = adapter.nativeGarbage.collections;
    promotedAndDisposed(SAMPLERS, finalized);
    // The collection runs on a later turn (between engine steps), the finalizers after it.
    for (let i = 0; i < 200 && collected < SAMPLERS - 100; i++) await turn();
    // Every sampler disposed before the last collection was freed; what waits is below one threshold.
    expect(collected).toBeGreaterThanOrEqual(SAMPLERS - 100);
    expect(adapter.nativeGarbage.collections).toBeGreaterThan(before);
    expect(adapter.nativeGarbage.pendingBytes).toBeLessThan(threshold);
  });
});
