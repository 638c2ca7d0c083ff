/**
 * The answers for a request no route serves, on the real HTTP app (fastify inject): a known path asked with another
 * method is a 405 with `Allow` in the request's error envelope; an unknown path is a short 404.
 */
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { Metrics } from "../metrics/metrics.js";
import { ModelSet } from "../models/model-set.js";
import type { GatewayOptions } from "../server.js";
import { buildHttpApp } from "./app.js";
import { allowedMethods } from "./routes.js";

const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
const log = pino({ level: "silent" });
// No model unit is started: no request below reaches a route.
const models = new ModelSet({ stallMs: 1000, pingIntervalMs: 1000, readyStalenessMs: 1000, metrics, log, labelLogs: false });
const opts = { bodyLimit: 1 << 20, requestTimeoutMs: 30_000 } as GatewayOptions;
const { app } = buildHttpApp({ opts, models, metrics, log });
afterAll(() => app.close());

describe("allowedMethods", () => {
  it("names the methods of a known path under every prefix, with HEAD beside GET; [] for an unknown path", () => {
    expect(allowedMethods("/v3/chat/completions")).toEqual(["POST"]);
    expect(allowedMethods("/v3/v1/completions?x=1")).toEqual(["POST"]);
    expect(allowedMethods("/v1/models")).toEqual(["GET", "HEAD"]);
    expect(allowedMethods("/v1/models/org/name")).toEqual(["GET", "HEAD"]);
    expect(allowedMethods("/v2/models/tiny/ready")).toEqual(["GET", "HEAD"]);
    expect(allowedMethods("/v1/config/reload")).toEqual(["POST"]);
    expect(allowedMethods("/v3/embeddings")).toEqual([]);
    expect(allowedMethods("/v3/chat/completions/x")).toEqual([]);
    expect(allowedMethods("/v2/models/a/b/ready")).toEqual([]);
  });
});

describe("a request no route serves", () => {
  it("GET on a POST route is a 405 with Allow: POST in the OpenAI envelope", async () => {
    const r = await app.inject({ method: "GET", url: "/v3/chat/completions" });
    expect(r.statusCode).toBe(405);
    expect(r.headers["allow"]).toBe("POST");
    expect(r.json()).toEqual({
      error: { message: "Method 'GET' is not allowed on '/v3/chat/completions'. Allowed: POST.", type: "invalid_request_error", code: "method_not_allowed", param: null },
    });
  });

  it("POST on a GET route is a 405 with Allow: GET, HEAD", async () => {
    const r = await app.inject({ method: "POST", url: "/v1/models", payload: {} });
    expect(r.statusCode).toBe(405);
    expect(r.headers["allow"]).toBe("GET, HEAD");
    expect(r.json().error.code).toBe("method_not_allowed");
  });

  it("another method on a Messages path is a 405 in Anthropic's envelope (the query string does not matter)", async () => {
    const r = await app.inject({ method: "GET", url: "/v1/messages?beta=true" });
    expect(r.statusCode).toBe(405);
    expect(r.headers["allow"]).toBe("POST");
    expect(r.json()).toEqual({ type: "error", error: { type: "invalid_request_error", message: "Method 'GET' is not allowed on '/v1/messages'. Allowed: POST." } });
  });

  it("an unknown path is a 404 route_not_found whose message is short and lists no routes", async () => {
    const r = await app.inject({ method: "GET", url: "/v3/embeddings" });
    expect(r.statusCode).toBe(404);
    expect(r.headers["allow"]).toBeUndefined();
    const body = r.json() as { error: { code: string; message: string } };
    expect(body.error.code).toBe("route_not_found");
    expect(body.error.message).toBe("No route for 'GET' '/v3/embeddings'. The API is served under /v1/, /v3/ and /v3/v1/ (e.g. POST /v1/chat/completions; routes: docs/api.md).");
    expect(body.error.message.length).toBeLessThan(160);
  });
});
