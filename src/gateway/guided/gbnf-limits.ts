/**
 * Guards on every emitted GBNF rule body, so no schema (or pattern) can produce a grammar that llama.cpp's parser
 * crashes on or refuses (issue #9): llama.cpp parses groups recursively and SEGFAULTED on 20000 nested optional
 * groups (measured in a child: depth 1000 parses, 3000 is refused, 20000 kills the process). Keel never needs deep
 * groups (nested values become separate rules), so the cap sits far below: 64.
 *
 * Repetitions: llama.cpp expands `X{m,n}` into about n generated rules and refuses it once (rules inside X) × n
 * reaches MAX_REPETITION_THRESHOLD (2000). Measured on the bundled build: `("a"{0,100}){0,19}` parses, `{0,20}`
 * is refused; `("a"{0,2}){0,999}` is refused; a rule REFERENCE repeated counts one (`r{0,1999}` parses whatever r
 * holds); `?`, `*` and `+` count as repetitions with bound 1 (`(x{0,1998} y)?` is refused). We count conservatively (every inner repetition as its bound, `* + ?` as one rule, plus the group
 * itself), so what we accept llama.cpp parses; the converter keeps repeated parts as rule references.
 */

import { HEX_WIDTH } from "./gbnf-text.js";

/** Deepest parenthesis nesting one emitted rule body may have. */
export const MAX_GROUP_DEPTH = 64;
/** llama.cpp's MAX_REPETITION_THRESHOLD: (rules repeated) × (bound) must stay below it. */
export const LLAMA_REPETITION_THRESHOLD = 2000;

/**
 * Scans a rule body's structure, skipping string literals and character classes (their brackets and parentheses
 * are text). Calls `onOpen`/`onClose` per group and `onRepeat(min, max)` per `{m,n}` bound (max null: open).
 */
export function scanBody(
  body: string,
  on: { open?: () => void; close?: () => void; repeat?: (min: number, max: number | null, afterGroup: boolean) => void; op?: (afterGroup: boolean) => void },
): void {
  let i = 0;
  /** Whether the last structural token was a `)` (a repetition right after it applies to that group). */
  let afterGroup = false;
  while (i < body.length) {
    const c = body[i]!;
    // 1. Literals and classes: skip to their unescaped end.
    if (c === '"' || c === "[") {
      const end = c === '"' ? '"' : "]";
      i++;
      while (i < body.length && body[i] !== end) i += body[i] === "\\" ? 2 : 1;
      i++;
      afterGroup = false;
      continue;
    }
    // 2. Structure.
    if (c === "(") on.open?.();
    else if (c === ")") {
      on.close?.();
      afterGroup = true;
      i++;
      continue;
    } else if (c === "*" || c === "+" || c === "?") {
      on.op?.(afterGroup);
      afterGroup = false;
      i++;
      continue;
    }
    else if (c === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(body.slice(i, i + 24));
      if (m) {
        const min = Number(m[1]);
        on.repeat?.(min, m[2] === undefined ? min : m[3] ? Number(m[3]) : null, afterGroup);
        i += m[0].length;
        afterGroup = false;
        continue;
      }
    }
    if (c !== " ") afterGroup = false;
    i++;
  }
}

/** The deepest parenthesis nesting of `body`. */
export function groupDepth(body: string): number {
  let depth = 0;
  let max = 0;
  scanBody(body, {
    open: () => {
      depth++;
      if (depth > max) max = depth;
    },
    close: () => {
      depth--;
    },
  });
  return max;
}

/**
 * The first surrogate code point (U+D800–U+DFFF) a GBNF body names, as a `\u` / `\U` / `\x` escape or as a
 * character of its own (a JSON string may carry a lone one), or null. llama.cpp's grammar reads each such code point
 * as a character that UTF-8 output can never spell, so a guide holding one could only be escaped or dropped.
 */
export function loneSurrogate(body: string): number | null {
  const isSurrogate = (c: number) => c >= 0xd800 && c <= 0xdfff;
  for (let i = 0; i < body.length; i++) {
    const c = body.charCodeAt(i);
    if (c === 0x5c) {
      const width = HEX_WIDTH[body[i + 1] ?? ""];
      if (width !== undefined && /^[0-9a-fA-F]+$/.test(body.slice(i + 2, i + 2 + width))) {
        const v = parseInt(body.slice(i + 2, i + 2 + width), 16);
        if (isSurrogate(v)) return v;
        i += 1 + width;
      } else i += 1; // an escaped character (\\, \", \], …)
      continue;
    }
    const next = body.charCodeAt(i + 1); // NaN past the end
    if (c >= 0xd800 && c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
      i += 1; // a well-formed pair: one character above U+FFFF
      continue;
    }
    if (isSurrogate(c)) return c;
  }
  return null;
}

/**
 * Why llama.cpp would refuse or crash on `body` (groups nested deeper than {@link MAX_GROUP_DEPTH}, or a repetition
 * reaching {@link LLAMA_REPETITION_THRESHOLD} counted as in the module comment), or null when it parses.
 */
export function bodyProblem(body: string): string | null {
  const surrogate = loneSurrogate(body);
  if (surrogate !== null) return `it holds the lone surrogate U+${surrogate.toString(16).toUpperCase()}, which no UTF-8 text holds (a character above U+FFFF is one code point: \\U0001F600, not \\uD83D\\uDE00)`;
  if (groupDepth(body) > MAX_GROUP_DEPTH) return `groups nest deeper than ${MAX_GROUP_DEPTH} (limit ${MAX_GROUP_DEPTH})`;
  // Generated rules per open group (the outermost entry is the body itself).
  const inner: number[] = [0];
  /** Rules generated inside the group that just closed. */
  let closed = 0;
  let problem: string | null = null;
  const repetition = (min: number, max: number | null, afterGroup: boolean): void => {
    const bound = Math.max(1, max ?? min);
    const rules = (afterGroup ? closed + 1 : 1) * bound;
    if (rules >= LLAMA_REPETITION_THRESHOLD && problem === null) {
      problem = `a repetition expands to ${rules} rules (llama.cpp's limit: below ${LLAMA_REPETITION_THRESHOLD}; bounds at most ${LLAMA_REPETITION_THRESHOLD - 1}, nested bounds multiply)`;
    }
    // The repeated group's own rules were added when it closed: replaced by its expansion, not added twice.
    inner[inner.length - 1]! += afterGroup ? rules - closed : rules;
  };
  scanBody(body, {
    open: () => inner.push(0),
    close: () => {
      closed = inner.pop() ?? 0;
      inner[inner.length - 1]! += closed;
    },
    // `* + ?` are repetitions too (bound 1): `(X{0,1998} Y)?` holds 2000 rules and is refused.
    op: (afterGroup) => repetition(1, 1, afterGroup),
    repeat: repetition,
  });
  return problem;
}
