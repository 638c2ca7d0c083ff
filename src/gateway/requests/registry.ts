/**
 * The request registry: one entry per request the gateway has handed to the engine, from `add` until the engine's
 * terminal event. It records what is needed to resume a generation (prompt token ids, generated token ids,
 * sampling parameters and seed), drives each request's {@link Lifecycle}, and routes engine outputs to the HTTP
 * handler's sink. Outputs for ids it does not know are dropped silently (docs/design-rules.md, rule 5).
 */
import type { AddMessage, PositionLogprobs, RequestErrorMessage, SamplingParams, StepMessage } from "../../protocol/messages.js";
import { PROTOCOL_VERSION } from "../../protocol/messages.js";
import * as lc from "./lifecycle.js";
import { SuspectTests, type ExitDecision } from "../supervision/recovery.js";
import { engineErrorToHttp, engineFault, SHUTTING_DOWN_MESSAGE, shuttingDown, type KeelHttpError } from "../http/errors.js";
/** Token counts of a request (tokens). */
export interface Usage {
  promptTokens: number;
  completionTokens: number;
}

/** Where the registry delivers a request's events; implemented by the chat route. */
export interface RequestSink {
  /** The engine admitted the request (its prefill starts). */
  onAdmitted(): void;
  /**
   * New tokens and the text they completed (text may be "" while a character is incomplete), with their log
   * probabilities when the request asked for them.
   */
  onOutput(tokens: number[], text: string, logprobs?: PositionLogprobs[]): void;
  /** The request ended. Not called for a request the gateway cancelled itself. */
  onFinish(reason: lc.FinishReason, usage: Usage, error?: { code: string; message: string; httpError?: KeelHttpError }): void;
  /**
   * A request the gateway cancelled was released (the engine confirmed, or no engine held it), with the phase it
   * had reached — known only now when the abort arrived during the step that admitted it.
   */
  onReleased?(phase: lc.Phase | null): void;
  /**
   * The engine stopped constraining this request (`RequestOutput.guideDropped`, once): it goes on unconstrained.
   * Delivered before the same step's output.
   */
  onGuideDropped?(reason: string): void;
}

/** Registry-side record of one request. */
interface Entry {
  readonly id: string;
  /** Current lifecycle state. */
  lifecycle: lc.Lifecycle;
  readonly sink: RequestSink;
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

/** Events the registry reports for metrics and logs. */
export interface RegistryObserver {
  onCancel?(id: string, phase: lc.Phase, cause: lc.CancelCause): void;
  onFinished?(
    id: string,
    reason: lc.FinishReason,
    usage: Usage,
    info: { phase: lc.Phase | null; error?: string; errorCode?: string; abortLatencySteps?: number; e2eMs: number },
  ): void;
  /** First admission to a sequence: queue time (ms) and prompt tokens reused from the prefix cache. */
  onAdmitted?(id: string, promptTokens: number, info: { queueMs: number; cachedTokens: number }): void;
  /** First generated token: time to first token from acceptance (ms). */
  onFirstToken?(id: string, ttftMs: number): void;
  /** Later tokens: how many, and the mean inter-token latency over them (ms). */
  onTokens?(id: string, count: number, itlMs: number): void;
  /** The request was handed to the engine's queue. */
  onQueued?(id: string): void;
  /** The engine refused the request as invalid (e.g. context length); it is not counted as finished. */
  onRefused?(id: string, code: string): void;
  onInternalError?(id: string, message: string): void;
  /** A request was resubmitted to a restarted engine as a continuation. */
  onResumed?(id: string, generatedTokens: number, deaths: number): void;
  /** A request was isolated as the one whose presence kills the engine. */
  onCulprit?(id: string, deaths: number): void;
}

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
  /** Operations in progress (a sink may call back into the table); decisions wait until the outermost one ends. */
  private depth = 0;

