/**
 * `POST …/responses`: OpenAI's Responses API on the generation pipeline (docs/api.md, docs/agents.md#responses).
 * The request (responses-request.ts) becomes chat turns, a prompt, an output parser and a guide exactly as a chat
 * request does; the answer is a `response` object whose output items (responses-output.ts) are reasoning (with
 * `--reasoning_parser`), the message text and `function_call`s, in the order the model produced them. Keel keeps no
 * server state, so `previous_response_id` and `store: true` are refused.
 *
 * Streaming sends typed named events, each with a `sequence_number`: response.created, response.in_progress, then per
 * item response.output_item.added, its content events (response.content_part.added, response.output_text.delta… /
 * response.reasoning_text.delta…, or response.function_call_arguments.delta…), their `.done` events and
 * response.output_item.done; then response.completed (or response.incomplete when the token budget ran out;
 * response.failed on an error), then `data: [DONE]` as OVMS does.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { outputParserFactory, requestToolParser, toolsForTemplate } from "./agent-request.js";
import { requestGuide } from "../models/guide-plan.js";
import { buildGuide } from "../guided/guide.js";
import type { ResponseFormat, ToolChoice, ToolSpec } from "../tools.js";
import { guidedNotSupported, KeelHttpError, modelNotFound, unsupportedField } from "../http/errors.js";
import { runGeneration, type Encoder } from "../requests/generate.js";
import type { Usage } from "../requests/registry.js";
import { checkModelName, readyEngine, renderMessages, type RouteContext } from "../http/route-context.js";
import type { ChoiceResult } from "../requests/session/events.js";
import { parseResponsesRequest, type ResponsesRequest } from "./responses-request.js";
import { templateKwargsFor } from "./reasoning-effort.js";
import { feed, ResponseOutput, unaryOutput } from "./responses-output.js";
import { recordedForUnary } from "../parsers/recording.js";
import type { ParsedDelta } from "../parsers/types.js";

export { parseResponsesRequest, type ResponsesRequest };

/** Responses `usage`. */
function usageBody(u: Usage) {
  return {
    input_tokens: u.promptTokens,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: u.completionTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.promptTokens + u.completionTokens,
  };
}

/** The request's tools as a Responses object echoes them (flat shape). */
function toolsBody(tools: readonly ToolSpec[]): unknown[] {
  return tools.map((t) => ({ type: "function", name: t.name, description: t.description ?? null, parameters: t.parameters ?? null, strict: t.strict ?? false }));
}

/** `tool_choice` as the response object echoes it. */
function toolChoiceBody(c: ToolChoice): unknown {
  return c.kind === "function" ? { type: "function", name: c.name } : c.kind;
}

/** `text.format` as the response object echoes it. */
function formatBody(f: ResponseFormat): Record<string, unknown> {
  return f.kind === "json_schema" ? { type: "json_schema", name: f.name, schema: f.schema, strict: f.strict } : { type: f.kind };
}

/** The response status of a finished choice: incomplete when the token budget cut it. */
const statusOf = (c: ChoiceResult): "completed" | "incomplete" => (c.reason === "length" ? "incomplete" : "completed");

/**
 * The Responses encoder: builds the response object in each state and the typed stream events. The output items
 * and their events come from a {@link ResponseOutput} fed with the session's parsed deltas.
 * @param parsed - For a unary answer: the output parser's deltas in order (recordingParser), or null without a parser.
 */
