/**
 * Tools for a chat template that cannot show them (issue #20): many small models' templates (SmolLM2's, the ChatML
 * fallback) render only `role` and `content`, so a request's `tools` would vanish from the prompt and a guided call
 * would be forced on a model that was never told the format. At engine ready the template is probed with marker
 * tools and messages ({@link probeToolSupport}); where it drops them and the server has a `--tool_parser`, the
 * messages are rewritten before rendering ({@link injectTools}): the tool definitions and the parser's call format go
 * into the system message, earlier assistant calls become text in that format, and tool results become user text —
 * so the model sees what a tool-aware template would have shown, and a tool loop keeps its history. (llama.cpp's
 * server polyfills templates the same way; the wording here is Keel's own.)
 */
import type { ToolCall, ToolParserName, ToolSpec } from "../tools.js";
import { withinNesting } from "../http/json-depth.js";
import { loneSurrogatePath } from "../http/lone-surrogate.js";

/** A chat message as this module needs it (chat-template.ts's ChatMessage, structurally). */
export interface PromptMessage {
  role: string;
  content: string;
  toolCalls?: ToolCall[];
  toolCallId?: string;
  name?: string;
  reasoningContent?: string;
}

/** What a template renders of the tool vocabulary (each probed by a unique marker that must appear in the prompt). */
export interface TemplateToolSupport {
  /** The `tools` variable reaches the prompt. */
  tools: boolean;
  /** An assistant message's `tool_calls` reach the prompt. */
  toolCalls: boolean;
  /** A `system` message's content reaches the prompt (and the role is not refused). */
  systemRole: boolean;
}

/** Renders messages with optional tools; any failure counts as "not shown". */
export type ProbeRender = (messages: PromptMessage[], tools: readonly ToolSpec[], addGenerationPrompt: boolean) => string;

/** Marker names no real conversation uses, so their presence in the prompt can only come from the probe. */
const MARK = { tool: "keel_probe_tool_7f3a", call: "keel_probe_call_9c1e", system: "keel_probe_system_e85f" } as const;

/**
 * Probes `render` (the model's template, without injection) with marker tools and messages. Each capability is
 * probed on its own, so a template that raises on one (e.g. a `tool` role) still reports the others.
 */
export function probeToolSupport(render: ProbeRender): TemplateToolSupport {
  const shows = (marker: string, messages: PromptMessage[], tools: readonly ToolSpec[], genPrompt: boolean): boolean => {
    try {
      return render(messages, tools, genPrompt).includes(marker);
    } catch {
      return false;
    }
  };
  const user: PromptMessage = { role: "user", content: "Hello" };
  const call: ToolCall = { id: "call_probe", name: MARK.call, arguments: '{"x": 1}' };
  const assistant: PromptMessage = { role: "assistant", content: "", toolCalls: [call] };
  const probeTool: ToolSpec = { name: MARK.tool, description: "probe", parameters: { type: "object", properties: { x: { type: "integer" } } } };
  return {
    tools: shows(MARK.tool, [user], [probeTool], true),
    toolCalls: shows(MARK.call, [user, assistant], [], false),
    systemRole: shows(MARK.system, [{ role: "system", content: MARK.system }, user], [], true),
  };
}

/** True when the template drops something a tool conversation needs (then {@link injectTools} applies). */
export function needsToolInjection(s: TemplateToolSupport): boolean {
  return !s.tools;
}

/** One example call per format, with placeholders, as the instructions show it. */
const EXAMPLE: Readonly<Record<ToolParserName, string>> = {
  hermes3: '<tool_call>\n{"name": "TOOL_NAME", "arguments": {"ARGUMENT_NAME": "VALUE"}}\n</tool_call>',
  qwen3coder: "<tool_call>\n<function=TOOL_NAME>\n<parameter=ARGUMENT_NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>",
  llama3: '{"name": "TOOL_NAME", "parameters": {"ARGUMENT_NAME": "VALUE"}}',
};

/** What each format says about several calls. */
const SEVERAL: Readonly<Record<ToolParserName, string>> = {
  hermes3: "For several calls, write one such block per call.",
  qwen3coder: "For several calls, write one such block per call; write each argument as its own <parameter=…> block.",
  llama3: "For several calls, separate the JSON objects with ';'.",
};

/**
 * The system text that declares `tools` and the call format of `format`: the tools as JSON (one per line, in the
 * nested OpenAI shape), then how to call one, with an example.
 */
