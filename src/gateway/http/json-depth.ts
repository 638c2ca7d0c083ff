/**
 * How deeply a JSON text nests, read without parsing it. Client JSON is walked by recursive code downstream (the
 * chat template's `tojson`, schema and message checks), and JavaScript's stack ends at a few thousand levels: a
 * 45 KB body of nested brackets answered 500 "Maximum call stack size exceeded". Bodies and JSON texts inside them
 * (tool-call `arguments`) deeper than {@link MAX_JSON_NESTING} are refused or kept as text instead.
 */

/** The deepest JSON nesting Keel reads from a client: far above any real request (schemas stop at 160 levels). */
export const MAX_JSON_NESTING = 256;

/** The deepest nesting of `[` / `{` in `text`, brackets inside strings ignored; stops counting past `limit`. */
export function jsonNesting(text: string, limit = MAX_JSON_NESTING): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  // 1. One pass: strings (with their escapes) are skipped; brackets outside them move the depth.
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c /* \ */) i++;
      else if (c === 0x22 /* " */) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b /* [ */ || c === 0x7b /* { */) {
      depth++;
      if (depth > deepest) {
        deepest = depth;
        if (deepest > limit) return deepest;
      }
    } else if (c === 0x5d /* ] */ || c === 0x7d /* } */) depth--;
  }
  return deepest;
}

/** True when `text` nests no deeper than {@link MAX_JSON_NESTING}. */
export function withinNesting(text: string): boolean {
  return jsonNesting(text) <= MAX_JSON_NESTING;
}
