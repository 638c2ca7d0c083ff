/**
 * A JSON-schema `pattern` (ECMA-262 regex) → GBNF, for the subset a grammar can express exactly: literals, escapes,
 * classes (`[a-z]`, `[^"]`, `\d \w \s` and negations), `.`, groups (`(…)`, `(?:…)`, `(?<name>…)`), alternation,
 * quantifiers `? * + {m} {m,} {m,n}` (lazy `?` suffix accepted: it changes nothing about what matches), and `^`/`$`
 * at the very start/end. Without `^` (or `$`) the pattern matches anywhere in the string, as JSON Schema says, so
 * any characters may come before (after) it.
 *
 * Refused, with a message naming the construct: lookaround, backreferences, word boundaries, Unicode property
 * escapes, `\c`, anchors anywhere else, and a quantifier over something that can match nothing (`(a?)*`; llama.cpp
 * rejects the left recursion that would produce).
 */
import { type CharSet, MAX_CODE_POINT, charSet, classOf, jsonCharOf, negate, subtract } from "./gbnf-text.js";

/**
 * Largest `{m,n}` bound we emit: llama.cpp's GBNF parser refuses a repetition once (rules in the repeated part) ×
 * (bound) reaches its MAX_REPETITION_THRESHOLD, 2000 (measured on the bundled build: `[a-z]{0,1999}` parses,
 * `{0,2000}` is refused whatever else the grammar holds). Nested repetitions multiply: see gbnf-limits.ts.
 */
export const MAX_REPEAT = 1999;

/** A parsed regex. */
type Node =
  | { kind: "set"; set: CharSet }
  | { kind: "seq"; items: Node[] }
  | { kind: "alt"; options: Node[] }
  | { kind: "repeat"; item: Node; min: number; max: number | null };

/** Thrown for a pattern we refuse; the schema converter turns it into a 400 naming the schema location. */
export class PatternError extends Error {
  /** True when the pattern is not a valid ECMA-262 regex at all (vs a valid one we cannot express). */
  readonly invalidRegex: boolean;
  constructor(message: string, invalidRegex = false) {
    super(message);
    this.invalidRegex = invalidRegex;
  }
}

const DIGIT: CharSet = charSet([[0x30, 0x39]]);
const WORD: CharSet = charSet([
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
]);
const SPACE: CharSet = charSet([
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
]);
/** `.` without the `s` flag: anything but line terminators. */
const DOT: CharSet = negate(
  charSet([
    [0x0a, 0x0a],
    [0x0d, 0x0d],
    [0x2028, 0x2029],
  ]),
);
const ANY: CharSet = charSet([[0, MAX_CODE_POINT]]);

const single = (cp: number): Node => ({ kind: "set", set: charSet([[cp, cp]]) });

/** Recursive-descent parser over the pattern's code points. */
class RegexParser {
  /** The pattern as code points. */
  private readonly cps: number[];
  /** Index of the next unread code point. */
  private pos = 0;

  constructor(pattern: string) {
    this.cps = Array.from(pattern, (c) => c.codePointAt(0)!);
  }

  /** Parses the whole pattern; returns the tree and whether it is anchored at each end. */
  parseTop(): { node: Node; start: boolean; end: boolean } {
    let start = false;
    let end = false;
    if (this.cps[0] === 0x5e) {
      start = true;
      this.pos = 1;
    }
    // A trailing unescaped `$` anchors the end: count the backslashes before it.
    const n = this.cps.length;
    if (n > this.pos && this.cps[n - 1] === 0x24) {
      let bs = 0;
      for (let i = n - 2; i >= 0 && this.cps[i] === 0x5c; i--) bs++;
      if (bs % 2 === 0) {
        end = true;
        this.cps.pop();
      }
    }
    const node = this.parseAlt();
    if (this.pos < this.cps.length) throw new PatternError(`unexpected '${this.char()}' at offset ${this.pos}`);
    return { node, start, end };
  }

  private char(): string {
    return String.fromCodePoint(this.cps[this.pos]!);
  }

