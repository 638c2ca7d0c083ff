/**
 * Validation of `POST /v3/chat/completions` (and `/v1/chat/completions`)
 * bodies into a normalised {@link ChatRequest}.
 *
 * Follows the OpenAI Chat Completions request schema, with the value ranges
 * OpenVINO Model Server enforces (e.g. `seed` and `max_tokens` are uint32),
 * and rejects — rather than silently ignores — the OpenAI features Keel does
 * not implement. Conventions:
 *
 * - `null` for an optional field means "not set" (the OpenAI schema marks
 *   these fields nullable and some clients send explicit nulls).
 * - Unknown top-level fields are refused (400 `unknown_field`, known-fields.ts): the known ones are this schema's.
 * - The first problem found (in field order) is reported as a 400
 *   {@link KeelHttpError} whose `param` is the field path, e.g.
 *   `messages[0].content[1].type`.
 * - Lone UTF-16 surrogates (legal in JSON as `"\ud800"`) never reach here: the HTTP door refuses a body holding one
 *   (400 naming the field, http/lone-surrogate.ts), so every string downstream is well-formed.
 *
 * @module
 */
import { z } from "zod";
import type { ChatMessage } from "../models/chat-template.js";
import { KeelHttpError, invalidValue, show, unsupportedField } from "../http/errors.js";
import { parseMessageExtras, responseFormatSchema, toolChoiceSchema, toolsSchema } from "./tool-fields.js";
import type { ResponseFormat, ToolChoice, ToolSpec } from "../tools.js";
import { describe, issueToError, RANGES, report, UINT32_MAX, type IssueCtx } from "./request-issues.js";
import { checkMinTokens, extendedSampling, MAX_TOP_LOGPROBS, samplingFields, type ExtendedSampling } from "./sampling.js";
import { outputConstraint, structuredOutputFields } from "./structured-outputs.js";
import { checkKnownFields, fieldsOf } from "./known-fields.js";

export { describe, issueToError, report, UINT32_MAX };

/** A validated chat-completion request, with defaults applied. */
/** The fields chat and completions share: how to generate, whatever the prompt. */
export interface GenerationFields {
  /** Model name as sent (not yet resolved). */
  model: string;
  /** Server-sent events response. Default false. */
  stream: boolean;
  /** `stream_options.include_usage`: send a final usage chunk. Default false. */
  includeUsage: boolean;
  /** Sampling temperature, 0..2 (0 = greedy). Default 1. */
  temperature: number;
  /** Nucleus sampling mass, 0 < topP ≤ 1. Default 1 (disabled). */
  topP: number;
  /** Top-k cutoff; −1 = all tokens (disabled), else ≥ 1. Default −1. */
  topK: number;
  /** RNG seed, 0..2^32−1; absent = random per request. */
  seed?: number;
  /** Stop strings (0–16, each non-empty); output ends before the first one generated. */
  stop: string[];
  /** Keep generating past the end-of-sequence token (until `maxTokens`). Default false. */
  ignoreEos: boolean;
  /** Choices to generate (1..16 per prompt); each is one engine request. Default 1. */
  n: number;
  /** Presence/frequency/repetition penalties, min_p, logit_bias, min_tokens, stop_token_ids (no-op values dropped). */
  sampling: ExtendedSampling;
  /** Keep the matched stop string in the output. Default false. */
  includeStopStr: boolean;
  /** Alternatives per token for log probabilities (chat `top_logprobs`, completions integer `logprobs`); null = none. */
  logprobs: number | null;
}

export interface ChatRequest extends GenerationFields {
  /** At least one message; content flattened to text. */
  messages: ChatMessage[];
  /** Completion token budget (`max_completion_tokens`, else `max_tokens`), 1..2^32−1; absent = until EOS / context end. */
  maxTokens?: number;
  /** Extra variables for the chat template (`chat_template_kwargs`, e.g. `enable_thinking`). */
  templateKwargs: Record<string, unknown>;
  /** Function tools the model may call (`tools`); [] = none. */
  tools: ToolSpec[];
  /** `tool_choice`; default `auto` with tools, `none` without. */
  toolChoice: ToolChoice;
  /** `parallel_tool_calls`: false = at most one call. Default true. */
  parallelToolCalls: boolean;
  /** The output constraint: `response_format`, `structured_outputs`, `guided_*` or `grammar` (one at most); default text. */
  responseFormat: ResponseFormat;
  /** `reasoning_effort` (applied as the template's thinking switch where a reasoning parser is set: reasoning-effort.ts). */
  reasoningEffort?: ReasoningEffort;
}

