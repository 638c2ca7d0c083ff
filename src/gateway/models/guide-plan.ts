/**
 * The engine guide of one chat request (issue #9: tool-guided generation and structured output), built at
 * admission from the request's tools / tool_choice / parallel_tool_calls / response_format and the server's agent
 * settings. A schema the converter cannot take is a 400 here, before anything reaches the engine; a request that
 * needs a guide on an engine without the `grammars` capability is a 400 too (never run unconstrained silently).
 */
import type { EngineCapabilities, GuideSpec } from "../../protocol/messages.js";
import type { AgentSettings } from "./agent-config.js";
import { reasoningClosed, reasoningOpen, toolsActive } from "../api/agent-request.js";
import type { ChatRequest } from "../api/chat-request.js";
import { guidedNotSupported } from "../http/errors.js";
import { constraintField } from "../guided/output-rule.js";
import type { BuildGuide, GuideRequest } from "../guided/types.js";
import type { ToolParserName } from "../tools.js";

type GuideFields = Pick<ChatRequest, "tools" | "toolChoice" | "parallelToolCalls" | "responseFormat">;

/**
 * The guide for the engine, or null when nothing is constrained.
 *
 * Tool schemas are checked on every request with active tools, guided or not (built as if `auto` were guided, the
 * result dropped when it is not): whether a request is refused for a bad schema must not depend on a server flag.
 *
 * @param build - The guide builder (guided/guide.ts `buildGuide`).
 * @param toolParser - This request's tool format (null when it asks for no calls).
 * @throws KeelHttpError 400 for a schema the converter refuses, or when the engine cannot apply a needed guide.
 */
export function requestGuide(build: BuildGuide, body: GuideFields, toolParser: ToolParserName | null, agents: AgentSettings, prompt: string, caps: EngineCapabilities): GuideSpec | null {
  const req: GuideRequest = {
    toolParser,
    tools: body.tools,
    toolChoice: body.toolChoice,
    // A model whose template cannot show tools repeats a call until max_tokens when allowed several (SmolLM2 does):
    // one call per turn, as llama.cpp's server guides by default; the tool loop brings the next.
    parallelToolCalls: body.parallelToolCalls && agents.toolsInjected !== true,
    responseFormat: body.responseFormat,
    guideAuto: agents.guideAuto,
    // No reasoning phase when the server parses none, when the prompt switched thinking off, or for a call forced on
    // a model whose template cannot show tools (unless the prompt opened reasoning): the gate would let it open
    // `<think>`, which nothing told it about, and end inside it without the call (SmolLM2 with llama3 did).
    reasoning:
      agents.reasoningParser === null || reasoningClosed(agents, prompt) || (forcedCall(body) && agents.toolsInjected === true && !reasoningOpen(agents, prompt))
        ? null
        : { parser: agents.reasoningParser, open: reasoningOpen(agents, prompt) },
  };
  const validateOnly = toolsActive(body) && body.toolChoice.kind === "auto" && !agents.guideAuto;
  const guide = build(validateOnly ? { ...req, guideAuto: true } : req);
  if (validateOnly || guide === null) return null;
  if (!caps.grammars) throw guidedNotSupported(body.responseFormat.kind !== "text" ? constraintField(body.responseFormat) : "tool_choice");
  return guide;
}

/**
 * The guide of a request without tools or a chat template (`/completions`): its output constraint alone, with no
 * reasoning phase (no reasoning parser reads a completion), or null for free text.
 * @throws KeelHttpError 400 for a constraint the converter refuses, or when the engine cannot apply grammars.
 */
export function outputGuide(build: BuildGuide, responseFormat: ChatRequest["responseFormat"], caps: EngineCapabilities): GuideSpec | null {
  if (responseFormat.kind === "text") return null;
  const guide = build({ toolParser: null, tools: [], toolChoice: { kind: "none" }, parallelToolCalls: true, responseFormat, guideAuto: false, reasoning: null });
  if (guide !== null && !caps.grammars) throw guidedNotSupported(constraintField(responseFormat));
  return guide;
}


/** The request forces a call: active tools with `tool_choice` required or a named function. */
function forcedCall(body: GuideFields): boolean {
  return toolsActive(body) && (body.toolChoice.kind === "required" || body.toolChoice.kind === "function");
}
