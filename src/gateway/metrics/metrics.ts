/**
 * Prometheus metrics (prom-client). Every label set is created at 0 at start, so a fresh server shows each name.
 * Names are documented in docs/metrics.md.
 */
import client from "prom-client";
import type { Phase, FinishReason } from "../requests/lifecycle.js";

const PHASES: Phase[] = ["queued", "prefill", "decode"];
const FINISH_REASONS: FinishReason[] = ["stop", "length", "abort", "error"];

/** Sources that gauges read at scrape time. */
export interface GaugeSources {
  counts(): { waiting: number; running: number };
  /** Sequences owned by live requests, as last reported by the engine. */
  activeSequences(): number;
  /** Idle sequences holding reusable KV, as last reported by the engine. */
  cachedSequences(): number;
  /** Seconds since the engine's last step. */
  lastStepAgeSeconds(): number;
  /** Per-model state for the gateway gauges (vLLM and OVMS names), one entry per served model; absent = none. */
  models?(): ModelGauges[];
}

/** One served model's state as the gateway gauges read it at scrape time. */
export interface ModelGauges {
  /** Served model name (the `model_name` / `name` label). */
  modelName: string;
  /** Requests waiting for an engine sequence. */
  waiting: number;
  /** Requests owning an engine sequence (prefill or decode). */
  running: number;
  /** KV cells (tokens) held by live requests, as last reported by the engine (idle prefix-cache KV excluded). */
  kvTokensInUse: number;
  /** Configured KV budget in tokens: sequences × tokens per sequence; 0 while no engine is ready. */
  kvTokenCapacity: number;
  /** KV element type the engine runs with (e.g. f16, q8_0). */
  cacheDtype: string;
  /** Whether finished requests' KV is kept for prefix reuse. */
  prefixCaching: boolean;
  /** Linear-attention state blocks of a hybrid model (in use, pool), as last reported; absent for other models. */
  linearAttentionBlocks?: { inUse: number; total: number };
}

/** KV usage in 0..1 (0 when there is no budget yet). */
export function kvUsage(m: Pick<ModelGauges, "kvTokensInUse" | "kvTokenCapacity">): number {
  return m.kvTokenCapacity > 0 ? Math.min(1, m.kvTokensInUse / m.kvTokenCapacity) : 0;
}

/** Buckets (seconds) of the phase histograms: a step's or a first token's parts, 10 µs to 2.5 s. */
const PHASE_BUCKETS = [0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];

/**
 * prom-client's default set (process_resident_memory_bytes, nodejs_heap_size_used_bytes and the heap spaces, GC
 * durations, event-loop lag), collected once per process: its collectors (a GC observer, an event-loop monitor) are
 * process-wide and never torn down, so every gateway in the process shares them.
 */
let processMetricList: client.Metric[] | null = null;
function processMetrics(): client.Metric[] {
  if (!processMetricList) {
    const reg = new client.Registry();
    client.collectDefaultMetrics({ register: reg });
    spaceLagCollects(reg);
    processMetricList = reg.getMetricsAsArray().map((m) => reg.getSingleMetric(m.name)!);
  }
  return processMetricList;
}

/** Least time between two reads of the event-loop delay histogram (see {@link spaceLagCollects}). */
export const LAG_COLLECT_MIN_MS = 1000;

/**
 * prom-client's event-loop lag families are filled by one collect that reads a delay histogram and resets it, so a
 * second collect within the histogram's 10 ms resolution (two scrapes at once) reads an empty one: min 9.2e9 s, max 0,
 * mean NaN. A collect less than a second after the last keeps the last values; the next one covers both windows
 * (docs/upstream.md).
 */
export function spaceLagCollects(reg: client.Registry, now: () => number = () => performance.now()): void {
  const lag = reg.getSingleMetric("nodejs_eventloop_lag_seconds") as (client.Metric & { collect?: () => unknown }) | undefined;
  const collect = lag?.collect;
  if (!lag || !collect) return;
  let last = -Infinity;
  lag.collect = function (this: unknown) {
    const t = now();
    if (t - last < LAG_COLLECT_MIN_MS) return undefined;
    last = t;
    return collect.call(this);
  };
}