/** OpenAI's `reasoning_effort` values. */
export const REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"] as const;
/** One of {@link REASONING_EFFORTS}. */
export type ReasoningEffort = (typeof REASONING_EFFORTS)[number];

/** Most stop strings per request (OVMS limit; OpenAI documents 4). */
export const MAX_STOP_STRINGS = 16;
/**
 * Longest stop string (UTF-16 units). Each choice matches every stop string against its text as it streams, so
 * sixteen 450 KB stop strings with n = 16 froze the gateway for a second; a stop string this long is already far
 * beyond anything a client means.
 */
export const MAX_STOP_STRING_LENGTH = 4096;
/** Accepted `messages[].role` values. */
export const CHAT_ROLES = ["system", "user", "assistant", "tool", "developer"] as const;

// ------------------------------------------------------------------ content

/** Content-part types defined by OpenAI that Keel (text-only) does not accept. */
const UNSUPPORTED_PART_TYPES = new Set(["image_url", "input_audio", "file", "refusal"]);

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Flattens `content` to text: a string as is, `null`/absent as `""` (assistant
 * only), text parts joined with `"\n"`. Reports problems relative to the message.
 */
function flattenContent(role: string, content: unknown, ctx: IssueCtx): string {
  if (content === undefined || content === null) {
    if (role === "assistant") return "";
    if (content === undefined) report(ctx, "missing_field", "", ["content"]);
    else report(ctx, "invalid_value", `null content is only allowed in assistant messages; expected a string or an array of content parts.`, ["content"], null);
    return "";
  }
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) {
    report(ctx, "invalid_type", `expected a string or an array of content parts, but got ${describe(content)} instead.`, ["content"], content);
    return "";
  }
  if (content.length === 0) {
    report(ctx, "invalid_value", "expected a non-empty array of content parts, but got an empty array.", ["content"], content);
    return "";
  }
  const texts: string[] = [];
  for (const [j, part] of content.entries()) {
    if (!isPlainObject(part)) {
      report(ctx, "invalid_type", `expected an object, but got ${describe(part)} instead.`, ["content", j], part);
      return "";
    }
    const type = part.type;
    if (type === undefined) {
      report(ctx, "missing_field", "", ["content", j, "type"]);
      return "";
    }
    if (typeof type !== "string") {
      report(ctx, "invalid_type", `expected a string, but got ${describe(type)} instead.`, ["content", j, "type"], type);
      return "";
    }
    if (type !== "text") {
      if (UNSUPPORTED_PART_TYPES.has(type)) {
        report(ctx, "unsupported_field", `Content parts of type '${type}' are not supported; only 'text' is.`, ["content", j, "type"], type);
      } else {
        report(ctx, "invalid_value", `expected 'text' (got ${show(type)}).`, ["content", j, "type"], type);
      }
      return "";
    }
    if (part.text === undefined) {
      report(ctx, "missing_field", "", ["content", j, "text"]);
      return "";
    }
    if (typeof part.text !== "string") {
      report(ctx, "invalid_type", `expected a string, but got ${describe(part.text)} instead.`, ["content", j, "text"], part.text);
      return "";
    }
    texts.push(part.text);
  }
  return texts.join("\n");
}

const messageSchema = z
  .object({ role: z.enum(CHAT_ROLES), content: z.unknown().optional() })
  .passthrough()
  .transform((m, ctx): ChatMessage => {
    const extras = parseMessageExtras(m.role, m, ctx);
    // An assistant message that only calls tools has null content (OpenAI); flattenContent maps it to "".
    const message: ChatMessage = { role: m.role, content: flattenContent(m.role, m.content, ctx) };
    // An empty list is no calls (templates test `tool_calls` for presence).
    if (extras?.toolCalls !== undefined && extras.toolCalls.length > 0) message.toolCalls = extras.toolCalls;
    if (extras?.toolCallId !== undefined) message.toolCallId = extras.toolCallId;
    if (extras?.name !== undefined) message.name = extras.name;
    if (extras?.reasoningContent !== undefined) message.reasoningContent = extras.reasoningContent;
    return message;
  });

