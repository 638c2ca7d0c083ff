/**
 * The request table: one entry per engine request the gateway has handed to the engine, from `add` until the
 * engine's terminal event. It records what is needed to resume a generation (prompt token ids, generated token ids,
 * sampling parameters and seed), drives each request's {@link Lifecycle} through its named transitions, and applies
 * recovery's decisions (supervision/recovery.ts). It reports what happened as {@link TableEvent}s, which the caller
 * drains after each operation ({@link RequestRegistry.drain}); it never calls a layer above it. Outputs for ids it
 * does not know are dropped silently (late events are ignored).
 */
import type { AddMessage, RequestErrorMessage, SamplingParams, StepMessage } from "../../protocol/messages.js";
import { LOGIT_BIAS_BAN, PROTOCOL_VERSION } from "../../protocol/messages.js";
import * as lc from "./lifecycle.js";
import type { RequestError, TableEvent, Usage } from "./events.js";
import { SuspectTests, type ExitDecision } from "../supervision/recovery.js";
import { engineErrorToHttp } from "../http/engine-errors.js";
import { engineFault, invalidValue, SHUTTING_DOWN_MESSAGE, shuttingDown, type KeelHttpError } from "../http/errors.js";

export type { Usage };

/** A request isolated as the engine's killer: what recovery's memory needs to refuse it at admission. */
export interface Culprit {
  id: string;
  prompt: AddMessage["prompt"];
  params: SamplingParams;
}

/** Table record of one engine request. */
interface Entry {
  readonly id: string;
  /** Current lifecycle state. */
  lifecycle: lc.Lifecycle;
  /** Prompt token ids, known once the engine admitted the request. */
  promptTokens: number[];
  /** Token ids generated so far. */
  readonly generated: number[];
  readonly params: SamplingParams;
  /** When the request was accepted (ms since epoch). */
  readonly acceptedAt: number;
  /** Engine step counter when the gateway cancelled it (for abort latency in steps), or null. */
  cancelledAtStep: number | null;
  /** The prompt as first submitted (rendered text), used to resubmit a request that was never admitted. */
  readonly prompt: AddMessage["prompt"];
  /** When the request was first admitted to a sequence (ms since epoch), or null. */
  admittedAt: number | null;
  /** When its latest token arrived (ms since epoch), or null. */
  lastTokenAt: number | null;
}

/** Tokens of progress after a resume that clear a request's death count (see lifecycle.generated). */
export const FORGIVE_AFTER_TOKENS = lc.FORGIVE_AFTER_TOKENS;

export class RequestRegistry {
  /** Live requests by id. */
  private readonly live = new Map<string, Entry>();
  /** Culprit isolation's test plan (supervision/recovery.ts decides; this table applies its decisions). */
  private readonly tests = new SuspectTests();
  /**
   * Set when a test group ended cleanly during the current operation: the next test is released once the operation
   * is over (never while the table is being updated).
   */
  private releaseNextTest = false;
  /** Operations in progress (one may run another); the next suspect test waits until the outermost one ends. */
  private depth = 0;
  /** Events of the operations since the last {@link drain}, in order. */
  private events: TableEvent[] = [];

  constructor(
    private readonly send: (msg: AddMessage | { v: number; type: "abort"; ids: string[] }) => boolean,
    /** The engine's step counter as last reported (0 when unknown). */
    private readonly currentStep: () => number = () => 0,
  ) {}

  /** Number of live requests per phase (cancelling requests count in the phase they were cancelled in). */
  counts(): { waiting: number; running: number } {
    let waiting = 0;
    let running = 0;
    for (const e of this.live.values()) {
      const p = lc.phaseOf(e.lifecycle);
      if (p === "queued") waiting += 1;
      else if (p !== null) running += 1;
    }
    return { waiting, running };
  }

  /** Live requests. */
  get size(): number {
    return this.live.size;
  }

  /** Phase of a live request, or null. */
  phase(id: string): lc.Phase | null {
    const e = this.live.get(id);
    return e ? lc.phaseOf(e.lifecycle) : null;
  }

