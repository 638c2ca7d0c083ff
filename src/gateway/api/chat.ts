/**
 * `POST …/chat/completions`: OpenAI chat completions, unary and streaming, with `n` choices and logprobs.
 *
 * Streaming follows OpenAI: `chat.completion.chunk` events, a first chunk per choice with the assistant role, a
 * chunk with `finish_reason` per choice, an optional usage chunk (`stream_options.include_usage`), then
 * `data: [DONE]`. An error after streaming began is a final `data: {"error":…}` event without `[DONE]`.
 * Headers are sent when the engine admits the request, so a refusal before that is a plain JSON 4xx/5xx.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { parseChatRequest, type ChatRequest } from "./chat-request.js";
import { toErrorBody } from "../http/error-envelope.js";
import { generationOptions, runGeneration, type Encoder } from "../requests/generate.js";
import type { Usage } from "../requests/registry.js";
import type { ChoiceResult, SessionEvent } from "../requests/session/events.js";
import { checkModelName, readyEngine, renderMessages, type RouteContext } from "../http/route-context.js";
import { templateKwargsFor } from "./reasoning-effort.js";
import { checkCapabilities, checkSpeculation } from "./sampling.js";
import { outputParserFactory, requestToolParser, toolsForTemplate } from "./agent-request.js";
import { requestGuide } from "../models/guide-plan.js";
import { buildGuide } from "../guided/guide.js";
import type { GuideSpec } from "../../protocol/messages.js";
import { chatLogprobs } from "./logprobs.js";

/**
 * Builder of one API's stream chunks: `{id, object, created, model, choices}`, with `usage: null` on every chunk when
 * the client asked for a final usage chunk (OpenAI's shape), plus any `extra` fields.
 */
export function chunkBuilder(object: string, id: string, created: number, model: string, includeUsage: boolean) {
  return (choices: unknown[], extra: Record<string, unknown> = {}): unknown => ({
    id,
    object,
    created,
    model,
    choices,
    ...(includeUsage ? { usage: null } : {}),
    ...extra,
  });
}

export function usageBody(u: Usage): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  return { prompt_tokens: u.promptTokens, completion_tokens: u.completionTokens, total_tokens: u.promptTokens + u.completionTokens };
}

/**
 * The stream deltas of one session delta: `{reasoning_content}`, `{content}`, then one `{tool_calls:[…]}` per call
 * fragment — a call's first fragment `{index, id, type: "function", function: {name, arguments}}` (arguments "" when
 * none came yet), later ones `{index, function: {arguments}}` (OpenAI's shape). A delta with nothing but logprobs
 * is `{content: ""}`.
 */
export function chatDeltas(ev: Extract<SessionEvent, { type: "delta" }>): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  if (ev.reasoning) out.push({ reasoning_content: ev.reasoning });
  if (ev.content.length > 0) out.push({ content: ev.content });
  for (const d of ev.toolCalls ?? []) {
    const fn: Record<string, unknown> = {};
    if (d.name !== undefined) fn.name = d.name;
    if (d.arguments !== undefined || d.name !== undefined) fn.arguments = d.arguments ?? "";
    const call: Record<string, unknown> = d.id !== undefined ? { index: d.index, id: d.id, type: "function", function: fn } : { index: d.index, function: fn };
    out.push({ tool_calls: [call] });
  }
  if (out.length === 0) out.push({ content: "" });
  return out;
}

/**
 * The unary message of one choice: `content` (null when empty and there are tool calls, as OpenAI),
 * `reasoning_content` only when the reasoning parser found some, `tool_calls` only when there are calls.
 */
export function chatMessage(c: ChoiceResult): Record<string, unknown> {
  const message: Record<string, unknown> = { role: "assistant", content: c.text === "" && c.toolCalls.length > 0 ? null : c.text };
  if (c.reasoning !== null) message.reasoning_content = c.reasoning;
  if (c.toolCalls.length > 0) {
    message.tool_calls = c.toolCalls.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } }));
  }
  return message;
}

/** The chat encoder for one request. */
export function chatEncoder(body: Pick<ChatRequest, "n" | "includeUsage" | "logprobs">, id: string, model: string, created: number): Encoder {
  const chunk = chunkBuilder("chat.completion.chunk", id, created, model, body.includeUsage);
  const wantLogprobs = body.logprobs !== null;
  return {
    stream(ev, w) {
      switch (ev.type) {
        case "started":
          for (let i = 0; i < body.n; i++) w.data(chunk([{ index: i, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]));
          return;
        case "delta": {
          // One chunk per part, in the order reasoning → content → tool calls; logprobs ride on the first.
          const deltas = chatDeltas(ev);
          for (const [k, delta] of deltas.entries()) {
            w.data(chunk([{ index: ev.index, delta, logprobs: wantLogprobs && k === 0 ? chatLogprobs(ev.logprobs) : null, finish_reason: null }]));
          }
          return;
        }
        case "choice_finished":
          w.data(chunk([{ index: ev.index, delta: {}, logprobs: null, finish_reason: ev.reason }]));
          return;
        case "finished":
          if (body.includeUsage) w.data(chunk([], { usage: usageBody(ev.usage) }));
          return;
      }
    },
    streamError(err, w) {
      w.data(toErrorBody(err));
    },
    unary(ev) {
      return {
        id,
        object: "chat.completion",
        created,
        model,
        choices: ev.choices.map((c) => ({
          index: c.index,
          message: chatMessage(c),
          logprobs: wantLogprobs ? chatLogprobs(c.logprobs) : null,
          finish_reason: c.reason,
        })),
        usage: usageBody(ev.usage),
      };
    },
  };
}

/** The plan options with `params.guide` set when there is a guide. */
export function withGuide<T extends { params: object }>(opts: T, guide: GuideSpec | null): T {
  return guide === null ? opts : { ...opts, params: { ...opts.params, guide } };
}

/** Handle one chat completion request. */
export async function handleChat(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body = parseChatRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const caps = engine.capabilities;
  const refused = checkCapabilities(body.sampling, body.logprobs === null ? null : { param: body.logprobs > 0 ? "top_logprobs" : "logprobs", n: body.logprobs }, caps, engine.vocabSize, engine.engineName);
  if (refused) throw refused;
  const agents = ctx.model.agents();
  // Tools asked for but no parser to read the calls: refused before rendering (never accepted and ignored).
  const toolParser = requestToolParser(body, agents);
  const prompt = renderMessages(engine, body.messages, templateKwargsFor(body, agents, engine.template.source), toolsForTemplate(body));
  const parser = outputParserFactory(body, toolParser, agents, prompt);
  // A bad schema, or a guide this engine cannot apply, is a 400 here, before the engine sees the request.
  const guide = requestGuide(buildGuide, body, toolParser, agents, prompt, caps);
  const conflict = checkSpeculation(body.sampling, body.logprobs !== null, guide !== null);
  if (conflict) throw conflict;
  const id = `chatcmpl-${randomUUID().replaceAll("-", "")}`;
  const created = Math.floor(Date.now() / 1000);
  runGeneration(
    ctx,
    req,
    reply,
    {
      id,
      prompts: [prompt],
      ...withGuide(generationOptions(body, body.maxTokens ?? null), guide),
      ...(parser ? { parser } : {}),
    },
    chatEncoder(body, id, ctx.model.name, created),
  );
}
