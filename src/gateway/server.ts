/**
 * The gateway process, composed: the request registry, the engine supervisor (supervisor.ts), the metrics observer
 * (metrics-observer.ts) and the HTTP app (http-app.ts); plus the graceful drain. It never touches engine state; it
 * sends the engine commands and applies the engine's outputs.
 *
 * Routes (OVMS 2026.2's REST surface, with OpenAI conventions where the two differ — see README):
 *   POST /v3/chat/completions, /v3/v1/chat/completions, /v1/chat/completions
 *   GET  /v3/models, /v3/v1/models, /v1/models
 *   GET  /v2/health/live   — the HTTP loop answers (always 200 while the process runs)
 *   GET  /v2/health/ready  — engine reported ready and answered a ping recently
 *   GET  /metrics          — Prometheus text
 */
import { SHUTTING_DOWN_MESSAGE } from "./errors.js";
import type { FastifyInstance } from "fastify";
import pino, { type DestinationStream, type Logger } from "pino";
import type { EngineClient } from "./engine-client.js";
import { buildHttpApp } from "./http-app.js";
import { Metrics } from "./metrics.js";
import { registryObserver, StepObserver } from "./metrics-observer.js";
import { RequestRegistry } from "./registry.js";
import { EngineSupervisor, ISOLATED_PROMPT_TTL_MS } from "./supervisor.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { AgentFlags } from "./agent-config.js";
import type { CorsPolicy } from "./cors.js";

/** Gateway options (resolved CLI flags). */
export interface GatewayOptions {
  host: string;
  port: number;
  modelName: string;
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
  logLevel: "debug" | "info" | "warn" | "error";
  /** Where log lines go and in which format (gateway/logging.ts); default: JSON lines on stdout. */
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
}

/** A running gateway. */
export interface Gateway {
  app: FastifyInstance;
  engine: EngineClient;
  supervisor: EngineSupervisor;
  registry: RequestRegistry;
  metrics: Metrics;
  log: Logger;
  /** Resolves when the engine reported ready for the first time. */
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
  const metrics = new Metrics({
    counts: () => registry.counts(),
    activeSequences: () => steps.activeSequences,
    cachedSequences: () => steps.cachedSequences,
    lastStepAgeSeconds: () => (Date.now() - steps.lastStepAt) / 1000,
    // One model today; multi-model serving gives one entry per model (each from its own registry and engine).
    models: () => {
      const limits = supervisor.engine.ready?.limits;
      return [
        {
          modelName: opts.modelName,
          ...registry.counts(),
          kvTokensInUse: steps.kvTokensInUse,
          kvTokenCapacity: limits ? limits.maxNumSeqs * limits.maxModelLen : 0,
          cacheDtype: opts.engine.kvCacheType,
          prefixCaching: opts.engine.prefixCaching,
        },
      ];
    },
  });
  const steps = new StepObserver(metrics);
  const registry: RequestRegistry = new RequestRegistry((msg) => supervisor.engine.send(msg), registryObserver(metrics, log, () => registry.counts().waiting, opts.modelName), () => steps.lastStep);
  const supervisor = new EngineSupervisor(
    {
      engine: opts.engine,
      ...(opts.engineCommand ? { engineCommand: opts.engineCommand } : {}),
      stallMs: opts.engineStallTimeoutMs ?? 30_000,
      pingIntervalMs: opts.pingIntervalMs ?? 1000,
      readyStalenessMs: opts.readyStalenessMs ?? 5000,
      isolatedPromptTtlMs: opts.isolatedPromptTtlMs ?? ISOLATED_PROMPT_TTL_MS,
      onEngineReady: (s) => web.setTemplate(s.template),
    },
    registry,
    steps,
    metrics,
    log,
  );
  /** When a running drain stops waiting for in-flight requests (ms since epoch). */
  let drainDeadline = 0;
  /** Set by hurryDrain() (a second signal): what the drain ends early is logged as hurried, not as a timeout. */
  let hurried = false;

  const web = buildHttpApp({ opts, registry, supervisor, metrics, log });
  const app = web.app;

  // Listen first: liveness answers while the engine loads, and a busy port fails before an engine is spawned.
  await app.listen({ host: opts.host, port: opts.port });
  supervisor.start();
  log.info({ event: "listening", address: app.server.address() }, "gateway listening");

  /** Stop the engine, drop connections that never sent a request, close the HTTP server. */
  async function shutDown(): Promise<void> {
    web.startClosing();
    await supervisor.stop();
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
    engine: supervisor.engine,
    supervisor,
    registry,
    metrics,
    log,
    engineReady: supervisor.firstReady,
    async drain(timeoutMs: number) {
      web.startDraining();
      supervisor.stopWatchdog();
      log.info({ event: "drain_started", inFlight: registry.size, timeoutMs }, "draining: new requests get 503");
      drainDeadline = Date.now() + timeoutMs;
      // 1. Let in-flight requests finish (observed through the registry; bounded by the timeout).
      while (registry.size > 0 && Date.now() < drainDeadline) await new Promise((r) => setTimeout(r, 50));
      // 2. End what is left cleanly and abort it in the engine.
      const left = registry.endAll(SHUTTING_DOWN_MESSAGE);
      if (left > 0) {
        if (hurried) log.warn({ event: "drain_hurried", aborted: left }, "second signal: remaining requests aborted");
        else log.warn({ event: "drain_timeout", aborted: left }, "shutdown timeout reached: remaining requests aborted");
      }
      // 3. Give the engine a moment to confirm the aborts, then stop everything.
      const settle = Date.now() + 2000;
      while (registry.size > 0 && Date.now() < settle) await new Promise((r) => setTimeout(r, 20));
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
