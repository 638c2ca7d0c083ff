/**
 * Validation of the chat request's agent fields — `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`,
 * and the assistant/tool message extras (`tool_calls`, `tool_call_id`, `name`, `reasoning_content`) — into the
 * shared vocabulary of tools.ts. Problems are reported as zod issues with the field path (chat-request.ts turns the
 * first one into an OpenAI-shaped 400), e.g. `tools[1].function.name`, `messages[2].tool_calls[0].function.name`.
 *
 * Accepted shapes follow OpenAI, plus OVMS's flat tool `{type:"function", name, parameters}`. Only the structure is
 * checked here; whether a schema can be turned into a grammar is buildGuide's question (guided/guide.ts).
 *
 * @module
 */
import { z } from "zod";
import { describe, show } from "../http/errors.js";
import type { ResponseFormat, ToolCall, ToolChoice, ToolSpec } from "../tools.js";

/** OpenAI's rule for function names (and `response_format.json_schema.name`, without the dot). */
export const TOOL_NAME_PATTERN = /^[a-zA-Z0-9_.-]{1,64}$/;
const SCHEMA_NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;
/** Most tools per request (OpenAI's documented limit). */
export const MAX_TOOLS = 128;

/** How a custom issue is reported (see chat-request.ts `issueToError`). */
type IssueKind = "invalid_type" | "invalid_value" | "missing_field" | "unsupported_field";

interface IssueCtx {
  addIssue(issue: { code: "custom"; message: string; path?: PropertyKey[]; params?: Record<string, unknown>; input?: unknown }): void;
}

/** Thrown inside the walkers below to stop at the first problem (zod collects; we report only the first anyway). */
class Stop extends Error {}

function fail(ctx: IssueCtx, kind: IssueKind, detail: string, path: PropertyKey[], input?: unknown): never {
  ctx.addIssue({ code: "custom", message: detail, path, params: { kind }, input });
  throw new Stop();
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A required string field; `nonEmpty` refuses "". */
function needString(ctx: IssueCtx, obj: Record<string, unknown>, key: string, path: PropertyKey[], nonEmpty = true): string {
  const v = obj[key];
  if (v === undefined || v === null) fail(ctx, "missing_field", "", [...path, key]);
  if (typeof v !== "string") fail(ctx, "invalid_type", `expected a string, but got ${describe(v)} instead.`, [...path, key], v);
  if (nonEmpty && v.length === 0) fail(ctx, "invalid_value", "expected a non-empty string.", [...path, key], v);
  return v;
}

/** An optional field of a given JS type (null = absent). */
function optional<T>(ctx: IssueCtx, obj: Record<string, unknown>, key: string, path: PropertyKey[], type: "string" | "boolean"): T | undefined {
  const v = obj[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== type) fail(ctx, "invalid_type", `expected ${type === "string" ? "a string" : "a boolean"}, but got ${describe(v)} instead.`, [...path, key], v);
  return v as T;
}

function checkToolName(ctx: IssueCtx, name: string, path: PropertyKey[]): void {
  if (!TOOL_NAME_PATTERN.test(name)) {
    fail(ctx, "invalid_value", `a function name must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '.' or '-' (got ${show(name)}).`, path, name);
  }
}

/** One tool: nested `{type, function:{name, description, parameters, strict}}` or flat `{type, name, …}`. */
function parseTool(ctx: IssueCtx, raw: unknown, i: number): ToolSpec {
  const at: PropertyKey[] = [i];
  if (!isObject(raw)) fail(ctx, "invalid_type", `expected an object, but got ${describe(raw)} instead.`, at, raw);
  if (raw.type === undefined || raw.type === null) fail(ctx, "missing_field", "", [...at, "type"]);
  if (raw.type !== "function") {
    fail(ctx, "unsupported_field", `Only tools of type 'function' are supported (got ${show(raw.type)}).`, [...at, "type"], raw.type);
  }
  // Nested when `function` is present (OpenAI); flat otherwise (OVMS).
  const nested = raw.function !== undefined;
  let fn: Record<string, unknown>;
  let fnPath: PropertyKey[];
  if (nested) {
    if (!isObject(raw.function)) fail(ctx, "invalid_type", `expected an object, but got ${describe(raw.function)} instead.`, [...at, "function"], raw.function);
    fn = raw.function;
    fnPath = [...at, "function"];
  } else {
    fn = raw;
    fnPath = at;
  }
  const name = needString(ctx, fn, "name", fnPath);
  checkToolName(ctx, name, [...fnPath, "name"]);
  const tool: ToolSpec = { name };
  const description = optional<string>(ctx, fn, "description", fnPath, "string");
  if (description !== undefined) tool.description = description;
  const parameters = fn.parameters;
  if (parameters !== undefined && parameters !== null) {
    if (!isObject(parameters)) {
      fail(ctx, "invalid_type", `expected an object (a JSON schema), but got ${describe(parameters)} instead.`, [...fnPath, "parameters"], parameters);
    }
    tool.parameters = parameters;
  }
  const strict = optional<boolean>(ctx, fn, "strict", fnPath, "boolean");
  if (strict !== undefined) tool.strict = strict;
  return tool;
}

/** `tools`: null/absent → []; else an array of ≤ {@link MAX_TOOLS} function tools with unique names. */
export const toolsSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): ToolSpec[] => {
    if (v === undefined || v === null) return [];
    try {
      if (!Array.isArray(v)) fail(ctx, "invalid_type", `expected an array of tools, but got ${describe(v)} instead.`, [], v);
      if (v.length > MAX_TOOLS) fail(ctx, "invalid_value", `expected at most ${MAX_TOOLS} tools, but got ${v.length}.`, [], v);
      const tools = v.map((t, i) => parseTool(ctx, t, i));
      const seen = new Set<string>();
      for (const [i, t] of tools.entries()) {
        if (seen.has(t.name)) {
          const nested = isObject(v[i]) && v[i].function !== undefined;
          fail(ctx, "invalid_value", `the function name ${show(t.name)} is declared more than once.`, nested ? [i, "function", "name"] : [i, "name"], t.name);
        }
        seen.add(t.name);
      }
      return tools;
    } catch (err) {
      if (err instanceof Stop) return [];
      throw err;
    }
  });

