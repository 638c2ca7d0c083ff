/**
 * The one mapping of an engine's refusals and failures (protocol `request_error`, `finish.error`) to HTTP errors: the
 * closed catalogue of protocol/messages.ts ENGINE_ERROR_CODES in, the catalogued KeelHttpError out (errors.ts).
 */
import type { EngineErrorCode } from "../../protocol/messages.js";
import { apiFieldOf } from "../api/field-names.js";
import { engineError, invalidValue, KeelHttpError } from "./errors.js";

/**
 * 400 for an `add` the engine refused (protocol `request_error`): its message already names the numbers.
 * `context_length_exceeded` keeps OpenAI's code and points at `messages`; a refusal of a value the client sent in a
 * field (engines name it in `param`) answers like the gateway's own check of that value (`invalid_value`, `param`).
 */
export function engineRefusal(code: string, message: string, param?: string): KeelHttpError {
  // `guide` and `logprobs` come from different request fields per API: those stay unnamed.
  const field = param === undefined ? undefined : apiFieldOf(param);
  if (field) return invalidValue(field, message);
  if (code !== "context_length_exceeded") return new KeelHttpError({ status: 400, type: "invalid_request_error", code, message, param: null });
  // The engines state the numbers; what to do is said as the gateway's own check says it (OpenAI's and vLLM's words).
  const advice = message.startsWith("This model's maximum context length") && !message.includes("Please reduce") ? " Please reduce the length of the messages or completion." : "";
  return new KeelHttpError({ status: 400, type: "invalid_request_error", code, message: message + advice, param: "messages" });
}

/**
 * The one mapping of the protocol's closed engine error catalogue (protocol/messages.ts ENGINE_ERROR_CODES) to HTTP:
 *   context_length_exceeded, invalid_prompt, invalid_params → 400 (the request is at fault; {@link engineRefusal})
 *   duplicate_id → 409 (an id the engine already holds)
 *   engine_error, invariant_violation → 500 `engine_error` (the engine failed the request)
 *   any other code → 500 `engine_error` (an engine must not invent codes; treated as a failure)
 */
export function engineErrorToHttp(code: string, message: string, param?: string): KeelHttpError {
  switch (code as EngineErrorCode) {
    case "context_length_exceeded":
    case "invalid_prompt":
    case "invalid_params":
      return engineRefusal(code, message, param);
    case "duplicate_id":
      return new KeelHttpError({ status: 409, type: "invalid_request_error", code, message });
    case "engine_error":
    case "invariant_violation":
      return engineError(message);
    default:
      return engineError(message);
  }
}
