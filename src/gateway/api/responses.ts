/**
 * `POST …/responses`: the subset of OpenAI's Responses API that OVMS serves (docs: shared ovms-compat §2) —
 * `input` (a string, or message items with text content), `instructions` (a system message before the input),
 * `max_output_tokens`, `temperature`, `top_p`, `stream`. Keel keeps no server state, so `previous_response_id` and
 * `store: true` are refused clearly, as are reasoning, structured text formats and the other fields below. Function
 * tools work as in chat (same validation, parsing and guidance): `function_call` output items, `function_call` /
 * `function_call_output` input items.
 *
 * Streaming sends typed named events, each with a `sequence_number`: response.created, response.in_progress,
 * response.output_item.added, response.content_part.added, response.output_text.delta…, response.output_text.done,
 * response.content_part.done, response.output_item.done, then response.completed (or response.incomplete when the
 * token budget ran out; response.failed on an error), then `data: [DONE]` as OVMS does.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import type { ChatMessage } from "../models/chat-template.js";
import { describe, isPlainObject, issueToError, report, resolveToolChoice, tokenLimit, unsupported } from "./chat-request.js";
import { outputParserFactory, requestToolParser, toolsForTemplate } from "./agent-request.js";
import { requestGuide } from "../models/guide-plan.js";
import { buildGuide } from "../guided/guide.js";
import { toolChoiceSchema, toolsSchema } from "./tool-fields.js";
import type { ToolCall, ToolChoice, ToolSpec } from "../tools.js";
import type { KeelHttpError } from "../http/errors.js";
import { runGeneration, type Encoder } from "../requests/generate.js";
import type { Usage } from "../requests/registry.js";
import { checkModelName, readyEngine, renderMessages, type RouteContext } from "../http/route-context.js";
import type { ChoiceResult } from "../requests/session/events.js";
import { sanitizeForJson } from "../requests/utf8-stream.js";

/** A validated Responses request. */
export interface ResponsesRequest {
  model: string;
  /** The conversation: `instructions` as a system message, then the input items. */
  messages: ChatMessage[];
  instructions: string | null;
  stream: boolean;
  maxOutputTokens: number | null;
  temperature: number;
  topP: number;
  metadata: Record<string, string>;
  /** Function tools (Responses' flat `{type:"function", name, …}`; the nested chat shape is accepted too). */
  tools: ToolSpec[];
  /** `tool_choice`; default `auto` with tools, `none` without. */
  toolChoice: ToolChoice;
  /** `parallel_tool_calls` (default true). */
  parallelToolCalls: boolean;
}

const INPUT_ROLES = ["user", "assistant", "system", "developer"] as const;

/** Flatten one input item's content: a string or `input_text` / `output_text` parts. */
function itemText(item: Record<string, unknown>, i: number, ctx: Parameters<typeof report>[0]): string {
  const c = item.content;
  if (typeof c === "string") return sanitizeForJson(c);
  if (!Array.isArray(c) || c.length === 0) {
    report(ctx, "invalid_value", `expected a string or a non-empty array of input_text parts, but got ${describe(c)}.`, [i, "content"], c);
    return "";
  }
  const texts: string[] = [];
  for (const [j, part] of c.entries()) {
    if (!isPlainObject(part) || (part.type !== "input_text" && part.type !== "output_text") || typeof part.text !== "string") {
      const type = isPlainObject(part) ? part.type : undefined;
      if (type === "input_image" || type === "input_file" || type === "input_audio") {
        report(ctx, "unsupported_field", `Content parts of type '${String(type)}' are not supported; only 'input_text' is.`, [i, "content", j, "type"], type);
      } else report(ctx, "invalid_value", "expected an {\"type\": \"input_text\", \"text\": string} part.", [i, "content", j], part);
      return "";
    }
    texts.push(sanitizeForJson(part.text));
  }
  return texts.join("\n");
}

