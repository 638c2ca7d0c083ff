/**
 * The `input` of a Responses request as the chat turns a template renders: a string is one user message; a list
 * holds `message` items (text content: a string or `input_text` / `output_text` parts), and the items an agent
 * gives back from earlier turns — `reasoning` (its `reasoning_text` content, else its summary), `function_call` and
 * `function_call_output`. Consecutive assistant-side items (reasoning, an assistant message, calls) form one
 * assistant turn, as chat's `{reasoning_content, content, tool_calls}` message. Problems are reported with the item's
 * path (`input[2].call_id`).
 */
import { z } from "zod";
import type { ChatMessage } from "../models/chat-template.js";
import { describe, isPlainObject, report } from "./chat-request.js";
import type { IssueCtx } from "./request-issues.js";

const INPUT_ROLES = ["user", "assistant", "system", "developer"] as const;
/** Content part types OpenAI defines that Keel (text only) refuses as unsupported rather than invalid. */
const UNSUPPORTED_PARTS = new Set(["input_image", "input_file", "input_audio", "refusal"]);

/**
 * Text of a list of parts whose type is one of `types` (joined with "\n"), or null after reporting a problem.
 * @param at - Path of the list (e.g. `[2, "content"]`).
 */
function partsText(parts: unknown, types: readonly string[], at: PropertyKey[], ctx: IssueCtx): string | null {
  if (typeof parts === "string") return parts;
  if (!Array.isArray(parts) || parts.length === 0) {
    report(ctx, "invalid_value", `expected a string or a non-empty array of ${types.join(" / ")} parts, but got ${describe(parts)}.`, at, parts);
    return null;
  }
  const texts: string[] = [];
  for (const [j, part] of parts.entries()) {
    const type = isPlainObject(part) ? part.type : undefined;
    if (!isPlainObject(part) || typeof type !== "string" || !types.includes(type) || typeof part.text !== "string") {
      if (typeof type === "string" && UNSUPPORTED_PARTS.has(type)) {
        report(ctx, "unsupported_field", `Content parts of type '${type}' are not supported; only ${types.map((t) => `'${t}'`).join(", ")} are.`, [...at, j, "type"], type);
      } else report(ctx, "invalid_value", `expected a {"type": "${types[0]}", "text": string} part.`, [...at, j], part);
      return null;
    }
    texts.push(part.text);
  }
  return texts.join("\n");
}

/** A string field of an item; null (after reporting when `required`) when absent or not a string. */
function itemString(item: Record<string, unknown>, key: string, i: number, required: boolean, ctx: IssueCtx): string | null {
  const v = item[key];
  if (v === undefined || v === null) {
    if (required) report(ctx, "missing_field", "", [i, key]);
    return null;
  }
  if (typeof v !== "string") {
    report(ctx, "invalid_type", `expected a string, but got ${describe(v)} instead.`, [i, key], v);
    return null;
  }
  return v;
}

/** The reasoning text of a `reasoning` item given back: its content, else its summary; null after a problem. */
function reasoningText(item: Record<string, unknown>, i: number, ctx: IssueCtx): string | null {
  if (item.encrypted_content !== undefined && item.encrypted_content !== null) {
    report(ctx, "unsupported_field", "Keel produces no encrypted reasoning and cannot read one; give the reasoning back as its 'content'.", [i, "encrypted_content"], item.encrypted_content);
    return null;
  }
  const hasContent = Array.isArray(item.content) && item.content.length > 0;
  if (hasContent) return partsText(item.content, ["reasoning_text"], [i, "content"], ctx);
  if (item.summary === undefined || item.summary === null) {
    report(ctx, "missing_field", "", [i, "summary"]);
    return null;
  }
  if (Array.isArray(item.summary) && item.summary.length === 0) return "";
  return partsText(item.summary, ["summary_text"], [i, "summary"], ctx);
}

/** The assistant turn the next assistant-side item joins: the last message when it is an assistant's. */
function assistantTurn(out: ChatMessage[]): ChatMessage | null {
  const last = out.at(-1);
  return last?.role === "assistant" ? last : null;
}

