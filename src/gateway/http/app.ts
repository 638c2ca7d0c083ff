/**
 * The gateway's HTTP app (fastify): strict UTF-8 JSON bodies, the OpenAI error envelope for every failure, guards on
 * connections (slow, silent, oversized), and every route. Engine supervision and the registry are given to it;
 * it owns only the HTTP-side state (connections, body parsing, error envelopes).
 */
import type { GuideSpec } from "../../protocol/messages.js";
import http from "node:http";
import Fastify, { type FastifyInstance, type FastifyReply } from "fastify";
import type { Logger } from "pino";
import { allowedMethods, isAnthropicRoute, registerRoutes } from "./routes.js";
import { MAX_JSON_NESTING, withinNesting } from "./json-depth.js";
import { loneSurrogateMessage, loneSurrogatePath } from "./lone-surrogate.js";
import { registerConfigRoutes } from "../api/config.js";
import { apiKeyChecker, needsApiKey } from "./auth.js";
import { corsHeaders, OPEN_CORS } from "./cors.js";
import { clientConnectionError, invalidApiKey, invalidUrl, expectationFailed, invalidJson, invalidValue, methodNotAllowed, routeNotFound, unsupportedContentEncoding } from "./errors.js";
import { toAnthropicErrorBody, toErrorBody, toHttpError } from "./error-envelope.js";
import type { Metrics } from "../metrics/metrics.js";
import type { ModelSet, ModelSpec } from "../models/model-set.js";
import type { GatewayOptions } from "../server.js";
import { SilentConnections } from "./silent-connections.js";
import { markReceived } from "./received-at.js";

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

/** What the HTTP app is given. */
export interface HttpAppDeps {
  opts: GatewayOptions;
  /** The served models (each its own engine, registry and route context). */
  models: ModelSet;
  metrics: Metrics;
  log: Logger;
  /** Re-read the configuration (`POST /v1/config/reload`); absent when the server was not started from a config file. */
  reload?: () => Promise<ModelSpec[]>;
}

/** The HTTP app and the switches the gateway's composition turns. */
export interface HttpApp {
  app: FastifyInstance;
  /** Connections that never sent a request (dropped at shutdown). */
  silent: SilentConnections;
  /** Readiness turns 503 and new requests get 503 `shutting_down` with Retry-After. */
  startDraining(): void;
  /** The server is being stopped (same answers as draining). */
  startClosing(): void;
}

