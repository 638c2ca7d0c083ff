/**
 * Speculative verification on the engine loop with a fake model whose next token follows the sequence's own history
 * (a 26-letter cycle per sampler): once the cycle repeats, n-gram drafts match. On vs off must emit the same tokens in
 * fewer steps, trim the KV of rejected drafts, stop at max_tokens exactly, and skip logprob requests.
 */
import { describe, expect, it } from "vitest";
import type { DecodeItem } from "../backend.js";
import type { EngineMessage, SamplingParams, StepMessage } from "../../protocol/messages.js";
import { add, FakeBackend } from "../../../test/support/engine-fake-backend.js";
import { StepLoop } from "../step-loop.js";

/** The fake with partial KV trims and a logits position per drafted token (consecutive indices, as llama.cpp). */
class DraftingFake extends FakeBackend {
  readonly trims: { slot: number; keep: number }[] = [];
  trimSequence(slot: number, keep: number): boolean {
    this.trims.push({ slot, keep });
    return true;
  }
  override async decode(items: DecodeItem[]): Promise<number[]> {
    await super.decode(items);
    this.logitItems = [];
    return items.map((it) => {
      if (!it.wantsLogits) return -1;
      const first = this.logitItems.length;
      for (let j = 0; j <= (it.drafts ?? 0); j++) this.logitItems.push(it);
      return first;
    });
  }
}

const spec = { numAssistantTokens: 4, maxNgramSize: 2 };

async function run(p: Partial<SamplingParams>, n = 1) {
  const backend = new DraftingFake();
  const messages: EngineMessage[] = [];
  const violations: string[][] = [];
  const loop = new StepLoop(backend, { maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 128 }, (m) => messages.push(structuredClone(m)), { onInvariantViolation: (v) => violations.push(v) });
  for (let i = 0; i < n; i++) loop.submit(add(`r${i}`, "go", { maxTokens: 70, ...p }));
  let steps = 0;
  do {
    if (steps++ > 300) throw new Error("loop does not drain");
    await loop.step();
  } while (loop.scheduler.hasWork);
  const stepMsgs = messages.filter((m): m is StepMessage => m.type === "step");
  const tokens = (id: string) => stepMsgs.flatMap((m) => m.outputs.filter((o) => o.id === id).flatMap((o) => o.tokens));
  const finish = (id: string) => stepMsgs.flatMap((m) => m.outputs.filter((o) => o.id === id && o.finish).map((o) => o.finish!.reason));
  expect(violations).toEqual([]);
  return { backend, loop, tokens, finish, steps: loop.steps, last: stepMsgs.at(-1)! };
}

describe("prompt-lookup verification (fake model)", () => {
  it("emits the same tokens as without speculation in fewer steps, and reports the draft counters", async () => {
    const off = await run({});
    const on = await run({ speculation: spec });
    expect(on.tokens("r0")).toEqual(off.tokens("r0"));
    expect(on.tokens("r0")).toHaveLength(70);
    expect(on.finish("r0")).toEqual(["length"]);
    expect(on.steps).toBeLessThan(off.steps - 20);
    expect(on.loop.drafts.accepted).toBeGreaterThan(30);
    expect(on.last.stats).toMatchObject({ draftTokens: on.loop.drafts.proposed, acceptedDraftTokens: on.loop.drafts.accepted });
    expect(off.last.stats.draftTokens).toBeUndefined();
  });

  it("verifies several sequences of a step together and stays exact for each", async () => {
    const off = await run({}, 2);
    const on = await run({ speculation: spec }, 2);
    for (const id of ["r0", "r1"]) expect(on.tokens(id)).toEqual(off.tokens(id));
    // Drafted batches held both sequences with drafts at once.
    expect(on.backend.batches.some((b) => b.length === 2 && b.every((it) => it.tokens.length > 1))).toBe(true);
  });

  it("trims the KV of rejected drafts to the emitted length", async () => {
    // A script that never repeats the draft: every draft is rejected, each step emits one token and trims.
    const backend = new DraftingFake();
    backend.script = (s) => 97 + ((s.history.length * 5) % 26);
    const loop = new StepLoop(backend, { maxNumSeqs: 1, maxNumBatchedTokens: 16, maxModelLen: 128 }, () => {});
    loop.submit(add("a", "abababababab", { maxTokens: 6, speculation: spec }));
    do await loop.step();
    while (loop.scheduler.hasWork);
    expect(loop.drafts.proposed).toBeGreaterThan(0);
    expect(loop.drafts.accepted).toBe(0);
    expect(backend.trims.length).toBeGreaterThan(0);
    for (const t of backend.trims) expect(t.slot).toBe(0);
    // Each drafted decode at position p that emitted one token keeps p + 1 positions.
    const drafted = backend.batches.flat().filter((it) => it.tokens.length > 1 && it.wantsLogits && it.pos >= 12);
    expect(backend.trims.map((t) => t.keep)).toEqual(drafted.map((it) => it.pos + 1));
  });

  it("does not speculate for requests with logprobs or on a backend that cannot trim", async () => {
    expect((await run({ speculation: spec, logprobs: 2 })).loop.drafts.proposed).toBe(0);
    const plain = new FakeBackend();
    const loop = new StepLoop(plain, { maxNumSeqs: 1, maxNumBatchedTokens: 16, maxModelLen: 128 }, () => {});
    loop.submit(add("a", "go", { maxTokens: 60, speculation: spec }));
    do await loop.step();
    while (loop.scheduler.hasWork);
    expect(loop.drafts.proposed).toBe(0);
  });
});
