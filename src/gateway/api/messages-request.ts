/**
 * Validation of Anthropic Messages API bodies (`POST …/messages`, `POST …/messages/count_tokens`) into a
 * {@link MessagesRequest}: the conversation as chat-template messages (chat-request.ts's shapes — an assistant turn's
 * `tool_use` blocks become its `toolCalls`, a `tool_result` block a `tool` message), tools, tool choice, thinking and
 * sampling. Follows Anthropic's request schema: unknown top-level fields and unknown block fields are refused naming
 * the field (Anthropic: "Extra inputs are not permitted"); `max_tokens` is required; `temperature` is 0..1.
 * `cache_control` marks are accepted wherever Anthropic allows them: Keel caches prompt prefixes by itself.
 *
 * @module
 */
import { z } from "zod";
import type { ChatMessage } from "../models/chat-template.js";
import { invalidValue, show } from "../http/errors.js";
import { checkKnownFields, fieldsOf } from "./known-fields.js";
import type { ToolCall, ToolChoice, ToolSpec } from "../tools.js";
import { isPlainObject, resolveToolChoice, stopSchema, unsupported } from "./chat-request.js";
import { describe, issueToError, report, UINT32_MAX, type IssueCtx } from "./request-issues.js";
import { MAX_TOOLS, TOOL_NAME_PATTERN } from "./tool-fields.js";

/**
 * `thinking`: `default` (not sent: the template's own default), `enabled` (`enabled` or `adaptive`: reasoning is
 * parsed into `thinking` blocks; needs `--reasoning_parser`), `disabled` (the template's thinking switch is off).
 */
export type ThinkingRequest = { kind: "default" } | { kind: "enabled"; budgetTokens: number | null } | { kind: "disabled" };

/** A validated `count_tokens` body: what the prompt is made of. */
export interface MessagesPromptRequest {
  model: string;
  /** `system` (as a system message) then the conversation. */
  messages: ChatMessage[];
  /** Custom tools (`input_schema` as the parameters); [] = none. */
  tools: ToolSpec[];
  /** `tool_choice` (`any` → required, `tool` → named); default auto with tools, none without. */
  toolChoice: ToolChoice;
  /** False when `tool_choice.disable_parallel_tool_use` is true (at most one call). */
  parallelToolCalls: boolean;
  thinking: ThinkingRequest;
}

/** A validated Messages body, with Anthropic's defaults applied. */
export interface MessagesRequest extends MessagesPromptRequest {
  /** `max_tokens` (required): the answer's token budget, thinking included. */
  maxTokens: number;
  /** `stop_sequences`: the answer ends before the first one generated (`stop_reason: "stop_sequence"`). */
  stopSequences: string[];
  /** 0..1, default 1. */
  temperature: number;
  /** 0 < top_p ≤ 1, default 1 (off). */
  topP: number;
  /** ≥ 1, or −1 when not sent (off). */
  topK: number;
  stream: boolean;
}

type Path = PropertyKey[];
/** Thrown by the walkers below to stop at the first problem (it was reported to zod first). */
class Stop extends Error {}

function fail(ctx: IssueCtx, kind: "invalid_type" | "invalid_value" | "missing_field" | "unsupported_field", detail: string, path: Path, input?: unknown): never {
  report(ctx, kind, detail, path, input);
  throw new Stop();
}

/** Refuse keys of `obj` outside `allowed` (Anthropic's "Extra inputs are not permitted"). */
function onlyKeys(ctx: IssueCtx, obj: Record<string, unknown>, allowed: readonly string[], path: Path): void {
  const extra = Object.keys(obj).find((k) => !allowed.includes(k));
  if (extra !== undefined) fail(ctx, "invalid_value", "unknown field: extra inputs are not permitted.", [...path, extra], obj[extra]);
}

function needObject(ctx: IssueCtx, v: unknown, path: Path): Record<string, unknown> {
  if (v === undefined) fail(ctx, "missing_field", "", path);
  if (!isPlainObject(v)) fail(ctx, "invalid_type", `expected an object, but got ${describe(v)} instead.`, path, v);
  return v;
}

