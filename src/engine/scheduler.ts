/**
 * The continuous-batching scheduler: pure logic, no I/O, no native calls.
 *
 * The engine loop owns one Scheduler and drives it once per step (docs/design-rules.md, "one owner of engine state",
 * "step boundaries"):
 *   1. `add` / `abort` with the commands snapshotted at the step boundary;
 *   2. `schedule()` admits queued requests to free sequences (FCFS) and plans ONE batch — one token per decoding
 *      sequence first, then prefill chunks within the token budget (chunked prefill, as vLLM v1 / Sarathi);
 *   3. the loop decodes the batch and samples; `commit()` records the sampled tokens and decides who finished;
 *      or `failStep()` fails the requests of a batch that could not be decoded.
 * Every method returns the sequence slots it released, so the loop can clear their KV before the next decode.
 *
 * Terms: a *slot* is one of `maxNumSeqs` KV partitions (a llama.cpp sequence id); *processed* counts tokens whose
 * KV is in the slot; a sequence's {@link SequenceStatus} says whether it is queued, in prefill or in decode (the
 * gateway's phase names). Parts: scheduler/types.ts (the vocabulary), slots.ts (slot choice), prefill-plan.ts (the
 * chunk plan), stop.ts (the stop decision), invariants.ts.
 */
import type { EngineErrorCode } from "../protocol/messages.js";
import { draftRoom, draftsFor } from "./scheduler/drafts.js";
import { findViolations, type SchedulerView } from "./scheduler/invariants.js";
import { planPrefill } from "./scheduler/prefill-plan.js";
import { chooseSlot, processedOf, slotOf, slotOfId, type SlotState } from "./scheduler/slots.js";
import { stopReason } from "./scheduler/stop.js";
import {
  validateSchedulerConfig,
  type AddRefusal,
  type Finished,
  type NewSequence,
  type Outcome,
  type Sampled,
  type SchedulerConfig,
  type Sequence,
  type SequencePhase,
  type StepPlan,
} from "./scheduler/types.js";

export { PREFILL_CAP_MIN, PREFILL_CAP_SHARE } from "./scheduler/prefill-plan.js";
export {
  validateSchedulerConfig,
  type AddRefusal,
  type BatchItem,
  type Finished,
  type KvOp,
  type NewSequence,
  type Outcome,
  type Sampled,
  type SchedulerConfig,
  type SequencePhase,
  type SequenceStatus,
  type StepPlan,
} from "./scheduler/types.js";

export class Scheduler {
  /** Requests not yet admitted, in arrival order (FCFS). */
  private readonly queued: Sequence[] = [];
  /** Requests owning a slot, in admission order. */
  private readonly running: Sequence[] = [];
  /** What each slot holds. */
  private readonly slots: SlotState[];
  /** Logical clock for least-recently-released choice among cached slots. */
  private clock = 0;
  /** Prefill tokens saved by prefix reuse since start. */
  prefixHitTokens = 0;
  /** Every live request by id (queued or running). */
  private readonly live = new Map<string, Sequence>();

  constructor(readonly config: SchedulerConfig) {
    validateSchedulerConfig(config);
    this.slots = Array.from({ length: config.maxNumSeqs }, (): SlotState => ({ kind: "empty" }));
  }

  /** Idle slots holding reusable KV (not owned by any live request). */
  get cachedSlots(): number {
    return this.slots.filter((s) => s.kind === "cached").length;
  }

  /** Requests queued for a slot (the step message's `stats.waiting`). */
  get queuedCount(): number {
    return this.queued.length;
  }

  /** Requests owning a slot. */
  get runningCount(): number {
    return this.running.length;
  }

  /** Slots owned by live requests. */
  get activeSlots(): number {
    return this.slots.filter((o) => o.kind === "owned").length;
  }

  /** KV cells (tokens) held by live requests: what their slots hold (the gateway's KV-usage gauge). */
  get kvTokensInUse(): number {
    let n = 0;
    for (const s of this.running) n += processedOf(s);
    return n;
  }