/**
 * Append one list item to the conversation. Returns false after reporting a problem.
 * 1. `function_call_output` → a tool message; 2. `function_call` → a call of the current assistant turn (or a new
 * one); 3. `reasoning` → a new assistant turn's reasoning (or more of a turn that has only reasoning so far);
 * 4. a message → its role's turn (an assistant message fills a turn that has only reasoning so far).
 */
function addItem(out: ChatMessage[], item: Record<string, unknown>, i: number, ctx: IssueCtx): boolean {
  if (item.type === "function_call_output") {
    const callId = itemString(item, "call_id", i, true, ctx);
    if (callId === null) return false;
    if (item.output === undefined || item.output === null) {
      report(ctx, "missing_field", "", [i, "output"]);
      return false;
    }
    const output = partsText(item.output, ["input_text"], [i, "output"], ctx);
    if (output === null) return false;
    out.push({ role: "tool", content: output, toolCallId: callId });
    return true;
  }
  if (item.type === "function_call") {
    const callId = itemString(item, "call_id", i, true, ctx);
    const name = callId === null ? null : itemString(item, "name", i, true, ctx);
    if (callId === null || name === null) return false;
    const args = itemString(item, "arguments", i, false, ctx);
    if (args === null && item.arguments !== undefined && item.arguments !== null) return false;
    const call = { id: callId, name, arguments: args ?? "{}" };
    const turn = assistantTurn(out);
    if (turn) turn.toolCalls = [...(turn.toolCalls ?? []), call];
    else out.push({ role: "assistant", content: "", toolCalls: [call] });
    return true;
  }
  if (item.type === "reasoning") {
    const text = reasoningText(item, i, ctx);
    if (text === null) return false;
    const turn = assistantTurn(out);
    if (turn && turn.content === "" && !turn.toolCalls) turn.reasoningContent = [turn.reasoningContent, text].filter((t) => t).join("\n");
    else out.push({ role: "assistant", content: "", reasoningContent: text });
    return true;
  }
  if (item.type !== undefined && item.type !== "message") {
    const why = item.type === "item_reference" ? "Keel keeps no server-side state, so items cannot be referenced by id; send the item itself." : "Only message, reasoning, function_call and function_call_output items are supported.";
    report(ctx, "unsupported_field", `Input items of type ${describe(item.type)} are not supported. ${why}`, [i, "type"], item.type);
    return false;
  }
  if (typeof item.role !== "string" || !(INPUT_ROLES as readonly string[]).includes(item.role)) {
    report(ctx, "invalid_value", `expected one of ${INPUT_ROLES.map((r) => `'${r}'`).join(", ")}.`, [i, "role"], item.role);
    return false;
  }
  if (item.content === undefined || item.content === null) {
    report(ctx, "missing_field", "", [i, "content"]);
    return false;
  }
  const text = partsText(item.content, ["input_text", "output_text"], [i, "content"], ctx);
  if (text === null) return false;
  const turn = item.role === "assistant" ? assistantTurn(out) : null;
  if (turn && turn.content === "" && !turn.toolCalls) turn.content = text;
  else out.push({ role: item.role, content: text });
  return true;
}

/** `input`: a string (one user message) or a non-empty list of items. */
export const inputSchema = z.unknown().transform((v, ctx): ChatMessage[] => {
  if (typeof v === "string") return [{ role: "user", content: v }];
  if (v === undefined || v === null) {
    report(ctx, "missing_field", "", [], v);
    return [];
  }
  if (!Array.isArray(v) || v.length === 0) {
    report(ctx, "invalid_value", `expected a string or a non-empty array of input items, but got ${describe(v)}.`, [], v);
    return [];
  }
  const out: ChatMessage[] = [];
  for (const [i, item] of v.entries()) {
    if (!isPlainObject(item)) {
      report(ctx, "invalid_type", `expected an input item object, but got ${describe(item)} instead.`, [i], item);
      return [];
    }
    if (!addItem(out, item, i, ctx)) return [];
  }
  return out;
});
