/** The scheduler's draft tokens: bounded by the step budget, the slot capacity and max_tokens; committed by emitted count. */
import { describe, expect, it } from "vitest";
import { isEog, mk, seq } from "../../../test/support/scheduler-harness.js";

// History 1 2 3 4 1 2 3 → the trigram [1 2 3] matched at 0 proposes [4 1 2 3] (the history to its end).
const REPEATING = [1, 2, 3, 4, 1, 2, 3];
const spec = (numAssistantTokens: number) => ({ speculation: { numAssistantTokens, maxNgramSize: 3 } });

/** Admit one request and prefill it, so its next step is a decode (the pending token is `pending`). */
function decoding(cfg: Parameters<typeof mk>[0], opts: Parameters<typeof seq>[2], pending = 4) {
  const s = mk(cfg);
  expect(s.add(seq("a", REPEATING.length, { inputTokens: REPEATING, ...opts }))).toBeNull();
  // Prefill (in chunks under a small budget) until the pending token is sampled.
  while (s.phaseOf("a") !== "decode") {
    const plan = s.schedule();
    s.commit(plan, plan.items[0]!.wantsLogits ? [{ id: "a", token: pending }] : [], isEog);
  }
  return s;
}

describe("scheduler drafts (prompt lookup)", () => {
  it("appends the n-gram drafts to the decode item and counts them against the step budget", () => {
    const s = decoding({ maxNumBatchedTokens: 16, maxModelLen: 64 }, spec(3));
    const plan = s.schedule();
    // history 1 2 3 4 1 2 3 4: [2 3 4] matched at 1 → 1 2 3.
    expect(plan.items).toEqual([{ id: "a", slot: 0, pos: 7, tokens: [4, 1, 2, 3], wantsLogits: true, kind: "decode", drafts: 3 }]);
    expect(plan.totalTokens).toBe(4);
  });

  it("proposes no drafts without speculation, and at most what the budget, capacity and max_tokens leave", () => {
    expect(decoding({ maxNumBatchedTokens: 16, maxModelLen: 64 }, {}).schedule().items[0]!.tokens).toEqual([4]);
    // Budget 3 with 2 slots: one token for the decode, 2 drafts.
    expect(decoding({ maxNumBatchedTokens: 3, maxModelLen: 64 }, spec(8)).schedule().items[0]!.drafts).toBe(2);
    // Capacity 11: 8 tokens now, a step may emit 3 more at most → 2 drafts.
    expect(decoding({ maxNumBatchedTokens: 16, maxModelLen: 11 }, spec(8)).schedule().items[0]!.drafts).toBe(2);
    // max_tokens 3 with 1 generated: 2 more tokens → 1 draft; max_tokens 2: none.
    expect(decoding({ maxNumBatchedTokens: 16, maxModelLen: 64 }, { ...spec(8), maxNewTokens: 3 }).schedule().items[0]!.drafts).toBe(1);
    expect(decoding({ maxNumBatchedTokens: 16, maxModelLen: 64 }, { ...spec(8), maxNewTokens: 2 }).schedule().items[0]!.tokens).toEqual([4]);
  });

  it("keeps in the KV the pending token and the accepted drafts: processed advances by the tokens emitted", () => {
    const s = decoding({ maxNumBatchedTokens: 16, maxModelLen: 64 }, spec(3));
    const plan = s.schedule();
    // Drafts 1 2 3: the samples 1 and 2 accepted d1 and d2, then 9 differs from d3: three tokens emitted.
    const out = s.commit(plan, [{ id: "a", token: 1 }, { id: "a", token: 2 }, { id: "a", token: 9 }], isEog);
    expect(out.finished).toEqual([]);
    expect(s.generatedTokens("a")).toEqual([4, 1, 2, 9]);
    expect(s.kvTokensInUse).toBe(7 + 3);
    expect(s.checkInvariants()).toEqual([]);
    // The next decode starts after them, with the last emitted token pending.
    expect(s.schedule().items[0]).toMatchObject({ pos: 10, tokens: [9] });
  });
});
