/**
 * A unary answer that lists its parts in the order they were produced (Responses items, Anthropic content blocks)
 * needs the parser's deltas, not only its result: this wrapper keeps them.
 */
import type { OutputParser, ParsedDelta } from "./types.js";

/** An output parser that also appends every delta it returns to `log`, in order. */
export function recordingParser(parser: OutputParser, log: ParsedDelta[]): OutputParser {
  return {
    push(text) {
      const d = parser.push(text);
      log.push(d);
      return d;
    },
    finish(reason) {
      const d = parser.finish(reason);
      log.push(d);
      return d;
    },
    result: () => parser.result(),
  };
}

/**
 * The parser factory of a request whose unary answer lists its parts in produced order: for a unary request (and a
 * parser) each parser made records into `parsed`; a stream needs no log (`parsed` null, the factory as it was).
 */
export function recordedForUnary(factory: (() => OutputParser) | undefined, stream: boolean): { parser: (() => OutputParser) | undefined; parsed: ParsedDelta[] | null } {
  if (factory === undefined || stream) return { parser: factory, parsed: null };
  const parsed: ParsedDelta[] = [];
  return { parser: () => recordingParser(factory(), parsed), parsed };
}