function needString(ctx: IssueCtx, obj: Record<string, unknown>, key: string, path: Path): string {
  const v = obj[key];
  if (v === undefined || v === null) fail(ctx, "missing_field", "", [...path, key]);
  if (typeof v !== "string") fail(ctx, "invalid_type", `expected a string, but got ${describe(v)} instead.`, [...path, key], v);
  return v;
}

/** A `cache_control` mark: `{type: "ephemeral", ttl?}` (accepted; prefix caching is automatic). */
function checkCacheControl(ctx: IssueCtx, obj: Record<string, unknown>, path: Path): void {
  checkCacheValue(ctx, obj.cache_control, [...path, "cache_control"]);
}

/** The `cache_control` value itself at `path`. */
function checkCacheValue(ctx: IssueCtx, v: unknown, path: Path): void {
  if (v === undefined || v === null) return;
  const c = needObject(ctx, v, path);
  onlyKeys(ctx, c, ["type", "ttl"], path);
  if (c.type !== "ephemeral") fail(ctx, "invalid_value", `expected 'ephemeral' (got ${show(c.type)}).`, [...path, "type"], c.type);
}

/** Block types Anthropic defines that carry more than text (Keel serves text-only models). */
const NON_TEXT_BLOCKS = new Set(["image", "document", "search_result", "container_upload", "server_tool_use", "web_search_tool_result", "redacted_thinking"]);

/** One `{type: "text", text}` block's text. */
function textBlock(ctx: IssueCtx, b: Record<string, unknown>, path: Path): string {
  onlyKeys(ctx, b, ["type", "text", "cache_control", "citations"], path);
  checkCacheControl(ctx, b, path);
  if (b.citations !== undefined && b.citations !== null && !(Array.isArray(b.citations) && b.citations.length === 0)) {
    fail(ctx, "unsupported_field", "Citations are not available.", [...path, "citations"], b.citations);
  }
  return needString(ctx, b, "text", path);
}

/** A block's type, refusing what is not `allowed` here (non-text types get `unsupported_field`). */
function blockType(ctx: IssueCtx, b: Record<string, unknown>, allowed: readonly string[], role: string, path: Path): string {
  const type = needString(ctx, b, "type", path);
  if (allowed.includes(type)) return type;
  if (NON_TEXT_BLOCKS.has(type)) fail(ctx, "unsupported_field", `Content blocks of type '${type}' are not supported; Keel serves text.`, [...path, "type"], type);
  fail(ctx, "invalid_value", `expected one of ${allowed.map((t) => `'${t}'`).join(", ")} in a${role === "assistant" ? "n" : ""} ${role} message (got ${show(type)}).`, [...path, "type"], type);
}

/** A `tool_result` block's content: a string or text blocks (joined with "\n"); `is_error` prefixes "Error: ". */
function toolResult(ctx: IssueCtx, b: Record<string, unknown>, path: Path): ChatMessage {
  onlyKeys(ctx, b, ["type", "tool_use_id", "content", "is_error", "cache_control"], path);
  checkCacheControl(ctx, b, path);
  const id = needString(ctx, b, "tool_use_id", path);
  const c = b.content;
  let text = "";
  if (typeof c === "string") text = c;
  else if (Array.isArray(c)) {
    text = c.map((part, k) => {
      const p = needObject(ctx, part, [...path, "content", k]);
      blockType(ctx, p, ["text"], "tool_result", [...path, "content", k]);
      return textBlock(ctx, p, [...path, "content", k]);
    }).join("\n");
  } else if (c !== undefined && c !== null) fail(ctx, "invalid_type", `expected a string or an array of text blocks, but got ${describe(c)} instead.`, [...path, "content"], c);
  if (b.is_error !== undefined && b.is_error !== null && typeof b.is_error !== "boolean") fail(ctx, "invalid_type", `expected a boolean, but got ${describe(b.is_error)} instead.`, [...path, "is_error"], b.is_error);
  // The template has no error flag for a tool message: the model reads it in the text.
  return { role: "tool", content: b.is_error === true ? `Error: ${text}` : text, toolCallId: id };
}

