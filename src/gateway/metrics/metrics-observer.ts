/**
 * The one place where metrics and request logs follow the engine: the consumer of every request event (queue,
 * admission, tokens, a dropped guide, finish, refusal, cancel, resume, culprit, internal error, a client that left)
 * and the engine's step outputs (steps, prefix-cache hits, sequence gauges).
 */
import type { Logger } from "pino";
import type { StepMessage } from "../../protocol/messages.js";
import type { Metrics } from "./metrics.js";
import type { ObservedEvent } from "../requests/events.js";

/** Tokens processed by a model's engines, cumulative since the gateway started (see {@link StepObserver.processed}). */
export interface ProcessedTokens {
  /** Prompt tokens prefilled: admitted prompts less what the prefix cache supplied. */
  promptTokens: number;
  /** Prompt tokens reused from the prefix cache at admission. */
  cachedTokens: number;
  /** Tokens generated. */
  generatedTokens: number;
}

/**
 * The fields of one engine step's TRACE line (`--log_level TRACE`): what the step held and what it took, to lay a
 * request's first token against the steps around it (a time-to-first-token investigation).
 */
export function stepTrace(msg: StepMessage): Record<string, unknown> {
  let admitted = 0;
  let prefilled = 0;
  let sampled = 0;
  let finished = 0;
  for (const o of msg.outputs) {
    if (o.admitted) {
      admitted++;
      prefilled += o.admitted.promptTokens.length - Math.min(o.admitted.cachedTokens, o.admitted.promptTokens.length);
    }
    if (o.tokens.length > 0) sampled++;
    if (o.finish) finished++;
  }
  const ph = msg.stats.phaseUs;
  return {
    event: "engine_step",
    step: msg.step,
    batchTokens: msg.batchTokens,
    admitted,
    prefilledTokens: prefilled,
    sampledRequests: sampled,
    finished,
    waiting: msg.stats.waiting,
    running: msg.stats.running,
    ...(ph ? { decodeUs: ph.decode, sampleUs: ph.sample, stepUs: ph.step } : {}),
  };
}

/** Counters derived from the current engine's cumulative step stats. */
export class StepObserver {
  /** Step counter of the current engine as last reported (0 before its first step). */
  lastStep = 0;
  /** When the last step output arrived (ms since epoch). */
  lastStepAt = Date.now();
  /** Cumulative prefix-cache hit tokens of the current engine as last reported. */
  private lastPrefixHits = 0;
  /** Engine sequences owned by live requests, as last reported. */
  activeSequences = 0;
  /** Idle engine sequences holding reusable KV, as last reported. */
  cachedSequences = 0;
  /** KV cells held by live requests, as last reported (0 when the engine does not report it). */
  kvTokensInUse = 0;
  /** Cumulative preemptions of the current engine as last reported (0 before its first report). */
  private lastPreemptions = 0;
  /** Cumulative draft / accepted draft tokens of the current engine as last reported. */
  private lastDrafts = { proposed: 0, accepted: 0 };
  /** Linear-attention blocks (in use, pool) as last reported; undefined for engines and models without them. */
  linearAttentionBlocks: { inUse: number; total: number } | undefined = undefined;
  /**
   * Tokens this model's engines processed as the step outputs showed them, since the gateway started (kept across
   * engine restarts; the periodic engine line takes their differences): prompt tokens of admissions less those reused
   * from the prefix cache, prompt tokens reused, and tokens generated.
   */
  readonly processed: ProcessedTokens = { promptTokens: 0, cachedTokens: 0, generatedTokens: 0 };

  /** @param modelName the served model whose engine this observes (labels the per-model counters) */
  constructor(
    private readonly metrics: Metrics,
    private readonly modelName = "",
  ) {}

  /** A new engine process: its counters start from 0. */
  engineStarted(): void {
    this.lastStep = 0;
    this.lastPrefixHits = 0;
    this.lastPreemptions = 0;
    this.lastDrafts = { proposed: 0, accepted: 0 };
    this.engineGone();
  }

  /** The engine process exited: it holds no sequence any more. */
  engineGone(): void {
    this.activeSequences = 0;
    this.cachedSequences = 0;
    this.kvTokensInUse = 0;
    if (this.linearAttentionBlocks) this.linearAttentionBlocks = { inUse: 0, total: this.linearAttentionBlocks.total };
  }

