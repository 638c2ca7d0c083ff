import { describe, expect, it } from "vitest";
import fc from "fast-check";
import {
  PREFILL_CAP_MIN,
  PREFILL_CAP_SHARE,
  Scheduler,
  validateSchedulerConfig,
  type Finished,
  type NewSequence,
  type Outcome,
  type Sampled,
  type SchedulerConfig,
  type StepPlan,
} from "./scheduler.js";

const EOG = 999;
const isEog = (t: number): boolean => t === EOG;

function seq(id: string, inputLength: number, opts: Partial<Omit<NewSequence, "id">> = {}): NewSequence {
  const inputTokens = opts.inputTokens ?? Array.from({ length: inputLength }, (_, i) => 10 + i);
  return { ...opts, id, inputTokens, promptLength: opts.promptLength ?? inputTokens.length, maxNewTokens: opts.maxNewTokens ?? null, ignoreEos: opts.ignoreEos ?? false };
}

function mk(cfg: Partial<SchedulerConfig> = {}): Scheduler {
  return new Scheduler({ maxNumSeqs: 2, maxNumBatchedTokens: 8, maxModelLen: 32, ...cfg });
}

/** Sample `token` for every item of the plan that wants logits. */
function sampleAll(plan: StepPlan, token: number | ((id: string) => number) = 1): Sampled[] {
  return plan.items.filter((it) => it.wantsLogits).map((it) => ({ id: it.id, token: typeof token === "function" ? token(it.id) : token }));
}

/** Schedule and commit one step, checking invariants. */
function step(s: Scheduler, token: number | ((id: string) => number) = 1): { plan: StepPlan; outcome: Outcome } {
  const plan = s.schedule();
  const outcome = s.commit(plan, sampleAll(plan, token), isEog);
  expect(s.checkInvariants()).toEqual([]);
  return { plan, outcome };
}

function ids(fins: Finished[]): string[] {
  return fins.map((f) => f.id);
}

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

describe("refusals", () => {
  it("refuses input >= maxModelLen", () => {
    const s = mk({ maxModelLen: 8 });
    expect(s.add(seq("a", 8))).toMatchObject({ id: "a", code: "context_length_exceeded" });
    expect(s.add(seq("b", 9))?.code).toBe("context_length_exceeded");
    expect(s.add(seq("c", 7))).toBeNull();
    expect(s.queuedCount).toBe(1);
    expect(s.phaseOf("a")).toBeNull();
  });

  it("maxPromptLen (split-fuse off): refuses a prompt longer than it, as OVMS; resumed tokens do not count", () => {
    const s = mk({ maxModelLen: 64, maxNumBatchedTokens: 16, maxPromptLen: 16 });
    const r = s.add(seq("a", 17));
    expect(r).toMatchObject({ id: "a", code: "context_length_exceeded" });
    expect(r!.message).toMatch(/^Input length exceeds pipeline capabilities: 17 > 16/);
    expect(s.add(seq("b", 16))).toBeNull();
    // A resumed request: 16 prompt tokens plus 10 generated on an earlier engine is still a 16-token prompt.
    expect(s.add(seq("c", 26, { promptLength: 16 }))).toBeNull();
    expect(mk({ maxModelLen: 64, maxNumBatchedTokens: 16 }).add(seq("d", 17))).toBeNull();
  });

  it("refuses input + maxNewTokens > maxModelLen and accepts == maxModelLen", () => {
    const s = mk({ maxModelLen: 8 });
    const r = s.add(seq("a", 5, { maxNewTokens: 4 }));
    expect(r).toMatchObject({ id: "a", code: "context_length_exceeded" });
    expect(r!.message).toContain("8");
    expect(s.add(seq("b", 5, { maxNewTokens: 3 }))).toBeNull();
    expect(s.queuedCount).toBe(1);
  });

  it("refuses a duplicate live id, and accepts the id again after it finished", () => {
    const s = mk();
    expect(s.add(seq("a", 2, { maxNewTokens: 1 }))).toBeNull();
    expect(s.add(seq("a", 3))).toMatchObject({ id: "a", code: "duplicate_id" });
    expect(s.queuedCount).toBe(1);
    step(s);
    expect(s.phaseOf("a")).toBeNull();
    expect(s.add(seq("a", 3))).toBeNull();
  });

  it("refuses an empty input", () => {
    const s = mk();
    expect(s.add(seq("e", 0))).toMatchObject({ id: "e", code: "invalid_prompt" });
    expect(s.hasWork).toBe(false);
  });
});

