/**
 * Validation of `POST …/responses` bodies into a {@link ResponsesRequest}: OpenAI's Responses fields that Keel
 * applies, the recognised ones it refuses (400 `unsupported_field`, with why), and every other top-level field
 * refused as unknown (400 `unknown_field` naming it). Applied: `model`, `input` (responses-input.ts),
 * `instructions`, `stream`, `max_output_tokens`, `temperature`, `top_p`, `metadata`, function `tools`,
 * `tool_choice`, `parallel_tool_calls`, `text.format` (text, json_object, json_schema → the same guide as chat's
 * `response_format`), `reasoning.effort` (→ the template's thinking switch; the route checks a reasoning parser is
 * set), and the identifiers `user`, `safety_identifier`, `prompt_cache_key` (accepted, they change no output).
 */
import { z } from "zod";
import type { ChatMessage } from "../models/chat-template.js";
import { describe, isPlainObject, issueToError, report, resolveToolChoice, tokenLimit, unsupported } from "./chat-request.js";
import type { IssueCtx } from "./request-issues.js";
import { toolChoiceSchema, toolsSchema } from "./tool-fields.js";
import type { ResponseFormat, ToolChoice, ToolSpec } from "../tools.js";
import { inputSchema } from "./responses-input.js";
import { checkKnownFields } from "./known-fields.js";

import { REASONING_EFFORTS, type ReasoningEffort } from "./chat-request.js";

/** A validated Responses request. */
export interface ResponsesRequest {
  model: string;
  /** The conversation: `instructions` as a system message, then the input items. */
  messages: ChatMessage[];
  instructions: string | null;
  stream: boolean;
  maxOutputTokens: number | null;
  temperature: number;
  topP: number;
  metadata: Record<string, string>;
  /** Function tools (Responses' flat `{type:"function", name, …}`; the nested chat shape is accepted too). */
  tools: ToolSpec[];
  /** `tool_choice`; default `auto` with tools, `none` without. */
  toolChoice: ToolChoice;
  /** `parallel_tool_calls` (default true). */
  parallelToolCalls: boolean;
  /** `text.format` in chat's terms (default text). */
  responseFormat: ResponseFormat;
  /** `reasoning.effort`, or null when not given. */
  reasoningEffort: ReasoningEffort | null;
  /** `reasoning.summary` (only `auto` is accepted), or null. */
  reasoningSummary: "auto" | null;
}

/** OpenAI's rule for `text.format.name`. */
const SCHEMA_NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;

/** `text.format`: absent → text; `{type: "text" | "json_object"}`; `{type: "json_schema", name, schema, strict?, description?}`. */
function formatOf(f: unknown, ctx: IssueCtx): ResponseFormat | null {
  if (f === undefined || f === null) return { kind: "text" };
  if (!isPlainObject(f)) {
    report(ctx, "invalid_type", `expected an object, but got ${describe(f)} instead.`, ["format"], f);
    return null;
  }
  if (f.type === "text") return { kind: "text" };
  if (f.type === "json_object") return { kind: "json_object" };
  if (f.type !== "json_schema") {
    report(ctx, "invalid_value", `expected one of 'text', 'json_object', 'json_schema' (got ${describe(f.type)}).`, ["format", "type"], f.type);
    return null;
  }
  if (typeof f.name !== "string" || !SCHEMA_NAME_PATTERN.test(f.name)) {
    if (f.name === undefined || f.name === null) report(ctx, "missing_field", "", ["format", "name"]);
    else report(ctx, "invalid_value", "the schema name must be 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-'.", ["format", "name"], f.name);
    return null;
  }
  if (!isPlainObject(f.schema)) {
    if (f.schema === undefined || f.schema === null) report(ctx, "missing_field", "", ["format", "schema"]);
    else report(ctx, "invalid_type", `expected an object (a JSON schema), but got ${describe(f.schema)} instead.`, ["format", "schema"], f.schema);
    return null;
  }
  for (const [key, type] of [["strict", "boolean"], ["description", "string"]] as const) {
    if (f[key] !== undefined && f[key] !== null && typeof f[key] !== type) {
      report(ctx, "invalid_type", `expected a ${type}, but got ${describe(f[key])} instead.`, ["format", key], f[key]);
      return null;
    }
  }
  return { kind: "json_schema", name: f.name, schema: f.schema, strict: f.strict === true };
}

/** `text`: `{format?, verbosity?}`; only the default verbosity (`medium`) is available. */
const textSchema = z.unknown().optional().transform((v, ctx): ResponseFormat => {
  if (v === undefined || v === null) return { kind: "text" };
  if (!isPlainObject(v)) {
    report(ctx, "invalid_type", `expected an object, but got ${describe(v)} instead.`, [], v);
    return { kind: "text" };
  }
  for (const key of Object.keys(v)) {
    if (key !== "format" && key !== "verbosity") report(ctx, "unsupported_field", `Only 'format' and 'verbosity' are known in 'text'.`, [key], v[key]);
  }
  if (v.verbosity !== undefined && v.verbosity !== null && v.verbosity !== "medium") {
    report(ctx, "unsupported_field", "Only the default verbosity ('medium') is available: the model's output length is not steered.", ["verbosity"], v.verbosity);
  }
  return formatOf(v.format, ctx) ?? { kind: "text" };
});

