/**
 * The seam between the composed parser (index.ts) and one tool-call format: text in (what the reasoning stage
 * left), content and call events out. A call is announced (`start`) as soon as its name is certain and its
 * arguments follow as compact-JSON fragments (`args`, appended to the latest started call); a stage that only
 * knows a call once it is whole (a bare JSON answer) sends `start` and one `args` together. An announced call
 * cannot be taken back: a stage announces only what stays a call whatever follows.
 *
 * @module
 */
import type { FoundCall } from "./call-shape.js";
import type { ContentGaps } from "./content-gaps.js";
import type { JsonCallReader } from "./json-call-reader.js";

/** One step of the calls: a new call (its name), or the next piece of the latest call's arguments text. */
export type CallEvent = { kind: "start"; name: string } | { kind: "args"; text: string };

/** What a stage made certain. */
export interface StageOutput {
  content: string;
  calls: CallEvent[];
}

export interface ToolStage {
  push(text: string): StageOutput;
  finish(reason: "stop" | "length"): StageOutput;
}

/** A fresh, empty output to append to. */
export function emptyOutput(): StageOutput {
  return { content: "", calls: [] };
}

/** Appends whole calls (start + all arguments at once). */
export function pushWhole(out: StageOutput, calls: readonly FoundCall[]): void {
  for (const c of calls) out.calls.push({ kind: "start", name: c.name }, { kind: "args", text: c.arguments });
}

/** Appends an arguments fragment (nothing for ""). */
export function pushArgs(out: StageOutput, text: string): void {
  if (text !== "") out.calls.push({ kind: "args", text });
}

/** A call object being streamed: its reader, and whether its `start` went out. */
export interface StreamedCall {
  readonly reader: JsonCallReader;
  announced: boolean;
}

/** Announces `st`'s call once its name closed (once): a call exists from here on, and the text before it ends. */
export function announceWhenNamed(st: StreamedCall, gaps: ContentGaps, out: StageOutput): void {
  if (st.announced || st.reader.name === null) return;
  st.announced = true;
  gaps.call();
  out.calls.push({ kind: "start", name: st.reader.name });
}