  private parseAlt(): Node {
    const options = [this.parseSeq()];
    while (this.cps[this.pos] === 0x7c) {
      this.pos++;
      options.push(this.parseSeq());
    }
    return options.length === 1 ? options[0]! : { kind: "alt", options };
  }

  private parseSeq(): Node {
    const items: Node[] = [];
    for (;;) {
      const c = this.cps[this.pos];
      if (c === undefined || c === 0x7c || c === 0x29) break;
      const atom = this.parseAtom();
      items.push(this.parseQuantifier(atom));
    }
    return items.length === 1 ? items[0]! : { kind: "seq", items };
  }

  private parseQuantifier(atom: Node): Node {
    const c = this.cps[this.pos];
    let min: number;
    let max: number | null;
    if (c === 0x2a) [min, max] = [0, null];
    else if (c === 0x2b) [min, max] = [1, null];
    else if (c === 0x3f) [min, max] = [0, 1];
    else if (c === 0x7b) {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(String.fromCodePoint(...this.cps.slice(this.pos, this.pos + 24)));
      if (!m) return atom; // a literal `{` (Annex B); the RegExp check already accepted it
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === "" ? null : Number(m[3]);
      if (min > MAX_REPEAT || (max !== null && max > MAX_REPEAT)) {
        throw new PatternError(`repetition bound above ${MAX_REPEAT} in '${m[0]}'`);
      }
      this.pos += m[0].length - 1;
    } else return atom;
    this.pos++;
    if (this.cps[this.pos] === 0x3f) this.pos++; // lazy: same language
    if (nullable(atom)) throw new PatternError("a quantifier over something that can match the empty string");
    const next = this.cps[this.pos];
    if (next === 0x2a || next === 0x2b || next === 0x3f || next === 0x7b) {
      throw new PatternError("nested quantifier");
    }
    return { kind: "repeat", item: atom, min, max };
  }

  private parseAtom(): Node {
    const c = this.cps[this.pos]!;
    this.pos++;
    switch (c) {
      case 0x2e:
        return { kind: "set", set: DOT };
      case 0x5b:
        return { kind: "set", set: this.parseClass() };
      case 0x28:
        return this.parseGroup();
      case 0x5c:
        return this.parseEscape(false);
      case 0x5e:
      case 0x24:
        throw new PatternError(`anchor '${String.fromCodePoint(c)}' is supported only at the start/end of the pattern`);
      case 0x2a:
      case 0x2b:
      case 0x3f:
        throw new PatternError(`nothing to repeat at offset ${this.pos - 1}`);
      default:
        return single(c);
    }
  }

  private parseGroup(): Node {
    if (this.cps[this.pos] === 0x3f) {
      const two = String.fromCodePoint(...this.cps.slice(this.pos, this.pos + 3));
      if (two.startsWith("?:")) this.pos += 2;
      else if (two.startsWith("?=") || two.startsWith("?!") || two.startsWith("?<=") || two.startsWith("?<!")) {
        throw new PatternError("lookaround assertions (?=, ?!, ?<=, ?<!) are not supported");
      } else if (two.startsWith("?<")) {
        const close = this.cps.indexOf(0x3e, this.pos);
        if (close < 0) throw new PatternError("unterminated group name");
        this.pos = close + 1;
      } else throw new PatternError(`unsupported group syntax '(${two}'`);
    }
    const inner = this.parseAlt();
    if (this.cps[this.pos] !== 0x29) throw new PatternError("unterminated group");
    this.pos++;
    return inner;
  }