// ------------------------------------------------------------------ stop

/** `stop`: string or array of ≤ 16 non-empty strings; null/absent → []. */
export const stopSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): string[] => {
    if (v === undefined || v === null) return [];
    const list = typeof v === "string" ? [v] : v;
    if (!Array.isArray(list)) {
      report(ctx, "invalid_type", `expected a string or an array of strings, but got ${describe(v)} instead.`, [], v);
      return [];
    }
    if (list.length > MAX_STOP_STRINGS) {
      report(ctx, "invalid_value", `expected at most ${MAX_STOP_STRINGS} stop strings, but got ${list.length}.`, [], v);
      return [];
    }
    const out: string[] = [];
    for (const [i, s] of list.entries()) {
      const path = typeof v === "string" ? [] : [i];
      if (typeof s !== "string") {
        report(ctx, "invalid_type", `expected a string, but got ${describe(s)} instead.`, path, s);
        return [];
      }
      if (s.length === 0) {
        report(ctx, "invalid_value", "stop strings must be non-empty.", path, s);
        return [];
      }
      if (s.length > MAX_STOP_STRING_LENGTH) {
        report(ctx, "invalid_value", `stop strings must be at most ${MAX_STOP_STRING_LENGTH} characters (got ${s.length}).`, path, s);
        return [];
      }
      out.push(s);
    }
    return out;
  });

// ------------------------------------------------------------------ unsupported

/**
 * A recognised OpenAI field Keel does not implement: accepted when absent,
 * null, or `isNoop(value)`; otherwise 400 `unsupported_field`.
 */
export function unsupported(isNoop: (v: unknown) => boolean, reason?: string) {
  return z
    .unknown()
    .optional()
    .superRefine((v, ctx) => {
      if (v !== undefined && v !== null && !isNoop(v)) report(ctx, "unsupported_field", reason ?? "", [], v);
    });
}

const isEmptyArray = (v: unknown): boolean => Array.isArray(v) && v.length === 0;

// ------------------------------------------------------------------ request

export const tokenLimit = z.number().min(1).max(UINT32_MAX).int().nullish();

/**
 * zod schema of the raw chat-completion body (snake_case, before defaults and
 * cross-field checks). Field order is the order problems are reported in.
 * Prefer {@link parseChatRequest}.
 */
export const chatRequestBodySchema = z.object({
  model: z.string().min(1),
  messages: z.array(messageSchema).min(1),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  max_tokens: tokenLimit,
  max_completion_tokens: tokenLimit,
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: z
    .number()
    .int()
    .nullish()
    .superRefine((v, ctx) => {
      if (v != null && v < -1) report(ctx, "invalid_value", `${RANGES.top_k} (got ${v}).`, [], v);
    }),
  seed: z.number().min(0).max(UINT32_MAX).int().nullish(),
  stop: stopSchema,
  ignore_eos: z.boolean().nullish(),
  ...samplingFields,
  best_of: z.number().int().min(1).nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  tools: toolsSchema,
  tool_choice: toolChoiceSchema,
  parallel_tool_calls: z.boolean().nullish(),
  response_format: responseFormatSchema,
  ...structuredOutputFields,
  reasoning_effort: z.enum(REASONING_EFFORTS).nullish(),
  // Labels OpenAI takes without effect on the output (abuse monitoring, cache routing): checked, not applied.
  user: z.string().nullish(),
  safety_identifier: z.string().nullish(),
  prompt_cache_key: z.string().nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  // recognised, not implemented (OpenAI's deprecated function-calling fields)
  functions: unsupported(isEmptyArray, "The legacy 'functions' field is not supported; use 'tools' instead."),
  function_call: unsupported((v) => v === "none" || v === "auto", "The legacy 'function_call' field is not supported; use 'tool_choice' instead."),
  audio: unsupported(() => false, "Audio output is not available."),
  modalities: unsupported((v) => Array.isArray(v) && v.length === 1 && v[0] === "text", "Only [\"text\"] is supported."),
  prediction: unsupported(() => false, "Predicted outputs are not available."),
  // OpenAI fields with an effect Keel does not provide: refused rather than dropped.
  web_search_options: unsupported(() => false, "Web search is not available."),
  store: unsupported((v) => v === false, "Keel keeps no server-side state; completions cannot be stored."),
  service_tier: unsupported((v) => v === "auto" || v === "default", "Service tiers are not available."),
  verbosity: unsupported((v) => v === "medium", "Only the model's own verbosity ('medium') is available."),
  prompt_cache_retention: unsupported((v) => v === "in_memory", "Keel's prefix cache lives in memory only ('in_memory')."),
  // vLLM's chat extensions Keel does not offer, accepted at the value Keel always uses.
  add_generation_prompt: unsupported((v) => v === true, "Keel always ends the prompt with the assistant's turn (true)."),
  continue_final_message: unsupported((v) => v === false, "Continuing the final message is not available (false)."),
  echo: unsupported((v) => v === false, "Echoing the prompt is not available on chat (false); /completions has 'echo'."),
  use_beam_search: unsupported((v) => v === false, "Beam search is not available (false)."),
});