  constructor(
    private readonly send: (msg: AddMessage | { v: number; type: "abort"; ids: string[] }) => boolean,
    private readonly observer: RegistryObserver = {},
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

  /** Hand a request to the engine. Returns false when no engine is connected (nothing is recorded then). */
  submit(id: string, prompt: AddMessage["prompt"], params: SamplingParams, sink: RequestSink): boolean {
    if (this.live.has(id)) throw new Error(`request id ${id} is already live`);
    const ok = this.send({ v: PROTOCOL_VERSION, type: "add", id, prompt, params });
    if (!ok) return false;
    this.live.set(id, {
      id,
      lifecycle: lc.initial,
      sink,
      promptTokens: [],
      generated: [],
      params,
      acceptedAt: Date.now(),
      cancelledAtStep: null,
      prompt,
      admittedAt: null,
      lastTokenAt: null,
    });
    this.observer.onQueued?.(id);
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
      this.observer.onCancel?.(id, phase, cause);
      if (next.state === "finished") {
        // No engine holds it (recovering): released at once; the client gave up or is being ended, so no sink call.
        this.close(e, next, phase, { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { notifySink: false });
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
          // An exception while serving one request fails only that request (the engine releases it on abort).
          this.failLocally(e, err);
        }
      }
    });
  }

  /** Fail one request after a gateway-side exception: abort it in the engine and tell its sink, guarded. */
  private failLocally(e: Entry, err: unknown): void {
    const message = `internal error while serving the request: ${(err as Error)?.message ?? String(err)}`;
    this.observer.onInternalError?.(e.id, message);
    const sink = e.sink;
    const wasLive = e.lifecycle.state !== "cancelling" && e.lifecycle.state !== "finished";
    this.cancel(e.id, "internal_error");
    if (wasLive) {
      try {
        sink.onFinish("error", { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { code: "internal_error", message });
      } catch {
        /* the sink is broken; the abort already went out */
      }
    }
  }

  private applyOutput(e: Entry, o: StepMessage["outputs"][number]): void {
    const now = Date.now();
    if (o.admitted) {
      e.promptTokens = o.admitted.promptTokens;
      const next = lc.admit(e.lifecycle);
      if (next) {
        e.lifecycle = next;
        // Timings are reported once per request: a resumed request is admitted again but queued only once.
        if (e.admittedAt === null) {
          e.admittedAt = now;
          // Queue time ends at admission, not after the first prefill chunk: the engine's own measure when it sends
          // one (the add left the gateway at acceptance), else up to this step's output.
          const queueMs = o.admitted.queueMs ?? now - e.acceptedAt;
          this.observer.onAdmitted?.(e.id, e.promptTokens.length, { queueMs, cachedTokens: o.admitted.cachedTokens });
        }
        if (next.state !== "cancelling") e.sink.onAdmitted();
      }
    }
    if (o.guideDropped !== undefined && e.lifecycle.state !== "cancelling") e.sink.onGuideDropped?.(o.guideDropped);
    if (o.tokens.length > 0 || o.text.length > 0) {
      const before = e.generated.length;
      e.generated.push(...o.tokens);
      // Progress forgives earlier deaths (lifecycle.generated): a culprit dies again before making progress.
      const next = lc.generated(e.lifecycle, o.tokens.length);
      if (next) e.lifecycle = next;
      if (o.tokens.length > 0) {
        if (before === 0) this.observer.onFirstToken?.(e.id, now - e.acceptedAt);
        else if (e.lastTokenAt !== null) this.observer.onTokens?.(e.id, o.tokens.length, (now - e.lastTokenAt) / o.tokens.length);
        e.lastTokenAt = now;
      }
      if (e.lifecycle.state !== "cancelling") e.sink.onOutput(o.tokens, o.text, o.logprobs);
    }
    if (o.finish) {
      const usage = { promptTokens: e.promptTokens.length > 0 ? e.promptTokens.length : o.finish.promptTokens, completionTokens: e.generated.length };
      const error = o.finish.error ? { ...o.finish.error, httpError: engineErrorToHttp(o.finish.error.code, o.finish.error.message) } : undefined;
      this.end(e, o.finish.reason, usage, error, o.finish.stepsAfterAbort);
    }
  }

  /** The engine refused an add. Its code maps to HTTP once (errors.ts engineErrorToHttp). */
  handleRequestError(msg: RequestErrorMessage): void {
    return this.operation(() => {
      const e = this.live.get(msg.id);
      if (!e) return;
      const httpError = engineErrorToHttp(msg.code, msg.message);
      // A 4xx is a refusal of a bad request (e.g. context length), not a finished request; a 5xx is an engine failure.
      this.end(e, "error", { promptTokens: 0, completionTokens: 0 }, { code: httpError.code, message: msg.message, httpError }, undefined, httpError.status < 500);
    });
  }

  /**
   * End every live request now (shutdown): each client gets a 503-shaped error (a final stream event, or a 503),
   * and each request is aborted in the engine. Returns how many were ended.
   */
  endAll(message: string): number {
    return this.operation(() => {
      let n = 0;
      for (const e of [...this.live.values()]) {
        if (e.lifecycle.state === "cancelling" || e.lifecycle.state === "finished") continue;
        n += 1;
        try {
          e.sink.onFinish("error", { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { code: "shutting_down", message, httpError: shuttingDown(message) });
        } catch {
          /* a broken sink must not stop the shutdown */
        }
        this.cancel(e.id, "shutdown");
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
  applyEngineExit(d: ExitDecision): { id: string; prompt: AddMessage["prompt"]; params: SamplingParams }[] {
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
  handleEngineDeath(description: string, opts: { blame: boolean } = { blame: true }): { id: string; prompt: AddMessage["prompt"]; params: SamplingParams }[] {
    return this.operation(() => {
      const died: Entry[] = [];
      for (const e of [...this.live.values()].filter((x) => lc.heldByEngine(x.lifecycle))) {
        const phase = lc.phaseOf(e.lifecycle);
        const next = lc.engineDied(e.lifecycle, this.tests.charged(e.id, opts.blame));
        if (!next) continue;
        if (next.state === "finished") {
          // It was cancelling: the death released it.
          this.close(e, next, phase, { promptTokens: e.promptTokens.length, completionTokens: e.generated.length }, { notifySink: false });
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
      const culprits: { id: string; prompt: AddMessage["prompt"]; params: SamplingParams }[] = [];
      const lone = culprit === null ? undefined : this.live.get(culprit);
      if (lone) {
        culprits.push({ id: lone.id, prompt: lone.prompt, params: lone.params });
        this.observer.onCulprit?.(lone.id, lc.deathsOf(lone.lifecycle));
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
    this.observer.onResumed?.(e.id, e.generated.length, lc.deathsOf(next));
    return true;
  }

  /** End an entry with `reason` (the engine's terminal event, or the gateway's decision) and forget it. */
  private end(
    e: Entry,
    reason: lc.FinishReason,
    usage: Usage,
    error?: { code: string; message: string; httpError?: KeelHttpError },
    stepsAfterAbort?: number,
    refused = false,
  ): void {
    const phase = lc.phaseOf(e.lifecycle);
    const wasCancelling = e.lifecycle.state === "cancelling";
    const next = lc.finish(e.lifecycle, reason);
    if (!next) return;
    this.close(e, next, phase, usage, {
      notifySink: !wasCancelling,
      ...(error ? { error } : {}),
      ...(stepsAfterAbort !== undefined ? { stepsAfterAbort } : {}),
      refused,
    });
  }

  /**
   * Record a finished state for an entry and forget it: the sink (unless the gateway itself ended the request, e.g.
   * a cancel), then metrics and logs through the observer.
   */
  private close(
    e: Entry,
    next: lc.Lifecycle,
    phase: lc.Phase | null,
    usage: Usage,
    how: { notifySink?: boolean; error?: { code: string; message: string; httpError?: KeelHttpError }; stepsAfterAbort?: number; refused?: boolean },
  ): void {
    if (next.state !== "finished") return;
    const { error, stepsAfterAbort, refused = false, notifySink = true } = how;
    e.lifecycle = next;
    this.live.delete(e.id);
    // A suspect that ended is cleared; a test group that ended without killing the engine holds no culprit: the
    // next test is released once the current operation is over.
    if (this.tests.ended(e.id)) this.releaseNextTest = true;
    // Abort latency in engine steps: measured by the engine from the abort's arrival when it reports it, else
    // from the gateway's view of the step counter (which lags by the messages in flight).
    const latency = stepsAfterAbort !== undefined ? { abortLatencySteps: stepsAfterAbort } : e.cancelledAtStep === null ? {} : { abortLatencySteps: this.currentStep() - e.cancelledAtStep };
    // The client first, then metrics and logs; neither may stop the other or the caller (an engine exit, a step).
    try {
      // A request the gateway cancelled itself is told only that it was released (and in which phase).
      if (notifySink) e.sink.onFinish(next.reason, usage, error);
      else e.sink.onReleased?.(phase);
    } catch (err) {
      this.observer.onInternalError?.(e.id, `sink failed: ${(err as Error)?.message ?? String(err)}`);
    }
    try {
      if (refused) this.observer.onRefused?.(e.id, error?.code ?? "invalid_request");
      else this.observer.onFinished?.(e.id, next.reason, usage, { phase, e2eMs: Date.now() - e.acceptedAt, ...latency, ...(error ? { error: error.message, errorCode: error.code } : {}) });
    } catch {
      /* metrics/logging must never take a request or the gateway down */
    }
  }
}