  /** After a backslash. `inClass`: inside `[...]`, where `\b` is a backspace. */
  private parseEscape(inClass: boolean): Node {
    const c = this.cps[this.pos];
    if (c === undefined) throw new PatternError("trailing backslash");
    this.pos++;
    const ch = String.fromCodePoint(c);
    switch (ch) {
      case "d":
        return { kind: "set", set: DIGIT };
      case "D":
        return { kind: "set", set: negate(DIGIT) };
      case "w":
        return { kind: "set", set: WORD };
      case "W":
        return { kind: "set", set: negate(WORD) };
      case "s":
        return { kind: "set", set: SPACE };
      case "S":
        return { kind: "set", set: negate(SPACE) };
      case "t":
        return single(9);
      case "n":
        return single(10);
      case "v":
        return single(11);
      case "f":
        return single(12);
      case "r":
        return single(13);
      case "0":
        if (!/[0-9]/.test(String.fromCodePoint(this.cps[this.pos] ?? 0x20))) return single(0);
        throw new PatternError("octal escapes are not supported");
      case "x":
        return single(this.hexDigits(2));
      case "u":
        if (this.cps[this.pos] === 0x7b) {
          const close = this.cps.indexOf(0x7d, this.pos);
          const digits = String.fromCodePoint(...this.cps.slice(this.pos + 1, close));
          this.pos = close + 1;
          return single(parseInt(digits, 16));
        }
        return single(this.utf16Escape(this.hexDigits(4)));
      case "b":
        if (inClass) return single(8);
        throw new PatternError("word boundaries (\\b) are not supported");
      case "B":
        throw new PatternError("word boundaries (\\B) are not supported");
      case "p":
      case "P":
        throw new PatternError("Unicode property escapes (\\p{…}) are not supported");
      case "c":
        throw new PatternError("control escapes (\\c) are not supported");
      case "k":
        throw new PatternError("backreferences (\\k<…>) are not supported");
      default:
        if (c >= 0x31 && c <= 0x39) throw new PatternError("backreferences (\\1…) are not supported");
        return single(c); // identity escape of a syntax character
    }
  }

  /**
   * A `\uXXXX` escape's code point: a high surrogate followed by `\u` and a low one is the character they encode, as
   * in a JavaScript regex (`\ud83d\ude00` is 😀); a surrogate left alone is refused (no UTF-8 text holds one).
   */
  private utf16Escape(unit: number): number {
    const next = String.fromCodePoint(...this.cps.slice(this.pos, this.pos + 6));
    if (unit >= 0xd800 && unit <= 0xdbff && /^\\u[dD][c-fC-F][0-9a-fA-F]{2}$/.test(next)) {
      this.pos += 6;
      return 0x10000 + ((unit - 0xd800) << 10) + (parseInt(next.slice(2), 16) - 0xdc00);
    }
    if (unit >= 0xd800 && unit <= 0xdfff) throw new PatternError(`the lone surrogate \\u${unit.toString(16).toUpperCase()} matches no UTF-8 text (write a pair, or \\u{…} for a character above U+FFFF)`);
    return unit;
  }

  private hexDigits(n: number): number {
    const digits = String.fromCodePoint(...this.cps.slice(this.pos, this.pos + n));
    if (!/^[0-9a-fA-F]+$/.test(digits) || digits.length !== n) throw new PatternError("bad hex escape");
    this.pos += n;
    return parseInt(digits, 16);
  }

  /** After `[`: the class up to its `]`. */
  private parseClass(): CharSet {
    let negated = false;
    if (this.cps[this.pos] === 0x5e) {
      negated = true;
      this.pos++;
    }
    const ranges: Array<readonly [number, number]> = [];
    for (;;) {
      const c = this.cps[this.pos];
      if (c === undefined) throw new PatternError("unterminated character class");
      if (c === 0x5d) {
        this.pos++;
        break;
      }
      const lo = this.classAtom();
      if (this.cps[this.pos] === 0x2d && this.cps[this.pos + 1] !== 0x5d && this.cps[this.pos + 1] !== undefined) {
        this.pos++;
        const hi = this.classAtom();
        if (lo.length !== 1 || hi.length !== 1 || lo[0]![0] !== lo[0]![1] || hi[0]![0] !== hi[0]![1]) {
          throw new PatternError("a class escape cannot bound a range");
        }
        ranges.push([lo[0]![0], hi[0]![0]]);
      } else ranges.push(...lo);
    }
    const set = charSet(ranges);
    return negated ? negate(set) : set;
  }

