/**
 * The Anthropic Messages encoder: a finished generation as a `message` object, and a generation as Anthropic's
 * server-sent events — `message_start`, `ping`, then per content block `content_block_start`, its
 * `content_block_delta`s (`thinking_delta`, `text_delta`, `input_json_delta` with the tool-call argument fragments as
 * the parser yields them) and `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`. No
 * `data: [DONE]`. An error after the stream began is an `event: error` with Anthropic's error body.
 *
 * Blocks follow each other (one open at a time): a new kind of output, or a new tool call, closes the open block.
 * The unary content has the same blocks in the same order (the parser's recorded deltas replayed); without a
 * parser it is `[text]`.
 */
import { toAnthropicErrorBody } from "../http/error-envelope.js";
import type { Encoder } from "../requests/generate.js";
import type { Usage } from "../requests/registry.js";
import type { ChoiceResult } from "../requests/session/events.js";
import type { ParsedDelta } from "../parsers/types.js";
import type { ResponseWriter } from "../http/sse.js";
import { sanitizeForJson } from "../requests/utf8-stream.js";

/** Anthropic's `stop_reason` values Keel produces. */
export type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use";

/** Anthropic `stop_reason` and `stop_sequence` of a finished choice. */
export function stopReasonOf(c: Pick<ChoiceResult, "reason" | "stopSequence">): { stop_reason: StopReason; stop_sequence: string | null } {
  if (c.reason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  // A stop sequence wins over tool_use: it may have cut a call short, and the client must be able to tell.
  if (c.stopSequence !== undefined) return { stop_reason: "stop_sequence", stop_sequence: c.stopSequence };
  return { stop_reason: c.reason === "tool_calls" ? "tool_use" : "end_turn", stop_sequence: null };
}

/** A tool-call id in Anthropic's shape: the parser's `call_…` becomes `toolu_…` (ids the client sends back as is). */
export function toolUseId(callId: string): string {
  return `toolu_${callId.replace(/^call_/, "")}`;
}

/** A call's arguments as the `input` object (parsers emit a JSON object; anything else is kept under `_raw`). */
function inputOf(args: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(args === "" ? "{}" : args);
    if (typeof v === "object" && v !== null && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    /* not JSON: kept as text below */
  }
  return { _raw: sanitizeForJson(args) };
}

/** Anthropic `usage` (no prompt caching is reported: every prompt token counts as input). */
function usageBody(u: Usage): Record<string, number> {
  return { input_tokens: u.promptTokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: u.completionTokens };
}

/** The `content` of a finished choice: thinking, then text, then one `tool_use` block per call. */
export function contentOf(c: Pick<ChoiceResult, "text" | "reasoning" | "toolCalls">): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  if (c.reasoning !== null && c.reasoning !== "") out.push({ type: "thinking", thinking: c.reasoning, signature: "" });
  if (c.text !== "") out.push({ type: "text", text: c.text });
  for (const t of c.toolCalls) out.push({ type: "tool_use", id: toolUseId(t.id), name: t.name, input: inputOf(t.arguments) });
  return out;
}

/**
 * The content of a finished choice in the order the parser produced it, block for block as the stream sends it: a
 * run of reasoning is a thinking block, a run of text a text block, each call a tool_use block (its input from the
 * finished call). Text after a call (a model that echoes the result, say) comes after the call, as in the stream.
 * @param log - the parser's deltas in order (parsers/recording.ts), or null without a parser.
 */
export function orderedContentOf(c: Pick<ChoiceResult, "text" | "reasoning" | "toolCalls">, log: readonly ParsedDelta[] | null): Record<string, unknown>[] {
  if (log === null) return contentOf(c);
  const out: Record<string, unknown>[] = [];
  // 1. Extend the last block when it is of this kind, else start one (as the stream's `ensure`).
  const append = (kind: "thinking" | "text", text: string): void => {
    const last = out.at(-1);
    if (last?.type === kind) last[kind] = (last[kind] as string) + text;
    else out.push(kind === "text" ? { type: "text", text } : { type: "thinking", thinking: text, signature: "" });
  };
  for (const d of log) {
    if (d.reasoning) append("thinking", d.reasoning);
    if (d.content) append("text", d.content);
    // 2. A call's first fragment places its block; its input is the finished call's arguments.
    for (const t of d.toolCalls ?? []) {
      const call = c.toolCalls[t.index];
      if (t.id !== undefined && call) out.push({ type: "tool_use", id: toolUseId(call.id), name: call.name, input: inputOf(call.arguments) });
    }
  }
  return out;
}

