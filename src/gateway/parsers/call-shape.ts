/**
 * Turning a parsed JSON value into tool calls: `{"name": …, "arguments": {…}}` (also `"parameters"`, also arguments
 * given as a JSON text, also wrapped as OpenAI's `{"type": "function", "function": {…}}`), or a list of them.
 * Shared by hermes3, llama3 and the bare-call detector.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";

/** A call found in the output, before it gets its index and id. */
export interface FoundCall {
  name: string;
  /** Compact JSON text of the arguments object. */
  arguments: string;
}

/**
 * The call(s) `value` describes, or null when it is not a call (then the caller keeps the raw text as content).
 * `declaredOnly`: the name must be one of `tools` — required where no tag says "this is a call" (a bare JSON answer
 * naming an unknown function is more likely an answer than a call).
 */
export function callsFromJson(value: unknown, tools: readonly ToolSpec[], declaredOnly: boolean): FoundCall[] | null {
  const items = Array.isArray(value) ? value : [value];
  if (items.length === 0) return null;
  const calls: FoundCall[] = [];
  for (const item of items) {
    const call = callFromObject(item, tools, declaredOnly);
    if (call === null) return null;
    calls.push(call);
  }
  return calls;
}

function callFromObject(item: unknown, tools: readonly ToolSpec[], declaredOnly: boolean): FoundCall | null {
  if (!isPlainObject(item)) return null;
  // Why: small models sometimes echo OpenAI's own shape, `{"type": "function", "function": {"name": …}}`.
  const wrapped = item["function"];
  if (item["name"] === undefined && isPlainObject(wrapped)) return callFromObject(wrapped, tools, declaredOnly);
  const name = item["name"];
  if (typeof name !== "string" || name.trim() === "") return null;
  if (declaredOnly && !tools.some((t) => t.name === name)) return null;
  // Why both keys: Qwen and Hermes write "arguments", Llama 3 writes "parameters"; small models mix them up.
  let args: unknown = "arguments" in item ? item["arguments"] : "parameters" in item ? item["parameters"] : {};
  if (typeof args === "string") {
    // Why: some models send the arguments as a JSON text (OpenAI's own wire shape) instead of an object.
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  if (!isPlainObject(args)) return null;
  return { name, arguments: JSON.stringify(args) };
}

/** A JSON object (not an array, not null). */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** `JSON.parse`, or `undefined` when the text is not JSON. */
export function tryParseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
