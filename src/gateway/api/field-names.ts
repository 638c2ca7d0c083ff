/**
 * The request field behind each extended sampling parameter of the engine protocol (`params.logitBias` is the
 * client's `logit_bias` in chat and completions alike): how a refusal about one names the client's field.
 */
import type { ExtendedSampling } from "./sampling.js";

export const EXTENDED_FIELD_NAMES: Readonly<Record<keyof ExtendedSampling, string>> = {
  presencePenalty: "presence_penalty",
  frequencyPenalty: "frequency_penalty",
  repetitionPenalty: "repetition_penalty",
  minP: "min_p",
  logitBias: "logit_bias",
  minTokens: "min_tokens",
  stopTokenIds: "stop_token_ids",
  speculation: "num_assistant_tokens",
};

/** The client's field for a protocol `params` field, when every API spells it one way; undefined otherwise. */
export function apiFieldOf(param: string): string | undefined {
  return Object.hasOwn(EXTENDED_FIELD_NAMES, param) ? EXTENDED_FIELD_NAMES[param as keyof ExtendedSampling] : undefined;
}