/** Build the HTTP app (not listening yet). */
export function buildHttpApp(deps: HttpAppDeps): HttpApp {
  const { opts, models, metrics, log } = deps;

  /** CORS settings (every response carries their headers; see the onRequest hook below). */
  const cors = opts.cors ?? OPEN_CORS;
  // requestTimeout bounds how long a client may take to send its whole request (slow headers or body).
  const requestTimeout = opts.requestTimeoutMs ?? 30_000;
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit,
    return503OnClosing: true,
    // Errors fastify raises before routing (a path parameter that does not decode) in the OpenAI envelope too.
    frameworkErrors: (err, req, reply) => {
      const e = err.code === "FST_ERR_BAD_URL" ? invalidUrl(req.url) : toHttpError(err, opts.bodyLimit);
      // No hook ran for this request: its CORS headers are set here, so a page can read the error too.
      const origin = Array.isArray(req.headers.origin) ? req.headers.origin[0] : req.headers.origin;
      void (reply as unknown as FastifyReply).headers(corsHeaders(cors, { origin }, false)).status(e.status).send(toErrorBody(e));
    },
    // Errors Node reports on the connection before any route (a request not sent in time, oversized headers, not
    // HTTP) get the OpenAI envelope too, not Fastify's own body.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (err.code === "ECONNRESET" || socket.destroyed) return;
      const e = clientConnectionError(err.code);
      const body = JSON.stringify(toErrorBody(e));
      // A response already under way on this connection (its headers sent: an earlier pipelined request is
      // streaming) must not get a raw error written into its body: the connection is unusable, so it is closed (that
      // response's request is released). A response not started yet is the one this error answers (Node's rule).
      const busy = (socket as unknown as { _httpMessage?: { headersSent?: boolean } | null })._httpMessage?.headersSent === true;
      if (socket.writable && !busy) {
        socket.write(`HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status]}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
      }
      socket.destroy();
    },
    // Node drops a client that has not sent its whole request (headers and body) within requestTimeout; it checks
    // on connectionsCheckingInterval, kept below the timeout so short limits are honoured.
    serverFactory: (handler) => {
      const server = http.createServer(
        { requestTimeout, headersTimeout: requestTimeout, connectionsCheckingInterval: Math.min(30_000, Math.max(100, Math.floor(requestTimeout / 4))) },
        handler,
      );
      // A client's FIN no longer aborts its request at once: HTTP/1.1 lets a client half-close and read its answer.
      // Whether it left is found by writing to it (ResponseWriter's half-close probes). Node's own switch, not in its
      // typings (docs/upstream.md); test/e2e/api.test.ts pins it.
      (server as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
      return server;
    },
  });
  // CORS then the API key, before any route: every response carries the CORS headers, a preflight (OPTIONS) is
  // answered 204 before the key is asked for (a browser sends none with it), and a missing or wrong key is a 401.
  const checkKey = opts.apiKey ? apiKeyChecker(opts.apiKey) : null;
  const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);
  /** The error envelope of a route: Anthropic's on the Messages routes, OpenAI's everywhere else. */
  const errorBody = (url: string, e: unknown): unknown => (isAnthropicRoute(url) ? toAnthropicErrorBody(e) : toErrorBody(e));
  app.addHook("onRequest", async (req, reply) => {
    markReceived(req.raw);
    const preflight = req.method === "OPTIONS";
    const h = req.headers;
    // On the raw response: generation routes hijack the reply and write their own head, which Node merges with these.
    const headers = corsHeaders(cors, { origin: one(h.origin), requestMethod: one(h["access-control-request-method"]), requestHeaders: one(h["access-control-request-headers"]) }, preflight);
    for (const [k, v] of Object.entries(headers)) reply.raw.setHeader(k, v);
    if (preflight) return reply.status(204).send();
    // The matched route's pattern, not the raw URL: a percent-encoded path (`/%763/models`) routes like its decoded
    // form and must be guarded like it.
    if (checkKey && needsApiKey(req.routeOptions.url ?? req.url)) {
      // `Authorization: Bearer` (OpenAI, OVMS) or `x-api-key` (Anthropic), on every route.
      const r = checkKey(one(h.authorization), one(h["x-api-key"]));
      if (!r.ok) {
        metrics.requestsUnauthorized.inc();
        return reply.status(401).header("www-authenticate", "Bearer").send(errorBody(req.routeOptions.url ?? req.url, invalidApiKey(r.present)));
      }
    }
    return undefined;
  });
  /** Connections that never sent a request: dropped after requestTimeout, and at shutdown. */
  const silent = new SilentConnections(app.server, requestTimeout);
  // Bodies are parsed as strict UTF-8 JSON whatever the content type says (clients often omit it).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (req, buf, done) => {
    const raw = buf as Buffer;
    // A compressed body is refused, not parsed as if it were plain (Keel decodes no Content-Encoding).
    const encoding = one(req.headers["content-encoding"]);
    if (encoding && encoding.split(",").some((c) => c.trim().toLowerCase() !== "identity")) return done(unsupportedContentEncoding(encoding), undefined);
    // No route here: the answer is the 404 / 405, whatever the body holds.
    if (raw.length === 0 || req.routeOptions.url === undefined) return done(null, undefined);
    let text: string;
    try {
      text = utf8.decode(raw);
    } catch {
      return done(invalidJson("(The request body is not valid UTF-8.)"), undefined);
    }
    // Before parsing: recursive code downstream would overflow the stack on a deeply nested body (a 500).
    if (!withinNesting(text)) return done(invalidJson(`(The body nests deeper than ${MAX_JSON_NESTING} levels.)`), undefined);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch (err) {
      return done(invalidJson(`(${(err as Error).message})`), undefined);
    }
    const surrogate = loneSurrogatePath(body);
    if (surrogate !== null) return done(invalidValue(surrogate === "" ? null : surrogate, loneSurrogateMessage(surrogate)), undefined);
    done(null, body);
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
    const body = errorBody(req.routeOptions.url ?? req.url, e);
    if (e.status === 413 && !req.raw.complete) {
      // The client may still be sending a body that is too large. Answering and closing at once (Fastify's way) makes
      // its writes fail with EPIPE before it reads the answer. So the rest of the body is read and discarded (bounded
      // in bytes here and in time by --request_timeout); a client sending more than the bound is cut off.
      const discarded = discardBody(req.raw, MAX_DISCARDED_BODY_BYTES);
      if (!reply.raw.shouldKeepAlive) {
        // The client asked to close (`Connection: close`, HTTP/1.0): Node closes the connection as soon as the answer
        // is written, and closing with body bytes still unread resets it (RST), which can destroy the answer before
        // the client reads it. So the answer waits until the whole body was read (docs/upstream.md).
        void discarded.then((exceeded) => (exceeded ? req.raw.socket.destroy() : void reply.status(e.status).send(body)));
        return;
      }
      // A client keeping the connection gets the answer at once, and the connection stays open while its body drains.
      reply.removeHeader("connection");
      void discarded.then((exceeded) => exceeded && req.raw.socket.destroy());
    }
    // RFC 9110 §15.5.16: a 415 for a content coding names the codings that are accepted.
    if (e.code === "unsupported_content_encoding") void reply.header("accept-encoding", "identity");
    return reply.status(e.status).send(body);
  });
  // A known path asked with another method is a 405 with `Allow` (RFC 9110); a path no route has is a short 404.
  app.setNotFoundHandler((req, reply) => {
    const allowed = allowedMethods(req.url);
    if (allowed.length === 0) return void reply.status(404).send(errorBody(req.url, routeNotFound(req.method, req.url)));
    void reply.status(405).header("allow", allowed.join(", ")).send(errorBody(req.url, methodNotAllowed(req.method, req.url.split("?", 1)[0] ?? "", allowed)));
  });

  registerRoutes(app, models);
  app.get("/v2/health/live", async (_req, reply) => reply.status(200).send());
  // Ready when every served model is (as OVMS); the answer names the first one that is not. `/health` is the same
  // probe under vLLM's and llama-server's path (200 when ready, 503 while loading or restarting).
  const ready = async (_req: unknown, reply: FastifyReply) => {
    const notReadyUnit = models.servingUnits().find((u) => !u.isReady(models));
    if (!notReadyUnit) return reply.status(200).send();
    return reply.status(503).send(toErrorBody(notReadyUnit.unavailable(models)));
  };
  app.get("/v2/health/ready", ready);
  app.get("/health", ready);
  // The open readiness route names the served models (in an unknown model's 404) only to a caller with the key.
  const mayListModels = (req: { headers: http.IncomingHttpHeaders }): boolean => checkKey === null || checkKey(one(req.headers.authorization), one(req.headers["x-api-key"])).ok;
  registerConfigRoutes(app, models, log, mayListModels, deps.reload);
  app.get("/metrics", async (_req, reply) => {
    // `--metrics_list` (OVMS): only the families it names.
    return reply.type(metrics.registry.contentType).send(await metrics.text(opts.metricsList));
  });

  // `Expect: 100-continue` is answered by Node itself; any other expectation gets the OpenAI envelope, not Node's
  // bare 417.
  app.server.on("checkExpectation", (req, res) => {
    const text = JSON.stringify(toErrorBody(expectationFailed(String(req.headers["expect"]))));
    res.writeHead(417, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text), connection: "close" });
    res.end(text);
  });

  return {
    app,
    silent,
    startDraining: () => (models.stopping ??= "draining"),
    startClosing: () => (models.stopping = "closing"),
  };
}