describe("abort", () => {
  it("removes a waiting request without freeing a slot", () => {
    const s = mk({ maxNumSeqs: 1 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    step(s);
    expect(s.phaseOf("b")).toBe("queued");
    const out = s.abort(["b"]);
    expect(out).toEqual({ finished: [{ id: "b", reason: "abort", promptTokens: 2, completionTokens: 0 }], freedSlots: [] });
    expect(s.queuedCount).toBe(0);
    expect(s.activeSlots).toBe(1);
    expect(s.checkInvariants()).toEqual([]);
  });

  it("removes a waiting request that was never scheduled", () => {
    const s = mk();
    s.add(seq("a", 2));
    expect(s.abort(["a"])).toEqual({ finished: [{ id: "a", reason: "abort", promptTokens: 2, completionTokens: 0 }], freedSlots: [] });
    expect(s.hasWork).toBe(false);
    expect(s.schedule().items).toEqual([]);
  });

  it("frees the slot of a request in prefill (mid chunked prefill)", () => {
    const s = mk({ maxNumSeqs: 2, maxNumBatchedTokens: 4 });
    s.add(seq("x", 1));
    s.add(seq("a", 10));
    step(s);
    expect(s.phaseOf("a")).toBe("prefill");
    const out = s.abort(["a"]);
    expect(out.finished).toEqual([{ id: "a", reason: "abort", promptTokens: 10, completionTokens: 0 }]);
    expect(out.freedSlots).toEqual([1]);
    expect(s.activeSlots).toBe(1);
    expect(s.checkInvariants()).toEqual([]);
  });

  it("frees the slot of a decoding request and reports its completion tokens", () => {
    const s = mk({ maxNumSeqs: 2 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    step(s);
    step(s);
    expect(s.phaseOf("b")).toBe("decode");
    const out = s.abort(["b"]);
    expect(out.finished).toEqual([{ id: "b", reason: "abort", promptTokens: 2, completionTokens: 2 }]);
    expect(out.freedSlots).toEqual([1]);
    expect(s.runningCount).toBe(1);
  });

  it("is idempotent and ignores unknown ids", () => {
    const s = mk();
    s.add(seq("a", 2));
    step(s);
    expect(s.abort(["nope"])).toEqual({ finished: [], freedSlots: [] });
    const first = s.abort(["a", "a", "nope"]);
    expect(ids(first.finished)).toEqual(["a"]);
    expect(first.freedSlots).toEqual([0]);
    expect(s.abort(["a"])).toEqual({ finished: [], freedSlots: [] });
    expect(s.checkInvariants()).toEqual([]);
  });
});

describe("failStep", () => {
  it("fails only the requests of the batch", () => {
    const s = mk({ maxNumSeqs: 2, maxNumBatchedTokens: 6 });
    s.add(seq("a", 4));
    s.add(seq("b", 4));
    s.add(seq("w", 2));
    const full = s.schedule();
    // Budget 6 in admission order: a's whole prompt, then 2 of b's; w waits. Fail only a's part of the batch.
    expect(full.items.map((it) => [it.id, it.tokens.length])).toEqual([["a", 4], ["b", 2]]);
    const plan = { ...full, items: full.items.filter((it) => it.id === "a") };
    const err = { code: "engine_error" as const, message: "boom" };
    const out = s.failStep(plan, err);
    expect(out.finished).toEqual([{ id: "a", reason: "error", promptTokens: 4, completionTokens: 0, error: err }]);
    expect(out.freedSlots).toEqual([0]);
    expect(s.phaseOf("b")).toBe("prefill");
    expect(s.phaseOf("w")).toBe("queued");
    expect(s.checkInvariants()).toEqual([]);
    // The loop goes on: w takes the freed slot.
    const next = s.schedule();
    expect(next.admitted.map((a) => a.id)).toEqual(["w"]);
  });

  it("skips requests of the batch that were aborted in between", () => {
    const s = mk();
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    const plan = s.schedule();
    s.abort(["a"]);
    const out = s.failStep(plan, { code: "engine_error", message: "y" });
    expect(ids(out.finished)).toEqual(["b"]);
    expect(out.freedSlots).toEqual([1]);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Property test: random interleavings at saturation.

type Op =
  | { t: "add"; inputLength: number; maxNew: number | null; ignoreEos: boolean }
  | { t: "abort"; picks: number[] }
  | { t: "step"; eog: boolean[]; abortBeforeCommit: number[] }
  | { t: "fail" };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ t: fc.constant("add" as const), inputLength: fc.integer({ min: 1, max: 14 }), maxNew: fc.option(fc.integer({ min: 1, max: 8 }), { nil: null }), ignoreEos: fc.boolean() }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("abort" as const), picks: fc.array(fc.nat(), { maxLength: 3 }) }) },
  {
    weight: 5,
    arbitrary: fc.record({ t: fc.constant("step" as const), eog: fc.array(fc.boolean(), { maxLength: 6 }), abortBeforeCommit: fc.array(fc.nat(), { maxLength: 2 }) }),
  },
  { weight: 1, arbitrary: fc.constant({ t: "fail" as const }) },
);

interface ModelReq {
  id: string;
  inputLength: number;
  maxNew: number | null;
  ignoreEos: boolean;
  live: boolean;
  admitted: boolean;
  slot: number | null;
  generated: number;
  terminal: Finished[];
}

describe("scheduler property: random interleavings at saturation", () => {
  it("keeps its invariants, ends every request exactly once with the right reason, never shares a slot", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 3 }),
        fc.integer({ min: 0, max: 5 }),
        fc.integer({ min: 8, max: 20 }),
        fc.array(opArb, { minLength: 1, maxLength: 60 }),
        fc.constantFrom(undefined, { partialTrim: true }, { partialTrim: false }),
        (maxNumSeqs, extraBudget, maxModelLen, ops, caching) => {
          // caching: prefix cache off, on, or on for a recurrent model (no partial trim).
          const cfg = { maxNumSeqs, maxNumBatchedTokens: maxNumSeqs + extraBudget, maxModelLen, ...(caching ? { prefixCaching: true, ...caching } : {}) };
          const s = new Scheduler(cfg);
          const reqs: ModelReq[] = [];
          const byId = new Map<string, ModelReq>();
          let nextId = 0;
          const live = (): ModelReq[] => reqs.filter((r) => r.live);
          const waiting = (): ModelReq[] => live().filter((r) => !r.admitted);
          const running = (): ModelReq[] => live().filter((r) => r.admitted);
          const pick = (n: number): string => (n % (reqs.length + 2) < reqs.length ? reqs[n % (reqs.length + 2)]!.id : `unknown-${n}`);

          /** Record an outcome; `expectReason` decides per finished request whether the reason is right. */
          const record = (out: Outcome, check: (r: ModelReq, f: Finished) => void): void => {
            let freedExpected = 0;
            for (const f of out.finished) {
              const r = byId.get(f.id);
              expect(r, `finish for unknown ${f.id}`).toBeDefined();
              expect(r!.live, `second terminal event for ${f.id}`).toBe(true);
              expect(f.promptTokens).toBe(r!.inputLength);
              expect(f.completionTokens).toBe(r!.generated);
              check(r!, f);
              r!.terminal.push(f);
              r!.live = false;
              if (r!.admitted) {
                // With the prefix cache a cleanly finished slot keeps its KV; a failed one is always freed.
                if (!caching || f.reason === "error") {
                  freedExpected += 1;
                  if (r!.slot !== null) expect(out.freedSlots).toContain(r!.slot);
                }
              }
            }
            if (!caching) expect(out.freedSlots).toHaveLength(freedExpected);
            else expect(out.freedSlots.length).toBeGreaterThanOrEqual(freedExpected);
            expect(new Set(out.freedSlots).size).toBe(out.freedSlots.length);
          };

          const checkState = (): void => {
            expect(s.checkInvariants()).toEqual([]);
            expect(s.queuedCount).toBe(waiting().length);
            expect(s.runningCount).toBe(running().length);
            expect(s.activeSlots).toBe(running().length);
            expect(s.activeSlots).toBeLessThanOrEqual(maxNumSeqs);
            for (const r of reqs) {
              const phase = s.phaseOf(r.id);
              if (!r.live) expect(phase).toBeNull();
              else if (!r.admitted) expect(phase).toBe("queued");
              else expect(phase === "prefill" || phase === "decode").toBe(true);
            }
          };

          const schedule = (): StepPlan => {
            const before = waiting().map((r) => r.id);
            const free = maxNumSeqs - running().length;
            const plan = s.schedule();
            // FCFS: the first `free` waiting requests, in arrival order.
            expect(plan.admitted.map((a) => a.id)).toEqual(before.slice(0, Math.max(0, free)));
            for (const a of plan.admitted) byId.get(a.id)!.admitted = true;
            expect(plan.totalTokens).toBeLessThanOrEqual(cfg.maxNumBatchedTokens);
            expect(plan.totalTokens).toBe(plan.items.reduce((n, it) => n + it.tokens.length, 0));
            const slotsInPlan = plan.items.map((it) => it.slot);
            expect(new Set(slotsInPlan).size).toBe(slotsInPlan.length);
            // Decodes come before prefills, and every decoding request gets one token.
            const firstPrefill = plan.items.findIndex((it) => it.kind === "prefill");
            if (firstPrefill >= 0) expect(plan.items.slice(firstPrefill).every((it) => it.kind === "prefill")).toBe(true);
            for (const it of plan.items) {
              const r = byId.get(it.id)!;
              expect(r.live && r.admitted).toBe(true);
              expect(it.slot).toBeGreaterThanOrEqual(0);
              expect(it.slot).toBeLessThan(maxNumSeqs);
              if (r.slot === null) {
                // A slot is never handed to two live requests.
                const holder = live().find((o) => o !== r && o.slot === it.slot);
                expect(holder, `slot ${it.slot} given to ${r.id} while ${holder?.id} holds it`).toBeUndefined();
                r.slot = it.slot;
              } else {
                expect(it.slot).toBe(r.slot);
              }
              if (it.kind === "decode") expect(it.tokens).toHaveLength(1);
              expect(it.pos + it.tokens.length).toBeLessThanOrEqual(maxModelLen);
            }
            return plan;
          };

          const abortIds = (idList: string[]): void => {
            const wasLive = new Set(idList.filter((id) => byId.get(id)?.live));
            record(s.abort(idList), (r, f) => {
              expect(f.reason).toBe("abort");
              expect(wasLive.has(r.id)).toBe(true);
            });
            for (const id of wasLive) expect(byId.get(id)!.live).toBe(false);
          };

          const doStep = (eog: boolean[], abortBeforeCommit: number[]): void => {
            const plan = schedule();
            checkState();
            const late = abortBeforeCommit.map(pick);
            abortIds(late);
            checkState();
            const sampled: Sampled[] = [];
            plan.items.forEach((it, i) => {
              if (it.wantsLogits) sampled.push({ id: it.id, token: eog[i % Math.max(1, eog.length)] ? EOG : 7 + i });
            });
            // Model: which sampled tokens count (request still live after the late aborts).
            const counted = sampled.filter((x) => byId.get(x.id)!.live);
            for (const x of counted) byId.get(x.id)!.generated += 1;
            const out = s.commit(plan, sampled, isEog);
            const finishedNow = new Set(out.finished.map((f) => f.id));
            for (const x of counted) {
              const r = byId.get(x.id)!;
              const stop = !r.ignoreEos && x.token === EOG;
              const length = (r.maxNew !== null && r.generated >= r.maxNew) || r.inputLength + r.generated >= maxModelLen;
              expect(finishedNow.has(r.id), `finish of ${r.id} (stop=${stop}, length=${length})`).toBe(stop || length);
            }
            record(out, (r, f) => {
              const x = counted.find((c) => c.id === r.id);
              expect(x, `commit finished ${r.id} that had no live sampled token`).toBeDefined();
              expect(f.reason).toBe(!r.ignoreEos && x!.token === EOG ? "stop" : "length");
            });
            checkState();
          };

          for (const op of ops) {
            if (op.t === "add") {
              const id = `r${nextId++}`;
              const refusal = s.add(seq(id, op.inputLength, { maxNewTokens: op.maxNew, ignoreEos: op.ignoreEos }));
              const fits = op.inputLength < maxModelLen && (op.maxNew === null || op.inputLength + op.maxNew <= maxModelLen);
              expect(refusal === null).toBe(fits);
              if (refusal) expect(refusal.code).toBe("context_length_exceeded");
              else {
                const r: ModelReq = { id, inputLength: op.inputLength, maxNew: op.maxNew, ignoreEos: op.ignoreEos, live: true, admitted: false, slot: null, generated: 0, terminal: [] };
                reqs.push(r);
                byId.set(id, r);
              }
              // A duplicate of a live id is always refused.
              const anyLive = live()[0];
              if (anyLive) expect(s.add(seq(anyLive.id, 1))?.code).toBe("duplicate_id");
            } else if (op.t === "abort") {
              abortIds(op.picks.map(pick));
            } else if (op.t === "step") {
              doStep(op.eog, op.abortBeforeCommit);
            } else {
              const plan = schedule();
              const inPlan = new Set(plan.items.map((it) => it.id));
              const err = { code: "engine_error" as const, message: "decode failed" };
              record(s.failStep(plan, err), (r, f) => {
                expect(f.reason).toBe("error");
                expect(f.error).toEqual(err);
                expect(inPlan.has(r.id)).toBe(true);
              });
              for (const id of inPlan) expect(byId.get(id)!.live).toBe(false);
            }
            checkState();
          }
          // Drain: without new adds every request ends (length caps guarantee progress).
          for (let i = 0; s.hasWork; i++) {
            expect(i).toBeLessThan(500);
            doStep([false], []);
          }
          checkState();
          for (const r of reqs) expect(r.terminal, `terminal events of ${r.id}`).toHaveLength(1);
        },
      ),
      { numRuns: 400 },
    );
  });
});

