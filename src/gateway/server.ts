/**
 * The gateway process, composed: the request registry, the engine supervisor (supervisor.ts), the metrics observer
 * (metrics-observer.ts) and the HTTP app. It never touches engine state; it sends the engine commands and applies
 * the engine's outputs.
 *
 * Routes (OVMS 2026.2's REST surface, with OpenAI conventions where the two differ — see README):
 *   POST /v3/chat/completions, /v3/v1/chat/completions, /v1/chat/completions
 *   GET  /v3/models, /v3/v1/models, /v1/models
 *   GET  /v2/health/live   — the HTTP loop answers (always 200 while the process runs)
 *   GET  /v2/health/ready  — engine reported ready and answered a ping recently
 *   GET  /metrics          — Prometheus text
 */
import http from "node:http";
import Fastify, { type FastifyInstance } from "fastify";
import pino, { type Logger } from "pino";
import { handleChat, MAX_UNREAD_BYTES } from "./chat-route.js";
import type { ChatTemplate } from "./chat-template.js";
import type { EngineClient } from "./engine-client.js";
import { engineRestarting, expectationFailed, invalidJson, notReady, routeNotFound, shuttingDown, toErrorBody, toHttpError } from "./errors.js";
import { Metrics } from "./metrics.js";
import { registryObserver, StepObserver } from "./metrics-observer.js";
import { RequestRegistry } from "./registry.js";
import { SilentConnections } from "./silent-connections.js";
import { EngineSupervisor, ISOLATED_PROMPT_TTL_MS } from "./supervisor.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";

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
  /** No step progress for this long (ms) while there is work → the engine is killed and restarted (default 30 s). */
  engineStallTimeoutMs?: number;
  /** Largest number of requests waiting for a sequence before new ones get 429 (the bounded queue). */
  maxQueuedRequests: number;
  /** Ping period and readiness staleness (ms). */
  pingIntervalMs?: number;
  readyStalenessMs?: number;
  /** How long a prompt isolated as an engine killer stays refused (ms; default 10 min). */
  isolatedPromptTtlMs?: number;
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

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Most bytes of a too-large body read and discarded before the 413 is sent anyway. */
const MAX_DISCARDED_BODY_BYTES = 64 * 1024 * 1024;

/**
 * Read and drop the rest of a request body; resolves at its end or when the client goes (false), or once more than
 * `maxBytes` were dropped (true).
 */
function discardBody(body: http.IncomingMessage, maxBytes: number): Promise<boolean> {
  return new Promise((resolve) => {
    let seen = 0;
    const done = (exceeded = false): void => {
      body.off("data", onData);
      resolve(exceeded);
    };
    const onData = (chunk: Buffer): void => {
      seen += chunk.length;
      if (seen > maxBytes) done(true);
    };
    body.on("data", onData);
    body.once("end", () => done());
    body.once("close", () => done());
    body.once("error", () => done());
    body.resume();
  });
}

