/**
 * The gateway's single catalogue of HTTP errors.
 *
 * Every error a client can see is a {@link KeelHttpError} built by one of the
 * factory functions below, and is serialised with {@link toErrorBody} into the
 * OpenAI error envelope:
 *
 * ```json
 * {"error": {"message": "...", "type": "invalid_request_error", "code": "invalid_value", "param": "temperature"}}
 * ```
 *
 * `type` and `code` follow the OpenAI API's conventions where OpenAI has an
 * equivalent (`invalid_request_error`, `model_not_found`,
 * `context_length_exceeded`, `server_error`); the remaining codes are Keel's.
 * Messages never contain lone surrogates (see {@link sanitizeForJson}) and
 * client-supplied values echoed in them are truncated.
 *
 * @module
 */
import { sanitizeForJson } from "../requests/utf8-stream.js";

/** Values of {@link KeelHttpError.type}. */
export type KeelErrorType =
  | "invalid_request_error"
  | "rate_limit_error"
  | "service_unavailable_error"
  | "server_error";

/** Constructor argument of {@link KeelHttpError}. */
export interface KeelHttpErrorInit {
  /** HTTP status code, 400–599. */
  status: number;
  type: KeelErrorType;
  /** Stable machine-readable code, snake_case. */
  code: string;
  /** Human-readable message; sanitised on construction. */
  message: string;
  /** Request field the error is about, as a path (`messages[0].role`), or null. */
  param?: string | null;
}

/**
 * An error with everything needed to answer an HTTP request.
 *
 * Also exposes `statusCode` (same value as `status`) so Fastify's own error
 * handling picks the right status if the error reaches it unhandled.
 */
export class KeelHttpError extends Error {
  /** HTTP status code. */
  readonly status: number;
  /** OpenAI error `type`. */
  readonly type: KeelErrorType;
  /** Stable machine-readable code (OpenAI `code`). */
  readonly code: string;
  /** Offending request field path, e.g. `messages[0].content[1].type`; null when not about one field. */
  readonly param: string | null;

  constructor(init: KeelHttpErrorInit) {
    super(sanitizeForJson(init.message));
    this.name = "KeelHttpError";
    this.status = init.status;
    this.type = init.type;
    this.code = init.code;
    this.param = init.param ?? null;
  }

  /** Alias of {@link KeelHttpError.status} for Fastify. */
  get statusCode(): number {
    return this.status;
  }
}

/** Longest client-supplied value echoed into a message, in UTF-16 units. */
const MAX_ECHO = 120;

/**
 * Quotes a client-supplied string for inclusion in an error message:
 * truncated to {@link MAX_ECHO} units (with `…`) and wrapped in single quotes.
 */
export function quoteClientValue(value: string): string {
  let v = value;
  if (v.length > MAX_ECHO) {
    v = v.slice(0, MAX_ECHO);
    // do not cut a surrogate pair in half
    if (/[\uD800-\uDBFF]$/.test(v)) v = v.slice(0, -1);
    v += "…";
  }
  return `'${sanitizeForJson(v)}'`;
}

// ---------------------------------------------------------------- 4xx: request

/** 400 `invalid_json`: the body is empty or not parsable JSON. `detail` is appended when given. */
export function invalidJson(detail?: string): KeelHttpError {
  const base = "We could not parse the JSON body of your request.";
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "invalid_json",
    message: detail ? `${base} ${detail}` : `${base} (The request body must be a JSON object.)`,
  });
}

/**
 * 400 `invalid_value`: a field is present but has the wrong type or value.
 * @param param - Field path, or null when the whole body is at fault.
 * @param message - Full message, e.g. `Invalid value for 'temperature': must be between 0 and 2.`
 */
export function invalidValue(param: string | null, message: string): KeelHttpError {
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code: "invalid_value", message, param });
}

/** 400 `missing_field`: a required field is absent. Message: `Missing required parameter: '<param>'.` */
export function missingField(param: string): KeelHttpError {
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "missing_field",
    message: `Missing required parameter: '${param}'.`,
    param,
  });
}