export function responsesEncoder(body: ResponsesRequest, id: string, model: string, createdAt: number, parsed: readonly ParsedDelta[] | null = null): Encoder {
  /** The random part of the response id; item ids are built from it. */
  const suffix = id.replace(/^resp_/, "");
  /** `sequence_number` of the next stream event (0, 1, 2, … over the whole stream). */
  let sequence = 0;
  /** The streamed output items (set when the stream starts). */
  let streamed: ResponseOutput | null = null;
  const response = (status: "in_progress" | "completed" | "incomplete" | "failed", extra: { output?: unknown[]; usage?: Usage; error?: KeelHttpError } = {}) => ({
    id,
    object: "response",
    created_at: createdAt,
    status,
    error: extra.error ? { code: extra.error.code, message: extra.error.message } : null,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: body.instructions,
    max_output_tokens: body.maxOutputTokens,
    model,
    output: extra.output ?? [],
    parallel_tool_calls: body.parallelToolCalls,
    previous_response_id: null,
    reasoning: { effort: body.reasoningEffort, summary: body.reasoningSummary },
    store: false,
    temperature: body.temperature,
    text: { format: formatBody(body.responseFormat) },
    tool_choice: toolChoiceBody(body.toolChoice),
    tools: toolsBody(body.tools),
    top_p: body.topP,
    truncation: "disabled",
    usage: extra.usage ? usageBody(extra.usage) : null,
    metadata: body.metadata,
  });
  return {
    stream(ev, w) {
      const send = (type: string, payload: Record<string, unknown>): void => w.event(type, { type, sequence_number: sequence++, ...payload });
      switch (ev.type) {
        case "started":
          streamed = new ResponseOutput(suffix, send);
          send("response.created", { response: response("in_progress") });
          send("response.in_progress", { response: response("in_progress") });
          return;
        case "delta":
          // In the order the parser reports them: reasoning, then text, then call fragments.
          feed(streamed!, { reasoning: ev.reasoning ?? "", content: ev.content, toolCalls: ev.toolCalls ?? [] });
          return;
        case "choice_finished":
          return;
        case "finished": {
          const c = ev.choices[0]!;
          const status = statusOf(c);
          streamed!.finish(c);
          send(status === "completed" ? "response.completed" : "response.incomplete", { response: response(status, { output: streamed!.output(), usage: ev.usage }) });
          return;
        }
      }
    },
    streamError(err, w) {
      w.event("response.failed", { type: "response.failed", sequence_number: sequence++, response: response("failed", { error: err, output: streamed?.output() ?? [] }) });
    },
    doneAfterError: true,
    unary(ev) {
      const c = ev.choices[0]!;
      const out = unaryOutput(suffix, c, parsed);
      return { ...response(statusOf(c), { output: out.output(), usage: ev.usage }), output_text: out.text() };
    },
  };
}

/** A guide error about chat's field names, renamed to the Responses fields (`text.format`, flat `tools[i]`). */
function inResponsesTerms(err: unknown): unknown {
  if (!(err instanceof KeelHttpError) || err.param === null) return err;
  const rename = (s: string) => s.replaceAll("response_format.json_schema", "text.format").replace(/tools\[(\d+)\]\.function\./g, "tools[$1].");
  return new KeelHttpError({ status: err.status, type: err.type, code: err.code, message: rename(err.message), param: rename(err.param) });
}

/** Handle one Responses request. */
export async function handleResponses(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body = parseResponsesRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const caps = engine.capabilities;
  const agents = ctx.model.agents();
  // reasoning.effort is the template's thinking switch, applied and refused exactly as chat's reasoning_effort.
  const kwargs = body.reasoningEffort === null ? undefined : { ...templateKwargsFor({ templateKwargs: {}, reasoningEffort: body.reasoningEffort }, agents, engine.template.source, "reasoning.effort"), reasoning_effort: body.reasoningEffort };
  if (body.responseFormat.kind !== "text" && !caps.grammars) throw guidedNotSupported("text.format");
  const toolParser = requestToolParser(body, agents);
  const prompt = renderMessages(engine, body.messages, kwargs, toolsForTemplate(body));
  const factory = outputParserFactory(body, toolParser, agents, prompt);
  // A unary answer lists its items in the order the parser found them, as a stream would: its deltas are recorded.
  const { parser, parsed } = recordedForUnary(factory, body.stream);
  let guide;
  try {
    guide = requestGuide(buildGuide, body, toolParser, agents, prompt, caps);
  } catch (err) {
    throw inResponsesTerms(err);
  }
  const id = `resp_${randomUUID().replaceAll("-", "")}`;
  runGeneration(
    ctx,
    req,
    reply,
    {
      id,
      prompts: [prompt],
      n: 1,
      stream: body.stream,
      params: { maxTokens: body.maxOutputTokens, temperature: body.temperature, topP: body.topP, topK: -1, ignoreEos: false, ...(guide ? { guide } : {}) },
      stop: [],
      includeStopStr: false,
      promptField: "input",
      ...(parser ? { parser } : {}),
    },
    responsesEncoder(body, id, ctx.model.name, Math.floor(Date.now() / 1000), parsed),
  );
}
