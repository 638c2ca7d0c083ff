/**
 * The server's agent settings (`--tool_parser`, `--reasoning_parser`, `--enable_tool_guided_generation`) and their
 * resolution against the current engine's chat template: `--tool_parser auto` becomes a concrete format (or none)
 * once the engine is ready, because only then is the model's template known.
 */
import type { ReasoningParserName, ToolParserName } from "../tools.js";

/** The flags as given (unknown names were refused at start by the CLI). */
export interface AgentFlags {
  /** `--tool_parser`; null = unset (requests with active tools are refused). */
  toolParser: ToolParserName | "auto" | null;
  /** `--reasoning_parser`; null = unset (reasoning stays in content). */
  reasoningParser: ReasoningParserName | null;
  /** `--enable_tool_guided_generation`: guide `tool_choice: auto` too. */
  guideAuto: boolean;
}

/** What requests use: the flags with `auto` resolved for the current model. */
export interface AgentSettings {
  /** Call format to parse and guide; null = none (tools refused with a 400 naming the flag). */
  toolParser: ToolParserName | null;
  /** Reasoning format (`--reasoning_parser`), or null. */
  reasoningParser: ReasoningParserName | null;
  /** `--enable_tool_guided_generation`: guide `tool_choice: auto` too. */
  guideAuto: boolean;
  /** How the tool parser was chosen, for the start log and the 400 (`flag`, `template`, or `auto found none`). */
  toolParserSource: "flag" | "template" | "none" | "auto_found_none";
  /**
   * The model's template cannot show tools, so they are written into the messages (models/tool-prompt.ts); absent =
   * false. Such a model was never trained to end a turn after its calls: guided output allows one call per turn.
   */
  toolsInjected?: boolean;
}

/** No agent flags: no parsing, no guided `auto`. */
export const NO_AGENT_FLAGS: AgentFlags = { toolParser: null, reasoningParser: null, guideAuto: false };

/**
 * Resolve the flags for a model whose chat template source is `template` (null = the model has none).
 * @param pick - Chooses a format from a template's source (parsers' pickToolParser), null when none matches.
 */
export function resolveAgentSettings(flags: AgentFlags, template: string | null, pick: (template: string) => ToolParserName | null): AgentSettings {
  const base = { reasoningParser: flags.reasoningParser, guideAuto: flags.guideAuto };
  if (flags.toolParser === null) return { ...base, toolParser: null, toolParserSource: "none" };
  if (flags.toolParser !== "auto") return { ...base, toolParser: flags.toolParser, toolParserSource: "flag" };
  const picked = template === null ? null : pick(template);
  return picked === null ? { ...base, toolParser: null, toolParserSource: "auto_found_none" } : { ...base, toolParser: picked, toolParserSource: "template" };
}