/** A `function_call` item (the model's earlier call) or a `function_call_output` item (its result) as a message. */
function callItem(item: Record<string, unknown>, i: number, ctx: Parameters<typeof report>[0]): ChatMessage | null {
  const text = (key: string, required: boolean): string | null => {
    const v = item[key];
    if (v === undefined || v === null) {
      if (required) report(ctx, "missing_field", "", [i, key]);
      return null;
    }
    if (typeof v !== "string") {
      report(ctx, "invalid_type", `expected a string, but got ${describe(v)} instead.`, [i, key], v);
      return null;
    }
    return sanitizeForJson(v);
  };
  const callId = text("call_id", true);
  if (callId === null) return null;
  if (item.type === "function_call_output") {
    const output = text("output", true);
    return output === null ? null : { role: "tool", content: output, toolCallId: callId };
  }
  const name = text("name", true);
  if (name === null) return null;
  const args = text("arguments", false);
  if (args === null && item.arguments !== undefined && item.arguments !== null) return null;
  const call: ToolCall = { id: callId, name, arguments: args ?? "{}" };
  return { role: "assistant", content: "", toolCalls: [call] };
}

const inputSchema = z.unknown().transform((v, ctx): ChatMessage[] => {
  if (typeof v === "string") return [{ role: "user", content: sanitizeForJson(v) }];
  if (v === undefined) {
    report(ctx, "missing_field", "", [], v);
    return [];
  }
  if (!Array.isArray(v) || v.length === 0) {
    report(ctx, "invalid_value", `expected a string or a non-empty array of message items, but got ${describe(v)}.`, [], v);
    return [];
  }
  const out: ChatMessage[] = [];
  for (const [i, item] of v.entries()) {
    if (!isPlainObject(item)) {
      report(ctx, "invalid_type", `expected a message item object, but got ${describe(item)} instead.`, [i], item);
      return [];
    }
    if (item.type === "function_call" || item.type === "function_call_output") {
      const m = callItem(item, i, ctx);
      if (m === null) return [];
      // Consecutive calls are one assistant turn (as chat's `tool_calls` list).
      const last = out.at(-1);
      if (m.toolCalls && last?.role === "assistant" && last.toolCalls && last.content === "") last.toolCalls.push(...m.toolCalls);
      else out.push(m);
      continue;
    }
    if (item.type !== undefined && item.type !== "message") {
      report(ctx, "unsupported_field", `Input items of type '${String(item.type)}' are not supported; only messages, function_call and function_call_output are.`, [i, "type"], item.type);
      return [];
    }
    if (typeof item.role !== "string" || !(INPUT_ROLES as readonly string[]).includes(item.role)) {
      report(ctx, "invalid_value", `expected one of ${INPUT_ROLES.map((r) => `'${r}'`).join(", ")}.`, [i, "role"], item.role);
      return [];
    }
    out.push({ role: item.role, content: itemText(item, i, ctx) });
  }
  return out;
});

/** Chat/completions request fields that clients send to /responses by mistake. */
const CHAT_ONLY_FIELDS = [
  "messages", "max_tokens", "max_completion_tokens", "seed", "stop", "n", "best_of", "logprobs", "logit_bias",
  "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "top_k", "min_tokens", "stop_token_ids",
  "ignore_eos", "include_stop_str_in_output", "chat_template_kwargs", "response_format",
] as const;

