/**
 * The gateway process, composed: the request registry, the engine supervisor (supervisor.ts), the metrics observer
 * (metrics-observer.ts), the HTTP app (http-app.ts) and the periodic engine line (metrics/engine-stats-log.ts); plus
 * the graceful drain. It never touches engine state; it
 * sends the engine commands and applies the engine's outputs.
 *
 * Routes (OVMS 2026.2's REST surface, with OpenAI conventions where the two differ — see README):
 *   POST /v3/chat/completions, /v3/v1/chat/completions, /v1/chat/completions
 *   GET  /v3/models, /v3/v1/models, /v1/models
 *   GET  /v2/health/live   — the HTTP loop answers (always 200 while the process runs)
 *   GET  /v2/health/ready  — every model's engine reported ready and answered a ping recently
 *   GET  /v2/models/{name}/ready, GET /v1/config, POST /v1/config/reload — OVMS's per-model status (api/config.ts)
 *   GET  /metrics          — Prometheus text
 *
 * Several models (`--config_path`): one engine, supervisor and registry per model (model-set.ts).
 */
import { SHUTTING_DOWN_MESSAGE } from "./http/errors.js";
import type { AddressInfo } from "node:net";
import type { FastifyInstance } from "fastify";
import pino, { type DestinationStream, type Logger } from "pino";
import type { EngineClient } from "./supervision/engine-client.js";
import { buildHttpApp } from "./http/app.js";
import { kvUsage, Metrics, type ModelGauges } from "./metrics/metrics.js";
import { ENGINE_STATS_INTERVAL_MS, startEngineStatsLog } from "./metrics/engine-stats-log.js";
import { ModelSet, type ModelSpec, type ServedModelView } from "./models/model-set.js";
import type { RequestRegistry } from "./requests/registry.js";
import type { EngineSupervisor } from "./supervision/supervisor.js";
import { describeServerReady, serverUrl } from "./supervision/ready-line.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import { NO_AGENT_FLAGS, type AgentFlags } from "./models/agent-config.js";
import type { CorsPolicy } from "./http/cors.js";

/** Gateway options (resolved CLI flags). */
export interface GatewayOptions {
  host: string;
  port: number;
  modelName: string;
  /** Other names requests may use for the model (the catalogue name given to `--model_path`). */
  modelAliases?: string[];
  /** Engine start configuration (engine-neutral, protocol/engine-config.ts); the mode is set per process. */
  engine: Omit<EngineConfig, "mode">;
  /** How to run the engine (default: node dist/engine/main.js). */
  engineCommand?: EngineCommand;
  /** Request body limit (bytes). */
  bodyLimit: number;
  /** Bytes of unread stream output per client before it is treated as gone (default 1 MiB). */
  maxStreamBuffer?: number;
  /**
   * How long a client may take to send its whole request (ms), and how long a connection may stay open without
   * sending one; slower clients are dropped (default 30 s).
   */
  requestTimeoutMs?: number;
  logLevel: "trace" | "debug" | "info" | "warn" | "error";
  /** Where log lines go and in which format (gateway/http/logging.ts); default: JSON lines on stdout. */
  logDestination?: DestinationStream;
  /** No step progress for this long (ms) while there is work → the engine is killed and restarted (default 30 s). */
  engineStallTimeoutMs?: number;
  /** Largest number of requests waiting for a sequence before new ones get 429 (the bounded queue). */
  maxQueuedRequests: number;
  /** Ping period and readiness staleness (ms). */
  pingIntervalMs?: number;
  readyStalenessMs?: number;
  /** How long a prompt isolated as an engine killer stays refused (ms; default 10 min). */
  isolatedPromptTtlMs?: number;
  /** `--tool_parser`, `--reasoning_parser`, `--enable_tool_guided_generation` (default: none of them). */
  agents?: AgentFlags;
  /** API key required on /v1/ and /v3/ routes (auth.ts); null or absent = no auth. Never logged. */
  apiKey?: string | null;
  /** CORS headers and preflight answers (cors.ts; default: OVMS's `*` everywhere, no credentials). */
  cors?: CorsPolicy;
  /** `--metrics_list`: the metric families /metrics exports (default: all). */
  metricsList?: string[];
  /**
   * Several models (`--config_path`), each with its own engine; when given, `modelName`, `engine` and `agents` are
   * not used. The first is the default model.
   */
  models?: ModelSpec[];
  /** Re-read the config file for `POST /v1/config/reload` (throws Error with the reason when it is invalid). */
  reloadModels?: () => Promise<ModelSpec[]>;
  /** Interval of the periodic engine line (ms; default 5000, 0 = none). */
  engineStatsIntervalMs?: number;
}