/** A `tool_use` block of an assistant turn as a chat tool call (`input` as JSON text). */
function toolUse(ctx: IssueCtx, b: Record<string, unknown>, path: Path): ToolCall {
  onlyKeys(ctx, b, ["type", "id", "name", "input", "cache_control"], path);
  checkCacheControl(ctx, b, path);
  const id = needString(ctx, b, "id", path);
  const name = needString(ctx, b, "name", path);
  const input = needObject(ctx, b.input, [...path, "input"]);
  return { id, name, arguments: JSON.stringify(input) };
}

/**
 * One Anthropic message as chat messages. A user turn: its text blocks (consecutive ones joined with "\n") as user
 * messages and each `tool_result` as a `tool` message, in order. An assistant turn: one message — text as content,
 * `thinking` as its reasoning, `tool_use` blocks as its tool calls.
 */
function messageOf(ctx: IssueCtx, raw: unknown, i: number): ChatMessage[] {
  const path: Path = [i];
  const m = needObject(ctx, raw, path);
  onlyKeys(ctx, m, ["role", "content"], path);
  const role = m.role;
  if (role !== "user" && role !== "assistant" && role !== "system") fail(ctx, "invalid_value", `expected one of 'user', 'assistant', 'system' (got ${show(role)}).`, [...path, "role"], role);
  const c = m.content;
  if (typeof c === "string") return [{ role, content: c }];
  if (c === undefined || c === null) fail(ctx, "missing_field", "", [...path, "content"]);
  if (!Array.isArray(c) || c.length === 0) fail(ctx, "invalid_value", `expected a string or a non-empty array of content blocks, but got ${describe(c)}.`, [...path, "content"], c);
  const blocks = c.map((b, j) => needObject(ctx, b, [...path, "content", j]));
  const at = (j: number): Path => [...path, "content", j];
  if (role === "assistant") {
    const text: string[] = [];
    const thinking: string[] = [];
    const calls: ToolCall[] = [];
    for (const [j, b] of blocks.entries()) {
      const type = blockType(ctx, b, ["text", "thinking", "tool_use"], role, at(j));
      if (type === "text") text.push(textBlock(ctx, b, at(j)));
      else if (type === "tool_use") calls.push(toolUse(ctx, b, at(j)));
      else {
        onlyKeys(ctx, b, ["type", "thinking", "signature"], at(j));
        thinking.push(needString(ctx, b, "thinking", at(j)));
      }
    }
    const out: ChatMessage = { role, content: text.join("\n") };
    if (calls.length > 0) out.toolCalls = calls;
    if (thinking.length > 0) out.reasoningContent = thinking.join("\n");
    return [out];
  }
  const out: ChatMessage[] = [];
  let text: string[] = [];
  const flush = (): void => {
    if (text.length > 0) out.push({ role, content: text.join("\n") });
    text = [];
  };
  for (const [j, b] of blocks.entries()) {
    const type = blockType(ctx, b, role === "user" ? ["text", "tool_result"] : ["text"], role, at(j));
    if (type === "text") text.push(textBlock(ctx, b, at(j)));
    else {
      flush();
      out.push(toolResult(ctx, b, at(j)));
    }
  }
  flush();
  return out;
}

/** Run a walker inside a zod transform: a reported problem ends it (the first issue is the 400). */
function walk<T>(ctx: IssueCtx, fallback: T, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    if (err instanceof Stop) return fallback;
    throw err;
  }
}

