/**
 * The request fields of the whole sampling set shared by chat and completions (vLLM/OpenAI names), their
 * validation, and their mapping to the protocol's {@link SamplingParams}. A field at its no-op value (penalty 0,
 * repetition 1, min_p 0, empty bias / stop ids, min_tokens 0) is not sent, so a request that uses none of them
 * runs on any engine; any other value needs the engine's `extendedSampling` capability (or the field in its
 * `samplingFields` list) or is refused (400).
 */
import { EXTENDED_FIELD_NAMES } from "./field-names.js";
import { z } from "zod";
import { LOGIT_BIAS_BAN, type EngineCapabilities, type SamplingParams } from "../../protocol/messages.js";
import { invalidValue, show, unsupportedField, type KeelHttpError } from "../http/errors.js";

/** Largest `n` per request (each choice is one engine request; OpenAI allows 128, a CPU server much less). */
export const MAX_N = 16;
/** Largest `top_logprobs` / integer `logprobs` the API accepts (OpenAI's 20); the engine may serve fewer. */
export const MAX_TOP_LOGPROBS = 20;

/** The extended sampling fields of a request, only those set to something other than their no-op value. */
export type ExtendedSampling = Pick<
  SamplingParams,
  "presencePenalty" | "frequencyPenalty" | "repetitionPenalty" | "minP" | "logitBias" | "minTokens" | "stopTokenIds" | "speculation"
>;

/** Largest `num_assistant_tokens` (draft tokens verified per step): past a few dozen a miss only wastes compute. */
export const MAX_ASSISTANT_TOKENS = 32;
/** Largest `max_ngram_size` (OVMS sets no bound; longer n-grams than this hardly ever match where shorter fail). */
export const MAX_NGRAM_SIZE = 16;
/** OVMS's `num_assistant_tokens` when a request sets only `max_ngram_size`, and its `max_ngram_size` default. */
const DEFAULT_ASSISTANT_TOKENS = 5;
const DEFAULT_NGRAM_SIZE = 3;

/** Human ranges, for error messages (merged into the request parser's range table). */
export const SAMPLING_RANGES: Record<string, string> = {
  presence_penalty: "must be between -2 and 2",
  frequency_penalty: "must be between -2 and 2",
  repetition_penalty: "must be greater than 0 and at most 1000000 (1 = off)",
  min_p: "must be between 0 and 1",
  min_tokens: "must be a non-negative integer",
  n: `must be an integer between 1 and ${MAX_N}`,
  num_assistant_tokens: `must be an integer between 0 and ${MAX_ASSISTANT_TOKENS} (0 = no prompt-lookup decoding for this request)`,
  max_ngram_size: `must be an integer between 1 and ${MAX_NGRAM_SIZE}`,
  top_logprobs: `must be an integer between 0 and ${MAX_TOP_LOGPROBS}`,
};

/**
 * `logit_bias`: OpenAI's object of token-id strings to a bias in -100..100. The error names the offending key, so
 * a client that sent words instead of token ids learns why.
 */

const logitBiasSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): [number, number][] => {
    if (v === undefined || v === null) return [];
    if (typeof v !== "object" || Array.isArray(v)) {
      ctx.addIssue({ code: "custom", message: "expected an object mapping token ids (as strings) to a bias between -100 and 100.", input: v, params: { kind: "invalid_type" } });
      return [];
    }
    const out: [number, number][] = [];
    for (const [key, bias] of Object.entries(v as Record<string, unknown>)) {
      if (!/^(0|[1-9][0-9]{0,9})$/.test(key) || Number(key) > 0x7fffffff) {
        const shown = key.length > 40 ? `${key.slice(0, 40)}…` : key;
        ctx.addIssue({ code: "custom", message: `key '${shown}' is not a token id; keys must be token ids written as decimal strings, e.g. {"1234": -100}.`, input: v, params: { kind: "invalid_value" } });
        return [];
      }
      if (typeof bias !== "number" || !Number.isFinite(bias) || bias < -100 || bias > 100) {
        ctx.addIssue({ code: "custom", message: `the bias of token ${key} must be a number between -100 and 100 (got ${show(bias)}).`, input: v, params: { kind: "invalid_value" } });
        return [];
      }
      if (bias !== 0) out.push([Number(key), bias]);
    }
    return out;
  });

