/**
 * `POST …/messages` (Anthropic Messages API) and `POST …/messages/count_tokens`, on the same pipeline as chat
 * completions: the body (messages-request.ts) becomes chat-template messages, tools and a tool choice; the prompt is
 * rendered, parsed and guided exactly as chat's; runGeneration runs it with the Messages encoder (messages-stream.ts),
 * so admission, disconnects, engine restarts (resume) and drain behave as on chat. Errors on these routes use
 * Anthropic's envelope (the catalogue is the same, http/errors.ts).
 *
 * `thinking`: `enabled` / `adaptive` needs `--reasoning_parser` (refused otherwise) and turns the template's thinking
 * switch (`enable_thinking`) on when it has one; `disabled` turns it off. With a reasoning parser, reasoning is
 * returned as `thinking` blocks whatever was asked (never mixed into the text). `budget_tokens` is validated as
 * Anthropic does (≥ 1024, < max_tokens); `max_tokens` bounds the whole answer, thinking included.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { buildGuide } from "../guided/guide.js";
import { engineError, invalidValue, unsupportedField } from "../http/errors.js";
import { checkModelName, readyEngine, renderMessages, type ReadyEngine, type RouteContext } from "../http/route-context.js";
import type { AgentSettings } from "../models/agent-config.js";
import { requestGuide } from "../models/guide-plan.js";
import { runGeneration } from "../requests/generate.js";
import { outputParserFactory, requestToolParser, toolsForTemplate } from "./agent-request.js";
import { parseCountTokensRequest, parseMessagesRequest, type MessagesPromptRequest, type ThinkingRequest } from "./messages-request.js";
import { messagesEncoder } from "./messages-stream.js";
import { recordedForUnary } from "../parsers/recording.js";
import { TOKENIZE_CHARS_PER_CONTEXT_TOKEN } from "./tokenize.js";

/** The template variable HF templates read as their thinking switch (Qwen3's, and others'). */
const THINKING_SWITCH = "enable_thinking";

/**
 * The template variables `thinking` sets: the template's thinking switch on (`enabled`) or off (`disabled`) when the
 * template has one; nothing when it has none or `thinking` was not sent.
 * @throws KeelHttpError 400 when thinking is asked for and the server parses no reasoning.
 */
export function thinkingKwargs(thinking: ThinkingRequest, agents: Pick<AgentSettings, "reasoningParser">, templateSource: string): Record<string, unknown> {
  if (thinking.kind === "enabled" && agents.reasoningParser === null) {
    throw unsupportedField("thinking", "Extended thinking needs a reasoning parser: start the server with --reasoning_parser qwen3 (the model's reasoning format), or leave 'thinking' out.");
  }
  if (thinking.kind === "default" || !templateSource.includes(THINKING_SWITCH)) return {};
  return { [THINKING_SWITCH]: thinking.kind === "enabled" };
}

/** Render the request's prompt (as chat renders it); also returns the model's agent settings and tool format. */
function renderPrompt(ctx: RouteContext, engine: ReadyEngine, body: MessagesPromptRequest) {
  const agents = ctx.model.agents();
  const kwargs = thinkingKwargs(body.thinking, agents, engine.template.source);
  // Tools asked for but no parser to read the calls: refused before rendering (never accepted and ignored).
  const toolParser = requestToolParser(body, agents);
  const prompt = renderMessages(engine, body.messages, kwargs, toolsForTemplate(body));
  return { agents, toolParser, prompt };
}

/** Handle one Messages request. */
export async function handleMessages(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body = parseMessagesRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const { agents, toolParser, prompt } = renderPrompt(ctx, engine, body);
  const factory = outputParserFactory(body, toolParser, agents, prompt);
  // A unary answer lists its blocks in the order the parser found them, as the stream does: its deltas are recorded.
  const { parser, parsed } = recordedForUnary(factory, body.stream);
  // A bad schema, or a guide this engine cannot apply, is a 400 here, before the engine sees the request.
  const guide = requestGuide(buildGuide, { ...body, responseFormat: { kind: "text" } }, toolParser, agents, prompt, engine.capabilities);
  const id = `msg_${randomUUID().replaceAll("-", "")}`;
  runGeneration(
    ctx,
    req,
    reply,
    {
      id,
      prompts: [prompt],
      n: 1,
      stream: body.stream,
      params: { maxTokens: body.maxTokens, temperature: body.temperature, topP: body.topP, topK: body.topK, ignoreEos: false, ...(guide ? { guide } : {}) },
      stop: body.stopSequences,
      includeStopStr: false,
      ...(parser ? { parser } : {}),
    },
    messagesEncoder(id, ctx.model.name, parsed),
  );
}

/** Handle one `count_tokens` request: the prompt's tokens, as the engine would count them (`usage.input_tokens`). */
export async function handleCountTokens(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<{ input_tokens: number }> {
  const body = parseCountTokensRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const { prompt } = renderPrompt(ctx, engine, body);
  // The engine tokenizes between steps: a prompt far beyond any context is refused rather than stalling them.
  const limit = engine.maxModelLen * TOKENIZE_CHARS_PER_CONTEXT_TOKEN;
  if (prompt.length > limit) {
    throw invalidValue("messages", `Invalid value for 'messages': the prompt has ${prompt.length} characters, more than this model's ${engine.maxModelLen}-token context can hold (at most ${limit} characters are counted).`);
  }
  try {
    // The engine tokenizes a prompt with its special tokens (admission.ts): counted the same way here.
    return { input_tokens: (await engine.tokenize(prompt, true)).length };
  } catch (err) {
    if (ctx.engine() === null) {
      void reply.header("retry-after", "1");
      throw ctx.unavailable();
    }
    throw engineError(`tokenization failed: ${(err as Error).message}`);
  }
}
