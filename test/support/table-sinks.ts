/**
 * The request table (src/gateway/requests/registry.ts) as its unit tests read it: after every operation the table's
 * events are drained and handed to a per-request sink (what the request's client would be told) and an observer
 * (what metrics and logs read), in the order the table reported them. A test of the table asserts on these logs.
 */
import type { AddMessage, PositionLogprobs, RequestErrorMessage, SamplingParams, StepMessage } from "../../src/protocol/messages.js";
import type { KeelHttpError } from "../../src/gateway/http/errors.js";
import type { RequestError, TableEvent, Usage } from "../../src/gateway/requests/events.js";
import type { CancelCause, FinishReason, Phase } from "../../src/gateway/requests/lifecycle.js";
import { RequestRegistry, type Culprit } from "../../src/gateway/requests/registry.js";
import type { ExitDecision } from "../../src/gateway/supervision/recovery.js";

/** What one request's client is told. */
export interface RequestSink {
  onAdmitted(): void;
  onOutput(tokens: number[], text: string, logprobs?: PositionLogprobs[]): void;
  onFinish(reason: FinishReason, usage: Usage, error?: { code: string; message: string; httpError?: KeelHttpError }): void;
  onReleased?(phase: Phase | null): void;
  onGuideDropped?(reason: string): void;
}

/** What metrics and logs read, one hook per event. */
export interface TableObserver {
  onCancel?(id: string, phase: Phase, cause: CancelCause): void;
  onFinished?(id: string, reason: FinishReason, usage: Usage, info: { phase: Phase | null; error?: string; errorCode?: string; abortLatencySteps?: number; e2eMs: number }): void;
  onAdmitted?(id: string, promptTokens: number, info: { queueMs: number; cachedTokens: number }): void;
  onFirstToken?(id: string, ttftMs: number): void;
  onTokens?(id: string, count: number, itlMs: number): void;
  onQueued?(id: string): void;
  onRefused?(id: string, code: string): void;
  onInternalError?(id: string, message: string): void;
  onResumed?(id: string, generatedTokens: number, deaths: number): void;
  onCulprit?(id: string, deaths: number): void;
}

export class SinkTable {
  readonly table: RequestRegistry;
  private readonly sinks = new Map<string, RequestSink>();

  constructor(
    send: (msg: AddMessage | { v: number; type: "abort"; ids: string[] }) => boolean,
    private readonly observer: TableObserver = {},
    currentStep: () => number = () => 0,
  ) {
    this.table = new RequestRegistry(send, currentStep);
  }

  submit(id: string, prompt: AddMessage["prompt"], params: SamplingParams, sink: RequestSink): boolean {
    const ok = this.table.submit(id, prompt, params);
    if (ok) this.sinks.set(id, sink);
    this.flush();
    return ok;
  }
  cancel(id: string, cause: CancelCause): void {
    this.table.cancel(id, cause);
    this.flush();
  }
  handleStep(msg: StepMessage): void {
    this.table.handleStep(msg);
    this.flush();
  }
  handleRequestError(msg: RequestErrorMessage): void {
    this.table.handleRequestError(msg);
    this.flush();
  }
  endAll(message: string): number {
    const n = this.table.endAll(message);
    this.flush();
    return n;
  }
  handleEngineExit(description: string, httpError?: KeelHttpError): void {
    this.table.handleEngineExit(description, ...(httpError ? [httpError] : []));
    this.flush();
  }
  handleEngineDeath(description: string, opts?: { blame: boolean }): Culprit[] {
    const culprits = this.table.handleEngineDeath(description, opts);
    this.flush();
    return culprits;
  }
  applyEngineExit(d: ExitDecision): Culprit[] {
    const culprits = this.table.applyEngineExit(d);
    this.flush();
    return culprits;
  }
  resumeRecovering(): void {
    this.table.resumeRecovering();
    this.flush();
  }
  get size(): number {
    return this.table.size;
  }
  get recoveringCount(): number {
    return this.table.recoveringCount;
  }
  phase(id: string): Phase | null {
    return this.table.phase(id);
  }
  counts(): { waiting: number; running: number } {
    return this.table.counts();
  }
  promptLength(id: string): number {
    return this.table.promptLength(id);
  }

  /**
   * Hand every event the table reported to its request's sink and to the observer; then, as the output processor
   * does, abort what the table ended for its client (after the events), and hand on what that reported.
   */
  private flush(): void {
    for (let events = this.table.drain(); events.length > 0; events = this.table.drain()) {
      const ended: { id: string; cause: CancelCause }[] = [];
      for (const ev of events) {
        if (ev.type === "ended") ended.push({ id: ev.id, cause: ev.cause });
        this.dispatch(ev);
      }
      for (const e of ended) this.table.cancel(e.id, e.cause);
    }
  }

  private dispatch(ev: TableEvent): void {
    const sink = this.sinks.get(ev.id);
    const o = this.observer;
    switch (ev.type) {
      case "queued":
        return o.onQueued?.(ev.id);
      case "admitted":
        if (ev.first) o.onAdmitted?.(ev.id, ev.promptTokens, ev.first);
        if (ev.live) sink?.onAdmitted();
        return;
      case "guide_dropped":
        return sink?.onGuideDropped?.(ev.reason);
      case "output":
        return sink?.onOutput(ev.tokens, ev.text, ev.logprobs);
      case "first_token":
        return o.onFirstToken?.(ev.id, ev.ttftMs);
      case "tokens":
        return o.onTokens?.(ev.id, ev.count, ev.itlMs);
      case "cancelled":
        return o.onCancel?.(ev.id, ev.phase, ev.cause);
      case "ended":
        return sink?.onFinish("error", ev.usage, ev.error);
      case "finished": {
        this.sinks.delete(ev.id);
        if (ev.released) sink?.onReleased?.(ev.phase);
        else sink?.onFinish(ev.reason, ev.usage, ev.error);
        const error: RequestError | undefined = ev.error;
        if (ev.refused) return o.onRefused?.(ev.id, error?.code ?? "invalid_request");
        const latency = ev.abortLatencySteps !== undefined ? { abortLatencySteps: ev.abortLatencySteps } : {};
        return o.onFinished?.(ev.id, ev.reason, ev.usage, { phase: ev.phase, e2eMs: ev.e2eMs, ...latency, ...(error ? { error: error.message, errorCode: error.code } : {}) });
      }
      case "resumed":
        return o.onResumed?.(ev.id, ev.generatedTokens, ev.deaths);
      case "culprit":
        return o.onCulprit?.(ev.id, ev.deaths);
      case "internal_error":
        return o.onInternalError?.(ev.id, ev.message);
    }
  }
}
