import { describe, expect, it } from "vitest";
import Fastify from "fastify";
import {
  KeelHttpError,
  contextLengthExceeded,
  engineError,
  internalError,
  invalidJson,
  invalidValue,
  methodNotAllowed,
  missingField,
  modelNotFound,
  invalidConfig,
  noConfigFile,
  notReady,
  queueFull,
  quoteClientValue,
  requestTooLarge,
  routeNotFound,
  templateError,
  unsupportedField,
  unsupportedContentEncoding,
  unsupportedMediaType,
} from "./errors.js";
import { toErrorBody, toHttpError } from "./error-envelope.js";

describe("error factories", () => {
  it.each([
    ["invalidJson", invalidJson(), 400, "invalid_request_error", "invalid_json", null],
    ["invalidValue", invalidValue("messages[0].role", "x"), 400, "invalid_request_error", "invalid_value", "messages[0].role"],
    ["missingField", missingField("model"), 400, "invalid_request_error", "missing_field", "model"],
    ["unsupportedField", unsupportedField("tools"), 400, "invalid_request_error", "unsupported_field", "tools"],
    ["templateError", templateError("boom"), 400, "invalid_request_error", "template_error", "messages"],
    ["contextLengthExceeded", contextLengthExceeded(4096, 5000), 400, "invalid_request_error", "context_length_exceeded", "messages"],
    ["modelNotFound", modelNotFound("gpt-x"), 404, "invalid_request_error", "model_not_found", "model"],
    ["routeNotFound", routeNotFound("GET", "/nope"), 404, "invalid_request_error", "route_not_found", null],
    ["methodNotAllowed", methodNotAllowed("PUT", "/v3/models", ["GET"]), 405, "invalid_request_error", "method_not_allowed", null],
    ["requestTooLarge", requestTooLarge(1024), 413, "invalid_request_error", "request_too_large", null],
    ["unsupportedMediaType", unsupportedMediaType(), 415, "invalid_request_error", "unsupported_media_type", null],
    ["unsupportedContentEncoding", unsupportedContentEncoding("gzip"), 415, "invalid_request_error", "unsupported_content_encoding", null],
    ["queueFull", queueFull(), 429, "rate_limit_error", "queue_full", null],
    ["engineError", engineError(), 500, "server_error", "engine_error", null],
    ["notReady", notReady(), 503, "service_unavailable_error", "not_ready", null],
    ["internalError", internalError(), 500, "server_error", "internal_error", null],
    ["invalidConfig", invalidConfig("bad"), 400, "invalid_request_error", "invalid_config", null],
    ["noConfigFile", noConfigFile(), 400, "invalid_request_error", "no_config_file", null],
  ] as const)("%s has the catalogued status, type, code and param", (_n, err, status, type, code, param) => {
    expect(err).toBeInstanceOf(KeelHttpError);
    expect(err).toBeInstanceOf(Error);
    expect(err.status).toBe(status);
    expect(err.statusCode).toBe(status);
    expect(err.type).toBe(type);
    expect(err.code).toBe(code);
    expect(err.param).toBe(param);
    expect(err.message.length).toBeGreaterThan(0);
  });

  it("model_not_found names the served models when given, and the reason of a refused reload is in its message", () => {
    expect(modelNotFound("x", ["a", "b/c"]).message).toBe('The model \'x\' does not exist. Served models: "a", "b/c".');
    expect(modelNotFound("x").message).toBe("The model 'x' does not exist.");
    expect(invalidConfig("model \"a\": max_num_seqs must be an integer").message).toContain('nothing changed): model "a": max_num_seqs must be an integer');
  });

  it("names the field in missing-field messages", () => {
    expect(missingField("messages[2].role").message).toBe("Missing required parameter: 'messages[2].role'.");
  });

  it("reports both parts of an overflowing request", () => {
    expect(contextLengthExceeded(4096, 4000, 200).message).toContain("you requested 4200 tokens (4000 in the messages, 200 in the completion)");
    expect(contextLengthExceeded(4096, 5000).message).toContain("your messages resulted in 5000 tokens");
    expect(contextLengthExceeded(4, 4, undefined, 4).message).toContain("your 4 messages render to at least 4 tokens, which leaves no room for the completion");
  });

  it("replaces lone surrogates in messages", () => {
    const e = invalidValue("stop", "bad \uD800 value");
    expect(e.message).toBe("bad \uFFFD value");
    expect(JSON.stringify(toErrorBody(e))).not.toMatch(/\\ud800/i);
  });

  it("truncates long client values echoed into messages", () => {
    const e = modelNotFound("m".repeat(10_000));
    expect(e.message.length).toBeLessThan(200);
    expect(e.message).toContain("…");
    // a cut never leaves half a surrogate pair behind
    expect(quoteClientValue("a".repeat(119) + "😀😀")).toBe(`'${"a".repeat(119)}…'`);
  });
});