  private classAtom(): CharSet {
    const c = this.cps[this.pos]!;
    this.pos++;
    if (c !== 0x5c) return charSet([[c, c]]);
    const node = this.parseEscape(true);
    if (node.kind !== "set") throw new PatternError("unsupported escape in a class");
    return node.set;
  }
}

/** Whether a node can match the empty string. */
function nullable(n: Node): boolean {
  switch (n.kind) {
    case "set":
      return false;
    case "seq":
      return n.items.every(nullable);
    case "alt":
      return n.options.some(nullable);
    case "repeat":
      return n.min === 0 || nullable(n.item);
  }
}

/** How characters are written: inside a JSON string (escaped) or raw (a qwen3coder parameter value). */
export type CharMode = "json" | "raw";
/** A {@link CharMode}, or plain text (any character as itself: the whole output under `structured_outputs.regex`). */
type EmitMode = CharMode | "text";

/** One character of `set` in `mode`, or null when no character can be written (an empty class). */
export function charOf(set: CharSet, mode: EmitMode): string | null {
  if (mode === "json") return set.length === 0 ? null : jsonCharOf(set);
  if (mode === "text") return set.length === 0 ? null : classOf(set);
  // Raw (qwen3coder) values under a pattern or length never hold a newline, so they cannot contain the
  // `\n</parameter>` terminator (a subset: newlines the pattern would allow are refused).
  const raw = subtract(set, NEWLINE);
  return raw.length === 0 ? null : classOf(raw);
}

const NEWLINE: CharSet = charSet([[0x0a, 0x0a]]);

function emit(n: Node, mode: EmitMode): string {
  switch (n.kind) {
    case "set": {
      const c = charOf(n.set, mode);
      if (c === null) throw new PatternError("a character class that matches nothing");
      return c;
    }
    case "seq":
      return n.items.length === 0 ? '""' : n.items.map((i) => emit(i, mode)).join(" ");
    case "alt":
      return `(${n.options.map((o) => emit(o, mode)).join(" | ")})`;
    case "repeat": {
      const inner = `(${emit(n.item, mode)})`;
      if (n.min === 0 && n.max === null) return `${inner}*`;
      if (n.min === 1 && n.max === null) return `${inner}+`;
      if (n.min === 0 && n.max === 1) return `${inner}?`;
      if (n.max === null) return `${inner}{${n.min},}`;
      if (n.max === 0) return '""';
      return n.min === n.max ? `${inner}{${n.min}}` : `${inner}{${n.min},${n.max}}`;
    }
  }
}

/**
 * GBNF for the CONTENT of a string matching `pattern` (no quotes). `anyChar` is the expression for one arbitrary
 * character in `mode`, used around an unanchored pattern. Throws PatternError for invalid or unsupported patterns.
 */
export function patternToGbnf(pattern: string, mode: CharMode, anyChar: string): string {
  try {
    new RegExp(pattern, "u");
  } catch (e) {
    throw new PatternError(`invalid regular expression: ${(e as Error).message}`, true);
  }
  const { node, start, end } = new RegexParser(pattern).parseTop();
  const body = emit(node, mode);
  return `${start ? "" : `(${anyChar})* `}(${body})${end ? "" : ` (${anyChar})*`}`;
}

/** One arbitrary character in raw mode (no newline: see {@link charOf}). */
export const RAW_ANY = classOf(subtract(ANY, NEWLINE));

/**
 * GBNF for a whole output that FULLY matches `pattern` (vLLM's `structured_outputs.regex`: the output is one match,
 * start to end, so `^`/`$` at the ends change nothing). Throws PatternError for invalid or unsupported patterns.
 */
export function regexToGbnf(pattern: string): string {
  try {
    new RegExp(pattern, "u");
  } catch (e) {
    throw new PatternError(`invalid regular expression: ${(e as Error).message}`, true);
  }
  return emit(new RegexParser(pattern).parseTop().node, "text");
}
