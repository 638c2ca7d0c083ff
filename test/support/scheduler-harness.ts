/** Helpers of the scheduler's unit tests (src/engine/scheduler*.test.ts): sequences, a small scheduler, one step. */
import { expect } from "vitest";
import { Scheduler, type Finished, type NewSequence, type Outcome, type Sampled, type SchedulerConfig, type StepPlan } from "../../src/engine/scheduler.js";

export const EOG = 999;
export const isEog = (t: number): boolean => t === EOG;

export function seq(id: string, inputLength: number, opts: Partial<Omit<NewSequence, "id">> = {}): NewSequence {
  const inputTokens = opts.inputTokens ?? Array.from({ length: inputLength }, (_, i) => 10 + i);
  return { ...opts, id, inputTokens, promptLength: opts.promptLength ?? inputTokens.length, maxNewTokens: opts.maxNewTokens ?? null, ignoreEos: opts.ignoreEos ?? false };
}

export function mk(cfg: Partial<SchedulerConfig> = {}): Scheduler {
  return new Scheduler({ maxNumSeqs: 2, maxNumBatchedTokens: 8, maxModelLen: 32, ...cfg });
}

/** Sample `token` for every item of the plan that wants logits. */
export function sampleAll(plan: StepPlan, token: number | ((id: string) => number) = 1): Sampled[] {
  return plan.items.filter((it) => it.wantsLogits).map((it) => ({ id: it.id, token: typeof token === "function" ? token(it.id) : token }));
}

/** Schedule and commit one step, checking invariants. */
export function step(s: Scheduler, token: number | ((id: string) => number) = 1): { plan: StepPlan; outcome: Outcome } {
  const plan = s.schedule();
  const outcome = s.commit(plan, sampleAll(plan, token), isEog);
  expect(s.checkInvariants()).toEqual([]);
  return { plan, outcome };
}

export function ids(fins: Finished[]): string[] {
  return fins.map((f) => f.id);
}