/**
 * `tool_choice` as given (the default and the check against `tools` are applied by parseChatRequest, which knows
 * the tools): `"none" | "auto" | "required"`, `{type:"function", function:{name}}` or `{type:"function", name}`.
 */
export const toolChoiceSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): ToolChoice | undefined => {
    if (v === undefined || v === null) return undefined;
    try {
      if (typeof v === "string") {
        if (v === "none" || v === "auto" || v === "required") return { kind: v };
        fail(ctx, "invalid_value", `expected 'none', 'auto', 'required' or {"type": "function", "function": {"name": …}} (got ${show(v)}).`, [], v);
      }
      if (!isObject(v)) fail(ctx, "invalid_type", `expected a string or an object, but got ${describe(v)} instead.`, [], v);
      if (v.type === undefined || v.type === null) fail(ctx, "missing_field", "", ["type"]);
      if (v.type !== "function") fail(ctx, "invalid_value", `expected 'function' (got ${show(v.type)}).`, ["type"], v.type);
      if (v.function !== undefined) {
        if (!isObject(v.function)) fail(ctx, "invalid_type", `expected an object, but got ${describe(v.function)} instead.`, ["function"], v.function);
        return { kind: "function", name: needString(ctx, v.function, "name", ["function"]) };
      }
      return { kind: "function", name: needString(ctx, v, "name", []) };
    } catch (err) {
      if (err instanceof Stop) return undefined;
      throw err;
    }
  });