  /** Apply one step output's counters (the engine reports cumulative values; the metrics count increments). */
  observe(msg: StepMessage): void {
    this.lastStepAt = Date.now();
    for (const o of msg.outputs) {
      this.processed.generatedTokens += o.tokens.length;
      if (!o.admitted) continue;
      const cached = Math.min(o.admitted.cachedTokens, o.admitted.promptTokens.length);
      this.processed.promptTokens += o.admitted.promptTokens.length - cached;
      this.processed.cachedTokens += cached;
    }
    if (msg.step > this.lastStep) {
      this.metrics.engineSteps.inc(msg.step - this.lastStep);
      this.lastStep = msg.step;
      const scheduled = msg.outputs.filter((o) => o.tokens.length > 0).length;
      if (scheduled > 0) this.metrics.stepRequests.observe(scheduled);
      const ph = msg.stats.phaseUs;
      if (ph) {
        this.metrics.stepPhase.observe({ phase: "decode" }, ph.decode / 1e6);
        this.metrics.stepPhase.observe({ phase: "sample" }, ph.sample / 1e6);
        this.metrics.stepPhase.observe({ phase: "other" }, Math.max(0, ph.step - ph.decode - ph.sample) / 1e6);
      }
    }
    this.activeSequences = msg.stats.activeSequences;
    this.cachedSequences = msg.stats.cachedSequences;
    this.kvTokensInUse = msg.stats.kvTokensInUse ?? 0;
    if (msg.stats.linearAttentionBlocks) this.linearAttentionBlocks = { ...msg.stats.linearAttentionBlocks };
    if (msg.stats.prefixCacheHitTokens > this.lastPrefixHits) {
      this.metrics.prefixCacheHitTokens.inc(msg.stats.prefixCacheHitTokens - this.lastPrefixHits);
      this.lastPrefixHits = msg.stats.prefixCacheHitTokens;
    }
    // Preemptions: cumulative per engine process (absent: an engine without preemption).
    const preemptions = msg.stats.preemptions ?? 0;
    if (preemptions > this.lastPreemptions) {
      this.metrics.preemptions.inc({ model: this.modelName }, preemptions - this.lastPreemptions);
      this.metrics.vllmPreemptions.inc({ model_name: this.modelName }, preemptions - this.lastPreemptions);
      this.lastPreemptions = preemptions;
    }
    // Draft tokens: cumulative per engine process (absent: no speculation yet, or an engine without it).
    const proposed = msg.stats.draftTokens ?? 0;
    const accepted = msg.stats.acceptedDraftTokens ?? 0;
    if (proposed > this.lastDrafts.proposed) {
      const m = this.metrics;
      m.draftTokens.inc({ model: this.modelName }, proposed - this.lastDrafts.proposed);
      m.vllmDraftTokens.inc({ model_name: this.modelName }, proposed - this.lastDrafts.proposed);
      m.acceptedDraftTokens.inc({ model: this.modelName }, accepted - this.lastDrafts.accepted);
      m.vllmAcceptedDraftTokens.inc({ model_name: this.modelName }, accepted - this.lastDrafts.accepted);
      this.lastDrafts = { proposed, accepted };
    }
  }
}

/**
 * The consumer of a model's request events (requests/events.ts): it updates `metrics` and logs each event with its
 * request id — one INFO line per HTTP request (its terminal record, `request_done`), the lifecycle events of its
 * engine requests (queued, prefill, first token, cancel, end) at DEBUG, and what an operator must see (a resume, an
 * isolated culprit, a dropped guide, an internal error) at INFO or above. `modelName` labels the OVMS families (one
 * request table per served model); `waiting` is the table's queue length at the time (for the DEBUG `queued` line).
 */