export class Metrics {
  readonly registry = new client.Registry();
  readonly engineSteps: client.Counter;
  readonly clientDisconnects: client.Counter<"phase">;
  readonly requestsFinished: client.Counter<"finish_reason">;
  readonly engineRestarts: client.Counter<"reason">;
  readonly prefixCacheHitTokens: client.Counter;
  /** Requests that got a token per decoding step: how many sequences the engine actually scheduled together. */
  readonly stepRequests: client.Histogram;
  /** Engine step wall time by phase (decode, sample, other), from the step messages' phaseUs. */
  readonly stepPhase: client.Histogram<"phase">;
  /** Where each streamed request's first token spent its time, by phase (`TtftPhase` of http/route-context.ts). */
  readonly ttftPhase: client.Histogram<"phase">;
  readonly requestsResumed: client.Counter;
  /** Guided requests whose constraint the engine dropped (they went on unconstrained). */
  readonly guidedDropped: client.Counter;
  readonly requestsQueued: client.Counter;
  readonly promptTokens: client.Counter;
  readonly generationTokens: client.Counter;
  readonly timeToFirstToken: client.Histogram;
  readonly interTokenLatency: client.Histogram;
  readonly e2eLatency: client.Histogram;
  readonly queueTime: client.Histogram;
  readonly requestsFailed: client.Counter<"reason">;
  readonly requestsRejected: client.Counter<"reason">;
  /** Requests refused 401 for a missing or wrong API key. */
  readonly requestsUnauthorized: client.Counter;
  /** OVMS families, labelled by served model `name` (ovms-compat.md §7). */
  readonly ovmsAccepted: client.Counter<"name">;
  readonly ovmsRejected: client.Counter<"name">;
  readonly ovmsSuccess: client.Counter<"name">;
  readonly ovmsFail: client.Counter<"name">;
  readonly ovmsProcessingTime: client.Histogram<"name">;
  /** Preemptions reported by each model's engine (a running request lost its KV and waits to be recomputed). */
  readonly preemptions: client.Counter<"model">;
  /** The same count under vLLM's name. */
  readonly vllmPreemptions: client.Counter<"model_name">;
  /** Prompt-lookup draft tokens verified, and accepted, per model (keel_engine_*; vLLM's spec_decode names too). */
  readonly draftTokens: client.Counter<"model">;
  readonly acceptedDraftTokens: client.Counter<"model">;
  readonly vllmDraftTokens: client.Counter<"model_name">;
  readonly vllmAcceptedDraftTokens: client.Counter<"model_name">;

