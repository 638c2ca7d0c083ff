/**
 * The gateway process: HTTP routes, the request registry and the engine supervisor. It never touches engine state;
 * it sends the engine commands and applies the engine's outputs.
 *
 * Routes (OVMS 2026.2's REST surface, with OpenAI conventions where the two differ — see README):
 *   under /v3, /v3/v1 and /v1 (src/gateway/routes.ts): POST chat/completions, completions, responses, tokenize;
 *   GET models, models/{id}
 *   GET  /v2/health/live   — the HTTP loop answers (always 200 while the process runs)
 *   GET  /v2/health/ready  — engine reported ready and answered a ping recently
 *   GET  /metrics          — Prometheus text
 */
import http from "node:http";
import Fastify, { type FastifyInstance } from "fastify";
import pino, { type Logger } from "pino";
import { MAX_UNREAD_BYTES, type RouteContext } from "./route-context.js";
import { registerRoutes, routeList } from "./routes.js";
import { TokenizeClient } from "./tokenize-client.js";
import { ChatTemplate } from "./chat-template.js";
import { EngineClient } from "./engine-client.js";
import { engineRestarting, expectationFailed, invalidJson, notReady, routeNotFound, shuttingDown, toErrorBody, toHttpError } from "./errors.js";
import { Metrics } from "./metrics.js";
import { RequestRegistry } from "./registry.js";
import type { EngineConfig } from "../engine/main.js";
import { CHATML_TEMPLATE } from "../model/tiny-model.js";

/** Gateway options (resolved CLI flags). */
export interface GatewayOptions {
  host: string;
  port: number;
  modelName: string;
  engine: Omit<EngineConfig, "mode">;
  /** Request body limit (bytes). */
  bodyLimit: number;
  /** Bytes of unread stream output per client before it is treated as gone (default 1 MiB). */
  maxStreamBuffer?: number;
  /** How long a client may take to send its whole request (ms); slower clients are dropped (default 30 s). */
  requestTimeoutMs?: number;
  logLevel: "debug" | "info" | "warn" | "error";
  /** No step progress for this long (ms) while there is work → the engine is killed and restarted (default 30 s). */
  engineStallTimeoutMs?: number;
  /** Largest number of requests waiting for a sequence before new ones get 429 (the bounded queue). */
  maxQueuedRequests: number;
  /** Ping period and readiness staleness (ms). */
  pingIntervalMs?: number;
  readyStalenessMs?: number;
}

/** A running gateway. */
export interface Gateway {
  app: FastifyInstance;
  engine: EngineClient;
  registry: RequestRegistry;
  metrics: Metrics;
  log: Logger;
  /** Resolves when the engine reported ready for the first time. */
  engineReady: Promise<void>;
  /**
   * Graceful drain: readiness turns 503, new requests get 503 with Retry-After, in-flight requests may finish for
   * up to `timeoutMs`; the rest are then ended (stream: a final error event; unary: 503) and aborted; the engine
   * stops and the HTTP server closes. Resolves when everything is down.
   */
  drain(timeoutMs: number): Promise<void>;
  /** Make a running drain stop waiting for in-flight requests (a second signal). */
  hurryDrain(): void;
  close(): Promise<void>;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Build and start the gateway (HTTP listening, engine spawned). */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const log = pino({ level: opts.logLevel, base: { component: "gateway", pid: process.pid } });
  let template: ChatTemplate | null = null;
  let activeSequences = 0;
  let cachedSequences = 0;
  let lastEngineStep = 0;
  let lastPrefixHits = 0;