  /** Prompt tokens of a live, admitted request (0 before admission or when unknown). */
  promptLength(id: string): number {
    return this.live.get(id)?.promptTokens.length ?? 0;
  }

  /** The events of every operation since the last call, in order (and forget them). */
  drain(): TableEvent[] {
    const out = this.events;
    this.events = [];
    return out;
  }

  /** Hand a request to the engine. Returns false when no engine is connected (nothing is recorded then). */
  submit(id: string, prompt: AddMessage["prompt"], params: SamplingParams): boolean {
    if (this.live.has(id)) throw new Error(`request id ${id} is already live`);
    const ok = this.send({ v: PROTOCOL_VERSION, type: "add", id, prompt, params });
    if (!ok) return false;
    this.live.set(id, {
      id,
      lifecycle: lc.initial,
      promptTokens: [],
      generated: [],
      params,
      acceptedAt: Date.now(),
      cancelledAtStep: null,
      prompt,
      admittedAt: null,
      lastTokenAt: null,
    });
    this.events.push({ type: "queued", id });
    return true;
  }

  /**
   * Cancel a live request: send one abort and keep the entry until the engine confirms. Idempotent; a request
   * that is already cancelling or finished is left alone.
   */
  cancel(id: string, cause: lc.CancelCause): void {
    return this.operation(() => {
      const e = this.live.get(id);
      if (!e) return;
      const phase = lc.phaseOf(e.lifecycle);
      const next = lc.cancel(e.lifecycle, cause);
      if (!next || phase === null) return;
      this.events.push({ type: "cancelled", id, phase, cause });
      if (next.state === "finished") {
        // No engine holds it (recovering): released at once; the client gave up or is being ended, so it is not told.
        this.close(e, next, phase, { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { released: true });
        return;
      }
      // An engine holds it: send one abort and wait for the engine's confirmation.
      e.lifecycle = next;
      e.cancelledAtStep = this.currentStep();
      this.send({ v: PROTOCOL_VERSION, type: "abort", ids: [id] });
    });
  }

  /** Apply one engine step output. */
  handleStep(msg: StepMessage): void {
    return this.operation(() => {
      for (const o of msg.outputs) {
        const e = this.live.get(o.id);
        if (!e) continue; // late output for a request we no longer know: ignore
        try {
          this.applyOutput(e, o);
        } catch (err) {
          // An exception while applying one request's output fails only that request (the engine releases it on abort).
          this.failLocally(e, err);
        }
      }
    });
  }

  /** Fail one request after a gateway-side exception: its client is told, and it is aborted in the engine. */
  private failLocally(e: Entry, err: unknown): void {
    const message = `internal error while serving the request: ${(err as Error)?.message ?? String(err)}`;
    this.events.push({ type: "internal_error", id: e.id, message });
    if (e.lifecycle.state !== "cancelling" && e.lifecycle.state !== "finished") this.endForClient(e, { code: "internal_error", message }, "internal_error");
  }

  /** The gateway ends a live request for its client (an error answer); its abort for `cause` is decided from it. */
  private endForClient(e: Entry, error: RequestError, cause: lc.CancelCause): void {
    this.events.push({ type: "ended", id: e.id, usage: { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, error, cause });
  }

  private applyOutput(e: Entry, o: StepMessage["outputs"][number]): void {
    const now = Date.now();
    if (o.admitted) {
      e.promptTokens = o.admitted.promptTokens;
      const next = lc.admit(e.lifecycle);
      if (next) {
        e.lifecycle = next;
        // Timings are reported once per request: a resumed request is admitted again but queued only once.
        let first: { queueMs: number; cachedTokens: number } | null = null;
        if (e.admittedAt === null) {
          e.admittedAt = now;
          // Queue time ends at admission, not after the first prefill chunk: the engine's own measure when it sends
          // one (the add left the gateway at acceptance), else up to this step's output.
          const queueMs = o.admitted.queueMs ?? now - e.acceptedAt;
          first = { queueMs, cachedTokens: o.admitted.cachedTokens };
        }
        this.events.push({ type: "admitted", id: e.id, promptTokens: e.promptTokens.length, first, live: next.state !== "cancelling" });
      }
    }
    // Delivered before the same step's output; a request being cancelled has no client to tell.
    if (o.guideDropped !== undefined && e.lifecycle.state !== "cancelling") {
      // The client's own bans left its guide no token: what follows would break the format it asked for, so the
      // request ends here with a 400 naming logit_bias (this step's tokens, sampled unconstrained, are not sent; the
      // engine's reason is in the guide_dropped line).
      const banned = e.params.logitBias?.some(([, bias]) => bias <= LOGIT_BIAS_BAN) === true;
      this.events.push({ type: "guide_dropped", id: e.id, reason: o.guideDropped, ends: banned });
      if (banned) {
        const message = `Invalid value for 'logit_bias': it bans every token the requested format (response_format, a guided tool call or a grammar) allows after ${e.generated.length} generated tokens.`;
        const error = { code: "invalid_value", message, httpError: invalidValue("logit_bias", message) };
        // The engine ended it in this same output (an end token sampled unconstrained): it holds nothing to abort,
        // so the request closes now; otherwise it is aborted and closes when the engine confirms.
        if (o.finish) this.end(e, "error", finishUsage(e, o.finish), error);
        else this.endForClient(e, error, "guide_unsatisfiable");
        return;
      }
    }
    if (o.tokens.length > 0 || o.text.length > 0) {
      const before = e.generated.length;
      e.generated.push(...o.tokens);
      // Progress forgives earlier deaths (lifecycle.generated): a culprit dies again before making progress.
      const next = lc.generated(e.lifecycle, o.tokens.length);
      if (next) e.lifecycle = next;
      if (o.tokens.length > 0) {
        if (before === 0) this.events.push({ type: "first_token", id: e.id, ttftMs: now - e.acceptedAt });
        else if (e.lastTokenAt !== null) this.events.push({ type: "tokens", id: e.id, count: o.tokens.length, itlMs: (now - e.lastTokenAt) / o.tokens.length });
        e.lastTokenAt = now;
      }
      if (e.lifecycle.state !== "cancelling") this.events.push({ type: "output", id: e.id, tokens: o.tokens, text: o.text, ...(o.logprobs ? { logprobs: o.logprobs } : {}), ...(o.textEnds ? { textEnds: o.textEnds } : {}) });
    }
    if (o.finish) {
      const usage = finishUsage(e, o.finish);
      const error = o.finish.error ? { ...o.finish.error, httpError: engineErrorToHttp(o.finish.error.code, o.finish.error.message) } : undefined;
      // A cancelled request the engine ended on its own was released before the abort reached it: 0 steps.
      const stepsAfterAbort = o.finish.stepsAfterAbort ?? (e.lifecycle.state === "cancelling" && o.finish.reason !== "abort" ? 0 : undefined);
      this.end(e, o.finish.reason, usage, error, stepsAfterAbort);
    }
  }

  /** The engine refused an add. Its code maps to HTTP once (engine-errors.ts engineErrorToHttp). */
  handleRequestError(msg: RequestErrorMessage): void {
    return this.operation(() => {
      const e = this.live.get(msg.id);
      if (!e) return;
      const httpError = engineErrorToHttp(msg.code, msg.message, msg.param);
      // A 4xx is a refusal of a bad request (e.g. context length), not a finished request; a 5xx is an engine failure.
      this.end(e, "error", { promptTokens: 0, completionTokens: 0 }, { code: httpError.code, message: msg.message, httpError }, undefined, httpError.status < 500);
    });
  }

  /**
   * End every live request now (shutdown): each client gets a 503-shaped error (a final stream event, or a 503),
   * and each request is to be aborted in the engine (`ended` events, applied by the caller). Returns how many.
   */
  endAll(message: string): number {
    return this.operation(() => {
      let n = 0;
      for (const e of [...this.live.values()]) {
        if (e.lifecycle.state === "cancelling" || e.lifecycle.state === "finished") continue;
        n += 1;
        this.endForClient(e, { code: "shutting_down", message, httpError: shuttingDown(message) }, "shutdown");
      }
      return n;
    });
  }

  /**
   * No engine will serve the live requests (the server is shutting down, or the engine keeps failing to start):
   * every one ends with an error — `httpError` is what its client sees (the code it is counted under follows it).
   */
  handleEngineExit(description: string, httpError: KeelHttpError = engineFault(description)): void {
    return this.operation(() => {
      for (const e of [...this.live.values()]) {
        this.end(e, "error", { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { code: httpError.code, message: description, httpError });
      }
    });
  }

  /**
   * Apply recovery's decision about an engine exit (supervision/recovery.ts exitDecision): the shutdown's exit ends
   * everything with `shutting_down`; an engine that cannot start fails every waiting request (`engine_fault`); a
   * restart keeps the requests for their resumption. Returns the requests isolated as culprits.
   */
  applyEngineExit(d: ExitDecision): Culprit[] {
    switch (d.kind) {
      case "shutdown":
        this.handleEngineExit(SHUTTING_DOWN_MESSAGE, shuttingDown());
        return [];
      case "unrecoverable":
        this.handleEngineExit(d.description);
        return [];
      case "restart":
        return this.handleEngineDeath(d.description, { blame: d.verdict.blame });
    }
  }

  /**
   * The engine process died and is being restarted. Requests it held move to `recovering` (cancelling ones are
   * released by the death). Culprit isolation (supervision/recovery.ts, SuspectTests): blame must be earned — only a
   * death the requests could have caused (`opts.blame`, recovery's death verdict) counts one more death for them.
   * Once deaths repeat, everyone in flight is a `suspect` and is tested in groups; a request that was alone in flight
   * when the engine died, after repeated deaths, is failed with `engine_fault`; everyone else is resumed (suspects
   * when their test comes). Returns the requests failed as culprits.
   */
  handleEngineDeath(description: string, opts: { blame: boolean } = { blame: true }): Culprit[] {
    return this.operation(() => {
      const died: Entry[] = [];
      for (const e of [...this.live.values()].filter((x) => lc.heldByEngine(x.lifecycle))) {
        const phase = lc.phaseOf(e.lifecycle);
        const next = lc.engineDied(e.lifecycle, this.tests.charged(e.id, opts.blame));
        if (!next) continue;
        if (next.state === "finished") {
          // It was cancelling: the death released it.
          this.close(e, next, phase, { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { released: true });
          continue;
        }
        e.lifecycle = next;
        died.push(e);
      }
      const { culprit } = this.tests.afterDeath(
        died.map((e) => ({ id: e.id, deaths: lc.deathsOf(e.lifecycle) })),
        opts.blame,
      );
      // Suspects wait for a test of their own (lifecycle `suspect`); everyone else is resumed at the next ready.
      for (const e of died) {
        if (e.id === culprit || !this.tests.isSuspect(e.id)) continue;
        const next = lc.suspect(e.lifecycle);
        if (next) e.lifecycle = next;
      }
      const culprits: Culprit[] = [];
      const lone = culprit === null ? undefined : this.live.get(culprit);
      if (lone) {
        culprits.push({ id: lone.id, prompt: lone.prompt, params: lone.params });
        this.events.push({ type: "culprit", id: lone.id, deaths: lc.deathsOf(lone.lifecycle) });
        this.failCulprit(lone, description);
      }
      return culprits;
    });
  }

  /** Fail a request isolated as the engine's killer with an OpenAI-shaped `engine_fault` error. */
  private failCulprit(e: Entry, description: string): void {
    const phase = lc.phaseOf(e.lifecycle);
    const next = lc.isolate(e.lifecycle);
    if (!next) return;
    const message = `this request crashed the engine ${lc.deathsOf(e.lifecycle)} times (${description}); it was isolated and failed so that other requests could continue`;
    this.close(e, next, phase, { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, {
      error: { code: "engine_fault", message, httpError: engineFault(message) },
    });
  }

  /**
   * A (re)started engine is ready: resubmit waiting requests as continuations (prompt token ids + generated token
   * ids; the engine prefills both and emits only new text). Everyone who is not a suspect goes at once; suspects go
   * one test group at a time, as recovery's plan says.
   */
  resumeRecovering(): void {
    this.releaseNextTest = false;
    for (const e of [...this.live.values()]) {
      if (e.lifecycle.state === "recovering") this.resubmit(e);
    }
    for (const id of this.tests.nextTest((x) => this.live.get(x)?.lifecycle.state === "suspect")) {
      if (this.resubmit(this.live.get(id)!)) this.tests.testing(id);
    }
  }

  /** Run one operation on the table; the next suspect test, if one ended meanwhile, is released after the outermost. */
  private operation<T>(run: () => T): T {
    this.depth += 1;
    try {
      return run();
    } finally {
      this.depth -= 1;
      if (this.depth === 0 && this.releaseNextTest) this.resumeRecovering();
    }
  }

  /** Requests waiting to be resubmitted after an engine death. */
  get recoveringCount(): number {
    let n = 0;
    for (const e of this.live.values()) if (lc.awaitingResubmit(e.lifecycle)) n += 1;
    return n;
  }

  private resubmit(e: Entry): boolean {
    const next = lc.resubmit(e.lifecycle);
    if (!next) return false;
    const prompt = e.promptTokens.length > 0 ? { tokens: e.promptTokens } : e.prompt;
    const ok = this.send({ v: PROTOCOL_VERSION, type: "add", id: e.id, prompt, params: e.params, ...(e.generated.length > 0 ? { generated: [...e.generated] } : {}) });
    if (!ok) return false;
    e.lifecycle = next;
    this.events.push({ type: "resumed", id: e.id, generatedTokens: e.generated.length, deaths: lc.deathsOf(next) });
    return true;
  }

  /** End an entry with `reason` (the engine's terminal event, or the gateway's decision) and forget it. */
  private end(
    e: Entry,
    reason: lc.FinishReason,
    usage: Usage,
    error?: RequestError,
    stepsAfterAbort?: number,
    refused = false,
  ): void {
    const phase = lc.phaseOf(e.lifecycle);
    const wasCancelling = e.lifecycle.state === "cancelling";
    const next = lc.finish(e.lifecycle, reason);
    if (!next) return;
    this.close(e, next, phase, usage, {
      released: wasCancelling,
      ...(error ? { error } : {}),
      ...(stepsAfterAbort !== undefined ? { stepsAfterAbort } : {}),
      refused,
    });
  }

  /**
   * Record a finished state for an entry and forget it, reporting how it ended (`released`: the gateway had
   * cancelled it itself, so its client is not told).
   */
  private close(
    e: Entry,
    next: lc.Lifecycle,
    phase: lc.Phase | null,
    usage: Usage,
    how: { released?: boolean; error?: RequestError; stepsAfterAbort?: number; refused?: boolean },
  ): void {
    if (next.state !== "finished") return;
    const { error, stepsAfterAbort, refused = false, released = false } = how;
    e.lifecycle = next;
    this.live.delete(e.id);
    // A suspect that ended is cleared; a test group that ended without killing the engine holds no culprit: the
    // next test is released once the current operation is over.
    if (this.tests.ended(e.id)) this.releaseNextTest = true;
    // Abort latency in engine steps: measured by the engine from the abort's arrival when it reports it (0 when it
    // ended the request before the abort arrived), else from the gateway's view of the step counter (which lags by
    // the messages in flight).
    const latency = stepsAfterAbort !== undefined ? { abortLatencySteps: stepsAfterAbort } : e.cancelledAtStep === null ? {} : { abortLatencySteps: this.currentStep() - e.cancelledAtStep };
    this.events.push({ type: "finished", id: e.id, reason: next.reason, usage, phase, e2eMs: Date.now() - e.acceptedAt, ...latency, ...(error ? { error } : {}), released, refused });
  }
}

/** Usage of a request the engine finished: the prompt as admitted (else as the engine counted it) and every token. */
function finishUsage(e: Entry, finish: NonNullable<StepMessage["outputs"][number]["finish"]>): Usage {
  return { promptTokens: e.promptTokens.length > 0 ? e.promptTokens.length : finish.promptTokens, completionTokens: e.generated.length };
}