/** The block the stream has open: its kind and index (and, for a tool call, the parser's call index). */
type OpenBlock = { kind: "none" } | { kind: "thinking" | "text"; index: number } | { kind: "tool_use"; index: number; call: number };

/** The Messages encoder for one request (`id` is `msg_…`; `parsed`: the parser's deltas of a unary answer, see {@link orderedContentOf}). */
export function messagesEncoder(id: string, model: string, parsed: readonly ParsedDelta[] | null = null): Encoder {
  /** Index of the next content block. */
  let next = 0;
  /** The block open now. */
  let open: OpenBlock = { kind: "none" };
  /** Block index of each tool call (by the parser's call index), for argument fragments. */
  const callBlocks = new Map<number, number>();
  const message = (content: unknown[], stop: ReturnType<typeof stopReasonOf> | null, usage: Record<string, number>) => ({
    id,
    type: "message",
    role: "assistant",
    model,
    content,
    stop_reason: stop?.stop_reason ?? null,
    stop_sequence: stop?.stop_sequence ?? null,
    usage,
  });
  const send = (w: ResponseWriter, type: string, payload: Record<string, unknown> = {}): void => w.event(type, { type, ...payload });
  const close = (w: ResponseWriter): void => {
    if (open.kind !== "none") send(w, "content_block_stop", { index: open.index });
    open = { kind: "none" };
  };
  /** Open a thinking or text block unless one of that kind is open; returns its index. */
  const ensure = (w: ResponseWriter, kind: "thinking" | "text"): number => {
    if (open.kind === kind) return open.index;
    close(w);
    open = { kind, index: next++ };
    send(w, "content_block_start", { index: open.index, content_block: kind === "text" ? { type: "text", text: "" } : { type: "thinking", thinking: "", signature: "" } });
    return open.index;
  };
  return {
    stream(ev, w) {
      switch (ev.type) {
        case "started":
          // The prompt's token count is known when the request finishes: message_delta carries it.
          send(w, "message_start", { message: message([], null, usageBody({ promptTokens: 0, completionTokens: 0 })) });
          send(w, "ping");
          return;
        case "delta":
          // 1. Reasoning, 2. text, 3. tool-call fragments: the order the session reports them in.
          if (ev.reasoning) send(w, "content_block_delta", { index: ensure(w, "thinking"), delta: { type: "thinking_delta", thinking: ev.reasoning } });
          if (ev.content.length > 0) send(w, "content_block_delta", { index: ensure(w, "text"), delta: { type: "text_delta", text: ev.content } });
          for (const d of ev.toolCalls ?? []) {
            // A call's first fragment (id and name) opens its block; later fragments carry argument pieces.
            if (d.id !== undefined && d.name !== undefined && !callBlocks.has(d.index)) {
              close(w);
              open = { kind: "tool_use", index: next++, call: d.index };
              callBlocks.set(d.index, open.index);
              send(w, "content_block_start", { index: open.index, content_block: { type: "tool_use", id: toolUseId(d.id), name: d.name, input: {} } });
            }
            const index = callBlocks.get(d.index);
            if (index === undefined || !d.arguments) continue;
            send(w, "content_block_delta", { index, delta: { type: "input_json_delta", partial_json: d.arguments } });
          }
          return;
        case "choice_finished":
          return;
        case "finished": {
          close(w);
          const c = ev.choices[0]!;
          send(w, "message_delta", { delta: stopReasonOf(c), usage: { input_tokens: ev.usage.promptTokens, output_tokens: ev.usage.completionTokens } });
          send(w, "message_stop");
          return;
        }
      }
    },
    streamError(err, w) {
      w.event("error", toAnthropicErrorBody(err));
    },
    doneAtEnd: false,
    errorBody: toAnthropicErrorBody,
    unary(ev) {
      const c = ev.choices[0]!;
      return message(orderedContentOf(c, parsed), stopReasonOf(c), usageBody(ev.usage));
    },
  };
}