/** zod fields of the sampling set (snake_case, as in the request body). */
export const samplingFields = {
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  repetition_penalty: z.number().gt(0).max(1e6).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  logit_bias: logitBiasSchema,
  min_tokens: z.number().int().min(0).max(0xffffffff).nullish(),
  stop_token_ids: z.array(z.number().int().min(0).max(0x7fffffff)).max(64).nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  n: z.number().int().min(1).max(MAX_N).nullish(),
  num_assistant_tokens: z.number().int().min(0).max(MAX_ASSISTANT_TOKENS).nullish(),
  max_ngram_size: z.number().int().min(1).max(MAX_NGRAM_SIZE).nullish(),
};

/** The parsed sampling fields, before mapping. */
export type SamplingFieldsBody = z.output<z.ZodObject<typeof samplingFields>>;

/** Map parsed fields to the extended protocol parameters, dropping no-op values. */
export function extendedSampling(b: SamplingFieldsBody): ExtendedSampling {
  const out: ExtendedSampling = {};
  if (b.presence_penalty != null && b.presence_penalty !== 0) out.presencePenalty = b.presence_penalty;
  if (b.frequency_penalty != null && b.frequency_penalty !== 0) out.frequencyPenalty = b.frequency_penalty;
  if (b.repetition_penalty != null && b.repetition_penalty !== 1) out.repetitionPenalty = b.repetition_penalty;
  if (b.min_p != null && b.min_p !== 0) out.minP = b.min_p;
  if (b.logit_bias && b.logit_bias.length > 0) out.logitBias = b.logit_bias;
  if (b.min_tokens != null && b.min_tokens !== 0) out.minTokens = b.min_tokens;
  if (b.stop_token_ids && b.stop_token_ids.length > 0) out.stopTokenIds = [...new Set(b.stop_token_ids)];
  // Prompt lookup (OVMS): either field asks for it for this request (num_assistant_tokens 0 turns it off); neither
  // leaves the server's --prompt_lookup default.
  if (b.num_assistant_tokens != null || b.max_ngram_size != null) {
    out.speculation = { numAssistantTokens: b.num_assistant_tokens ?? DEFAULT_ASSISTANT_TOKENS, maxNgramSize: b.max_ngram_size ?? DEFAULT_NGRAM_SIZE };
  }
  return out;
}

/**
 * A request that asks for prompt-lookup decoding itself (`num_assistant_tokens` > 0, or `max_ngram_size`) together
 * with log probabilities or a guide (response_format, a grammar, tool-guided generation) is refused: the engine verifies
 * drafts only for unguided requests without log probabilities, and a field must be applied or refused, never ignored.
 * The server default (`--prompt_lookup`) simply does not apply to those requests.
 */
export function checkSpeculation(ext: ExtendedSampling, withLogprobs: boolean, guided: boolean): KeelHttpError | null {
  if (!ext.speculation || ext.speculation.numAssistantTokens < 1) return null;
  const what = withLogprobs ? "log probabilities (logprobs)" : guided ? "a guide (response_format, a grammar or tool-guided generation)" : null;
  if (what === null) return null;
  return invalidValue("num_assistant_tokens", `Invalid value for 'num_assistant_tokens': prompt-lookup decoding (num_assistant_tokens, max_ngram_size) cannot be combined with ${what}; set num_assistant_tokens to 0 or leave both fields out.`);
}