const messagesSchema = z.unknown().transform((v, ctx): ChatMessage[] =>
  walk(ctx, [], () => {
    if (v === undefined) fail(ctx, "missing_field", "", []);
    if (!Array.isArray(v) || v.length === 0) fail(ctx, "invalid_value", `expected a non-empty array of messages, but got ${describe(v)}.`, [], v);
    const out = v.flatMap((m, i) => messageOf(ctx, m, i));
    // Anthropic continues a final assistant turn (prefill); a chat template closes it and opens a new one instead.
    if (isPlainObject(v.at(-1)) && (v.at(-1) as Record<string, unknown>).role === "assistant") {
      fail(ctx, "unsupported_field", "A final assistant message (prefilling the answer) is not supported: the chat template would close that turn. End with a user message.", [v.length - 1, "role"], "assistant");
    }
    return out;
  }),
);

const systemSchema = z.unknown().optional().transform((v, ctx): string | null =>
  walk(ctx, null, () => {
    if (v === undefined || v === null) return null;
    if (typeof v === "string") return v;
    if (!Array.isArray(v)) fail(ctx, "invalid_type", `expected a string or an array of text blocks, but got ${describe(v)} instead.`, [], v);
    if (v.length === 0) return null;
    return v.map((b, j) => {
      const block = needObject(ctx, b, [j]);
      blockType(ctx, block, ["text"], "system", [j]);
      return textBlock(ctx, block, [j]);
    }).join("\n");
  }),
);

/** One custom tool: `{name, description?, input_schema, cache_control?, type?: "custom", strict?}`. */
function toolOf(ctx: IssueCtx, raw: unknown, i: number): ToolSpec {
  const t = needObject(ctx, raw, [i]);
  if (t.type !== undefined && t.type !== null && t.type !== "custom") {
    fail(ctx, "unsupported_field", `Server tools are not available; only custom tools (name, description, input_schema) are (got type ${show(t.type)}).`, [i, "type"], t.type);
  }
  onlyKeys(ctx, t, ["type", "name", "description", "input_schema", "cache_control", "strict", "eager_input_streaming"], [i]);
  checkCacheControl(ctx, t, [i]);
  const name = needString(ctx, t, "name", [i]);
  if (!TOOL_NAME_PATTERN.test(name)) fail(ctx, "invalid_value", `a tool name must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '.' or '-' (got ${show(name)}).`, [i, "name"], name);
  const schema = needObject(ctx, t.input_schema, [i, "input_schema"]);
  if (schema.type !== "object") fail(ctx, "invalid_value", `expected a JSON schema of type 'object' (got type ${show(schema.type)}).`, [i, "input_schema", "type"], schema.type);
  const tool: ToolSpec = { name, parameters: schema };
  if (t.description !== undefined && t.description !== null) tool.description = needString(ctx, t, "description", [i]);
  for (const flag of ["strict", "eager_input_streaming"] as const) {
    if (t[flag] !== undefined && t[flag] !== null && typeof t[flag] !== "boolean") fail(ctx, "invalid_type", `expected a boolean, but got ${describe(t[flag])} instead.`, [i, flag], t[flag]);
  }
  if (t.strict === true) tool.strict = true;
  return tool;
}

const toolsSchema = z.unknown().optional().transform((v, ctx): ToolSpec[] =>
  walk(ctx, [], () => {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) fail(ctx, "invalid_type", `expected an array of tools, but got ${describe(v)} instead.`, [], v);
    if (v.length > MAX_TOOLS) fail(ctx, "invalid_value", `expected at most ${MAX_TOOLS} tools, but got ${v.length}.`, [], v);
    const tools = v.map((t, i) => toolOf(ctx, t, i));
    const seen = new Set<string>();
    for (const [i, t] of tools.entries()) {
      if (seen.has(t.name)) fail(ctx, "invalid_value", `the tool name ${show(t.name)} is declared more than once.`, [i, "name"], t.name);
      seen.add(t.name);
    }
    return tools;
  }),
);

/** `tool_choice` as Keel's choice plus `disable_parallel_tool_use`. */
interface RawToolChoice {
  choice: ToolChoice | undefined;
  noParallel: boolean;
}