  /** True when a step would do work. */
  get hasWork(): boolean {
    return this.queued.length > 0 || this.running.length > 0;
  }

  /** Phase of a live request, or null if unknown. */
  phaseOf(id: string): SequencePhase | null {
    return this.live.get(id)?.status.phase ?? null;
  }

  /**
   * Queue a request. Refuses (without queueing) an id that is live, an empty input, or a request that cannot fit
   * the slot capacity: input ≥ maxModelLen (no room for one token), or input + maxNewTokens > maxModelLen.
   */
  add(req: NewSequence): AddRefusal | null {
    const cap = this.config.maxModelLen;
    if (this.live.has(req.id)) return { id: req.id, code: "duplicate_id", message: `request id ${req.id} is already live` };
    if (req.inputTokens.length === 0) return { id: req.id, code: "invalid_prompt", message: "the prompt is empty after tokenization" };
    const promptCap = this.config.maxPromptLen;
    if (promptCap !== undefined && req.promptLength > promptCap) {
      // OVMS's wording for the same refusal (split-fuse off), so clients matching on it keep working.
      return { id: req.id, code: "context_length_exceeded", message: `Input length exceeds pipeline capabilities: ${req.promptLength} > ${promptCap} (a prompt must fit one step of ${promptCap} tokens when chunked prefill is off)` };
    }
    if (req.inputTokens.length >= cap) {
      return {
        id: req.id,
        code: "context_length_exceeded",
        message: `This model's maximum context length is ${cap} tokens. However, your messages resulted in ${req.inputTokens.length} tokens.`,
      };
    }
    if (req.maxNewTokens !== null && req.inputTokens.length + req.maxNewTokens > cap) {
      return {
        id: req.id,
        code: "context_length_exceeded",
        message:
          `This model's maximum context length is ${cap} tokens. However, you requested ${req.inputTokens.length + req.maxNewTokens} tokens ` +
          `(${req.inputTokens.length} in the messages, ${req.maxNewTokens} in the completion).`,
      };
    }
    const seq: Sequence = {
      id: req.id,
      status: { phase: "queued" },
      tokens: [...req.inputTokens],
      inputLength: req.inputTokens.length,
      promptLength: req.promptLength,
      generated: 0,
      maxNewTokens: req.maxNewTokens,
      ignoreEos: req.ignoreEos,
      stopTokens: req.stopTokens ?? null,
      minTokens: req.minTokens ?? 0,
      speculation: req.speculation ?? null,
    };
    this.queued.push(seq);
    this.live.set(req.id, seq);
    return null;
  }

  /**
   * Abort requests. A queued request is removed without touching any slot; a running one frees its slot at once.
   * Unknown ids (already finished, or never seen) are ignored: aborts are idempotent (docs/design-rules.md, "late
   * events").
   */
  abort(ids: Iterable<string>): Outcome {
    const out: Outcome = { finished: [], freedSlots: [] };
    for (const id of ids) {
      const s = this.live.get(id);
      if (!s) continue;
      this.release(s, { id, reason: "abort", promptTokens: s.inputLength, completionTokens: s.generated }, out);
    }
    return out;
  }