export function requestObserver(metrics: Metrics, log: Logger, waiting: () => number, modelName = ""): (ev: ObservedEvent) => void {
  const name = { name: modelName };
  metrics.registerModel(modelName);
  const debug = log.isLevelEnabled("debug");
  return (ev) => {
    switch (ev.type) {
      case "queued":
        metrics.requestsQueued.inc();
        metrics.ovmsAccepted.inc(name);
        // waiting() walks the table: only when the line is written.
        if (debug) log.debug({ requestId: ev.id, event: "queued", waiting: waiting() }, "request queued");
        return;
      case "admitted":
        if (!ev.first) return; // timings are reported once per request (a resumed request is admitted again)
        metrics.queueTime.observe(ev.first.queueMs / 1000);
        log.debug({ requestId: ev.id, event: "prefill_started", promptTokens: ev.promptTokens, cachedTokens: ev.first.cachedTokens, queueMs: ev.first.queueMs }, "prefill started");
        return;
      case "first_token":
        metrics.timeToFirstToken.observe(ev.ttftMs / 1000);
        log.debug({ requestId: ev.id, event: "first_token", ttftMs: ev.ttftMs }, "first token");
        return;
      case "tokens":
        for (let i = 0; i < ev.count; i++) metrics.interTokenLatency.observe(ev.itlMs / 1000);
        return;
      case "guide_dropped":
        // The engine stopped constraining this request: a schema is no longer guaranteed — counted and logged, never silent.
        metrics.guidedDropped.inc();
        log.warn(
          { requestId: ev.id, event: "guide_dropped", child: ev.id, reason: ev.reason, ends: ev.ends },
          ev.ends ? "guided generation dropped: the request's logit_bias left its guide no token; it ends with a 400" : "guided generation dropped; the request continues unconstrained",
        );
        return;
      case "cancelled":
        log.debug({ requestId: ev.id, event: "cancelled", phase: ev.phase, cause: ev.cause }, "request cancelled");
        return;
      case "resumed":
        metrics.requestsResumed.inc();
        log.info({ requestId: ev.id, event: "resumed", generatedTokens: ev.generatedTokens, deaths: ev.deaths }, "request resumed on the restarted engine");
        return;
      case "culprit":
        log.error({ requestId: ev.id, event: "culprit_isolated", deaths: ev.deaths }, "request isolated as the engine's killer and failed");
        return;
      case "internal_error":
        // A gateway bug while serving one request: it fails alone; this is the line that makes it visible.
        log.error({ requestId: ev.id, event: "internal_error", error: ev.message }, "internal error while serving a request");
        return;
      case "client_disconnect":
        log.debug({ requestId: ev.requestId, event: "client_disconnect", children: ev.children }, "client disconnected");
        return;
      case "client_disconnect_released":
        // Counted once every child is released, in the furthest phase they had reached.
        if (ev.phase) metrics.clientDisconnects.inc({ phase: ev.phase });
        log.debug({ requestId: ev.requestId, event: "client_disconnect_released", phase: ev.phase }, "disconnected client's requests released");
        return;
      case "finished":
        finished(ev);
        return;
      case "request_done":
        requestDone(ev);
        return;
      default:
        return;
    }
  };

  /**
   * The one INFO line of an HTTP request, from its terminal record (requests/request-record.ts). A server-side failure
   * (a 5xx other than 503's "not now") is a WARN line instead.
   */
  function requestDone(ev: Extract<ObservedEvent, { type: "request_done" }>): void {
    const { type: _type, requestId, error, ...rest } = ev;
    const line = { requestId, event: "request_done", model: modelName, ...rest, ...(error ? { errorCode: error.code, status: error.status, error: error.message } : {}) };
    const how = error ? `failed (${error.code})` : ev.clientGone ? "ended: the client went away" : `finished (${ev.finishReason})`;
    if (error && error.status >= 500 && error.status !== 503) log.warn(line, `request ${how}`);
    else log.info(line, `request ${how}`);
  }

  function finished(ev: Extract<ObservedEvent, { type: "finished" }>): void {
    const { id, reason, usage, error } = ev;
    if (ev.refused) {
      metrics.requestsRejected.inc({ reason: "invalid_request" });
      metrics.ovmsRejected.inc(name);
      log.debug({ requestId: id, event: "rejected", code: error?.code ?? "invalid_request" }, "request refused by the engine");
      return;
    }
    metrics.requestsFinished.inc({ finish_reason: reason });
    metrics.promptTokens.inc(usage.promptTokens);
    metrics.generationTokens.inc(usage.completionTokens);
    metrics.e2eLatency.observe(ev.e2eMs / 1000);
    metrics.ovmsProcessingTime.observe(name, ev.e2eMs * 1000);
    (reason === "stop" || reason === "length" ? metrics.ovmsSuccess : metrics.ovmsFail).inc(name);
    if (reason === "error") {
      log.debug({ requestId: id, event: "failed", phase: ev.phase, code: error?.code, error: error?.message, e2eMs: ev.e2eMs, ...usage }, "request failed");
      // A 4xx decided mid-request (a logit_bias that left the guide nothing) is the client's, not an engine error.
      const clientError = error?.httpError !== undefined && error.httpError.status < 500;
      metrics.requestsFailed.inc({ reason: error?.code === "engine_fault" ? "engine_fault" : error?.code === "shutting_down" ? "shutdown" : clientError ? "invalid_request" : "engine_error" });
    }
    if (reason === "abort") {
      log.debug({ requestId: id, event: "aborted", phase: ev.phase, abortLatencySteps: ev.abortLatencySteps, e2eMs: ev.e2eMs, ...usage }, "request aborted");
    }
  }
}
