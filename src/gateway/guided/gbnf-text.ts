/**
 * Writing GBNF (llama.cpp's grammar dialect) text: quoted literals, character classes over code-point ranges, and
 * code-point sets as they appear inside a JSON string (raw where JSON allows the character raw, escaped otherwise).
 *
 * Escapes are limited to the ones llama.cpp's parser knows (`\x`, `\u`, `\U`, `\t`, `\r`, `\n`, `\\`, `\"`, `\[`,
 * `\]`); any other backslash escape is a parse error there, so classes spell punctuation as `\xHH`.
 */

/** A set of code points as sorted, disjoint, non-adjacent inclusive ranges. */
export type CharSet = ReadonlyArray<readonly [number, number]>;

/** Highest Unicode code point. */
export const MAX_CODE_POINT = 0x10ffff;

/** Normalises ranges: sorts, merges overlapping and adjacent ones. */
export function charSet(ranges: ReadonlyArray<readonly [number, number]>): CharSet {
  const sorted = [...ranges].filter(([a, b]) => a <= b).sort((x, y) => x[0] - y[0]);
  const out: Array<[number, number]> = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** Every code point not in `s`. */
export function negate(s: CharSet): CharSet {
  const out: Array<[number, number]> = [];
  let next = 0;
  for (const [a, b] of s) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= MAX_CODE_POINT) out.push([next, MAX_CODE_POINT]);
  return out;
}

/** `a` minus `b`. */
export function subtract(a: CharSet, b: CharSet): CharSet {
  return intersect(a, negate(b));
}

/** Code points in both sets. */
export function intersect(a: CharSet, b: CharSet): CharSet {
  const out: Array<[number, number]> = [];
  for (const [a0, a1] of a) {
    for (const [b0, b1] of b) {
      const lo = Math.max(a0, b0);
      const hi = Math.min(a1, b1);
      if (lo <= hi) out.push([lo, hi]);
    }
  }
  return charSet(out);
}

/** Whether `cp` is in `s`. */
export function contains(s: CharSet, cp: number): boolean {
  return s.some(([a, b]) => cp >= a && cp <= b);
}

function hex(cp: number, width: number): string {
  return cp.toString(16).toUpperCase().padStart(width, "0");
}

/** One code point inside a `[...]` class: letters and digits raw, everything else as a numeric escape. */
function classChar(cp: number): string {
  if ((cp >= 0x30 && cp <= 0x39) || (cp >= 0x41 && cp <= 0x5a) || (cp >= 0x61 && cp <= 0x7a)) {
    return String.fromCodePoint(cp);
  }
  if (cp <= 0xff) return `\\x${hex(cp, 2)}`;
  if (cp <= 0xffff) return `\\u${hex(cp, 4)}`;
  return `\\U${hex(cp, 8)}`;
}

/** A GBNF character class matching exactly `s` (which must not be empty). */
export function classOf(s: CharSet): string {
  if (s.length === 0) throw new Error("classOf: empty set");
  // A negated class is shorter when the set covers most of the code space (e.g. "anything but a quote").
  const neg = negate(s);
  const body = (set: CharSet) =>
    set.map(([a, b]) => (a === b ? classChar(a) : `${classChar(a)}-${classChar(b)}`)).join("");
  if (neg.length > 0 && neg.length < s.length) return `[^${body(neg)}]`;
  if (neg.length === 0) return "[\\x00-\\U0010FFFF]";
  return `[${body(s)}]`;
}

/** A GBNF quoted literal matching exactly `text`. */
export function literal(text: string): string {
  let out = '"';
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (cp < 0x20 || cp === 0x7f) out += `\\x${hex(cp, 2)}`;
    else if (cp >= 0xd800 && cp <= 0xdfff) out += `\\u${hex(cp, 4)}`;
    else out += ch;
  }
  return out + '"';
}

/** Short JSON escapes of control characters (the form `JSON.stringify` writes). */
const SHORT_ESCAPES: Readonly<Record<number, string>> = { 8: "b", 9: "t", 10: "n", 12: "f", 13: "r" };

/** Characters JSON never writes raw inside a string: quote, backslash and C0 controls. */
const JSON_ESCAPED: CharSet = charSet([
  [0x00, 0x1f],
  [0x22, 0x22],
  [0x5c, 0x5c],
]);

/**
 * GBNF for one character of `s` as it appears inside a JSON string: raw where JSON allows, otherwise its escape
 * (`\"`, `\\`, the short control escapes or `\u00XX` as `JSON.stringify` writes them). Returns null for an empty set.
 */
export function jsonCharOf(s: CharSet): string | null {
  const alts: string[] = [];
  const raw = subtract(s, JSON_ESCAPED);
  if (raw.length > 0) alts.push(classOf(raw));
  if (contains(s, 0x22)) alts.push(literal('\\"'));
  if (contains(s, 0x5c)) alts.push(literal("\\\\"));
  const controls = intersect(s, charSet([[0x00, 0x1f]]));
  const controlCount = controls.reduce((n, [a, b]) => n + b - a + 1, 0);
  if (controlCount === 32) {
    alts.push(`"\\\\" ([bfnrt] | "u00" [01] [0-9a-fA-F])`);
  } else {
    for (const [a, b] of controls) {
      for (let cp = a; cp <= b; cp++) {
        const short = SHORT_ESCAPES[cp];
        alts.push(literal(short ? `\\${short}` : `\\u${cp.toString(16).padStart(4, "0")}`));
      }
    }
  }
  if (alts.length === 0) return null;
  return alts.length === 1 ? alts[0]! : `(${alts.join(" | ")})`;
}

/** Hex digits after llama.cpp's GBNF escapes `\x`, `\u`, `\U`, by the escape's letter. */
export const HEX_WIDTH: Readonly<Record<string, number>> = { x: 2, u: 4, U: 8 };
