/**
 * Guards on every emitted GBNF rule body, so no schema (or pattern) can produce a grammar that llama.cpp's parser
 * crashes on or refuses (issue #9): llama.cpp parses groups recursively and SEGFAULTED on 20000 nested optional
 * groups (measured in a child: depth 1000 parses, 3000 is refused, 20000 kills the process). Keel never needs deep
 * groups (nested values become separate rules), so the cap sits far below: 64.
 */

/** Deepest parenthesis nesting one emitted rule body may have. */
export const MAX_GROUP_DEPTH = 64;

/**
 * Scans a rule body's structure, skipping string literals and character classes (their brackets and parentheses
 * are text). Calls `onOpen`/`onClose` per group and `onRepeat(min, max)` per `{m,n}` bound (max null: open).
 */
export function scanBody(body: string, on: { open?: () => void; close?: () => void; repeat?: (min: number, max: number | null) => void }): void {
  let i = 0;
  while (i < body.length) {
    const c = body[i]!;
    // 1. Literals and classes: skip to their unescaped end.
    if (c === '"' || c === "[") {
      const end = c === '"' ? '"' : "]";
      i++;
      while (i < body.length && body[i] !== end) i += body[i] === "\\" ? 2 : 1;
      i++;
      continue;
    }
    // 2. Structure.
    if (c === "(") on.open?.();
    else if (c === ")") on.close?.();
    else if (c === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(body.slice(i, i + 24));
      if (m) {
        const min = Number(m[1]);
        on.repeat?.(min, m[2] === undefined ? min : m[3] ? Number(m[3]) : null);
        i += m[0].length;
        continue;
      }
    }
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
