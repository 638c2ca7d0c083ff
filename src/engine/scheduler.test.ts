import { describe, expect, it } from "vitest";
import {
  PREFILL_CAP_MIN,
  PREFILL_CAP_SHARE,
  Scheduler,
  validateSchedulerConfig,
  type Finished,
} from "./scheduler.js";
import { EOG, ids, isEog, mk, sampleAll, seq, step } from "../../test/support/scheduler-harness.js";

describe("validateSchedulerConfig", () => {
  it("rejects max_num_batched_tokens < max_num_seqs", () => {
    expect(() => validateSchedulerConfig({ maxNumSeqs: 4, maxNumBatchedTokens: 3, maxModelLen: 64 })).toThrow(RangeError);
    expect(() => validateSchedulerConfig({ maxNumSeqs: 4, maxNumBatchedTokens: 3, maxModelLen: 64 })).toThrow(/max_num_batched_tokens/);
    expect(() => new Scheduler({ maxNumSeqs: 4, maxNumBatchedTokens: 3, maxModelLen: 64 })).toThrow(RangeError);
  });

  it("accepts max_num_batched_tokens == max_num_seqs", () => {
    expect(() => validateSchedulerConfig({ maxNumSeqs: 4, maxNumBatchedTokens: 4, maxModelLen: 64 })).not.toThrow();
  });

  it.each([
    { maxNumSeqs: 0, maxNumBatchedTokens: 4, maxModelLen: 64 },
    { maxNumSeqs: 1.5, maxNumBatchedTokens: 4, maxModelLen: 64 },
    { maxNumSeqs: 1, maxNumBatchedTokens: 4, maxModelLen: 0 },
    { maxNumSeqs: 1, maxNumBatchedTokens: Number.NaN, maxModelLen: 8 },
  ])("rejects non-positive or non-integer limits %o", (cfg) => {
    expect(() => validateSchedulerConfig(cfg)).toThrow(RangeError);
  });
});

describe("admission", () => {
  it("admits FCFS into max_num_seqs slots and the rest wait", () => {
    const s = mk({ maxNumSeqs: 2, maxNumBatchedTokens: 16 });
    for (const id of ["a", "b", "c", "d"]) expect(s.add(seq(id, 3, { maxNewTokens: 1 }))).toBeNull();
    expect(s.queuedCount).toBe(4);
    const plan = s.schedule();
    expect(plan.admitted.map((a) => a.id)).toEqual(["a", "b"]);
    expect(plan.admitted[0]!.promptTokens).toEqual([10, 11, 12]);
    expect(s.queuedCount).toBe(2);
    expect(s.runningCount).toBe(2);
    expect(s.activeSlots).toBe(2);
    expect(s.phaseOf("a")).toBe("prefill");
    expect(s.phaseOf("c")).toBe("queued");
    expect(new Set(plan.items.map((it) => it.slot)).size).toBe(2);
    // maxNewTokens 1: both finish at the first sampled token and free their slots.
    const out = s.commit(plan, sampleAll(plan), isEog);
    expect(ids(out.finished)).toEqual(["a", "b"]);
    expect(out.freedSlots.sort()).toEqual([0, 1]);
    const plan2 = s.schedule();
    expect(plan2.admitted.map((a) => a.id)).toEqual(["c", "d"]);
    expect(s.checkInvariants()).toEqual([]);
  });

  it("admitted promptTokens exclude resumed generated tokens", () => {
    const s = mk();
    s.add(seq("r", 5, { inputTokens: [1, 2, 3, 4, 5], promptLength: 3 }));
    const plan = s.schedule();
    expect(plan.admitted).toEqual([{ id: "r", promptTokens: [1, 2, 3], cachedTokens: 0 }]);
    expect(plan.items[0]!.tokens).toEqual([1, 2, 3, 4, 5]);
  });
});

