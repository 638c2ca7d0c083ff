/**
 * A compressed request body (`Content-Encoding` other than identity) is refused with a 415 in the route's error
 * envelope, on the real HTTP app (fastify inject): Keel decodes no encoding, and must not parse the bytes as if plain.
 */
import { gzipSync } from "node:zlib";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { Metrics } from "../metrics/metrics.js";
import { ModelSet } from "../models/model-set.js";
import type { GatewayOptions } from "../server.js";
import { buildHttpApp } from "./app.js";

const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
const log = pino({ level: "silent" });
// No model unit is started: a body that passes the parser reaches a route that knows no model.
const models = new ModelSet({ stallMs: 1000, pingIntervalMs: 1000, readyStalenessMs: 1000, metrics, log, labelLogs: false });
const { app } = buildHttpApp({ opts: { bodyLimit: 1 << 20, requestTimeoutMs: 30_000 } as GatewayOptions, models, metrics, log });
afterAll(() => app.close());

const body = JSON.stringify({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] });
const post = (url: string, encoding: string | undefined, payload: string | Buffer = body) =>
  app.inject({ method: "POST", url, payload, headers: { "content-type": "application/json", ...(encoding === undefined ? {} : { "content-encoding": encoding }) } });

describe("Content-Encoding", () => {
  it.each(["gzip", "br", "GZIP", "deflate, gzip", "identity, gzip"])("%s on a plain body: 415 unsupported_content_encoding naming it (OpenAI envelope)", async (encoding) => {
    const r = await post("/v3/chat/completions", encoding);
    expect(r.statusCode).toBe(415);
    expect(r.headers["accept-encoding"]).toBe("identity");
    expect(r.json()).toEqual({ error: { message: `Content-Encoding '${encoding}' is not supported: send the request body uncompressed.`, type: "invalid_request_error", code: "unsupported_content_encoding", param: null } });
  });

  it("a really gzipped body: the same 415, not an invalid-JSON 400", async () => {
    const r = await post("/v1/chat/completions", "gzip", gzipSync(body));
    expect([r.statusCode, r.json().error.code]).toEqual([415, "unsupported_content_encoding"]);
  });

  it("on the Anthropic route: Anthropic's envelope", async () => {
    const r = await post("/v1/messages", "gzip");
    expect(r.statusCode).toBe(415);
    expect(r.json()).toMatchObject({ type: "error", error: { type: "invalid_request_error", message: expect.stringMatching(/^Content-Encoding 'gzip' is not supported/) } });
  });

  it("a long coding is echoed cut to 120 characters", async () => {
    const r = await post("/v3/chat/completions", "x".repeat(500));
    expect(r.json().error.message).toBe(`Content-Encoding '${"x".repeat(120)}…' is not supported: send the request body uncompressed.`);
  });

  it("identity (or a list of identities), or no header, reaches the route (which knows no model here)", async () => {
    for (const encoding of ["identity", " Identity ", "identity, identity", undefined]) {
      const r = await post("/v3/chat/completions", encoding);
      expect(r.statusCode).not.toBe(415);
      expect(r.json().error.code).not.toBe("unsupported_content_encoding");
    }
  });
});