describe("toErrorBody / toHttpError", () => {
  it("serialises a KeelHttpError as the OpenAI envelope", () => {
    expect(toErrorBody(invalidValue("temperature", "Invalid value for 'temperature': must be between 0 and 2."))).toEqual({
      error: {
        message: "Invalid value for 'temperature': must be between 0 and 2.",
        type: "invalid_request_error",
        code: "invalid_value",
        param: "temperature",
      },
    });
  });

  it("hides unknown errors behind a generic 500 without message or stack", () => {
    const secret = new Error("ENOENT: /home/keel/models/secret.gguf");
    const body = toErrorBody(secret);
    expect(toHttpError(secret).status).toBe(500);
    expect(body.error.code).toBe("internal_error");
    expect(body.error.type).toBe("server_error");
    expect(JSON.stringify(body)).not.toContain("secret");
    expect(JSON.stringify(body)).not.toContain("at ");
  });

  it.each([null, undefined, "string", 42, { statusCode: 400 }])("maps the non-error %j to a 500", (v) => {
    expect(toHttpError(v).status).toBe(500);
  });

  it("does not trust statusCode on foreign errors", () => {
    const e = Object.assign(new Error("internal detail"), { statusCode: 404 });
    expect(toHttpError(e).status).toBe(500);
  });

  describe("maps Fastify's own errors (real server)", () => {
    async function inject(payload: string, headers: Record<string, string>, bodyLimit = 1_000_000) {
      const app = Fastify({ bodyLimit });
      app.post("/x", async () => ({ ok: true }));
      app.setErrorHandler((err, _req, reply) => {
        const e = toHttpError(err, bodyLimit);
        return reply.status(e.status).send(toErrorBody(e));
      });
      const res = await app.inject({ method: "POST", url: "/x", payload, headers });
      await app.close();
      return { status: res.statusCode, body: res.json() as { error: { code: string } } };
    }

    it("malformed JSON → 400 invalid_json", async () => {
      const r = await inject("{not json", { "content-type": "application/json" });
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe("invalid_json");
    });

    it("empty JSON body → 400 invalid_json", async () => {
      const r = await inject("", { "content-type": "application/json" });
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe("invalid_json");
    });

    it("prototype poisoning → 400 invalid_json", async () => {
      const r = await inject('{"__proto__":{"x":1}}', { "content-type": "application/json" });
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe("invalid_json");
    });

    it("body over the limit → 413 request_too_large", async () => {
      const r = await inject(JSON.stringify({ a: "x".repeat(200) }), { "content-type": "application/json" }, 100);
      expect(r.status).toBe(413);
      expect(r.body.error.code).toBe("request_too_large");
    });

    it("wrong content type → 415 unsupported_media_type", async () => {
      const r = await inject("<xml/>", { "content-type": "application/xml" });
      expect(r.status).toBe(415);
      expect(r.body.error.code).toBe("unsupported_media_type");
    });
  });
});