const toolChoiceSchema = z.unknown().optional().transform((v, ctx): RawToolChoice =>
  walk(ctx, { choice: undefined, noParallel: false }, () => {
    if (v === undefined || v === null) return { choice: undefined, noParallel: false };
    const c = needObject(ctx, v, []);
    const type = needString(ctx, c, "type", []);
    if (type === "none") {
      onlyKeys(ctx, c, ["type"], []);
      return { choice: { kind: "none" }, noParallel: false };
    }
    if (type !== "auto" && type !== "any" && type !== "tool") fail(ctx, "invalid_value", `expected one of 'auto', 'any', 'tool', 'none' (got ${show(type)}).`, ["type"], type);
    onlyKeys(ctx, c, type === "tool" ? ["type", "name", "disable_parallel_tool_use"] : ["type", "disable_parallel_tool_use"], []);
    const dp = c.disable_parallel_tool_use;
    if (dp !== undefined && dp !== null && typeof dp !== "boolean") fail(ctx, "invalid_type", `expected a boolean, but got ${describe(dp)} instead.`, ["disable_parallel_tool_use"], dp);
    const choice: ToolChoice = type === "auto" ? { kind: "auto" } : type === "any" ? { kind: "required" } : { kind: "function", name: needString(ctx, c, "name", []) };
    return { choice, noParallel: dp === true };
  }),
);

/** `thinking` before the cross-check of `budget_tokens` against `max_tokens`. */
const thinkingSchema = z.unknown().optional().transform((v, ctx): ThinkingRequest =>
  walk(ctx, { kind: "default" } as ThinkingRequest, () => {
    if (v === undefined || v === null) return { kind: "default" };
    const t = needObject(ctx, v, []);
    const type = needString(ctx, t, "type", []);
    if (type === "disabled") {
      onlyKeys(ctx, t, ["type"], []);
      return { kind: "disabled" };
    }
    if (type !== "enabled" && type !== "adaptive") fail(ctx, "invalid_value", `expected one of 'enabled', 'adaptive', 'disabled' (got ${show(type)}).`, ["type"], type);
    onlyKeys(ctx, t, type === "enabled" ? ["type", "budget_tokens", "display"] : ["type", "display"], []);
    if (t.display !== undefined && t.display !== null && t.display !== "summarized") {
      fail(ctx, "unsupported_field", "Only 'summarized' thinking display is available (thinking is returned as the model wrote it).", ["display"], t.display);
    }
    if (type === "adaptive") return { kind: "enabled", budgetTokens: null };
    const b = t.budget_tokens;
    if (b === undefined || b === null) fail(ctx, "missing_field", "", ["budget_tokens"]);
    if (typeof b !== "number" || !Number.isInteger(b) || b < 1024) fail(ctx, "invalid_value", `must be an integer of at least 1024 (got ${show(b)}).`, ["budget_tokens"], b);
    return { kind: "enabled", budgetTokens: b };
  }),
);

/** A number field within [min, max] (`minExclusive`: min itself refused), reported with Anthropic's range. */
function range(min: number, max: number, minExclusive = false, int = false) {
  return z.unknown().optional().transform((v, ctx): number | null => {
    if (v === undefined || v === null) return null;
    const ok = typeof v === "number" && Number.isFinite(v) && (minExclusive ? v > min : v >= min) && v <= max && (!int || Number.isInteger(v));
    if (ok) return v;
    const what = int ? "an integer" : "a number";
    report(ctx, typeof v === "number" ? "invalid_value" : "invalid_type", typeof v === "number" ? `must be ${what} ${minExclusive ? "greater than" : "of at least"} ${min} and at most ${max} (got ${show(v)}).` : `expected ${what}, but got ${describe(v)} instead.`, [], v);
    return null;
  });
}