describe("prefix cache", () => {
  const cached = (cfg: Partial<SchedulerConfig> = {}) => mk({ maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 64, prefixCaching: true, ...cfg });
  /** Run one request to completion (prefill + `gen` greedy tokens 100, 101, …). */
  function runToEnd(s: Scheduler, id: string, input: number[], gen: number): void {
    s.add(seq(id, input.length, { inputTokens: input, maxNewTokens: gen }));
    for (let i = 0; i < 20 && s.phaseOf(id) !== null; i++) {
      const plan = s.schedule();
      const sampled = plan.items.filter((it) => it.wantsLogits && it.id === id).map((it) => ({ id, token: 100 + it.pos }));
      s.commit(plan, sampled, () => false);
      expect(s.checkInvariants()).toEqual([]);
    }
    expect(s.phaseOf(id)).toBeNull();
  }

  it("keeps a finished request's KV and reuses the longest common prefix, prefilling only the suffix", () => {
    const s = cached();
    runToEnd(s, "a", [1, 2, 3, 4, 5, 6], 2); // slot holds 1..6 + first generated token
    expect(s.cachedSlots).toBe(1);
    expect(s.activeSlots).toBe(0);
    s.add(seq("b", 8, { inputTokens: [1, 2, 3, 4, 9, 9, 9, 9] }));
    const plan = s.schedule();
    expect(plan.admitted).toEqual([{ id: "b", promptTokens: [1, 2, 3, 4, 9, 9, 9, 9], cachedTokens: 4 }]);
    const slot = plan.items[0]!.slot;
    expect(plan.kvOps).toEqual([{ slot, keep: 4 }]);
    expect(plan.items[0]).toMatchObject({ pos: 4, tokens: [9, 9, 9, 9], wantsLogits: true });
    expect(s.prefixHitTokens).toBe(4);
    expect(s.cachedSlots).toBe(0);
  });

  it("an identical prompt still prefills its last token (logits are needed)", () => {
    const s = cached();
    runToEnd(s, "a", [1, 2, 3], 1);
    s.add(seq("b", 3, { inputTokens: [1, 2, 3] }));
    const plan = s.schedule();
    expect(plan.admitted[0]!.cachedTokens).toBe(2);
    expect(plan.items[0]).toMatchObject({ pos: 2, tokens: [3] });
  });

  it("prefers an empty slot over evicting a cache entry when nothing is shared", () => {
    const s = cached();
    runToEnd(s, "a", [1, 2, 3], 1);
    s.add(seq("b", 3, { inputTokens: [7, 8, 9] }));
    const plan = s.schedule();
    expect(plan.kvOps).toEqual([]);
    expect(plan.admitted[0]!.cachedTokens).toBe(0);
    expect(s.cachedSlots).toBe(1);
  });

  it("recurrent models (no partial trim) reuse a slot only when all cached tokens prefix the input, else clear it", () => {
    const s = cached({ maxNumSeqs: 1, partialTrim: false });
    runToEnd(s, "a", [1, 2, 3], 1); // cache holds [1, 2, 3] (the sampled token was never decoded)
    s.add(seq("b", 5, { inputTokens: [1, 2, 3, 4, 5] }));
    let plan = s.schedule();
    expect(plan.kvOps).toEqual([]);
    expect(plan.admitted[0]!.cachedTokens).toBe(3);
    s.abort(["b"]);
    // b's KV ([1..3] + chunk) is cached now; a request sharing only part of it must get a cleared slot.
    s.add(seq("c", 3, { inputTokens: [1, 2, 7] }));
    plan = s.schedule();
    expect(plan.kvOps).toEqual([{ slot: 0, keep: 0 }]);
    expect(plan.admitted[0]!.cachedTokens).toBe(0);
    expect(plan.items[0]).toMatchObject({ pos: 0, tokens: [1, 2, 7] });
  });

  it("a failed step does not leave its KV in the cache", () => {
    const s = cached({ maxNumSeqs: 1 });
    s.add(seq("a", 3, { inputTokens: [1, 2, 3] }));
    const plan = s.schedule();
    s.commit(plan, [], () => false);
    const out = s.failStep(s.schedule(), { code: "engine_error", message: "x" });
    expect(out.freedSlots).toEqual([0]);
    expect(s.cachedSlots).toBe(0);
  });
});