export function toolSystemText(format: ToolParserName, tools: readonly ToolSpec[]): string {
  const defs = tools.map((t) => JSON.stringify({ type: "function", function: { name: t.name, ...(t.description !== undefined ? { description: t.description } : {}), parameters: t.parameters ?? { type: "object", properties: {} } } }));
  return [
    "# Tools",
    "",
    "You can call the following tools. Each is described by a JSON object, its arguments by a JSON schema:",
    "<tools>",
    ...defs,
    "</tools>",
    "",
    "To call a tool, reply with the call in exactly this format, replacing the names and values:",
    EXAMPLE[format],
    "End your reply after the call: the tool's result comes back to you in a <tool_response></tool_response> block.",
    SEVERAL[format],
  ].join("\n");
}

/** `arguments` (a JSON text) as an object, or null when it is not one. */
function argumentsObject(text: string): Record<string, unknown> | null {
  if (!withinNesting(text)) return null;
  try {
    const v: unknown = JSON.parse(text);
    // A lone surrogate escaped inside the text is no character once parsed: not an object to show.
    return typeof v === "object" && v !== null && !Array.isArray(v) && loneSurrogatePath(v) === null ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** One call as the model would have written it in `format` (what the output parser reads back). */
export function callText(format: ToolParserName, call: ToolCall): string {
  const args = argumentsObject(call.arguments);
  if (format === "qwen3coder") {
    // Strings raw, everything else as JSON (the parser types values by the tool's schema); arguments that are not
    // an object cannot be parameters: they go in one `arguments` parameter, as written.
    const params = args === null ? [["arguments", call.arguments] as const] : Object.entries(args).map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)] as const);
    return ["<tool_call>", `<function=${call.name}>`, ...params.map(([k, v]) => `<parameter=${k}>\n${v}\n</parameter>`), "</function>", "</tool_call>"].join("\n");
  }
  const key = format === "llama3" ? "parameters" : "arguments";
  const json = `{"name": ${JSON.stringify(call.name)}, "${key}": ${args === null ? JSON.stringify(call.arguments) : JSON.stringify(args)}}`;
  return format === "hermes3" ? `<tool_call>\n${json}\n</tool_call>` : json;
}

/** An assistant message's content with its calls appended as text. */
function assistantText(format: ToolParserName, m: PromptMessage): string {
  const calls = (m.toolCalls ?? []).map((c) => callText(format, c));
  const joined = format === "llama3" ? calls.join(";") : calls.join("\n");
  return m.content === "" ? joined : `${m.content}\n${joined}`;
}

/** A tool result as user text. */
function responseText(m: PromptMessage): string {
  return `<tool_response>\n${m.content}\n</tool_response>`;
}

/**
 * `messages` rewritten for a template with support `s`, for the tools of this request in `format`:
 * 1. with tools, their definitions and the call format go first in the system message (one is added when there
 *    is none; where the template drops system messages, at the start of the first user message);
 * 2. assistant calls the template would drop become text in `format` (the call ids are lost with them);
 * 3. tool results become user messages of `<tool_response>` blocks, consecutive ones merged into one: a template
 *    without tools has no tool turn the model was trained on (SmolLM2's would print a bare `tool` role).
 */
export function injectTools(messages: readonly PromptMessage[], tools: readonly ToolSpec[], format: ToolParserName, s: TemplateToolSupport): PromptMessage[] {
  const out: PromptMessage[] = [];
  for (const m of messages) {
    // 1. Calls and results as text where the template drops them.
    if (m.role === "assistant" && m.toolCalls !== undefined && m.toolCalls.length > 0 && !s.toolCalls) {
      const { toolCalls: _calls, ...rest } = m;
      out.push({ ...rest, content: assistantText(format, m) });
    } else if (m.role === "tool") {
      const prev = out[out.length - 1];
      if (prev !== undefined && prev.role === "user" && prev.content.endsWith("</tool_response>")) prev.content += `\n${responseText(m)}`;
      else out.push({ role: "user", content: responseText(m) });
    } else out.push({ ...m });
  }
  if (tools.length === 0) return out;
  // 2. The tools and the format, before any system text the client gave.
  const text = toolSystemText(format, tools);
  const first = out[0];
  if (first !== undefined && (first.role === "system" || first.role === "developer") && s.systemRole) {
    out[0] = { ...first, content: first.content === "" ? text : `${text}\n\n${first.content}` };
  } else if (s.systemRole) {
    out.unshift({ role: "system", content: text });
  } else {
    const u = out.findIndex((m) => m.role === "user");
    if (u >= 0) out[u] = { ...out[u]!, content: `${text}\n\n${out[u]!.content}` };
    else out.unshift({ role: "user", content: text });
  }
  return out;
}
