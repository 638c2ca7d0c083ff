/**
 * The engine step loop: the single owner of engine state (docs/design-rules.md, "one owner of engine state").
 *
 * Commands (add / abort / tokenize) are only queued by `submit()`; the loop takes ONE snapshot of them per step and
 * applies them at the step boundary ("step boundaries"), then runs the step as named parts:
 *   schedule — the {@link Scheduler} admits waiting requests and plans one batch (KV trims first);
 *   execute  — the {@link BatchExecutor} decodes the batch and samples it sequentially (execute.ts);
 *   update   — the scheduler commits the sampled tokens and decides who finished; tokens, text and finishes are
 *              recorded, freed slots cleared;
 * and emits exactly one `step` message for each step that did work. No native call ever overlaps a decode: slots
 * are cleared and samplers disposed only between decodes. On a device backend with the overlap on (`overlapsDecode`)
 * a decode step's message is sent while the next step's decode computes, together with the event-loop turn (vLLM's
 * overlap of output processing with the next forward pass): the host work between decodes shrinks to scheduling and
 * sampling; a step that admitted or finished a request is sent at once.
 * Admission of an add: admission.ts.
 */
import type { AddMessage, EngineErrorCode, EngineMessage, RequestOutput, TokenizedMessage, TokenizeMessage } from "../protocol/messages.js";
import { PROTOCOL_VERSION } from "../protocol/messages.js";
import { admitAdd, isRefused } from "./admission.js";
import { grammarSupport, type ModelBackend } from "./backend.js";
import { BatchExecutor, type Executed } from "./execute.js";
import type { RequestState } from "./request-state.js";
import type { NgramSettings } from "./speculation/ngram.js";
import { Scheduler, type BatchItem, type Outcome, type SchedulerConfig, type StepPlan } from "./scheduler.js";

/** One turn of the event loop (I/O callbacks run: commands are queued, pings answered). */
const nextTurn = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve));

/** A command for the loop, applied at the next step boundary. */
export type LoopCommand = AddMessage | { type: "abort"; ids: string[] } | TokenizeMessage;

/** Largest `params.logprobs` a backend with log probabilities serves (OpenAI's top_logprobs cap). */
export const MAX_TOP_LOGPROBS = 20;

/** Options of a {@link StepLoop}. */
export interface StepLoopOptions {
  /** Receives the scheduler's invariant violations after a step that found any (tests fail on any; main logs). */
  onInvariantViolation?: (violations: string[]) => void;
  /** Prompt-lookup settings of requests that set none (`--prompt_lookup`); absent = off unless a request asks. */
  promptLookup?: NgramSettings | null;
}

/** The outputs of one step, one per request it touched, in first-touch order. */
class StepOutputs {
  readonly byId = new Map<string, RequestOutput>();

  /** The output of request `id` in this step (created empty on first use). */
  of(id: string): RequestOutput {
    let o = this.byId.get(id);
    if (!o) this.byId.set(id, (o = { id, tokens: [], text: "" }));
    return o;
  }
}

export class StepLoop {
  /** Commands received since the last snapshot, in arrival order. */
  private inbox: LoopCommand[] = [];
  /** Engine-side state of every request the scheduler holds. */
  private readonly requests = new Map<string, RequestState>();
  /** Step counter when an abort for a live or pending request arrived. */
  private readonly abortArrivedAtStep = new Map<string, number>();
  /** When each `add` arrived (performance.now() ms), until its admission: the queue time reported in `admitted.queueMs`. */
  private readonly addArrivedAt = new Map<string, number>();
  /** Resolves the idle wait when a command arrives. */
  private wake: (() => void) | null = null;
  /** Set by stop(); the loop exits at the next boundary. */
  private stopping = false;
  /**
   * The last step's message while it waits to be sent during the next step's decode (device backends only, and
   * only while more steps follow); every other message sends it first, so messages keep their order.
   */
  private deferred: EngineMessage | null = null;
  /** Whether the current step's decode already gave the event loop its turn (alongside the device's work). */
  private turned = false;
  /** Steps that decoded a batch. */
  steps = 0;
  /** Prompt-lookup draft tokens verified since start, and those accepted (the step message's cumulative counters). */
  readonly drafts = { proposed: 0, accepted: 0 };
  /** Decodes and samples each step's batch; keeps the step's decode and sample times. */
  private readonly executor: BatchExecutor;

  readonly scheduler: Scheduler;

  constructor(
    private readonly backend: ModelBackend,
    config: SchedulerConfig,
    private readonly emit: (msg: EngineMessage) => void,
    private readonly options: StepLoopOptions = {},
  ) {
    this.scheduler = new Scheduler(config);
    this.executor = new BatchExecutor(backend, this.requests);
  }