describe("invariant repair (production containment)", () => {
  /** Reach into the scheduler's private state to corrupt it the way a bug would. */
  const internals = (s: Scheduler) => s as unknown as { queued: unknown[]; running: { id: string; status: { processed: number } }[]; slots: unknown[] };

  it("a request queued twice is failed alone; the others and the invariants are fine afterwards", () => {
    const s = mk({ maxNumSeqs: 1 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    s.add(seq("c", 2));
    s.schedule(); // a runs; b and c wait
    internals(s).queued.push(internals(s).queued[0]); // b twice
    expect(s.checkInvariants()).not.toEqual([]);
    const out = s.repairInvariants();
    expect(out.finished.map((f) => [f.id, f.reason, f.error?.code])).toEqual([["b", "error", "invariant_violation"]]);
    expect(s.checkInvariants()).toEqual([]);
    expect(s.phaseOf("a")).toBe("prefill");
    expect(s.phaseOf("c")).toBe("queued");
  });

  it("a slot owned by a request that is not live is emptied (its KV cleared); nobody fails", () => {
    const s = mk({ maxNumSeqs: 2 });
    s.add(seq("a", 2));
    s.schedule();
    internals(s).slots[1] = { kind: "owned", id: "ghost" };
    const out = s.repairInvariants();
    expect(out.finished).toEqual([]);
    expect(out.freedSlots).toEqual([1]);
    expect(s.checkInvariants()).toEqual([]);
    expect(s.activeSlots).toBe(1);
  });

  it("a running request beyond its capacity fails and frees its slot", () => {
    const s = mk({ maxNumSeqs: 2 });
    s.add(seq("a", 2));
    s.add(seq("b", 2));
    s.schedule();
    const a = internals(s).running.find((r) => r.id === "a")!;
    a.status = { ...a.status, processed: 99 };
    const out = s.repairInvariants();
    expect(out.finished.map((f) => f.id)).toEqual(["a"]);
    expect(out.freedSlots).toHaveLength(1);
    expect(s.checkInvariants()).toEqual([]);
    expect(s.phaseOf("b")).toBe("prefill");
    expect(s.repairInvariants()).toEqual({ finished: [], freedSlots: [] });
  });
});
