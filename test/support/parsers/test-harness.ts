/**
 * Test helpers for the output parsers: feed a text in given pieces, rebuild the answer from the deltas alone (as a
 * streaming client would), and check the delta protocol on the way.
 *
 * @module
 */
import type { ToolSpec } from "../../../src/gateway/tools.js";
import { createOutputParser } from "../../../src/gateway/parsers/index.js";
import type { OutputParserOptions, ParsedDelta, ParsedOutput } from "../../../src/gateway/parsers/types.js";

/** Parser options with a counting id generator (`call_0`, `call_1`, …). */
export function options(partial: Partial<OutputParserOptions> & { tools?: readonly ToolSpec[] }): OutputParserOptions {
  let n = 0;
  return {
    toolParser: null,
    tools: [],
    reasoningParser: null,
    reasoningOpen: false,
    newId: () => `call_${n++}`,
    ...partial,
  };
}

/** What a streaming client would assemble from the deltas, plus the parser's own final result. */
export interface Run {
  streamed: ParsedOutput;
  result: ParsedOutput;
  deltas: ParsedDelta[];
}

/** Feeds `pieces` then finishes with `reason`. */
export function runPieces(opts: OutputParserOptions, pieces: readonly string[], reason: "stop" | "length"): Run {
  const parser = createOutputParser(opts);
  const deltas = pieces.map((p) => parser.push(p));
  deltas.push(parser.finish(reason));
  return { streamed: assemble(deltas), result: parser.result(), deltas };
}

/**
 * Rebuilds content, reasoning and calls from deltas the way an OpenAI streaming client does, failing on protocol
 * breaks: an empty string where the field should be omitted, a call whose first delta lacks id or name, an index
 * that skips, a second header for the same call.
 */
export function assemble(deltas: readonly ParsedDelta[]): ParsedOutput {
  let content = "";
  let reasoning = "";
  const calls: { id: string; name: string; arguments: string }[] = [];
  for (const d of deltas) {
    if (d.content === "" || d.reasoning === "" || d.toolCalls?.length === 0) throw new Error("empty part not omitted");
    content += d.content ?? "";
    reasoning += d.reasoning ?? "";
    for (const t of d.toolCalls ?? []) {
      if (t.index === calls.length) {
        if (t.id === undefined || t.name === undefined) throw new Error(`call ${t.index}: first delta without id/name`);
        calls.push({ id: t.id, name: t.name, arguments: t.arguments ?? "" });
      } else if (t.index === calls.length - 1) {
        if (t.id !== undefined || t.name !== undefined) throw new Error(`call ${t.index}: header sent twice`);
        calls[t.index]!.arguments += t.arguments ?? "";
      } else {
        throw new Error(`call index ${t.index} out of order (have ${calls.length})`);
      }
    }
  }
  return { content, reasoning: reasoning === "" ? null : reasoning, toolCalls: calls };
}

/** `text` cut at the given positions (sorted, deduplicated, in range). */
export function splitAt(text: string, cuts: readonly number[]): string[] {
  const points = [...new Set(cuts.map((c) => Math.max(0, Math.min(text.length, c))))].sort((a, b) => a - b);
  const out: string[] = [];
  let start = 0;
  for (const p of points) {
    out.push(text.slice(start, p));
    start = p;
  }
  out.push(text.slice(start));
  return out;
}
