/**
 * What a chat request's agent fields mean for one generation, given the server's agent settings: which tools the
 * template declares, whether tools can be served at all, and the output parser of each choice. (The guide for the
 * engine is built next to it, in guide-plan.ts.)
 */
import type { AgentSettings } from "../models/agent-config.js";
import type { ChatRequest } from "./chat-request.js";
import { toolsNotServed } from "../http/errors.js";
import { createOutputParser, promptOpensReasoning, type OutputParser } from "../parsers/index.js";
import type { ToolParserName, ToolSpec } from "../tools.js";

type AgentFields = Pick<ChatRequest, "tools" | "toolChoice">;

/** True when the request asks for tool calls: tools given and tool_choice is not `none`. */
export function toolsActive(body: AgentFields): boolean {
  return body.tools.length > 0 && body.toolChoice.kind !== "none";
}

/** The tools the template declares: none for `none`, only the named one for a named function (as OVMS), else all. */
export function toolsForTemplate(body: AgentFields): ToolSpec[] {
  const choice = body.toolChoice;
  if (choice.kind === "none") return [];
  if (choice.kind === "function") return body.tools.filter((t) => t.name === choice.name);
  return [...body.tools];
}

/**
 * The tool-call format for this request, or null when it asks for no calls.
 * @throws KeelHttpError 400 when it asks for calls and the server has no tool parser (never accepted and ignored).
 */
export function requestToolParser(body: AgentFields, agents: AgentSettings): ToolParserName | null {
  if (!toolsActive(body)) return null;
  if (agents.toolParser === null) throw toolsNotServed(agents.toolParserSource === "auto_found_none");
  return agents.toolParser;
}

/** Whether the output starts inside reasoning: the server parses reasoning and the rendered prompt opened it. */
export function reasoningOpen(agents: AgentSettings, prompt: string): boolean {
  return agents.reasoningParser !== null && promptOpensReasoning(prompt);
}

/**
 * The prompt already closed reasoning (it ends with `</think>`: the template switched thinking off with an empty
 * `<think></think>` block, as Qwen3's does for `enable_thinking: false`). A guide then forces its rule from the first
 * token instead of letting the model open reasoning again.
 */
export function reasoningClosed(agents: AgentSettings, prompt: string): boolean {
  return agents.reasoningParser !== null && prompt.trimEnd().endsWith("</think>");
}

/** The per-choice parser factory, or undefined when nothing is parsed (no tool format for it, no reasoning parser). */
export function outputParserFactory(body: AgentFields, toolParser: ToolParserName | null, agents: AgentSettings, prompt: string): (() => OutputParser) | undefined {
  if (toolParser === null && agents.reasoningParser === null) return undefined;
  const open = reasoningOpen(agents, prompt);
  const tools = toolParser === null ? [] : toolsForTemplate(body);
  return () => createOutputParser({ toolParser, tools, reasoningParser: agents.reasoningParser, reasoningOpen: open });
}