/** Every top-level field `/chat/completions` knows (any other is a 400 `unknown_field`). */
export const CHAT_FIELDS = fieldsOf(chatRequestBodySchema);

/**
 * Validates a parsed JSON body of a chat-completion request and returns it
 * normalised, with defaults applied.
 *
 * Field rules (OpenAI Chat Completions schema; ranges as in OVMS,
 * OVMS 2026.2 chat-completions validation):
 *
 * - `model`: non-empty string, required.
 * - `messages`: non-empty array of `{role, content}`; `role` one of
 *   {@link CHAT_ROLES}; `content` a string, an array of ≥ 1
 *   `{type:"text", text}` parts (joined with `"\n"`), or — for `assistant`
 *   only — null/absent (→ `""`). Parts of type `image_url`, `input_audio`,
 *   `file`, `refusal` are `unsupported_field`; other types `invalid_value`.
 * - `stream`: boolean. `stream_options` (`{include_usage?: boolean}`) only
 *   together with `stream: true`.
 * - `max_tokens`, `max_completion_tokens`: integer 1..2^32−1;
 *   `max_completion_tokens` wins when both are set.
 * - `temperature`: 0..2. `top_p`: 0 < top_p ≤ 1 — 0 is rejected although
 *   OpenAI and OVMS accept it, because an empty nucleus is not a
 *   distribution; ask for greedy decoding with `temperature: 0` instead.
 * - `top_k`: integer, −1 (all tokens) or ≥ 1. `seed`: integer 0..2^32−1.
 * - `stop`: string or array of ≤ 16 strings, none empty.
 * - `ignore_eos`: boolean.
 * - `n` (1..16) and `best_of` (only equal to `n`); `logprobs` (boolean) with
 *   `top_logprobs` (0..20, only with `logprobs: true` unless 0);
 *   `chat_template_kwargs` (object of extra template variables).
 * - The sampling set (api/sampling.ts): `presence_penalty`,
 *   `frequency_penalty`, `repetition_penalty`, `min_p`, `logit_bias`,
 *   `min_tokens`, `stop_token_ids`, `include_stop_str_in_output`; no-op
 *   values are dropped. Whether the engine can apply them is checked at
 *   admission (capabilities), not here.
 * - Agent fields (tool-fields.ts): `tools` (≤ 128 function tools, nested
 *   or flat, unique names), `tool_choice` (default auto with tools, none
 *   without; a named function must be declared), `parallel_tool_calls`,
 *   `response_format` (text, json_object, json_schema); assistant
 *   `tool_calls` / `reasoning_content`, tool `tool_call_id`, `name`.
 * - Output constraints (structured-outputs.ts): `structured_outputs`
 *   (json, regex, choice, grammar, json_object), `guided_json`,
 *   `guided_regex`, `guided_choice`, `guided_grammar`, `grammar` — at most
 *   one, `response_format` included. `reasoning_effort` (applied at the
 *   route: reasoning-effort.ts). Labels without effect on the output:
 *   `user`, `safety_identifier`, `prompt_cache_key`, `metadata`.
 * - Not implemented, so 400 `unsupported_field` unless given their no-op
 *   value: `functions` ([]), `function_call` ("none", "auto") — use
 *   `tools` — `modalities` (["text"]), `store` (false), `service_tier`,
 *   `verbosity`, `prompt_cache_retention`, vLLM's `add_generation_prompt`
 *   (true), `continue_final_message`, `echo`, `use_beam_search` (false),
 *   and `audio`, `prediction`, `web_search_options` (no no-op value).
 * - Any other top-level field: 400 `unknown_field` (known-fields.ts).
 *
 * @param body - The request body as parsed from JSON (any value).
 * @returns The normalised request.
 * @throws KeelHttpError 400, `code` `invalid_value` / `missing_field` /
 *   `unsupported_field`, `param` = path of the first offending field, message
 *   in OpenAI's style (e.g. `Invalid value for 'temperature': must be between
 *   0 and 2 (got 3).`).
 */
