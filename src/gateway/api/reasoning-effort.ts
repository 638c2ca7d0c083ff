/**
 * `reasoning_effort` (OpenAI, vLLM) on chat: applied as the chat template's thinking switch, `enable_thinking`, where
 * the server parses reasoning (`--reasoning_parser`); refused (400) where it does not, since nothing would read the
 * effort. The switch is binary (Qwen3-style templates have no budget), so the effort maps to thinking on or off:
 * `none` and `minimal` (OpenAI: no or almost no reasoning tokens) → `enable_thinking: false`; `low`, `medium`,
 * `high`, `xhigh` → `enable_thinking: true`. A `chat_template_kwargs.enable_thinking` that says the opposite is a 400,
 * and so is a template that has no such switch (the effort would change nothing).
 */
import { invalidValue, unsupportedField } from "../http/errors.js";
import type { AgentSettings } from "../models/agent-config.js";
import type { ChatRequest, ReasoningEffort } from "./chat-request.js";

/** The thinking switch each effort maps to. */
export const THINKING_BY_EFFORT: Readonly<Record<ReasoningEffort, boolean>> = {
  none: false,
  minimal: false,
  low: true,
  medium: true,
  high: true,
  xhigh: true,
};

/**
 * The template variables of `body` with its `reasoning_effort` applied (the request's own kwargs when it sets none).
 * @param templateSource - The model's chat template (Jinja source), which must read `enable_thinking`.
 * @param param - The field's name in errors (`reasoning.effort` on /responses).
 * @throws KeelHttpError 400 on `reasoning_effort` without a reasoning parser or a thinking switch, or against
 *   `enable_thinking`.
 */
export function templateKwargsFor(body: Pick<ChatRequest, "templateKwargs" | "reasoningEffort">, agents: Pick<AgentSettings, "reasoningParser">, templateSource: string, param = "reasoning_effort"): Record<string, unknown> {
  if (body.reasoningEffort === undefined) return body.templateKwargs;
  if (agents.reasoningParser === null) {
    throw unsupportedField(param, "It applies to reasoning models: start the server with --reasoning_parser (e.g. qwen3) to use it.");
  }
  if (!templateSource.includes("enable_thinking")) {
    throw unsupportedField(param, "The model's chat template has no thinking switch (enable_thinking), so the effort would change nothing.");
  }
  const thinking = THINKING_BY_EFFORT[body.reasoningEffort];
  const given = body.templateKwargs.enable_thinking;
  if (given !== undefined && given !== thinking) {
    throw invalidValue(
      "reasoning_effort",
      `Invalid value for 'reasoning_effort': '${body.reasoningEffort}' turns thinking ${thinking ? "on" : "off"}, but chat_template_kwargs.enable_thinking is ${JSON.stringify(given)}.`,
    );
  }
  return { ...body.templateKwargs, enable_thinking: thinking };
}