/** A running gateway. */
export interface Gateway {
  app: FastifyInstance;
  /** The first model's engine, supervisor and registry at start (the only ones of a single-model server; a reload may replace them: use `models`). */
  engine: EngineClient;
  supervisor: EngineSupervisor;
  registry: RequestRegistry;
  /** Every served model with its own engine, supervisor and registry. */
  models: ModelSet;
  metrics: Metrics;
  log: Logger;
  /** Resolves when every model's engine reported ready for the first time. */
  engineReady: Promise<void>;
  /**
   * Graceful drain: readiness turns 503, new requests get 503 with Retry-After, in-flight requests may finish for
   * up to `timeoutMs`; the rest are then ended (stream: a final error event; unary: 503) and aborted; the engine
   * stops, connections that never sent a request are dropped, and the HTTP server closes. Resolves when everything
   * is down.
   */
  drain(timeoutMs: number): Promise<void>;
  /** Make a running drain stop waiting for in-flight requests (a second signal). */
  hurryDrain(): void;
  close(): Promise<void>;
}

/** A served model's state as the gateway gauges (and the periodic engine line's KV usage) read it. */
function gaugesOf(u: Pick<ServedModelView, "spec" | "supervisor" | "registry" | "steps">): ModelGauges {
  const limits = u.supervisor.engine.ready?.limits;
  return {
    modelName: u.spec.name,
    ...u.registry.counts(),
    kvTokensInUse: u.steps.kvTokensInUse,
    ...(u.steps.linearAttentionBlocks ? { linearAttentionBlocks: u.steps.linearAttentionBlocks } : {}),
    // One shared pool (OpenVINO) when the engine reports it, else a partition per sequence (llama.cpp).
    kvTokenCapacity: limits ? (limits.kvPoolTokens ?? limits.maxNumSeqs * limits.maxModelLen) : 0,
    cacheDtype: u.spec.engine.kvCacheType,
    prefixCaching: u.spec.engine.prefixCaching,
  };
}

/** How long the HTTP server may take to close its connections at shutdown before the rest are dropped (ms). */
const CLOSE_GRACE_MS = 2000;