  /** Queue a command for the next step boundary. Never touches engine state. */
  submit(cmd: LoopCommand): void {
    if (cmd.type === "add" && !this.addArrivedAt.has(cmd.id)) this.addArrivedAt.set(cmd.id, performance.now());
    if (cmd.type === "abort") {
      // Remember when each abort arrived, to report how many steps it took to apply (the end-to-end invariant "an
      // abort is applied within 2 engine steps", docs/design-rules.md).
      for (const id of cmd.ids) {
        const known = this.requests.has(id) || this.inbox.some((c) => c.type === "add" && c.id === id);
        if (known && !this.abortArrivedAtStep.has(id)) this.abortArrivedAtStep.set(id, this.steps);
      }
    }
    this.inbox.push(cmd);
    this.wake?.();
  }

  /** Ask the loop to exit at the next step boundary. */
  stop(): void {
    this.stopping = true;
    this.wake?.();
  }

  /**
   * Run until stop(). A failing decode or sampler fails only its requests; an unexpected exception in the loop
   * itself rejects, and the engine process then exits so that the gateway restarts it (never a stuck loop).
   */
  async run(): Promise<void> {
    try {
      while (!this.stopping) {
        if (this.inbox.length === 0 && !this.scheduler.hasWork) {
          await new Promise<void>((resolve) => (this.wake = resolve));
          this.wake = null;
          continue;
        }
        await this.step();
        // Let I/O in (commands, pings) between steps: with Keel's addon a decode step's native calls all run on this
        // thread, so a busy loop would otherwise never leave the microtask queue and starve the command channel.
        // A step whose decode computed on a device had that turn alongside it.
        if (!this.turned) await nextTurn();
      }
    } finally {
      this.sendDeferred();
    }
  }

  /** One step: commands, schedule, execute, update, invariants, emit. Exposed for tests that step by hand. */
  async step(): Promise<void> {
    const stepStart = performance.now();
    this.executor.times = { decodeUs: 0, sampleUs: 0 };
    this.turned = false;
    const outputs = new StepOutputs();
    // 1. One snapshot of the commands, applied at this boundary.
    this.applyCommands(outputs);
    // 2. Schedule: admission and one batch.
    const plan = this.schedule(outputs);
    let batchTokens = 0;
    if (plan.items.length > 0) {
      // 3. Execute: decode and sample (a failing decode is retried, then bisected: only its culprit fails).
      const executed = await this.executor.run(plan.items, this.steps + 1, this.backend.overlapsDecode ? this.alongside : undefined);
      // 4. Update: commit what was decoded, record tokens and text, release the finished.
      batchTokens = this.update(plan, executed, outputs);
    }
    // 5. Contain a violated scheduler invariant: report it, fail only the implicated requests; the loop goes on.
    const violations = this.scheduler.checkInvariants();
    if (violations.length > 0) {
      this.options.onInvariantViolation?.(violations);
      this.finish(this.scheduler.repairInvariants(), outputs);
    }
    // 6. Exactly one output message for the step (the last step's goes first, if no decode sent it).
    this.sendDeferred();
    if (outputs.byId.size > 0 || batchTokens > 0) this.emitStep(outputs, batchTokens, stepStart);
  }

  /** Host work while a decode computes on the device: the last step's message, then the event loop's turn. */
  private readonly alongside = async (): Promise<void> => {
    this.sendDeferred();
    await nextTurn();
    this.turned = true;
  };

  /** Send a message, after the deferred step message (order kept). */
  private send(msg: EngineMessage): void {
    this.sendDeferred();
    this.emit(msg);
  }

  /** Send the deferred step message, if one waits. */
  private sendDeferred(): void {
    const msg = this.deferred;
    this.deferred = null;
    if (msg) this.emit(msg);
  }

  /** Apply the snapshot of commands: adds before aborts, so an abort that raced its own add is never lost. */
  private applyCommands(outputs: StepOutputs): void {
    const snapshot = this.inbox;
    this.inbox = [];
    const abortIds: string[] = [];
    for (const cmd of snapshot) {
      if (cmd.type === "add") this.applyAdd(cmd);
      else if (cmd.type === "tokenize") this.send(this.tokenize(cmd));
      else abortIds.push(...cmd.ids);
    }
    // Aborts free their slots at once (no decode is in flight here).
    this.finish(this.scheduler.abort(abortIds), outputs);
  }

