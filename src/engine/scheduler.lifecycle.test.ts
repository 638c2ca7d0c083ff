/** The scheduler's request lifecycle beyond one step: refusals, aborts, failed steps, the prefix cache, invariant repair. */
import { describe, expect, it } from "vitest";
import { Scheduler, type SchedulerConfig } from "./scheduler.js";
import { ids, mk, seq, step } from "../../test/support/scheduler-harness.js";

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