/** `min_tokens` above the token budget can never be honoured: refused here, with the field named. */
export function checkMinTokens(ext: ExtendedSampling, maxTokens: number | null | undefined): void {
  if (ext.minTokens !== undefined && maxTokens != null && ext.minTokens > maxTokens) {
    throw invalidValue("min_tokens", `Invalid value for 'min_tokens': must not exceed the token budget (max_tokens ${maxTokens}), got ${ext.minTokens}.`);
  }
}

/**
 * Refuse what the current engine cannot do (instead of accepting and ignoring it): extended sampling fields without
 * `extendedSampling`, logprobs beyond `maxTopLogprobs`, token ids outside the vocabulary. Returns the error or null.
 */
export function checkCapabilities(
  ext: ExtendedSampling,
  logprobs: { param: string; n: number } | null,
  caps: EngineCapabilities,
  vocabSize: number,
  engineName?: string,
): KeelHttpError | null {
  const engine = engineName === undefined ? "The current engine" : `The current engine (${engineName})`;
  // Prompt lookup needs the capability unless the request turns it off (0 is what every engine does anyway).
  if (ext.speculation && ext.speculation.numAssistantTokens > 0 && caps.promptLookup !== true) {
    return unsupportedField("num_assistant_tokens", `${engine} does not apply prompt-lookup decoding (num_assistant_tokens, max_ngram_size); leave them out or set num_assistant_tokens to 0.`);
  }
  // Every extended field with extendedSampling; else only those the engine lists in samplingFields (the OpenVINO
  // engine applies penalties, min_p, min_tokens and stop ids but has no logit_bias).
  if (!caps.extendedSampling) {
    const applied = new Set(caps.samplingFields ?? []);
    const first = (Object.keys(ext) as (keyof ExtendedSampling)[]).find((k) => k !== "speculation" && !applied.has(k as never));
    if (first) return unsupportedField(EXTENDED_FIELD_NAMES[first], `${engine} does not apply this sampling parameter.`);
  }
  if (logprobs && logprobs.n > caps.maxTopLogprobs) {
    return caps.maxTopLogprobs < 0
      ? unsupportedField(logprobs.param, `${engine} does not compute log probabilities.`)
      : caps.maxTopLogprobs === 0
      ? invalidValue(logprobs.param, `Invalid value for '${logprobs.param}': ${engine.charAt(0).toLowerCase()}${engine.slice(1)} returns only the sampled token's log probability, no alternatives (got ${logprobs.n}); use 0, or serve with --engine llama.cpp for alternatives.`)
      : invalidValue(logprobs.param, `Invalid value for '${logprobs.param}': ${engine.charAt(0).toLowerCase()}${engine.slice(1)} serves at most ${caps.maxTopLogprobs} alternatives per token (got ${logprobs.n}).`);
  }
  let banned = 0;
  for (const [token, bias] of ext.logitBias ?? []) {
    if (token >= vocabSize) return invalidValue("logit_bias", `Invalid value for 'logit_bias': token id ${token} is outside the vocabulary (0..${vocabSize - 1}).`);
    if (bias <= LOGIT_BIAS_BAN) banned += 1;
  }
  // Every token banned (-100 bans, as OpenAI's): nothing may be generated, and a sampler would still pick one.
  if (banned >= vocabSize) return invalidValue("logit_bias", `Invalid value for 'logit_bias': it bans every token of the vocabulary (${vocabSize} tokens at -100), so nothing could be generated.`);
  for (const token of ext.stopTokenIds ?? []) {
    if (token >= vocabSize) return invalidValue("stop_token_ids", `Invalid value for 'stop_token_ids': token id ${token} is outside the vocabulary (0..${vocabSize - 1}).`);
  }
  return null;
}

/**
 * Seed of child `i` of a request with seed `seed`: child 0 keeps the request's seed (so `n: 1` is unchanged), the
 * others get distinct seeds derived deterministically (golden-ratio increments modulo 2^32), so the same seeded
 * request with `n > 1` gives the same choices again.
 */
export function childSeed(seed: number, i: number): number {
  return (seed + Math.imul(i, 0x9e3779b9)) >>> 0;
}