  /** Admit and plan one batch; report admissions; trim reused prefix-cache slots before decoding into them. */
  private schedule(outputs: StepOutputs): StepPlan {
    const plan = this.scheduler.schedule();
    // Queue time ends here, at admission — before the prefill runs (the step output arrives only after it).
    const admittedAt = performance.now();
    for (const a of plan.admitted) {
      const arrived = this.addArrivedAt.get(a.id);
      this.addArrivedAt.delete(a.id);
      outputs.of(a.id).admitted = { promptTokens: a.promptTokens, cachedTokens: a.cachedTokens, ...(arrived !== undefined ? { queueMs: Math.round((admittedAt - arrived) * 1000) / 1000 } : {}) };
    }
    for (const op of plan.kvOps) {
      const ok = this.backend.trimSequence ? this.backend.trimSequence(op.slot, op.keep) : (this.backend.clearSequence(op.slot), op.keep === 0);
      if (ok) continue;
      // The slot could not keep its prefix (it was cleared): fail only the request that was placed there.
      const victim = plan.items.filter((it) => it.slot === op.slot);
      plan.items = plan.items.filter((it) => it.slot !== op.slot);
      this.finish(this.scheduler.failStep({ ...plan, items: victim }, { code: "engine_error", message: "the prefix cache slot could not be trimmed" }), outputs);
    }
    return plan;
  }

  /**
   * Fail what could not be executed; commit what was decoded: decide who finished, then record tokens, log
   * probabilities and text (a stop token that ended its request is reported without text), then release the
   * finished. Returns the step's batch tokens (0 when nothing was decoded: the step does not count).
   */
  private update(plan: StepPlan, { sampled, decoded, failed }: Executed, outputs: StepOutputs): number {
    for (const f of failed) {
      this.finish(this.scheduler.failStep({ ...plan, items: [f.item] }, { code: "engine_error", message: f.message }), outputs);
    }
    if (decoded.length === 0) return 0;
    this.steps += 1;
    const outcome = this.scheduler.commit({ ...plan, items: decoded }, sampled, (t) => this.backend.isEndOfGeneration(t));
    this.settleDrafts(decoded, sampled, outcome);
    const stoppedBy = new Set(outcome.finished.filter((f) => f.reason === "stop").map((f) => f.id));
    for (const { id, token, logprobs } of sampled) {
      const st = this.requests.get(id);
      if (!st) continue;
      const o = outputs.of(id);
      o.tokens.push(token);
      // A second token in one step (speculation): from here on, where each token's text ends (protocol textEnds).
      if (o.tokens.length === 2) o.textEnds = [o.text.length];
      if (logprobs) (o.logprobs ??= []).push(logprobs);
      if (st.guide) {
        // The guide's phase moves between steps only: here, after this sequence's sample settled.
        st.guide.onToken(token);
        const dropped = st.guide.takeDropped();
        if (dropped !== undefined) o.guideDropped = dropped;
      }
      const silent = this.backend.isEndOfGeneration(token) || (stoppedBy.has(id) && st.sampling.isStopToken(token));
      if (!silent) o.text += st.decoder.decode(this.backend.bytesOf(token), { stream: true });
      if (o.tokens.length > 1) o.textEnds!.push(o.text.length);
    }
    this.finish(outcome, outputs);
    return decoded.reduce((a, it) => a + it.tokens.length, 0);
  }

  /**
   * After a step with drafted items: count proposed and accepted drafts, and drop from each drafted slot's KV the
   * drafts that were not accepted (positions past the emitted tokens), before anything decodes into it again. A slot
   * that cannot be trimmed fails its request (never stale KV under a live or cached sequence).
   */
  private settleDrafts(decoded: readonly BatchItem[], sampled: readonly { id: string }[], outcome: Outcome): void {
    const drafted = decoded.filter((it) => (it.drafts ?? 0) > 0);
    if (drafted.length === 0) return;
    const emitted = new Map<string, number>();
    for (const { id } of sampled) emitted.set(id, (emitted.get(id) ?? 0) + 1);
    for (const it of drafted) {
      const n = emitted.get(it.id) ?? 0;
      this.drafts.proposed += it.drafts!;
      this.drafts.accepted += Math.max(0, n - 1);
      if (n >= it.tokens.length || outcome.freedSlots.includes(it.slot)) continue;
      if (this.backend.trimSequence?.(it.slot, it.pos + n)) continue;
      const failed = this.scheduler.failStep({ kvOps: [], items: [it], admitted: [], totalTokens: 0 }, { code: "engine_error", message: "rejected draft tokens could not be removed from the KV cache" });
      outcome.finished.push(...failed.finished);
      outcome.freedSlots.push(...failed.freedSlots);
    }
  }