/** `reasoning`: `{effort?, summary?}`; summaries are not produced (the reasoning itself comes as its content). */
const reasoningSchema = z.unknown().optional().transform((v, ctx): { effort: ReasoningEffort | null; summary: "auto" | null } => {
  const none = { effort: null, summary: null };
  if (v === undefined || v === null) return none;
  if (!isPlainObject(v)) {
    report(ctx, "invalid_type", `expected an object, but got ${describe(v)} instead.`, [], v);
    return none;
  }
  for (const key of Object.keys(v)) {
    if (!["effort", "summary", "generate_summary"].includes(key) && v[key] !== null) report(ctx, "unsupported_field", "Only 'effort' and 'summary' are available in 'reasoning'.", [key], v[key]);
  }
  const effort = v.effort ?? null;
  if (effort !== null && !(REASONING_EFFORTS as readonly unknown[]).includes(effort)) {
    report(ctx, "invalid_value", `expected one of ${REASONING_EFFORTS.map((e) => `'${e}'`).join(", ")} (got ${describe(effort)}).`, ["effort"], effort);
  }
  for (const key of ["summary", "generate_summary"]) {
    const s = v[key];
    if (s !== undefined && s !== null && s !== "auto") {
      report(ctx, "unsupported_field", "Reasoning summaries are not produced; with 'auto' (or none) the model's reasoning comes whole as the reasoning item's content.", [key], s);
    }
  }
  return { effort: effort as ReasoningEffort | null, summary: v.summary === "auto" || v.generate_summary === "auto" ? "auto" : null };
});

/** Chat/completions request fields that clients send to /responses by mistake. */
/** The Responses field a chat field's client means, where there is one. */
const RESPONSES_NAME: Partial<Record<string, string>> = {
  reasoning_effort: "reasoning.effort",
  response_format: "text.format",
  max_tokens: "max_output_tokens",
  max_completion_tokens: "max_output_tokens",
};

const CHAT_ONLY_FIELDS = [
  "messages", "max_tokens", "max_completion_tokens", "seed", "stop", "n", "best_of", "logprobs", "logit_bias",
  "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "top_k", "min_tokens", "stop_token_ids",
  "ignore_eos", "include_stop_str_in_output", "chat_template_kwargs", "response_format", "reasoning_effort",
] as const;

const STATELESS = "Keel keeps no server-side state; send the whole conversation in 'input'.";
/** An identifier OpenAI uses for routing, caching or abuse monitoring: accepted (a string, ≤ 512 characters); it changes no output. */
const identifier = z.string().max(512).nullish();

const responsesBodySchema = z.object({
  model: z.string().min(1),
  input: inputSchema,
  instructions: z.string().nullish(),
  stream: z.boolean().nullish(),
  max_output_tokens: tokenLimit,
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  tools: toolsSchema,
  tool_choice: toolChoiceSchema,
  parallel_tool_calls: z.boolean().nullish(),
  text: textSchema,
  reasoning: reasoningSchema,
  user: identifier,
  safety_identifier: identifier,
  prompt_cache_key: identifier,
  // Keel keeps no conversation state.
  previous_response_id: unsupported(() => false, STATELESS),
  conversation: unsupported(() => false, STATELESS),
  context_management: unsupported(() => false, STATELESS),
  store: unsupported((v) => v === false, "Keel keeps no server-side state; responses cannot be stored (send store: false or omit it)."),
  background: unsupported((v) => v === false, "Background responses are not available."),
  // recognised, not implemented
  include: unsupported((v) => Array.isArray(v) && v.length === 0, "No extra output data (encrypted reasoning, logprobs, sources) is available."),
  top_logprobs: unsupported((v) => v === 0, "Log probabilities are not available on /responses; use /chat/completions."),
  truncation: unsupported((v) => v === "disabled", "Only truncation 'disabled' is available."),
  stream_options: unsupported((v) => isPlainObject(v) && Object.keys(v).length === 0, "No stream options are available on /responses."),
  max_tool_calls: unsupported(() => false, "max_tool_calls is not available; use parallel_tool_calls: false for at most one call."),
  prompt: unsupported(() => false, "Prompt templates are not available."),
  prompt_cache_retention: unsupported(() => false, "Prompt cache retention cannot be chosen (the engine's prefix cache is managed by the server)."),
  moderation: unsupported(() => false, "Moderation is not available."),
  service_tier: unsupported((v) => v === "auto" || v === "default", "Service tiers are not available."),
  // Chat/completions fields that the Responses API does not have: refused with a hint, not accepted and ignored.
  ...Object.fromEntries(CHAT_ONLY_FIELDS.map((f) => [f, unsupported(() => false, `'${f}' is not a Responses API field; ${RESPONSES_NAME[f] ? `use ${RESPONSES_NAME[f]}` : "use /chat/completions for it"}.`)])),
});

/** Every top-level field the Responses body knows (the rest are refused as unknown). */
const KNOWN_FIELDS: ReadonlySet<string> = new Set(Object.keys(responsesBodySchema.shape));

/** Validate a Responses body (400 naming the first offending field). */
export function parseResponsesRequest(body: unknown): ResponsesRequest {
  checkKnownFields(body, KNOWN_FIELDS);
  const parsed = responsesBodySchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  const instructions = b.instructions != null ? b.instructions : null;
  return {
    model: b.model,
    messages: instructions !== null ? [{ role: "system", content: instructions }, ...b.input] : b.input,
    instructions,
    stream: b.stream ?? false,
    maxOutputTokens: b.max_output_tokens ?? null,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    metadata: b.metadata ?? {},
    tools: b.tools,
    toolChoice: resolveToolChoice(b.tools, b.tool_choice),
    parallelToolCalls: b.parallel_tool_calls ?? true,
    responseFormat: b.text,
    reasoningEffort: b.reasoning.effort,
    reasoningSummary: b.reasoning.summary,
  };
}
