/**
 * The guided-generation seam: from a validated request (tools, tool_choice, response_format) and the server's
 * parser choice to the protocol's {@link GuideSpec}, or to a 400 before anything reaches the engine.
 */
import type { GuideSpec } from "../../protocol/messages.js";
import type { ReasoningParserName, ResponseFormat, ToolChoice, ToolParserName, ToolSpec } from "../tools.js";

/** Inputs of `buildGuide` (guided/guide.ts). */
export interface GuideRequest {
  /** Call format to constrain (the server's `--tool_parser`, resolved from the template for `auto`). */
  toolParser: ToolParserName | null;
  tools: readonly ToolSpec[];
  toolChoice: ToolChoice;
  /** `parallel_tool_calls` (default true): false allows at most one call. */
  parallelToolCalls: boolean;
  responseFormat: ResponseFormat;
  /** `--enable_tool_guided_generation`: guide `auto` too (required / named / response_format are always guided). */
  guideAuto: boolean;
  /** Reasoning markers when the server has a reasoning parser, and whether the prompt already opened reasoning. */
  reasoning: { parser: ReasoningParserName; open: boolean } | null;
}

/** The result: a guide for the engine, or none (nothing to constrain). Throws a KeelHttpError 400 on a bad schema. */
export type BuildGuide = (req: GuideRequest) => GuideSpec | null;