  /** The step message: every output, the scheduler's gauges, and the step's times. */
  private emitStep(outputs: StepOutputs, batchTokens: number, stepStart: number): void {
    const times = this.executor.times;
    const msg: EngineMessage = {
      v: PROTOCOL_VERSION,
      type: "step",
      step: this.steps,
      batchTokens,
      outputs: [...outputs.byId.values()],
      stats: {
        waiting: this.scheduler.queuedCount,
        running: this.scheduler.runningCount,
        activeSequences: this.scheduler.activeSlots,
        cachedSequences: this.scheduler.cachedSlots,
        prefixCacheHitTokens: this.scheduler.prefixHitTokens,
        kvTokensInUse: this.scheduler.kvTokensInUse,
        ...(this.drafts.proposed > 0 ? { draftTokens: this.drafts.proposed, acceptedDraftTokens: this.drafts.accepted } : {}),
        phaseUs: { decode: Math.round(times.decodeUs), sample: Math.round(times.sampleUs), step: Math.round((performance.now() - stepStart) * 1000) },
      },
    };
    // Deferred into the next step's decode when one follows at once on a device backend; else sent now. A step that
    // admitted or finished a request is sent now: a first token (it comes with the admission when the prompt fits
    // one step) or an end is not held behind the next step's launch.
    const defer = this.backend.overlapsDecode === true && this.scheduler.hasWork && !this.stopping && [...outputs.byId.values()].every((o) => !o.admitted && !o.finish);
    if (defer) this.deferred = msg;
    else this.send(msg);
  }

  /** Number of requests the loop holds (for tests). */
  get liveRequests(): number {
    return this.requests.size;
  }

  /**
   * Answer a `tokenize` question (docs/protocol.md §3.5) at the step boundary, like every other call into the model:
   * nothing touches the backend while a decode is in flight. Without `addSpecialTokens` a leading BOS the tokenizer
   * adds is dropped.
   */
  private tokenize(m: TokenizeMessage): TokenizedMessage {
    try {
      const tokens = this.backend.tokenize(m.text);
      const bos = this.backend.bosToken ?? null;
      if (!m.addSpecialTokens && bos !== null && tokens[0] === bos) tokens.shift();
      return { v: PROTOCOL_VERSION, type: "tokenized", id: m.id, tokens };
    } catch (err) {
      return { v: PROTOCOL_VERSION, type: "tokenized", id: m.id, error: (err as Error)?.message ?? String(err) };
    }
  }

  /** Make an add live (admission.ts), or refuse it with a `request_error`. */
  private applyAdd(cmd: AddMessage): void {
    const refuse = (code: EngineErrorCode, message: string, param?: string): void => {
      this.abortArrivedAtStep.delete(cmd.id);
      if (!this.requests.has(cmd.id)) this.addArrivedAt.delete(cmd.id);
      this.send({ v: PROTOCOL_VERSION, type: "request_error", id: cmd.id, code, message, ...(param ? { param } : {}) });
    };
    if (this.requests.has(cmd.id)) return refuse("duplicate_id", `request id ${cmd.id} is already live`);
    const admitted = admitAdd(cmd, { backend: this.backend, scheduler: this.scheduler, maxTopLogprobs: this.maxTopLogprobs, grammars: this.grammars, promptLookup: this.options.promptLookup ?? null });
    if (isRefused(admitted)) return refuse(admitted.code, admitted.message, admitted.param);
    this.requests.set(cmd.id, admitted);
  }

  /** Largest `params.logprobs` served: {@link MAX_TOP_LOGPROBS} when the backend has log probabilities, else -1. */
  get maxTopLogprobs(): number {
    return this.backend.logprobs ? MAX_TOP_LOGPROBS : -1;
  }

  /** True when the backend applies guides (capabilities.grammars). */
  get grammars(): boolean {
    return grammarSupport(this.backend) !== null;
  }

  /** Apply an outcome: clear freed slots, dispose samplers, record terminal events. */
  private finish(outcome: Outcome, outputs: StepOutputs): void {
    for (const slot of outcome.freedSlots) this.backend.clearSequence(slot);
    for (const f of outcome.finished) {
      const st = this.requests.get(f.id);
      this.requests.delete(f.id);
      const o = outputs.of(f.id);
      if (st) {
        if (f.reason === "stop" || f.reason === "length") o.text += st.decoder.decode();
        st.sampler.dispose();
      }
      const arrived = this.abortArrivedAtStep.get(f.id);
      this.abortArrivedAtStep.delete(f.id);
      this.addArrivedAt.delete(f.id);
      o.finish = {
        reason: f.reason,
        promptTokens: f.promptTokens,
        completionTokens: f.completionTokens,
        ...(f.reason === "abort" && arrived !== undefined ? { stepsAfterAbort: this.steps - arrived } : {}),
        ...(f.error ? { error: f.error } : {}),
      };
    }
  }
}
