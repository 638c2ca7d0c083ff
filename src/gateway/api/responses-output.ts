/**
 * The output items of one Responses answer, built as the session's parsed deltas arrive, with the stream events
 * that announce them. Items follow each other as the model produced them — a `reasoning` item (reasoning parser),
 * a `message` item (output text), `function_call` items (tool parser) — and each is closed (its `.done` events)
 * before the next one opens, so a client sees one item at a time, as OpenAI streams.
 *
 * Output text that is only whitespace is held back until real text follows: a model that writes "\n" before a call
 * gets only the `function_call` item (OpenAI returns no empty message before a call). An answer with no reasoning,
 * text or call still has one (empty) message item.
 *
 * The unary answer is built by the same class from the parser's deltas in the order it gave them (recorded by
 * {@link recordingParser}), so streamed and unary items agree — also when text follows a call.
 */
import type { ParsedDelta, ToolCallDelta } from "../parsers/types.js";

import type { ChoiceResult } from "../requests/session/events.js";

/** Writes one stream event (`type` plus its payload; the encoder adds `sequence_number`). */
export type EmitEvent = (type: string, payload: Record<string, unknown>) => void;

/** Status of an item: open while it streams, then completed, or incomplete when the token budget cut it. */
type ItemStatus = "in_progress" | "completed" | "incomplete";

/** A reasoning or message item being built: its text so far. */
interface TextItem {
  kind: "reasoning" | "message";
  id: string;
  outputIndex: number;
  text: string;
  status: ItemStatus;
}

/** A function-call item being built. */
interface CallItem {
  kind: "function_call";
  id: string;
  outputIndex: number;
  /** The id the client answers with `function_call_output.call_id`. */
  callId: string;
  name: string;
  /** The arguments streamed so far. */
  args: string;
  status: ItemStatus;
}

/** One output item being built. */
type Item = TextItem | CallItem;

/** The output item's JSON (as `output[i]`, `response.output_item.added` / `.done` carry it). */
function itemBody(item: Item): Record<string, unknown> {
  const done = item.status !== "in_progress";
  switch (item.kind) {
    case "reasoning":
      return { id: item.id, type: "reasoning", status: item.status, summary: [], content: done ? [{ type: "reasoning_text", text: item.text }] : [] };
    case "message":
      return { id: item.id, type: "message", status: item.status, role: "assistant", content: done ? [outputText(item.text)] : [] };
    case "function_call":
      return { id: item.id, type: "function_call", status: item.status, call_id: item.callId, name: item.name, arguments: done ? item.args : "" };
  }
}

/** An `output_text` content part. */
function outputText(text: string): Record<string, unknown> {
  return { type: "output_text", text, annotations: [], logprobs: [] };
}

/** The output items of one answer and the events that stream them. */
export class ResponseOutput {
  /** Every item opened so far, in output order. */
  private readonly items: Item[] = [];
  /** The item receiving deltas now (the last of `items` while it is open), or null. */
  private open: Item | null = null;
  /** Output text held back while it is only whitespace and no message is open. */
  private pending = "";
  /** Function-call items by the parser's call index. */
  private readonly calls = new Map<number, CallItem>();

  /**
   * @param idSuffix - The response id's random part; item ids are `rs_` / `msg_` + it + the output index.
   * @param emit - Stream event sink (a no-op for unary answers).
   */
  constructor(
    private readonly idSuffix: string,
    private readonly emit: EmitEvent,
  ) {}

  /** Reasoning text: into the open reasoning item, else a new one. */
  reasoning(text: string): void {
    if (text === "") return;
    const item = this.open?.kind === "reasoning" ? this.open : this.start("reasoning", "rs");
    item.text += text;
    this.emit("response.reasoning_text.delta", { item_id: item.id, output_index: item.outputIndex, content_index: 0, delta: text });
  }

  /** Output text: into the open message item; else held while it is whitespace, then a new message item. */
  content(text: string): void {
    if (text === "") return;
    let item = this.open?.kind === "message" ? this.open : null;
    if (item === null) {
      this.pending += text;
      if (this.pending.trim() === "") return;
      item = this.start("message", "msg");
      text = this.pending;
      this.pending = "";
    }
    item.text += text;
    this.emit("response.output_text.delta", { item_id: item.id, output_index: item.outputIndex, content_index: 0, delta: text, logprobs: [] });
  }

