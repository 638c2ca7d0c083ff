/**
 * Any thrown value → the catalogued error (errors.ts) and its OpenAI envelope: what the HTTP app's error handler
 * and the generation pipeline answer when something other than a {@link KeelHttpError} was thrown.
 */
import { internalError, invalidJson, KeelHttpError, requestTooLarge, unsupportedMediaType } from "./errors.js";

/** The OpenAI error envelope. */
export interface ErrorBody {
  error: { message: string; type: string; code: string; param: string | null };
}

function fastifyStatus(err: object): number | undefined {
  const s = (err as { statusCode?: unknown }).statusCode;
  return typeof s === "number" && Number.isInteger(s) ? s : undefined;
}

/**
 * Normalises any thrown value into a {@link KeelHttpError}.
 *
 * - `KeelHttpError` → itself.
 * - Fastify body-parsing errors → `invalidJson` (empty or malformed JSON, incl.
 *   prototype-poisoning keys), `requestTooLarge` (`FST_ERR_CTP_BODY_TOO_LARGE`;
 *   the limit is not known here and is reported as `bodyLimitBytes`), or
 *   `unsupportedMediaType`.
 * - Other errors carrying a 4xx `statusCode` with a Fastify `FST_` code →
 *   400-class `invalid_request_error` with Fastify's (fixed, safe) message.
 * - Anything else → {@link internalError}; the original message and stack
 *   are not exposed (log them separately).
 *
 * @param bodyLimitBytes - Configured body limit, used in the 413 message.
 */
export function toHttpError(err: unknown, bodyLimitBytes = 0): KeelHttpError {
  if (err instanceof KeelHttpError) return err;
  if (typeof err !== "object" || err === null) return internalError();
  const code = (err as { code?: unknown }).code;
  const status = fastifyStatus(err);
  switch (code) {
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return invalidJson();
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return invalidJson("(The request body is empty.)");
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return requestTooLarge(bodyLimitBytes);
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return unsupportedMediaType();
  }
  if (err instanceof SyntaxError && status === 400) return invalidJson();
  if (typeof code === "string" && code.startsWith("FST_") && status !== undefined && status >= 400 && status < 500) {
    return new KeelHttpError({
      status,
      type: "invalid_request_error",
      code: code.slice(4).toLowerCase(),
      message: err instanceof Error ? err.message : "Bad request.",
    });
  }
  return internalError();
}

/**
 * Builds the OpenAI error envelope for any thrown value (see
 * {@link toHttpError} for the mapping). The result is always safe to
 * `JSON.stringify`; use `toHttpError(err).status` for the status code.
 */
export function toErrorBody(err: unknown): ErrorBody {
  const e = toHttpError(err);
  return { error: { message: e.message, type: e.type, code: e.code, param: e.param } };
}

/** Anthropic's error envelope (the `/messages` routes): `{"type":"error","error":{"type":…,"message":…}}`. */
export interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}

/**
 * Anthropic's error `type` for a catalogued error, by its HTTP status (Anthropic's table): 401
 * `authentication_error`, 403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
 * `rate_limit_error`, 503 `overloaded_error` (the server is loading, restarting or draining: retry), any other 5xx
 * `api_error`, any other 4xx `invalid_request_error`. The message is the catalogue's.
 */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
  }
  return status >= 500 ? "api_error" : "invalid_request_error";
}

/** Anthropic's error envelope for any thrown value (the same catalogued error as {@link toErrorBody}). */
export function toAnthropicErrorBody(err: unknown): AnthropicErrorBody {
  const e = toHttpError(err);
  return { type: "error", error: { type: anthropicErrorType(e.status), message: e.message } };
}
