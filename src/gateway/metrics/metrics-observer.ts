/**
 * The one place where metrics and request logs follow the engine: the registry's observer (every hook connected:
 * queue, admission, tokens, finish, refusal, cancel, resume, culprit, internal error) and the engine's step
 * outputs (steps, prefix-cache hits, sequence gauges).
 */
import type { Logger } from "pino";
import type { StepMessage } from "../../protocol/messages.js";
import type { Metrics } from "./metrics.js";
import type { RegistryObserver } from "../requests/registry.js";

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
    this.engineGone();
  }

  /** The engine process exited: it holds no sequence any more. */
  engineGone(): void {
    this.activeSequences = 0;
    this.cachedSequences = 0;
    this.kvTokensInUse = 0;
  }

  /** Apply one step output's counters (the engine reports cumulative values; the metrics count increments). */
  observe(msg: StepMessage): void {
    this.lastStepAt = Date.now();
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
  }
}

/**
 * Registry observer that updates `metrics` and logs each request event with its request id. `modelName` labels the
 * OVMS families (one registry per served model).
 */
export function registryObserver(metrics: Metrics, log: Logger, waiting: () => number, modelName = ""): RegistryObserver {
  const name = { name: modelName };
  metrics.registerModel(modelName);
  return {
    onQueued(id) {
      metrics.requestsQueued.inc();
      metrics.ovmsAccepted.inc(name);
      log.info({ requestId: id, event: "queued", waiting: waiting() }, "request queued");
    },
    onAdmitted(id, promptTokens, info) {
      metrics.queueTime.observe(info.queueMs / 1000);
      log.info({ requestId: id, event: "prefill_started", promptTokens, cachedTokens: info.cachedTokens, queueMs: info.queueMs }, "prefill started");
    },
    onFirstToken(id, ttftMs) {
      metrics.timeToFirstToken.observe(ttftMs / 1000);
      log.info({ requestId: id, event: "first_token", ttftMs }, "first token");
    },
    onTokens(_id, count, itlMs) {
      for (let i = 0; i < count; i++) metrics.interTokenLatency.observe(itlMs / 1000);
    },
    onCancel(id, phase, cause) {
      log.info({ requestId: id, event: "cancelled", phase, cause }, "request cancelled");
    },
    onRefused(id, code) {
      metrics.requestsRejected.inc({ reason: "invalid_request" });
      metrics.ovmsRejected.inc(name);
      log.info({ requestId: id, event: "rejected", code }, "request refused by the engine");
    },
    onResumed(id, generatedTokens, deaths) {
      metrics.requestsResumed.inc();
      log.info({ requestId: id, event: "resumed", generatedTokens, deaths }, "request resumed on the restarted engine");
    },
    onCulprit(id, deaths) {
      log.error({ requestId: id, event: "culprit_isolated", deaths }, "request isolated as the engine's killer and failed");
    },
    onInternalError(id, message) {
      // A gateway bug while serving one request: it fails alone; this is the line that makes it visible.
      log.error({ requestId: id, event: "internal_error", error: message }, "internal error while serving a request");
    },
    onFinished(id, reason, usage, info) {
      metrics.requestsFinished.inc({ finish_reason: reason });
      metrics.promptTokens.inc(usage.promptTokens);
      metrics.generationTokens.inc(usage.completionTokens);
      metrics.e2eLatency.observe(info.e2eMs / 1000);
      metrics.ovmsProcessingTime.observe(name, info.e2eMs * 1000);
      (reason === "stop" || reason === "length" ? metrics.ovmsSuccess : metrics.ovmsFail).inc(name);
      if (reason === "error") {
        log.warn({ requestId: id, event: "failed", phase: info.phase, code: info.errorCode, error: info.error, e2eMs: info.e2eMs, ...usage }, "request failed");
        metrics.requestsFailed.inc({ reason: info.errorCode === "engine_fault" ? "engine_fault" : info.errorCode === "shutting_down" ? "shutdown" : "engine_error" });
      }
      if (reason === "abort") {
        log.info({ requestId: id, event: "aborted", phase: info.phase, abortLatencySteps: info.abortLatencySteps, e2eMs: info.e2eMs, ...usage }, "request aborted");
      }
    },
  };
}