  /** A tool-call fragment: the first one of a call (id and name) opens its item; arguments stream into it. */
  call(d: ToolCallDelta): void {
    let item = this.calls.get(d.index);
    if (!item && d.id !== undefined && d.name !== undefined) {
      this.closeOpen("completed");
      // Whitespace before a call is not a message.
      this.pending = "";
      item = { kind: "function_call", id: `fc_${d.id.replace(/^call_/, "")}`, outputIndex: this.items.length, callId: d.id, name: d.name, args: "", status: "in_progress" };
      this.calls.set(d.index, item);
      this.items.push(item);
      this.open = item;
      this.emit("response.output_item.added", { output_index: item.outputIndex, item: itemBody(item) });
    }
    if (!item || !d.arguments) return;
    item.args += d.arguments;
    this.emit("response.function_call_arguments.delta", { item_id: item.id, output_index: item.outputIndex, delta: d.arguments });
  }

  /**
   * The choice ended: close the open item (incomplete when the token budget cut it), and give an answer without
   * any item its message. A call the parser did not confirm (cut by the budget) stays incomplete.
   */
  finish(choice: Pick<ChoiceResult, "reason" | "toolCalls">): void {
    const cut = choice.reason === "length";
    const confirmed = new Set(choice.toolCalls.map((t) => t.id));
    const open = this.open;
    const status = cut && (open?.kind !== "function_call" || !confirmed.has(open.callId)) ? "incomplete" : "completed";
    this.closeOpen(status);
    if (!this.items.some((i) => i.kind !== "reasoning") && (this.pending !== "" || this.items.length === 0)) {
      const item = this.start("message", "msg");
      if (this.pending !== "") this.emit("response.output_text.delta", { item_id: item.id, output_index: item.outputIndex, content_index: 0, delta: this.pending, logprobs: [] });
      item.text = this.pending;
      this.closeOpen(cut ? "incomplete" : "completed");
    }
    this.pending = "";
  }

  /** The output items (final once `finish` ran). */
  output(): Record<string, unknown>[] {
    return this.items.map(itemBody);
  }

  /** The text of the message items (the SDKs' `output_text`). */
  text(): string {
    return this.items.map((i) => (i.kind === "message" ? i.text : "")).join("");
  }

  /** Close the open item and open a new reasoning or message item with its content part. */
  private start(kind: TextItem["kind"], prefix: string): TextItem {
    this.closeOpen("completed");
    const outputIndex = this.items.length;
    const item: TextItem = { kind, id: `${prefix}_${this.idSuffix}${outputIndex}`, outputIndex, text: "", status: "in_progress" };
    this.items.push(item);
    this.open = item;
    this.emit("response.output_item.added", { output_index: outputIndex, item: itemBody(item) });
    const part = kind === "reasoning" ? { type: "reasoning_text", text: "" } : outputText("");
    this.emit("response.content_part.added", { item_id: item.id, output_index: outputIndex, content_index: 0, part });
    return item;
  }

  /** Close the open item: its `.done` events with the whole text or arguments. */
  private closeOpen(status: "completed" | "incomplete"): void {
    const item = this.open;
    if (item === null) return;
    this.open = null;
    item.status = status;
    const at = { item_id: item.id, output_index: item.outputIndex };
    switch (item.kind) {
      case "reasoning":
        this.emit("response.reasoning_text.done", { ...at, content_index: 0, text: item.text });
        this.emit("response.content_part.done", { ...at, content_index: 0, part: { type: "reasoning_text", text: item.text } });
        break;
      case "message":
        this.emit("response.output_text.done", { ...at, content_index: 0, text: item.text, logprobs: [] });
        this.emit("response.content_part.done", { ...at, content_index: 0, part: outputText(item.text) });
        break;
      case "function_call":
        this.emit("response.function_call_arguments.done", { ...at, name: item.name, arguments: item.args });
        break;
    }
    this.emit("response.output_item.done", { output_index: item.outputIndex, item: itemBody(item) });
  }
}

/** Feed one parsed delta (reasoning, then text, then call fragments — the session's order). */
export function feed(out: ResponseOutput, d: ParsedDelta): void {
  out.reasoning(d.reasoning ?? "");
  out.content(d.content ?? "");
  for (const t of d.toolCalls ?? []) out.call(t);
}


/**
 * The output of a finished choice for a unary answer: the parser's deltas replayed in order when they were recorded
 * (`parsed`), else the choice's totals (reasoning, text, calls) — the same items a stream of it would have built.
 */
export function unaryOutput(idSuffix: string, choice: ChoiceResult, parsed: readonly ParsedDelta[] | null): ResponseOutput {
  const out = new ResponseOutput(idSuffix, () => {});
  if (parsed !== null) parsed.forEach((d) => feed(out, d));
  else feed(out, { reasoning: choice.reasoning ?? "", content: choice.text, toolCalls: choice.toolCalls.map((t, index) => ({ index, id: t.id, name: t.name, arguments: t.arguments })) });
  out.finish(choice);
  return out;
}