/** Build and start the gateway (HTTP listening, engine spawned). */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const logOptions = {
    level: opts.logLevel,
    base: { component: "gateway", pid: process.pid },
    // Nothing logs request headers today; should a line ever carry them, the API key is censored.
    redact: { paths: ["headers.authorization", "req.headers.authorization", "*.headers.authorization", "authorization", "apiKey"], censor: "[redacted]" },
  };
  const log = opts.logDestination ? pino(logOptions, opts.logDestination) : pino(logOptions);
  const specs: ModelSpec[] = opts.models ?? [{ name: opts.modelName, aliases: opts.modelAliases ?? [], engine: opts.engine, agents: opts.agents ?? NO_AGENT_FLAGS, maxQueuedRequests: opts.maxQueuedRequests }];
  /** Sum of a per-model reading over every engine (serving and retired): the metric families stay server-wide. */
  const sum = (read: (u: ReturnType<ModelSet["all"]>[number]) => number): number => models.all().reduce((n, u) => n + read(u), 0);
  const metrics = new Metrics({
    counts: () => ({ waiting: sum((u) => u.registry.counts().waiting), running: sum((u) => u.registry.counts().running) }),
    activeSequences: () => sum((u) => u.steps.activeSequences),
    cachedSequences: () => sum((u) => u.steps.cachedSequences),
    // The stalest engine's age: a stuck engine of one model shows even while another steps.
    lastStepAgeSeconds: () => Math.max(0, ...models.all().map((u) => (Date.now() - u.steps.lastStepAt) / 1000)),
    // The gateway gauges (vLLM names, OVMS families): one entry per served model, from its own registry and engine.
    models: () => models.servingUnits().map(gaugesOf),
  });
  const models = new ModelSet({
    ...(opts.engineCommand ? { engineCommand: opts.engineCommand } : {}),
    stallMs: opts.engineStallTimeoutMs ?? 30_000,
    pingIntervalMs: opts.pingIntervalMs ?? 1000,
    readyStalenessMs: opts.readyStalenessMs ?? 5000,
    ...(opts.isolatedPromptTtlMs !== undefined ? { isolatedPromptTtlMs: opts.isolatedPromptTtlMs } : {}),
    ...(opts.maxStreamBuffer !== undefined ? { maxUnreadBytes: opts.maxStreamBuffer } : {}),
    metrics,
    log,
    labelLogs: opts.models !== undefined,
  });
  /** When a running drain stops waiting for in-flight requests (ms since epoch). */
  let drainDeadline = 0;
  /** Set by hurryDrain() (a second signal): what the drain ends early is logged as hurried, not as a timeout. */
  let hurried = false;

  const web = buildHttpApp({ opts, models, metrics, log, ...(opts.reloadModels ? { reload: opts.reloadModels } : {}) });
  const app = web.app;

  // Listen first: liveness answers while the engines load, and a busy port fails before an engine is spawned.
  await app.listen({ host: opts.host, port: opts.port });
  models.startAll(specs);
  const first = models.first();
  log.info({ event: "listening", address: app.server.address() }, "gateway listening");
  const engineReady = Promise.all(models.servingUnits().map((u) => u.supervisor.firstReady)).then(() => undefined);
  /** Set when the server starts shutting down: a ready line after that would be a lie. */
  let stopping = false;
  // One line once every model's engine is ready: where clients go and what answers there.
  void engineReady.then(() => {
    const units = models.servingUnits().filter((u) => u.supervisor.engine.ready !== null);
    if (stopping || units.length === 0) return;
    const url = serverUrl(app.server.address() as AddressInfo);
    const served = units.map((u) => ({ name: u.spec.name, ready: u.supervisor.engine.ready! }));
    log.info({ event: "ready", url, models: served.map((m) => ({ name: m.name, engine: m.ready.engine, backend: m.ready.backend ?? null })) }, describeServerReady(url, served));
  });

  // The periodic engine line (throughput, running/waiting, KV, prefix hits) of every model that is busy.
  const stopStats = opts.engineStatsIntervalMs === 0
    ? () => undefined
    : startEngineStatsLog(log, () => models.servingUnits().map((u) => ({ modelName: u.spec.name, processed: u.steps.processed, counts: () => u.registry.counts(), kvUsage: () => kvUsage(gaugesOf(u)) })), { intervalMs: opts.engineStatsIntervalMs ?? ENGINE_STATS_INTERVAL_MS });

  /** Stop the engine, drop connections that never sent a request, close the HTTP server. */
  async function shutDown(): Promise<void> {
    stopping = true;
    stopStats();
    web.startClosing();
    await models.stopAll();
    const closed = app.close();
    const dropped = web.silent.destroyAll();
    if (dropped > 0) log.info({ event: "silent_connections_dropped", count: dropped }, "dropped connections that never sent a request");
    // Every request the server took has ended by now; what still holds a connection is a client half-way through
    // sending one (it would hold the exit until --request_timeout). Let answers already written flush, then drop it.
    let grace: NodeJS.Timeout | undefined;
    const flushed = await Promise.race([closed.then(() => true), new Promise<boolean>((r) => (grace = setTimeout(() => r(false), CLOSE_GRACE_MS)))]);
    clearTimeout(grace);
    if (!flushed) {
      log.info({ event: "connections_dropped" }, "dropped connections still sending a request at shutdown");
      app.server.closeAllConnections();
      await closed;
    }
  }

  return {
    app,
    engine: first.supervisor.engine,
    supervisor: first.supervisor,
    registry: first.registry,
    models,
    metrics,
    log,
    engineReady,
    async drain(timeoutMs: number) {
      stopping = true;
      web.startDraining();
      for (const u of models.all()) u.supervisor.stopWatchdog();
      log.info({ event: "drain_started", inFlight: models.inFlight, timeoutMs }, "draining: new generation requests get 503 (a second SIGINT/SIGTERM, e.g. Ctrl-C again, stops now)");
      drainDeadline = Date.now() + timeoutMs;
      // 1. Let in-flight requests finish (observed through the registries; bounded by the timeout).
      while (models.inFlight > 0 && Date.now() < drainDeadline) await new Promise((r) => setTimeout(r, 50));
      // 2. End what is left cleanly and abort it in the engines.
      const left = models.endAll(SHUTTING_DOWN_MESSAGE);
      if (left > 0) {
        if (hurried) log.warn({ event: "drain_hurried", aborted: left }, "second signal: remaining requests aborted");
        else log.warn({ event: "drain_timeout", aborted: left }, "shutdown timeout reached: remaining requests aborted");
      }
      // 3. Give the engine a moment to confirm the aborts, then stop everything.
      const settle = Date.now() + 2000;
      while (models.inFlight > 0 && Date.now() < settle) await new Promise((r) => setTimeout(r, 20));
      await shutDown();
      log.info({ event: "drain_finished" }, "shutdown complete");
    },
    hurryDrain() {
      hurried = true;
      drainDeadline = 0;
    },
    async close() {
      await shutDown();
    },
  };
}