/**
 * 400 `unknown_field`: a top-level request field this route does not know (a typo such as `max_token`, or another
 * server's extension). OpenAI's message, plus the closest known field when one is near.
 */
export function unknownField(param: string, suggestion?: string): KeelHttpError {
  const hint = suggestion === undefined ? "" : ` Did you mean '${suggestion}'?`;
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "unknown_field",
    message: `Unrecognized request argument supplied: ${quoteClientValue(param)}.${hint}`,
    param: sanitizeForJson(param.slice(0, MAX_ECHO)),
  });
}

/**
 * 400 `unsupported_field`: an OpenAI field Keel recognises but does not
 * implement was given a value other than its no-op default.
 * @param reason - Optional sentence appended to the standard message.
 */
export function unsupportedField(param: string, reason?: string): KeelHttpError {
  const base = `Unsupported parameter: '${param}' is not supported by this server.`;
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "unsupported_field",
    message: reason ? `${base} ${reason}` : base,
    param,
  });
}

/**
 * 400 `unsupported_field` on `tools`: the request has tools to call (tool_choice not `none`) but the server parses
 * no tool-call format, so the calls would come back as plain text. Refused rather than accepted and ignored.
 * @param autoFoundNone - `--tool_parser auto` was given but the model's template shows no known format.
 */
export function toolsNotServed(autoFoundNone: boolean): KeelHttpError {
  const why = autoFoundNone
    ? "the server was started with --tool_parser auto, but the model's chat template shows no tool-call format Keel knows"
    : "the server was started without --tool_parser";
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "unsupported_field",
    message: `'tools' needs a tool-call parser on this server: ${why}. Start the server with --tool_parser hermes3, qwen3coder or llama3 (the model's format) or auto (read from its chat template), or send tool_choice 'none'.`,
    param: "tools",
  });
}

/** 400 `unsupported_field`: the request needs constrained generation (`param`) and the engine cannot apply a grammar. */
export function guidedNotSupported(param: string): KeelHttpError {
  return unsupportedField(param, "This engine cannot constrain generation with a grammar (capability 'grammars'), which this request needs.");
}

/** 400 `template_error`: the model's chat template failed on this request. */
export function templateError(detail: string): KeelHttpError {
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "template_error",
    message: `Error applying the chat template: ${detail}`,
    param: "messages",
  });
}

/**
 * 400 `context_length_exceeded` (OpenAI code), param `messages`.
 * @param contextLength - Model context size, tokens.
 * @param promptTokens - Tokens in the rendered prompt.
 * @param maxTokens - Requested completion budget, tokens, when it is what overflowed.
 * @param messages - The number of messages, when there are more of them than the context holds tokens (each
 *   renders to one token or more).
 */
export function contextLengthExceeded(contextLength: number, promptTokens: number, maxTokens?: number, messages?: number): KeelHttpError {
  const asked =
    messages !== undefined
      ? `your ${messages} messages render to at least ${messages} tokens, which leaves no room for the completion`
      : maxTokens === undefined
      ? `your messages resulted in ${promptTokens} tokens`
      : `you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion)`;
  return new KeelHttpError({
    status: 400,
    type: "invalid_request_error",
    code: "context_length_exceeded",
    message: `This model's maximum context length is ${contextLength} tokens. However, ${asked}. Please reduce the length of the messages or completion.`,
    param: "messages",
  });
}

/**
 * A `context_length_exceeded` answer (the gateway's or an engine's, which speak of messages) for an API whose prompt
 * field is not `messages`: `/v1/completions` takes `prompt`, the Responses API `input`. Other errors are unchanged.
 */
export function contextLengthFor(error: KeelHttpError, field: "prompt" | "input"): KeelHttpError {
  if (error.code !== "context_length_exceeded" || error.param !== "messages") return error;
  const message = error.message.replace(/your messages resulted in/g, `your ${field} resulted in`).replace(/in the messages/g, `in the ${field}`).replace(/the length of the messages/g, `the length of the ${field}`);
  return new KeelHttpError({ status: error.status, type: error.type, code: error.code, message, param: field });
}