/** Build and start the gateway (HTTP listening, engine spawned). */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const log = pino({ level: opts.logLevel, base: { component: "gateway", pid: process.pid } });
  const metrics = new Metrics({
    counts: () => registry.counts(),
    activeSequences: () => steps.activeSequences,
    cachedSequences: () => steps.cachedSequences,
    lastStepAgeSeconds: () => (Date.now() - steps.lastStepAt) / 1000,
  });
  const steps = new StepObserver(metrics);
  const registry: RequestRegistry = new RequestRegistry((msg) => supervisor.engine.send(msg), registryObserver(metrics, log, () => registry.counts().waiting), () => steps.lastStep);
  const supervisor = new EngineSupervisor(
    {
      engine: opts.engine,
      ...(opts.engineCommand ? { engineCommand: opts.engineCommand } : {}),
      stallMs: opts.engineStallTimeoutMs ?? 30_000,
      pingIntervalMs: opts.pingIntervalMs ?? 1000,
      readyStalenessMs: opts.readyStalenessMs ?? 5000,
      isolatedPromptTtlMs: opts.isolatedPromptTtlMs ?? ISOLATED_PROMPT_TTL_MS,
      onEngineReady: (s) => (template = s.template),
    },
    registry,
    steps,
    metrics,
    log,
  );
  // The names the routes' context below reads (it moves as one unit to the routes module).
  const engine = supervisor.engine;
  /** Chat template of the current engine's model; null until an engine reported ready. */
  let template: ChatTemplate | null = null;
  /** Prompts isolated as engine killers, as the routes ask about them (bounded in time: supervisor.ts). */
  const culpritPrompts = { has: (prompt: string) => supervisor.isKnownCulprit(prompt) };
  /** Set once the HTTP server and engine are being stopped. */
  let closing = false;
  /** Set by drain(): readiness 503 and new requests refused with 503 + Retry-After. */
  let draining = false;
  /** When a running drain stops waiting for in-flight requests (ms since epoch). */
  let drainDeadline = 0;

  // ---- The HTTP app: body parsing, the error envelope, connection guards and every route.
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
  /** Connections that never sent a request: dropped after requestTimeout, and at shutdown. */
  const silent = new SilentConnections(app.server, requestTimeout);
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
      log.info({ event: "client_aborted_request", requestId: req.id, url: req.url }, "client aborted while sending the request");
      return;
    }
    const e = toHttpError(err, opts.bodyLimit);
    // A 503 (loading, restarting, draining) is the server saying "not now", not a failure: info, with the id.
    if (e.status === 503) log.info({ event: "unavailable", requestId: req.id, url: req.url, code: e.code }, "request refused: server unavailable");
    else if (e.status >= 500) log.error({ event: "request_error", requestId: req.id, url: req.url, err: err instanceof Error ? err.message : String(err) }, "request failed");
    if (e.status === 413 && !req.raw.complete) {
      // The client may still be sending a body that is too large. Answering and closing at once (Fastify's way) makes
      // its writes fail with EPIPE before it reads the answer. So answer at once but keep the connection, and read and
      // discard the rest of the body (bounded in bytes here and in time by --request_timeout); a client sending
      // more than the bound is cut off.
      reply.removeHeader("connection");
      void discardBody(req.raw, MAX_DISCARDED_BODY_BYTES).then((exceeded) => exceeded && req.raw.socket.destroy());
    }
    return reply.status(e.status).send(toErrorBody(e));
  });
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send(toErrorBody(routeNotFound(req.method, req.url)));
  });

  const chatCtx = {
    registry,
    modelName: opts.modelName,
    template: () => template,
    isReady: () => engine.isReady && !draining && !closing,
    maxModelLen: () => engine.ready?.limits.maxModelLen ?? null,
    maxQueuedRequests: opts.maxQueuedRequests,
    maxUnreadBytes: opts.maxStreamBuffer ?? MAX_UNREAD_BYTES,
    maxNumSeqs: () => engine.ready?.limits.maxNumSeqs ?? 0,
    unavailable: () => {
      if (draining || closing) return shuttingDown();
      if (engine.starts > 1 && !engine.ready) return engineRestarting();
      return notReady();
    },
    isKnownCulprit: (prompt: string) => culpritPrompts.has(prompt),
    onRejected: (reason: "queue_full" | "not_ready") => metrics.requestsRejected.inc({ reason }),
    log,
    onDisconnect: (phase: "queued" | "prefill" | "decode") => metrics.clientDisconnects.inc({ phase }),
  };
  for (const path of ["/v3/chat/completions", "/v3/v1/chat/completions", "/v1/chat/completions"]) {
    app.post(path, (req, reply) => handleChat(chatCtx, req, reply));
  }
  const modelsBody = () => ({
    object: "list",
    data: [{ id: opts.modelName, object: "model", created: startedAt, owned_by: "keel" }],
  });
  const startedAt = Math.floor(Date.now() / 1000);
  for (const path of ["/v3/models", "/v3/v1/models", "/v1/models"]) app.get(path, async () => modelsBody());
  app.get("/v2/health/live", async (_req, reply) => reply.status(200).send());
  app.get("/v2/health/ready", async (_req, reply) => {
    if (engine.isReady && !closing && !draining) return reply.status(200).send();
    return reply.status(503).send(toErrorBody(draining || closing ? shuttingDown() : supervisor.unavailableReason === "restarting" ? engineRestarting() : notReady()));
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
  supervisor.start();
  log.info({ event: "listening", address: app.server.address() }, "gateway listening");

  /** Stop the engine, drop connections that never sent a request, close the HTTP server. */
  async function shutDown(): Promise<void> {
    closing = true;
    await supervisor.stop();
    const closed = app.close();
    const dropped = silent.destroyAll();
    if (dropped > 0) log.info({ event: "silent_connections_dropped", count: dropped }, "dropped connections that never sent a request");
    await closed;
  }

  return {
    app,
    engine,
    supervisor,
    registry,
    metrics,
    log,
    engineReady: supervisor.firstReady,
    async drain(timeoutMs: number) {
      draining = true;
      supervisor.stopWatchdog();
      log.info({ event: "drain_started", inFlight: registry.size, timeoutMs }, "draining: new requests get 503");
      drainDeadline = Date.now() + timeoutMs;
      // 1. Let in-flight requests finish (observed through the registry; bounded by the timeout).
      while (registry.size > 0 && Date.now() < drainDeadline) await new Promise((r) => setTimeout(r, 50));
      // 2. End what is left cleanly and abort it in the engine.
      const left = registry.endAll("the server is shutting down");
      if (left > 0) log.warn({ event: "drain_timeout", aborted: left }, "shutdown timeout reached: remaining requests aborted");
      // 3. Give the engine a moment to confirm the aborts, then stop everything.
      const settle = Date.now() + 2000;
      while (registry.size > 0 && Date.now() < settle) await new Promise((r) => setTimeout(r, 20));
      await shutDown();
      log.info({ event: "drain_finished" }, "shutdown complete");
    },
    hurryDrain() {
      drainDeadline = 0;
    },
    async close() {
      await shutDown();
    },
  };
}