/** `metadata`: only `user_id` (a string of at most 256 characters), as Anthropic; accepted, and logged nowhere. */
const metadataSchema = z.unknown().optional().transform((v, ctx): void =>
  walk(ctx, undefined, () => {
    if (v === undefined || v === null) return;
    const m = needObject(ctx, v, []);
    onlyKeys(ctx, m, ["user_id"], []);
    if (m.user_id === undefined || m.user_id === null) return;
    if (typeof m.user_id !== "string" || m.user_id.length > 256) fail(ctx, "invalid_value", `expected a string of at most 256 characters (got ${show(m.user_id)}).`, ["user_id"], m.user_id);
  }),
);

/** Fields of both routes (what the prompt is made of). */
const promptFields = {
  model: z.string().min(1),
  messages: messagesSchema,
  system: systemSchema,
  tools: toolsSchema,
  tool_choice: toolChoiceSchema,
  thinking: thinkingSchema,
  cache_control: z.unknown().optional().transform((v, ctx) => walk(ctx, undefined, () => checkCacheValue(ctx, v, []))),
  // Anthropic features Keel does not have: refused, not dropped.
  mcp_servers: unsupported((v) => Array.isArray(v) && v.length === 0, "MCP servers are not available; run the tools in your client."),
  container: unsupported(() => false, "Containers (code execution) are not available."),
  context_management: unsupported(() => false, "Context management is not available; send the conversation as it should be read."),
  output_config: unsupported(() => false, "Output configuration (effort, output formats) is not available."),
};

/** Fields of `POST …/messages` only. */
const generationFields = {
  max_tokens: z.number().int().min(1).max(UINT32_MAX),
  stop_sequences: z.array(z.unknown()).nullish().pipe(stopSchema as z.ZodType<string[], unknown[] | null | undefined>),
  temperature: range(0, 1),
  top_p: range(0, 1, true),
  top_k: range(1, UINT32_MAX, false, true),
  stream: z.boolean().nullish(),
  metadata: metadataSchema,
  service_tier: unsupported((v) => v === "auto" || v === "standard_only", "Only 'auto' and 'standard_only' are available (one tier)."),
  inference_geo: unsupported(() => false, "Inference geography is not selectable."),
  speed: unsupported((v) => v === "standard", "Only 'standard' speed is available."),
};

const countSchema = z.object(promptFields);
const messagesBodySchema = z.object({ ...promptFields, ...generationFields });

/** The prompt part of a parsed body. */
function promptOf(b: z.infer<typeof countSchema>): MessagesPromptRequest {
  // An empty system prompt ("" or []) is none: no empty system turn in the template.
  const system = b.system === "" ? null : b.system;
  const choice = b.tool_choice.choice;
  if (choice?.kind === "required" && b.tools.length === 0) throw invalidValue("tool_choice", "Invalid value for 'tool_choice': 'any' needs at least one tool in 'tools'.");
  return {
    model: b.model,
    messages: system !== null ? [{ role: "system", content: system }, ...b.messages] : b.messages,
    tools: b.tools,
    toolChoice: resolveToolChoice(b.tools, choice),
    parallelToolCalls: !b.tool_choice.noParallel,
    thinking: b.thinking,
  };
}

/** Validate a `count_tokens` body (400 naming the first offending field). */
export function parseCountTokensRequest(body: unknown): MessagesPromptRequest {
  checkKnownFields(body, fieldsOf(countSchema));
  const parsed = countSchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  return promptOf(parsed.data);
}

/** Validate a Messages body (400 naming the first offending field). */
export function parseMessagesRequest(body: unknown): MessagesRequest {
  checkKnownFields(body, fieldsOf(messagesBodySchema));
  const parsed = messagesBodySchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  if (b.thinking.kind === "enabled" && b.thinking.budgetTokens !== null && b.thinking.budgetTokens >= b.max_tokens) {
    throw invalidValue("thinking.budget_tokens", `Invalid value for 'thinking.budget_tokens': must be less than max_tokens (${b.max_tokens}; got ${b.thinking.budgetTokens}).`);
  }
  return {
    ...promptOf(b),
    maxTokens: b.max_tokens,
    stopSequences: b.stop_sequences,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    topK: b.top_k ?? -1,
    stream: b.stream ?? false,
  };
}
