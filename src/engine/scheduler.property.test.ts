/** The scheduler under random interleavings of adds, aborts, steps and failed steps at saturation (fast-check). */
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { Scheduler, type Finished, type Outcome, type Sampled, type StepPlan } from "./scheduler.js";
import { EOG, isEog, seq, step } from "../../test/support/scheduler-harness.js";

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