  /** Admit queued requests to free slots, then plan one batch. */
  schedule(): StepPlan {
    const plan: StepPlan = { kvOps: [], items: [], admitted: [], totalTokens: 0 };
    // 1. Admission, FCFS into free slots; each goes to the free slot whose cached KV shares its longest prefix.
    while (this.queued.length > 0 && this.slots.some((st) => st.kind !== "owned")) {
      const s = this.queued[0]!;
      const choice = chooseSlot(this.slots, s.tokens.slice(0, s.inputLength), this.config.partialTrim !== false);
      if (choice === null) break;
      this.queued.shift();
      const prev = this.slots[choice.slot]!;
      if (prev.kind === "cached" && choice.keep < prev.tokens.length) plan.kvOps.push({ slot: choice.slot, keep: choice.keep });
      this.admit(s, choice.slot, choice.keep);
      this.prefixHitTokens += choice.keep;
      this.slots[choice.slot] = { kind: "owned", id: s.id };
      this.running.push(s);
      plan.admitted.push({ id: s.id, promptTokens: s.tokens.slice(0, s.promptLength), cachedTokens: choice.keep });
    }
    let budget = this.config.maxNumBatchedTokens;
    // 2. One token per decoding sequence (budget ≥ maxNumSeqs guarantees room for all of them).
    for (const s of this.running) {
      if (s.status.phase !== "decode") continue;
      const { slot, processed } = s.status;
      plan.items.push({ id: s.id, slot, pos: processed, tokens: [s.tokens[processed]!], wantsLogits: true, kind: "decode" });
      budget -= 1;
    }
    // 2b. Draft tokens (prompt lookup) from what is left, in admission order: they count against the step budget.
    for (const it of plan.items) {
      const s = this.live.get(it.id)!;
      const drafts = draftsFor(s, draftRoom(s, budget, this.config.maxModelLen));
      if (drafts.length === 0) continue;
      it.tokens.push(...drafts);
      it.drafts = drafts.length;
      budget -= drafts.length;
    }
    // 3. Prefill chunks from what is left (the chunk plan: scheduler/prefill-plan.ts).
    const prefilling = this.running.filter((s): s is Sequence & { status: { phase: "prefill" } } => s.status.phase === "prefill");
    const take = planPrefill(prefilling.map((s) => s.inputLength - s.status.processed), budget, this.config.maxNumBatchedTokens);
    prefilling.forEach((s, k) => {
      const n = take[k]!;
      if (n === 0) return;
      const { slot, processed } = s.status;
      const end = processed + n;
      plan.items.push({
        id: s.id,
        slot,
        pos: processed,
        tokens: s.tokens.slice(processed, end),
        wantsLogits: end === s.inputLength,
        kind: "prefill",
      });
    });
    plan.totalTokens = plan.items.reduce((a, it) => a + it.tokens.length, 0);
    return plan;
  }

  /**
   * Record a decoded step: advance each item's processed count and append the sampled tokens; finish the requests
   * the stop decision ends (scheduler/stop.ts). Items whose request was aborted in the meantime are skipped (late
   * events are ignored, never asserted on).
   */
  commit(plan: StepPlan, sampled: Sampled[], isEndOfGeneration: (token: number) => boolean): Outcome {
    const out: Outcome = { finished: [], freedSlots: [] };
    const emitted = new Map<string, number>();
    for (const { id } of sampled) emitted.set(id, (emitted.get(id) ?? 0) + 1);
    for (const it of plan.items) {
      const s = this.live.get(it.id);
      if (!s || slotOf(s) !== it.slot) continue;
      // A drafted item keeps in its KV the pending token and the accepted drafts: one position per emitted token.
      this.advance(s, it.pos + (it.drafts ? Math.min(emitted.get(it.id) ?? 1, it.tokens.length) : it.tokens.length));
    }
    for (const { id, token, guideEnd } of sampled) {
      const s = this.live.get(id);
      if (!s || s.status.phase === "queued") continue;
      s.tokens.push(token);
      s.generated += 1;
      const reason = stopReason(s, token, guideEnd === true, isEndOfGeneration, this.config.maxModelLen);
      if (reason) this.release(s, { id, reason, promptTokens: s.inputLength, completionTokens: s.generated }, out);
    }
    return out;
  }

  /** Fail every request of a batch that could not be decoded (only those; the loop goes on). */
  failStep(plan: StepPlan, error: { code: EngineErrorCode; message: string }): Outcome {
    const out: Outcome = { finished: [], freedSlots: [] };
    for (const it of plan.items) {
      const s = this.live.get(it.id);
      if (!s) continue;
      this.release(s, { id: s.id, reason: "error", promptTokens: s.inputLength, completionTokens: s.generated, error }, out);
    }
    return out;
  }