/** 404 `model_not_found` (OpenAI code), param `model`; `served` (when given) are named in the message. */
export function modelNotFound(model: string, served?: readonly string[]): KeelHttpError {
  return new KeelHttpError({
    status: 404,
    type: "invalid_request_error",
    code: "model_not_found",
    message: `The model ${quoteClientValue(model)} does not exist.${served && served.length > 0 ? ` Served models: ${served.map((n) => JSON.stringify(n)).join(", ")}.` : ""}`,
    param: "model",
  });
}

/**
 * 401 `invalid_api_key` (OpenAI's answer): the server has an API key and the request's `Authorization: Bearer` is
 * missing or wrong. OVMS answers 500 here; Keel keeps OpenAI's status so clients see an authentication failure.
 */
export function invalidApiKey(present: boolean): KeelHttpError {
  return new KeelHttpError({
    status: 401,
    type: "invalid_request_error",
    code: "invalid_api_key",
    message: present ? "Incorrect API key provided in the Authorization or x-api-key header." : "Missing API key: send the header Authorization: Bearer <key> (or x-api-key: <key>).",
  });
}

/** 400 `invalid_url`: the request's URL cannot be decoded (e.g. a bad percent escape in a path parameter). */
export function invalidUrl(path: string): KeelHttpError {
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code: "invalid_url", message: `The request URL ${quoteClientValue(path)} is not valid (bad percent-encoding).` });
}

/** 404 `route_not_found`: no route has this path (a known path with another method is a 405); short, naming no route list. */
export function routeNotFound(method: string, path: string): KeelHttpError {
  return new KeelHttpError({
    status: 404,
    type: "invalid_request_error",
    code: "route_not_found",
    message: `No route for ${quoteClientValue(method)} ${quoteClientValue(path)}. The API is served under /v1/, /v3/ and /v3/v1/ (e.g. POST /v1/chat/completions; routes: docs/api.md).`,
  });
}

/**
 * 405 `method_not_allowed`: the path exists but not for this method.
 * The caller should also send an `Allow` header listing `allowed`.
 */
export function methodNotAllowed(method: string, path: string, allowed: readonly string[]): KeelHttpError {
  return new KeelHttpError({
    status: 405,
    type: "invalid_request_error",
    code: "method_not_allowed",
    message: `Method ${quoteClientValue(method)} is not allowed on ${quoteClientValue(path)}. Allowed: ${allowed.join(", ")}.`,
  });
}

/** 413 `request_too_large`: the body exceeds the configured limit (bytes). */
export function requestTooLarge(limitBytes: number): KeelHttpError {
  return new KeelHttpError({
    status: 413,
    type: "invalid_request_error",
    code: "request_too_large",
    message: `The request body exceeds the limit of ${limitBytes} bytes.`,
  });
}

/** 415 `unsupported_media_type`: the body is not `application/json`. */
export function unsupportedMediaType(): KeelHttpError {
  return new KeelHttpError({
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_media_type",
    message: "The request body must be sent with Content-Type: application/json.",
  });
}

/** 415 `unsupported_content_encoding`: a compressed body (`Content-Encoding` other than identity), which Keel does not decode. */
export function unsupportedContentEncoding(encoding: string): KeelHttpError {
  return new KeelHttpError({
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_content_encoding",
    message: `Content-Encoding ${quoteClientValue(encoding.trim())} is not supported: send the request body uncompressed.`,
  });
}

/**
 * The answer to a connection-level client error that Node reports before any route runs (`clientError`): a request
 * not sent within --request_timeout (408 `request_timeout`), headers too large (431 `headers_too_large`), or a
 * request that is not HTTP (400 `malformed_request`).
 */
export function clientConnectionError(nodeCode: string | undefined): KeelHttpError {
  if (nodeCode === "ERR_HTTP_REQUEST_TIMEOUT") {
    return new KeelHttpError({ status: 408, type: "invalid_request_error", code: "request_timeout", message: "The request (headers and body) was not received within the server's request timeout." });
  }
  if (nodeCode === "HPE_HEADER_OVERFLOW") {
    return new KeelHttpError({ status: 431, type: "invalid_request_error", code: "headers_too_large", message: "The request headers are too large." });
  }
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code: "malformed_request", message: "The request is not valid HTTP." });
}