const responsesBodySchema = z.object({
  model: z.string().min(1),
  input: inputSchema,
  instructions: z.string().nullish(),
  stream: z.boolean().nullish(),
  max_output_tokens: tokenLimit,
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  // Keel keeps no conversation state.
  previous_response_id: unsupported(() => false, "Keel keeps no server-side state; send the whole conversation in 'input'."),
  store: unsupported((v) => v === false, "Keel keeps no server-side state; responses cannot be stored (send store: false or omit it)."),
  conversation: unsupported(() => false, "Keel keeps no server-side state; send the whole conversation in 'input'."),
  background: unsupported((v) => v === false, "Background responses are not available."),
  tools: toolsSchema,
  tool_choice: toolChoiceSchema,
  parallel_tool_calls: z.boolean().nullish(),
  // recognised, not implemented
  reasoning: unsupported(() => false, "Reasoning options are not available."),
  text: unsupported((v) => isPlainObject(v) && (v.format === undefined || (isPlainObject(v.format) && v.format.type === "text")) && Object.keys(v).every((k) => k === "format"), "Only plain text output ({\"format\": {\"type\": \"text\"}}) is available."),
  include: unsupported((v) => Array.isArray(v) && v.length === 0, "No extra output data is available."),
  top_logprobs: unsupported((v) => v === 0, "Log probabilities are not available on /responses; use /chat/completions."),
  truncation: unsupported((v) => v === "disabled", "Only truncation 'disabled' is available."),
  stream_options: unsupported(() => false, "stream_options is not accepted on /responses."),
  max_tool_calls: unsupported(() => false, "max_tool_calls is not available; use parallel_tool_calls: false for at most one call."),
  prompt: unsupported(() => false, "Prompt templates are not available."),
  service_tier: unsupported((v) => v === "auto" || v === "default", "Service tiers are not available."),
  // Chat/completions fields that the Responses API does not have: refused, not accepted and ignored.
  ...Object.fromEntries(CHAT_ONLY_FIELDS.map((f) => [f, unsupported(() => false, `'${f}' is not a Responses API field; use /chat/completions for it.`)])),
});

/** Validate a Responses body (400 naming the first offending field). */
export function parseResponsesRequest(body: unknown): ResponsesRequest {
  const parsed = responsesBodySchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  const instructions = b.instructions != null ? sanitizeForJson(b.instructions) : null;
  return {
    model: sanitizeForJson(b.model),
    messages: instructions !== null ? [{ role: "system", content: instructions }, ...b.input] : b.input,
    instructions,
    stream: b.stream ?? false,
    maxOutputTokens: b.max_output_tokens ?? null,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    metadata: b.metadata ?? {},
    tools: b.tools,
    toolChoice: resolveToolChoice(b.tools, b.tool_choice),
    parallelToolCalls: b.parallel_tool_calls ?? true,
  };
}

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

/** One function call of the response as the encoder tracks it. */
interface CallItem {
  /** Output item id (`fc_…`). */
  readonly itemId: string;
  /** The call id the client answers with `function_call_output.call_id`. */
  readonly callId: string;
  readonly name: string;
  /** Position in `output` (the message item is 0; calls follow in order of appearance). */
  readonly outputIndex: number;
  /** Arguments streamed so far. */
  args: string;
}

/** The request's tools as a Responses object echoes them (flat shape). */
function toolsBody(tools: readonly ToolSpec[]): unknown[] {
  return tools.map((t) => ({ type: "function", name: t.name, description: t.description ?? null, parameters: t.parameters ?? null, strict: t.strict ?? false }));
}

function toolChoiceBody(c: ToolChoice): unknown {
  return c.kind === "function" ? { type: "function", name: c.name } : c.kind;
}

/**
 * The Responses encoder: builds the response object in each state and the typed stream events. Output items: the
 * assistant message (index 0, always), then one `function_call` item per parsed tool call (indexes 1, 2, … in order).
 */