  /** Tokens generated so far by a live request (for tests and resume). */
  generatedTokens(id: string): number[] | null {
    const s = this.live.get(id);
    return s ? s.tokens.slice(s.inputLength) : null;
  }

  /**
   * Check the scheduler's invariants; returns a description of each violation (empty when consistent).
   * Tests call it after every step; production logs violations.
   */
  checkInvariants(): string[] {
    return findViolations(this.view()).map((v) => v.message);
  }

  /**
   * Production recovery from a violated invariant (never a crash): every request a violation names fails with
   * `invariant_violation`, and every slot it names is emptied (its KV must be cleared). The other requests go on.
   */
  repairInvariants(): Outcome {
    const out: Outcome = { finished: [], freedSlots: [] };
    const violations = findViolations(this.view());
    if (violations.length === 0) return out;
    const ids = new Set(violations.flatMap((v) => v.ids));
    const slots = new Set(violations.flatMap((v) => v.slots));
    const error = { code: "invariant_violation" as const, message: `scheduler invariant violated: ${violations.map((v) => v.message).join("; ")}` };
    for (const id of ids) {
      const s = this.live.get(id);
      const slot = s ? slotOf(s) : null;
      if (slot !== null) slots.add(slot);
      this.live.delete(id);
      if (s) out.finished.push({ id, reason: "error", promptTokens: s.inputLength, completionTokens: s.generated, error });
    }
    for (let i = this.queued.length - 1; i >= 0; i--) if (ids.has(this.queued[i]!.id)) this.queued.splice(i, 1);
    for (let i = this.running.length - 1; i >= 0; i--) if (ids.has(this.running[i]!.id)) this.running.splice(i, 1);
    for (const slot of slots) {
      const st = this.slots[slot];
      if (st?.kind === "owned" && !ids.has(st.id) && slotOfId(this.live, st.id) === slot) continue; // a healthy owner
      this.slots[slot] = { kind: "empty" };
      out.freedSlots.push(slot);
    }
    return out;
  }

  /** The state the invariants are about (scheduler/invariants.ts). */
  private view(): SchedulerView {
    return { config: this.config, queued: this.queued, running: this.running, slots: this.slots, live: this.live };
  }

  /** Transition queued → prefill (decode when all is cached): `s` owns `slot`, whose first `keep` tokens hold its KV. */
  private admit(s: Sequence, slot: number, keep: number): void {
    s.status = keep < s.inputLength ? { phase: "prefill", slot, processed: keep } : { phase: "decode", slot, processed: keep };
  }

  /** Transition prefill → prefill | decode, decode → decode: `processed` tokens are now in the slot's KV. */
  private advance(s: Sequence, processed: number): void {
    if (s.status.phase === "queued") return;
    const slot = s.status.slot;
    s.status = processed < s.inputLength ? { phase: "prefill", slot, processed } : { phase: "decode", slot, processed };
  }

  /** Remove a live request from wherever it is and record its terminal event. */
  private release(s: Sequence, fin: Finished, out: Outcome): void {
    this.live.delete(s.id);
    if (s.status.phase === "queued") {
      const i = this.queued.indexOf(s);
      if (i >= 0) this.queued.splice(i, 1);
    } else {
      const { slot, processed } = s.status;
      const i = this.running.indexOf(s);
      if (i >= 0) this.running.splice(i, 1);
      // Keep the KV of a request that ended cleanly as a prefix cache entry; a failed step's KV is suspect.
      if (this.config.prefixCaching && fin.reason !== "error" && processed > 0) {
        this.slots[slot] = { kind: "cached", tokens: s.tokens.slice(0, processed), releasedAt: ++this.clock };
      } else {
        this.slots[slot] = { kind: "empty" };
        out.freedSlots.push(slot);
      }
      s.status = { phase: "queued" }; // detached: no longer live, owns nothing
    }
    out.finished.push(fin);
  }
}