/** 429 `queue_full`: the admission queue is at capacity; the client should retry later. */
export function queueFull(): KeelHttpError {
  return new KeelHttpError({
    status: 429,
    type: "rate_limit_error",
    code: "queue_full",
    message: "The server is at capacity and its request queue is full. Please retry after a short wait.",
  });
}

// ---------------------------------------------------------------- 5xx: server

/** 503 `not_ready`: the model is still loading (or failed to load). */
export function notReady(): KeelHttpError {
  return new KeelHttpError({
    status: 503,
    type: "service_unavailable_error",
    code: "not_ready",
    message: "The server is not ready yet: the model is still loading. Please retry shortly.",
  });
}

/** 503 while the server drains for shutdown (graceful SIGTERM/SIGINT). */
/** The one wording of the shutdown answer (new requests and in-flight ones ended by the drain alike). */
export const SHUTTING_DOWN_MESSAGE = "The server is shutting down.";

export function shuttingDown(message = SHUTTING_DOWN_MESSAGE): KeelHttpError {
  return new KeelHttpError({ status: 503, type: "service_unavailable_error", code: "shutting_down", message });
}

/** 503 while a crashed or stalled engine restarts and in-flight requests are being resumed. */
export function engineRestarting(): KeelHttpError {
  return new KeelHttpError({
    status: 503,
    type: "service_unavailable_error",
    code: "engine_restarting",
    message: "The engine is restarting after a fault; in-flight requests are being resumed. Please retry shortly.",
  });
}

/** 500 for a request isolated as the one whose presence crashes the engine (docs/fault-injection.md). */
export function engineFault(message: string): KeelHttpError {
  return new KeelHttpError({ status: 500, type: "server_error", code: "engine_fault", message });
}

/** 417 for an `Expect` header other than `100-continue`. */
export function expectationFailed(expect: string): KeelHttpError {
  return new KeelHttpError({ status: 417, type: "invalid_request_error", code: "expectation_failed", message: `Unsupported Expect header: ${expect.slice(0, 100)}` });
}

/**
 * 500 `engine_error`: the inference engine failed on this request.
 * @param detail - Safe, client-facing detail; must not contain stack traces or paths.
 */
export function engineError(detail?: string): KeelHttpError {
  return new KeelHttpError({
    status: 500,
    type: "server_error",
    code: "engine_error",
    message: detail ? `The inference engine failed: ${detail}` : "The inference engine failed while processing your request.",
  });
}

/** 500 `internal_error`: anything unexpected. The message is fixed and reveals nothing. */
export function internalError(): KeelHttpError {
  return new KeelHttpError({
    status: 500,
    type: "server_error",
    code: "internal_error",
    message: "The server had an internal error while processing your request.",
  });
}

/** "a string", "null", "an integer", "a decimal", … — the JSON type of `v` for messages. */
export function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  switch (typeof v) {
    case "string":
      return "a string";
    case "boolean":
      return "a boolean";
    case "number":
      // JSON.parse reads a literal beyond the double range (1e309) as ±Infinity.
      if (!Number.isFinite(v)) return "a value beyond the range of a double (read as Infinity)";
      return Number.isInteger(v) ? "an integer" : "a decimal";
    case "object":
      return "an object";
    default:
      return typeof v;
  }
}

/** Renders a client value for a message: strings quoted and truncated, numbers as is. */
export function show(v: unknown): string {
  if (typeof v === "string") return quoteClientValue(v);
  if (typeof v === "number" || typeof v === "boolean" || v === null) return String(v);
  return describe(v);
}

/** 400 `invalid_config`: `POST /v1/config/reload` read a configuration it cannot apply; nothing changed. */
export function invalidConfig(reason: string): KeelHttpError {
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code: "invalid_config", message: `The configuration was not reloaded (nothing changed): ${reason}`, param: null });
}

/** 400 `no_config_file`: a reload on a server started without `--config_path` (its model comes from flags). */
export function noConfigFile(): KeelHttpError {
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code: "no_config_file", message: "This server was not started with --config_path; there is no configuration to reload.", param: null });
}
