/**
 * The seam between the composed parser (index.ts) and one tool-call format: text in (what the reasoning stage
 * left), content and completed calls out. Calls are reported whole, once complete, so a call cut by the end of
 * the output can still become content (a streamed call header cannot be taken back).
 *
 * @module
 */
import type { FoundCall } from "./call-shape.js";

/** What a stage made certain. */
export interface StageOutput {
  content: string;
  calls: FoundCall[];
}

export interface ToolStage {
  push(text: string): StageOutput;
  finish(reason: "stop" | "length"): StageOutput;
}

/** A fresh, empty output to append to. */
export function emptyOutput(): StageOutput {
  return { content: "", calls: [] };
}