  constructor(src: GaugeSources) {
    const registers = [this.registry];
    /** A gauge whose value is read from `read()` at scrape time. */
    const gauge = (name: string, help: string, read: () => number): void => {
      new client.Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read());
        },
      });
    };
    /** A counter with every label value created at 0, so a fresh server shows each series. */
    const labelled = <L extends string>(name: string, help: string, label: L, values: readonly string[]): client.Counter<L> => {
      const c = new client.Counter<L>({ name, help, labelNames: [label], registers });
      for (const v of values) c.inc({ [label]: v } as Partial<Record<L, string>>, 0);
      return c;
    };
    gauge("keel_requests_running", "Requests admitted to an engine sequence (prefill or decode), including ones being cancelled", () => src.counts().running);
    gauge("keel_requests_waiting", "Requests handed to the engine and waiting for a sequence", () => src.counts().waiting);
    gauge("keel_engine_sequences_active", "Engine sequences owned by live requests (idle prefix-cache sequences excluded)", () => src.activeSequences());
    gauge("keel_prefix_cache_sequences", "Idle engine sequences holding reusable KV (prefix cache); not counted in keel_engine_sequences_active", () => src.cachedSequences());
    this.prefixCacheHitTokens = new client.Counter({
      name: "keel_prefix_cache_hit_tokens_total",
      help: "Prompt tokens reused from the prefix cache instead of being prefilled",
      registers,
    });
    this.requestsRejected = labelled("keel_requests_rejected_total", "Requests refused, by reason (queue_full: 429; not_ready: 503; invalid_request: refused by the engine, e.g. context length)", "reason", ["queue_full", "not_ready", "invalid_request"]);
    this.engineSteps = new client.Counter({ name: "keel_engine_steps_total", help: "Engine steps that decoded a batch", registers });
    this.stepRequests = new client.Histogram({
      name: "keel_engine_step_requests",
      help: "Requests that got a token in one engine step (the decode batch the engine scheduled), per step that decoded",
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
      registers,
    });
    this.stepPhase = new client.Histogram({
      name: "keel_engine_step_phase_seconds",
      help: "Engine step wall time by phase: decode (the native batch decode), sample (every sequence's sampling), other (scheduling and bookkeeping; the output message is written after the step is timed), per step that decoded",
      labelNames: ["phase"],
      buckets: PHASE_BUCKETS,
      registers,
    });
    this.ttftPhase = new client.Histogram({
      name: "keel_request_ttft_phase_seconds",
      help: "Time to first token by phase, per request: accept (HTTP request received -> its add written to the engine: body, validation, chat template, admission), engine (add written -> the step message carrying the first token read back: the hop in, the wait for a step boundary, tokenisation, prefill, first sampling, the hop back), deliver (that message read -> the first token written to the client: output processing, parsers, encoding, the write)",
      labelNames: ["phase"],
      buckets: PHASE_BUCKETS,
      registers,
    });
    this.clientDisconnects = labelled("keel_client_disconnects_total", "Clients that closed their connection before their response ended, by request phase", "phase", PHASES);
    this.requestsFinished = labelled("keel_requests_finished_total", "Requests that ended, by finish_reason (stop, length, abort, error)", "finish_reason", FINISH_REASONS);
    this.engineRestarts = labelled("keel_engine_restarts_total", "Engine processes restarted after an exit, by reason", "reason", ["exit", "signal", "watchdog", "protocol"]);
    this.requestsQueued = new client.Counter({ name: "keel_requests_queued_total", help: "Requests handed to the engine's queue", registers });
    this.promptTokens = new client.Counter({ name: "keel_prompt_tokens_total", help: "Prompt tokens of finished requests", registers });
    this.generationTokens = new client.Counter({ name: "keel_generation_tokens_total", help: "Tokens generated for finished requests", registers });
    // Buckets in seconds, from vLLM's choices for the same histograms (fine below 100 ms, coarse above 10 s).
    const latencyBuckets = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
    this.timeToFirstToken = new client.Histogram({ name: "keel_time_to_first_token_seconds", help: "Time from acceptance to the first generated token (TTFT)", buckets: latencyBuckets, registers });
    this.interTokenLatency = new client.Histogram({ name: "keel_inter_token_latency_seconds", help: "Time between consecutive generated tokens of a request (ITL)", buckets: latencyBuckets, registers });
    this.e2eLatency = new client.Histogram({ name: "keel_e2e_request_latency_seconds", help: "Time from acceptance to the request's end, whatever the reason", buckets: latencyBuckets, registers });
    this.queueTime = new client.Histogram({ name: "keel_request_queue_time_seconds", help: "Time from acceptance to admission to an engine sequence", buckets: latencyBuckets, registers });
    this.guidedDropped = new client.Counter({
      name: "keel_guided_dropped_total",
      help: "Guided requests (tools, response_format) whose grammar constraint the engine dropped; they continued unconstrained, or ended with a 400 when their own logit_bias left the guide no token",
      registers,
    });
    this.requestsResumed = new client.Counter({
      name: "keel_requests_resumed_total",
      help: "Requests resubmitted as continuations to a restarted engine",
      registers,
    });
    this.requestsFailed = labelled("keel_requests_failed_total", "Requests that ended with an error, by reason (engine_fault: isolated as the engine's killer; engine_error; shutdown; invalid_request: a 4xx decided while generating)", "reason", ["engine_fault", "engine_error", "shutdown", "invalid_request"]);
    gauge("keel_engine_last_step_age_seconds", "Seconds since the engine's last step", () => src.lastStepAgeSeconds());
    this.requestsUnauthorized = new client.Counter({ name: "keel_requests_unauthorized_total", help: "Requests refused 401 for a missing or wrong API key", registers });

    // Gateway gauges under vLLM's names (read by the Gateway API Inference Extension / llm-d endpoint picker) and
    // OVMS's; one series per served model, rebuilt at each scrape so a model that went away leaves no series.
    const models = (): ModelGauges[] => src.models?.() ?? [];
    /** A gauge with one series per model, set from `read(model)` at scrape time. */
    const perModel = (name: string, help: string, label: "model_name" | "name", read: (m: ModelGauges) => number): void => {
      new client.Gauge({
        name,
        help,
        labelNames: [label],
        registers,
        collect() {
          this.reset();
          for (const m of models()) this.set({ [label]: m.modelName }, read(m));
        },
      });
    };
    perModel("vllm:num_requests_waiting", "Requests waiting for an engine sequence, per model (vLLM name)", "model_name", (m) => m.waiting);
    perModel("vllm:num_requests_running", "Requests owning an engine sequence, per model (vLLM name)", "model_name", (m) => m.running);
    perModel("vllm:kv_cache_usage_perc", "KV cells held by live requests over the configured KV budget (0..1), per model (vLLM name)", "model_name", kvUsage);
    new client.Gauge({
      name: "vllm:cache_config_info",
      help: "KV cache configuration per model (vLLM name): block_size 1 (llama.cpp KV is per token cell), num_gpu_blocks = KV budget in cells",
      labelNames: ["model_name", "block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"],
      registers,
      collect() {
        this.reset();
        for (const m of models()) {
          if (m.kvTokenCapacity === 0) continue; // no engine ready: the capacity is not known yet
          this.set({ model_name: m.modelName, block_size: "1", num_gpu_blocks: String(m.kvTokenCapacity), cache_dtype: m.cacheDtype, enable_prefix_caching: String(m.prefixCaching) }, 1);
        }
      },
    });
    // Hybrid (linear-attention) models on the OpenVINO engine only: other models have no series.
    const laGauge = (name: string, help: string, read: (b: { inUse: number; total: number }) => number): void => {
      new client.Gauge({
        name,
        help,
        labelNames: ["model"],
        registers,
        collect() {
          this.reset();
          for (const m of models()) if (m.linearAttentionBlocks) this.set({ model: m.modelName }, read(m.linearAttentionBlocks));
        },
      });
    };
    laGauge("keel_engine_linear_attention_blocks_in_use", "Linear-attention state blocks held by live requests of a hybrid model (OpenVINO engine), per model", (b) => b.inUse);
    laGauge("keel_engine_linear_attention_blocks_capacity", "Linear-attention state blocks in the pool of a hybrid model (OpenVINO num_linear_attention_blocks), per model", (b) => b.total);
    perModel("ovms_current_graphs", "Requests in flight (waiting or running), per model (OVMS name)", "name", (m) => m.waiting + m.running);
    const byName = (name: string, help: string): client.Counter<"name"> => new client.Counter({ name, help, labelNames: ["name"], registers });
    this.ovmsAccepted = byName("ovms_requests_accepted", "Requests handed to a model's engine (OVMS name)");
    this.ovmsRejected = byName("ovms_requests_rejected", "Requests refused at admission: queue full, not ready, or refused by the engine (a 400 from the gateway's own validation is not counted; OVMS name)");
    this.ovmsSuccess = byName("ovms_requests_success", "Requests that ended with finish_reason stop or length (OVMS name)");
    this.ovmsFail = byName("ovms_requests_fail", "Requests that ended with an error or were aborted (OVMS name)");
    this.ovmsProcessingTime = new client.Histogram({
      name: "ovms_graph_processing_time_us",
      help: "Request duration from acceptance to end, unary or stream, in microseconds (OVMS name)",
      labelNames: ["name"],
      // OVMS's exponential microsecond buckets, coarsened.
      buckets: [1e3, 5e3, 1e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7, 2e7, 4e7, 8e7, 1.6e8],
      registers,
    });
    // From the engine's cumulative step stats (metrics-observer.ts StepObserver); an engine without preemption
    // (llama.cpp: a KV partition per sequence) keeps them at 0.
    this.preemptions = new client.Counter({ name: "keel_engine_preemptions_total", help: "Running requests preempted by the engine (their KV freed for others; recomputed later), per model", labelNames: ["model"], registers });
    this.vllmPreemptions = new client.Counter({ name: "vllm:num_preemptions_total", help: "Cumulative number of preemptions from the engine, per model (vLLM name)", labelNames: ["model_name"], registers });
    // Prompt-lookup speculative decoding (docs/speculative.md); acceptance rate = accepted / draft.
    this.draftTokens = new client.Counter({ name: "keel_engine_draft_tokens_total", help: "Prompt-lookup draft tokens the engine verified, per model", labelNames: ["model"], registers });
    this.acceptedDraftTokens = new client.Counter({ name: "keel_engine_accepted_draft_tokens_total", help: "Prompt-lookup draft tokens accepted (equal to the token sampled at their position), per model", labelNames: ["model"], registers });
    this.vllmDraftTokens = new client.Counter({ name: "vllm:spec_decode_num_draft_tokens_total", help: "Number of draft tokens (vLLM name)", labelNames: ["model_name"], registers });
    this.vllmAcceptedDraftTokens = new client.Counter({ name: "vllm:spec_decode_num_accepted_tokens_total", help: "Number of accepted tokens (vLLM name)", labelNames: ["model_name"], registers });
    for (const m of processMetrics()) this.registry.registerMetric(m);
  }

  /**
   * The /metrics text: every family, or only `names` (`--metrics_list`), cut from one whole scrape. prom-client's
   * default set fills sibling families from one family's collect (nodejs_heap_size_used_bytes from
   * nodejs_heap_size_total_bytes'), so a family read alone would show 0 or a stale value (docs/upstream.md).
   */
  async text(names?: readonly string[]): Promise<string> {
    const all = await this.registry.metrics();
    if (!names) return all;
    const wanted = new Set(names);
    const kept: string[] = [];
    let keep = false;
    for (const line of all.split("\n")) {
      const family = /^# (?:HELP|TYPE) (\S+)/.exec(line)?.[1];
      if (family !== undefined) keep = wanted.has(family);
      if (keep && line !== "") kept.push(line);
    }
    return kept.join("\n") + "\n";
  }

  /** Create the per-model series at 0 (OVMS families, preemptions), so a fresh server shows each name for `modelName`. */
  registerModel(modelName: string): void {
    for (const c of [this.ovmsAccepted, this.ovmsRejected, this.ovmsSuccess, this.ovmsFail]) c.inc({ name: modelName }, 0);
    this.preemptions.inc({ model: modelName }, 0);
    this.vllmPreemptions.inc({ model_name: modelName }, 0);
    this.draftTokens.inc({ model: modelName }, 0);
    this.acceptedDraftTokens.inc({ model: modelName }, 0);
    this.vllmDraftTokens.inc({ model_name: modelName }, 0);
    this.vllmAcceptedDraftTokens.inc({ model_name: modelName }, 0);
  }
}

/** Names of every metric family /metrics exports (what `--metrics_list` may name), read from a throwaway registry. */
export function metricFamilies(): string[] {
  const idle = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
  return idle.registry.getMetricsAsArray().map((m) => m.name);
}