/** `response_format`: null/absent → text; `{type:"text"}`, `{type:"json_object"}`, `{type:"json_schema", json_schema:{name, schema, strict}}`. */
export const responseFormatSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): ResponseFormat => {
    if (v === undefined || v === null) return { kind: "text" };
    try {
      if (!isObject(v)) fail(ctx, "invalid_type", `expected an object, but got ${describe(v)} instead.`, [], v);
      if (v.type === undefined || v.type === null) fail(ctx, "missing_field", "", ["type"]);
      if (v.type === "text") return { kind: "text" };
      if (v.type === "json_object") return { kind: "json_object" };
      if (v.type !== "json_schema") fail(ctx, "invalid_value", `expected one of 'text', 'json_object', 'json_schema' (got ${show(v.type)}).`, ["type"], v.type);
      const js = v.json_schema;
      if (js === undefined || js === null) fail(ctx, "missing_field", "", ["json_schema"]);
      if (!isObject(js)) fail(ctx, "invalid_type", `expected an object, but got ${describe(js)} instead.`, ["json_schema"], js);
      const name = needString(ctx, js, "name", ["json_schema"]);
      if (!SCHEMA_NAME_PATTERN.test(name)) {
        fail(ctx, "invalid_value", `the schema name must be 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-' (got ${show(name)}).`, ["json_schema", "name"], name);
      }
      optional<string>(ctx, js, "description", ["json_schema"], "string");
      const schema = js.schema;
      if (schema === undefined || schema === null) fail(ctx, "missing_field", "", ["json_schema", "schema"]);
      if (!isObject(schema)) fail(ctx, "invalid_type", `expected an object (a JSON schema), but got ${describe(schema)} instead.`, ["json_schema", "schema"], schema);
      const strict = optional<boolean>(ctx, js, "strict", ["json_schema"], "boolean") ?? false;
      return { kind: "json_schema", name, schema, strict };
    } catch (err) {
      if (err instanceof Stop) return { kind: "text" };
      throw err;
    }
  });

/** The agent extras of one message, as the template sees them. */
export interface MessageExtras {
  toolCalls?: ToolCall[];
  toolCallId?: string;
  name?: string;
  reasoningContent?: string;
}

/**
 * Reads `tool_calls` (assistant), `tool_call_id` (tool, required), `name` and `reasoning_content` (assistant) of one
 * message; paths are relative to the message. Returns null after reporting a problem.
 */
export function parseMessageExtras(role: string, m: Record<string, unknown>, ctx: IssueCtx): MessageExtras | null {
  try {
    const out: MessageExtras = {};
    const name = optional<string>(ctx, m, "name", [], "string");
    if (name !== undefined) out.name = name;
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (role !== "assistant") fail(ctx, "invalid_value", "only assistant messages may carry tool calls.", ["tool_calls"], m.tool_calls);
      if (!Array.isArray(m.tool_calls)) fail(ctx, "invalid_type", `expected an array, but got ${describe(m.tool_calls)} instead.`, ["tool_calls"], m.tool_calls);
      out.toolCalls = m.tool_calls.map((raw, j): ToolCall => {
        const at: PropertyKey[] = ["tool_calls", j];
        if (!isObject(raw)) fail(ctx, "invalid_type", `expected an object, but got ${describe(raw)} instead.`, at, raw);
        if (raw.type !== undefined && raw.type !== null && raw.type !== "function") {
          fail(ctx, "invalid_value", `expected 'function' (got ${show(raw.type)}).`, [...at, "type"], raw.type);
        }
        const id = needString(ctx, raw, "id", at);
        if (raw.function === undefined || raw.function === null) fail(ctx, "missing_field", "", [...at, "function"]);
        if (!isObject(raw.function)) fail(ctx, "invalid_type", `expected an object, but got ${describe(raw.function)} instead.`, [...at, "function"], raw.function);
        const fname = needString(ctx, raw.function, "name", [...at, "function"]);
        // OVMS defaults missing arguments to "{}"; a client replaying our own answers always sends a string.
        const args = raw.function.arguments;
        if (args !== undefined && args !== null && typeof args !== "string") {
          fail(ctx, "invalid_type", `expected a string (the arguments as JSON text), but got ${describe(args)} instead.`, [...at, "function", "arguments"], args);
        }
        return { id, name: fname, arguments: typeof args === "string" ? args : "{}" };
      });
    }
    if (role === "tool") out.toolCallId = needString(ctx, m, "tool_call_id", []);
    else if (m.tool_call_id !== undefined && m.tool_call_id !== null) {
      fail(ctx, "invalid_value", "only tool messages carry a tool_call_id.", ["tool_call_id"], m.tool_call_id);
    }
    const reasoning = optional<string>(ctx, m, "reasoning_content", [], "string");
    if (reasoning !== undefined) {
      if (role !== "assistant") fail(ctx, "invalid_value", "only assistant messages carry reasoning_content.", ["reasoning_content"], reasoning);
      out.reasoningContent = reasoning;
    }
    return out;
  } catch (err) {
    if (err instanceof Stop) return null;
    throw err;
  }
}
