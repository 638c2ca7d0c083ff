/**
 * Validation of gateway → engine messages on the engine side, with the schemas of gateway-schema.ts (the gateway
 * checks engine → gateway messages with engine-validator.ts). A message that fails validation is answered with a
 * protocol error — or, for an `add` whose envelope is sound but whose sampling parameters are not, with a
 * `request_error` (`invalid_params`) for that id. It never throws past this module.
 */
import type { z } from "zod";
import { gatewayMessage, samplingParams } from "./gateway-schema.js";
import { protocolJsonSchema } from "./json-schema.js";
import { compile } from "./schema-validator.js";
import { PROTOCOL_VERSION, type GatewayMessage, type SamplingParams } from "./messages.js";

export { MAX_GUIDE_GRAMMAR_BYTES } from "./checks.js";

/** Outcome of {@link parseGatewayMessage}. */
export type ParsedGatewayMessage =
  | { ok: true; message: GatewayMessage }
  /** Not a message: answer with `protocol_error`. */
  | { ok: false; error: string }
  /** A sound `add` with unusable sampling parameters: answer with `request_error` `invalid_params` for `id`. */
  | { ok: false; error: string; refuse: { id: string; code: "invalid_params" } };

function describe(issues: readonly z.core.$ZodIssue[]): string {
  const first = issues[0];
  return `${first?.path.join(".") ?? ""} ${first?.message ?? ""}`.trim();
}

/**
 * The same schemas compiled from their JSON Schema (protocol.schema.json, generated from gateway-schema.ts; what the
 * gateway checks engine frames with): ~20× faster than zod on an add with a logit bias, so a sound add costs its
 * first token tens of microseconds, not hundreds.
 */
const compiledSchema = protocolJsonSchema().$defs;
const compiledMessage = compile(compiledSchema.gatewayMessage);
const compiledParams = compile(compiledSchema.samplingParams);

/**
 * Parse a decoded frame as a gateway → engine message, or say why it is not one. A message the compiled schema
 * accepts is taken as decoded; anything else goes through zod ({@link parseWithZod}), whose verdict and message
 * stand (the two accept the same messages: validate.test.ts).
 */
export function parseGatewayMessage(raw: Record<string, unknown>): ParsedGatewayMessage {
  if (raw["v"] !== PROTOCOL_VERSION) {
    return { ok: false, error: `unsupported protocol version ${JSON.stringify(raw["v"])} (expected ${PROTOCOL_VERSION})` };
  }
  if (compiledMessage(raw) === null && (raw["type"] !== "add" || compiledParams(raw["params"]) === null)) return { ok: true, message: raw as unknown as GatewayMessage };
  return parseWithZod(raw);
}

/** Parse with the zod schemas alone: the reference verdict, and every refusal's message. */
export function parseWithZod(raw: Record<string, unknown>): ParsedGatewayMessage {
  if (raw["v"] !== PROTOCOL_VERSION) {
    return { ok: false, error: `unsupported protocol version ${JSON.stringify(raw["v"])} (expected ${PROTOCOL_VERSION})` };
  }
  const result = gatewayMessage.safeParse(raw);
  if (!result.success) return { ok: false, error: `invalid ${String(raw["type"])} message: ${describe(result.error.issues)}` };
  if (result.data.type !== "add") return { ok: true, message: result.data as GatewayMessage };
  const params = samplingParams.safeParse(result.data.params);
  if (!params.success) {
    const first = params.error.issues[0];
    const where = ["params", ...(first?.path ?? []).map(String)].join(".");
    const error = `invalid sampling parameters: ${where} ${first?.message ?? ""}`.trim();
    return { ok: false, error, refuse: { id: result.data.id, code: "invalid_params" } };
  }
  return { ok: true, message: { ...result.data, params: params.data } as GatewayMessage };
}

/** What the engine serves, for the parameter checks that depend on it. */
export interface EngineParamLimits {
  vocabSize: number;
  /** Largest `logprobs` served; -1 = none. */
  maxTopLogprobs: number;
  /** Whether `guide` is applied (capabilities.grammars); absent = false. */
  grammars?: boolean;
}

/**
 * A param the engine cannot serve, and why; `param` names the field when its value is at fault (protocol
 * `request_error.param`), not when the engine serves the field not at all (its capabilities say that).
 */
export interface ParamRefusal {
  param?: keyof SamplingParams;
  message: string;
}

/** Checks of range-valid params against the engine (token ids in the vocabulary, logprobs cap); null when fine. */
export function checkSamplingParams(p: SamplingParams, limits: EngineParamLimits): ParamRefusal | null {
  const outside = (ids: readonly number[]): number | undefined => ids.find((t) => t >= limits.vocabSize);
  const badBias = outside((p.logitBias ?? []).map(([t]) => t));
  if (badBias !== undefined) return { param: "logitBias", message: `logitBias token ${badBias} is outside the vocabulary (${limits.vocabSize})` };
  const badStop = outside(p.stopTokenIds ?? []);
  if (badStop !== undefined) return { param: "stopTokenIds", message: `stopTokenIds token ${badStop} is outside the vocabulary (${limits.vocabSize})` };
  if (p.guide && !limits.grammars) return { message: "this engine does not apply guides (capabilities.grammars is false)" };
  if (p.logprobs != null && p.logprobs > limits.maxTopLogprobs) {
    if (limits.maxTopLogprobs < 0) return { message: "this engine does not serve log probabilities" };
    return { param: "logprobs", message: `logprobs ${p.logprobs} exceeds the engine's maximum of ${limits.maxTopLogprobs}` };
  }
  return null;
}