describe("batch planning", () => {
  it("puts one token per decoding sequence first, then prefill chunks within the budget", () => {
    const s = mk({ maxNumSeqs: 3, maxNumBatchedTokens: 6, maxModelLen: 64 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    const p1 = step(s, (id) => (id === "a" ? 100 : 200)).plan;
    expect(p1.items.map((it) => [it.id, it.kind, it.pos, it.tokens.length, it.wantsLogits])).toEqual([
      ["a", "prefill", 0, 2, true],
      ["b", "prefill", 0, 2, true],
    ]);
    expect(s.phaseOf("a")).toBe("decode");
    s.add(seq("c", 10));
    const p2 = step(s).plan;
    expect(p2.items.map((it) => [it.id, it.kind, it.pos, it.tokens, it.wantsLogits])).toEqual([
      ["a", "decode", 2, [100], true],
      ["b", "decode", 2, [200], true],
      ["c", "prefill", 0, [10, 11, 12, 13], false],
    ]);
    expect(p2.totalTokens).toBe(6);
    const p3 = step(s).plan;
    expect(p3.items.map((it) => [it.id, it.kind, it.pos, it.tokens.length, it.wantsLogits])).toEqual([
      ["a", "decode", 3, 1, true],
      ["b", "decode", 3, 1, true],
      ["c", "prefill", 4, 4, false],
    ]);
    const p4 = step(s).plan;
    expect(p4.items.map((it) => [it.id, it.kind, it.pos, it.tokens.length, it.wantsLogits])).toEqual([
      ["a", "decode", 4, 1, true],
      ["b", "decode", 4, 1, true],
      ["c", "prefill", 8, 2, true],
    ]);
    expect(p4.totalTokens).toBe(4);
    expect(s.phaseOf("c")).toBe("decode");
    const p5 = step(s).plan;
    expect(p5.items.every((it) => it.kind === "decode")).toBe(true);
    expect(p5.items.map((it) => it.id)).toEqual(["a", "b", "c"]);
  });

  it("never plans more than max_num_batched_tokens and splits the budget across prefills in admission order", () => {
    const s = mk({ maxNumSeqs: 2, maxNumBatchedTokens: 5, maxModelLen: 64 });
    s.add(seq("a", 3));
    s.add(seq("b", 7));
    const p = step(s).plan;
    expect(p.items.map((it) => [it.id, it.tokens.length, it.wantsLogits])).toEqual([
      ["a", 3, true],
      ["b", 2, false],
    ]);
    expect(p.totalTokens).toBe(5);
  });

  it("a burst of short prompts is prefilled first come first served: the earliest finish first, not all together last", () => {
    const s = mk({ maxNumSeqs: 8, maxNumBatchedTokens: 256, maxModelLen: 512 });
    for (let i = 0; i < 8; i++) s.add(seq(`r${i}`, 60));
    const firstTokenStep = new Map<string, number>();
    for (let stepNo = 1; stepNo <= 3; stepNo++) {
      const { plan } = step(s);
      for (const it of plan.items) if (it.kind === "prefill" && it.wantsLogits) firstTokenStep.set(it.id, stepNo);
      expect(plan.totalTokens).toBeLessThanOrEqual(256);
    }
    // 8 × 60 = 480 prompt tokens at 256 per step: four prompts complete in step 1 (r0..r3), the rest in step 2 — an
    // equal share (32 each) would have completed none before step 2.
    expect([...firstTokenStep]).toEqual([["r0", 1], ["r1", 1], ["r2", 1], ["r3", 1], ["r4", 2], ["r5", 2], ["r6", 2], ["r7", 2]]);
  });

  it("a prompt that fits what is left of the step is prefilled whole in one step, also while other prefills wait behind it", () => {
    const s = mk({ maxNumSeqs: 8, maxNumBatchedTokens: 256, maxModelLen: 512 });
    // 100-token prompts: above the cap (64), each within the step budget.
    for (let i = 0; i < 8; i++) s.add(seq(`r${i}`, 100));
    const firstTokenStep = new Map<string, number>();
    const chunks = new Map<string, number>();
    for (let stepNo = 1; stepNo <= 4; stepNo++) {
      const { plan } = step(s);
      expect(plan.totalTokens).toBeLessThanOrEqual(256);
      for (const it of plan.items) {
        if (it.kind !== "prefill") continue;
        chunks.set(it.id, (chunks.get(it.id) ?? 0) + 1);
        if (it.wantsLogits) firstTokenStep.set(it.id, stepNo);
      }
    }
    // Step 1: r0 and r1 whole (200 tokens), r2 the 56 left; cutting each to the cap (64) finished none in step 1.
    expect([...firstTokenStep]).toEqual([["r0", 1], ["r1", 1], ["r2", 2], ["r3", 2], ["r4", 2], ["r5", 3], ["r6", 3], ["r7", 4]]);
    // A prompt that started in a step with room for it took exactly one chunk.
    for (const id of ["r0", "r1", "r3", "r4", "r6"]) expect(chunks.get(id)).toBe(1);
  });

  it("a long prompt ahead of short ones takes at most the cap while they wait, and the whole leftover when alone", () => {
    const s = mk({ maxNumSeqs: 4, maxNumBatchedTokens: 256, maxModelLen: 4096 });
    s.add(seq("long", 1000));
    s.add(seq("s1", 20));
    s.add(seq("s2", 20));
    const first = step(s).plan;
    const cap = Math.max(PREFILL_CAP_MIN, Math.ceil(256 * PREFILL_CAP_SHARE));
    // Pass 1: long gets the cap, the short ones their whole prompts; pass 2: the leftover goes back to long.
    expect(first.items.map((it) => [it.id, it.tokens.length, it.wantsLogits])).toEqual([
      ["long", 256 - 40, false],
      ["s1", 20, true],
      ["s2", 20, true],
    ]);
    expect(cap).toBeLessThan(256 - 40);
    // A short prompt arriving behind the long one is not held back for the long one's whole length.
    s.add(seq("s3", 30));
    const second = step(s).plan;
    expect(second.items.find((it) => it.id === "s3")).toMatchObject({ tokens: expect.any(Array), wantsLogits: true });
    expect(second.items.find((it) => it.id === "long")!.tokens.length).toBe(256 - 2 - 30);
  });

  it("chunks a long prompt across steps with wantsLogits only on the final chunk", () => {
    const s = mk({ maxNumSeqs: 1, maxNumBatchedTokens: 8, maxModelLen: 64 });
    const input = Array.from({ length: 20 }, (_, i) => 500 + i);
    s.add(seq("long", 20, { inputTokens: input }));
    const chunks: { pos: number; tokens: number[]; wantsLogits: boolean }[] = [];
    for (let i = 0; i < 3; i++) {
      const plan = s.schedule();
      expect(plan.items).toHaveLength(1);
      const it = plan.items[0]!;
      expect(it.kind).toBe("prefill");
      chunks.push({ pos: it.pos, tokens: it.tokens, wantsLogits: it.wantsLogits });
      // Non-final chunks get no sampled token.
      const out = s.commit(plan, it.wantsLogits ? [{ id: "long", token: 7 }] : [], isEog);
      expect(out.finished).toEqual([]);
      expect(s.checkInvariants()).toEqual([]);
      if (i < 2) expect(s.phaseOf("long")).toBe("prefill");
    }
    expect(chunks.map((c) => [c.pos, c.tokens.length, c.wantsLogits])).toEqual([
      [0, 8, false],
      [8, 8, false],
      [16, 4, true],
    ]);
    expect(chunks.flatMap((c) => c.tokens)).toEqual(input);
    expect(s.phaseOf("long")).toBe("decode");
    expect(s.generatedTokens("long")).toEqual([7]);
    const next = s.schedule();
    expect(next.items).toEqual([{ id: "long", slot: 0, pos: 20, tokens: [7], wantsLogits: true, kind: "decode" }]);
  });
});

describe("commit", () => {
  it("finishes with stop on an end-of-generation token", () => {
    const s = mk();
    s.add(seq("a", 3));
    step(s, 5);
    const { outcome } = step(s, EOG);
    expect(outcome.finished).toEqual([{ id: "a", reason: "stop", promptTokens: 3, completionTokens: 2 }]);
    expect(outcome.freedSlots).toEqual([0]);
    expect(s.phaseOf("a")).toBeNull();
    expect(s.hasWork).toBe(false);
  });

  it("does not stop on EOG under ignoreEos", () => {
    const s = mk();
    s.add(seq("a", 3, { ignoreEos: true, maxNewTokens: 3 }));
    expect(step(s, EOG).outcome.finished).toEqual([]);
    expect(step(s, EOG).outcome.finished).toEqual([]);
    const { outcome } = step(s, EOG);
    expect(outcome.finished).toEqual([{ id: "a", reason: "length", promptTokens: 3, completionTokens: 3 }]);
  });

  it("stops on a stop token (also under ignoreEos), not on an ordinary one", () => {
    const s = mk();
    s.add(seq("a", 3, { ignoreEos: true, stopTokens: new Set([7]) }));
    expect(step(s, 8).outcome.finished).toEqual([]);
    expect(step(s, EOG).outcome.finished).toEqual([]);
    expect(step(s, 7).outcome.finished).toEqual([{ id: "a", reason: "stop", promptTokens: 3, completionTokens: 3 }]);
  });

  it("minTokens: EOG and stop tokens end the request only once minTokens were generated, resumed tokens included", () => {
    const s = mk();
    s.add(seq("fresh", 3, { minTokens: 2, stopTokens: new Set([7]) }));
    // Input of 5 = prompt of 3 + 2 resumed tokens: minTokens 4 needs two more (not four).
    s.add(seq("resumed", 5, { promptLength: 3, minTokens: 4 }));
    expect(step(s, (id) => (id === "fresh" ? 7 : EOG)).outcome.finished).toEqual([]);
    const { outcome } = step(s, EOG);
    expect(outcome.finished).toEqual([
      { id: "fresh", reason: "stop", promptTokens: 3, completionTokens: 2 },
      { id: "resumed", reason: "stop", promptTokens: 5, completionTokens: 2 },
    ]);
  });

  it("a sequence's status goes waiting → prefill → decode through admission and commits", () => {
    const s = mk({ maxNumSeqs: 1, maxNumBatchedTokens: 4 });
    s.add(seq("a", 6, { maxNewTokens: 2 }));
    s.add(seq("b", 2));
    expect([s.phaseOf("a"), s.phaseOf("b")]).toEqual(["queued", "queued"]);
    step(s); // a: 4 of 6 prefilled
    expect([s.phaseOf("a"), s.phaseOf("b")]).toEqual(["prefill", "queued"]);
    step(s); // a: prefill done, first token sampled
    expect(s.phaseOf("a")).toBe("decode");
    step(s); // a: second token → length; b is admitted next step
    expect([s.phaseOf("a"), s.phaseOf("b")]).toEqual([null, "queued"]);
    s.schedule();
    expect(s.phaseOf("b")).toBe("prefill");
  });

  it("finishes with length at maxNewTokens", () => {
    const s = mk();
    s.add(seq("a", 4, { maxNewTokens: 2 }));
    expect(step(s).outcome.finished).toEqual([]);
    expect(s.generatedTokens("a")).toEqual([1]);
    const { outcome } = step(s);
    expect(outcome.finished).toEqual([{ id: "a", reason: "length", promptTokens: 4, completionTokens: 2 }]);
    expect(outcome.freedSlots).toEqual([0]);
  });

  it("finishes with length when the slot is full (maxModelLen)", () => {
    const s = mk({ maxModelLen: 8 });
    s.add(seq("a", 5));
    let fin: Finished[] = [];
    let steps = 0;
    while (s.hasWork) {
      fin = fin.concat(step(s).outcome.finished);
      steps += 1;
      expect(steps).toBeLessThan(10);
    }
    // 5 input tokens + 3 generated = 8 = maxModelLen.
    expect(fin).toEqual([{ id: "a", reason: "length", promptTokens: 5, completionTokens: 3 }]);
    expect(steps).toBe(3);
  });

  it("counts resumed tokens as prompt tokens, not completion tokens", () => {
    const s = mk();
    s.add(seq("r", 5, { inputTokens: [1, 2, 3, 4, 5], promptLength: 3, maxNewTokens: 1 }));
    expect(step(s).outcome.finished).toEqual([{ id: "r", reason: "length", promptTokens: 5, completionTokens: 1 }]);
  });

  it("ignores items of requests aborted between schedule and commit (late events)", () => {
    const s = mk({ maxNumSeqs: 2 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    step(s);
    const plan = s.schedule();
    const ab = s.abort(["a"]);
    expect(ab.finished).toEqual([{ id: "a", reason: "abort", promptTokens: 2, completionTokens: 1 }]);
    expect(ab.freedSlots).toEqual([0]);
    const out = s.commit(plan, [{ id: "a", token: EOG }, { id: "b", token: 42 }], isEog);
    expect(out).toEqual({ finished: [], freedSlots: [] });
    expect(s.generatedTokens("a")).toBeNull();
    expect(s.generatedTokens("b")).toEqual([1, 42]);
    expect(s.checkInvariants()).toEqual([]);
    // a's freed slot is handed to the next request, whose prefill starts at 0.
    s.add(seq("c", 3));
    const p = s.schedule();
    expect(p.items.find((it) => it.id === "c")).toMatchObject({ slot: 0, pos: 0, kind: "prefill" });
  });

  it("ignores items of a request aborted and re-added under the same id before commit", () => {
    const s = mk({ maxNumSeqs: 1 });
    s.add(seq("a", 2));
    const plan = s.schedule();
    s.abort(["a"]);
    s.add(seq("a", 4));
    const out = s.commit(plan, sampleAll(plan, EOG), isEog);
    expect(out.finished).toEqual([]);
    expect(s.phaseOf("a")).toBe("queued");
    expect(s.checkInvariants()).toEqual([]);
    expect(s.schedule().items[0]).toMatchObject({ id: "a", pos: 0, tokens: [10, 11, 12, 13] });
  });
});