export function responsesEncoder(body: ResponsesRequest, id: string, model: string, createdAt: number): Encoder {
  /** The message output item's id. */
  const itemId = `msg_${id.slice(5)}`;
  /** `sequence_number` of the next stream event (0, 1, 2, … over the whole stream). */
  let sequence = 0;
  /** Output text streamed so far (for the `.done` events). */
  let text = "";
  /** Function calls streamed so far, by the parser's call index. */
  const calls = new Map<number, CallItem>();
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
    reasoning: null,
    store: false,
    temperature: body.temperature,
    text: { format: { type: "text" } },
    tool_choice: toolChoiceBody(body.toolChoice),
    tools: toolsBody(body.tools),
    top_p: body.topP,
    truncation: "disabled",
    usage: extra.usage ? usageBody(extra.usage) : null,
    metadata: body.metadata,
  });
  const part = (t: string) => ({ type: "output_text", text: t, annotations: [] });
  const item = (status: "in_progress" | "completed" | "incomplete", t: string | null) => ({
    id: itemId,
    type: "message",
    status,
    role: "assistant",
    content: t === null ? [] : [part(t)],
  });
  const callBody = (c: { itemId: string; callId: string; name: string }, args: string, status: "in_progress" | "completed") => ({
    id: c.itemId,
    type: "function_call",
    status,
    call_id: c.callId,
    name: c.name,
    arguments: args,
  });
  const statusOf = (c: ChoiceResult): "completed" | "incomplete" => (c.reason === "length" ? "incomplete" : "completed");
  /** The final output items of a choice: the message, then its calls. */
  const outputOf = (c: ChoiceResult, status: "completed" | "incomplete"): unknown[] => [
    item(status, c.text),
    ...c.toolCalls.map((t) => callBody({ itemId: `fc_${t.id.replace(/^call_/, "")}`, callId: t.id, name: t.name }, t.arguments, "completed")),
  ];
  return {
    stream(ev, w) {
      const send = (type: string, payload: Record<string, unknown>): void => w.event(type, { type, sequence_number: sequence++, ...payload });
      const at = { item_id: itemId, output_index: 0, content_index: 0 };
      switch (ev.type) {
        case "started":
          send("response.created", { response: response("in_progress") });
          send("response.in_progress", { response: response("in_progress") });
          send("response.output_item.added", { output_index: 0, item: item("in_progress", null) });
          send("response.content_part.added", { ...at, part: part("") });
          return;
        case "delta":
          if (ev.content.length > 0) {
            text += ev.content;
            send("response.output_text.delta", { ...at, delta: ev.content, logprobs: [] });
          }
          // 1. A call's first fragment (id and name) adds its item; 2. argument fragments stream into it.
          for (const d of ev.toolCalls ?? []) {
            let c = calls.get(d.index);
            if (!c && d.id !== undefined && d.name !== undefined) {
              c = { itemId: `fc_${d.id.replace(/^call_/, "")}`, callId: d.id, name: d.name, outputIndex: calls.size + 1, args: "" };
              calls.set(d.index, c);
              send("response.output_item.added", { output_index: c.outputIndex, item: callBody(c, "", "in_progress") });
            }
            if (!c || !d.arguments) continue;
            c.args += d.arguments;
            send("response.function_call_arguments.delta", { item_id: c.itemId, output_index: c.outputIndex, delta: d.arguments });
          }
          return;
        case "choice_finished":
          return;
        case "finished": {
          const c = ev.choices[0]!;
          const status = statusOf(c);
          send("response.output_text.done", { ...at, text, logprobs: [] });
          send("response.content_part.done", { ...at, part: part(text) });
          send("response.output_item.done", { output_index: 0, item: item(status, text) });
          for (const call of calls.values()) {
            send("response.function_call_arguments.done", { item_id: call.itemId, output_index: call.outputIndex, arguments: call.args });
            send("response.output_item.done", { output_index: call.outputIndex, item: callBody(call, call.args, "completed") });
          }
          send(status === "completed" ? "response.completed" : "response.incomplete", { response: response(status, { output: outputOf(c, status), usage: ev.usage }) });
          return;
        }
      }
    },
    streamError(err, w) {
      w.event("response.failed", { type: "response.failed", sequence_number: sequence++, response: response("failed", { error: err }) });
    },
    doneAfterError: true,
    unary(ev) {
      const c = ev.choices[0]!;
      const status = statusOf(c);
      return { ...response(status, { output: outputOf(c, status), usage: ev.usage }), output_text: c.text };
    },
  };
}

/** Handle one Responses request. */
export async function handleResponses(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body = parseResponsesRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const caps = engine.capabilities;
  // Reasoning stays in the text here (Responses reasoning items are not produced); tool calls are parsed as in chat.
  const agents = { ...ctx.model.agents(), reasoningParser: null };
  const toolParser = requestToolParser(body, agents);
  const prompt = renderMessages(engine, body.messages, undefined, toolsForTemplate(body));
  const parser = outputParserFactory(body, toolParser, agents, prompt);
  const guide = requestGuide(buildGuide, { ...body, responseFormat: { kind: "text" } }, toolParser, agents, prompt, caps);
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
      ...(parser ? { parser } : {}),
    },
    responsesEncoder(body, id, ctx.model.name, Math.floor(Date.now() / 1000)),
  );
}