export function parseChatRequest(body: unknown): ChatRequest {
  checkKnownFields(body, CHAT_FIELDS);
  const parsed = chatRequestBodySchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  const stream = b.stream ?? false;
  if (b.stream_options != null && !stream) {
    throw invalidValue("stream_options", "Invalid value for 'stream_options': only allowed when 'stream' is true.");
  }
  const request: ChatRequest = {
    model: b.model,
    messages: b.messages,
    stream,
    includeUsage: b.stream_options?.include_usage ?? false,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    topK: b.top_k == null || b.top_k === 0 ? -1 : b.top_k, // 0 = all tokens, as vLLM and llama.cpp read it
    stop: b.stop,
    ignoreEos: b.ignore_eos ?? false,
    n: b.n ?? 1,
    sampling: extendedSampling(b),
    includeStopStr: b.include_stop_str_in_output ?? false,
    logprobs: null,
    templateKwargs: b.chat_template_kwargs ?? {},
    tools: b.tools,
    toolChoice: resolveToolChoice(b.tools, b.tool_choice),
    parallelToolCalls: b.parallel_tool_calls ?? true,
    responseFormat: outputConstraint(b),
  };
  if (b.reasoning_effort != null) request.reasoningEffort = b.reasoning_effort;
  if (b.best_of != null && b.best_of !== request.n) {
    throw unsupportedField("best_of", "Only best_of equal to n is supported (every generated choice is returned).");
  }
  if (b.top_logprobs != null && b.top_logprobs > 0 && b.logprobs !== true) {
    throw invalidValue("top_logprobs", "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.");
  }
  if (b.logprobs === true) request.logprobs = b.top_logprobs ?? 0;
  const maxTokens = b.max_completion_tokens ?? b.max_tokens;
  if (maxTokens != null) request.maxTokens = maxTokens;
  checkMinTokens(request.sampling, maxTokens);
  if (b.seed != null) request.seed = b.seed;
  return request;
}

/**
 * `tool_choice` against the declared tools: default `auto` with tools and `none` without; `required` needs tools; a
 * named function must be one of them (OpenAI and OVMS both refuse a missing one).
 */
export function resolveToolChoice(tools: readonly ToolSpec[], choice: ToolChoice | undefined): ToolChoice {
  if (choice === undefined) return tools.length > 0 ? { kind: "auto" } : { kind: "none" };
  if (choice.kind === "required" && tools.length === 0) {
    throw invalidValue("tool_choice", "Invalid value for 'tool_choice': 'required' needs at least one tool in 'tools'.");
  }
  if (choice.kind === "function" && !tools.some((t) => t.name === choice.name)) {
    throw invalidValue("tool_choice", `Invalid value for 'tool_choice': no function named ${show(choice.name)} in 'tools'.`);
  }
  // `auto` without tools is what every client sends by default: it means none.
  if (choice.kind === "auto" && tools.length === 0) return { kind: "none" };
  return choice;
}