  // eslint-disable-next-line prefer-const
  let engine: EngineClient;
  const registry = new RequestRegistry((msg) => engine.send(msg), {
    onResumed(id, generatedTokens, deaths) {
      metrics.requestsResumed.inc();
      log.info({ requestId: id, event: "resumed", generatedTokens, deaths }, "request resumed on the restarted engine");
    },
    onRefused(id, code) {
      metrics.requestsRejected.inc({ reason: "invalid_request" });
      log.info({ requestId: id, event: "rejected", code }, "request refused by the engine");
    },
    onFinished(id, reason, usage, info) {
      metrics.requestsFinished.inc({ finish_reason: reason });
      metrics.promptTokens.inc(usage.promptTokens);
      metrics.generationTokens.inc(usage.completionTokens);
      metrics.e2eLatency.observe(info.e2eMs / 1000);
      if (reason === "error") log.warn({ requestId: id, event: "failed", phase: info.phase, code: info.errorCode, error: info.error, e2eMs: info.e2eMs, ...usage }, "request failed");
      if (reason === "error") metrics.requestsFailed.inc({ reason: info.errorCode === "engine_fault" ? "engine_fault" : info.errorCode === "shutting_down" ? "shutdown" : "engine_error" });
      if (reason === "abort") {
        log.info({ requestId: id, event: "aborted", phase: info.phase, abortLatencySteps: info.abortLatencySteps, e2eMs: info.e2eMs, ...usage }, "request aborted");
      }
    },
    onQueued(id) {
      metrics.requestsQueued.inc();
      log.info({ requestId: id, event: "queued", waiting: registry.counts().waiting }, "request queued");
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
  }, () => lastEngineStep);
  const metrics = new Metrics({
    counts: () => registry.counts(),
    activeSequences: () => activeSequences,
    cachedSequences: () => cachedSequences,
    lastStepAgeSeconds: () => (Date.now() - lastStepAt) / 1000,
  });
  let lastStepAt = Date.now();

  let resolveReady!: () => void;
  const engineReady = new Promise<void>((r) => (resolveReady = r));
  engine = new EngineClient(
    {
      config: opts.engine,
      pingIntervalMs: opts.pingIntervalMs ?? 1000,
      readyStalenessMs: opts.readyStalenessMs ?? 5000,
      restartMinMs: 100,
      restartMaxMs: 30_000,
    },
    {
      onReady(msg) {
        lastEngineStep = 0;
        lastPrefixHits = 0;
        activeSequences = 0;
        cachedSequences = 0;
        const m = msg.model;
        try {
          template = new ChatTemplate(m.chatTemplate ?? CHATML_TEMPLATE, { bosToken: m.bosToken, eosToken: m.eosToken });
        } catch (err) {
          log.error({ err: (err as Error).message }, "the model's chat template does not parse; using ChatML");
          template = new ChatTemplate(CHATML_TEMPLATE, { bosToken: m.bosToken, eosToken: m.eosToken });
        }
        lastProgressAt = Date.now();
        const recovering = registry.recoveringCount;
        log.info({ event: "engine_ready", enginePid: msg.pid, model: m.path, limits: msg.limits, engine: msg.engine, recovering }, "engine ready");
        if (diedAt !== null) {
          log.info({ event: "engine_recovered", downtimeMs: Date.now() - diedAt, resuming: recovering }, "engine restarted; resuming in-flight requests");
          diedAt = null;
        }
        registry.resumeRecovering();
        resolveReady();
      },
      onMessage(msg) {
        switch (msg.type) {
          case "step":
            lastProgressAt = Date.now();
            lastStepAt = lastProgressAt;
            if (msg.step > lastEngineStep) {
              metrics.engineSteps.inc(msg.step - lastEngineStep);
              lastEngineStep = msg.step;
            }
            activeSequences = msg.stats.activeSequences;
            cachedSequences = msg.stats.cachedSequences;
            if (msg.stats.prefixCacheHitTokens > lastPrefixHits) {
              metrics.prefixCacheHitTokens.inc(msg.stats.prefixCacheHitTokens - lastPrefixHits);
              lastPrefixHits = msg.stats.prefixCacheHitTokens;
            }
            registry.handleStep(msg);
            break;
          case "request_error":
            registry.handleRequestError(msg);
            break;
          case "tokenized":
            tokenizer.handle(msg);
            break;
          case "protocol_error":
            log.error({ event: "protocol_error", error: msg.message }, "engine rejected a message");
            break;
          case "fatal":
            log.error({ event: "engine_fatal", error: msg.message }, "engine reported a fatal error");
            break;
          default:
            break;
        }
      },
      onExit({ code, signal }) {
        tokenizer.failAll("the engine process exited");
        activeSequences = 0;
        cachedSequences = 0;
        if (closing) {
          registry.handleEngineExit("the server is shutting down");
          return;
        }
        const reason = killedByWatchdog ? "watchdog" : signal ? "signal" : "exit";
        killedByWatchdog = false;
        diedAt = Date.now();
        log.error({ event: "engine_exit", code, signal, reason, inFlight: registry.size }, "engine process exited; restarting and resuming");
        metrics.engineRestarts.inc({ reason });
        // An engine that keeps dying before it is ready will not resume anyone: end what waits, clearly.
        if (engine.failedStarts >= MAX_FAILED_STARTS) {
          log.error({ event: "engine_unrecoverable", failedStarts: engine.failedStarts }, "the engine keeps failing to start; failing in-flight requests");
          registry.handleEngineExit(`the engine failed to start ${engine.failedStarts} times in a row`);
          return;
        }
        const culprits = registry.handleEngineDeath(`the engine process exited (${signal ?? `code ${code}`})`, { blame: reason !== "watchdog" });
        for (const c of culprits) {
          log.error({ event: "culprit_isolated", requestId: c.id }, "request isolated as the engine's killer and failed");
          // Remember its prompt (bounded) so that resending it is refused without another crash.
          if ("text" in c.prompt) {
            culpritPrompts.add(c.prompt.text);
            if (culpritPrompts.size > 1000) culpritPrompts.delete(culpritPrompts.values().next().value as string);
          }
        }
      },
      onLog(line, stream) {
        // Engine lines are JSON already; pass them through at their level.
        try {
          const parsed = JSON.parse(line) as { level?: string; msg?: string };
          const level = parsed.level === "fatal" || parsed.level === "error" ? "error" : parsed.level === "warn" ? "warn" : "info";
          log[level]({ engine: parsed }, parsed.msg ?? "engine");
        } catch {
          log.info({ engineStream: stream }, line);
        }
      },
    },
  );
  /** Set once the HTTP server and engine are being stopped. */
  let closing = false;
  /** Rendered prompts of requests isolated as engine killers (insertion-ordered, at most 1000). */
  const culpritPrompts = new Set<string>();
  /** When the engine last made progress (a step), or work appeared; the watchdog compares against it. */
  let lastProgressAt = Date.now();
  /** When the current engine process died (for the recovery-time log), or null. */
  let diedAt: number | null = null;
  /** Set when the watchdog killed the engine, so the exit is counted with reason "watchdog". */
  let killedByWatchdog = false;
  // Watchdog: work pending but no step for engineStallTimeoutMs, or no pong for long → kill, restart, resume.
  const stallMs = opts.engineStallTimeoutMs ?? 30_000;
  // Three ways an engine can be stuck, each checked whether or not requests are waiting:
  //   stalled  — requests are in the engine but no step came for stallMs;
  //   deaf     — the engine reported ready but answered no ping for max(stallMs, 10 s) (frozen while idle);
  //   starting — an engine process has not reported ready within max(10 × stallMs, 60 s) of its start.
  const startupLimitMs = Math.max(10 * stallMs, 60_000);
  const watchdog = setInterval(() => {
    const now = Date.now();
    const work = registry.size > registry.recoveringCount;
    if (!engine.ready || !work) lastProgressAt = now;
    const stalled = engine.ready !== null && work && now - lastProgressAt > stallMs;
    const deaf = engine.ready !== null && now - engine.lastPong > Math.max(stallMs, 10_000);
    const starting = engine.ready === null && engine.pid !== null && now - engine.startedAt > startupLimitMs;
    if (stalled || deaf || starting) {
      const why = stalled ? "no step progress" : deaf ? "no answer to pings" : "did not become ready";
      log.error({ event: "engine_stalled", why, stalledMs: now - lastProgressAt, pongAgeMs: now - engine.lastPong }, `engine stuck (${why}); killing it to restart and resume`);
      killedByWatchdog = true;
      lastProgressAt = now;
      engine.kill();
    }
  }, Math.min(500, Math.max(50, stallMs / 4)));
  watchdog.unref();
  /** Set by drain(): readiness 503 and new requests refused with 503 + Retry-After. */
  let draining = false;
  /** When a running drain stops waiting for in-flight requests (ms since epoch). */
  let drainDeadline = 0;

  // requestTimeout bounds how long a client may take to send its whole request (slow headers or body).
  const requestTimeout = opts.requestTimeoutMs ?? 30_000;
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit,
    return503OnClosing: true,
    // Node drops a client that has not sent its whole request (headers and body) within requestTimeout; it checks
    // on connectionsCheckingInterval, kept below the timeout so short limits are honoured.
    serverFactory: (handler) =>
      http.createServer(
        { requestTimeout, headersTimeout: requestTimeout, connectionsCheckingInterval: Math.min(30_000, Math.max(100, Math.floor(requestTimeout / 4))) },
        handler,
      ),
  });
  // Bodies are parsed as strict UTF-8 JSON whatever the content type says (clients often omit it).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (_req, buf, done) => {
    const raw = buf as Buffer;
    if (raw.length === 0) return done(null, undefined);
    let text: string;
    try {
      text = utf8.decode(raw);
    } catch {
      return done(invalidJson("(The request body is not valid UTF-8.)"), undefined);
    }
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(invalidJson(`(${(err as Error).message})`), undefined);
    }
  });
  app.setErrorHandler((err, req, reply) => {
    if (req.raw.aborted || (err as { code?: string }).code === "ECONNRESET") {
      // The client left while sending its body: a client abort (499-style), not a server error.
      log.info({ event: "client_aborted_request", url: req.url }, "client aborted while sending the request");
      return;
    }
    const e = toHttpError(err, opts.bodyLimit);
    if (e.status >= 500) log.error({ err: err instanceof Error ? err.message : String(err) }, "request failed");
    void reply.status(e.status).send(toErrorBody(e));
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send(toErrorBody(routeNotFound(req.method, req.url, routeList())));
  });

  const startedAt = Math.floor(Date.now() / 1000);
  const tokenizer = new TokenizeClient((msg) => engine.send(msg));
  const routeCtx: RouteContext = {
    registry,
    modelName: opts.modelName,
    modelCreated: startedAt,
    template: () => template,
    isReady: () => engine.isReady && !draining && !closing,
    maxModelLen: () => engine.ready?.limits.maxModelLen ?? null,
    vocabSize: () => engine.ready?.model.vocabSize ?? 0,
    capabilities: () => engine.ready?.capabilities ?? null,
    maxQueuedRequests: opts.maxQueuedRequests,
    maxUnreadBytes: opts.maxStreamBuffer ?? MAX_UNREAD_BYTES,
    maxNumSeqs: () => engine.ready?.limits.maxNumSeqs ?? 0,
    unavailable: () => {
      if (draining || closing) return shuttingDown();
      if (engine.starts > 1 && !engine.ready) return engineRestarting();
      return notReady();
    },
    isKnownCulprit: (prompt: string) => culpritPrompts.has(prompt),
    tokenize: (text, addSpecialTokens) => tokenizer.tokenize(text, addSpecialTokens),
    onRejected: (reason: "queue_full" | "not_ready") => metrics.requestsRejected.inc({ reason }),
    log,
    onDisconnect: (phase) => metrics.clientDisconnects.inc({ phase }),
  };
  registerRoutes(app, routeCtx);
  app.get("/v2/health/live", async (_req, reply) => reply.status(200).send());
  app.get("/v2/health/ready", async (_req, reply) => {
    if (engine.isReady && !closing && !draining) return reply.status(200).send();
    return reply.status(503).send(toErrorBody(draining || closing ? shuttingDown() : engine.starts > 1 ? engineRestarting() : notReady()));
  });
  app.get("/metrics", async (_req, reply) => {
    const text = await metrics.registry.metrics();
    return reply.type(metrics.registry.contentType).send(text);
  });

  // `Expect: 100-continue` is answered by Node itself; any other expectation gets the OpenAI envelope, not Node's
  // bare 417.
  app.server.on("checkExpectation", (req, res) => {
    const text = JSON.stringify(toErrorBody(expectationFailed(String(req.headers["expect"]))));
    res.writeHead(417, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text), connection: "close" });
    res.end(text);
  });
  // Listen first: liveness answers while the engine loads, and a busy port fails before an engine is spawned.
  await app.listen({ host: opts.host, port: opts.port });
  engine.start();
  log.info({ event: "listening", address: app.server.address() }, "gateway listening");

  return {
    app,
    engine,
    registry,
    metrics,
    log,
    engineReady,
    async drain(timeoutMs: number) {
      draining = true;
      clearInterval(watchdog);
      log.info({ event: "drain_started", inFlight: registry.size, timeoutMs }, "draining: new requests get 503");
      drainDeadline = Date.now() + timeoutMs;
      // 1. Let in-flight requests finish (observed through the registry; bounded by the timeout).
      while (registry.size > 0 && Date.now() < drainDeadline) await new Promise((r) => setTimeout(r, 50));
      // 2. End what is left cleanly and abort it in the engine.
      const left = registry.endAll("the server is shutting down");
      if (left > 0) log.warn({ event: "drain_timeout", aborted: left }, "shutdown timeout reached: remaining requests aborted");
      const settle = Date.now() + 2000;
      while (registry.size > 0 && Date.now() < settle) await new Promise((r) => setTimeout(r, 20));
      closing = true;
      await engine.stop();
      registry.handleEngineExit("the server is shutting down");
      await app.close();
      log.info({ event: "drain_finished" }, "shutdown complete");
    },
    hurryDrain() {
      drainDeadline = 0;
    },
    async close() {
      closing = true;
      clearInterval(watchdog);
      await engine.stop();
      // Whatever the engine did not release (e.g. no engine was running) ends now, so no response stays open.
      registry.handleEngineExit("the server is shutting down");
      await app.close();
    },
  };
}

/** Engine processes in a row that die before reporting ready, after which waiting requests are failed. */
const MAX_FAILED_STARTS = 5;

